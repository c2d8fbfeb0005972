//! What a session's [`Recorder`](super::Recorder) and the writer thread share: when the
//! recording started, how many bytes it holds, and whether (and why) it failed; and what its
//! followers are told: how much of its file is written, and whether it is complete
//! ([`FileProgress`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{watch, Notify};

/// How far a recording's file is written, as its followers see it: the writer publishes it
/// after each write, so a follower reads whole lines only and never waits on the session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileProgress {
    /// Bytes of the file that are final (whole lines, a write the kernel accepted).
    pub written: u64,
    /// The writer is done with the file: `written` is its length for good.
    pub closed: bool,
}

/// A recording's size cap (`--record-max-bytes`), and what it left out once reached. Shared by
/// the writer (which reaches it), the session's recorder (which then records nothing more) and
/// the session's audit trail (which says so in its `ended` event).
#[derive(Debug, Default)]
pub struct RecordingCap {
    max: Option<u64>,
    reached: AtomicBool,
    left_out: AtomicU64,
}

/// What a recording's `ended` audit event says of a recording its cap cut short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Truncation {
    /// The cap (`--record-max-bytes`).
    pub max_bytes: u64,
    /// Session bytes (output, and input with `--record-stdin`) left out of the recording.
    pub unrecorded_bytes: u64,
}

impl RecordingCap {
    /// A cap of `max` bytes of file (`None`: none).
    pub fn new(max: Option<u64>) -> RecordingCap {
        RecordingCap {
            max,
            ..RecordingCap::default()
        }
    }

    /// Whether a file of `len` bytes has reached the cap.
    pub(crate) fn reached_by(&self, len: u64) -> bool {
        self.max.is_some_and(|max| len >= max)
    }

    /// The cap was reached: nothing more is recorded.
    pub(crate) fn reach(&self) {
        self.reached.store(true, Ordering::Release);
    }

    /// Whether the cap was reached.
    pub fn reached(&self) -> bool {
        self.reached.load(Ordering::Acquire)
    }

    /// `len` more session bytes were left out.
    pub(crate) fn left_out(&self, len: u64) {
        self.left_out.fetch_add(len, Ordering::Relaxed);
    }

    /// What the recording's `ended` event says: `None` unless the cap was reached.
    pub fn truncation(&self) -> Option<Truncation> {
        match (self.reached(), self.max) {
            (true, Some(max_bytes)) => Some(Truncation {
                max_bytes,
                unrecorded_bytes: self.left_out.load(Ordering::Relaxed),
            }),
            _ => None,
        }
    }
}

/// Shared between a session's [`Recorder`] and the writer.
#[derive(Debug)]
pub struct RecordingState {
    started: Instant,
    failed: AtomicBool,
    error: Mutex<Option<String>>,
    failure: Notify,
    /// Output and input bytes the writer has written (a write the kernel accepted).
    pub(crate) bytes: AtomicU64,
    /// Output and input bytes the session has handed the writer (`--record=required` only).
    queued: AtomicU64,
    /// Told whenever `bytes` grows or the recording fails.
    progress: Notify,
    /// The file's progress, for followers. Publishing it costs the writer one uncontended
    /// lock per write (up to 256 KiB of lines), whether anyone follows or not.
    file: watch::Sender<FileProgress>,
    /// Its size cap.
    pub(crate) cap: Arc<RecordingCap>,
}

impl RecordingState {
    #[cfg(test)]
    pub(crate) fn new() -> RecordingState {
        RecordingState::capped(None)
    }

    /// A recording whose file may hold at most `max` bytes (`None`: no cap).
    pub(crate) fn capped(max: Option<u64>) -> RecordingState {
        RecordingState {
            started: Instant::now(),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
            failure: Notify::new(),
            bytes: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            progress: Notify::new(),
            file: watch::Sender::new(FileProgress::default()),
            cap: Arc::new(RecordingCap::new(max)),
        }
    }

    /// The file's progress from now on, for a follower.
    pub(crate) fn follow(&self) -> watch::Receiver<FileProgress> {
        self.file.subscribe()
    }

    /// The writer made the file's first `written` bytes final (`closed`: and is done with it).
    pub(crate) fn file_written(&self, written: u64, closed: bool) {
        self.file.send_replace(FileProgress { written, closed });
    }

    /// The file's final bytes so far, as the writer counted them (its size once closed).
    pub(crate) fn file_len(&self) -> u64 {
        self.file.borrow().written
    }

    pub(crate) fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Resolves once the recording has failed; why.
    pub(crate) async fn failed(&self) -> String {
        loop {
            let notified = self.failure.notified();
            if let Some(error) = self.error() {
                return error;
            }
            notified.await;
        }
    }

    /// The session handed the writer `len` more bytes.
    pub(crate) fn queued(&self, len: u64) {
        self.queued.fetch_add(len, Ordering::AcqRel);
    }

    /// The writer wrote `len` more bytes.
    pub(crate) fn written(&self, len: u64) {
        self.bytes.fetch_add(len, Ordering::AcqRel);
        self.progress.notify_waiters();
    }

    /// Resolves once all but at most `ahead` of the bytes queued are written (`true`), or
    /// once the recording has failed (`false`).
    pub(crate) async fn caught_up(&self, ahead: u64) -> bool {
        loop {
            let progress = self.progress.notified();
            tokio::pin!(progress);
            // Registered before the check: a write that lands in between still wakes it.
            progress.as_mut().enable();
            if self.failed.load(Ordering::Acquire) {
                return false;
            }
            let queued = self.queued.load(Ordering::Acquire);
            if queued.saturating_sub(self.bytes.load(Ordering::Acquire)) <= ahead {
                return true;
            }
            progress.await;
        }
    }

    pub(crate) fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    pub(crate) fn fail(&self, error: String) {
        *self.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
        self.failed.store(true, Ordering::Release);
        self.failure.notify_waiters();
        self.progress.notify_waiters();
    }

    pub(crate) fn error(&self) -> Option<String> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
