//! The fuzz targets' entry points (`fuzz/`, see `docs/architecture.md`, "Tests and benchmarks"): each takes arbitrary
//! bytes and checks what must hold whatever they are. A panic is a finding. Compiled
//! for `cargo fuzz` (`--cfg fuzzing`) and for the unit test below, which replays every
//! committed input, so an input that once failed stays a test case.

/// The fast path's client head parser, validation, and the two header rewriters.
pub fn client_head(data: &[u8]) {
    crate::front::fuzz_client_head(data, false);
}

/// Header rewriting: the fast path's writer and the map path forward the same fields.
pub fn header_rewrite(data: &[u8]) {
    crate::front::fuzz_client_head(data, true);
}

/// The upstream response head parser.
pub fn upstream_response(data: &[u8]) {
    crate::proxy::fuzz_response(data);
}

/// The chunked decoder.
pub fn chunked(data: &[u8]) {
    crate::proxy::fuzz_chunked(data);
}

/// The route matcher: the precomputed table against a scan in order.
pub fn route(data: &[u8]) {
    crate::route::fuzz_find(data);
}

/// The config file parser.
pub fn config(data: &[u8]) {
    crate::config::fuzz_config(data);
}

/// A client certificate's reading: its names, its dates, its XFCC value.
pub fn certificate(data: &[u8]) {
    crate::identity::fuzz_certificate(data);
}

/// A bearer token's reading and check, and a JWK set's reading.
pub fn bearer_token(data: &[u8]) {
    crate::jwt::fuzz_token(data);
}

/// HTTP/2 frames: parsed or refused, and a header block written in frames reads back.
pub fn h2_frames(data: &[u8]) {
    crate::http2::fuzz_frames(data);
}

/// HTTP/2 header blocks: decoded or refused, and an answer's fields round-trip.
pub fn hpack(data: &[u8]) {
    crate::http2::fuzz_hpack(data);
}

/// What fulcrum's HPACK decoder makes of a block on a new connection (`None`: refused);
/// the fuzz target compares it with another decoder's.
pub fn hpack_decoded(data: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    crate::http2::hpack_decoded(data)
}

/// A whole HTTP/2 connection fed arbitrary frames.
pub fn h2_connection(data: &[u8]) {
    crate::http2::fuzz_connection(data);
}

/// A TLS connection's first bytes read for passthrough (`tcp::hello`): whatever they
/// are, the reading ends without a panic, a name found is a lowercase host name, and a
/// handshake message reads the same whole in one record or cut into many.
pub fn client_hello(data: &[u8]) {
    crate::tcp::hello::fuzz(data);
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// What the `hpack` fuzz target checks beyond [`super::hpack`]: fulcrum's decoder
    /// agrees with `loona-hpack`'s on every block both take.
    fn hpack_against_loona(data: &[u8]) {
        let mut other = loona_hpack::Decoder::new();
        other.set_max_allowed_table_size(4096);
        if let (Some(ours), Ok(theirs)) = (super::hpack_decoded(data), other.decode(data)) {
            assert_eq!(ours, theirs);
        }
    }

    /// Runs every file of `fuzz/corpus/TARGET` and `fuzz/regressions/TARGET`.
    fn replay(target: &str, entry: fn(&[u8])) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
        let mut n = 0;
        for dir in ["corpus", "regressions"] {
            let Ok(files) = std::fs::read_dir(root.join(dir).join(target)) else {
                continue;
            };
            for f in files.flatten() {
                let data = std::fs::read(f.path()).expect("a committed input");
                entry(&data);
                n += 1;
            }
        }
        assert!(n > 0, "no committed inputs for {target}");
    }

    #[test]
    fn committed_inputs_pass_every_target() {
        replay("client_head", super::client_head);
        replay("header_rewrite", super::header_rewrite);
        replay("upstream_response", super::upstream_response);
        replay("chunked", super::chunked);
        replay("config", super::config);
        replay("route", super::route);
        replay("certificate", super::certificate);
        replay("bearer_token", super::bearer_token);
        replay("h2_frames", super::h2_frames);
        replay("hpack", super::hpack);
        replay("hpack", hpack_against_loona);
        replay("h2_connection", super::h2_connection);
        replay("client_hello", super::client_hello);
    }
}
