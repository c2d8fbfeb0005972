//! The inside of a JSON string from terminal text: every byte a recording keeps passes through
//! here, so it is the recorder's hot loop. Control characters, `"` and `\` are escaped; the
//! rest is copied. Text is scanned sixteen bytes at a time with SSE2 (part of x86-64 itself),
//! eight at a time with word arithmetic elsewhere and for the last few bytes.

/// Appends valid UTF-8 `text` as the inside of a JSON string.
pub fn escape_json(text: &[u8], out: &mut Vec<u8>) {
    if text.len() < SHORT {
        escape_bytes(text, out);
        return;
    }
    out.reserve(text.len());
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    let at = sse2::escape_blocks(text, out);
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    let at = 0;
    escape_words(&text[at..], out);
}

/// Text shorter than this is escaped byte by byte: binary output comes as runs of a few
/// valid bytes between U+FFFDs, and for those setting up the scans costs more than the bytes.
const SHORT: usize = 8;

/// [`escape_json`] one byte at a time.
fn escape_bytes(text: &[u8], out: &mut Vec<u8>) {
    for &b in text {
        match &ESCAPES[b as usize] {
            (_, 0) => out.push(b),
            (bytes, n) => out.extend_from_slice(&bytes[..*n as usize]),
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
mod sse2 {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8, _mm_storeu_si128, _mm_xor_si128,
    };

    use super::push_escape_run;

    const BLOCK: usize = 16;

    /// Escapes `text` block by block while a whole block is left, and returns how far it got
    /// (fewer than sixteen bytes before the end). Each block is stored to `out` whole and
    /// `out` then keeps only the bytes before the first one that needs an escape: one load,
    /// one store and four compares per sixteen bytes, no copy call per run of plain text.
    pub(super) fn escape_blocks(text: &[u8], out: &mut Vec<u8>) -> usize {
        let mut at = 0;
        while at + BLOCK <= text.len() {
            out.reserve(text.len() - at + BLOCK);
            // Plain blocks are handled on local copies of the buffer's pointer and length, so
            // the loop does not go through `out` in memory for every block.
            let base = out.as_mut_ptr();
            let mut len = out.len();
            let mut mask = 0;
            // Every block keeps at most the sixteen bytes it consumes, so the room reserved
            // (what is left of `text` plus a block) is never used up in this loop.
            while at + BLOCK <= text.len() {
                debug_assert!(len + BLOCK <= out.capacity());
                // SAFETY: `at + 16 <= text.len()`: the sixteen bytes read are inside `text`.
                let v = unsafe { _mm_loadu_si128(text.as_ptr().add(at).cast::<__m128i>()) };
                // SAFETY: since the reserve above, `len` grew by at most what `at` did, and the
                // reserve left `text.len() - at + 16` free then: sixteen bytes are free after `len`.
                unsafe { _mm_storeu_si128(base.add(len).cast::<__m128i>(), v) };
                mask = needs_escape_mask(v);
                if mask != 0 {
                    let plain = mask.trailing_zeros() as usize;
                    len += plain;
                    at += plain;
                    break;
                }
                len += BLOCK;
                at += BLOCK;
            }
            // SAFETY: the bytes up to `len` were written by the stores above.
            unsafe { out.set_len(len) };
            if mask != 0 {
                at = push_escape_run(text, at, out);
            }
        }
        at
    }

    /// Bit i set where byte i of `v` is below 0x20, `"` or `\`.
    fn needs_escape_mask(v: __m128i) -> u32 {
        // SSE2 compares bytes as signed: flipping the sign bit of both sides makes "below
        // 0x20" an unsigned compare, so bytes from 0x80 up (UTF-8 beyond ASCII) stay out.
        // SAFETY: this module is built only where SSE2 is enabled (cfg on `mod sse2`).
        unsafe {
            let sign = _mm_set1_epi8(i8::MIN);
            let below_space = _mm_cmplt_epi8(_mm_xor_si128(v, sign), _mm_set1_epi8(0x20 ^ i8::MIN));
            let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
            let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
            _mm_movemask_epi8(_mm_or_si128(below_space, _mm_or_si128(quote, backslash))) as u32
        }
    }
}

/// Bytes that JSON strings cannot hold as they are: control characters, `"` and `\` (those
/// [`ESCAPES`] has an escape for).
const NEEDS_ESCAPE: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = ESCAPES[i].1 != 0;
        i += 1;
    }
    t
};

