#![no_main]
//! See `src/fuzzing.rs` for what this target checks; beyond it, fulcrum's HPACK decoder
//! must agree with `loona-hpack`'s on every block both take (it may refuse more: a size
//! update after a field, integers past 2^28).

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fulcrum::fuzzing::hpack(data);
    let mut other = loona_hpack::Decoder::new();
    other.set_max_allowed_table_size(4096);
    if let (Some(ours), Ok(theirs)) = (fulcrum::fuzzing::hpack_decoded(data), other.decode(data)) {
        assert_eq!(ours, theirs);
    }
});
