//! Where audit events go: JSON lines appended to a file that is rotated by size, or stdout.
//!
//! Sessions never wait for the disk: an event is serialised on the session's task and handed
//! to one writer thread through a bounded queue. When the queue is full (a disk far slower
//! than sessions start and end) the event is dropped and counted, never the session held up.
//! A write that fails (disk full, file removed) is counted and logged; the writer reopens the
//! file and carries on with the next event.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::time::Duration;

use prometheus::IntCounter;
use serde::Serialize;
use tracing::warn;

/// Events waiting for the writer at most; past that they are dropped.
const QUEUE_EVENTS: usize = 4096;

/// Where the events go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditTarget {
    Stdout,
    File(PathBuf),
}

impl AuditTarget {
    /// `-` is stdout, anything else a file path.
    pub fn parse(s: &str) -> AuditTarget {
        if s == "-" {
            AuditTarget::Stdout
        } else {
            AuditTarget::File(PathBuf::from(s))
        }
    }
}

/// The audit log's settings.
#[derive(Debug, Clone)]
pub struct AuditLogConfig {
    pub target: AuditTarget,
    /// A file is rotated before it would grow past this (`--audit-log-max-size`).
    pub max_size: u64,
    /// Rotated files kept: `PATH.1` (newest) … `PATH.N` (`--audit-log-max-backups`).
    pub max_backups: usize,
}

/// The counters the log keeps (registered by the proxy's metrics).
#[derive(Debug, Clone)]
pub struct AuditCounters {
    pub written: IntCounter,
    pub dropped: IntCounter,
    pub write_failures: IntCounter,
}

enum Message {
    Line(Vec<u8>),
    /// Answered once every line queued before it is written and flushed.
    Sync(std::sync::mpsc::Sender<()>),
}

/// The audit log: cheap to share, writes on its own thread.
#[derive(Debug)]
pub struct AuditLog {
    tx: SyncSender<Message>,
    counters: AuditCounters,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Message::Line(_) => "Line",
            Message::Sync(_) => "Sync",
        })
    }
}

impl AuditLog {
    /// Opens the target now (a file that cannot be written stops the start) and starts the
    /// writer thread.
    pub fn open(config: AuditLogConfig, counters: AuditCounters) -> io::Result<AuditLog> {
        let sink = Sink::open(config)?;
        let (tx, rx) = sync_channel(QUEUE_EVENTS);
        let thread_counters = counters.clone();
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || write_loop(sink, rx, thread_counters))?;
        Ok(AuditLog { tx, counters })
    }

    /// Queues one event as a JSON line; drops it (and counts it) if the queue is full.
    pub fn emit<T: Serialize>(&self, event: &T) {
        let mut line = match serde_json::to_vec(event) {
            Ok(line) => line,
            Err(e) => {
                warn!(error = %e, "audit event could not be serialised");
                self.counters.dropped.inc();
                return;
            }
        };
        line.push(b'\n');
        match self.tx.try_send(Message::Line(line)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.counters.dropped.inc();
                warn!("audit event dropped: the audit log's queue is full");
            }
            Err(TrySendError::Disconnected(_)) => self.counters.dropped.inc(),
        }
    }

    /// Waits (blocking, at most `timeout`) until every event queued so far is written: at
    /// shutdown, so that the last sessions' ends are not lost.
    pub fn sync(&self, timeout: Duration) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        let deadline = std::time::Instant::now() + timeout;
        // The queue may be full: retry until the deadline rather than block past it.
        let mut message = Message::Sync(tx);
        loop {
            match self.tx.try_send(message) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if std::time::Instant::now() < deadline => {
                    message = m;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return false,
            }
        }
        rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .is_ok()
    }
}

/// The writer thread: writes what is queued, flushes when the queue is empty, until every
/// sender is gone.
fn write_loop(mut sink: Sink, rx: Receiver<Message>, counters: AuditCounters) {
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(message) = next.take() {
            match message {
                Message::Line(line) => match sink.write_line(&line) {
                    Ok(()) => counters.written.inc(),
                    Err(e) => {
                        counters.write_failures.inc();
                        warn!(error = %e, "audit event could not be written");
                    }
                },
                Message::Sync(done) => {
                    let _ = sink.flush();
                    let _ = done.send(());
                }
            }
            next = rx.try_recv().ok();
        }
        if let Err(e) = sink.flush() {
            counters.write_failures.inc();
            warn!(error = %e, "audit log could not be flushed");
        }
    }
    let _ = sink.flush();
}

/// The open target.
struct Sink {
    config: AuditLogConfig,
    out: Option<io::BufWriter<Box<dyn Write + Send>>>,
    /// Bytes in the current file.
    size: u64,
}

