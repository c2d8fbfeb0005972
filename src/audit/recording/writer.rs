//! The one thread that writes every recording. Sessions hand it events (their bytes are
//! shared, not copied, on the way); it turns them into asciicast lines and appends them to
//! each session's file. Keeping files and text decoding here means an idle recorded session
//! holds no buffer at all, and no session's task ever waits on the disk directly.
//!
//! It takes what the sessions sent in arrival order, except that output its upstream cut off
//! (what took the recorder's cut lane) goes first, its recording's earlier messages with it
//! ([`super::queue`] says how, and why no recording is starved).

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use prometheus::IntCounter;
use tokio::sync::OwnedSemaphorePermit;
use tracing::warn;

use super::asciicast::{
    begin_event, encode_event, encode_header, end_event, resize_text, EventCode, Header, Utf8Carry,
};
use super::queue::Inbox;
use super::state::RecordingState;
use super::typing::Rests;
use crate::audit::upload::SpoolUsage;

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
    /// The spool's size, with `--record-upload`: what is written adds to it.
    pub spool: Option<Arc<SpoolUsage>>,
}

impl Counted {
    /// `len` more bytes of file written.
    fn wrote(&self, len: u64) {
        if let Some(spool) = &self.spool {
            spool.add(len);
        }
    }
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
        /// Output its upstream cut off, which took the cut lane: written before other
        /// recordings' events ([`super::queue`]).
        urgent: bool,
        /// The event's share of the byte budget (or of a lane), given back once it is written.
        _budget: OwnedSemaphorePermit,
    },
    Close {
        id: u64,
        /// Told once the file is complete (or could not be completed: the recording's state
        /// says why), so that the session's `ended` event comes after its evidence.
        done: Option<tokio::sync::oneshot::Sender<()>>,
    },
}

impl EventKind {
    /// The session bytes it carries.
    fn len(&self) -> u64 {
        match self {
            EventKind::Output(data) | EventKind::Input(data) => data.len() as u64,
            EventKind::Resize(..) => 0,
        }
    }
}

impl Message {
    /// Closes recording `id`, telling nobody when it is done.
    #[cfg(test)]
    pub(super) fn close(id: u64) -> Message {
        Message::Close { id, done: None }
    }

    /// The recording it is about.
    pub(super) fn id(&self) -> u64 {
        match self {
            Message::Open { id, .. } | Message::Event { id, .. } | Message::Close { id, .. } => *id,
        }
    }

    /// Whether it is to be written before other recordings' messages.
    pub(super) fn is_urgent(&self) -> bool {
        matches!(self, Message::Event { urgent: true, .. })
    }

