//! Where audit events go: JSON lines appended to a file that is rotated by size, or stdout.
//!
//! Sessions never wait for the disk: an event is serialised on the session's task and handed
//! to one writer thread through a bounded queue. When the queue is full (a disk far slower
//! than sessions start and end) the event is dropped and counted, never the session held up.
//! A write that fails (disk full, file removed) is counted and logged; the writer reopens the
//! file and carries on with the next event.
//!
//! Every line stays a whole JSON object, so that a JSON-lines reader never loses more than the
//! event whose write failed: what that write left of its line is cut off again (the file is
//! truncated back to the end of its last whole line), and where nothing can be cut (stdout, or
//! a truncation that fails too) the next event starts on a fresh line instead of being glued
//! to the fragment. Events lost so are counted (`kube_ws_proxy_audit_events_lost_total`).
//! Truncating is preferred to a newline alone because it leaves no unparseable line behind;
//! it only ever removes bytes of the failed write itself, which a reader that waits for a
//! line's newline (as log shippers do) has not taken yet.
//!
//! Who ran what where is for the proxy's user only: the file is created `0600`, an existing
//! one readable by anyone else is narrowed to `0600` (with a warning), and a symbolic link at
//! the path is never followed (`O_NOFOLLOW`, at start, on every reopen and when emptied), so
//! whoever can write to the log's folder cannot point the proxy's writes at another file.
//! Rotation renames names, which follows no link either.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use prometheus::IntCounter;
use serde::Serialize;
use tracing::warn;

use super::refusals::{RefusalBudget, RefusalLimits, RefusalReport};
use super::upload::AuditBatches;
use crate::timestamp::rfc3339_millis;

/// Events waiting for the writer at most; past that they are dropped.
const QUEUE_EVENTS: usize = 4096;

/// How often the sessions the refusal budget refused are reported (one `refused` event).
pub const REFUSAL_REPORT_INTERVAL: Duration = Duration::from_secs(60);

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

