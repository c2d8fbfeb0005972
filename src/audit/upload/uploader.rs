//! The uploader: closed spool files to the store, a few at a time, each retried with backoff
//! until it is stored (a recording is evidence: it is never given up), then removed from the
//! spool. A session waits for its own recording's upload for a short bound so that its `ended`
//! event can name the object; one that is stored later gets an `uploaded` event of its own.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};
use serde::Serialize;
use tokio::sync::{oneshot, Semaphore};
use tracing::{info, warn};

use super::spool::SpoolUsage;
use super::store::{FailureReason, Store, StoreError};
use super::target::UploadTarget;
use crate::audit::log_file::AuditLog;
use crate::timestamp::rfc3339_millis;

/// Uploads in flight at once. Most recordings are small, so an upload's time is mostly its
/// round trips: 2 at a time stored about 60 a second in the soak while sessions ended at 150
/// a second, and the spool filled. 8 keeps a store busy and still does not open a connection
/// per ended session in a burst; each streams its file (no body is held in memory).
const CONCURRENT_UPLOADS: usize = 8;
/// The first retry's delay, doubled per failure up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between two attempts at one file.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// The uploads' metrics.
#[derive(Debug, Clone)]
pub struct UploadCounters {
    /// Objects stored, by `kind` (`recording`).
    pub uploads: IntCounterVec,
    /// Failed attempts, by `reason` ([`FailureReason::label`]).
    pub failures: IntCounterVec,
    /// Bytes stored.
    pub bytes: IntCounter,
    /// Spool files waiting for their upload (or in it), by `kind`.
    pub pending_files: IntGaugeVec,
    /// Their bytes, by `kind`.
    pub pending_bytes: IntGaugeVec,
    /// How long the oldest of them has waited, in seconds (0: none waits), by `kind`.
    pub oldest_pending_seconds: IntGaugeVec,
}

impl UploadCounters {
    /// Counters registered nowhere.
    pub fn unregistered() -> UploadCounters {
        let vec = |name: &str, label: &str| {
            IntCounterVec::new(Opts::new(name, name), &[label]).expect("valid counter")
        };
        let gauge =
            |name: &str| IntGaugeVec::new(Opts::new(name, name), &["kind"]).expect("valid gauge");
        UploadCounters {
            uploads: vec("uploads", "kind"),
            failures: vec("failures", "reason"),
            bytes: IntCounter::new("bytes", "bytes").expect("valid counter"),
            pending_files: gauge("pending_files"),
            pending_bytes: gauge("pending_bytes"),
            oldest_pending_seconds: gauge("oldest_pending_seconds"),
        }
    }
}

/// A spool file to store.
#[derive(Debug, Clone)]
pub struct UploadJob {
    /// The spool file (removed once stored).
    pub path: PathBuf,
    /// Its object key.
    pub key: String,
    /// The session it records.
    pub session_id: String,
    /// Found in the spool at start: its session ended (or its proxy died) before a restart.
    pub after_restart: bool,
    /// Told where it is once stored (readers of the recording find it there once it has
    /// left the spool).
    pub stored: Option<Arc<OnceLock<Stored>>>,
}

/// What an uploader's files are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadKind {
    /// A session's recording: its `ended` or `uploaded` event names the object.
    Recording,
    /// A batch of the audit log's lines (`--audit-upload`): counted, not audited.
    Audit,
}

impl UploadKind {
    /// Every kind.
    pub const ALL: [UploadKind; 2] = [UploadKind::Recording, UploadKind::Audit];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            UploadKind::Recording => "recording",
            UploadKind::Audit => "audit",
        }
    }
}

/// A recording in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// `s3://BUCKET/KEY`.
    pub object: String,
    /// Its key in the bucket.
    pub key: String,
    /// Its length.
    pub bytes: u64,
}

/// What a session's `ended` event can say of its recording's upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UploadState {
    /// Stored before the session's wait ran out.
    Stored(Stored),
    /// Queued and retried; an `uploaded` event will say when it is stored.
    Pending,
}