/// A mask with the high bit set in each of the eight bytes of `w` (first byte lowest) that is
/// below 0x20, `"` or `\`: the classic "has a byte less than n" and "has a zero byte" word
/// tests. Bits above the lowest one may be false (a borrow runs on into the next byte), but the
/// lowest is exact, which is all a scan for the next byte to escape needs.
fn escape_mask(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGHS;
    let q = w ^ (ONES * u64::from(b'"'));
    let quote = q.wrapping_sub(ONES) & !q & HIGHS;
    let s = w ^ (ONES * u64::from(b'\\'));
    let backslash = s.wrapping_sub(ONES) & !s & HIGHS;
    below_space | quote | backslash
}

/// The position of the first byte at or after `from` that needs an escape.
fn next_escape(text: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    // Eight bytes are looked at at once, and the first that needs an escape is found from the
    // word's mask, not byte by byte.
    while let Some(word) = text.get(at..at + 8) {
        let mask = escape_mask(u64::from_le_bytes(word.try_into().expect("eight bytes")));
        if mask != 0 {
            return Some(at + (mask.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    text[at..]
        .iter()
        .position(|&b| NEEDS_ESCAPE[b as usize])
        .map(|k| at + k)
}

/// [`escape_json`] with the word scan only: runs that need no escape are copied whole.
fn escape_words(text: &[u8], out: &mut Vec<u8>) {
    let mut copied = 0;
    while let Some(at) = next_escape(text, copied) {
        out.extend_from_slice(&text[copied..at]);
        copied = push_escape_run(text, at, out);
    }
    out.extend_from_slice(&text[copied..]);
}

/// Escapes the byte at `at`, which needs it, and the bytes straight after it that need one
/// too, and returns where the run ended. Escapes come in runs (NUL padding in a tar archive,
/// ANSI sequences after a newline), so they are looked at one by one before the next scan,
/// each written as one eight-byte store into room reserved for a stretch of them.
fn push_escape_run(text: &[u8], mut at: usize, out: &mut Vec<u8>) -> usize {
    const STRETCH: usize = 64;
    loop {
        out.reserve(STRETCH * 8);
        let base = out.as_mut_ptr();
        let mut len = out.len();
        let stop = (at + STRETCH).min(text.len());
        let mut ended = false;
        while at < stop {
            let (bytes, n) = &ESCAPES[text[at] as usize];
            if *n == 0 {
                ended = true;
                break;
            }
            // SAFETY: at most `STRETCH` escapes of eight bytes are stored after the length
            // `out` had when `STRETCH * 8` bytes were reserved.
            unsafe { std::ptr::write_unaligned(base.add(len).cast::<[u8; 8]>(), *bytes) };
            len += *n as usize;
            at += 1;
        }
        // SAFETY: the bytes up to `len` were written just above.
        unsafe { out.set_len(len) };
        if ended || at == text.len() {
            return at;
        }
    }
}

/// What each ASCII byte is inside a JSON string, padded to eight bytes, and its length: its
/// escape, or the byte itself (length 1). Binary output has an invalid byte every few bytes,
/// too often for the scans above to pay; it is turned into text a byte at a time with this
/// table, one load and one store per byte (`asciicast::Utf8Carry`).
pub(super) const ASCII_IN_JSON: [([u8; 8], u8); 128] = {
    let mut t = [([0u8; 8], 1u8); 128];
    let mut b = 0;
    while b < 128 {
        t[b] = if ESCAPES[b].1 == 0 {
            ([b as u8, 0, 0, 0, 0, 0, 0, 0], 1)
        } else {
            ESCAPES[b]
        };
        b += 1;
    }
    t
};

/// The JSON escape of every byte that needs one, padded to eight bytes, and its length (0 for
/// a byte that needs none).
const ESCAPES: [([u8; 8], u8); 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut t = [([0u8; 8], 0u8); 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = (
            [b'\\', b'u', b'0', b'0', HEX[b >> 4], HEX[b & 0xf], 0, 0],
            6,
        );
        b += 1;
    }
    t[b'"' as usize] = (*b"\\\"\0\0\0\0\0\0", 2);
    t[b'\\' as usize] = (*b"\\\\\0\0\0\0\0\0", 2);
    t[b'\n' as usize] = (*b"\\n\0\0\0\0\0\0", 2);
    t[b'\r' as usize] = (*b"\\r\0\0\0\0\0\0", 2);
    t[b'\t' as usize] = (*b"\\t\0\0\0\0\0\0", 2);
    t[0x08] = (*b"\\b\0\0\0\0\0\0", 2);
    t[0x0c] = (*b"\\f\0\0\0\0\0\0", 2);
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    fn serde_escape(text: &str) -> String {
        let quoted = serde_json::to_string(text).unwrap();
        quoted[1..quoted.len() - 1].to_owned()
    }

    fn ours(text: &[u8], f: fn(&[u8], &mut Vec<u8>)) -> String {
        let mut out = Vec::new();
        f(text, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn json_escaping_matches_serde_json() {
        let text = "plain \" quote \\ back \n\r\t\u{8}\u{c}\u{0}\u{1b}[0m € 😀 \u{7f}";
        assert_eq!(ours(text.as_bytes(), escape_json), serde_escape(text));
    }

    #[test]
    fn byte_vectors() {
        for (text, escaped) in [
            ("", ""),
            ("a", "a"),
            ("\0", "\\u0000"),
            ("\u{1f}\u{20}\u{7f}", "\\u001f \u{7f}"),
            ("0123456789abcdef\n", "0123456789abcdef\\n"),
            ("0123456789abcde\"x", "0123456789abcde\\\"x"),
            (
                "\\0123456789abcdef0123456789abcdef",
                "\\\\0123456789abcdef0123456789abcdef",
            ),
            ("é€😀 ünïcödé 0123456789\t", "é€😀 ünïcödé 0123456789\\t"),
        ] {
            assert_eq!(ours(text.as_bytes(), escape_json), escaped, "{text:?}");
        }
    }

    #[test]
    fn long_runs_of_escapes_at_the_end_of_a_block_stay_inside_the_buffer() {
        // Each NUL grows six-fold: the block path must reserve as it goes, not once up front.
        for plain in 0..40 {
            for nuls in [1usize, 15, 16, 17, 100, 1000] {
                let text = format!("{}{}", "x".repeat(plain), "\0".repeat(nuls));
                let mut out = Vec::new();
                escape_json(text.as_bytes(), &mut out);
                assert_eq!(out.len(), plain + 6 * nuls);
                assert_eq!(String::from_utf8(out).unwrap(), serde_escape(&text));
            }
        }
    }

    #[test]
    fn appends_after_what_is_there() {
        let mut out = b"[0.5, \"o\", \"".to_vec();
        escape_json("0123456789abcdefg\"".as_bytes(), &mut out);
        assert_eq!(out, b"[0.5, \"o\", \"0123456789abcdefg\\\"");
    }

    proptest::proptest! {
        #[test]
        fn the_word_mask_finds_the_first_byte_the_table_would(w in proptest::prelude::any::<u64>(), pos in 0usize..8, b in proptest::prelude::any::<u8>()) {
            // Random words, and words with one chosen byte, against the table byte by byte.
            let mut bytes = w.to_le_bytes();
            bytes[pos] = b;
            for word in [w.to_le_bytes(), bytes] {
                let table = word.iter().position(|&b| NEEDS_ESCAPE[b as usize]);
                let mask = escape_mask(u64::from_le_bytes(word));
                let first = (mask != 0).then(|| (mask.trailing_zeros() / 8) as usize);
                proptest::prop_assert_eq!(first, table);
            }
        }

        #[test]
        fn escaping_any_text_matches_serde_json(s in "(\\PC|[\\x00-\\x1f\"\\\\]){0,80}") {
            proptest::prop_assert_eq!(ours(s.as_bytes(), escape_json), serde_escape(&s));
        }

        #[test]
        fn blocks_and_words_agree_on_any_text(
            s in "([ -~]{0,40}|[\\x00-\\x1f\"\\\\]{0,5}|\\PC{0,4}){0,12}",
            prefix in 0usize..40,
        ) {
            // Sparse and dense escapes, over block boundaries, after text already in `out`.
            let mut both = [vec![b'x'; prefix], vec![b'x'; prefix]];
            escape_json(s.as_bytes(), &mut both[0]);
            escape_words(s.as_bytes(), &mut both[1]);
            proptest::prop_assert_eq!(&both[0], &both[1]);
            proptest::prop_assert_eq!(String::from_utf8(both[0][prefix..].to_vec()).unwrap(), serde_escape(&s));
        }
    }
}