/// The counters the log keeps (registered by the proxy's metrics, so that this module needs
/// nothing of the proxy's).
#[derive(Debug, Clone)]
pub struct AuditCounters {
    /// Events written whole.
    pub written: IntCounter,
    /// Events dropped because the queue was full.
    pub dropped: IntCounter,
    /// Writes and flushes that failed.
    pub write_failures: IntCounter,
    /// Events missing from the log because their write failed.
    pub lost: IntCounter,
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
    /// How many refused sessions each caller address may still have audited.
    refusals: Arc<RefusalBudget>,
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
        AuditLog::open_with(
            config,
            counters,
            RefusalLimits::default(),
            REFUSAL_REPORT_INTERVAL,
        )
    }

    /// [`open`](Self::open), with these refusal limits, reported every `report_every`.
    pub fn open_with(
        config: AuditLogConfig,
        counters: AuditCounters,
        limits: RefusalLimits,
        report_every: Duration,
    ) -> io::Result<AuditLog> {
        AuditLog::open_batched(config, counters, limits, report_every, None)
    }

    /// [`open_with`](Self::open_with), every line also written to `batches` for the store
    /// (`--audit-upload`).
    pub fn open_batched(
        config: AuditLogConfig,
        counters: AuditCounters,
        limits: RefusalLimits,
        report_every: Duration,
        batches: Option<AuditBatches>,
    ) -> io::Result<AuditLog> {
        let mut sink = Sink::open(config)?;
        sink.batches = batches;
        let (tx, rx) = sync_channel(QUEUE_EVENTS);
        let thread_counters = counters.clone();
        let refusals = Arc::new(RefusalBudget::new(limits));
        let reports = Reports {
            budget: refusals.clone(),
            every: report_every,
            next: Instant::now() + report_every,
        };
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || write_loop(sink, rx, thread_counters, reports))?;
        Ok(AuditLog {
            tx,
            counters,
            refusals,
        })
    }

    /// The caller addresses' refusal budgets ([`RefusalBudget`]).
    pub fn refusals(&self) -> &RefusalBudget {
        &self.refusals
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

/// The writer thread: writes what is queued (and, when due, the refusal report), flushes
/// when the queue is empty, until every sender is gone.
fn write_loop(
    mut sink: Sink,
    rx: Receiver<Message>,
    counters: AuditCounters,
    mut reports: Reports,
) {
    loop {
        let batch_due = sink.batches.as_ref().and_then(AuditBatches::until_due);
        let wait = batch_due.map_or(reports.until_due(), |due| due.min(reports.until_due()));
        let first = match rx.recv_timeout(wait) {
            Ok(first) => first,
            Err(RecvTimeoutError::Timeout) => {
                reports.write_due(&mut sink, &counters);
                flush(&mut sink, &counters);
                if let Some(batches) = sink.batches.as_mut() {
                    batches.close_if_due();
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let mut next = Some(first);
        while let Some(message) = next.take() {
            match message {
                Message::Line(line) => write_counted(&mut sink, &counters, &line),
                Message::Sync(done) => {
                    // What was refused until now is part of what was queued until now.
                    reports.write_now(&mut sink, &counters);
                    let _ = sink.flush();
                    if let Some(batches) = sink.batches.as_mut() {
                        // A stop: the open batch goes to the store now.
                        batches.close();
                    }
                    let _ = done.send(());
                }
            }
            next = rx.try_recv().ok();
        }
        reports.write_due(&mut sink, &counters);
        flush(&mut sink, &counters);
    }
    reports.write_now(&mut sink, &counters);
    let _ = sink.flush();
    if let Some(batches) = sink.batches.as_mut() {
        batches.close();
    }
}

fn write_counted(sink: &mut Sink, counters: &AuditCounters, line: &[u8]) {
    if let Some(batches) = sink.batches.as_mut() {
        batches.write_line(line);
    }
    match sink.write_line(line) {
        Ok(()) => counters.written.inc(),
        Err(e) => {
            counters.write_failures.inc();
            counters.lost.inc();
            warn!(error = %e, "audit event could not be written: lost");
        }
    }
}

fn flush(sink: &mut Sink, counters: &AuditCounters) {
    if let Err(e) = sink.flush() {
        counters.write_failures.inc();
        warn!(error = %e, "audit log could not be flushed");
    }
}

/// The `refused` events: one per interval in which the refusal budget refused sessions.
struct Reports {
    budget: Arc<RefusalBudget>,
    every: Duration,
    next: Instant,
}

/// One `refused` event: the sessions the proxy refused without starting them, and from where.
#[derive(Serialize)]
struct RefusedEvent<'a> {
    time: String,
    /// `refused`.
    stage: &'static str,
    /// Why: the addresses' refused sessions had spent their budgets.
    reason: &'static str,
    /// The time this event covers (since the previous report).
    interval_ms: u64,
    #[serde(flatten)]
    report: &'a RefusalReport,
}

impl Reports {
    /// Reports with nothing to say (tests that drive the writer alone).
    #[cfg(test)]
    fn idle() -> Reports {
        Reports {
            budget: Arc::new(RefusalBudget::new(RefusalLimits::default())),
            every: Duration::from_secs(3600),
            next: Instant::now() + Duration::from_secs(3600),
        }
    }

    fn until_due(&self) -> Duration {
        self.next.saturating_duration_since(Instant::now())
    }

    fn write_due(&mut self, sink: &mut Sink, counters: &AuditCounters) {
        if Instant::now() >= self.next {
            self.write_now(sink, counters);
        }
    }

    fn write_now(&mut self, sink: &mut Sink, counters: &AuditCounters) {
        let now = Instant::now();
        let since = now.saturating_duration_since(self.next.checked_sub(self.every).unwrap_or(now));
        self.next = now + self.every;
        let Some(report) = self.budget.take_report() else {
            return;
        };
        let event = RefusedEvent {
            time: rfc3339_millis(SystemTime::now()),
            stage: "refused",
            reason: "too many refused sessions from this address: refused by the proxy without \
                     being started",
            interval_ms: since.as_millis() as u64,
            report: &report,
        };
        if let Ok(mut line) = serde_json::to_vec(&event) {
            line.push(b'\n');
            write_counted(sink, counters, &line);
        }
    }
}

/// An open target: each line goes out in one `write_all`, unbuffered, so that the writer
/// always knows where the last whole line ends.
trait Target: Write + Send {
    /// Cuts the target back to `len` bytes; an error where it cannot be cut (stdout).
    fn truncate_to(&mut self, len: u64) -> io::Result<()>;
}

impl Target for File {
    fn truncate_to(&mut self, len: u64) -> io::Result<()> {
        // The file is opened for appending: the next write lands at the new end.
        self.set_len(len)
    }
}

impl Target for io::Stdout {
    fn truncate_to(&mut self, _len: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// A target just opened.
struct Opened {
    out: Box<dyn Target>,
    /// Its size in bytes (0 for stdout).
    size: u64,
    /// Whether it ends in part of a line; `None` where it cannot be told (stdout).
    ends_mid_line: Option<bool>,
}

/// How a target is opened: [`open_target`], or a faulty one in tests.
type Opener = Box<dyn FnMut(&AuditTarget) -> io::Result<Opened> + Send>;

/// The open target.
struct Sink {
    config: AuditLogConfig,
    open: Opener,
    out: Option<Box<dyn Target>>,
    /// Bytes in the current file, every one of them in a whole line unless `torn`.
    size: u64,
    /// The target may end in part of a line (a failed write that could not be cut off): the
    /// next line starts with a newline, so that it is not glued to the fragment.
    torn: bool,
    /// Every line also goes to a batch for the store (`--audit-upload`).
    batches: Option<AuditBatches>,
}

impl Sink {
    fn open(config: AuditLogConfig) -> io::Result<Sink> {
        Sink::with_opener(config, Box::new(open_target))
    }

    fn with_opener(config: AuditLogConfig, open: Opener) -> io::Result<Sink> {
        let mut sink = Sink {
            config,
            open,
            out: None,
            size: 0,
            torn: false,
            batches: None,
        };
        sink.reopen()?;
        Ok(sink)
    }

    fn reopen(&mut self) -> io::Result<()> {
        self.out = None;
        let opened = (self.open)(&self.config.target)?;
        self.out = Some(opened.out);
        self.size = opened.size;
        // A file says for itself (a new one after the old was removed is whole); stdout
        // keeps what the writer knows.
        if let Some(ends_mid_line) = opened.ends_mid_line {
            self.torn = ends_mid_line;
        }
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
        if self.torn {
            // End the fragment as a line of its own; the event that left it is lost anyway.
            if let Err(e) = out.write_all(b"\n") {
                self.out = None;
                return Err(e);
            }
            self.size += 1;
            self.torn = false;
        }
        if let Err(e) = out.write_all(line).and_then(|()| out.flush()) {
            // Whatever part of the line got out must not be glued to the next one: cut it off,
            // or have the next line start on a fresh one.
            self.torn = out.truncate_to(self.size).is_err();
            // The file may be gone: the next line reopens it.
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

/// Opens the configured target: stdout, or the file for appending, with its size and whether
/// it ends in part of a line (a failed write an earlier run could not cut off).
fn open_target(target: &AuditTarget) -> io::Result<Opened> {
    match target {
        AuditTarget::Stdout => Ok(Opened {
            out: Box::new(io::stdout()),
            size: 0,
            ends_mid_line: None,
        }),
        AuditTarget::File(path) => {
            let (file, size, ends_mid_line) = open_file(path)?;
            Ok(Opened {
                out: Box::new(file),
                size,
                ends_mid_line: Some(ends_mid_line),
            })
        }
    }
}

/// The file for appending, its size, and whether it ends in part of a line.
fn open_file(path: &Path) -> io::Result<(File, u64, bool)> {
    use std::os::unix::fs::FileExt;
    let file = append(path)?;
    let size = file.metadata()?.len();
    let mut last = [b'\n'];
    if size > 0 {
        file.read_exact_at(&mut last, size - 1)?;
    }
    Ok((file, size, last[0] != b'\n'))
}

/// The file for appending, created `0600`; never through a symbolic link, and never left
/// readable by others (see the module's doc).
fn append(path: &Path) -> io::Result<File> {
    // Read too: to see whether the file ends in a whole line.
    let file = open_no_follow(
        path,
        OpenOptions::new().create(true).read(true).append(true),
    )?;
    keep_private(&file, path)?;
    Ok(file)
}

/// Opens `path` with `options`, creating it `0600`, refusing a symbolic link (`ELOOP` said
/// plainly).
fn open_no_follow(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    options
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::other(format!(
                    "{} is a symbolic link: the audit log is written only to a file of its own \
                     (a link could point it anywhere)",
                    path.display()
                ))
            } else {
                e
            }
        })
}

/// Narrows an existing file that others may read or write to `0600` (files this writer creates
/// are `0600` already, and so are the rotated ones, renamed from them); a file whose mode
/// cannot be changed (another user's) is refused.
fn keep_private(file: &File, path: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = file.metadata()?.permissions().mode() & 0o777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "{} has mode {mode:o} and cannot be made 0600: {e}",
                    path.display()
                ),
            )
        })?;
    warn!(path = %path.display(), was = %format!("{mode:o}"), "audit log narrowed to mode 600: it was open to others");
    Ok(())
}

/// `PATH.N-1` → `PATH.N` … `PATH` → `PATH.1`; the oldest beyond `keep` is removed. With
/// `keep` 0 the file is simply emptied.
fn rotate(path: &Path, keep: usize) -> io::Result<()> {
    if keep == 0 {
        return open_no_follow(path, OpenOptions::new().write(true).truncate(true)).map(drop);
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
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    fn counters() -> AuditCounters {
        AuditCounters {
            written: IntCounter::new("w", "w").unwrap(),
            dropped: IntCounter::new("d", "d").unwrap(),
            write_failures: IntCounter::new("f", "f").unwrap(),
            lost: IntCounter::new("l", "l").unwrap(),
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
        // The file and the rotated ones are the proxy's user's alone.
        for name in ["audit.log", "audit.log.1", "audit.log.2"] {
            assert_eq!(mode(&dir.path().join(name)), 0o600, "{name}");
        }
        assert_eq!(ns(&dir.path().join("audit.log.1")), [16, 17, 18]);
        assert_eq!(ns(&dir.path().join("audit.log.2")), [13, 14, 15]);
        assert!(!dir.path().join("audit.log.3").exists());
    }

    /// A file on a disk that fills up once: writes take at most `room` bytes more, then one
    /// fails as a full disk does (after a short write, ENOSPC), and then space is free again.
    struct FillingDisk {
        file: File,
        room: Arc<AtomicU64>,
        can_truncate: bool,
    }

    impl Write for FillingDisk {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let room = self.room.load(Ordering::SeqCst);
            if room == 0 {
                self.room.store(u64::MAX, Ordering::SeqCst);
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let n = self
                .file
                .write(&buf[..buf.len().min(usize::try_from(room).unwrap_or(usize::MAX))])?;
            self.room.fetch_sub(n as u64, Ordering::SeqCst);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            self.file.flush()
        }
    }

    impl Target for FillingDisk {
        fn truncate_to(&mut self, len: u64) -> io::Result<()> {
            if self.can_truncate {
                self.file.set_len(len)
            } else {
                Err(io::ErrorKind::Unsupported.into())
            }
        }
    }

    /// Opens the file behind a [`FillingDisk`]; one that cannot be truncated stands for a
    /// pipe (stdout), which cannot say how it ends either.
    fn filling_disk(room: Arc<AtomicU64>, can_truncate: bool) -> Opener {
        Box::new(move |target| {
            let AuditTarget::File(path) = target else {
                unreachable!("a file")
            };
            let (file, size, ends_mid_line) = open_file(path)?;
            Ok(Opened {
                out: Box::new(FillingDisk {
                    file,
                    room: room.clone(),
                    can_truncate,
                }),
                size,
                ends_mid_line: can_truncate.then_some(ends_mid_line),
            })
        })
    }

    /// Writes `{"n":0}` … `{"n":4}` (8 bytes a line) through the writer thread's loop to a
    /// disk that is full 3 bytes into the third line; returns the file's lines and counters.
    fn five_events_and_a_full_disk(can_truncate: bool) -> (Vec<String>, AuditCounters) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let room = Arc::new(AtomicU64::new(8 * 2 + 3));
        let sink = Sink::with_opener(
            AuditLogConfig {
                target: AuditTarget::File(path.clone()),
                max_size: 1 << 20,
                max_backups: 1,
            },
            filling_disk(room, can_truncate),
        )
        .unwrap();
        let (tx, rx) = sync_channel(16);
        for n in 0..5 {
            let mut line = serde_json::to_vec(&serde_json::json!({ "n": n })).unwrap();
            line.push(b'\n');
            tx.send(Message::Line(line)).unwrap();
        }
        drop(tx);
        let c = counters();
        write_loop(sink, rx, c.clone(), Reports::idle());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with('\n'), "{text:?}");
        (text.lines().map(str::to_owned).collect(), c)
    }

    #[test]
    fn a_write_that_fails_mid_line_is_cut_off_and_every_line_stays_json() {
        let (lines, c) = five_events_and_a_full_disk(true);
        let ns: Vec<i64> = lines
            .iter()
            .map(|l| {
                let v: serde_json::Value =
                    serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
                v["n"].as_i64().unwrap()
            })
            .collect();
        // Only the event whose write failed is missing, and it is counted.
        assert_eq!(ns, [0, 1, 3, 4]);
        assert_eq!(c.written.get(), 4);
        assert_eq!(c.lost.get(), 1);
        assert_eq!(c.write_failures.get(), 1);
    }

    #[test]
    fn where_a_failed_write_cannot_be_cut_off_the_next_event_starts_a_fresh_line() {
        let (lines, c) = five_events_and_a_full_disk(false);
        assert_eq!(
            lines,
            [
                r#"{"n":0}"#,
                r#"{"n":1}"#,
                r#"{"n"#,
                r#"{"n":3}"#,
                r#"{"n":4}"#
            ]
        );
        assert_eq!(c.written.get(), 4);
        assert_eq!(c.lost.get(), 1);
    }

    #[test]
    fn a_file_left_ending_mid_line_gets_the_next_event_on_a_fresh_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        std::fs::write(&path, "{\"earlier\":1}\n{\"earl").unwrap();
        let log = AuditLog::open(
            AuditLogConfig {
                target: AuditTarget::File(path.clone()),
                max_size: 1 << 20,
                max_backups: 1,
            },
            counters(),
        )
        .unwrap();
        log.emit(&serde_json::json!({ "n": 1 }));
        assert!(log.sync(Duration::from_secs(5)));
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "{\"earlier\":1}\n{\"earl\n{\"n\":1}\n");
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

    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    }

    fn config(path: &Path, max_size: u64, max_backups: usize) -> AuditLogConfig {
        AuditLogConfig {
            target: AuditTarget::File(path.to_owned()),
            max_size,
            max_backups,
        }
    }

    #[test]
    fn a_symbolic_link_at_the_path_is_refused_and_its_target_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "not the proxy's\n").unwrap();
        let path = dir.path().join("audit.log");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let err = AuditLog::open(config(&path, 1 << 20, 1), counters()).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        // A dangling link is refused too (it would create its target).
        let dangling = dir.path().join("dangling.log");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(AuditLog::open(config(&dangling, 1 << 20, 1), counters()).is_err());
        assert!(!dir.path().join("nowhere").exists());
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            "not the proxy's\n"
        );
    }

    #[test]
    fn a_new_file_is_0600_and_an_existing_one_open_to_others_is_narrowed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new.log");
        let log = AuditLog::open(config(&new, 1 << 20, 1), counters()).unwrap();
        drop(log);
        assert_eq!(mode(&new), 0o600);
        let existing = dir.path().join("existing.log");
        std::fs::write(&existing, "{\"earlier\":1}\n").unwrap();
        std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o644)).unwrap();
        let log = AuditLog::open(config(&existing, 1 << 20, 1), counters()).unwrap();
        log.emit(&serde_json::json!({ "n": 1 }));
        assert!(log.sync(Duration::from_secs(5)));
        assert_eq!(mode(&existing), 0o600);
        assert_eq!(lines(&existing).len(), 2, "appended to, not replaced");
    }

    #[test]
    fn a_link_put_at_the_path_while_running_is_not_written_through() {
        // No backups: a full file is emptied in place, by opening its path again.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let c = counters();
        let log = AuditLog::open(config(&path, 20, 0), c.clone()).unwrap();
        log.emit(&serde_json::json!({ "n": 10 }));
        assert!(log.sync(Duration::from_secs(5)));
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "not the proxy's\n").unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        for n in 11..14 {
            log.emit(&serde_json::json!({ "n": n }));
        }
        assert!(log.sync(Duration::from_secs(5)));
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            "not the proxy's\n"
        );
        assert!(c.lost.get() >= 1, "the refused writes are counted");
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
