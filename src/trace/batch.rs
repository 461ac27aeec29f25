//! Spans gathered per worker (`docs/tracing.md`, "Export"): a worker keeps the spans it
//! records in a batch of its own and hands the batch to the exporter's queue when it
//! holds [`HAND_AT`] spans, at each heartbeat, and when the worker ends: one send on the
//! queue per batch rather than one per span, and nothing shared between workers while
//! a batch fills. A thread that does not gather (a test's, a benchmark's) hands each
//! span at once.

use std::cell::RefCell;
use std::sync::Arc;

use super::{Span, Tracer};

/// Spans a worker's batch holds before it is handed on.
const HAND_AT: usize = 64;

thread_local! {
    /// This thread's batch, when it gathers ([`batch_this_thread`]).
    static BATCH: RefCell<Option<Batch>> = const { RefCell::new(None) };
}

/// Spans recorded on this thread, not yet handed to their exporter.
struct Batch {
    /// The tracer the spans were recorded under (a reload may start another): their
    /// exporter. `None` while the batch is empty.
    tracer: Option<Arc<Tracer>>,
    spans: Vec<Span>,
}

/// This thread gathers the spans it records until [`flush_this_thread`].
pub(crate) fn batch_this_thread() {
    BATCH.with(|b| {
        *b.borrow_mut() = Some(Batch {
            tracer: None,
            spans: Vec::new(),
        })
    });
}

/// Hands what this thread gathered to its exporter.
pub(crate) fn flush_this_thread() {
    BATCH.with(|b| {
        if let Ok(Some(batch)) = b.try_borrow_mut().as_deref_mut() {
            batch.hand();
        }
    });
}

/// Records `span`, ended under `tracer`.
pub(super) fn record(tracer: &Arc<Tracer>, span: Span) {
    BATCH.with(|b| match b.try_borrow_mut().as_deref_mut() {
        Ok(Some(batch)) => batch.add(tracer, span),
        _ => tracer.hand(vec![span]),
    });
}

impl Batch {
    fn add(&mut self, tracer: &Arc<Tracer>, span: Span) {
        if !self.tracer.as_ref().is_some_and(|t| Arc::ptr_eq(t, tracer)) {
            self.hand();
            self.tracer = Some(Arc::clone(tracer));
        }
        if self.spans.capacity() == 0 {
            self.spans.reserve_exact(HAND_AT);
        }
        self.spans.push(span);
        if self.spans.len() >= HAND_AT {
            self.hand();
        }
    }

    /// Hands the spans on, and lets go of their tracer (a reload's old one can end).
    fn hand(&mut self) {
        if let Some(tracer) = self.tracer.take() {
            if !self.spans.is_empty() {
                tracer.hand(std::mem::take(&mut self.spans));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::trace_settings::TraceSettings;

    fn tracer(max_queue: usize) -> Arc<Tracer> {
        let settings = TraceSettings {
            // Nothing listens there: the exporter's posts fail, which is not looked at.
            endpoint: http::Uri::from_static("http://127.0.0.1:9/v1/traces"),
            sample: 1.0,
            service_name: "t".into(),
            max_queue,
            headers: Vec::new(),
        };
        Arc::new(Tracer::start(settings))
    }

    fn span() -> Span {
        super::super::tests::span()
    }

    fn waiting(t: &Tracer) -> usize {
        t.queue.waiting()
    }

    #[test]
    fn a_gathering_thread_hands_its_spans_on_in_batches() {
        std::thread::spawn(|| {
            let t = tracer(10_000);
            batch_this_thread();
            for _ in 0..HAND_AT - 1 {
                record(&t, span());
            }
            assert_eq!(waiting(&t), 0, "held until the batch is full");
            record(&t, span());
            assert_eq!(waiting(&t), HAND_AT);
            record(&t, span());
            flush_this_thread();
            assert_eq!(waiting(&t), HAND_AT + 1);
            // A span under another tracer (a reload) hands the first one's on first.
            let next = tracer(10_000);
            record(&t, span());
            record(&next, span());
            assert_eq!((waiting(&t), waiting(&next)), (HAND_AT + 2, 0));
            flush_this_thread();
            assert_eq!(waiting(&next), 1);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_that_does_not_gather_hands_each_span_on() {
        std::thread::spawn(|| {
            let t = tracer(2);
            for _ in 0..3 {
                record(&t, span());
            }
            assert_eq!(waiting(&t), 2, "the third found no room");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_batch_takes_what_room_is_left_and_the_rest_is_dropped() {
        let t = tracer(100);
        let batch = || (0..HAND_AT).map(|_| span()).collect::<Vec<_>>();
        assert_eq!(t.queue.push(batch()), 0);
        assert_eq!(t.queue.push(batch()), 2 * HAND_AT - 100);
        assert_eq!(waiting(&t), 100);
        assert_eq!(t.queue.push(batch()), HAND_AT);
        assert_eq!(waiting(&t), 100);
    }
}
