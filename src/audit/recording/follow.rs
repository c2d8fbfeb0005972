//! Reading a recording while it is written (the sessions API's `recording`, `?follow=true`).
//!
//! A follower costs the session nothing: it reads the file with a file handle of its own, and
//! learns how far it may read from what the writer publishes after each write
//! ([`FileProgress`]: whole lines only, so a follower never sees half an event). The writer
//! publishes whether anyone follows or not and never waits for a follower; a follower that
//! reads slowly only falls behind in the file, which holds everything it has not read yet.
//! What a follower holds is bounded: [`CHUNK`]-sized reads into a body channel of
//! [`AHEAD_CHUNKS`].

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use super::recorder::UploadOutcome;
pub use super::state::FileProgress;
use super::state::{RecordingCap, Truncation};
use crate::audit::upload::{Stored, UploadState};

/// How much of the file one read takes.
pub const CHUNK: usize = 64 * 1024;
/// Chunks read ahead of the follower's client: what a follower holds at most, beside what its
/// connection's buffers hold.
pub const AHEAD_CHUNKS: usize = 4;
/// How long a follower's client may take no bytes at all before it is dropped: a client that
/// stopped reading holds its place among the followers for no longer than this.
pub const STALL_LIMIT: Duration = Duration::from_secs(120);

/// A recording as a follower finds it: its file, and the writer's progress through it.
#[derive(Debug, Clone)]
pub struct RecordingFeed {
    path: PathBuf,
    progress: watch::Receiver<FileProgress>,
    /// The recording's size cap, when a writer of this proxy writes it.
    cap: Option<Arc<RecordingCap>>,
    /// What became of its upload (`--record-upload`).
    upload: Option<Arc<UploadOutcome>>,
}

impl RecordingFeed {
    /// The feed of the file at `path`, written as `progress` says.
    pub(crate) fn new(
        path: PathBuf,
        progress: watch::Receiver<FileProgress>,
        cap: Option<Arc<RecordingCap>>,
    ) -> RecordingFeed {
        RecordingFeed {
            path,
            progress,
            cap,
            upload: None,
        }
    }

    /// The feed, with where its upload's outcome will be once the recording is closed.
    pub(crate) fn with_upload(mut self, upload: Arc<UploadOutcome>) -> RecordingFeed {
        self.upload = Some(upload);
        self
    }

    /// What its session's `ended` event says of its upload: `None` without `--record-upload`
    /// or before its session's end.
    pub fn upload(&self) -> Option<&UploadState> {
        self.upload.as_ref().and_then(|u| u.at_end.get())
    }

    /// Where it is in the store, once stored (maybe after its session's `ended` event).
    pub fn stored(&self) -> Option<&Stored> {
        self.upload.as_ref().and_then(|u| u.stored.get())
    }

    /// The feed of a file no writer of this proxy writes (one found on disk): complete at
    /// `len` bytes.
    pub fn finished(path: PathBuf, len: u64) -> RecordingFeed {
        let (_, progress) = watch::channel(FileProgress {
            written: len,
            closed: true,
        });
        RecordingFeed {
            path,
            progress,
            cap: None,
            upload: None,
        }
    }

    /// Whether its size cap cut it short, and what that left out (`None`: it did not).
    pub fn truncation(&self) -> Option<Truncation> {
        self.cap.as_ref().and_then(|cap| cap.truncation())
    }

    /// The recording's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How far its file is written now.
    pub fn progress(&self) -> FileProgress {
        *self.progress.borrow()
    }

    /// Sends the recording, read from `file` (opened by the follower), to `tx` in chunks: what
    /// is written now, then, when `follow`, what is written after, until the writer is done
    /// with the file (or gone). Ends early when the receiver is dropped, or takes nothing for
    /// [`STALL_LIMIT`].
    pub async fn send(mut self, file: File, tx: mpsc::Sender<Bytes>, follow: bool) {
        let file = Arc::new(file);
        let mut offset = 0u64;
        let mut writer_gone = false;
        loop {
            let now = *self.progress.borrow_and_update();
            if !send_range(&file, &mut offset, now.written, &tx).await {
                return;
            }
            if now.closed || !follow || writer_gone {
                return;
            }
            tokio::select! {
                changed = self.progress.changed() => writer_gone = changed.is_err(),
                () = tx.closed() => return,
            }
        }
    }
}

/// Sends `file` from `offset` to `end`, moving `offset` on; `false` when the follower is gone
/// (or stalled) or the file cannot be read as far as the writer said.
async fn send_range(
    file: &Arc<File>,
    offset: &mut u64,
    end: u64,
    tx: &mpsc::Sender<Bytes>,
) -> bool {
    while *offset < end {
        let len = (end - *offset).min(CHUNK as u64) as usize;
        let Some(chunk) = read_at(file, *offset, len).await else {
            return false;
        };
        *offset += chunk.len() as u64;
        if tx.send_timeout(chunk, STALL_LIMIT).await.is_err() {
            return false;
        }
    }
    true
}

