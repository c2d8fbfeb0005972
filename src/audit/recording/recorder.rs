//! Recordings as sessions see them: [`Recordings`] (one per proxy) opens a file per session and
//! hands out [`Recorder`]s, which the session feeds its output, input and resizes.
//!
//! Memory is bounded for the whole proxy, not per session: an event takes its size from a
//! shared byte budget until the writer has written it. A disk slower than the sessions makes
//! them wait once the budget is spent (backpressure, as a slow client does), never grows
//! memory. A recording whose write fails stops; [`Recorder::failed`] tells the session, which
//! under `--record=required` ends with a Status that says why.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use prometheus::IntCounter;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio::sync::Semaphore;

use super::asciicast::Header;
use super::state::RecordingState;
use super::writer::{self, EventKind, Message};

/// Bytes of events waiting for the writer, all sessions together.
const BUDGET_BYTES: usize = 16 * 1024 * 1024;
/// What the smallest event (a resize, a short line) costs of the budget, so that the number of
/// queued events is bounded too.
const MIN_EVENT_COST: usize = 64;

/// Whether sessions are recorded (`--record`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecordPolicy {
    /// No recordings.
    #[default]
    Off,
    /// Record where possible; a session whose recording cannot start or fails goes on.
    BestEffort,
    /// A session that cannot be recorded is refused, one whose recording fails is ended.
    Required,
}

/// How recordings are made.
#[derive(Debug, Clone)]
pub struct RecordingConfig {
    /// Where the files go (`--record-dir`).
    pub dir: PathBuf,
    pub policy: RecordPolicy,
    /// Record what the client types too (`--record-stdin`; it can hold passwords).
    pub record_stdin: bool,
}

/// The counters recordings keep.
#[derive(Debug, Clone)]
pub struct RecordingCounters {
    /// Session bytes recorded.
    pub recorded_bytes: IntCounter,
    /// Recordings that could not start or could not be written to the end.
    pub failures: IntCounter,
}

/// Why a recording could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot create the recording {path}: {source}")]
pub struct RecordingError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// The proxy's recordings.
#[derive(Debug)]
pub struct Recordings {
    config: RecordingConfig,
    tx: UnboundedSender<Message>,
    budget: Arc<Semaphore>,
    next_id: AtomicU64,
    failures: IntCounter,
}

impl Recordings {
    /// Starts the writer; `--record-dir` must be a directory.
    pub fn start(
        config: RecordingConfig,
        counters: RecordingCounters,
    ) -> std::io::Result<Recordings> {
        if !std::fs::metadata(&config.dir)?.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                format!("{} is not a directory", config.dir.display()),
            ));
        }
        let (tx, rx) = unbounded_channel();
        let failures = counters.failures.clone();
        std::thread::Builder::new()
            .name("recordings".into())
            .spawn(move || writer::run(rx, counters.failures, counters.recorded_bytes))?;
        Ok(Recordings {
            config,
            tx,
            budget: Arc::new(Semaphore::new(BUDGET_BYTES)),
            next_id: AtomicU64::new(0),
            failures,
        })
    }

    /// `--record`.
    pub fn policy(&self) -> RecordPolicy {
        self.config.policy
    }

    /// Creates the session's file, `<UTC start>_<session id>.cast` in `--record-dir`. The
    /// terminal size in the header is the client's first resize, if one comes before any
    /// output.
    pub async fn open(
        &self,
        session_id: &str,
        command: &[String],
        title: String,
    ) -> Result<Recorder, RecordingError> {
        let now = SystemTime::now();
        let stamp: String = crate::timestamp::rfc3339(now)
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect();
        let path = self.config.dir.join(format!("{stamp}_{session_id}.cast"));
        let create = path.clone();
        // The disk is the writer thread's business, except for this one create.
        let file = tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::OpenOptionsExt;
            // What a session showed may hold secrets: readable by the proxy's user only.
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&create)
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
        .map_err(|source| {
            self.failures.inc();
            RecordingError {
                path: path.clone(),
                source,
            }
        })?;
        let (width, height) = writer::default_size();
        let header = Header {
            version: 2,
            width,
            height,
            timestamp: now
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            command: command.join(" "),
            title,
        };
        let state = Arc::new(RecordingState::new());
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let _ = self.tx.send(Message::Open {
            id,
            file,
            header,
            state: state.clone(),
        });
        Ok(Recorder {
            id,
            tx: self.tx.clone(),
            budget: self.budget.clone(),
            state,
            record_stdin: self.config.record_stdin,
            path,
        })
    }
}

