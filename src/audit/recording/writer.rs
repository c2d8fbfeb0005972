//! The one thread that writes every recording. Sessions hand it events (their bytes are
//! shared, not copied, on the way); it turns them into asciicast lines and appends them to
//! each session's file. Keeping files and text decoding here means an idle recorded session
//! holds no buffer at all, and no session's task ever waits on the disk directly.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use prometheus::IntCounter;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::OwnedSemaphorePermit;
use tracing::warn;

use super::asciicast::{
    begin_event, encode_event, encode_header, end_event, resize_text, EventCode, Header, Utf8Carry,
};
use super::state::RecordingState;

/// Terminal size of a recording that never learnt one (non-tty sessions).
const DEFAULT_SIZE: (u16, u16) = (80, 24);

/// What happened on a session.
#[derive(Debug)]
pub(crate) enum EventKind {
    Output(Bytes),
    Input(Bytes),
    Resize(u16, u16),
}

/// What one recording counts in: its cluster's counters.
#[derive(Debug, Clone)]
pub(crate) struct Counted {
    /// Session bytes written to it.
    pub recorded: IntCounter,
    /// It could not be written to the end.
    pub failures: IntCounter,
}

/// What the writer is told.
pub(crate) enum Message {
    Open {
        id: u64,
        file: File,
        header: Header,
        counted: Counted,
        /// The length of the header line when it is already in the file (`--record=required`
        /// writes it, padded, before the session starts; [`padded_header`]).
        written: Option<usize>,
        state: Arc<RecordingState>,
    },
    Event {
        id: u64,
        /// Seconds since the session started.
        at: f64,
        kind: EventKind,
        /// The event's share of the byte budget, given back once it is written.
        _budget: OwnedSemaphorePermit,
    },
    Close {
        id: u64,
    },
}

/// One open recording.
struct Open {
    file: File,
    /// Written before the first event: a resize first sets the terminal size.
    header: Option<Header>,
    /// A header already in the file and its padded length, while no event follows it: a
    /// resize first rewrites it in place with the client's size.
    rewrite: Option<(Header, usize)>,
    output: Utf8Carry,
    input: Utf8Carry,
    state: Arc<RecordingState>,
    counted: Counted,
}

/// How much encoded text of one recording is gathered before it is written: bulk output
/// (a build log, a `cat` of a big file) arrives as many small events, and a few large writes
/// cost the kernel far less than one per event.
const WRITE_AT: usize = 256 * 1024;

/// Encoded lines of one recording not written yet (they sit in the writer's line buffer).
struct Pending {
    id: u64,
    /// Output and input bytes the lines record.
    recorded: u64,
}

