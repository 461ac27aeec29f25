//! HPACK decoding (RFC 7541): integers, string literals (Huffman coded or not), the
//! static table and the connection's dynamic table.
//!
//! Written here rather than taken from a crate: `loona-hpack`, the maintained decoder
//! this front end started with, builds a hash map of the Huffman code for every coded
//! string, which made decoding an h2load request's block cost about 220 000
//! instructions (`docs/performance.md`, "HTTP/2 from clients, own codec"); the `h2`
//! crate's decoder is not public. This one decodes the canonical Huffman code a bit at a
//! time with four small tables and allocates nothing per block once its buffers have
//! grown. `fuzz/fuzz_targets/hpack.rs` checks it against `loona-hpack` on any input.

use std::collections::VecDeque;

/// The static table (RFC 7541 Appendix A).
const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// The first code of each length (RFC 7541 Appendix B's code is canonical).
const FIRST: [u32; 31] = [
    0, 0, 0, 0, 0, 0, 20, 92, 248, 508, 1016, 2042, 4090, 8184, 16380, 32764, 65534, 131068,
    262136, 524272, 1048550, 2097116, 4194258, 8388568, 16777194, 33554412, 67108832, 134217694,
    268435426, 536870910, 1073741820,
];
/// How many codes each length has.
const COUNT: [u32; 31] = [
    0, 0, 0, 0, 0, 10, 26, 32, 6, 0, 5, 3, 2, 6, 2, 3, 0, 0, 0, 3, 8, 13, 26, 29, 12, 4, 15, 19,
    29, 0, 4,
];
/// Where each length's symbols start in [`SYMBOLS`].
const OFFSET: [u16; 31] = [
    0, 0, 0, 0, 0, 0, 10, 36, 68, 74, 74, 79, 82, 84, 90, 92, 95, 95, 95, 95, 98, 106, 119, 145,
    174, 186, 190, 205, 224, 253, 253,
];
/// The symbols in code order (256 is EOS).
const SYMBOLS: [u16; 257] = [
    48, 49, 50, 97, 99, 101, 105, 111, 115, 116, 32, 37, 45, 46, 47, 51, 52, 53, 54, 55, 56, 57,
    61, 65, 95, 98, 100, 102, 103, 104, 108, 109, 110, 112, 114, 117, 58, 66, 67, 68, 69, 70, 71,
    72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 89, 106, 107, 113, 118, 119,
    120, 121, 122, 38, 42, 44, 59, 88, 90, 33, 34, 40, 41, 63, 39, 43, 124, 35, 62, 0, 36, 64, 91,
    93, 126, 94, 125, 60, 96, 123, 92, 195, 208, 128, 130, 131, 162, 184, 194, 224, 226, 153, 161,
    167, 172, 176, 177, 179, 209, 216, 217, 227, 229, 230, 129, 132, 133, 134, 136, 146, 154, 156,
    160, 163, 164, 169, 170, 173, 178, 181, 185, 186, 187, 189, 190, 196, 198, 228, 232, 233, 1,
    135, 137, 138, 139, 140, 141, 143, 147, 149, 150, 151, 152, 155, 157, 158, 165, 166, 168, 174,
    175, 180, 182, 183, 188, 191, 197, 231, 239, 9, 142, 144, 145, 148, 159, 171, 206, 215, 225,
    236, 237, 199, 207, 234, 235, 192, 193, 200, 201, 202, 205, 210, 213, 218, 219, 238, 240, 242,
    243, 255, 203, 204, 211, 212, 214, 221, 222, 223, 241, 244, 245, 246, 247, 248, 250, 251, 252,
    253, 254, 2, 3, 4, 5, 6, 7, 8, 11, 12, 14, 15, 16, 17, 18, 19, 20, 21, 23, 24, 25, 26, 27, 28,
    29, 30, 31, 127, 220, 249, 10, 13, 22, 256,
];

/// A block that is not valid HPACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Invalid;

/// One entry of the dynamic table: its name and value in one allocation.
struct Entry {
    bytes: Box<[u8]>,
    name_len: usize,
}

impl Entry {
    fn name(&self) -> &[u8] {
        &self.bytes[..self.name_len]
    }

    fn value(&self) -> &[u8] {
        &self.bytes[self.name_len..]
    }

