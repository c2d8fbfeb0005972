//! What a session's [`Recorder`](super::Recorder) and the writer thread share: when the
//! recording started, how many bytes it holds, and whether (and why) it failed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use tokio::sync::Notify;

/// Shared between a session's [`Recorder`] and the writer.
#[derive(Debug)]
pub struct RecordingState {
    started: Instant,
    failed: AtomicBool,
    error: Mutex<Option<String>>,
    failure: Notify,
    pub(crate) bytes: AtomicU64,
}

impl RecordingState {
    pub(crate) fn new() -> RecordingState {
        RecordingState {
            started: Instant::now(),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
            failure: Notify::new(),
            bytes: AtomicU64::new(0),
        }
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

    pub(crate) fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    pub(crate) fn fail(&self, error: String) {
        *self.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
        self.failed.store(true, Ordering::Release);
        self.failure.notify_waiters();
    }

    pub(crate) fn error(&self) -> Option<String> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
