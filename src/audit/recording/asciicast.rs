//! asciicast v2, the format `asciinema play` and `asciinema cat` replay: a JSON header line,
//! then one JSON array per event, `[seconds, code, data]`: `o` output, `i` input, `r` resize
//! (`"COLSxROWS"`).
//!
//! Terminal output is bytes and may split a UTF-8 character across two chunks; the format
//! holds text. [`Utf8Carry`] keeps an incomplete character until the next chunk completes
//! it, so valid output replays byte for byte; bytes that are not UTF-8 at all (a binary `cp`)
//! become U+FFFD, as a terminal would show them.

use std::io::Write;

use serde::{Deserialize, Serialize};

use super::json_escape::{escape_json, ASCII_IN_JSON};

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
    /// Whose session it is (a key of the proxy's own, which players ignore): a file found
    /// by its name is served by id only when its header says it is that session's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kube_ws_proxy: Option<HeaderSession>,
}

/// The session a recording is of, in its header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderSession {
    /// Its id (`<replica>-<n>`), as its audit events say it.
    pub session_id: String,
    /// The pod's namespace.
    pub namespace: String,
    /// Its named cluster (none for the unnamed upstream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
}

/// What an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventCode {
    Output,
    Input,
    Resize,
    /// A marker (asciicast v2 `m`): a point of note, its text the label.
    Marker,
}

impl EventCode {
    fn code(self) -> &'static str {
        match self {
            EventCode::Output => "o",
            EventCode::Input => "i",
            EventCode::Resize => "r",
            EventCode::Marker => "m",
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

/// The text of a resize event.
pub fn resize_text(cols: u16, rows: u16) -> String {
    format!("{cols}x{rows}")
}

/// The data of every event line in `lines` (a recording without its header), joined: what
/// the recording shows. For tests.
#[cfg(test)]
pub(crate) fn event_text<'a>(lines: impl IntoIterator<Item = &'a str>) -> String {
    lines
        .into_iter()
        .map(|l| {
            let event: serde_json::Value = serde_json::from_str(l).expect("an event line");
            event[2].as_str().expect("event data").to_owned()
        })
        .collect()
}

/// Decodes a byte stream that arrives in chunks as UTF-8 text.
#[derive(Debug, Default)]
pub struct Utf8Carry {
    /// The start of a character whose end has not arrived yet (at most 3 bytes).
    pending: Vec<u8>,
}

/// U+FFFD, as UTF-8.
const REPLACEMENT: &[u8] = "\u{fffd}".as_bytes();

/// Valid bytes in a row after which output that had bad bytes is taken for text again.
const TEXT_AGAIN: usize = 32;

/// How text is appended: valid runs through `run`, and, after a bad byte, each byte through
/// `bytes` (see [`ByteOut`]).
#[derive(Clone, Copy)]
struct Emit {
    run: fn(&[u8], &mut Vec<u8>),
    bytes: &'static [ByteOut; 256],
}

/// Text inside a JSON string: the escapes of [`escape_json`].
const JSON: Emit = Emit {
    run: escape_json,
    bytes: &byte_table(&ASCII_IN_JSON),
};

/// Text as it is.
#[cfg(test)]
const AS_IS: Emit = Emit {
    run: |text, out| out.extend_from_slice(text),
    bytes: &byte_table(&{
        let mut t = [([0u8; 8], 1u8); 128];
        let mut b = 0;
        while b < 128 {
            t[b].0[0] = b as u8;
            b += 1;
        }
        t
    }),
};

/// What one byte of binary output is, by itself: an ASCII character (as `ascii` writes it), a
/// byte no UTF-8 sequence starts with (U+FFFD), or the lead of a longer sequence, which
/// [`Sequence::at`] must judge. One table load and one eight-byte store for the first two,
/// with no branch on which of them it is: in random bytes either comes about half the time,
/// and a branch the processor cannot predict costs more than the byte.
#[derive(Clone, Copy)]
struct ByteOut {
    /// What it becomes, padded to eight bytes.
    bytes: [u8; 8],
    /// How many of `bytes` (0 for a lead).
    len: u8,
    /// Whether it is a character (ASCII): it continues a run of valid bytes.
    valid: bool,
}

const fn byte_table(ascii: &[([u8; 8], u8); 128]) -> [ByteOut; 256] {
    let lead = ByteOut {
        bytes: [0; 8],
        len: 0,
        valid: false,
    };
    let mut t = [lead; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = match b {
            0..=0x7f => ByteOut {
                bytes: ascii[b].0,
                len: ascii[b].1,
                valid: true,
            },
            // The leads of two- to four-byte sequences (`Sequence::at`'s).
            0xc2..=0xf4 => lead,
            _ => ByteOut {
                bytes: [0xef, 0xbf, 0xbd, 0, 0, 0, 0, 0],
                len: 3,
                valid: false,
            },
        };
        b += 1;
    }
    t
}

/// The UTF-8 sequence at the start of some bytes, judged as the standard library does (the
/// invalid part is the longest start of a sequence that could have been valid, at least one
/// byte: one U+FFFD each, as `String::from_utf8_lossy` gives).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sequence {
    /// A character of this many bytes.
    Valid(usize),
    /// This many bytes that are not a character.
    Invalid(usize),
    /// The start of a character whose end is not there.
    Incomplete,
}