/// The `uploaded` audit event: a recording stored after its session's `ended` event was
/// written (the store was slow or down), or found in the spool at start.
#[derive(Debug, Serialize)]
struct UploadedEvent<'a> {
    time: String,
    stage: &'static str,
    session_id: &'a str,
    recording: String,
    recording_object: &'a str,
    bytes: u64,
    attempts: u32,
    pending_ms: u64,
    after_restart: bool,
}

/// Oldest-first bookkeeping of what waits, for the pending gauges.
#[derive(Debug, Default)]
struct Pending {
    next: u64,
    /// By queue order: when each began to wait, and its bytes.
    waiting: BTreeMap<u64, (Instant, u64)>,
}

/// Hands spool files to the store; cheap to clone.
#[derive(Debug, Clone)]
pub struct Uploader {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Store,
    /// Where `uploaded` events go (set once the audit log is open: it may itself upload
    /// through an uploader).
    audit: OnceLock<Arc<AuditLog>>,
    runtime: tokio::runtime::Handle,
    counters: UploadCounters,
    slots: Semaphore,
    pending: Mutex<Pending>,
    /// How long a session waits for its recording's upload before its `ended` event.
    wait: Duration,
    /// The spool's size: stored files are taken off it.
    spool: Arc<SpoolUsage>,
    /// What it uploads; its gauges are this kind's.
    kind: UploadKind,
    pending_files: IntGauge,
    pending_bytes: IntGauge,
    oldest_pending_seconds: IntGauge,
}

impl Uploader {
    /// An uploader to `store`; a session waits up to `wait` for its own recording. Called
    /// within the proxy's tokio runtime, where its uploads run.
    pub fn start(
        store: Store,
        kind: UploadKind,
        counters: UploadCounters,
        wait: Duration,
    ) -> Uploader {
        let gauge = |g: &IntGaugeVec| g.with_label_values(&[kind.label()]);
        let inner = Arc::new(Inner {
            kind,
            pending_files: gauge(&counters.pending_files),
            pending_bytes: gauge(&counters.pending_bytes),
            oldest_pending_seconds: gauge(&counters.oldest_pending_seconds),
            store,
            audit: OnceLock::new(),
            runtime: tokio::runtime::Handle::current(),
            counters,
            slots: Semaphore::new(CONCURRENT_UPLOADS),
            pending: Mutex::new(Pending::default()),
            wait,
            spool: Arc::default(),
        });
        tokio::spawn(age_ticker(Arc::downgrade(&inner)));
        Uploader { inner }
    }

    /// Where objects go.
    pub fn target(&self) -> &UploadTarget {
        self.inner.store.target()
    }

    /// Writes `uploaded` events to `audit` from now on.
    pub fn audit_to(&self, audit: Arc<AuditLog>) {
        let _ = self.inner.audit.set(audit);
    }

    /// The spool's size (`--record-spool-max`).
    pub fn spool(&self) -> &Arc<SpoolUsage> {
        &self.inner.spool
    }

    /// The store (to read back what was stored).
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Queues `job`, waits at most the session's bound for it to be stored, and says what
    /// the session's `ended` event can say. The upload goes on after the wait, whatever it
    /// was (the caller may be dropped: the upload is not).
    /// `bytes` is the file's size, as its writer counted it.
    pub async fn upload_and_wait(&self, job: UploadJob, bytes: u64) -> UploadState {
        let (tx, mut rx) = oneshot::channel();
        self.queue(job, Some(tx), Some(bytes));
        match tokio::time::timeout(self.inner.wait, &mut rx).await {
            Ok(Ok(stored)) => UploadState::Stored(stored),
            _ => {
                // Closed before a last look: a result sent before the close is ours; after
                // it, the uploader's send fails and it writes an `uploaded` event instead.
                rx.close();
                match rx.try_recv() {
                    Ok(stored) => UploadState::Stored(stored),
                    Err(_) => UploadState::Pending,
                }
            }
        }
    }