    /// Its size as RFC 7541 §4.1 counts it.
    fn size(&self) -> usize {
        self.bytes.len() + 32
    }
}

/// A connection's decoder: its dynamic table, and the buffers a field is decoded into.
pub(crate) struct Decoder {
    /// Newest first.
    table: VecDeque<Entry>,
    size: usize,
    /// The table's size now, and the most the client may set it to (this side's
    /// `SETTINGS_HEADER_TABLE_SIZE`).
    max: usize,
    allowed: usize,
    name: Vec<u8>,
    value: Vec<u8>,
}

impl Decoder {
    /// A decoder whose client may use a table of `allowed` bytes.
    pub(crate) fn new(allowed: usize) -> Decoder {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max: allowed,
            allowed,
            name: Vec::new(),
            value: Vec::new(),
        }
    }

    /// Decodes `block`, handing each field to `each` as it comes; `each` returning
    /// `false` stops the decoding (the block is then refused, and the table can no
    /// longer follow the client's: the connection must end).
    pub(crate) fn decode(
        &mut self,
        block: &[u8],
        mut each: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), Invalid> {
        let mut at = 0;
        let mut fields = 0;
        while at < block.len() {
            let b = block[at];
            if b & 0xe0 == 0x20 {
                // A size update, only before the first field (RFC 7541 §4.2).
                let (size, used) = integer(&block[at..], 5)?;
                if fields > 0 || size > self.allowed {
                    return Err(Invalid);
                }
                self.max = size;
                self.evict(0);
                at += used;
                continue;
            }
            fields += 1;
            if b & 0x80 != 0 {
                // Indexed: handed over from the table as it is, never copied (a block
                // of one-byte references to a large entry costs no more than its size).
                let (index, used) = integer(&block[at..], 7)?;
                let (name, value) = entry(&self.table, index)?;
                if !each(name, value) {
                    return Err(Invalid);
                }
                at += used;
                continue;
            }
            at += self.field(&block[at..])?;
            if !each(&self.name, &self.value) {
                return Err(Invalid);
            }
        }
        Ok(())
    }

    /// Decodes one literal field representation into `self.name` and `self.value`; the
    /// bytes it took.
    fn field(&mut self, rest: &[u8]) -> Result<usize, Invalid> {
        let b = rest[0];
        let (prefix, indexing) = match b & 0xc0 == 0x40 {
            true => (6, true),
            false => (4, false),
        };
        let (index, mut used) = integer(rest, prefix)?;
        if index == 0 {
            used += string(&rest[used..], &mut self.name)?;
        } else {
            copy(&mut self.name, entry(&self.table, index)?.0);
        }
        used += string(&rest[used..], &mut self.value)?;
        if indexing {
            self.insert();
        }
        Ok(used)
    }

    /// Enters the field just decoded in the dynamic table (RFC 7541 §4.4): an entry
    /// larger than the table empties it and is not entered.
    fn insert(&mut self) {
        let mut bytes = Vec::with_capacity(self.name.len() + self.value.len());
        bytes.extend_from_slice(&self.name);
        bytes.extend_from_slice(&self.value);
        let e = Entry {
            bytes: bytes.into_boxed_slice(),
            name_len: self.name.len(),
        };
        let size = e.size();
        self.evict(size);
        if size <= self.max {
            self.size += size;
            self.table.push_front(e);
        }
    }

    /// Evicts the oldest entries until `room` more bytes fit.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max {
            match self.table.pop_back() {
                Some(e) => self.size -= e.size(),
                None => break,
            }
        }
    }
}

/// The entry at `index` of the static table, then of the dynamic one, `table`.
fn entry(table: &VecDeque<Entry>, index: usize) -> Result<(&[u8], &[u8]), Invalid> {
    match index {
        0 => Err(Invalid),
        1..=61 => Ok(STATIC[index - 1]),
        _ => {
            let e = table.get(index - 62).ok_or(Invalid)?;
            Ok((e.name(), e.value()))
        }
    }
}

/// Makes `to` a copy of `from`, in the room it has.
fn copy(to: &mut Vec<u8>, from: &[u8]) {
    to.clear();
    to.extend_from_slice(from);
}