impl Sequence {
    fn at(bytes: &[u8]) -> Sequence {
        let lead = bytes[0];
        if lead < 0x80 {
            return Sequence::Valid(1);
        }
        // The width, and the range of the second byte (which rules out overlong forms,
        // surrogates and code points above U+10FFFF).
        let (width, second) = match lead {
            0xc2..=0xdf => (2, 0x80..=0xbf),
            0xe0 => (3, 0xa0..=0xbf),
            0xe1..=0xec | 0xee..=0xef => (3, 0x80..=0xbf),
            0xed => (3, 0x80..=0x9f),
            0xf0 => (4, 0x90..=0xbf),
            0xf1..=0xf3 => (4, 0x80..=0xbf),
            0xf4 => (4, 0x80..=0x8f),
            _ => return Sequence::Invalid(1),
        };
        match bytes.get(1) {
            None => return Sequence::Incomplete,
            Some(b) if !second.contains(b) => return Sequence::Invalid(1),
            Some(_) => {}
        }
        for k in 2..width {
            match bytes.get(k) {
                None => return Sequence::Incomplete,
                Some(b) if b & 0xc0 != 0x80 => return Sequence::Invalid(k),
                Some(_) => {}
            }
        }
        Sequence::Valid(width)
    }
}

impl Utf8Carry {
    #[cfg(test)]
    /// The text of `chunk`, preceded by what the last chunk left incomplete; an incomplete
    /// character at the end waits for the next chunk, bytes that can never be UTF-8 are
    /// U+FFFD.
    pub fn decode(&mut self, chunk: &[u8]) -> String {
        let mut out = Vec::with_capacity(chunk.len());
        self.decode_with(chunk, &mut out, AS_IS);
        String::from_utf8(out).expect("only valid UTF-8 is appended")
    }

    /// Appends the text of `chunk` to `out` as the inside of a JSON string, in one pass from
    /// the chunk (no copy of it is made, except of a character split across chunks).
    pub fn decode_json_into(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        self.decode_with(chunk, out, JSON);
    }

    /// Hands the valid UTF-8 runs of `chunk` (and U+FFFD for bytes that are not) to `emit`.
    fn decode_with(&mut self, mut chunk: &[u8], out: &mut Vec<u8>, emit: Emit) {
        // First finish a character the last chunk began.
        while !self.pending.is_empty() && !chunk.is_empty() {
            self.pending.push(chunk[0]);
            chunk = &chunk[1..];
            match std::str::from_utf8(&self.pending) {
                Ok(_) => {
                    (emit.run)(&self.pending, out);
                    self.pending.clear();
                }
                Err(e) if e.error_len().is_some() => {
                    // Not a character after all: one replacement for the bad start, and the
                    // bytes after it are looked at again.
                    let rest: Vec<u8> = self.pending[e.error_len().unwrap_or(1)..].to_vec();
                    self.pending.clear();
                    out.extend_from_slice(REPLACEMENT);
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
                    (emit.run)(chunk, out);
                    return;
                }
                Err(e) => {
                    let (valid, after) = chunk.split_at(e.valid_up_to());
                    // Binary output has bad bytes back to back: nothing to hand on between.
                    if !valid.is_empty() {
                        (emit.run)(valid, out);
                    }
                    match e.error_len() {
                        // An incomplete character at the very end: keep it for later.
                        None => {
                            self.pending.extend_from_slice(after);
                            return;
                        }
                        Some(bad) => {
                            // U+FFFD needs no escape: appended as it is.
                            out.extend_from_slice(REPLACEMENT);
                            match self.decode_binary(&after[bad..], out, emit) {
                                Some(text) => chunk = text,
                                None => return,
                            }
                        }
                    }
                }
            }
        }
    }

