//! asciicast v2, the format `asciinema play` and `asciinema cat` replay: a JSON header line,
//! then one JSON array per event, `[seconds, code, data]`: `o` output, `i` input, `r` resize
//! (`"COLSxROWS"`).
//!
//! Terminal output is bytes and may split a UTF-8 character across two chunks; the format
//! holds text. [`Utf8Carry`] keeps an incomplete character until the next chunk completes
//! it, so valid output replays byte for byte; bytes that are not UTF-8 at all (a binary `cp`)
//! become U+FFFD, as a terminal would show them.

use std::io::Write;

use serde::Serialize;

/// The header line.
#[derive(Debug, Clone, Serialize)]
pub struct Header {
    pub version: u8,
    pub width: u16,
    pub height: u16,
    /// Unix time of the session's start.
    pub timestamp: u64,
    pub command: String,
    pub title: String,
}

/// What an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventCode {
    Output,
    Input,
    Resize,
}

impl EventCode {
    fn code(self) -> &'static str {
        match self {
            EventCode::Output => "o",
            EventCode::Input => "i",
            EventCode::Resize => "r",
        }
    }
}

/// Appends the header line to `out`.
pub fn encode_header(header: &Header, out: &mut Vec<u8>) {
    serde_json::to_writer(&mut *out, header).expect("a header serialises");
    out.push(b'\n');
}

/// Appends one event line to `out`.
pub fn encode_event(seconds: f64, code: EventCode, text: &str, out: &mut Vec<u8>) {
    begin_event(seconds, code, out);
    escape_json(text.as_bytes(), out);
    end_event(out);
}

/// Appends the start of an event line, up to the opening quote of its data.
pub fn begin_event(seconds: f64, code: EventCode, out: &mut Vec<u8>) {
    out.push(b'[');
    // Microseconds, as asciinema writes them.
    // Written in place: no string is allocated per event.
    let _ = write!(out, "{seconds:.6}");
    out.extend_from_slice(b", \"");
    out.extend_from_slice(code.code().as_bytes());
    out.extend_from_slice(b"\", \"");
}

