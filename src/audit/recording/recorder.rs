//! Recordings as sessions see them: [`Recordings`] (one per proxy) opens a file per session and
//! hands out [`Recorder`]s, which the session feeds its output, input and resizes.
//!
//! Memory is bounded for the whole proxy, not per session: an event takes its size from a
//! shared byte budget until the writer has written it. A disk slower than the sessions makes
//! them wait once the budget is spent (backpressure, as a slow client does), never grows
//! memory. The budget is handed out in turn, so a session takes what it already holds
//! (everything one read brought) in one wait: a wait per chunk would make a session with a
//! backlog wait its turn again for every chunk.
//!
//! Waiting in turn would put a person's keystroke echo behind every other session's bulk
//! output whenever the writer is behind (tenths of a second). So each session also has an
//! express lane of its own: a small batch goes ahead without queueing when the session has
//! nothing else in that lane. That bounds memory per session too ([`EXPRESS_BYTES`] each, on
//! top of the shared budget), as its other buffers are.
//!
//! Waiting in turn would also make a session whose upstream cut it off (a connection reset,
//! a kubelet gone) pass on what it still holds at its share of the writer: seconds, when the
//! writer is behind, for a session that can only end. Such output can no longer grow, so it
//! takes a second shared lane, the cut lane ([`CUT_BYTES`]), which only cut-off output uses
//! and which is therefore free when a fault strikes. The lane only gets room back as the
//! writer writes what is in it, so the writer writes that output before other sessions'
//! events (it is sent marked urgent): in arrival order it would wait behind the whole shared
//! budget, and the lane would turn over at the pace of that backlog, not of the cut output.
//!
//! A recording whose write fails stops; [`Recorder::failed`] tells the session, which under
//! `--record=required` ends with a Status that says why.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use bytes::Bytes;
use prometheus::{IntCounterVec, Opts};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use super::asciicast::{Header, HeaderSession};
use super::follow::RecordingFeed;
use super::queue::{self, Outbox};
use super::state::RecordingState;
use super::typing::{Rests, Typing};
use super::writer::{self, Counted, EventKind, Message};
use crate::audit::bounds;
use crate::audit::upload::{SpoolCap, Stored, UploadJob, UploadState, Uploader};

/// Bytes of events waiting for the writer, all sessions together.
const BUDGET_BYTES: usize = 16 * 1024 * 1024;
/// Bytes of cut-off output waiting for the writer, all sessions together, beside
/// [`BUDGET_BYTES`]: room for the rest of 64 sessions' full inboxes at once.
pub const CUT_BYTES: usize = 16 * 1024 * 1024;
/// What one session may have waiting for the writer without taking its turn for the shared
/// budget: a screenful of output, a keystroke's echo, a resize.
pub const EXPRESS_BYTES: usize = 8 * 1024;
/// How far, under `--record=required`, a session's output may run ahead of what the writer has
/// written to its file (a write the kernel accepted): output is passed on only once all but
/// this much of what the session recorded, itself included, is written; a failed write ends
/// the session before more goes. The client so holds at most this much output the recording
/// lacks.
pub const AHEAD_BYTES: u64 = 64 * 1024;
/// How long a session's end waits for its recording's file to be complete
/// ([`Recorder::close`]): longer than the writer needs for everything the budgets let wait
/// (32 MiB) on any disk that works, so that only a stuck disk reaches it.
pub const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
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
    /// Free bytes `dir`'s filesystem must keep for a recording to start (`--record-min-free`).
    pub min_free: u64,
    /// The most a recording's file may hold (`--record-max-bytes`; `None`: no cap).
    pub max_bytes: Option<u64>,
}

/// The counters recordings keep, by the `cluster` of their session.
#[derive(Debug, Clone)]
pub struct RecordingCounters {
    /// Session bytes recorded.
    pub recorded_bytes: IntCounterVec,
    /// Recordings that could not start or could not be written to the end.
    pub failures: IntCounterVec,
    /// Seconds the writer rested between writes because someone was typing ([`super::typing`]).
    pub writer_rested: prometheus::Counter,
}

impl RecordingCounters {
    /// Counters registered nowhere.
    pub fn unregistered() -> RecordingCounters {
        let vec = |name: &str| {
            IntCounterVec::new(Opts::new(name, name), &["cluster"]).expect("valid counter")
        };
        RecordingCounters {
            recorded_bytes: vec("recorded_bytes"),
            failures: vec("failures"),
            writer_rested: prometheus::Counter::new("rested", "rested").expect("valid counter"),
        }
    }

    /// What a recording of `cluster` counts in.
    fn of(&self, cluster: &str) -> Counted {
        Counted {
            recorded: self.recorded_bytes.with_label_values(&[cluster]),
            failures: self.failures.with_label_values(&[cluster]),
            spool: None,
        }
    }
}

/// Whose session a recording is: the `cluster` its counters count under, the folder of
/// `--record-dir` its file goes in (`None`: `--record-dir` itself), and the pod's namespace
/// (its header names the session, its namespace and the folder's cluster).
#[derive(Debug, Clone, Copy)]
pub struct RecordingPlace<'a> {
    /// The cluster's label.
    pub cluster: &'a str,
    /// One folder name (a cluster's name: a DNS label), made when the first recording goes
    /// in it.
    pub folder: Option<&'a str>,
    /// The session's pod's namespace.
    pub namespace: &'a str,
}

/// Why a recording could not start.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    /// The file could not be created.
    #[error("cannot create the recording {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file was created but its header could not be written (a full filesystem lets a
    /// file be created and then refuses its first byte).
    #[error("cannot write the recording {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The folder is not one plain name.
    #[error("{folder:?} is not a recording folder")]
    Folder { folder: String },
    /// The free space of `--record-dir`'s filesystem could not be found out.
    #[error("cannot tell the free space left for recordings in {dir}: {source}")]
    FreeSpace {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// The filesystem has less free space than `--record-min-free` keeps.
    #[error(
        "too little free space for recordings in {dir}: {free} bytes free, \
         --record-min-free keeps {min_free}"
    )]
    LowSpace {
        dir: PathBuf,
        free: u64,
        min_free: u64,
    },
    /// The spool holds `--record-spool-max` or more bytes not yet in the store, or as many
    /// files as that allows ([`SpoolCap::files`]).
    #[error(
        "the recording spool is full: {bytes} bytes in {files} files wait for their upload to \
         {target}, --record-spool-max is {max} (at most {max_files} files)"
    )]
    SpoolFull {
        bytes: u64,
        files: u64,
        max: u64,
        max_files: u64,
        target: String,
    },
}

impl RecordingError {
    /// The I/O error behind it, if one is.
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match self {
            RecordingError::Create { source, .. }
            | RecordingError::Write { source, .. }
            | RecordingError::FreeSpace { source, .. } => Some(source),
            RecordingError::LowSpace { .. }
            | RecordingError::Folder { .. }
            | RecordingError::SpoolFull { .. } => None,
        }
    }
}