/// An integer with a `prefix`-bit prefix (RFC 7541 §5.1), and the bytes it took; values
/// past 2^28 are refused (no field or table is that large).
fn integer(b: &[u8], prefix: u8) -> Result<(usize, usize), Invalid> {
    let max = (1usize << prefix) - 1;
    let mut value = (b[0] as usize) & max;
    if value < max {
        return Ok((value, 1));
    }
    let mut shift = 0;
    for (i, &byte) in b.iter().enumerate().skip(1) {
        value += ((byte & 0x7f) as usize) << shift;
        if byte & 0x80 == 0 {
            return Ok((value, i + 1));
        }
        shift += 7;
        if shift > 21 {
            return Err(Invalid);
        }
    }
    Err(Invalid)
}

/// A string literal (RFC 7541 §5.2) into `out`; the bytes it took.
fn string(b: &[u8], out: &mut Vec<u8>) -> Result<usize, Invalid> {
    let first = *b.first().ok_or(Invalid)?;
    let (len, used) = integer(b, 7)?;
    let raw = b.get(used..used + len).ok_or(Invalid)?;
    out.clear();
    match first & 0x80 != 0 {
        true => huffman(raw, out)?,
        false => out.extend_from_slice(raw),
    }
    Ok(used + len)
}

/// Decodes Huffman-coded `raw` (RFC 7541 §5.2, Appendix B) into `out`. A code of up to
/// eight bits (most characters of a path or a value) is one look-up in [`SHORT`]; a longer
/// one is searched for length by length through the canonical code's tables. It took a
/// bit at a time before, about 70 instructions a character: browsers and nghttp2 send
/// every `:path` as a Huffman-coded literal (`docs/performance.md`, "Huffman by the
/// byte"). Padding longer than 7 bits, padding that is not the EOS code's first bits, and
/// EOS itself are errors.
fn huffman(raw: &[u8], out: &mut Vec<u8>) -> Result<(), Invalid> {
    out.reserve(raw.len() * 8 / 5);
    let mut input = raw.iter();
    // The bits not decoded yet: the last `n` of `bits`.
    let (mut bits, mut n) = (0u64, 0u32);
    loop {
        while n <= 56 {
            let Some(&byte) = input.next() else { break };
            (bits, n) = ((bits << 8) | u64::from(byte), n + 8);
        }
        // The next eight bits, zeros after the last at the end.
        let top = match n >= 8 {
            true => bits >> (n - 8),
            false => bits << (8 - n),
        };
        let (symbol, len) = match SHORT[(top & 0xff) as usize] {
            (symbol, len) if len != 0 && u32::from(len) <= n => (u16::from(symbol), u32::from(len)),
            _ => match long_code(bits, n) {
                Some(code) => code,
                None => {
                    // No code in what is left: padding, all ones and shorter than a byte.
                    let padding = n <= 7 && bits == (1 << n) - 1 && input.len() == 0;
                    return padding.then_some(()).ok_or(Invalid);
                }
            },
        };
        if symbol == 256 {
            return Err(Invalid);
        }
        out.push(symbol as u8);
        n -= len;
        bits &= (1 << n) - 1;
    }
}

/// The code at the front of the last `n` bits of `bits`, searched length by length:
/// `(symbol, length)`, or `None` when those bits begin no code.
fn long_code(bits: u64, n: u32) -> Option<(u16, u32)> {
    (5..=n.min(30)).find_map(|len| {
        let code = ((bits >> (n - len)) & ((1 << len) - 1)) as u32;
        let i = code.wrapping_sub(FIRST[len as usize]);
        (i < COUNT[len as usize])
            .then(|| (SYMBOLS[OFFSET[len as usize] as usize + i as usize], len))
    })
}

/// The codes of up to eight bits, by any byte they begin: `(symbol, length)`, length 0
/// where a byte begins a longer code.
static SHORT: [(u8, u8); 256] = short_codes();