    /// Files queued and not yet stored (the spool's cap counts them).
    pub fn pending_files(&self) -> u64 {
        let p = self.inner.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.waiting.len() as u64
    }

    /// Queues `job` without waiting (the restart scan): an `uploaded` event says when it is
    /// stored. Without the file's size in `bytes`, it is read from the file: a blocking
    /// `stat`, for callers off the runtime (the restart scan, the audit log's writer thread).
    pub fn upload_later(&self, job: UploadJob, bytes: Option<u64>) {
        self.queue(job, None, bytes);
    }

    fn queue(&self, job: UploadJob, waiter: Option<oneshot::Sender<Stored>>, bytes: Option<u64>) {
        let bytes =
            bytes.unwrap_or_else(|| std::fs::metadata(&job.path).map(|m| m.len()).unwrap_or(0));
        if job.after_restart && self.inner.kind == UploadKind::Recording {
            // Written by an earlier run: not counted by this one's writer.
            self.inner.spool.add(bytes);
        }
        let since = Instant::now();
        let id = {
            let mut p = self.inner.pending.lock().unwrap_or_else(|e| e.into_inner());
            let id = p.next;
            p.next += 1;
            p.waiting.insert(id, (since, bytes));
            id
        };
        self.inner.pending_files.inc();
        self.inner.pending_bytes.add(bytes as i64);
        // Also called from the audit log's writer thread: spawned on the proxy's runtime.
        self.inner
            .runtime
            .spawn(self.inner.clone().run(id, job, waiter, since));
    }
}

impl Inner {
    /// One file's upload, to its end: attempts with backoff until it is stored.
    async fn run(
        self: Arc<Self>,
        id: u64,
        job: UploadJob,
        waiter: Option<oneshot::Sender<Stored>>,
        since: Instant,
    ) {
        let mut attempts = 0u32;
        let bytes = loop {
            attempts += 1;
            let slot = self.slots.acquire().await.expect("never closed");
            // Boxed: the store client's future is about 9 KiB, and unboxed it would be part
            // of every waiting upload's task, not only of the 8 that run.
            match Box::pin(self.store.put_file(&job.key, &job.path)).await {
                Ok(bytes) => break bytes,
                Err(e) => {
                    // A store that fails fails every file: this one keeps its slot while it
                    // waits, so that an outage costs 8 attempts per backoff rather than one
                    // per waiting file (the soak counted 13,000 failures for four 6-second
                    // outages), and files keep their order. Only a file of its own that
                    // cannot be read lets the others go on meanwhile.
                    if e.reason == FailureReason::File {
                        drop(slot);
                    }
                    self.failed(&job, attempts, &e).await;
                }
            }
        };
        let stored = Stored {
            object: self.store.target().object_url(&job.key),
            key: job.key.clone(),
            bytes,
        };
        self.done(id, &job, attempts, since, stored, waiter);
    }

    /// Counts a failed attempt, logs it and waits before the next one.
    async fn failed(&self, job: &UploadJob, attempts: u32, e: &StoreError) {
        self.counters
            .failures
            .with_label_values(&[e.reason.label()])
            .inc();
        let delay = backoff(attempts);
        let configuration = matches!(e.reason, FailureReason::Status4xx | FailureReason::Request);
        warn!(
            session_id = %job.session_id,
            key = %job.key,
            attempts,
            retry_in_s = delay.as_secs_f64(),
            configuration_problem = configuration,
            error = %e,
            "a recording's upload failed; it stays in the spool and is retried"
        );
        tokio::time::sleep(delay).await;
    }

