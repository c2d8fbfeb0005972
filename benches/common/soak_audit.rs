//! The soak's `--audit`: the proxy under test runs with the audit log (rotated small, so it
//! rotates under load) and `--record best-effort`, and this follows what it writes while the
//! soak runs. Every audit line must be a JSON object; every `ended` event that names a
//! recording is checked a little later (the writer thread finishes a file after the session)
//! and the file then removed, so an hour's recordings do not fill the disk: its header line is
//! asciicast v2 and it ends with a whole event line. At the end every `started` event must have
//! its `ended` one and every recording must have been named by one.
//!
//! With uploads on (the soak's `--upload`) the proxy removes a recording from its spool once
//! stored, so a recording is checked by fetching its object from the store instead: at its
//! `ended` event when that says `"recording_upload":"stored"`, else at its `uploaded` event.
//! Checked objects are deleted (moto keeps them in memory). At the end every recording an
//! `ended` event named must have been stored, the spool must hold no `.cast` file, the proxy
//! must have no recording pending, and the audit batches in the store, concatenated in key
//! order, must hold as many lines as the log had, the last of them the local log's files.

use std::io::{Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kube_ws_proxy::audit::upload::Store;

/// The audit log's size before it is rotated (one backup kept).
const ROTATE_AT: &str = "1Mi";

/// The soak's bucket, and the prefixes of the proxy's recordings and audit batches in it.
pub const BUCKET: &str = "soak";
const REC_PREFIX: &str = "rec";
const AUDIT_PREFIX: &str = "audit";
/// How often the proxy closes an audit batch (`--audit-upload-interval`).
const AUDIT_INTERVAL: Duration = Duration::from_secs(5);

/// With `--upload`: the store the proxy uploads to, read back here.
#[derive(Clone)]
pub struct Uploads {
    /// A client of the store itself (not the forwarder the faults take down).
    pub store: Arc<Store>,
    /// The store's address, to delete checked objects.
    pub server: SocketAddr,
}

impl Uploads {
    /// The proxy's arguments for uploads to the store at `endpoint`.
    pub fn proxy_args(endpoint: &str) -> Vec<String> {
        [
            "--record-upload",
            &format!("s3://{BUCKET}/{REC_PREFIX}"),
            "--audit-upload",
            &format!("s3://{BUCKET}/{AUDIT_PREFIX}"),
            "--audit-upload-interval",
            &format!("{}s", AUDIT_INTERVAL.as_secs()),
            "--s3-endpoint",
            endpoint,
            "--record-upload-wait",
            "1s",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect()
    }
}

/// What the follower has seen.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    pub started: u64,
    pub ended: u64,
    /// `ended` events by how the session ended (`outcome`).
    pub outcomes: std::collections::BTreeMap<String, u64>,
    pub rotations: u64,
    pub recordings_checked: u64,
    pub recording_bytes: u64,
    /// Ended events whose `recording_error` is set.
    pub recording_errors: Vec<String>,
    /// Lines that are not JSON objects, recordings that are not valid asciicast.
    pub bad: Vec<String>,
    /// Audit lines read, and their bytes (newlines included).
    pub lines: u64,
    pub line_bytes: u64,
    /// With uploads: `ended` events that said stored / pending, `uploaded` events.
    pub stored_at_end: u64,
    pub pending_at_end: u64,
    pub uploaded_events: u64,
    /// Recordings whose `ended` event said pending and whose `uploaded` event has not come;
    /// `uploaded` events whose `ended` one has not come.
    pub pending: std::collections::BTreeSet<String>,
    pub uploaded_early: std::collections::BTreeSet<String>,
}

/// A recording to check: a file in the spool, or (uploads on) an object in the store.
enum Due {
    File(PathBuf),
    Object(String),
}

/// The audit log and the recordings of one proxy.
pub struct Audit {
    pub dir: PathBuf,
    uploads: Option<Uploads>,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Audit {
    /// Makes the directories and starts following `audit.log` in `dir`; with `uploads`, its
    /// recordings are read back from the store.
    pub fn start(dir: &Path, uploads: Option<Uploads>) -> Audit {
        std::fs::create_dir_all(dir.join("recordings")).unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(follow(
            dir.to_owned(),
            uploads.clone(),
            seen.clone(),
            stop.clone(),
        ));
        Audit {
            dir: dir.to_owned(),
            uploads,
            seen,
            stop,
            task: Some(task),
        }
    }

    /// The proxy's arguments for this.
    pub fn proxy_args(dir: &Path) -> Vec<String> {
        vec![
            "--audit-log".into(),
            dir.join("audit.log").display().to_string(),
            "--audit-log-max-size".into(),
            ROTATE_AT.into(),
            "--audit-log-max-backups".into(),
            "1".into(),
            "--record".into(),
            "best-effort".into(),
            "--record-dir".into(),
            dir.join("recordings").display().to_string(),
        ]
    }

    /// What has been seen so far.
    pub fn seen(&self) -> Seen {
        self.seen.lock().unwrap().clone()
    }

    /// Once the proxy is idle: waits (up to `wait`) for every started session's `ended` event,
    /// for the last recordings to be checked and (uploads on) stored, stops following, and
    /// returns the verdict with the proxy's counters, read with `metric` (a metric's value
    /// summed over its labels, or of one label set written out).
    pub async fn finish(mut self, wait: Duration, metric: impl Fn(&str) -> f64) -> Verdict {
        let deadline = Instant::now() + wait;
        let pending_files = |kind: &str| {
            metric(&format!(
                "kube_ws_proxy_upload_pending_files{{kind=\"{kind}\"}}"
            ))
        };
        while Instant::now() < deadline {
            let settled = self.seen.lock().unwrap().settled();
            let drained = self.uploads.is_none()
                || (pending_files("recording") == 0.0 && pending_files("audit") == 0.0);
            if settled && drained {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // One more read of the log, for the last events.
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.stop.store(true, Ordering::SeqCst);
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
        let unnamed = std::fs::read_dir(self.dir.join("recordings"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".cast"))
            .collect();
        let mut uploaded = None;
        if let Some(u) = &self.uploads {
            let seen = self.seen();
            uploaded = Some(UploadVerdict {
                pending_recordings: pending_files("recording"),
                batches: check_batches(u, &self.dir, &seen, deadline).await,
                uploads: metric("kube_ws_proxy_uploads_total"),
                failures: metric("kube_ws_proxy_upload_failures_total"),
            });
        }
        Verdict {
            seen: self.seen(),
            unnamed,
            counters: counters(&metric),
            uploaded,
        }
    }
}

impl Seen {
    fn all_ended(&self) -> bool {
        self.started == self.ended
    }

    /// Every session ended, and every recording pending at its end stored.
    fn settled(&self) -> bool {
        self.all_ended() && self.pending.is_empty() && self.uploaded_early.is_empty()
    }
}

/// What `--upload` checks at the end, besides the recordings as they are stored.
pub struct UploadVerdict {
    /// `kube_ws_proxy_upload_pending_files{kind="recording"}`.
    pending_recordings: f64,
    /// The audit batches against the local log: their line count, or what is wrong.
    batches: Result<String, String>,
    uploads: f64,
    failures: f64,
}

/// The audit batches in the store, concatenated in key order (`<stamp>_<replica>-<n>`, `n`
/// numeric): as many lines as the log had (counted across its rotations), the last of them
/// the local log's files (the backup, then the current one). Waits up to `deadline` for the
/// last batch (closed every [`AUDIT_INTERVAL`]) to be stored.
async fn check_batches(
    u: &Uploads,
    dir: &Path,
    seen: &Seen,
    deadline: Instant,
) -> Result<String, String> {
    let prefix = format!("{AUDIT_PREFIX}/");
    let deadline = deadline.max(Instant::now() + 2 * AUDIT_INTERVAL);
    let mut keys = loop {
        let listed = u.store.list(&prefix).await.map_err(|e| e.to_string())?;
        let bytes: u64 = listed.iter().map(|(_, size)| size).sum();
        if bytes >= seen.line_bytes || Instant::now() > deadline {
            break listed;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let order = |key: &str| {
        let name = key.rsplit('/').next().unwrap_or(key);
        let name = name.strip_suffix(".jsonl").unwrap_or(name);
        let (stamp, rest) = name.split_once('_').unwrap_or((name, ""));
        let (replica, n) = rest.rsplit_once('-').unwrap_or((rest, ""));
        (
            stamp.to_owned(),
            replica.to_owned(),
            n.parse::<u64>().unwrap_or(u64::MAX),
        )
    };
    keys.sort_by_key(|(key, _)| order(key));
    let mut all = Vec::new();
    for (key, _) in &keys {
        all.extend(u.store.get(key).await.map_err(|e| e.to_string())?);
    }
    let batch_lines: Vec<&[u8]> = all.split_inclusive(|&b| b == b'\n').collect();
    if batch_lines.len() as u64 != seen.lines || all.len() as u64 != seen.line_bytes {
        return Err(format!(
            "{} batches hold {} lines ({} bytes), the log had {} ({} bytes)",
            keys.len(),
            batch_lines.len(),
            all.len(),
            seen.lines,
            seen.line_bytes
        ));
    }
    let mut local = std::fs::read(dir.join("audit.log.1")).unwrap_or_default();
    local.extend(std::fs::read(dir.join("audit.log")).map_err(|e| e.to_string())?);
    if !all.ends_with(&local) {
        return Err(format!(
            "the batches do not end with the local log's {} bytes",
            local.len()
        ));
    }
    Ok(format!(
        "{} batches, {} lines ({:.1} MB), the last {} bytes the local log's",
        keys.len(),
        batch_lines.len(),
        all.len() as f64 / 1e6,
        local.len()
    ))
}

/// The proxy's own counts of what went wrong, from its metrics.
#[derive(Debug, Clone, Copy)]
pub struct Counters {
    pub recording_failures: f64,
    pub audit_events_dropped: f64,
    pub audit_write_failures: f64,
}

/// Reads [`Counters`] with `metric`, a metric's value summed over its labels.
pub fn counters(metric: impl Fn(&str) -> f64) -> Counters {
    Counters {
        recording_failures: metric("kube_ws_proxy_recording_failures_total"),
        audit_events_dropped: metric("kube_ws_proxy_audit_events_dropped_total"),
        audit_write_failures: metric("kube_ws_proxy_audit_write_failures_total"),
    }
}

/// Everything `--audit` checks, at the end of the run.
pub struct Verdict {
    seen: Seen,
    /// Recordings left that no `ended` event named.
    unnamed: Vec<String>,
    counters: Counters,
    uploaded: Option<UploadVerdict>,
}

impl Verdict {
    /// Prints the figures and returns what failed.
    pub fn report(&self) -> Vec<String> {
        let (seen, c) = (&self.seen, &self.counters);
        let outcomes: Vec<String> = seen
            .outcomes
            .iter()
            .map(|(o, n)| format!("{n} × {o}"))
            .collect();
        println!("\n| audit and recordings | value |");
        println!("|---|---|");
        println!(
            "| audit events started / ended | {} / {} |",
            seen.started, seen.ended
        );
        println!("| ended, by outcome | {} |", outcomes.join(", "));
        println!("| audit log rotations | {} |", seen.rotations);
        println!(
            "| recordings checked (valid to the last line), size | {}, {:.1} GB |",
            seen.recordings_checked,
            seen.recording_bytes as f64 / 1e9
        );
        println!(
            "| recording failures / audit events dropped / audit write failures | {} / {} / {} |",
            c.recording_failures, c.audit_events_dropped, c.audit_write_failures
        );
        let first = |v: &[String]| v[..v.len().min(10)].to_vec();
        let mut failures = Vec::new();
        if !seen.all_ended() {
            failures.push(format!(
                "audit: {} sessions started, {} ended",
                seen.started, seen.ended
            ));
        }
        if !seen.bad.is_empty() {
            failures.push(format!(
                "audit: {} bad lines or recordings: {:?}",
                seen.bad.len(),
                first(&seen.bad)
            ));
        }
        if !seen.recording_errors.is_empty() {
            failures.push(format!(
                "recordings failed: {:?}",
                first(&seen.recording_errors)
            ));
        }
        if !self.unnamed.is_empty() {
            failures.push(format!(
                "{} recordings no ended event named: {:?}",
                self.unnamed.len(),
                first(&self.unnamed)
            ));
        }
        if c.recording_failures != 0.0
            || c.audit_events_dropped != 0.0
            || c.audit_write_failures != 0.0
        {
            failures.push(format!("{c:?}"));
        }
        if seen.recordings_checked == 0 {
            failures.push("audit: no recording was checked".into());
        }
        if let Some(u) = &self.uploaded {
            failures.extend(u.report(seen));
        }
        failures
    }
}

impl UploadVerdict {
    fn report(&self, seen: &Seen) -> Vec<String> {
        println!(
            "| recordings stored by their end / pending then / `uploaded` events | {} / {} / {} |",
            seen.stored_at_end, seen.pending_at_end, seen.uploaded_events
        );
        println!(
            "| uploads (recordings and batches) / upload failures counted | {} / {} |",
            self.uploads, self.failures
        );
        println!(
            "| audit batches against the log | {} |",
            match &self.batches {
                Ok(s) => s.clone(),
                Err(e) => format!("FAILED: {e}"),
            }
        );
        let mut failures = Vec::new();
        if !seen.pending.is_empty() || !seen.uploaded_early.is_empty() {
            failures.push(format!(
                "uploads: {} recordings pending at their end never stored, {} `uploaded` events without a pending `ended`: {:?}",
                seen.pending.len(),
                seen.uploaded_early.len(),
                seen.pending.iter().chain(&seen.uploaded_early).take(10).collect::<Vec<_>>()
            ));
        }
        if self.pending_recordings != 0.0 {
            failures.push(format!(
                "uploads: {} recordings still pending",
                self.pending_recordings
            ));
        }
        if let Err(e) = &self.batches {
            failures.push(format!("audit batches: {e}"));
        }
        failures
    }
}

impl Drop for Audit {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Reads the audit log as it grows (across rotations) and checks the recordings it names.
/// The checks (a fetch from the store each, with uploads on) run in a task of their own, so
/// that the reading never waits for them: a reader that fell behind by two rotations would
/// lose the file between them (one backup is kept).
async fn follow(
    dir: PathBuf,
    uploads: Option<Uploads>,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
) {
    let (to_check, checks) = tokio::sync::mpsc::unbounded_channel();
    let checker = tokio::spawn(check_all(checks, uploads.clone(), seen.clone()));
    let path = dir.join("audit.log");
    let mut file: Option<(std::fs::File, u64)> = None;
    let mut partial = Vec::new();
    let mut due: Vec<Due> = Vec::new();
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        if file.is_none() {
            file = std::fs::File::open(&path).ok().map(|f| {
                let ino = f.metadata().unwrap().ino();
                (f, ino)
            });
        }
        if let Some((f, ino)) = &mut file {
            let mut lines = Vec::new();
            read_lines(f, &mut partial, &mut lines);
            // Rotated: what was left in the old file was read just above; on to the new one.
            let rotated = std::fs::metadata(&path).is_ok_and(|m| m.ino() != *ino);
            if rotated {
                read_lines(f, &mut partial, &mut lines);
                seen.lock().unwrap().rotations += 1;
                file = None;
            }
            let mut s = seen.lock().unwrap();
            for line in lines {
                take_event(&line, &mut s, &mut due, uploads.is_some());
            }
        }
        // Checked as soon as the event that names it is read: a session's `ended` event is
        // written only once its recording is complete (or stored).
        for d in due.drain(..) {
            let _ = to_check.send(d);
        }
        if stopping {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    drop(to_check);
    checker.await.unwrap();
}

/// Checks what comes on `checks`, 8 at a time, counting each in `seen`, until the follower
/// is done.
async fn check_all(
    checks: tokio::sync::mpsc::UnboundedReceiver<Due>,
    uploads: Option<Uploads>,
    seen: Arc<Mutex<Seen>>,
) {
    let checks =
        futures_util::stream::unfold(
            checks,
            |mut rx| async move { rx.recv().await.map(|d| (d, rx)) },
        )
        .map(|d| {
            let uploads = uploads.clone();
            async move { check_due(d, uploads.as_ref()).await }
        })
        .buffer_unordered(8);
    futures_util::pin_mut!(checks);
    while let Some((what, checked)) = checks.next().await {
        let mut s = seen.lock().unwrap();
        match checked {
            Ok(bytes) => {
                s.recordings_checked += 1;
                s.recording_bytes += bytes;
            }
            Err(e) => s.bad.push(format!("{what}: {e}")),
        }
    }
}

/// Checks one recording, then removes it (the file, or the object: moto keeps objects in
/// memory); what it was and its size.
async fn check_due(due: Due, uploads: Option<&Uploads>) -> (String, Result<u64, String>) {
    match (due, uploads) {
        (Due::File(path), _) => {
            let checked = check_recording(&path);
            let _ = std::fs::remove_file(&path);
            (path.display().to_string(), checked)
        }
        (Due::Object(key), Some(u)) => {
            let checked = match u.store.get(&key).await {
                Ok(data) => check_cast(&data),
                Err(e) => Err(format!("fetch: {e}")),
            };
            if checked.is_ok() {
                delete_object(u.server, &key).await;
            }
            (format!("s3://{BUCKET}/{key}"), checked)
        }
        (Due::Object(key), None) => (key, Err("an object without a store".into())),
    }
}

/// Deletes an object from moto (which takes unsigned requests), best effort: a plain
/// `DELETE /BUCKET/KEY`.
async fn delete_object(server: SocketAddr, key: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(server).await else {
        return;
    };
    let request = format!(
        "DELETE /{BUCKET}/{key} HTTP/1.1\r\nHost: {server}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    if s.write_all(request.as_bytes()).await.is_ok() {
        let mut reply = Vec::new();
        let _ = s.read_to_end(&mut reply).await;
    }
}

/// Appends the whole lines `f` has from where it was read to, keeping a partial last one.
fn read_lines(f: &mut std::fs::File, partial: &mut Vec<u8>, lines: &mut Vec<Vec<u8>>) {
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    partial.extend_from_slice(&buf);
    while let Some(n) = partial.iter().position(|&b| b == b'\n') {
        let line: Vec<u8> = partial.drain(..=n).collect();
        lines.push(line);
    }
}

fn take_event(line: &[u8], s: &mut Seen, due: &mut Vec<Due>, uploads: bool) {
    s.lines += 1;
    s.line_bytes += line.len() as u64;
    let event: serde_json::Value = match serde_json::from_slice(line) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        _ => {
            s.bad
                .push(format!("audit line: {:?}", String::from_utf8_lossy(line)));
            return;
        }
    };
    // `s3://BUCKET/KEY` → KEY.
    let object = |event: &serde_json::Value| {
        event["recording_object"]
            .as_str()
            .and_then(|o| o.strip_prefix(&format!("s3://{BUCKET}/")))
            .map(|k| Due::Object(k.to_owned()))
    };
    match event["stage"].as_str() {
        Some("started") => s.started += 1,
        Some("ended") => {
            s.ended += 1;
            let outcome = event["outcome"].as_str().unwrap_or("?").to_owned();
            *s.outcomes.entry(outcome).or_default() += 1;
            if let Some(e) = event["recording_error"].as_str() {
                s.recording_errors.push(e.to_owned());
            }
            let Some(r) = event["recording"].as_str() else {
                return;
            };
            if !uploads {
                due.push(Due::File(PathBuf::from(r)));
                return;
            }
            match (event["recording_upload"].as_str(), object(&event)) {
                (Some("stored"), Some(o)) => {
                    s.stored_at_end += 1;
                    due.push(o);
                }
                (Some("pending"), None) => {
                    s.pending_at_end += 1;
                    if !s.uploaded_early.remove(r) {
                        s.pending.insert(r.to_owned());
                    }
                }
                _ => s.bad.push(format!(
                    "ended event's upload: {}",
                    String::from_utf8_lossy(line)
                )),
            }
        }
        Some("uploaded") if uploads => {
            s.uploaded_events += 1;
            let r = event["recording"].as_str().unwrap_or_default().to_owned();
            if !s.pending.remove(&r) {
                s.uploaded_early.insert(r);
            }
            match object(&event) {
                Some(o) => due.push(o),
                None => s
                    .bad
                    .push(format!("uploaded event: {}", String::from_utf8_lossy(line))),
            }
        }
        other => s.bad.push(format!("audit stage {other:?}")),
    }
}

/// A recording fetched whole: header asciicast v2, last line a whole event (or the header);
/// its size.
fn check_cast(data: &[u8]) -> Result<u64, String> {
    check_header(data)?;
    let Some(body) = data.strip_suffix(b"\n") else {
        return Err("does not end with a whole line".into());
    };
    let last = &body[body.iter().rposition(|&b| b == b'\n').map_or(0, |n| n + 1)..];
    check_last_line(last)?;
    Ok(data.len() as u64)
}

/// A recording's first line, in `start` (its first bytes): a whole asciicast v2 header.
fn check_header(start: &[u8]) -> Result<(), String> {
    let header_end = start
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("no whole header line")?;
    let header: serde_json::Value =
        serde_json::from_slice(&start[..header_end]).map_err(|e| format!("header: {e}"))?;
    if header["version"] != 2 {
        return Err(format!("header {header}"));
    }
    Ok(())
}

/// The last line of a recording: a whole event `[time, code, data]`, or the header.
fn check_last_line(last: &[u8]) -> Result<(), String> {
    let event: serde_json::Value =
        serde_json::from_slice(last).map_err(|e| format!("last line: {e}"))?;
    let whole_event = event.as_array().is_some_and(|a| a.len() == 3);
    if !whole_event && event["version"] != 2 {
        return Err(format!("last line {event}"));
    }
    Ok(())
}

/// A recording's header is asciicast v2 and its last line a whole event (or the header, for a
/// session that showed nothing); its size.
fn check_recording(path: &Path) -> Result<u64, String> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("open: {e}"))?;
    let size = f.metadata().map_err(|e| e.to_string())?.len();
    let mut head = vec![0u8; size.min(4096) as usize];
    f.read_exact(&mut head).map_err(|e| format!("read: {e}"))?;
    check_header(&head)?;
    // The last line: read back from the end, further while no line break is in sight (an
    // event of a 32 KiB chunk of NUL bytes is 192 KiB long).
    let mut window = 64 * 1024u64;
    let (tail, start) = loop {
        let len = size.min(window);
        f.seek(SeekFrom::Start(size - len))
            .map_err(|e| e.to_string())?;
        let mut tail = vec![0u8; len as usize];
        f.read_exact(&mut tail).map_err(|e| format!("read: {e}"))?;
        if tail.last() != Some(&b'\n') {
            return Err("does not end with a whole line".into());
        }
        match tail[..tail.len() - 1].iter().rposition(|&b| b == b'\n') {
            Some(n) => break (tail, n + 1),
            None if len == size => break (tail, 0),
            None => window *= 4,
        }
    };
    check_last_line(&tail[start..tail.len() - 1])?;
    Ok(size)
}