/// Up to `len` bytes of `file` at `offset`; `None` at its end (it was cut short under the
/// writer) or on an error.
async fn read_at(file: &Arc<File>, offset: u64, len: usize) -> Option<Bytes> {
    use std::os::unix::fs::FileExt;
    let file = file.clone();
    let read = tokio::task::spawn_blocking(move || {
        let mut buf = vec![0; len];
        let n = file.read_at(&mut buf, offset)?;
        buf.truncate(n);
        Ok::<_, std::io::Error>(buf)
    })
    .await;
    match read {
        Ok(Ok(buf)) if !buf.is_empty() => Some(Bytes::from(buf)),
        _ => None,
    }
}

/// Opens a recording's file for reading, never through a symbolic link, and only if it is a
/// regular file (not a FIFO that would block, nor a device): the file and its length.
pub fn open_regular(path: &Path) -> std::io::Result<(File, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok((file, meta.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::recording::{
        RecordPolicy, Recorder, RecordingConfig, RecordingCounters, RecordingPlace, Recordings,
    };

    async fn recorder(policy: RecordPolicy) -> (tempfile::TempDir, Recordings, Recorder) {
        let dir = tempfile::tempdir().unwrap();
        let config = RecordingConfig {
            dir: dir.path().to_owned(),
            policy,
            record_stdin: false,
            min_free: 0,
            max_bytes: None,
        };
        let recordings = Recordings::start(config, RecordingCounters::unregistered()).unwrap();
        let place = RecordingPlace {
            cluster: "default",
            folder: None,
            namespace: "team-a",
        };
        let rec = recordings
            .open(place, "r-1", &["sh".into()], "team-a/web".into(), true)
            .await
            .unwrap();
        (dir, recordings, rec)
    }

    /// Everything a follower was sent, once it is done.
    async fn all(mut rx: mpsc::Receiver<Bytes>) -> String {
        let mut text = Vec::new();
        while let Some(chunk) = rx.recv().await {
            text.extend_from_slice(&chunk);
        }
        String::from_utf8(text).unwrap()
    }

    #[tokio::test]
    async fn a_follower_sees_output_as_it_is_written_and_ends_with_the_file() {
        for policy in [RecordPolicy::BestEffort, RecordPolicy::Required] {
            let (_dir, _recordings, rec) = recorder(policy).await;
            let feed = rec.feed();
            let (file, _) = open_regular(feed.path()).unwrap();
            let (tx, mut rx) = mpsc::channel(AHEAD_CHUNKS);
            let follower = tokio::spawn(feed.clone().send(file, tx, true));
            rec.output(&Bytes::from_static(b"ONE\r\n")).await;
            // The header and the first event come before the session ends.
            let mut seen = String::new();
            while !seen.contains("ONE") {
                let chunk = rx.recv().await.expect("the follower goes on");
                seen.push_str(std::str::from_utf8(&chunk).unwrap());
            }
            let header: serde_json::Value =
                serde_json::from_str(seen.lines().next().unwrap()).unwrap();
            assert_eq!(header["kube_ws_proxy"]["session_id"], "r-1", "{policy:?}");
            assert_eq!(header["kube_ws_proxy"]["namespace"], "team-a");
            rec.output(&Bytes::from_static(b"TWO\r\n")).await;
            let path = feed.path().to_owned();
            assert!(rec.close().await.is_none());
            seen.push_str(&all(rx).await);
            follower.await.unwrap();
            // Whole lines only, and the whole file.
            assert_eq!(seen, std::fs::read_to_string(&path).unwrap(), "{policy:?}");
            assert!(seen.contains("TWO") && seen.ends_with('\n'));
            assert!(feed.progress().closed);
        }
    }

    #[tokio::test]
    async fn a_reader_that_does_not_follow_gets_what_is_written_now() {
        let (_dir, _recordings, rec) = recorder(RecordPolicy::BestEffort).await;
        rec.output(&Bytes::from_static(b"ONE\r\n")).await;
        let feed = rec.feed();
        let mut progress = feed.progress.clone();
        progress.wait_for(|p| p.written > 0).await.unwrap();
        let (file, _) = open_regular(feed.path()).unwrap();
        let (tx, rx) = mpsc::channel(AHEAD_CHUNKS);
        tokio::spawn(feed.send(file, tx, false));
        let text = all(rx).await;
        assert!(text.contains("ONE"), "{text}");
        assert_eq!(text.lines().count(), 2);
    }

    #[tokio::test]
    async fn a_stalled_follower_never_holds_the_session_back() {
        let (_dir, _recordings, rec) = recorder(RecordPolicy::Required).await;
        let feed = rec.feed();
        let (file, _) = open_regular(feed.path()).unwrap();
        // A follower whose client reads nothing.
        let (tx, rx) = mpsc::channel(AHEAD_CHUNKS);
        tokio::spawn(feed.clone().send(file, tx, true));
        let chunk = Bytes::from(vec![b'x'; 32 * 1024]);
        for _ in 0..256 {
            // Under `required` each batch waits for the writer: it must not wait for the
            // follower too.
            assert!(rec.output(&chunk).await);
        }
        assert!(rec.close().await.is_none());
        assert!(feed.progress().closed);
        assert!(feed.progress().written > 8 << 20);
        // It was sent what its channel holds, and no more.
        assert_eq!(rx.len(), AHEAD_CHUNKS);
    }
}