/// One session's recording; closing it (dropping) completes the file.
#[derive(Debug)]
pub struct Recorder {
    id: u64,
    tx: UnboundedSender<Message>,
    budget: Arc<Semaphore>,
    state: Arc<RecordingState>,
    record_stdin: bool,
    path: PathBuf,
}

impl Recorder {
    /// The recording's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why the recording failed, if it did.
    pub fn error(&self) -> Option<String> {
        self.state.error()
    }

    /// Stdout or stderr, as the client got it.
    pub async fn output(&self, data: &Bytes) {
        self.send(EventKind::Output(data.clone()), data.len()).await;
    }

    /// What the client typed (only with `--record-stdin`).
    pub async fn input(&self, data: &Bytes) {
        if self.record_stdin {
            self.send(EventKind::Input(data.clone()), data.len()).await;
        }
    }

    /// The client's terminal size changed.
    pub async fn resize(&self, cols: u16, rows: u16) {
        self.send(EventKind::Resize(cols, rows), 0).await;
    }

    /// Resolves once the recording has failed; why.
    pub async fn failed(&self) -> String {
        self.state.failed().await
    }

    async fn send(&self, kind: EventKind, len: usize) {
        if self.state.has_failed() {
            return;
        }
        let cost = len.clamp(MIN_EVENT_COST, BUDGET_BYTES) as u32;
        let Ok(budget) = self.budget.clone().acquire_many_owned(cost).await else {
            return;
        };
        let _ = self.tx.send(Message::Event {
            id: self.id,
            at: self.state.elapsed(),
            kind,
            _budget: budget,
        });
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.tx.send(Message::Close { id: self.id });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters() -> RecordingCounters {
        RecordingCounters {
            recorded_bytes: IntCounter::new("r", "r").unwrap(),
            failures: IntCounter::new("f", "f").unwrap(),
        }
    }

    /// Recordings under `required` into a fresh directory.
    fn required_recordings(
        record_stdin: bool,
    ) -> (tempfile::TempDir, RecordingCounters, Recordings) {
        let dir = tempfile::tempdir().unwrap();
        let c = counters();
        let recordings = Recordings::start(
            RecordingConfig {
                dir: dir.path().to_owned(),
                policy: RecordPolicy::Required,
                record_stdin,
            },
            c.clone(),
        )
        .unwrap();
        (dir, c, recordings)
    }

    async fn wait_for(path: &Path, lines: usize) -> Vec<String> {
        for _ in 0..200 {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if text.lines().count() >= lines {
                return text.lines().map(str::to_owned).collect();
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("{} never had {lines} lines", path.display());
    }

    #[tokio::test]
    async fn a_session_becomes_an_asciicast_file() {
        let (_dir, c, recordings) = required_recordings(false);
        let rec = recordings
            .open("abcd-1", &["sh".into(), "-i".into()], "default/web".into())
            .await
            .unwrap();
        let name = rec.path().file_name().unwrap().to_str().unwrap().to_owned();
        assert!(name.ends_with("_abcd-1.cast"), "{name}");
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(rec.path()).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        }
        rec.resize(100, 30).await;
        rec.output(&Bytes::from_static(b"$ \xe2\x82")).await;
        rec.output(&Bytes::from_static(b"\xac\r\n")).await;
        rec.input(&Bytes::from_static(b"secret\r")).await;
        rec.resize(120, 40).await;
        let path = rec.path().to_owned();
        drop(rec);
        let lines = wait_for(&path, 3).await;
        let header: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(header["version"], 2);
        assert_eq!(
            (header["width"].as_u64(), header["height"].as_u64()),
            (Some(100), Some(30))
        );
        assert_eq!(header["command"], "sh -i");
        let events: Vec<serde_json::Value> = lines[1..]
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // The euro sign split across two chunks comes out whole; stdin is not recorded.
        assert_eq!(events[0][1], "o");
        assert_eq!(events[0][2], "$ ");
        assert_eq!(events[1][2], "€\r\n");
        assert_eq!(events[2][1], "r");
        assert_eq!(events[2][2], "120x40");
        assert_eq!(events.len(), 3);
        assert_eq!(c.recorded_bytes.get(), 7);
    }

    #[tokio::test]
    async fn interleaved_sessions_each_get_exactly_their_own_output() {
        // The writer gathers a recording's lines before writing them; two sessions taking
        // turns, with more output than one write gathers, must still each get their own.
        let (_dir, c, recordings) = required_recordings(false);
        let a = recordings
            .open("a-1", &["sh".into()], "default/a".into())
            .await
            .unwrap();
        let b = recordings
            .open("b-1", &["sh".into()], "default/b".into())
            .await
            .unwrap();
        let mut sent = [String::new(), String::new()];
        for i in 0..40 {
            // 20 KiB chunks, a newline and a quote in each, both sessions in an uneven mix.
            let line = |who: &str| format!("{who}{i:04}\"{}\n", "x".repeat(20 * 1024 - 8));
            for (k, rec) in [(0, &a), (0, &a), (1, &b)] {
                let text = line(["a", "b"][k]);
                rec.output(&Bytes::from(text.clone())).await;
                sent[k].push_str(&text);
            }
        }
        let paths = [a.path().to_owned(), b.path().to_owned()];
        drop((a, b));
        for (k, path) in paths.iter().enumerate() {
            let events = 1 + sent[k].matches('\n').count();
            let lines = wait_for(path, events).await;
            let shown: String = lines[1..]
                .iter()
                .map(|l| {
                    let event: serde_json::Value = serde_json::from_str(l).unwrap();
                    event[2].as_str().unwrap().to_owned()
                })
                .collect();
            assert_eq!(shown, sent[k], "{}", path.display());
        }
        // Counted just after each write: give the writer a moment to count the last one.
        let total = (sent[0].len() + sent[1].len()) as u64;
        for _ in 0..200 {
            if c.recorded_bytes.get() == total {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(c.recorded_bytes.get(), total);
    }

    #[tokio::test]
    async fn a_recording_that_cannot_be_created_is_an_error() {
        let (dir, c, recordings) = required_recordings(true);
        std::fs::remove_dir(dir.path()).unwrap();
        let err = recordings
            .open("x-1", &[], String::new())
            .await
            .unwrap_err();
        assert_eq!(err.source.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(c.failures.get(), 1);
        assert!(Recordings::start(
            RecordingConfig {
                dir: dir.path().join("nope"),
                policy: RecordPolicy::BestEffort,
                record_stdin: false,
            },
            counters(),
        )
        .is_err());
    }

    /// A disk that refuses writes (`/dev/full` behaves as a full disk) fails the recording,
    /// and the session hears of it.
    #[tokio::test]
    async fn a_full_disk_fails_the_recording_and_tells_the_session() {
        let c = counters();
        let (tx, rx) = unbounded_channel();
        let failures = c.failures.clone();
        let recorded = c.recorded_bytes.clone();
        std::thread::spawn(move || writer::run(rx, failures, recorded));
        let state = Arc::new(RecordingState::new());
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        tx.send(Message::Open {
            id: 9,
            file: full,
            header: Header {
                version: 2,
                width: 80,
                height: 24,
                timestamp: 0,
                command: String::new(),
                title: String::new(),
            },
            state: state.clone(),
        })
        .unwrap();
        let rec = Recorder {
            id: 9,
            tx,
            budget: Arc::new(Semaphore::new(BUDGET_BYTES)),
            state,
            record_stdin: false,
            path: "/dev/full".into(),
        };
        rec.output(&Bytes::from_static(b"lost")).await;
        let why = tokio::time::timeout(std::time::Duration::from_secs(5), rec.failed())
            .await
            .expect("the session hears of the failure");
        assert!(why.contains("No space left"), "{why}");
        assert_eq!(c.failures.get(), 1);
        // Later events are not even queued.
        rec.output(&Bytes::from_static(b"more")).await;
        assert!(rec.error().is_some());
    }
}
