//! A body's hash for the comparison (`docs/traffic.md`, "Compare"): read as it streams,
//! up to the mirror's body limit. With `ignore_json`, the body is kept instead and, when
//! it is JSON, hashed without the named paths (`meta.trace_id`, `items.*.etag`); a body
//! that is not JSON is hashed whole.

use serde_json::Value;
use xxhash_rust::xxh3::Xxh3;

/// One step of an `ignore_json` path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// A member of an object.
    Name(String),
    /// Every element of an array (`*`).
    Each,
}

/// The `ignore_json` paths, read once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Ignored(Vec<Vec<Step>>);

impl Ignored {
    /// The paths as configured (each checked already: dotted, no empty step).
    pub(crate) fn new(paths: &[String]) -> Ignored {
        let read = |p: &String| {
            (p.split('.'))
                .map(|s| match s {
                    "*" => Step::Each,
                    name => Step::Name(name.to_string()),
                })
                .collect()
        };
        Ignored(paths.iter().map(read).collect())
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `v` without the paths.
    fn strip(&self, v: &mut Value) {
        for path in &self.0 {
            remove(v, path);
        }
    }
}

/// Removes `path` from `v`, wherever it leads (`*` into every element of an array).
fn remove(v: &mut Value, path: &[Step]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    match (first, v) {
        (Step::Name(n), Value::Object(m)) if rest.is_empty() => {
            m.remove(n);
        }
        (Step::Name(n), Value::Object(m)) => {
            if let Some(inner) = m.get_mut(n) {
                remove(inner, rest);
            }
        }
        (Step::Each, Value::Array(items)) if !rest.is_empty() => {
            for item in items {
                remove(item, rest);
            }
        }
        (Step::Each, Value::Array(items)) => items.clear(),
        _ => {}
    }
}

/// A body's hash as it is read.
pub(crate) struct Digest {
    kind: Kind,
    /// Bytes read so far.
    len: u64,
    limit: u64,
}

enum Kind {
    /// Hashed as it streams.
    Streaming(Box<Xxh3>),
    /// Kept whole, to take the ignored paths out first.
    Kept(Vec<u8>),
}

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Digest")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl Digest {
    /// A hash of a body up to `limit` bytes; with `ignored` paths, kept whole first.
    pub(crate) fn new(limit: u64, ignored: &Ignored) -> Digest {
        let kind = match ignored.is_empty() {
            true => Kind::Streaming(Box::default()),
            false => Kind::Kept(Vec::new()),
        };
        Digest {
            kind,
            len: 0,
            limit,
        }
    }

    /// Whether the body is kept whole (to take `ignore_json`'s paths out): finishing it
    /// parses it.
    pub(crate) fn is_kept(&self) -> bool {
        matches!(self.kind, Kind::Kept(_))
    }

    /// Takes the next piece of the body.
    pub(crate) fn update(&mut self, data: &[u8]) {
        self.len = self.len.saturating_add(data.len() as u64);
        if self.len > self.limit {
            // Over the limit: the body is not compared; nothing more is kept.
            if let Kind::Kept(v) = &mut self.kind {
                *v = Vec::new();
            }
            return;
        }
        match &mut self.kind {
            Kind::Streaming(h) => h.update(data),
            Kind::Kept(v) => v.extend_from_slice(data),
        }
    }

    /// The hash of the whole body, `None` when it was over the limit.
    pub(crate) fn finish(self, ignored: &Ignored) -> Option<u64> {
        if self.len > self.limit {
            return None;
        }
        Some(match self.kind {
            Kind::Streaming(h) => h.digest(),
            Kind::Kept(body) => match serde_json::from_slice::<Value>(&body) {
                Ok(mut v) => {
                    ignored.strip(&mut v);
                    // serde_json's maps are ordered by key: the same members in any
                    // order hash the same.
                    xxhash_rust::xxh3::xxh3_64(&serde_json::to_vec(&v).unwrap_or(body))
                }
                Err(_) => xxhash_rust::xxh3::xxh3_64(&body),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(body: &[u8], limit: u64, ignored: &Ignored) -> Option<u64> {
        let mut d = Digest::new(limit, ignored);
        for piece in body.chunks(3) {
            d.update(piece);
        }
        d.finish(ignored)
    }

    #[test]
    fn streaming_hash_does_not_depend_on_the_pieces() {
        let none = Ignored::default();
        let whole = {
            let mut d = Digest::new(100, &none);
            d.update(b"hello, world");
            d.finish(&none)
        };
        assert_eq!(hash(b"hello, world", 100, &none), whole);
        assert_ne!(hash(b"hello, World", 100, &none), whole);
        assert_eq!(hash(b"hello, world", 5, &none), None);
    }

    #[test]
    fn ignored_paths_are_taken_out_of_json() {
        let ig = Ignored::new(&[
            "updated_at".into(),
            "meta.trace_id".into(),
            "items.*.etag".into(),
        ]);
        let a = br#"{"id":1,"updated_at":"x","meta":{"trace_id":"a","v":2},"items":[{"n":1,"etag":"p"},{"n":2,"etag":"q"}]}"#;
        let b = br#"{"items":[{"etag":"r","n":1},{"n":2,"etag":"s"}],"meta":{"v":2,"trace_id":"b"},"updated_at":"y","id":1}"#;
        assert_eq!(hash(a, 1000, &ig), hash(b, 1000, &ig));
        let c = br#"{"id":2,"updated_at":"x","meta":{"trace_id":"a","v":2},"items":[{"n":1,"etag":"p"},{"n":2,"etag":"q"}]}"#;
        assert_ne!(hash(a, 1000, &ig), hash(c, 1000, &ig));
        // Not JSON: compared whole.
        assert_ne!(hash(b"plain a", 1000, &ig), hash(b"plain b", 1000, &ig));
        assert_eq!(hash(b"plain a", 1000, &ig), hash(b"plain a", 1000, &ig));
    }
}