    /// The session bytes it carries.
    pub(super) fn len(&self) -> usize {
        match self {
            Message::Event {
                kind: EventKind::Output(data) | EventKind::Input(data),
                ..
            } => data.len(),
            _ => 0,
        }
    }
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
    /// Bytes of the file written (whole lines), as its followers are told.
    file_len: u64,
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

/// Runs until every sender is gone, resting after its writes as `rests` says.
pub(crate) fn run(mut inbox: Inbox, rests: Rests) {
    let mut writer = Writer {
        open: HashMap::new(),
        line: Vec::with_capacity(WRITE_AT + 64 * 1024),
        pending: None,
        rests,
    };
    loop {
        let message = match inbox.try_next() {
            Some(message) => message,
            None => {
                // Nothing more is waiting: what was gathered goes to disk before the wait.
                writer.write_pending();
                match inbox.wait() {
                    Some(message) => message,
                    None => break,
                }
            }
        };
        writer.take(message);
    }
    writer.write_pending();
}

/// The writer thread's state.
struct Writer {
    open: HashMap<u64, Open>,
    /// Reused for every line; holds the pending lines of at most one recording.
    line: Vec<u8>,
    pending: Option<Pending>,
    /// While someone types, a rest after each write ([`super::typing`]).
    rests: Rests,
}

impl Writer {
    /// Does what `message` says.
    fn take(&mut self, message: Message) {
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
                    Some(len) => {
                        // Written before the session started, by the recording's opening.
                        counted.wrote(len as u64);
                        (None, Some((header, len)))
                    }
                    None => (Some(header), None),
                };
                let rec = Open {
                    file,
                    header,
                    rewrite,
                    output: Utf8Carry::default(),
                    input: Utf8Carry::default(),
                    state,
                    counted,
                    file_len: written.map_or(0, |len| len as u64),
                };
                self.open.insert(id, rec);
            }
            Message::Event { id, at, kind, .. } => self.event(id, at, kind),
            Message::Close { id, done } => {
                self.close(id);
                if let Some(done) = done {
                    // A session that stopped waiting has nothing to be told.
                    let _ = done.send(());
                }
            }
        }
    }

    /// Gathers the lines of one event, and writes them once enough are gathered. Once the
    /// recording's cap is reached, an event is only counted as left out.
    fn event(&mut self, id: u64, at: f64, kind: EventKind) {
        if self.pending.as_ref().is_some_and(|p| p.id != id) {
            self.write_pending();
        }
        let Some(rec) = self.open.get_mut(&id) else {
            return;
        };
        if rec.state.cap.reached() {
            let len = kind.len();
            rec.state.cap.left_out(len);
            // Handled, as far as a required session waiting on its recording is concerned.
            rec.state.written(len);
            return;
        }
        let len = encode(rec, at, kind, &mut self.line);
        let file_len = rec.file_len + self.line.len() as u64;
        if rec.state.cap.reached_by(file_len) {
            // This event is the last one recorded; a marker says why nothing follows.
            rec.state.cap.reach();
            let text = format!(
                "kube-ws-proxy: the recording stopped after {file_len} bytes, its cap \
                 (--record-max-bytes); the session went on unrecorded"
            );
            encode_event(at, EventCode::Marker, &text, &mut self.line);
        }
        self.pending
            .get_or_insert(Pending { id, recorded: 0 })
            .recorded += len;
        if self.line.len() >= WRITE_AT {
            self.write_pending();
        }
    }

    /// Completes a recording's file.
    fn close(&mut self, id: u64) {
        self.write_pending();
        let Some(mut rec) = self.open.remove(&id) else {
            return;
        };
        let line = &mut self.line;
        if let Some(header) = rec.header.take() {
            encode_header(&header, line);
        }
        // An incomplete character left at the end is shown, not lost.
        let tail = rec.output.finish();
        if !tail.is_empty() {
            encode_event(rec.state.elapsed(), EventCode::Output, &tail, line);
        }
        let written = rec.file.write_all(line).and_then(|()| rec.file.flush());
        let len = line.len() as u64;
        line.clear();
        match written {
            Ok(()) => {
                rec.counted.wrote(len);
                rec.state.file_written(rec.file_len + len, true)
            }
            Err(e) => {
                // What was written before stands: whole lines, which followers may read.
                rec.state.file_written(rec.file_len, true);
                rec.counted.failures.inc();
                rec.state.fail(e.to_string());
                warn!(error = %e, "a session recording could not be completed");
            }
        }
    }

    /// Writes the gathered lines of one recording to its file and counts what they record.
    fn write_pending(&mut self) {
        let Some(Pending { id, recorded: len }) = self.pending.take() else {
            return;
        };
        let started = Instant::now();
        let written = match self.open.get_mut(&id) {
            Some(rec) => rec.file.write_all(&self.line).map(|()| rec),
            None => {
                self.line.clear();
                return;
            }
        };
        let wrote = started.elapsed();
        let lines = self.line.len() as u64;
        self.line.clear();
        match written {
            Ok(rec) => {
                rec.counted.recorded.inc_by(len);
                rec.counted.wrote(lines);
                rec.state.written(len);
                // Its first event has passed, so a header written early can no longer change
                // under a follower: it is published with the lines after it.
                rec.file_len += lines;
                rec.state.file_written(rec.file_len, false);
                // After the sessions waiting on it are told: they go on meanwhile.
                self.rests.after_write(wrote);
            }
            Err(e) => self.fail(id, e),
        }
    }

    /// A write failed: the recording is over, and its session is told (`--record=required`
    /// ends it).
    fn fail(&mut self, id: u64, e: std::io::Error) {
        warn!(error = %e, "a session recording could not be written");
        if let Some(rec) = self.open.remove(&id) {
            rec.state.file_written(rec.file_len, true);
            rec.counted.failures.inc();
            rec.state.fail(e.to_string());
        }
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

/// The header of a recording a test sends the writer itself.
#[cfg(test)]
pub(super) fn test_header(title: &str) -> Header {
    Header {
        version: 2,
        width: DEFAULT_SIZE.0,
        height: DEFAULT_SIZE.1,
        timestamp: 0,
        command: String::new(),
        title: title.into(),
        kube_ws_proxy: None,
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::Semaphore;

    use super::*;
    use crate::audit::recording::queue::channel;

    /// Recordings whose files are one file opened for appending, so that its lines show the
    /// order in which the writer wrote them.
    #[test]
    fn cut_off_output_is_written_before_other_recordings_backlog() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("all.cast");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let budget = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS));
        let (tx, inbox) = channel();
        let recorded = IntCounter::new("c", "c").unwrap();
        let counted = Counted {
            recorded: recorded.clone(),
            failures: IntCounter::new("f", "f").unwrap(),
            spool: None,
        };
        let open = |id: u64, title: &str| Message::Open {
            id,
            file: file.try_clone().unwrap(),
            header: test_header(title),
            counted: counted.clone(),
            written: None,
            state: Arc::new(RecordingState::new()),
        };
        let event = |id: u64, text: String, urgent: bool| Message::Event {
            id,
            at: 0.0,
            urgent,
            _budget: budget
                .clone()
                .try_acquire_many_owned(text.len() as u32)
                .unwrap(),
            kind: EventKind::Output(Bytes::from(text)),
        };
        // 8 MiB of recording 1's output waits, then recording 2 gets an event it may wait
        // behind, and one cut off.
        tx.send(open(1, "backlog"));
        for i in 0..512 {
            tx.send(event(1, format!("{i:05}{}", "x".repeat(16 * 1024)), false));
        }
        tx.send(open(2, "cut"));
        tx.send(event(2, "before the cut".into(), false));
        tx.send(event(2, "cut off".into(), true));
        tx.send(Message::close(2));
        tx.send(Message::close(1));
        drop(tx);
        run(inbox, Rests::unused());

        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // Recording 2 whole and in its order, then recording 1 whole and in its order.
        assert_eq!(lines[0]["title"], "cut");
        assert_eq!(lines[1][2], "before the cut");
        assert_eq!(lines[2][2], "cut off");
        assert_eq!(lines[3]["title"], "backlog");
        assert_eq!(lines.len(), 4 + 512);
        for (i, line) in lines[4..].iter().enumerate() {
            assert!(line[2].as_str().unwrap().starts_with(&format!("{i:05}x")));
        }
        // Everything written gave its budget back.
        assert_eq!(budget.available_permits(), Semaphore::MAX_PERMITS);
        assert_eq!(
            recorded.get(),
            512 * (5 + 16 * 1024) + "before the cut".len() as u64 + "cut off".len() as u64
        );
    }
}