impl Sink {
    fn open(config: AuditLogConfig) -> io::Result<Sink> {
        let mut sink = Sink {
            config,
            out: None,
            size: 0,
        };
        sink.reopen()?;
        Ok(sink)
    }

    fn reopen(&mut self) -> io::Result<()> {
        self.out = None;
        let (writer, size): (Box<dyn Write + Send>, u64) = match &self.config.target {
            AuditTarget::Stdout => (Box::new(io::stdout()), 0),
            AuditTarget::File(path) => {
                let file = append(path)?;
                let size = file.metadata()?.len();
                (Box::new(file), size)
            }
        };
        self.out = Some(io::BufWriter::new(writer));
        self.size = size;
        Ok(())
    }

    fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        if let AuditTarget::File(path) = &self.config.target {
            if self.size > 0 && self.size + line.len() as u64 > self.config.max_size {
                let path = path.clone();
                self.flush()?;
                self.out = None;
                rotate(&path, self.config.max_backups)?;
            }
        }
        if self.out.is_none() {
            // A failed rotation or write left no file open: try again for this line.
            self.reopen()?;
        }
        let out = self.out.as_mut().expect("reopened");
        if let Err(e) = out.write_all(line) {
            self.out = None;
            return Err(e);
        }
        self.size += line.len() as u64;
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.out.as_mut() {
            Some(out) => out.flush().inspect_err(|_| self.out = None),
            None => Ok(()),
        }
    }
}

fn append(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // Who ran what where is for the proxy's user (and whoever it hands the files to) only.
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// `PATH.N-1` → `PATH.N` … `PATH` → `PATH.1`; the oldest beyond `keep` is removed. With
/// `keep` 0 the file is simply emptied.
fn rotate(path: &Path, keep: usize) -> io::Result<()> {
    if keep == 0 {
        return OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(path)
            .map(drop);
    }
    let numbered = |n: usize| {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    };
    let _ = std::fs::remove_file(numbered(keep));
    for n in (1..keep).rev() {
        match std::fs::rename(numbered(n), numbered(n + 1)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    std::fs::rename(path, numbered(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters() -> AuditCounters {
        AuditCounters {
            written: IntCounter::new("w", "w").unwrap(),
            dropped: IntCounter::new("d", "d").unwrap(),
            write_failures: IntCounter::new("f", "f").unwrap(),
        }
    }

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn events_are_appended_as_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        std::fs::write(&path, "{\"earlier\":true}\n").unwrap();
        let c = counters();
        let log = AuditLog::open(
            AuditLogConfig {
                target: AuditTarget::File(path.clone()),
                max_size: 1 << 20,
                max_backups: 2,
            },
            c.clone(),
        )
        .unwrap();
        for n in 0..3 {
            log.emit(&serde_json::json!({ "n": n }));
        }
        assert!(log.sync(Duration::from_secs(5)));
        let got = lines(&path);
        assert_eq!(got.len(), 4);
        assert_eq!(got[0]["earlier"], true);
        assert_eq!(got[3]["n"], 2);
        assert_eq!(c.written.get(), 3);
        assert_eq!(c.dropped.get(), 0);
    }

    #[test]
    fn files_rotate_by_size_and_keep_the_newest_backups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = AuditLog::open(
            AuditLogConfig {
                target: AuditTarget::File(path.clone()),
                // Each line is `{"n":NN}\n`, 9 bytes: three fit in a file.
                max_size: 30,
                max_backups: 2,
            },
            counters(),
        )
        .unwrap();
        for n in 10..20 {
            log.emit(&serde_json::json!({ "n": n }));
        }
        assert!(log.sync(Duration::from_secs(5)));
        let ns =
            |p: &Path| -> Vec<i64> { lines(p).iter().map(|v| v["n"].as_i64().unwrap()).collect() };
        assert_eq!(ns(&path), [19]);
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        }
        assert_eq!(ns(&dir.path().join("audit.log.1")), [16, 17, 18]);
        assert_eq!(ns(&dir.path().join("audit.log.2")), [13, 14, 15]);
        assert!(!dir.path().join("audit.log.3").exists());
    }

    #[test]
    fn an_unwritable_target_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let err = AuditLog::open(
            AuditLogConfig {
                target: AuditTarget::File(dir.path().join("missing/audit.log")),
                max_size: 1 << 20,
                max_backups: 1,
            },
            counters(),
        )
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn dash_is_stdout() {
        assert_eq!(AuditTarget::parse("-"), AuditTarget::Stdout);
        assert_eq!(
            AuditTarget::parse("/var/log/a"),
            AuditTarget::File("/var/log/a".into())
        );
    }
}
