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

use super::json_escape::escape_json;

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
                    emit(chunk, out);
                    return;
                }
                Err(e) => {
                    let (valid, after) = chunk.split_at(e.valid_up_to());
                    // Binary output has bad bytes back to back: nothing to hand on between.
                    if !valid.is_empty() {
                        emit(valid, out);
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
    /// looked at one sequence at a time here, until a stretch of [`TEXT_AGAIN`] valid bytes
    /// says this is text again: the rest from that stretch's start is returned, for the fast
    /// check. `None`: the chunk is used up (an incomplete character at its end is kept).
    fn decode_binary<'a>(
        &mut self,
        chunk: &'a [u8],
        out: &mut Vec<u8>,
        emit: fn(&[u8], &mut Vec<u8>),
    ) -> Option<&'a [u8]> {
        // Where the current run of valid sequences began.
        let mut run = 0;
        let mut at = 0;
        while at < chunk.len() {
            match Sequence::at(&chunk[at..]) {
                Sequence::Valid(len) => {
                    at += len;
                    if at - run >= TEXT_AGAIN {
                        return Some(&chunk[run..]);
                    }
                }
                Sequence::Invalid(len) => {
                    if run < at {
                        emit(&chunk[run..at], out);
                    }
                    out.extend_from_slice(REPLACEMENT);
                    at += len;
                    run = at;
                }
                Sequence::Incomplete => {
                    if run < at {
                        emit(&chunk[run..at], out);
                    }
                    self.pending.extend_from_slice(&chunk[at..]);
                    return None;
                }
            }
        }
        if run < at {
            emit(&chunk[run..], out);
        }
        None
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
        fn binary_with_text_in_it_in_any_chunks_is_the_lossy_text(
            pieces in proptest::collection::vec(proptest::prop_oneof![
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8),
                // Valid characters of every width, runs long enough to count as text again.
                proptest::strategy::Strategy::prop_map("\\PC{0,40}", String::into_bytes),
                proptest::sample::select(vec![
                    b"\xe0\x80".to_vec(), b"\xed\xa0\x80".to_vec(), b"\xf4\x90\x80\x80".to_vec(),
                    b"\xf0\x9f\x98".to_vec(), b"\xe2\x82".to_vec(), b"\xc3".to_vec(), vec![0u8; 40],
                ]),
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
