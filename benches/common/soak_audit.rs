//! The soak's `--audit`: the proxy under test runs with the audit log (rotated small, so it
//! rotates under load) and `--record best-effort`, and this follows what it writes while the
//! soak runs. Every audit line must be a JSON object; every `ended` event that names a
//! recording is checked a little later (the writer thread finishes a file after the session)
//! and the file then removed, so an hour's recordings do not fill the disk: its header line is
//! asciicast v2 and it ends with a whole event line. At the end every `started` event must have
//! its `ended` one and every recording must have been named by one.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The audit log's size before it is rotated (one backup kept).
const ROTATE_AT: &str = "1Mi";

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
}

/// The audit log and the recordings of one proxy.
pub struct Audit {
    pub dir: PathBuf,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Audit {
    /// Makes the directories and starts following `audit.log` in `dir`.
    pub fn start(dir: &Path) -> Audit {
        std::fs::create_dir_all(dir.join("recordings")).unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(follow(dir.to_owned(), seen.clone(), stop.clone()));
        Audit {
            dir: dir.to_owned(),
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

    /// Once the proxy is idle: waits (up to `wait`) for every started session's `ended` event
    /// and for the last recordings to be checked, stops following, and returns the verdict
    /// with the proxy's `counters`.
    pub async fn finish(mut self, wait: Duration, counters: Counters) -> Verdict {
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            if self.seen.lock().unwrap().all_ended() {
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
            .collect();
        Verdict {
            seen: self.seen(),
            unnamed,
            counters,
        }
    }
}

impl Seen {
    fn all_ended(&self) -> bool {
        self.started == self.ended
    }
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
        failures
    }
}

impl Drop for Audit {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Reads the audit log as it grows (across rotations) and checks the recordings it names.
async fn follow(dir: PathBuf, seen: Arc<Mutex<Seen>>, stop: Arc<AtomicBool>) {
    let path = dir.join("audit.log");
    let mut file: Option<(std::fs::File, u64)> = None;
    let mut partial = Vec::new();
    let mut due: Vec<PathBuf> = Vec::new();
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
                take_event(&line, &mut s, &mut due);
            }
        }
        // Checked as soon as the event that names it is read: a session's `ended` event is
        // written only once its recording is complete.
        for recording in due.drain(..) {
            let checked = check_recording(&recording);
            let _ = std::fs::remove_file(&recording);
            let mut s = seen.lock().unwrap();
            match checked {
                Ok(bytes) => {
                    s.recordings_checked += 1;
                    s.recording_bytes += bytes;
                }
                Err(e) => s.bad.push(format!("{}: {e}", recording.display())),
            }
        }
        if stopping {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
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

fn take_event(line: &[u8], s: &mut Seen, due: &mut Vec<PathBuf>) {
    let event: serde_json::Value = match serde_json::from_slice(line) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        _ => {
            s.bad
                .push(format!("audit line: {:?}", String::from_utf8_lossy(line)));
            return;
        }
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
            if let Some(r) = event["recording"].as_str() {
                due.push(PathBuf::from(r));
            }
        }
        other => s.bad.push(format!("audit stage {other:?}")),
    }
}

/// A recording's header is asciicast v2 and its last line a whole event (or the header, for a
/// session that showed nothing); its size.
fn check_recording(path: &Path) -> Result<u64, String> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("open: {e}"))?;
    let size = f.metadata().map_err(|e| e.to_string())?.len();
    let mut head = vec![0u8; size.min(4096) as usize];
    f.read_exact(&mut head).map_err(|e| format!("read: {e}"))?;
    let header_end = head
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("no whole header line")?;
    let header: serde_json::Value =
        serde_json::from_slice(&head[..header_end]).map_err(|e| format!("header: {e}"))?;
    if header["version"] != 2 {
        return Err(format!("header {header}"));
    }
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
    let last = &tail[start..tail.len() - 1];
    let event: serde_json::Value =
        serde_json::from_slice(last).map_err(|e| format!("last line: {e}"))?;
    let whole_event = event.as_array().is_some_and(|a| a.len() == 3);
    if !whole_event && event["version"] != 2 {
        return Err(format!("last line {event}"));
    }
    Ok(size)
}