/// Runs until every sender is gone.
pub(crate) fn run(mut rx: UnboundedReceiver<Message>) {
    let mut open: HashMap<u64, Open> = HashMap::new();
    // Reused for every line; holds the pending lines of at most one recording.
    let mut line = Vec::with_capacity(WRITE_AT + 64 * 1024);
    let mut pending: Option<Pending> = None;
    loop {
        let message = match rx.try_recv() {
            Ok(message) => message,
            Err(TryRecvError::Empty) => {
                // Nothing more is waiting: what was gathered goes to disk before the wait.
                write_pending(&mut open, &mut pending, &mut line);
                match rx.blocking_recv() {
                    Some(message) => message,
                    None => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        match message {
            Message::Open {
                id,
                file,
                header,
                counted,
                written,
                state,
            } => {
                let (header, rewrite) = match written {
                    Some(len) => (None, Some((header, len))),
                    None => (Some(header), None),
                };
                open.insert(
                    id,
                    Open {
                        file,
                        header,
                        rewrite,
                        output: Utf8Carry::default(),
                        input: Utf8Carry::default(),
                        state,
                        counted,
                    },
                );
            }
            Message::Event { id, at, kind, .. } => {
                if pending.as_ref().is_some_and(|p| p.id != id) {
                    write_pending(&mut open, &mut pending, &mut line);
                }
                let Some(rec) = open.get_mut(&id) else {
                    continue;
                };
                let len = encode(rec, at, kind, &mut line);
                pending.get_or_insert(Pending { id, recorded: 0 }).recorded += len;
                if line.len() >= WRITE_AT {
                    write_pending(&mut open, &mut pending, &mut line);
                }
            }
            Message::Close { id } => {
                write_pending(&mut open, &mut pending, &mut line);
                let Some(mut rec) = open.remove(&id) else {
                    continue;
                };
                if let Some(header) = rec.header.take() {
                    encode_header(&header, &mut line);
                }
                // An incomplete character left at the end is shown, not lost.
                let tail = rec.output.finish();
                if !tail.is_empty() {
                    encode_event(rec.state.elapsed(), EventCode::Output, &tail, &mut line);
                }
                let written = rec.file.write_all(&line).and_then(|()| rec.file.flush());
                line.clear();
                if let Err(e) = written {
                    rec.counted.failures.inc();
                    rec.state.fail(e.to_string());
                    warn!(error = %e, "a session recording could not be completed");
                }
            }
        }
    }
    write_pending(&mut open, &mut pending, &mut line);
}

/// Writes the gathered lines of one recording to its file and counts what they record.
fn write_pending(open: &mut HashMap<u64, Open>, pending: &mut Option<Pending>, line: &mut Vec<u8>) {
    let Some(Pending { id, recorded: len }) = pending.take() else {
        return;
    };
    let written = match open.get_mut(&id) {
        Some(rec) => rec.file.write_all(line).map(|()| rec),
        None => {
            line.clear();
            return;
        }
    };
    line.clear();
    match written {
        Ok(rec) => {
            rec.counted.recorded.inc_by(len);
            rec.state.written(len);
        }
        Err(e) => fail(open, id, e),
    }
}

/// Appends the lines of one event (and the header before the first); the bytes it recorded.
fn encode(rec: &mut Open, at: f64, kind: EventKind, line: &mut Vec<u8>) -> u64 {
    if let Some((mut header, len)) = rec.rewrite.take() {
        if let EventKind::Resize(cols, rows) = kind {
            header.width = cols;
            header.height = rows;
            // Nothing of this recording is gathered yet (this is its first event), so the
            // header can change under the cursor; if it cannot, the size is an event instead.
            if rewrite_header(&rec.file, &header, len).is_ok() {
                return 0;
            }
        }
    }
    if let Some(mut header) = rec.header.take() {
        if let EventKind::Resize(cols, rows) = kind {
            // The client's first size is the terminal's size from the start.
            header.width = cols;
            header.height = rows;
            encode_header(&header, line);
            return 0;
        }
        encode_header(&header, line);
    }
    match kind {
        EventKind::Output(data) => {
            text_event(&mut rec.output, at, EventCode::Output, &data, line);
            data.len() as u64
        }
        EventKind::Input(data) => {
            text_event(&mut rec.input, at, EventCode::Input, &data, line);
            data.len() as u64
        }
        EventKind::Resize(cols, rows) => {
            encode_event(at, EventCode::Resize, &resize_text(cols, rows), line);
            0
        }
    }
}

/// Appends an event carrying the text of `data`, escaped straight from the chunk; nothing
/// when the chunk only began a character.
fn text_event(carry: &mut Utf8Carry, at: f64, code: EventCode, data: &[u8], line: &mut Vec<u8>) {
    let mark = line.len();
    begin_event(at, code, line);
    let body = line.len();
    carry.decode_json_into(data, line);
    if line.len() == body {
        line.truncate(mark);
    } else {
        end_event(line);
    }
}

/// A write failed: the recording is over, and its session is told (`--record=required` ends
/// it).
fn fail(open: &mut HashMap<u64, Open>, id: u64, e: std::io::Error) {
    warn!(error = %e, "a session recording could not be written");
    if let Some(rec) = open.remove(&id) {
        rec.counted.failures.inc();
        rec.state.fail(e.to_string());
    }
}

/// Room left in a header line written before the session starts, so that the client's first
/// size (up to five digits each, from the two of the default) can replace the default in place.
const HEADER_SLACK: usize = 8;

/// `header` as a line padded with spaces (JSON allows them) to `len` bytes with the newline,
/// or to its own length and [`HEADER_SLACK`] without `len`.
pub(crate) fn padded_header(header: &Header, len: Option<usize>) -> Option<Vec<u8>> {
    let mut line = Vec::with_capacity(256);
    encode_header(header, &mut line);
    line.pop();
    let len = len.unwrap_or(line.len() + HEADER_SLACK + 1);
    if line.len() + 1 > len {
        return None;
    }
    line.resize(len - 1, b' ');
    line.push(b'\n');
    Some(line)
}

/// Writes `header` over the header line of `len` bytes at the start of `file`.
fn rewrite_header(file: &File, header: &Header, len: usize) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let line = padded_header(header, Some(len))
        .ok_or_else(|| std::io::Error::other("the new header does not fit"))?;
    file.write_all_at(&line, 0)
}

/// The size a recording starts with when nobody said.
pub(crate) fn default_size() -> (u16, u16) {
    DEFAULT_SIZE
}
