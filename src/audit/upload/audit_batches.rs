//! `--audit-upload`: the audit log's lines, beside the local log, in batches of JSON lines
//! that go to the store: a batch is closed every `--audit-upload-interval` or at 8 MiB,
//! whichever comes first, and when the proxy stops; closed batches wait in a spool folder of
//! their own (beside the audit log) until stored, as recordings do, and an earlier run's are
//! found at start.
//!
//! Written by the audit log's writer thread, so sessions never wait for it; an `uploaded`
//! event is not written for a batch (an event about the audit log in the audit log would
//! never end), the metrics count them (`kind="audit"`).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use tracing::warn;

use super::target::UploadTarget;
use super::uploader::{UploadJob, Uploader};

/// A batch is closed once it holds this much, whatever its age.
pub const BATCH_MAX_BYTES: u64 = 8 << 20;

/// The batch being written.
#[derive(Debug)]
struct Batch {
    file: File,
    path: PathBuf,
    key: String,
    opened: Instant,
    bytes: u64,
}

/// The audit log's batches; owned by its writer thread.
#[derive(Debug)]
pub struct AuditBatches {
    dir: PathBuf,
    uploader: Uploader,
    every: Duration,
    current: Option<Batch>,
    seq: u64,
}

impl AuditBatches {
    /// Batches in `dir` (made, readable by the proxy's user only), each closed after `every`,
    /// uploaded by `uploader`.
    pub fn new(dir: PathBuf, uploader: Uploader, every: Duration) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        Ok(AuditBatches {
            dir,
            uploader,
            every,
            current: None,
            seq: 0,
        })
    }

    /// The folder the batches wait in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends one whole line (its newline included) to the open batch, opening one if none
    /// is; closes it if it is full.
    pub fn write_line(&mut self, line: &[u8]) {
        if self.current.is_none() {
            self.current = self.open();
        }
        let Some(batch) = self.current.as_mut() else {
            return;
        };
        let ends = match batch.file.write_all(line) {
            Ok(()) => {
                batch.bytes += line.len() as u64;
                batch.bytes >= BATCH_MAX_BYTES
            }
            Err(e) => {
                // The line is in the local log; this batch ends with what it has.
                warn!(path = %batch.path.display(), error = %e, "an audit batch could not be written");
                true
            }
        };
        if ends {
            self.close();
        }
    }

    /// How long until the open batch is due to close (`None`: none is open).
    pub fn until_due(&self) -> Option<Duration> {
        let batch = self.current.as_ref()?;
        Some((batch.opened + self.every).saturating_duration_since(Instant::now()))
    }

    /// Closes the open batch if it is due.
    pub fn close_if_due(&mut self) {
        if self.until_due() == Some(Duration::ZERO) {
            self.close();
        }
    }

    /// Closes the open batch, if any, and hands it to the uploader.
    pub fn close(&mut self) {
        let Some(mut batch) = self.current.take() else {
            return;
        };
        if let Err(e) = batch.file.flush() {
            warn!(path = %batch.path.display(), error = %e, "an audit batch could not be flushed");
        }
        drop(batch.file);
        self.uploader.upload_later(
            UploadJob {
                path: batch.path,
                key: batch.key,
                session_id: String::new(),
                after_restart: false,
                stored: None,
            },
            None,
        );
    }

    /// A new batch file: `<UTC start>_<instance>-<n>.jsonl`.
    fn open(&mut self) -> Option<Batch> {
        use std::os::unix::fs::OpenOptionsExt;
        let now = SystemTime::now();
        self.seq += 1;
        let name = format!(
            "{}_{}-{}.jsonl",
            crate::timestamp::compact(now),
            crate::audit::instance::instance_id(),
            self.seq
        );
        let path = self.dir.join(&name);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path);
        match file {
            Ok(file) => Some(Batch {
                file,
                key: self.uploader.target().audit_key(now, &name),
                path,
                opened: Instant::now(),
                bytes: 0,
            }),
            Err(e) => {
                warn!(path = %path.display(), error = %e, "an audit batch could not be created");
                None
            }
        }
    }
}

/// The audit batches an earlier run left in `dir`, as jobs, oldest first.
pub fn leftovers(dir: &Path, target: &UploadTarget) -> std::io::Result<Vec<UploadJob>> {
    let mut found = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(started) = name
            .strip_suffix(".jsonl")
            .and_then(|n| n.split_once('_'))
            .and_then(|(stamp, _)| crate::timestamp::parse_compact(stamp))
        else {
            continue;
        };
        found.push((
            started,
            UploadJob {
                path: entry.path(),
                key: target.audit_key(started, name),
                session_id: String::new(),
                after_restart: true,
                stored: None,
            },
        ));
    }
    found.sort_by(|a, b| (a.0, &a.1.key).cmp(&(b.0, &b.1.key)));
    Ok(found.into_iter().map(|(_, job)| job).collect())
}
