//! W3C Trace Context (`traceparent`, version 00): read from a caller, written for a
//! backend. A field that is not a valid version-00 value is treated as absent, as the
//! recommendation says (the request then starts its own trace when sampled).

/// A trace's id: 16 bytes, not all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TraceId(pub(crate) [u8; 16]);

/// A span's id: 8 bytes, not all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpanId(pub(crate) [u8; 8]);

impl TraceId {
    /// A new random id.
    pub(crate) fn random() -> TraceId {
        let hi = fastrand::u64(..);
        let lo = fastrand::u64(1..);
        let mut id = [0; 16];
        id[..8].copy_from_slice(&hi.to_be_bytes());
        id[8..].copy_from_slice(&lo.to_be_bytes());
        TraceId(id)
    }
}

impl TraceId {
    /// 32 lowercase hex digits, not all zero.
    pub(crate) fn from_hex(v: &[u8]) -> Option<TraceId> {
        if v.len() != 32 {
            return None;
        }
        let mut id = [0; 16];
        for (i, b) in id.iter_mut().enumerate() {
            *b = hex_byte(&v[2 * i..2 * i + 2])?;
        }
        (id != [0; 16]).then_some(TraceId(id))
    }
}

impl SpanId {
    /// A new random id.
    pub(crate) fn random() -> SpanId {
        SpanId(fastrand::u64(1..).to_be_bytes())
    }
}

/// What a caller's `traceparent` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ParentContext {
    pub(crate) trace: TraceId,
    /// The caller's span: the server span's parent.
    pub(crate) span: SpanId,
    /// Its sampled flag.
    pub(crate) sampled: bool,
}

impl ParentContext {
    /// `00-<32 hex>-<16 hex>-<2 hex>` with neither id all zero; a later version may be
    /// longer (its first four parts read the same way).
    pub(crate) fn parse(v: &[u8]) -> Option<ParentContext> {
        if v.len() < 55 || (v.len() > 55 && v[55] != b'-') || v[2] != b'-' {
            return None;
        }
        let version = hex_byte(&v[0..2])?;
        if version == 0xff || (version == 0 && v.len() != 55) {
            return None;
        }
        if v[35] != b'-' || v[52] != b'-' {
            return None;
        }
        let trace = TraceId::from_hex(&v[3..35])?;
        let mut span = [0; 8];
        for (i, b) in span.iter_mut().enumerate() {
            *b = hex_byte(&v[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&v[53..55])?;
        if span == [0; 8] {
            return None;
        }
        Some(ParentContext {
            trace,
            span: SpanId(span),
            sampled: flags & 1 == 1,
        })
    }
}

/// Two lowercase hex digits.
fn hex_byte(two: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(two[0])? << 4 | digit(two[1])?)
}

/// A `traceparent` value: `00-<32 hex>-<16 hex>-01`, hex digits and dashes only (valid
/// in a field as it is: the request path writes it without making a `HeaderValue`).
pub(crate) type Traceparent = [u8; 55];

/// The `traceparent` naming `span` of `trace`, sampled.
pub(crate) fn traceparent(trace: &TraceId, span: &SpanId) -> Traceparent {
    let mut out = *b"00-00000000000000000000000000000000-0000000000000000-01";
    let trace = u128::from_be_bytes(trace.0);
    out[3..19].copy_from_slice(&hex((trace >> 64) as u64));
    out[19..35].copy_from_slice(&hex(trace as u64));
    out[36..52].copy_from_slice(&hex(u64::from_be_bytes(span.0)));
    out
}

/// `n` as 16 lowercase hex digits, all at once rather than a digit at a time: each
/// of its nibbles moved into a byte of its own, then made a digit in every byte
/// together (a try's `traceparent` is written on the request path).
fn hex(n: u64) -> [u8; 16] {
    const fn every_byte(b: u8) -> u128 {
        u128::from_ne_bytes([b; 16])
    }
    let mut x = u128::from(n);
    x = (x | x << 32) & 0x0000_0000_ffff_ffff_0000_0000_ffff_ffff;
    x = (x | x << 16) & 0x0000_ffff_0000_ffff_0000_ffff_0000_ffff;
    x = (x | x << 8) & 0x00ff_00ff_00ff_00ff_00ff_00ff_00ff_00ff;
    x = (x | x << 4) & every_byte(0x0f);
    // A byte above 9 carries into bit 4 when 6 is added (no byte exceeds 21): those
    // skip from '9' + 1 to 'a', 39 further.
    let letters = ((x + every_byte(6)) >> 4) & every_byte(1);
    (x + every_byte(b'0') + letters * 39).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_reads_and_writes_back() {
        let p = ParentContext::parse(GOOD).unwrap();
        assert!(p.sampled);
        assert_eq!(&traceparent(&p.trace, &p.span)[..], GOOD);
        let unsampled = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(!ParentContext::parse(unsampled).unwrap().sampled);
    }

    #[test]
    fn bad_traceparents_are_absent() {
        for bad in [
            &b"00-00000000000000000000000000000000-00f067aa0ba902b7-01"[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736x00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"",
        ] {
            assert_eq!(
                ParentContext::parse(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // A later version may carry more after the flags.
        let later = b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more";
        assert!(ParentContext::parse(later).is_some());
    }

    #[test]
    fn hex_digits_are_those_of_the_number() {
        for n in [
            0,
            1,
            9,
            10,
            15,
            16,
            0xdead_beef,
            u64::MAX,
            0x0123_4567_89ab_cdef,
        ] {
            assert_eq!(hex(n), *format!("{n:016x}").as_bytes());
        }
    }

    proptest::proptest! {
        #[test]
        fn any_number_in_hex(n in proptest::num::u64::ANY) {
            let digits = format!("{n:016x}");
            proptest::prop_assert_eq!(&hex(n)[..], digits.as_bytes());
        }

        /// A caller's field is untrusted: any bytes parse or are absent, never panic; and
        /// what parses writes back the same for version 00.
        #[test]
        fn any_bytes_parse_or_are_absent(v in proptest::collection::vec(proptest::num::u8::ANY, 0..80)) {
            if let Some(p) = ParentContext::parse(&v) {
                if v.starts_with(b"00-") && v[53..55] == *b"01" {
                    proptest::prop_assert_eq!(&traceparent(&p.trace, &p.span)[..], &v[..]);
                }
            }
        }

        #[test]
        fn written_traceparents_parse_back(trace in proptest::array::uniform16(1u8..), span in proptest::array::uniform8(1u8..)) {
            let written = traceparent(&TraceId(trace), &SpanId(span));
            let p = ParentContext::parse(&written).unwrap();
            proptest::prop_assert_eq!((p.trace.0, p.span.0, p.sampled), (trace, span, true));
        }
    }
}
