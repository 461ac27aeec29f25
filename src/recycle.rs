//! A boxed future whose memory a worker thread keeps for the next one
//! (`docs/performance.md`, "The review's fixes").
//!
//! The fast path boxes each request's future (about 2.4 KiB): a connection must not hold
//! that memory while it waits for its next request. But glibc serves blocks over 1 KiB
//! from its bins, not from its per-thread cache, and a malloc and free of such a block
//! cost a few hundred instructions, more when the heap around it is fragmented: as much
//! as any step of the request itself. So each worker thread keeps the block of the last
//! request future that ended, and the next one of the same layout takes it: one block
//! per thread, however many connections wait. No allocator crate offers a per-thread
//! spare of one exact layout without replacing the global allocator (which was measured
//! worse, `docs/architecture.md`), hence this small one.

use std::alloc::Layout;
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};

thread_local! {
    /// The spare block and its layout, if any.
    static SPARE: Cell<Option<(Layout, NonNull<u8>)>> = const { Cell::new(None) };
}

/// A future in a block of its own, never moved (as in a `Pin<Box<F>>`): the block goes
/// back to the thread's spare when it is dropped.
pub(crate) struct Recycled<F> {
    ptr: NonNull<F>,
}

impl<F: Future> Recycled<F> {
    /// `f`, in the thread's spare block when it has one of `F`'s layout, else in a new
    /// one.
    pub(crate) fn new(f: F) -> Recycled<F> {
        let layout = Layout::new::<F>();
        let ptr = if layout.size() == 0 {
            NonNull::dangling()
        } else {
            let spare = SPARE.with(|s| match s.take() {
                Some((l, p)) if l == layout => Some(p),
                other => {
                    s.set(other);
                    None
                }
            });
            let raw = match spare {
                Some(p) => p.as_ptr(),
                // SAFETY: the layout's size is not zero.
                None => unsafe { std::alloc::alloc(layout) },
            };
            match NonNull::new(raw.cast::<F>()) {
                Some(p) => p,
                None => std::alloc::handle_alloc_error(layout),
            }
        };
        // SAFETY: `ptr` is valid for writes of an `F` and suitably aligned (a fresh or
        // spare block of `F`'s own layout, or dangling for a zero-sized `F`).
        unsafe { ptr.as_ptr().write(f) };
        Recycled { ptr }
    }
}

impl<F> Drop for Recycled<F> {
    fn drop(&mut self) {
        let layout = Layout::new::<F>();
        // SAFETY: the block holds an initialised `F`, dropped exactly once here.
        unsafe { std::ptr::drop_in_place(self.ptr.as_ptr()) };
        if layout.size() == 0 {
            return;
        }
        let block = self.ptr.cast::<u8>();
        let kept = SPARE.with(|s| match s.take() {
            None => {
                s.set(Some((layout, block)));
                true
            }
            other => {
                s.set(other);
                false
            }
        });
        if !kept {
            // SAFETY: the block was allocated with this layout by the global allocator.
            unsafe { std::alloc::dealloc(block.as_ptr(), layout) };
        }
    }
}

impl<F: Future> Future for Recycled<F> {
    type Output = F::Output;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: the future lives at a fixed address until it is dropped in place
        // (`Recycled` never moves it out and hands out no other access), so pinned
        // access to it is sound, as through a `Pin<Box<F>>`.
        unsafe { Pin::new_unchecked(&mut *self.get_mut().ptr.as_ptr()) }.poll(cx)
    }
}

// SAFETY: a `Recycled<F>` owns its `F` as a `Box<F>` would; the spare it gives its block
// back to is the dropping thread's own.
unsafe impl<F: Send> Send for Recycled<F> {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A future of about 3 KiB, of one type whatever `b` is.
    async fn sum_of(b: [u8; 3000]) -> u32 {
        tokio::task::yield_now().await;
        b.iter().map(|&x| u32::from(x)).sum::<u32>()
    }

    #[tokio::test]
    async fn a_future_runs_to_its_end_and_the_next_one_takes_its_block() {
        let first = Recycled::new(sum_of([7; 3000]));
        let at = first.ptr.as_ptr() as usize;
        assert_eq!(first.await, 21_000);
        let second = Recycled::new(sum_of([1; 3000]));
        assert_eq!(second.ptr.as_ptr() as usize, at, "the spare block is taken");
        assert_eq!(second.await, 3000);
        // Another layout gets a block of its own, and a zero-sized future none.
        let other = Recycled::new(async { [1u64; 10].len() });
        assert_eq!(other.await, 10);
        Recycled::new(std::future::ready(())).await;
    }

    #[test]
    fn a_future_dropped_unfinished_is_dropped_in_place() {
        let held = std::rc::Rc::new(());
        let h = std::rc::Rc::clone(&held);
        let f = Recycled::new(async move {
            let _h = h;
            std::future::pending::<()>().await;
        });
        assert_eq!(std::rc::Rc::strong_count(&held), 2);
        drop(f);
        assert_eq!(std::rc::Rc::strong_count(&held), 1);
    }
}