/// [`SHORT`], from the canonical code's tables.
const fn short_codes() -> [(u8, u8); 256] {
    let mut table = [(0u8, 0u8); 256];
    let mut len = 5;
    while len <= 8 {
        let mut i = 0;
        while i < COUNT[len] {
            let symbol = SYMBOLS[OFFSET[len] as usize + i as usize] as u8;
            let from = ((FIRST[len] + i) << (8 - len)) as usize;
            let mut j = 0;
            while j < 1 << (8 - len) {
                table[from + j] = (symbol, len as u8);
                j += 1;
            }
            i += 1;
        }
        len += 1;
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each field's name and value.
    type List = Vec<(Vec<u8>, Vec<u8>)>;

    fn decoded(d: &mut Decoder, block: &[u8]) -> Result<List, Invalid> {
        let mut list = Vec::new();
        d.decode(block, |n, v| {
            list.push((n.to_vec(), v.to_vec()));
            true
        })?;
        Ok(list)
    }

    #[test]
    fn rfc_7541_c4_requests_with_huffman_coding_decode_in_turn() {
        // RFC 7541 C.4.1 to C.4.3: three requests on one connection.
        let blocks: [&[u8]; 3] = [
            &[
                0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab,
                0x90, 0xf4, 0xff,
            ],
            &[
                0x82, 0x86, 0x84, 0xbe, 0x58, 0x86, 0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf,
            ],
            &[
                0x82, 0x87, 0x85, 0xbf, 0x40, 0x88, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f,
                0x89, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xb8, 0xe8, 0xb4, 0xbf,
            ],
        ];
        let mut d = Decoder::new(4096);
        let third = blocks
            .iter()
            .map(|b| decoded(&mut d, b).unwrap())
            .last()
            .unwrap();
        let text: Vec<(String, String)> = third
            .into_iter()
            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
            .collect();
        let want = [
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(text, want);
        assert_eq!(d.size, 164, "RFC 7541 C.4.3's table size");
    }

    #[test]
    fn the_static_table_is_loona_hpacks() {
        let mut ours = Decoder::new(4096);
        let mut theirs = loona_hpack::Decoder::new();
        for i in 1..=61u8 {
            let block = [0x80 | i];
            assert_eq!(
                decoded(&mut ours, &block).unwrap(),
                theirs.decode(&block).unwrap(),
                "{i}"
            );
        }
    }

    #[test]
    fn broken_blocks_are_refused() {
        let mut d = Decoder::new(4096);
        for block in [
            &[0x80][..],                                 // index 0
            &[0xbe],                                     // past both tables
            &[0x82, 0x3f, 0xe1, 0x1f],                   // a size update after a field
            &[0x3f, 0xe2, 0x1f],                         // a size over the allowed one
            &[0x00, 0x85, 0xff, 0xff],                   // a name cut short
            &[0x00, 0x81, 0x00, 0x00],                   // Huffman padding of zeros
            &[0x82, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f], // an integer too large
        ] {
            assert_eq!(decoded(&mut d, block), Err(Invalid), "{block:x?}");
        }
    }

    #[test]
    fn a_smaller_table_evicts_and_an_oversized_entry_empties_it() {
        let mut d = Decoder::new(4096);
        // foo: bar (3 + 3 + 32 = 38 bytes) entered, then the table shrunk to 37.
        decoded(&mut d, &[0x40, 3, b'f', b'o', b'o', 3, b'b', b'a', b'r']).unwrap();
        assert_eq!(d.size, 38);
        assert!(decoded(&mut d, &[0xbe]).is_ok());
        decoded(&mut d, &[0x3f, 0x06]).unwrap(); // 31 + 6 = 37
        assert_eq!((d.size, d.table.len()), (0, 0));
        assert_eq!(decoded(&mut d, &[0xbe]), Err(Invalid));
    }

    // The Huffman decoder by the byte against the one by the bit.

    /// The decoder as it was, a bit at a time: what [`huffman`] must agree with.
    fn huffman_by_bit(raw: &[u8], out: &mut Vec<u8>) -> Result<(), Invalid> {
        out.reserve(raw.len() * 8 / 5);
        let (mut code, mut len) = (0u32, 0usize);
        for &byte in raw {
            for shift in (0..8).rev() {
                code = (code << 1) | u32::from((byte >> shift) & 1);
                len += 1;
                if len < 5 {
                    continue;
                }
                if len > 30 {
                    return Err(Invalid);
                }
                let i = code.wrapping_sub(FIRST[len]);
                if i < COUNT[len] {
                    let symbol = SYMBOLS[OFFSET[len] as usize + i as usize];
                    if symbol == 256 {
                        return Err(Invalid);
                    }
                    out.push(symbol as u8);
                    (code, len) = (0, 0);
                }
            }
        }
        match len <= 7 && code == (1 << len) - 1 {
            true => Ok(()),
            false => Err(Invalid),
        }
    }

    /// `text` Huffman-coded, padded with `pad` (its low bits; all ones is the valid one).
    fn huffman_coded(text: &[u8], pad: u8) -> Vec<u8> {
        let (mut out, mut acc, mut n) = (Vec::new(), 0u64, 0u32);
        for &c in text {
            let at = SYMBOLS.iter().position(|&s| s == u16::from(c)).unwrap();
            let len = (5..=30)
                .find(|&l| {
                    (OFFSET[l] as usize..OFFSET[l] as usize + COUNT[l] as usize).contains(&at)
                })
                .unwrap();
            let code = FIRST[len] + (at - OFFSET[len] as usize) as u32;
            (acc, n) = ((acc << len) | u64::from(code), n + len as u32);
            while n >= 8 {
                out.push((acc >> (n - 8)) as u8);
                n -= 8;
                acc &= (1 << n) - 1;
            }
        }
        if n > 0 {
            out.push(((acc << (8 - n)) as u8) | (pad & ((1u8 << (8 - n)) - 1)));
        }
        out
    }

    proptest::proptest! {
        #[test]
        fn huffman_decodes_what_it_decoded_by_the_bit(raw in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let (ra, rb) = (huffman(&raw, &mut a), huffman_by_bit(&raw, &mut b));
            proptest::prop_assert_eq!(ra, rb);
            if ra.is_ok() {
                proptest::prop_assert_eq!(a, b);
            }
        }

        #[test]
        fn huffman_decodes_any_text_and_refuses_bad_padding(text in proptest::collection::vec(proptest::num::u8::ANY, 0..40), pad in proptest::num::u8::ANY) {
            for pad in [0xff, pad] {
                let raw = huffman_coded(&text, pad);
                let (mut a, mut b) = (Vec::new(), Vec::new());
                let (ra, rb) = (huffman(&raw, &mut a), huffman_by_bit(&raw, &mut b));
                proptest::prop_assert_eq!(ra, rb);
                if pad == 0xff {
                    proptest::prop_assert_eq!(ra, Ok(()));
                    proptest::prop_assert_eq!(&a, &text);
                }
            }
        }
    }

    #[test]
    fn huffman_refuses_eos_and_long_padding() {
        let mut out = Vec::new();
        // EOS: thirty ones, then two of padding.
        assert_eq!(huffman(&[0xff, 0xff, 0xff, 0xff], &mut out), Err(Invalid));
        // A whole byte of padding after a complete code.
        let mut raw = huffman_coded(b"a", 0xff);
        raw.push(0xff);
        assert_eq!(huffman(&raw, &mut out), Err(Invalid));
        // EOS after a symbol: `a` (00011), then EOS's thirty ones, then one of padding.
        assert_eq!(
            huffman(&[0x1f, 0xff, 0xff, 0xff, 0xff], &mut out),
            Err(Invalid)
        );
        // Seven bits of padding are taken, eight or more are not: five `a`s (00011 each)
        // are 25 bits, padded with seven ones; a byte of ones after them makes fifteen.
        out.clear();
        let five = huffman_coded(b"aaaaa", 0xff);
        assert_eq!(five.len(), 4);
        assert_eq!(huffman(&five, &mut out), Ok(()));
        assert_eq!(out, b"aaaaa");
        let mut longer = five.clone();
        longer.push(0xff);
        assert_eq!(huffman(&longer, &mut out), Err(Invalid));
        // `0` (00000) padded with three ones; with a byte of ones more, eleven.
        out.clear();
        assert_eq!(huffman(&[0x07], &mut out), Ok(()));
        assert_eq!(out, b"0");
        assert_eq!(huffman(&[0x07, 0xff], &mut out), Err(Invalid));
        out.clear();
        assert_eq!(huffman(&huffman_coded(b"/cost?1", 0xff), &mut out), Ok(()));
        assert_eq!(out, b"/cost?1");
    }
}
