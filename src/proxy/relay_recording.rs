//! Recording a relayed exec/attach session: the relay's copy loops hand every piece of bytes
//! they move to a [`RelayTap`], which follows the protocol passively
//! ([`crate::translate::observe`]) and feeds what it saw to the session's recorder. The bytes
//! on the wire are never changed; the tap only reads them (and, by awaiting the recorder,
//! slows the relay down when recordings fall behind, as the translated path does).

use std::sync::{Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::audit::recording::Recorder;
use crate::translate::observe::{Direction, ErrorStream, Observed, Observer};

/// What the two directions of one relay share. Both run in one task, so the lock is never
/// contended; it is a `Mutex` rather than a `RefCell` only because that task may move between
/// threads (it must be `Sync` to be borrowed across awaits). It is never held across one.
#[derive(Debug)]
struct Shared {
    observer: Observer,
    errors: ErrorStream,
    /// Why observing stopped, if it did.
    failure: Option<String>,
}

/// The recording of one relayed session.
#[derive(Debug)]
pub struct RelayTap {
    recorder: Recorder,
    /// `--record=required`: a session that can no longer be recorded must end.
    required: bool,
    shared: Mutex<Shared>,
    /// Cancelled once observing failed under `--record=required`.
    unobservable: CancellationToken,
}

/// How a recorded relay ended, for its audit event.
#[derive(Debug, Default)]
pub struct TapEnd {
    /// From the error stream's Status, if it sent one.
    pub exit_code: Option<i32>,
    /// `Success`, `exit N`, a reason or the text the error stream carried.
    pub status: Option<String>,
    /// Why the recording is incomplete, if it is.
    pub recording_error: Option<String>,
}

impl RelayTap {
    /// A tap recording to `recorder` what `observer` follows.
    pub fn new(recorder: Recorder, observer: Observer, required: bool) -> RelayTap {
        RelayTap {
            recorder,
            required,
            shared: Mutex::new(Shared {
                observer,
                errors: ErrorStream::default(),
                failure: None,
            }),
            unobservable: CancellationToken::new(),
        }
    }

    /// The recording's file.
    pub fn path(&self) -> &std::path::Path {
        self.recorder.path()
    }

    /// Follows bytes the relay is about to pass on in `direction` and records what they
    /// carried. Returns `false` when the session must end instead (observing failed under
    /// `--record=required`): those bytes are then not passed on.
    pub async fn relayed(&self, direction: Direction, bytes: &[u8]) -> bool {
        let mut events = Vec::new();
        {
            let mut shared = self.lock();
            if let Err(e) = shared.observer.feed(direction, bytes, &mut events) {
                warn!(
                    recording = %self.recorder.path().display(),
                    error = %e,
                    "stopped recording a relayed session"
                );
                shared.failure = Some(e.to_string());
                if self.required {
                    self.unobservable.cancel();
                    return false;
                }
            }
            for event in &events {
                if let Observed::Error(data) = event {
                    shared.errors.push(data);
                }
            }
        }
        for event in events {
            match event {
                Observed::Stdout(data) | Observed::Stderr(data) => {
                    self.recorder.output(&data).await
                }
                Observed::Stdin(data) => self.recorder.input(&data).await,
                Observed::Resize(size) => self.recorder.resize(size.width, size.height).await,
                Observed::Error(_) => {}
            }
        }
        true
    }

    /// Resolves, with the reason, once the session can no longer be recorded and recordings
    /// are required; never otherwise.
    pub async fn must_end(&self) -> String {
        if !self.required {
            return std::future::pending().await;
        }
        tokio::select! {
            () = self.unobservable.cancelled() => self
                .lock()
                .failure
                .clone()
                .unwrap_or_else(|| "the session could not be followed".to_owned()),
            error = self.recorder.failed() => error,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A panic while it was held cannot leave the observer half-updated in a way that
        // matters more than losing the recording's tail.
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The end of the session as the tap saw it; dropping the tap completes the recording.
    pub fn finish(self) -> TapEnd {
        let shared = self.shared.into_inner().unwrap_or_else(|e| e.into_inner());
        let (exit_code, status) = shared.errors.outcome();
        TapEnd {
            exit_code,
            status,
            recording_error: shared.failure.or_else(|| self.recorder.error()),
        }
    }
}