    /// A stored file: counted, removed from the spool, and told to its session or, when the
    /// session no longer waits, to the audit log.
    fn done(
        &self,
        id: u64,
        job: &UploadJob,
        attempts: u32,
        since: Instant,
        stored: Stored,
        waiter: Option<oneshot::Sender<Stored>>,
    ) {
        self.counters
            .uploads
            .with_label_values(&[self.kind.label()])
            .inc();
        self.counters.bytes.inc_by(stored.bytes);
        let waited = {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.waiting.remove(&id)
        };
        if let Some((_, queued_bytes)) = waited {
            self.pending_files.dec();
            self.pending_bytes.sub(queued_bytes as i64);
        }
        match std::fs::remove_file(&job.path) {
            Ok(()) => self.spool.remove(stored.bytes),
            Err(e) => warn!(
                path = %job.path.display(),
                error = %e,
                "a stored recording could not be removed from the spool"
            ),
        }
        let event = UploadedEvent {
            time: rfc3339_millis(SystemTime::now()),
            stage: "uploaded",
            session_id: &job.session_id,
            recording: job.path.display().to_string(),
            recording_object: &stored.object,
            bytes: stored.bytes,
            attempts,
            pending_ms: since.elapsed().as_millis() as u64,
            after_restart: job.after_restart,
        };
        if let Some(cell) = &job.stored {
            let _ = cell.set(stored.clone());
        }
        let told = match waiter {
            Some(waiter) => waiter.send(stored.clone()).is_ok(),
            None => false,
        };
        if !told && self.kind == UploadKind::Recording {
            if let Some(audit) = self.audit.get() {
                audit.emit(&event);
            }
        }
        info!(session_id = %job.session_id, object = %stored.object, bytes = stored.bytes, attempts, "recording uploaded");
    }
}

/// The wait before attempt `attempts + 1`: doubling from [`FIRST_BACKOFF`] to
/// [`MAX_BACKOFF`], the second half of it random, so that replicas and files that failed
/// together do not come back together.
fn backoff(attempts: u32) -> Duration {
    let ceiling = FIRST_BACKOFF
        .saturating_mul(1u32 << attempts.saturating_sub(1).min(16))
        .min(MAX_BACKOFF);
    let mut random = [0u8; 4];
    let _ = getrandom::fill(&mut random);
    let fraction = f64::from(u32::from_le_bytes(random)) / f64::from(u32::MAX);
    ceiling / 2 + ceiling.mul_f64(fraction / 2.0)
}

/// Keeps the oldest-pending gauge current, once a second, while the uploader lives.
async fn age_ticker(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let oldest = {
            let p = inner.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.waiting.values().next().map(|(since, _)| *since)
        };
        let age = oldest.map_or(0, |since| since.elapsed().as_secs());
        inner.oldest_pending_seconds.set(age as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::upload::StoreSettings;

    /// What each queued upload holds while it waits for a slot is its task: that must stay
    /// small, as thousands wait while a store is down (the store client's future, about 9 KiB,
    /// is boxed only once a slot is taken).
    #[tokio::test]
    async fn a_waiting_upload_holds_a_small_task() {
        let settings = StoreSettings {
            endpoint: Some("http://127.0.0.1:9".into()),
            region: Some("us-east-1".into()),
            static_keys: Some(("id".into(), "secret".into())),
            ..StoreSettings::default()
        };
        let store = Store::new("s3://evidence/p".parse().unwrap(), &settings)
            .await
            .unwrap();
        let uploader = Uploader::start(
            store,
            UploadKind::Recording,
            UploadCounters::unregistered(),
            Duration::ZERO,
        );
        let job = UploadJob {
            path: PathBuf::from("/nonexistent/20261129T000000Z_ab-1.cast"),
            key: "p/2026/11/29/ab-1.cast".into(),
            session_id: "ab-1".into(),
            after_restart: false,
            stored: None,
        };
        let task = uploader.inner.clone().run(0, job, None, Instant::now());
        let size = std::mem::size_of_val(&task);
        assert!(size <= 1024, "a waiting upload's task is {size} bytes");
    }

    #[test]
    fn backoff_doubles_to_its_ceiling_with_jitter_in_the_upper_half() {
        for (attempts, ceiling) in [(1, 1), (2, 2), (3, 4), (9, 256), (10, 300), (40, 300)] {
            let ceiling = Duration::from_secs(ceiling);
            for _ in 0..50 {
                let d = backoff(attempts);
                assert!(d >= ceiling / 2 && d <= ceiling, "{attempts}: {d:?}");
            }
        }
    }
}