    /// After a bad byte: binary output has another every few bytes, and starting the standard
    /// library's check afresh after each costs more than the check itself. So the bytes are
    /// turned into text one at a time here ([`ByteOut`]), until a stretch of [`TEXT_AGAIN`]
    /// valid bytes says this is text again: the rest after that stretch is returned, for the
    /// fast check. `None`: the chunk is used up (an incomplete character at its end is kept).
    fn decode_binary<'a>(
        &mut self,
        chunk: &'a [u8],
        out: &mut Vec<u8>,
        emit: Emit,
    ) -> Option<&'a [u8]> {
        /// Input bytes handled per reserve; each gives at most six bytes of text (an escape)
        /// and is stored as at most eight.
        const STRETCH: usize = 256;
        // Valid bytes in a row.
        let mut valid = 0;
        let mut at = 0;
        while at < chunk.len() && valid < TEXT_AGAIN {
            let stop = (at + STRETCH).min(chunk.len());
            out.reserve(STRETCH * 6 + 8);
            let base = out.as_mut_ptr();
            let mut len = out.len();
            while at < stop && valid < TEXT_AGAIN {
                let byte = &emit.bytes[chunk[at] as usize];
                if byte.len > 0 {
                    // SAFETY: fewer than `STRETCH` bytes were handled since the reserve, each
                    // adding at most six to `len`: eight bytes are free after `len`.
                    unsafe {
                        std::ptr::write_unaligned(base.add(len).cast::<[u8; 8]>(), byte.bytes)
                    };
                    len += byte.len as usize;
                    at += 1;
                    valid = if byte.valid { valid + 1 } else { 0 };
                    continue;
                }
                match Sequence::at(&chunk[at..]) {
                    Sequence::Valid(width) => {
                        // SAFETY: `width` (at most four) bytes are in `chunk` from `at`, and free
                        // after `len` (as above).
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                chunk.as_ptr().add(at),
                                base.add(len),
                                width,
                            )
                        };
                        len += width;
                        at += width;
                        valid += width;
                    }
                    Sequence::Invalid(bad) => {
                        // SAFETY: as above.
                        unsafe {
                            std::ptr::copy_nonoverlapping(REPLACEMENT.as_ptr(), base.add(len), 3)
                        };
                        len += REPLACEMENT.len();
                        at += bad;
                        valid = 0;
                    }
                    Sequence::Incomplete => {
                        // SAFETY: the bytes up to `len` were written above.
                        unsafe { out.set_len(len) };
                        self.pending.extend_from_slice(&chunk[at..]);
                        return None;
                    }
                }
            }
            // SAFETY: the bytes up to `len` were written above.
            unsafe { out.set_len(len) };
        }
        (valid >= TEXT_AGAIN).then_some(&chunk[at..])
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
                kube_ws_proxy: None,
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

    /// `bytes` decoded in the chunks that cutting it at `points` gives, and finished.
    fn decode_cut_at(bytes: &[u8], mut points: Vec<usize>) -> String {
        points.sort_unstable();
        let mut carry = Utf8Carry::default();
        let mut out = String::new();
        let mut from = 0;
        for p in points.into_iter().chain([bytes.len()]) {
            out.push_str(&carry.decode(&bytes[from..p]));
            from = p;
        }
        out.push_str(&carry.finish());
        out
    }

    /// Bytes UTF-8 decoders get wrong: an overlong form, a surrogate, above U+10FFFF, starts
    /// without their ends, a run of NULs.
    fn awkward_sequences() -> Vec<Vec<u8>> {
        vec![
            b"\xe0\x80".to_vec(),
            b"\xed\xa0\x80".to_vec(),
            b"\xf4\x90\x80\x80".to_vec(),
            b"\xf0\x9f\x98".to_vec(),
            b"\xe2\x82".to_vec(),
            b"\xc3".to_vec(),
            vec![0u8; 40],
        ]
    }

    /// What a recording's event holds for `bytes` fed in the chunks that cutting it at
    /// `points` gives, after `prefix` already in the line: byte for byte.
    fn json_cut_at(bytes: &[u8], mut points: Vec<usize>, prefix: &[u8]) -> Vec<u8> {
        points.sort_unstable();
        let mut carry = Utf8Carry::default();
        let mut out = prefix.to_vec();
        let mut from = 0;
        for p in points.into_iter().chain([bytes.len()]) {
            carry.decode_json_into(&bytes[from..p], &mut out);
            from = p;
        }
        escape_json(carry.finish().as_bytes(), &mut out);
        out
    }

    /// The JSON text of the lossy decoding, escaped in one piece: what the recording held
    /// before binary output was turned into text a byte at a time, and must still hold.
    fn json_of_lossy(bytes: &[u8], prefix: &[u8]) -> Vec<u8> {
        let mut out = prefix.to_vec();
        escape_json(String::from_utf8_lossy(bytes).as_bytes(), &mut out);
        out
    }

    #[test]
    fn binary_output_byte_vectors() {
        for (bytes, json) in [
            (&b"\xff"[..], "\u{fffd}"),
            (
                b"a\xffb\x00\"\\\n\x1b",
                "a\u{fffd}b\\u0000\\\"\\\\\\n\\u001b",
            ),
            // Overlong, surrogate, above U+10FFFF, a lead without its end before ASCII.
            (
                b"\xc0\x80\xed\xa0\x80\xf4\x90\x80\x80\xe2\x82x",
                "\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}x",
            ),
            // Valid characters of every width between bad bytes.
            (
                b"\x80\xc3\xa9\x80\xe2\x82\xac\x80\xf0\x9f\x98\x80\x80\t",
                "\u{fffd}\u{e9}\u{fffd}\u{20ac}\u{fffd}\u{1f600}\u{fffd}\\t",
            ),
        ] {
            let out = json_cut_at(bytes, vec![], b"");
            assert_eq!(String::from_utf8(out).unwrap(), json, "{bytes:?}");
            assert_eq!(json_of_lossy(bytes, b""), json.as_bytes());
        }
    }

    #[test]
    fn long_binary_output_is_the_escaped_lossy_text() {
        // Random bytes (a `kubectl cp` of compressed files) and NUL-heavy binary, long enough
        // for many reserves of the byte-at-a-time path, fed in the writer's chunk sizes.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let random: Vec<u8> = (0..300_000)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if i % 7 == 0 {
                    0
                } else {
                    (x >> 24) as u8
                }
            })
            .collect();
        for chunk in [1, 3, 255, 256, 257, 32 * 1024] {
            let points = (chunk..random.len()).step_by(chunk).collect();
            assert_eq!(
                json_cut_at(&random, points, b"[0.1, \"o\", \""),
                json_of_lossy(&random, b"[0.1, \"o\", \""),
                "chunks of {chunk}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn json_of_any_bytes_in_any_chunks_is_exactly_the_escaped_lossy_text(
            pieces in proptest::collection::vec(proptest::prop_oneof![
                // Binary: mostly bytes above 0x7f, escapes and plain ASCII among them.
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
                proptest::collection::vec(proptest::sample::select(vec![0x80u8, 0xbf, 0xc2, 0xe0, 0xed, 0xf0, 0xf4, 0xff, 0, b'"', b'\\', b'\n', b'a']), 0..80),
                // Text runs around the length after which binary is taken for text again.
                proptest::strategy::Strategy::prop_map("(\\PC|[\\x00-\\x1f\"\\\\]){0,40}", String::into_bytes),
                proptest::sample::select(awkward_sequences()),
            ], 0..12),
            cuts in proptest::collection::vec(0usize..8000, 0..8),
            prefix in 0usize..20,
        ) {
            let bytes = pieces.concat();
            let points: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            let prefix = vec![b'x'; prefix];
            let out = json_cut_at(&bytes, points, &prefix);
            proptest::prop_assert_eq!(out, json_of_lossy(&bytes, &prefix));
        }

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
        fn binary_with_text_in_it_in_any_chunks_is_the_lossy_text(
            pieces in proptest::collection::vec(proptest::prop_oneof![
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8),
                // Valid characters of every width, runs long enough to count as text again.
                proptest::strategy::Strategy::prop_map("\\PC{0,40}", String::into_bytes),
                proptest::sample::select(awkward_sequences()),
            ], 0..24),
            cuts in proptest::collection::vec(0usize..2000, 0..8),
        ) {
            let bytes = pieces.concat();
            let points: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            let out = decode_cut_at(&bytes, points);
            proptest::prop_assert_eq!(out, String::from_utf8_lossy(&bytes).into_owned());
        }

        #[test]
        fn a_sequence_is_judged_as_the_standard_library_judges_it(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..6),
        ) {
            let expected = match std::str::from_utf8(&bytes) {
                Ok(s) => Sequence::Valid(s.chars().next().unwrap().len_utf8()),
                Err(e) if e.valid_up_to() > 0 => {
                    Sequence::Valid(std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap().chars().next().unwrap().len_utf8())
                }
                Err(e) => match e.error_len() {
                    Some(len) => Sequence::Invalid(len),
                    None => Sequence::Incomplete,
                },
            };
            proptest::prop_assert_eq!(Sequence::at(&bytes), expected);
        }

        #[test]
        fn any_split_of_valid_text_is_exact(s in "\\PC{0,40}", cuts in proptest::collection::vec(0usize..200, 0..6)) {
            let bytes = s.as_bytes();
            let points: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            let out = decode_cut_at(bytes, points);
            proptest::prop_assert_eq!(out, s);
        }
    }
}