/// Appends the end of an event line, from the closing quote of its data.
pub fn end_event(out: &mut Vec<u8>) {
    out.extend_from_slice(b"\"]\n");
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
    // Terminal text rarely needs escapes: eight bytes are looked at at once, and the first
    // that needs one is found from the word's mask, not byte by byte.
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

/// Appends valid UTF-8 `text` as the inside of a JSON string: runs that need no escape are
/// copied whole, one pass over the bytes.
fn escape_json(text: &[u8], out: &mut Vec<u8>) {
    out.reserve(text.len());
    let mut copied = 0;
    while let Some(mut at) = next_escape(text, copied) {
        out.extend_from_slice(&text[copied..at]);
        // Escapes come in runs (NUL padding, ANSI sequences after a newline): the bytes
        // straight after one are looked at one by one before the next word scan.
        loop {
            push_escape(text[at], out);
            at += 1;
            if at == text.len() || !NEEDS_ESCAPE[text[at] as usize] {
                break;
            }
        }
        copied = at;
    }
    out.extend_from_slice(&text[copied..]);
}

/// The JSON escape of every byte that needs one, padded to six bytes, and its length.
const ESCAPES: [([u8; 6], u8); 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut t = [([0u8; 6], 0u8); 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = ([b'\\', b'u', b'0', b'0', HEX[b >> 4], HEX[b & 0xf]], 6);
        b += 1;
    }
    t[b'"' as usize] = (*b"\\\"\0\0\0\0", 2);
    t[b'\\' as usize] = (*b"\\\\\0\0\0\0", 2);
    t[b'\n' as usize] = (*b"\\n\0\0\0\0", 2);
    t[b'\r' as usize] = (*b"\\r\0\0\0\0", 2);
    t[b'\t' as usize] = (*b"\\t\0\0\0\0", 2);
    t[0x08] = (*b"\\b\0\0\0\0", 2);
    t[0x0c] = (*b"\\f\0\0\0\0", 2);
    t
};

/// Appends the JSON escape of a byte that needs one.
fn push_escape(b: u8, out: &mut Vec<u8>) {
    let (bytes, len) = &ESCAPES[b as usize];
    // A fixed six-byte copy, then the padding cut off: cheaper than a copy of varying length.
    out.extend_from_slice(bytes);
    out.truncate(out.len() - (6 - *len as usize));
}

/// The text of a resize event.
pub fn resize_text(cols: u16, rows: u16) -> String {
    format!("{cols}x{rows}")
}

/// Decodes a byte stream that arrives in chunks as UTF-8 text.
#[derive(Debug, Default)]
pub struct Utf8Carry {
    /// The start of a character whose end has not arrived yet (at most 3 bytes).
    pending: Vec<u8>,
}

/// U+FFFD, as UTF-8.
const REPLACEMENT: &[u8] = "\u{fffd}".as_bytes();

impl Utf8Carry {
    #[cfg(test)]
    /// The text of `chunk`, preceded by what the last chunk left incomplete; an incomplete
    /// character at the end waits for the next chunk, bytes that can never be UTF-8 are
    /// U+FFFD.
    pub fn decode(&mut self, chunk: &[u8]) -> String {
        let mut out = Vec::with_capacity(chunk.len());
        self.decode_with(chunk, &mut out, |text, out| out.extend_from_slice(text));
        String::from_utf8(out).expect("only valid UTF-8 is appended")
    }

    /// Appends the text of `chunk` to `out` as the inside of a JSON string, in one pass from
    /// the chunk (no copy of it is made, except of a character split across chunks).
    pub fn decode_json_into(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        self.decode_with(chunk, out, escape_json);
    }

    /// Hands the valid UTF-8 runs of `chunk` (and U+FFFD for bytes that are not) to `emit`.
    fn decode_with(&mut self, mut chunk: &[u8], out: &mut Vec<u8>, emit: fn(&[u8], &mut Vec<u8>)) {
        // First finish a character the last chunk began.
        while !self.pending.is_empty() && !chunk.is_empty() {
            self.pending.push(chunk[0]);
            chunk = &chunk[1..];
            match std::str::from_utf8(&self.pending) {
                Ok(_) => {
                    emit(&self.pending, out);
                    self.pending.clear();
                }
                Err(e) if e.error_len().is_some() => {
                    // Not a character after all: one replacement for the bad start, and the
                    // bytes after it are looked at again.
                    let rest: Vec<u8> = self.pending[e.error_len().unwrap_or(1)..].to_vec();
                    self.pending.clear();
                    emit(REPLACEMENT, out);
                    let mut again = Utf8Carry::default();
                    again.decode_with(&rest, out, emit);
                    self.pending = again.pending;
                }
                Err(_) => {} // still incomplete
            }
        }
        loop {
            match std::str::from_utf8(chunk) {
                Ok(_) => {
                    emit(chunk, out);
                    return;
                }
                Err(e) => {
                    let (valid, after) = chunk.split_at(e.valid_up_to());
                    emit(valid, out);
                    match e.error_len() {
                        // An incomplete character at the very end: keep it for later.
                        None => {
                            self.pending.extend_from_slice(after);
                            return;
                        }
                        Some(bad) => {
                            emit(REPLACEMENT, out);
                            chunk = &after[bad..];
                        }
                    }
                }
            }
        }
    }

    /// What is left when the stream ends: an incomplete character, as U+FFFD.
    pub fn finish(&mut self) -> String {
        if std::mem::take(&mut self.pending).is_empty() {
            String::new()
        } else {
            char::REPLACEMENT_CHARACTER.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_events_as_asciinema_writes_them() {
        let mut out = Vec::new();
        encode_header(
            &Header {
                version: 2,
                width: 80,
                height: 24,
                timestamp: 1_764_032_523,
                command: "sh".into(),
                title: "default/web".into(),
            },
            &mut out,
        );
        encode_event(0.25, EventCode::Output, "hi\r\n\u{1b}[0m\"", &mut out);
        encode_event(1.5, EventCode::Resize, &resize_text(120, 40), &mut out);
        encode_event(2.0, EventCode::Input, "ls\r", &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"version\":2,\"width\":80,\"height\":24,\"timestamp\":1764032523,\"command\":\"sh\",\"title\":\"default/web\"}\n\
             [0.250000, \"o\", \"hi\\r\\n\\u001b[0m\\\"\"]\n\
             [1.500000, \"r\", \"120x40\"]\n\
             [2.000000, \"i\", \"ls\\r\"]\n"
        );
    }

    #[test]
    fn characters_split_across_chunks_come_out_whole() {
        let text = "añ€😀z";
        let bytes = text.as_bytes();
        // Every way of cutting the stream in two gives back the text.
        for cut in 0..=bytes.len() {
            let mut carry = Utf8Carry::default();
            let mut out = carry.decode(&bytes[..cut]);
            out.push_str(&carry.decode(&bytes[cut..]));
            out.push_str(&carry.finish());
            assert_eq!(out, text, "cut at {cut}");
        }
        // One byte at a time too.
        let mut carry = Utf8Carry::default();
        let out: String = bytes.iter().map(|b| carry.decode(&[*b])).collect();
        assert_eq!(out, text);
    }

    #[test]
    fn bytes_that_are_not_utf8_become_replacement_characters() {
        let mut carry = Utf8Carry::default();
        assert_eq!(carry.decode(b"a\xffb\xc3"), "a\u{fffd}b");
        assert_eq!(carry.finish(), "\u{fffd}");
        assert_eq!(carry.finish(), "");
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
            let mut ours = Vec::new();
            escape_json(s.as_bytes(), &mut ours);
            let theirs = serde_json::to_string(&s).unwrap();
            proptest::prop_assert_eq!(format!("\"{}\"", String::from_utf8(ours).unwrap()), theirs);
        }
    }

    #[test]
    fn json_escaping_matches_serde_json() {
        let text = "plain \" quote \\ back \n\r\t\u{8}\u{c}\u{0}\u{1b}[0m € 😀 \u{7f}";
        let mut ours = Vec::new();
        escape_json(text.as_bytes(), &mut ours);
        let theirs = serde_json::to_string(text).unwrap();
        assert_eq!(format!("\"{}\"", String::from_utf8(ours).unwrap()), theirs);
    }

    proptest::proptest! {
        #[test]
        fn json_decoding_of_any_bytes_in_any_chunks_is_valid_json_of_the_lossy_text(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            cut in 0usize..64,
        ) {
            let cut = cut % (bytes.len() + 1);
            let mut carry = Utf8Carry::default();
            let mut inner = Vec::new();
            carry.decode_json_into(&bytes[..cut], &mut inner);
            carry.decode_json_into(&bytes[cut..], &mut inner);
            let tail = carry.finish();
            escape_json(tail.as_bytes(), &mut inner);
            let json = format!("\"{}\"", String::from_utf8(inner).unwrap());
            let decoded: String = serde_json::from_str(&json).unwrap();
            proptest::prop_assert_eq!(decoded, String::from_utf8_lossy(&bytes).into_owned());
        }

        #[test]
        fn any_split_of_valid_text_is_exact(s in "\\PC{0,40}", cuts in proptest::collection::vec(0usize..200, 0..6)) {
            let bytes = s.as_bytes();
            let mut points: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            points.sort_unstable();
            let mut carry = Utf8Carry::default();
            let mut out = String::new();
            let mut from = 0;
            for p in points.into_iter().chain([bytes.len()]) {
                out.push_str(&carry.decode(&bytes[from..p]));
                from = p;
            }
            out.push_str(&carry.finish());
            proptest::prop_assert_eq!(out, s);
        }
    }
}