/// The proxy's recordings.
#[derive(Debug)]
pub struct Recordings {
    config: RecordingConfig,
    tx: Outbox,
    budget: Arc<Semaphore>,
    /// The lane for output its upstream cut off ([`CUT_BYTES`]).
    cut_lane: Arc<Semaphore>,
    next_id: AtomicU64,
    counters: RecordingCounters,
    /// Where closed recordings go (`--record-upload`), if anywhere.
    uploader: Option<Uploader>,
    /// `--record-spool-max`: no recording starts while the spool holds this much.
    spool_max: Option<SpoolCap>,
    /// When someone last typed on a recorded terminal session: the writer rests meanwhile.
    typing: Arc<Typing>,
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
        let (tx, inbox) = queue::channel();
        let typing = Arc::new(Typing::default());
        let rests = Rests::new(typing.clone(), counters.writer_rested.clone());
        std::thread::Builder::new()
            .name("recordings".into())
            .spawn(move || writer::run(inbox, rests))?;
        Ok(Recordings {
            config,
            tx,
            budget: Arc::new(Semaphore::new(BUDGET_BYTES)),
            cut_lane: Arc::new(Semaphore::new(CUT_BYTES)),
            next_id: AtomicU64::new(0),
            counters,
            uploader: None,
            spool_max: None,
            typing,
        })
    }

    /// Uploads each recording once closed (`--record-upload`), its key under `uploader`'s
    /// target from the session's cluster folder, UTC start and id; while the spool holds
    /// `spool_max` bytes or more (`--record-spool-max`), no recording starts.
    pub fn upload_to(&mut self, uploader: Uploader, spool_max: Option<u64>) {
        self.uploader = Some(uploader);
        self.spool_max = spool_max.map(|bytes| SpoolCap { bytes });
    }

    /// Refuses a new recording while the spool is at its cap, in bytes or in files waiting.
    fn check_spool(&self) -> Result<(), RecordingError> {
        let (Some(cap), Some(uploader)) = (self.spool_max, &self.uploader) else {
            return Ok(());
        };
        let (bytes, files) = (uploader.spool().bytes(), uploader.pending_files());
        if cap.reached(bytes, files) {
            return Err(RecordingError::SpoolFull {
                bytes,
                files,
                max: cap.bytes,
                max_files: cap.files(),
                target: uploader.target().to_string(),
            });
        }
        Ok(())
    }

    /// Takes the whole shared budget, as other sessions' bulk output behind a slow disk does.
    #[cfg(test)]
    pub(crate) fn spend_budget(&self) -> tokio::sync::OwnedSemaphorePermit {
        self.budget
            .clone()
            .try_acquire_many_owned(BUDGET_BYTES as u32)
            .expect("an unused budget")
    }

    /// Where closed recordings go, if anywhere (`--record-upload`).
    pub fn uploader(&self) -> Option<&Uploader> {
        self.uploader.as_ref()
    }

    /// `--record`.
    pub fn policy(&self) -> RecordPolicy {
        self.config.policy
    }

    /// Creates the session's file, `<UTC start>_<session id>.cast` in `--record-dir` or the
    /// folder of it `place` names. The terminal size in the header is the client's first
    /// resize, if one comes before any output. What is typed on a session with a terminal
    /// (`tty`) makes the writer rest ([`super::typing`]).
    pub async fn open(
        &self,
        place: RecordingPlace<'_>,
        session_id: &str,
        command: &[String],
        title: String,
        tty: bool,
    ) -> Result<Recorder, RecordingError> {
        let mut counted = self.counters.of(place.cluster);
        counted.spool = self.uploader.as_ref().map(|u| u.spool().clone());
        self.check_spool().inspect_err(|_| counted.failures.inc())?;
        let dir = self
            .folder(place.folder)
            .inspect_err(|_| counted.failures.inc())?;
        let now = SystemTime::now();
        let stamp = crate::timestamp::compact(now);
        let path = dir.join(format!("{stamp}_{session_id}.cast"));
        let (width, height) = writer::default_size();
        let header = Header {
            version: 2,
            width,
            height,
            timestamp: now
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            // What the caller chose, cut as its audit events cut it.
            command: bounds::bounded_command(command).join(" "),
            title: {
                let mut title = title;
                bounds::cut_text(&mut title, bounds::TEXT_CAP);
                title
            },
            kube_ws_proxy: Some(HeaderSession {
                session_id: session_id.to_owned(),
                namespace: place.namespace.to_owned(),
                cluster: place.folder.map(str::to_owned),
            }),
        };
        // Under `required` the header is written now, before the session is admitted: a file
        // that can be created is no proof that anything can be written to it.
        let required = self.config.policy == RecordPolicy::Required;
        let (min_free, create) = (self.config.min_free, path.clone());
        let folder = place.folder.is_some();
        let early = required.then(|| header.clone());
        // The disk is the writer thread's business, except for this start.
        let (file, written) = tokio::task::spawn_blocking(move || {
            if folder {
                make_folder(&dir)?;
            }
            start_file(&dir, &create, min_free, early.as_ref())
        })
        .await
        .unwrap_or_else(|e| {
            Err(RecordingError::Create {
                path: path.clone(),
                source: std::io::Error::other(e),
            })
        })
        .inspect_err(|_| counted.failures.inc())?;
        let state = Arc::new(RecordingState::capped(self.config.max_bytes));
        let upload = self.uploader.clone().map(|uploader| {
            let outcome = Arc::new(UploadOutcome::default());
            Upload {
                job: UploadJob {
                    key: uploader
                        .target()
                        .recording_key(place.folder, now, session_id),
                    path: path.clone(),
                    session_id: session_id.to_owned(),
                    after_restart: false,
                    stored: Some(outcome.stored.clone()),
                },
                uploader,
                outcome,
            }
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.tx.send(Message::Open {
            id,
            file,
            header,
            counted,
            written,
            state: state.clone(),
        });
        Ok(Recorder {
            id,
            tx: self.tx.clone(),
            budget: self.budget.clone(),
            cut_lane: self.cut_lane.clone(),
            express: Arc::new(Semaphore::new(EXPRESS_BYTES)),
            state,
            record_stdin: self.config.record_stdin,
            required,
            path,
            closing: None,
            upload,
            typing: tty.then(|| self.typing.clone()),
        })
    }
}

impl Recordings {
    /// `--record-dir`, or its folder `folder` (one plain name: never a path that leaves it).
    pub(super) fn folder(&self, folder: Option<&str>) -> Result<PathBuf, RecordingError> {
        let Some(folder) = folder else {
            return Ok(self.config.dir.clone());
        };
        let mut parts = Path::new(folder).components();
        match (parts.next(), parts.next()) {
            (Some(std::path::Component::Normal(name)), None) if name == folder => {
                Ok(self.config.dir.join(folder))
            }
            _ => Err(RecordingError::Folder {
                folder: folder.to_owned(),
            }),
        }
    }
}

/// Makes the folder `dir` of `--record-dir` if it is not there yet, readable by the proxy's
/// user only (as the recordings in it).
fn make_folder(dir: &Path) -> Result<(), RecordingError> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(RecordingError::Create {
            path: dir.to_owned(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Checks the free space of `dir`, creates the recording at `path` and, when `header` is
/// given, writes it (the write the kernel accepted: a full filesystem refuses it); the file
/// and the length of the header line written.
fn start_file(
    dir: &Path,
    path: &Path,
    min_free: u64,
    header: Option<&Header>,
) -> Result<(std::fs::File, Option<usize>), RecordingError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if min_free > 0 {
        let free = free_bytes(dir).map_err(|source| RecordingError::FreeSpace {
            dir: dir.to_owned(),
            source,
        })?;
        if free < min_free {
            return Err(RecordingError::LowSpace {
                dir: dir.to_owned(),
                free,
                min_free,
            });
        }
    }
    // What a session showed may hold secrets: readable by the proxy's user only.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| RecordingError::Create {
            path: path.to_owned(),
            source,
        })?;
    let Some(header) = header else {
        return Ok((file, None));
    };
    let line = writer::padded_header(header, None).expect("a header fits its own padding");
    if let Err(source) = file.write_all(&line).and_then(|()| file.flush()) {
        // An empty file is no recording: it would only mislead whoever looks.
        let _ = std::fs::remove_file(path);
        return Err(RecordingError::Write {
            path: path.to_owned(),
            source,
        });
    }
    Ok((file, Some(line.len())))
}

/// Bytes of `dir`'s filesystem an unprivileged writer may still use (statvfs).
fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_dir = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: statvfs is plain data, for which all zeroes is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_dir` is a NUL-terminated path and `st` a valid place for the answer; both
    // outlive the call.
    if unsafe { libc::statvfs(c_dir.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// One session's recording; closing it (dropping) completes the file.
#[derive(Debug)]
pub struct Recorder {
    id: u64,
    tx: Outbox,
    budget: Arc<Semaphore>,
    /// The lane for output its upstream cut off, shared by all sessions.
    cut_lane: Arc<Semaphore>,
    /// This session's own small lane beside `budget`.
    express: Arc<Semaphore>,
    state: Arc<RecordingState>,
    record_stdin: bool,
    /// `--record=required`: what is recorded is passed on only within [`AHEAD_BYTES`] of the
    /// writer.
    required: bool,
    path: PathBuf,
    /// Told by the writer once the file is complete ([`Recorder::close`]).
    closing: Option<oneshot::Sender<()>>,
    /// Its upload once closed (`--record-upload`).
    upload: Option<Upload>,
    /// Told when the client types, on a session with a terminal.
    typing: Option<Arc<Typing>>,
}

/// A recording's upload: the uploader, the file's job, and what became of it.
#[derive(Debug)]
struct Upload {
    uploader: Uploader,
    job: UploadJob,
    outcome: Arc<UploadOutcome>,
}

/// What became of a recording's upload, as its [`RecordingFeed`] tells it.
#[derive(Debug, Default)]
pub struct UploadOutcome {
    /// What the session's `ended` event says: decided once, when the session's wait for the
    /// upload ends.
    pub(crate) at_end: OnceLock<UploadState>,
    /// Where it is, once stored (maybe after the session's end).
    pub(crate) stored: Arc<OnceLock<Stored>>,
}

impl Recorder {
    /// The recording's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The recording as a follower reads it while it is written: its file and the writer's
    /// progress through it.
    pub fn feed(&self) -> RecordingFeed {
        let feed = RecordingFeed::new(
            self.path.clone(),
            self.state.follow(),
            Some(self.state.cap.clone()),
        );
        match &self.upload {
            Some(upload) => feed.with_upload(upload.outcome.clone()),
            None => feed,
        }
    }

    /// Why the recording failed, if it did.
    pub fn error(&self) -> Option<String> {
        self.state.error()
    }

    /// Completes the recording and waits until its file is complete (all it was given, and
    /// its end, written: a write the kernel accepted), for at most [`CLOSE_WAIT`]; why it
    /// failed or may be incomplete, if so. A session's `ended` event comes after this, so that
    /// the event is the last word on its evidence: a tail that could not be written is named
    /// in it, and whoever reads the event finds the file whole.
    pub async fn close(mut self) -> Option<String> {
        let (done, mut written) = oneshot::channel();
        self.closing = Some(done);
        let state = self.state.clone();
        let upload = self.upload.take();
        drop(self);
        match tokio::time::timeout(CLOSE_WAIT, &mut written).await {
            // The writer closed the file (or is gone, having written all it could).
            Ok(_) => {
                if let Some(upload) = upload {
                    let bytes = state.file_len();
                    let outcome = upload.uploader.upload_and_wait(upload.job, bytes).await;
                    let _ = upload.outcome.at_end.set(outcome);
                }
                state.error()
            }
            Err(_) => {
                if let Some(upload) = upload {
                    // Uploaded once the writer is done with it, never half-written.
                    let _ = upload.outcome.at_end.set(UploadState::Pending);
                    let state = state.clone();
                    tokio::spawn(async move {
                        let _ = written.await;
                        let bytes = Some(state.file_len());
                        upload.uploader.upload_later(upload.job, bytes);
                    });
                }
                Some(state.error().unwrap_or_else(|| {
                    format!(
                        "the recording was still being written {} s after the session ended \
                         (the disk is slow or stuck); it may be incomplete",
                        CLOSE_WAIT.as_secs()
                    )
                }))
            }
        }
    }

    /// Stdout or stderr, as the client got it; whether it may be passed on (see
    /// [`Recorder::record`]).
    pub async fn output(&self, data: &Bytes) -> bool {
        self.record(&[Recorded::Output(data)]).await
    }

    /// Output chunks the client is sent together: they wait for the budget once (see
    /// [`Recorder::record`]); whether they may be passed on.
    pub async fn outputs(&self, chunks: &[Bytes]) -> bool {
        self.outputs_until_cut(chunks, std::future::pending()).await
    }

    /// [`Recorder::outputs`] for output that `cut` says can no longer grow: once it resolves
    /// (the upstream cut the stream off; it may have already), the chunks stop waiting in turn
    /// for the shared budget and take the cut lane.
    pub async fn outputs_until_cut(
        &self,
        chunks: &[Bytes],
        cut: impl std::future::Future<Output = ()>,
    ) -> bool {
        if self.cap_reached(chunks.iter().map(Recorded::Output)) {
            return self.may_pass_on().await;
        }
        let (count, cost) = self.tally(chunks.iter().map(Recorded::Output));
        if let Some(room) = self.wait_for_turn(count, cost, cut).await {
            self.send_reserved(room, count, chunks.iter().map(Recorded::Output));
        }
        self.may_pass_on().await
    }

    /// What the client typed (only with `--record-stdin`).
    pub async fn input(&self, data: &Bytes) {
        self.record(&[Recorded::Input(data)]).await;
    }

    /// The client's terminal size changed.
    pub async fn resize(&self, cols: u16, rows: u16) {
        self.record(&[Recorded::Resize { cols, rows }]).await;
    }

    /// Whether the recording's cap was reached: then `events` are not recorded, only counted
    /// as left out.
    fn cap_reached<'a>(&self, events: impl Iterator<Item = Recorded<'a>>) -> bool {
        let cap = &self.state.cap;
        if !cap.reached() {
            return false;
        }
        let len: usize = events.filter(|e| self.wanted(*e)).map(Recorded::len).sum();
        cap.left_out(len as u64);
        true
    }

    /// Under `--record=required`, waits until the writer is within [`AHEAD_BYTES`] of what
    /// this session queued; `false` once the recording has failed: nothing more may be passed
    /// on. Always `true` at once otherwise (best-effort never waits for the disk).
    async fn may_pass_on(&self) -> bool {
        !self.required || self.state.caught_up(AHEAD_BYTES).await
    }

    /// Resolves once the recording has failed; why.
    pub async fn failed(&self) -> String {
        self.state.failed().await
    }

    /// Events the session handled together (what one read brought, output already queued):
    /// they wait for the budget once. When the writer is behind, every wait is a turn after
    /// all the other sessions' events, so a session passing on a backlog (a burst of output,
    /// or the rest of what an upstream that just died had sent) would otherwise take one turn
    /// per chunk.
    ///
    /// Returns whether the events' bytes may be passed on: under `--record=required` once the
    /// writer is within [`AHEAD_BYTES`] of them, and never after the recording failed.
    pub async fn record<T: Recordable + Sync>(&self, events: &[T]) -> bool {
        self.record_within(events, 0).await
    }

    /// [`Recorder::record`] for a relay that has passed on `unrecorded` output bytes already
    /// (the start of a frame its observer has not finished): they count against the bound.
    pub async fn record_within<T: Recordable + Sync>(&self, events: &[T], unrecorded: u64) -> bool {
        self.record_within_until_cut(events, unrecorded, std::future::pending())
            .await
    }

    /// [`Recorder::record_within`] for events that `cut` says can no longer grow once it
    /// resolves (the relay's upstream hung up): they then stop waiting in turn for the shared
    /// budget and take the cut lane, as [`Recorder::outputs_until_cut`]'s do.
    pub async fn record_within_until_cut<T: Recordable + Sync>(
        &self,
        events: &[T],
        unrecorded: u64,
        cut: impl std::future::Future<Output = ()>,
    ) -> bool {
        if let Some(typing) = &self.typing {
            let typed = |e: Recorded<'_>| matches!(e, Recorded::Input(_));
            if events.iter().filter_map(T::recorded).any(typed) {
                typing.typed();
            }
        }
        if self.cap_reached(events.iter().filter_map(T::recorded)) {
            return self.may_pass_on().await;
        }
        let (count, cost) = self.tally(events.iter().filter_map(T::recorded));
        if let Some(room) = self.wait_for_turn(count, cost, cut).await {
            self.send_reserved(room, count, events.iter().filter_map(T::recorded));
        }
        !self.required
            || self
                .state
                .caught_up(AHEAD_BYTES.saturating_sub(unrecorded))
                .await
    }

    /// How many of `events` are recorded, and what they cost together.
    fn tally<'a>(&self, events: impl Iterator<Item = Recorded<'a>>) -> (usize, usize) {
        events
            .filter(|e| self.wanted(*e))
            .fold((0, 0), |(n, cost), e| (n + 1, cost + e.cost()))
    }

    /// Takes `cost` of the session's express lane if it is that small and the lane is free,
    /// else waits for it (at most all of it) from the shared budget, or from the cut lane once
    /// `cut` resolves; `None` when there is nothing to record or the recording has failed.
    /// Events given room in the cut lane are urgent: the writer writes them first, so that
    /// the lane turns over as fast as cut-off output can be written, not at the pace of
    /// everything queued before it.
    ///
    /// The events themselves are not held across this wait: a generic iterator held there
    /// would make the session's future lose `Send` (a known limit of the compiler with
    /// higher-ranked lifetimes), so callers count first and send after.
    async fn wait_for_turn(
        &self,
        count: usize,
        cost: usize,
        cut: impl std::future::Future<Output = ()>,
    ) -> Option<Room> {
        if count == 0 || self.state.has_failed() {
            return None;
        }
        let room = |permit: Result<OwnedSemaphorePermit, _>, urgent| {
            permit.ok().map(|permit| Room { permit, urgent })
        };
        if cost <= EXPRESS_BYTES {
            if let Ok(express) = self.express.clone().try_acquire_many_owned(cost as u32) {
                return room(Ok(express), false);
            }
        }
        let cost = cost.min(BUDGET_BYTES) as u32;
        let budget = self.budget.clone().acquire_many_owned(cost);
        tokio::pin!(budget);
        tokio::select! {
            // The budget if it is free now: the cut lane is for output that would wait.
            biased;
            budget = &mut budget => room(budget, false),
            () = cut => {
                // Its turn for the budget is kept: whichever comes first, the turn or room in
                // the cut lane (other sessions' cut output may fill that lane too).
                tokio::select! {
                    biased;
                    budget = &mut budget => room(budget, false),
                    lane = self.cut_lane.clone().acquire_many_owned(cost) => room(lane, true),
                }
            }
        }
    }

    /// Queues the `count` wanted ones of `events` for the writer, sharing `room` out.
    fn send_reserved<'a>(
        &self,
        room: Room,
        mut count: usize,
        events: impl Iterator<Item = Recorded<'a>>,
    ) {
        let at = self.state.elapsed();
        let mut budget = Some(room.permit);
        let mut queued = 0;
        for event in events.filter(|e| self.wanted(*e)) {
            queued += event.len() as u64;
            count = count.saturating_sub(1);
            // Each event gives its share back once written; the last takes what is left.
            let share = match count {
                0 => budget.take(),
                _ => budget
                    .as_mut()
                    .and_then(|b| b.split(event.cost().min(b.num_permits()))),
            };
            // Always there: every share fits in what is left, and only the last takes it all.
            let Some(share) = share else { break };
            self.tx.send(Message::Event {
                id: self.id,
                at,
                kind: event.kind(),
                urgent: room.urgent,
                _budget: share,
            });
        }
        if self.required {
            self.state.queued(queued);
        }
    }

    /// Typed input is recorded only with `--record-stdin`.
    fn wanted(&self, event: Recorded<'_>) -> bool {
        self.record_stdin || !matches!(event, Recorded::Input(_))
    }
}

/// Room for a batch of events until the writer has written them.
struct Room {
    permit: OwnedSemaphorePermit,
    /// It is in the cut lane: the writer is to write the events first.
    urgent: bool,
}

/// Something a session hands its recorder in a batch ([`Recorder::record`]).
pub trait Recordable {
    /// What of it is recorded, if anything.
    fn recorded(&self) -> Option<Recorded<'_>>;
}

impl Recordable for Recorded<'_> {
    fn recorded(&self) -> Option<Recorded<'_>> {
        Some(*self)
    }
}

/// What a session hands its [`Recorder`].
#[derive(Debug, Clone, Copy)]
pub enum Recorded<'a> {
    /// Stdout or stderr, as the client got it.
    Output(&'a Bytes),
    /// What the client typed (recorded only with `--record-stdin`).
    Input(&'a Bytes),
    /// The client's terminal size changed.
    Resize { cols: u16, rows: u16 },
}

impl Recorded<'_> {
    /// The session bytes it carries, as the writer counts them once written.
    fn len(self) -> usize {
        match self {
            Recorded::Output(data) | Recorded::Input(data) => data.len(),
            Recorded::Resize { .. } => 0,
        }
    }

    /// What the event takes of the budget until it is written.
    fn cost(self) -> usize {
        self.len().clamp(MIN_EVENT_COST, BUDGET_BYTES)
    }

    fn kind(self) -> EventKind {
        match self {
            Recorded::Output(data) => EventKind::Output(data.clone()),
            Recorded::Input(data) => EventKind::Input(data.clone()),
            Recorded::Resize { cols, rows } => EventKind::Resize(cols, rows),
        }
    }
}

impl Drop for Recorder {
    /// Closes the recording without waiting for it ([`Recorder::close`] waits).
    fn drop(&mut self) {
        self.tx.send(Message::Close {
            id: self.id,
            done: self.closing.take(),
        });
    }
}

/// What a test tells a [`Recorder::held`] recorder's writer did.
#[cfg(test)]
pub(crate) struct HeldWriter(Arc<RecordingState>);

#[cfg(test)]
impl HeldWriter {
    /// The writer wrote `len` more bytes.
    pub(crate) fn written(&self, len: u64) {
        self.0.written(len);
    }

    /// A write failed.
    pub(crate) fn fail(&self, error: &str) {
        self.0.fail(error.to_owned());
    }
}

#[cfg(test)]
impl Recorder {
    /// A recorder whose writer never writes by itself: the test says what it wrote, and when
    /// a write failed.
    pub(crate) fn held(required: bool) -> (Recorder, HeldWriter) {
        let (rec, inbox) = Recorder::unwritten(required);
        // The messages (and their budget) stay queued for as long as the test runs.
        std::mem::forget(inbox);
        let state = rec.state.clone();
        (rec, HeldWriter(state))
    }

    /// A recorder with budget and lanes of its own, and what it sends the writer.
    fn unwritten(required: bool) -> (Recorder, queue::Inbox) {
        let (tx, inbox) = queue::channel();
        let rec = Recorder {
            id: 1,
            tx,
            budget: Arc::new(Semaphore::new(BUDGET_BYTES)),
            cut_lane: Arc::new(Semaphore::new(CUT_BYTES)),
            express: Arc::new(Semaphore::new(EXPRESS_BYTES)),
            state: Arc::new(RecordingState::new()),
            record_stdin: false,
            required,
            path: "held".into(),
            closing: None,
            upload: None,
            typing: None,
        };
        (rec, inbox)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::recording::asciicast::event_text;

    fn counters() -> RecordingCounters {
        RecordingCounters::unregistered()
    }

    /// Where the tests' recordings go: `--record-dir` itself.
    const HERE: RecordingPlace<'static> = RecordingPlace {
        cluster: "default",
        folder: None,
        namespace: "default",
    };

    /// What `c` counts for [`HERE`]'s cluster.
    fn count(c: &prometheus::IntCounterVec) -> u64 {
        c.with_label_values(&["default"]).get()
    }

    /// Recordings under `required` into a fresh directory.
    fn required_recordings(
        record_stdin: bool,
    ) -> (tempfile::TempDir, RecordingCounters, Recordings) {
        recordings_with(RecordPolicy::Required, record_stdin)
    }

    /// Recordings under `policy` into a fresh directory.
    fn recordings_with(
        policy: RecordPolicy,
        record_stdin: bool,
    ) -> (tempfile::TempDir, RecordingCounters, Recordings) {
        let dir = tempfile::tempdir().unwrap();
        let c = counters();
        let recordings = Recordings::start(
            RecordingConfig {
                dir: dir.path().to_owned(),
                policy,
                record_stdin,
                min_free: 0,
                max_bytes: None,
            },
            c.clone(),
        )
        .unwrap();
        (dir, c, recordings)
    }

    #[tokio::test]
    async fn a_recording_stops_at_its_cap_with_a_marker_and_counts_what_it_left_out() {
        for policy in [RecordPolicy::Required, RecordPolicy::BestEffort] {
            let dir = tempfile::tempdir().unwrap();
            let config = RecordingConfig {
                dir: dir.path().to_owned(),
                policy,
                record_stdin: false,
                min_free: 0,
                max_bytes: Some(4096),
            };
            let recordings = Recordings::start(config, counters()).unwrap();
            let rec = recordings
                .open(HERE, "abcd-2", &["cat".into()], "default/web".into(), false)
                .await
                .unwrap();
            let feed = rec.feed();
            let chunk = Bytes::from(vec![b'x'; 100]);
            // 1,000 chunks: 100,000 bytes, far beyond the cap; none waits for long.
            for _ in 0..1000 {
                assert!(rec.output(&chunk).await, "{policy:?}");
            }
            assert!(rec.close().await.is_none(), "{policy:?}");
            let text = std::fs::read_to_string(feed.path()).unwrap();
            let lines: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            let (last, events) = lines[1..].split_last().unwrap();
            assert_eq!(last[1], "m", "{last}");
            let said = last[2].as_str().unwrap();
            assert!(said.contains("--record-max-bytes"), "{said}");
            // The event that reached the cap is the last one recorded.
            let before_marker = text.len() - text.lines().last().unwrap().len() - 1;
            assert!(before_marker >= 4096, "{before_marker}");
            assert!(before_marker < 4096 + 200, "{before_marker}");
            let recorded: usize = events.iter().map(|e| e[2].as_str().unwrap().len()).sum();
            let truncation = feed.truncation().expect("cut short");
            assert_eq!(truncation.max_bytes, 4096);
            assert_eq!(truncation.unrecorded_bytes, 100_000 - recorded as u64);
        }
    }

    #[tokio::test]
    async fn a_recording_within_its_cap_is_not_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let config = RecordingConfig {
            dir: dir.path().to_owned(),
            policy: RecordPolicy::Required,
            record_stdin: false,
            min_free: 0,
            max_bytes: Some(1 << 20),
        };
        let recordings = Recordings::start(config, counters()).unwrap();
        let rec = recordings
            .open(HERE, "abcd-3", &["cat".into()], "default/web".into(), false)
            .await
            .unwrap();
        let feed = rec.feed();
        assert!(rec.output(&Bytes::from_static(b"hello\r\n")).await);
        assert!(rec.close().await.is_none());
        assert_eq!(feed.truncation(), None);
        let text = std::fs::read_to_string(feed.path()).unwrap();
        assert!(!text.contains("\"m\""), "{text}");
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
            .open(
                HERE,
                "abcd-1",
                &["sh".into(), "-i".into()],
                "default/web".into(),
                true,
            )
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
        assert_eq!(count(&c.recorded_bytes), 7);
    }

    #[tokio::test]
    async fn interleaved_sessions_each_get_exactly_their_own_output() {
        // The writer gathers a recording's lines before writing them; two sessions taking
        // turns, with more output than one write gathers, must still each get their own.
        let (_dir, c, recordings) = required_recordings(false);
        let a = recordings
            .open(HERE, "a-1", &["sh".into()], "default/a".into(), false)
            .await
            .unwrap();
        let b = recordings
            .open(HERE, "b-1", &["sh".into()], "default/b".into(), false)
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
            let shown = event_text(lines[1..].iter().map(String::as_str));
            assert_eq!(shown, sent[k], "{}", path.display());
        }
        // Counted just after each write: give the writer a moment to count the last one.
        let total = (sent[0].len() + sent[1].len()) as u64;
        for _ in 0..200 {
            if count(&c.recorded_bytes) == total {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(count(&c.recorded_bytes), total);
    }

    /// Waits until the writer has given the whole budget back.
    async fn budget_returns(recordings: &Recordings) {
        for _ in 0..500 {
            if recordings.budget.available_permits() == BUDGET_BYTES {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!(
            "the budget never came back: {} of {BUDGET_BYTES}",
            recordings.budget.available_permits()
        );
    }

    #[tokio::test]
    async fn a_batch_waits_for_its_whole_cost_at_once() {
        let (_dir, _c, recordings) = required_recordings(false);
        let rec = recordings
            .open(HERE, "batch-1", &["cat".into()], String::new(), false)
            .await
            .unwrap();
        // Room in the shared budget for one of the chunks, not for all three; together they
        // are too big for the session's express lane.
        let chunk = Bytes::from(vec![b'x'; EXPRESS_BYTES / 2]);
        let held = recordings
            .budget
            .clone()
            .acquire_many_owned((BUDGET_BYTES - chunk.len()) as u32)
            .await
            .unwrap();
        let path = rec.path().to_owned();
        // Under `required` the header is there from the start.
        let header = std::fs::metadata(&path).unwrap().len();
        assert!(header > 0);
        let chunks = [chunk.clone(), chunk.clone(), chunk.clone()];
        let send = tokio::spawn(async move {
            rec.outputs(&chunks).await;
            rec
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        // Nothing of the batch went ahead alone: one chunk at a time, the first would have
        // been written by now.
        assert!(!send.is_finished());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), header);
        drop(held);
        drop(send.await.unwrap());
        let lines = wait_for(&path, 4).await;
        let shown = event_text(lines[1..].iter().map(String::as_str));
        assert_eq!(shown.len(), 3 * chunk.len());
        budget_returns(&recordings).await;
    }

    /// Typing on a terminal session, recorded or not (`--record-stdin`), tells the writer to
    /// rest; output, and input on a session without a terminal (a `kubectl cp`), do not.
    #[tokio::test]
    async fn typing_on_a_terminal_session_tells_the_writer() {
        let (_dir, _c, recordings) = required_recordings(false);
        let typed = || {
            recordings.typing.lately_at(
                std::time::Instant::now(),
                super::super::typing::TYPING_WINDOW,
            )
        };
        let piped = recordings
            .open(HERE, "cp-1", &["tar".into()], String::new(), false)
            .await
            .unwrap();
        piped.input(&Bytes::from_static(b"tar stream")).await;
        let tty = recordings
            .open(HERE, "sh-1", &["sh".into()], String::new(), true)
            .await
            .unwrap();
        tty.output(&Bytes::from_static(b"$ ")).await;
        tty.resize(100, 30).await;
        assert!(!typed());
        tty.input(&Bytes::from_static(b"l")).await;
        assert!(typed());
    }

    #[tokio::test]
    async fn a_small_event_takes_the_express_lane_past_a_spent_budget() {
        let (_dir, _c, recordings) = required_recordings(false);
        let rec = recordings
            .open(HERE, "echo-1", &["sh".into()], String::new(), false)
            .await
            .unwrap();
        // Other sessions' bulk output holds the whole shared budget.
        let held = recordings
            .budget
            .clone()
            .acquire_many_owned(BUDGET_BYTES as u32)
            .await
            .unwrap();
        let echo = std::time::Duration::from_secs(5);
        tokio::time::timeout(echo, rec.output(&Bytes::from_static(b"x")))
            .await
            .expect("a keystroke's echo does not queue behind bulk output");
        let path = rec.path().to_owned();
        let lines = wait_for(&path, 2).await;
        assert!(lines[1].ends_with(r#""o", "x"]"#), "{}", lines[1]);
        // Written, the lane is free again.
        for _ in 0..500 {
            if rec.express.available_permits() == EXPRESS_BYTES {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(rec.express.available_permits(), EXPRESS_BYTES);
        // More than the lane holds takes its turn for the shared budget.
        let big = Bytes::from(vec![b'y'; EXPRESS_BYTES + 1]);
        let waits = tokio::time::timeout(std::time::Duration::from_millis(50), rec.output(&big));
        assert!(
            waits.await.is_err(),
            "a bulk event must wait for the budget"
        );
        drop(held);
        tokio::time::timeout(echo, rec.output(&big))
            .await
            .expect("with the budget back it goes");
    }

    #[tokio::test]
    async fn output_its_upstream_cut_off_takes_the_cut_lane_past_a_spent_budget() {
        let (_dir, _c, recordings) = recordings_with(RecordPolicy::BestEffort, false);
        let rec = recordings
            .open(HERE, "cut-1", &["tar".into()], String::new(), false)
            .await
            .unwrap();
        // Other sessions' bulk output holds the whole shared budget.
        let held = recordings.spend_budget();
        let rest = [
            Bytes::from(vec![b'r'; 200 * 1024]),
            Bytes::from_static(b"end"),
        ];
        // Still coming: it waits its turn.
        let (cut_tx, cut_rx) = tokio::sync::oneshot::channel::<()>();
        let soon = std::time::Duration::from_secs(5);
        {
            let waiting = rec.outputs_until_cut(&rest, async {
                let _ = cut_rx.await;
            });
            tokio::pin!(waiting);
            let quick = std::time::Duration::from_millis(50);
            assert!(tokio::time::timeout(quick, &mut waiting).await.is_err());
            // Cut off while it waits: it leaves the queue for the cut lane.
            cut_tx.send(()).unwrap();
            assert!(tokio::time::timeout(soon, &mut waiting).await.unwrap());
        }
        // It was taken while the budget stayed spent: only the cut lane could take it. (The
        // lane's permits themselves may already be back: the writer thread races this check.)
        assert_eq!(recordings.budget.available_permits(), 0);
        // Already cut off: it does not queue at all.
        let more = [Bytes::from(vec![b's'; 100 * 1024])];
        let ready = rec.outputs_until_cut(&more, std::future::ready(()));
        assert!(tokio::time::timeout(soon, ready).await.unwrap());
        // Everything is written and the lane given back, though the budget never was.
        let path = rec.path().to_owned();
        drop(rec);
        for _ in 0..500 {
            if recordings.cut_lane.available_permits() == CUT_BYTES {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(recordings.cut_lane.available_permits(), CUT_BYTES);
        let lines = wait_for(&path, 4).await;
        let shown = event_text(lines[1..].iter().map(String::as_str));
        assert_eq!(shown.len(), 200 * 1024 + 3 + 100 * 1024);
        drop(held);
    }

    #[tokio::test]
    async fn only_output_in_the_cut_lane_is_sent_urgent() {
        let (rec, mut inbox) = Recorder::unwritten(false);
        let mut urgent = |what: &str| match inbox.try_next() {
            Some(Message::Event { urgent, .. }) => urgent,
            _ => panic!("{what}: no event sent"),
        };
        let (small, big) = (Bytes::from_static(b"x"), Bytes::from(vec![b'y'; 64 * 1024]));
        let cut = std::future::ready;
        // Cut off, but room in its express lane or in the budget: in turn, as it came.
        rec.outputs_until_cut(std::slice::from_ref(&small), cut(()))
            .await;
        assert!(!urgent("express lane"));
        rec.outputs_until_cut(std::slice::from_ref(&big), cut(()))
            .await;
        assert!(!urgent("budget"));
        // With the budget spent, cut-off output too big for the express lane takes the cut
        // lane: every event of the batch is urgent.
        let held = rec
            .budget
            .clone()
            .try_acquire_many_owned(rec.budget.available_permits() as u32)
            .unwrap();
        rec.outputs_until_cut(&[small.clone(), big.clone()], cut(()))
            .await;
        assert!(urgent("cut lane, first"));
        assert!(urgent("cut lane, second"));
        // Not cut off, it waits for the budget; given back, it goes in turn.
        drop(held);
        rec.outputs(&[big]).await;
        assert!(!urgent("budget again"));
    }

    #[tokio::test]
    async fn a_batch_larger_than_the_budget_still_passes() {
        let (_dir, c, recordings) = required_recordings(false);
        let rec = recordings
            .open(HERE, "big-1", &["cat".into()], String::new(), false)
            .await
            .unwrap();
        let chunk = Bytes::from(vec![b'x'; BUDGET_BYTES * 2 / 3]);
        rec.outputs(&[chunk.clone(), chunk.clone()]).await;
        drop(rec);
        budget_returns(&recordings).await;
        assert_eq!(count(&c.recorded_bytes), 2 * chunk.len() as u64);
    }

    #[tokio::test]
    async fn typed_input_in_a_batch_is_left_out_unless_asked_for() {
        for record_stdin in [false, true] {
            let (_dir, _c, recordings) = required_recordings(record_stdin);
            let rec = recordings
                .open(HERE, "mix-1", &["sh".into()], String::new(), false)
                .await
                .unwrap();
            let (out, typed) = (Bytes::from_static(b"$ "), Bytes::from_static(b"ls\r"));
            // The input last: the event before it must still give its share back.
            rec.record(&[
                Recorded::Resize { cols: 90, rows: 20 },
                Recorded::Output(&out),
                Recorded::Input(&typed),
            ])
            .await;
            let path = rec.path().to_owned();
            drop(rec);
            let lines = wait_for(&path, 2).await;
            let kinds: Vec<String> = lines[1..]
                .iter()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()[1].to_string())
                .collect();
            let expected: &[&str] = if record_stdin {
                &["\"o\"", "\"i\""]
            } else {
                &["\"o\""]
            };
            assert_eq!(kinds, expected, "record_stdin {record_stdin}");
            budget_returns(&recordings).await;
        }
    }

    #[tokio::test]
    async fn a_recording_that_cannot_be_created_is_an_error() {
        let (dir, c, recordings) = required_recordings(true);
        std::fs::remove_dir(dir.path()).unwrap();
        let err = recordings
            .open(HERE, "x-1", &[], String::new(), false)
            .await
            .unwrap_err();
        let kind = err.io_error().map(std::io::Error::kind);
        assert_eq!(kind, Some(std::io::ErrorKind::NotFound), "{err}");
        assert_eq!(count(&c.failures), 1);
        assert!(Recordings::start(
            RecordingConfig {
                dir: dir.path().join("nope"),
                policy: RecordPolicy::BestEffort,
                record_stdin: false,
                min_free: 0,
                max_bytes: None,
            },
            counters(),
        )
        .is_err());
    }

    #[tokio::test]
    async fn a_recording_below_the_free_space_reserve_does_not_start() {
        for policy in [RecordPolicy::Required, RecordPolicy::BestEffort] {
            let dir = tempfile::tempdir().unwrap();
            let c = counters();
            let config = RecordingConfig {
                dir: dir.path().to_owned(),
                policy,
                record_stdin: false,
                min_free: u64::MAX,
                max_bytes: None,
            };
            let recordings = Recordings::start(config, c.clone()).unwrap();
            let err = recordings
                .open(HERE, "low-1", &[], String::new(), false)
                .await
                .unwrap_err();
            assert!(matches!(err, RecordingError::LowSpace { .. }), "{err}");
            assert!(err.to_string().contains("--record-min-free"), "{err}");
            assert_eq!(count(&c.failures), 1);
            // Nothing was created.
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        }
    }

    #[tokio::test]
    async fn a_required_recording_holds_its_header_before_the_session_starts() {
        let (_dir, _c, recordings) = required_recordings(false);
        let rec = recordings
            .open(HERE, "early-1", &["sh".into()], String::new(), false)
            .await
            .unwrap();
        // Written by the start, not by the writer: there before any event.
        let text = std::fs::read_to_string(rec.path()).unwrap();
        let header: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(header["version"], 2);
        assert!(text.ends_with('\n'), "{text:?}");
    }

    /// A recorder whose writer is the test: nothing is written until it says so.
    fn held_recorder(required: bool) -> (Recorder, Arc<RecordingState>) {
        let (rec, state) = Recorder::held(required);
        (rec, state.0)
    }

    #[tokio::test]
    async fn under_required_output_goes_on_only_within_the_bound_of_what_is_written() {
        let quick = std::time::Duration::from_millis(50);
        let (rec, state) = held_recorder(true);
        let chunk = Bytes::from(vec![b'x'; AHEAD_BYTES as usize / 2]);
        // Up to the bound, nothing waits for the writer.
        assert!(rec.output(&chunk).await);
        assert!(rec.output(&chunk).await);
        // One byte more than the bound ahead of what is written: it waits.
        let one = Bytes::from_static(b"y");
        assert!(tokio::time::timeout(quick, rec.output(&one)).await.is_err());
        // The writer writes one byte: within the bound again.
        state.written(1);
        assert!(tokio::time::timeout(quick, rec.output(&Bytes::new()))
            .await
            .unwrap());
        // A failed write: what waits is not passed on, nor anything later.
        let waiting = rec.output(&chunk);
        tokio::pin!(waiting);
        assert!(tokio::time::timeout(quick, &mut waiting).await.is_err());
        state.fail("No space left on device".into());
        assert!(!tokio::time::timeout(quick, waiting).await.unwrap());
        assert!(!rec.output(&one).await);

        // best-effort never waits for the disk.
        let (rec, _state) = held_recorder(false);
        for _ in 0..8 {
            assert!(tokio::time::timeout(quick, rec.output(&chunk))
                .await
                .unwrap());
        }
    }

    /// A recorder (`--record=required` or not) whose file is `/dev/full`, which refuses every
    /// write as a full disk does, with the writer thread running; and its counters.
    fn full_disk_recorder(required: bool) -> (RecordingCounters, Recorder) {
        let c = counters();
        let (tx, inbox) = queue::channel();
        std::thread::spawn(move || writer::run(inbox, Rests::unused()));
        let state = Arc::new(RecordingState::new());
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        tx.send(Message::Open {
            id: 9,
            file: full,
            header: writer::test_header(""),
            counted: c.of("default"),
            written: None,
            state: state.clone(),
        });
        let rec = Recorder {
            id: 9,
            tx,
            budget: Arc::new(Semaphore::new(BUDGET_BYTES)),
            cut_lane: Arc::new(Semaphore::new(CUT_BYTES)),
            express: Arc::new(Semaphore::new(EXPRESS_BYTES)),
            state,
            record_stdin: false,
            required,
            path: "/dev/full".into(),
            closing: None,
            upload: None,
            typing: None,
        };
        (c, rec)
    }

    /// A disk that refuses writes (`/dev/full` behaves as a full disk) fails the recording,
    /// and the session hears of it.
    #[tokio::test]
    async fn a_full_disk_fails_the_recording_and_tells_the_session() {
        let (c, rec) = full_disk_recorder(true);
        rec.output(&Bytes::from_static(b"lost")).await;
        let why = tokio::time::timeout(std::time::Duration::from_secs(5), rec.failed())
            .await
            .expect("the session hears of the failure");
        assert!(why.contains("No space left"), "{why}");
        assert_eq!(count(&c.failures), 1);
        // Later events are not even queued, and must not be passed on.
        assert!(!rec.output(&Bytes::from_static(b"more")).await);
        assert!(rec.error().is_some());
    }

    /// Closing waits for the writer: once `close` returns, the file holds everything the
    /// session recorded and its end, even with megabytes of output still queued when the
    /// session ended (the session's `ended` event is written after this).
    #[tokio::test]
    async fn close_returns_once_the_file_is_complete() {
        let (dir, _c, recordings) = recordings_with(RecordPolicy::BestEffort, false);
        let rec = recordings
            .open(HERE, "s1", &[], "close".into(), false)
            .await
            .unwrap();
        let path = rec.path().to_owned();
        let chunk = Bytes::from("y".repeat(64 * 1024));
        for _ in 0..64 {
            rec.output(&chunk).await;
        }
        rec.output(&Bytes::from_static(b"the last line\n")).await;
        assert_eq!(rec.close().await, None);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines.last().unwrap().contains("the last line"),
            "{:?}",
            lines.last()
        );
        let recorded = event_text(lines[1..].iter().copied()).len();
        assert_eq!(recorded, 64 * 64 * 1024 + "the last line\n".len());
        drop(dir);
    }

    /// A tail the writer could not write is named by `close` (best-effort sessions hear of it
    /// no other way: they never wait for the disk), so their `ended` event can say so.
    #[tokio::test]
    async fn close_names_a_tail_that_could_not_be_written() {
        let (c, rec) = full_disk_recorder(false);
        let why = rec.close().await.expect("the failed tail is named");
        assert!(why.contains("No space left"), "{why}");
        assert_eq!(count(&c.failures), 1);
    }

    mod stress {
        //! Many recordings at once through the recorder, the writer's queue and the writer, with a
        //! budget and a cut lane scarce enough that sessions wait for them and cut-off output
        //! jumps ahead of ordinary output.

        use std::time::Duration;

        use super::*;
        use crate::audit::recording::asciicast::event_text;

        /// Room left in the budget and in the cut lane while the test runs.
        const BUDGET_LEFT: usize = 1024 * 1024;
        const LANE_LEFT: usize = 512 * 1024;

        /// A tiny deterministic generator (xorshift), one per session.
        struct Rng(u64);

        impl Rng {
            fn below(&mut self, n: u64) -> u64 {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                self.0 % n
            }
        }

        /// What session `n` sends: batches of numbered chunks, some tiny (the express lane), some
        /// large; from its middle on every other session is cut off (its batches may take the cut
        /// lane). The text it sent, in order.
        async fn session(rec: Recorder, n: u64, batches: u64) -> (PathBuf, String) {
            let mut rng = Rng(0x9E37_79B9 ^ ((n + 1) * 7919));
            let mut sent = String::new();
            for b in 0..batches {
                let chunks: Vec<Bytes> = (0..1 + rng.below(4))
                    .map(|c| {
                        let pad = match rng.below(3) {
                            0 => 0,
                            1 => rng.below(4 * 1024),
                            _ => rng.below(96 * 1024),
                        };
                        let text = format!("<{n}.{b}.{c}{}>", "x".repeat(pad as usize));
                        sent.push_str(&text);
                        Bytes::from(text)
                    })
                    .collect();
                let cut = n % 2 == 1 && b >= batches / 2;
                if cut {
                    rec.outputs_until_cut(&chunks, std::future::ready(())).await;
                } else {
                    rec.outputs(&chunks).await;
                }
                if rng.below(4) == 0 {
                    tokio::task::yield_now().await;
                }
            }
            (rec.path().to_owned(), sent)
        }

        /// Waits until `path` records `len` bytes of output; its text.
        async fn written(path: &Path, len: usize) -> String {
            let mut shown = String::new();
            for _ in 0..2000 {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                shown = event_text(text.lines().skip(1));
                if shown.len() >= len {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            shown
        }

        /// Every event of every recording is written, each recording's in the order it was sent,
        /// and every byte of budget and lane comes back; the sessions never wait for ever on a
        /// writer that idles with events queued (the test would time out).
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn many_recordings_with_cut_off_output_are_written_whole_and_in_order() {
            let (_dir, _c, recordings) = recordings_with(RecordPolicy::BestEffort, false);
            let held_budget = recordings
                .budget
                .clone()
                .try_acquire_many_owned((BUDGET_BYTES - BUDGET_LEFT) as u32)
                .unwrap();
            let held_lane = recordings
                .cut_lane
                .clone()
                .try_acquire_many_owned((CUT_BYTES - LANE_LEFT) as u32)
                .unwrap();
            let mut tasks = Vec::new();
            for n in 0..48u64 {
                let rec = recordings
                    .open(HERE, &format!("stress-{n}"), &[], String::new(), false)
                    .await
                    .unwrap();
                tasks.push(tokio::spawn(session(rec, n, 40)));
            }
            let sent = tokio::time::timeout(Duration::from_secs(60), async {
                let mut sent = Vec::new();
                for task in tasks {
                    sent.push(task.await.unwrap());
                }
                sent
            })
            .await
            .expect("the sessions never got room: the writer stalled with events queued");
            for (path, text) in &sent {
                let shown = written(path, text.len()).await;
                assert!(
                    shown == *text,
                    "{} differs from what was sent",
                    path.display()
                );
            }
            drop((held_budget, held_lane));
            budget_returns(&recordings).await;
            assert_eq!(recordings.cut_lane.available_permits(), CUT_BYTES);
        }
    }
}
