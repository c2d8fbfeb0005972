//! Session recordings (`--record`, `--record-dir`, `--record-stdin`) with real clients:
//! kubectl 1.33 exec, translated; kubectl 1.28 exec over SPDY and raw legacy WebSocket clients
//! (`v4.channel.k8s.io`, `base64.channel.k8s.io`, none), relayed and followed passively. Each
//! recording is replayed with Debian's `asciinema cat` and must give exactly what the client
//! was shown; a `-it` session whose window changes size has the sizes in its recording;
//! `--record=required` refuses what it cannot record. The audit event names each session's
//! recording and, for relayed sessions too, its exit code.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::clients::{require_asciinema, require_kubectl, write_kubeconfig};
use common::harness::{stderr, stdout};
use common::proxy_process::ProxyProcess;
use common::pty::{run_script_on_pty, PtyStep};
use common::replay::{replay, without_ready_message_race};
use kube_ws_proxy::sim::{SimCluster, SimConfig, SimStreaming};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

/// A simulated cluster behind a proxy that audits and records (tests/e2e_spdy_headers.rs
/// uses it too).
pub(crate) struct Recorded {
    _sim: SimCluster,
    pub(crate) proxy: ProxyProcess,
    dir: tempfile::TempDir,
    records: PathBuf,
    audit: PathBuf,
    kubeconfig: PathBuf,
}

impl Recorded {
    pub(crate) async fn start(extra: &[&str]) -> Recorded {
        Recorded::start_with(SimStreaming::default(), extra).await
    }

    /// Before a cluster that streams as `streaming` does.
    async fn start_with(streaming: SimStreaming, extra: &[&str]) -> Recorded {
        let sim = SimCluster::start(SimConfig {
            streaming,
            ..SimConfig::default()
        })
        .await
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let records = dir.path().join("recordings");
        std::fs::create_dir(&records).unwrap();
        let audit = dir.path().join("audit.log");
        let mut args = vec![
            "--record-dir".to_owned(),
            records.display().to_string(),
            "--audit-log".to_owned(),
            audit.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let proxy = ProxyProcess::start(&sim.url(), &refs);
        let kubeconfig = write_kubeconfig(dir.path(), &proxy.url(), None);
        Recorded {
            _sim: sim,
            proxy,
            dir,
            records,
            audit,
            kubeconfig,
        }
    }

    fn kubectl(&self, k: &Path) -> std::process::Command {
        let mut c = std::process::Command::new(k);
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .env("HOME", self.dir.path())
            .env_remove("KUBECONFIG")
            .env_remove("KUBECTL_REMOTE_COMMAND_WEBSOCKETS");
        c
    }

    /// The `ended` audit event of the session on `pod`, once written.
    pub(crate) async fn ended(&self, pod: &str) -> Value {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let text = std::fs::read_to_string(&self.audit).unwrap_or_default();
            if let Some(e) = text
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .find(|e| e["stage"] == "ended" && e["pod"] == pod)
            {
                return e;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no ended event for {pod}: {text}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The recording an `ended` event names, complete the moment the event is seen
    /// ([`common::replay::complete_recording`]).
    pub(crate) fn recording(&self, ended: &Value) -> PathBuf {
        let (path, _) = common::replay::complete_recording(ended);
        assert!(path.starts_with(&self.records), "{}", path.display());
        path
    }
}

pub(crate) fn events(recording: &Path) -> (Value, Vec<Value>) {
    let text = std::fs::read_to_string(recording).unwrap();
    let mut lines = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap());
    let header = lines.next().expect("a header");
    (header, lines.collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_replays_to_exactly_what_kubectl_printed() {
    let (Some(k), Some(asciinema)) = (require_kubectl("1.33"), require_asciinema()) else {
        return;
    };
    let r = Recorded::start(&["--record", "required"]).await;
    let mut c = r.kubectl(&k);
    c.args([
        "exec",
        "plain",
        "--",
        "sh",
        "-c",
        "printf 'first line\\n'; sleep 0.2; printf 'to stderr\\n' >&2; sleep 0.2; \
         printf '\\342\\202\\254 and \\360\\237\\230\\200 done\\n'",
    ]);
    let o = common::harness::run(c, None, T).await;
    assert!(o.status.success(), "kubectl: {}", stderr(&o));
    let ended = r.ended("plain").await;
    assert_eq!(ended["exit_code"], 0, "{ended}");
    assert_eq!(ended["recording_error"], Value::Null, "{ended}");
    let recording = r.recording(&ended);
    let recording_path = recording.clone();
    // stdout and stderr, interleaved as they came.
    let shown = format!("{}{}", stdout(&o), stderr(&o));
    assert_eq!(stdout(&o), "first line\n€ and 😀 done\n");
    let replayed = tokio::task::spawn_blocking(move || replay(&asciinema, &recording_path))
        .await
        .unwrap();
    assert_eq!(
        replayed, "first line\nto stderr\n€ and 😀 done\n",
        "kubectl showed {shown:?}"
    );
    let (header, _) = events(&recording);
    assert_eq!(header["version"], 2);
    assert_eq!(header["command"], "sh -c printf 'first line\\n'; sleep 0.2; printf 'to stderr\\n' >&2; sleep 0.2; printf '\\342\\202\\254 and \\360\\237\\230\\200 done\\n'");
    let metrics = r.proxy.metrics();
    assert!(
        metrics.contains(r#"kube_ws_proxy_recording_failures_total{cluster="default"} 0"#),
        "{metrics}"
    );
    // No terminal, nobody typing: the writer never rested.
    assert_eq!(r.proxy.metric(RESTED), Some(0.0));
}

/// The seconds the recordings' writer rested because someone typed on a terminal session.
const RESTED: &str = "kube_ws_proxy_recording_writer_rested_seconds_total";

/// Someone typed on a recorded terminal session and output followed: the writer rested after
/// writing it (for as long as the write took, a few microseconds here).
fn writer_rested_for_typing(r: &Recorded) {
    let rested = r
        .proxy
        .metric(RESTED)
        .expect("the writer's rests are counted");
    assert!(rested > 0.0, "{rested}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_session_records_its_window_sizes_and_with_record_stdin_its_input() {
    let (Some(k), Some(asciinema)) = (require_kubectl("1.33"), require_asciinema()) else {
        return;
    };
    let r = Recorded::start(&["--record", "best-effort", "--record-stdin"]).await;
    let mut c = r.kubectl(&k);
    c.args(["exec", "-it", "tty", "--", "sh"]);
    let run = tokio::task::spawn_blocking(move || {
        run_script_on_pty(
            c,
            80,
            24,
            &[
                PtyStep::Wait(Duration::from_secs(1)),
                PtyStep::Type(b"stty size\n"),
                PtyStep::Wait(Duration::from_millis(700)),
                PtyStep::Resize(100, 30),
                PtyStep::Wait(Duration::from_millis(700)),
                PtyStep::Type(b"stty size; exit\n"),
            ],
            T,
        )
    })
    .await
    .unwrap();
    assert!(run.status.success(), "kubectl: {:?}", run.output);
    assert!(run.output.contains("24 80"), "{:?}", run.output);
    assert!(run.output.contains("30 100"), "{:?}", run.output);
    let ended = r.ended("tty").await;
    let recording = r.recording(&ended);
    let (header, events) = events(&recording);
    // The terminal's first size is the header's; the window change is a resize event.
    assert_eq!(
        (header["width"].as_u64(), header["height"].as_u64()),
        (Some(80), Some(24))
    );
    assert!(
        events.iter().any(|e| e[1] == "r" && e[2] == "100x30"),
        "{events:?}"
    );
    let typed: String = events
        .iter()
        .filter(|e| e[1] == "i")
        .map(|e| e[2].as_str().unwrap())
        .collect();
    assert_eq!(typed, "stty size\nstty size; exit\n");
    writer_rested_for_typing(&r);
    // The replay is exactly what kubectl wrote to its terminal.
    let replayed = tokio::task::spawn_blocking(move || replay(&asciinema, &recording))
        .await
        .unwrap();
    assert_eq!(replayed, without_ready_message_race(&run.output));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_record_stdin_nothing_typed_is_recorded() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let r = Recorded::start(&["--record", "best-effort"]).await;
    let mut c = r.kubectl(&k);
    c.args(["exec", "-i", "cat", "--", "cat"]);
    let o = common::harness::run(c, Some(b"my password\n".to_vec()), T).await;
    assert_eq!(stdout(&o), "my password\n");
    let ended = r.ended("cat").await;
    let recording = r.recording(&ended);
    let (_, events) = events(&recording);
    assert!(events.iter().all(|e| e[1] == "o"), "{events:?}");
    assert_eq!(events.len(), 1, "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_recordings_refuse_what_cannot_be_recorded() {
    let (Some(k33), Some(k28)) = (require_kubectl("1.33"), require_kubectl("1.28")) else {
        return;
    };
    let r = Recorded::start(&["--record", "required"]).await;
    // The directory goes away after the start: no recording can be created. (The tests run as
    // root, whom permissions do not stop.)
    std::fs::remove_dir_all(&r.records).unwrap();
    let mut c = r.kubectl(&k33);
    c.args(["exec", "refused", "--", "echo", "never"]);
    let o = common::harness::run(c, None, T).await;
    assert!(!o.status.success());
    assert_eq!(stdout(&o), "", "the command ran: {}", stdout(&o));
    assert!(
        stderr(&o).contains("recordings are required"),
        "kubectl: {}",
        stderr(&o)
    );
    let ended = r.ended("refused").await;
    assert_eq!(ended["outcome"], "recording_failed", "{ended}");
    assert!(ended["recording_error"].as_str().is_some(), "{ended}");

    // kubectl 1.28 speaks SPDY, which the proxy relays: refused too, before it goes upstream.
    let mut c = r.kubectl(&k28);
    c.args(["exec", "relayed-refused", "--", "echo", "never"]);
    c.stdin(Stdio::null());
    let o = common::harness::run(c, None, T).await;
    assert!(!o.status.success());
    assert_eq!(stdout(&o), "");
    assert!(
        stderr(&o).contains("recordings are required"),
        "kubectl 1.28: {}",
        stderr(&o)
    );
    let ended = r.ended("relayed-refused").await;
    assert_eq!(ended["outcome"], "recording_failed", "{ended}");
    // Refused before the upstream was asked: under `--upstream-streaming auto` no path was
    // taken.
    assert_eq!(ended["protocol_path"], "auto", "{ended}");
    assert!(ended["recording_error"].as_str().is_some(), "{ended}");

    // Once recordings can be made, a relayed SPDY session is recorded, so it is admitted.
    std::fs::create_dir(&r.records).unwrap();
    let mut c = r.kubectl(&k28);
    c.args(["exec", "relayed", "--", "echo", "recorded"]);
    c.stdin(Stdio::null());
    let o = common::harness::run(c, None, T).await;
    assert!(o.status.success(), "kubectl 1.28: {}", stderr(&o));
    assert_eq!(stdout(&o), "recorded\n");
    let ended = r.ended("relayed").await;
    assert_eq!(ended["outcome"], "success", "{ended}");
    assert_eq!(ended["exit_code"], 0, "{ended}");
    assert_eq!(ended["recording_error"], Value::Null, "{ended}");
    let recording = r.recording(&ended);
    let (_, events) = events(&recording);
    let recorded: String = events
        .iter()
        .filter(|e| e[1] == "o")
        .map(|e| e[2].as_str().unwrap())
        .collect();
    assert_eq!(recorded, "recorded\n");
    let metrics = r.proxy.metrics();
    assert!(
        metrics.contains(r#"kube_ws_proxy_recording_failures_total{cluster="default"} 2"#),
        "{metrics}"
    );
    // Both refusals count as sessions that ended for their recording. Refused before any path
    // was taken, each counts under the kind `--upstream-streaming auto` admits it as (the v5
    // exec as a pass-through, the SPDY one as a relay).
    for kind in ["websocket_pass_through", "spdy_relay"] {
        let refused = format!(
            "kube_ws_proxy_sessions_total{{cluster=\"default\",kind=\"{kind}\",outcome=\"recording_failed\"}} 1"
        );
        assert!(metrics.contains(&refused), "{refused}\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_spdy_exec_replays_to_exactly_what_kubectl_printed_with_its_exit_code() {
    let (Some(k), Some(asciinema)) = (require_kubectl("1.28"), require_asciinema()) else {
        return;
    };
    let r = Recorded::start(&["--record", "required"]).await;
    let mut c = r.kubectl(&k);
    c.args([
        "exec",
        "spdy-plain",
        "--",
        "sh",
        "-c",
        "printf 'first line\\n'; sleep 0.2; printf 'to stderr\\n' >&2; sleep 0.2; \
         printf '\\342\\202\\254 and \\360\\237\\230\\200 done\\n'; exit 3",
    ]);
    c.stdin(Stdio::null());
    let o = common::harness::run(c, None, T).await;
    assert_eq!(o.status.code(), Some(3), "kubectl: {}", stderr(&o));
    assert_eq!(stdout(&o), "first line\n€ and 😀 done\n");
    assert!(stderr(&o).starts_with("to stderr\n"), "{}", stderr(&o));
    let ended = r.ended("spdy-plain").await;
    assert_eq!(ended["protocol_path"], "relay_spdy", "{ended}");
    assert_eq!(ended["exit_code"], 3, "{ended}");
    assert_eq!(ended["status"], "exit 3", "{ended}");
    assert_eq!(ended["recording_error"], Value::Null, "{ended}");
    let recording = r.recording(&ended);
    let replayed = tokio::task::spawn_blocking(move || replay(&asciinema, &recording))
        .await
        .unwrap();
    // stdout and stderr, interleaved as they came.
    assert_eq!(replayed, "first line\nto stderr\n€ and 😀 done\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_spdy_interactive_session_records_its_window_sizes() {
    let (Some(k), Some(asciinema)) = (require_kubectl("1.28"), require_asciinema()) else {
        return;
    };
    let r = Recorded::start(&["--record", "required", "--record-stdin"]).await;
    let mut c = r.kubectl(&k);
    c.args(["exec", "-it", "spdy-tty", "--", "sh"]);
    let run = tokio::task::spawn_blocking(move || {
        run_script_on_pty(
            c,
            80,
            24,
            &[
                PtyStep::Wait(Duration::from_secs(1)),
                PtyStep::Type(b"stty size\n"),
                PtyStep::Wait(Duration::from_millis(700)),
                PtyStep::Resize(100, 30),
                PtyStep::Wait(Duration::from_millis(700)),
                PtyStep::Type(b"stty size; exit\n"),
            ],
            T,
        )
    })
    .await
    .unwrap();
    assert!(run.status.success(), "kubectl: {:?}", run.output);
    assert!(run.output.contains("24 80"), "{:?}", run.output);
    assert!(run.output.contains("30 100"), "{:?}", run.output);
    let ended = r.ended("spdy-tty").await;
    assert_eq!(ended["protocol_path"], "relay_spdy", "{ended}");
    assert_eq!(ended["exit_code"], 0, "{ended}");
    let recording = r.recording(&ended);
    let (header, events) = events(&recording);
    assert_eq!(
        (header["width"].as_u64(), header["height"].as_u64()),
        (Some(80), Some(24)),
        "{header}"
    );
    assert!(
        events.iter().any(|e| e[1] == "r" && e[2] == "100x30"),
        "{events:?}"
    );
    let typed: String = events
        .iter()
        .filter(|e| e[1] == "i")
        .map(|e| e[2].as_str().unwrap())
        .collect();
    assert_eq!(typed, "stty size\nstty size; exit\n");
    writer_rested_for_typing(&r);
    let replayed = tokio::task::spawn_blocking(move || replay(&asciinema, &recording))
        .await
        .unwrap();
    assert_eq!(replayed, run.output);
}

/// Runs `command` in `pod` over a relayed legacy WebSocket `protocol` with a raw client; what
/// a terminal would have shown (stdout and stderr in the order they came) and the status.
async fn raw_websocket_exec(
    r: &Recorded,
    pod: &str,
    protocol: &str,
    command: &[&str],
) -> (String, Vec<u8>) {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;

    let path = common::ws_client::exec_path(pod, command, false, true, true);
    let (mut ws, resp) = common::ws_client::connect(r.proxy.addr, &path, protocol)
        .await
        .unwrap();
    // Offered none, the kubelet names none (or names the empty one).
    let named = resp
        .headers()
        .get("sec-websocket-protocol")
        .map(|v| v.to_str().unwrap())
        .unwrap_or("");
    assert_eq!(named, protocol, "the relayed protocol");
    let base64 = protocol.contains("base64");
    let mut shown = Vec::new();
    let mut status = Vec::new();
    tokio::time::timeout(T, async {
        while let Some(Ok(msg)) = ws.next().await {
            let (channel, payload) = match msg {
                Message::Binary(b) if !base64 && !b.is_empty() => (b[0], b[1..].to_vec()),
                Message::Text(t) if base64 && !t.is_empty() => {
                    use base64::Engine;
                    let t = t.as_bytes();
                    let payload = base64::engine::general_purpose::STANDARD
                        .decode(&t[1..])
                        .unwrap();
                    (t[0] - b'0', payload)
                }
                Message::Close(_) => break,
                _ => continue,
            };
            match channel {
                1 | 2 => shown.extend_from_slice(&payload),
                3 => status.extend_from_slice(&payload),
                _ => {}
            }
        }
    })
    .await
    .unwrap();
    // The relay ends when both directions have: the client's too.
    drop(ws);
    (String::from_utf8(shown).unwrap(), status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_legacy_websocket_execs_replay_to_exactly_what_the_client_got() {
    let Some(asciinema) = require_asciinema() else {
        return;
    };
    let r = Recorded::start(&["--record", "required"]).await;
    let command = [
        "sh",
        "-c",
        "printf 'out one\\n'; sleep 0.2; printf 'err two\\n' >&2; sleep 0.2; \
         printf '\\342\\202\\254 three\\n'; exit 2",
    ];
    for (pod, protocol, exit_code) in [
        ("ws-v4", "v4.channel.k8s.io", Value::from(2)),
        ("ws-base64", "base64.channel.k8s.io", Value::Null),
        ("ws-none", "", Value::Null),
    ] {
        let (shown, status) = raw_websocket_exec(&r, pod, protocol, &command).await;
        assert_eq!(shown, "out one\nerr two\n€ three\n", "{protocol}");
        let ended = r.ended(pod).await;
        assert_eq!(ended["protocol_path"], "relay_websocket", "{ended}");
        if !protocol.is_empty() {
            assert_eq!(ended["protocol"], protocol, "{ended}");
        }
        assert_eq!(ended["recording_error"], Value::Null, "{ended}");
        // v4 sends a Status; the oldest protocols only a text message on failure.
        assert_eq!(ended["exit_code"], exit_code, "{ended}");
        assert!(!status.is_empty(), "{protocol}: no status");
        let recording = r.recording(&ended);
        let asciinema = asciinema.clone();
        let replayed = tokio::task::spawn_blocking(move || replay(&asciinema, &recording))
            .await
            .unwrap();
        assert_eq!(replayed, shown, "{protocol}");
    }
}

/// A tmpfs of `kib` KiB mounted on `dir` for as long as it lives: a disk that fills up.
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    /// Mounts it; `None` (and a loud failure in CI) where this user may not mount.
    fn mount(dir: &Path, kib: u32) -> Option<SmallDisk> {
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("run mount");
        if out.status.success() {
            return Some(SmallDisk {
                dir: dir.to_owned(),
            });
        }
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "a full disk needs a tmpfs mount (root), which failed: {why}"
        );
        eprintln!("skipped: cannot mount a tmpfs for a full disk: {why}");
        None
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .status();
    }
}

/// Every complete line of a recording cut short is still an asciicast line: the header, then
/// events. Returns the output it kept.
fn valid_up_to_the_cut(recording: &Path) -> String {
    let text = std::fs::read_to_string(recording).unwrap();
    let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    let mut lines = complete.lines();
    let header: Value = serde_json::from_str(lines.next().expect("a header")).unwrap();
    assert_eq!(header["version"], 2, "{header}");
    lines
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .filter(|e| e[1] == "o")
        .map(|e| e[2].as_str().unwrap().to_owned())
        .collect()
}

/// Output that fills the disk, then a command that would run on for a minute.
const FILLS_THE_DISK: &str = "seq 1 200000; sleep 60";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_that_fills_up_ends_required_sessions_and_not_best_effort_ones() {
    let (Some(k33), Some(k28)) = (require_kubectl("1.33"), require_kubectl("1.28")) else {
        return;
    };
    // The disk is far below the default reserve: this is about a disk that fills mid-session.
    let r = Recorded::start(&["--record", "required", "--record-min-free", "0"]).await;
    let Some(_disk) = SmallDisk::mount(&r.records, 256) else {
        return;
    };

    // Translated (kubectl 1.33): ended with a Status that says why, long before the command.
    let started = std::time::Instant::now();
    let mut c = r.kubectl(&k33);
    c.args(["exec", "full-disk", "--", "sh", "-c", FILLS_THE_DISK]);
    c.stdin(Stdio::null());
    let o = common::harness::run(c, None, T).await;
    assert!(!o.status.success(), "kubectl 1.33 exited 0");
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "ran until the command's end"
    );
    assert!(
        stderr(&o).contains("its recording failed") && stderr(&o).contains("No space left"),
        "kubectl 1.33: {}",
        stderr(&o)
    );
    let ended = r.ended("full-disk").await;
    assert_eq!(ended["outcome"], "recording_failed", "{ended}");
    assert_eq!(ended["protocol_path"], "translated", "{ended}");
    assert!(
        ended["recording_error"]
            .as_str()
            .is_some_and(|e| e.contains("No space left")),
        "{ended}"
    );
    // What was recorded before the disk filled stays a valid asciicast, and is what kubectl
    // printed first.
    let recording = PathBuf::from(ended["recording"].as_str().unwrap());
    let kept = valid_up_to_the_cut(&recording);
    assert!(!kept.is_empty(), "nothing recorded before the disk filled");
    assert_within_the_bound(&stdout(&o), &kept, "translated");
    std::fs::remove_file(&recording).unwrap();

    // Relayed SPDY (kubectl 1.28): the relay ends the session at a frame boundary with a
    // Status on the error stream; kubectl prints it and fails, the audit event says why.
    let started = std::time::Instant::now();
    let mut c = r.kubectl(&k28);
    c.args([
        "exec",
        "relayed-full-disk",
        "--",
        "sh",
        "-c",
        FILLS_THE_DISK,
    ]);
    c.stdin(Stdio::null());
    let o = common::harness::run(c, None, T).await;
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "ran until the command's end: {}",
        stderr(&o)
    );
    assert!(!o.status.success(), "kubectl 1.28 exited 0");
    assert_told_why(&stderr(&o), "kubectl 1.28 (relayed SPDY)");
    let ended = r.ended("relayed-full-disk").await;
    assert_eq!(ended["outcome"], "recording_failed", "{ended}");
    assert_eq!(ended["protocol_path"], "relay_spdy", "{ended}");
    assert!(
        ended["recording_error"]
            .as_str()
            .is_some_and(|e| e.contains("No space left")),
        "{ended}"
    );
    let recording = PathBuf::from(ended["recording"].as_str().unwrap());
    assert_within_the_bound(
        &stdout(&o),
        &valid_up_to_the_cut(&recording),
        "relayed SPDY",
    );
    std::fs::remove_file(&recording).unwrap();

    // With space again, the proxy records the next session: nothing stayed broken.
    let mut c = r.kubectl(&k33);
    c.args(["exec", "after", "--", "echo", "recorded"]);
    let o = common::harness::run(c, None, T).await;
    assert!(o.status.success(), "kubectl 1.33: {}", stderr(&o));
    let ended = r.ended("after").await;
    assert_eq!(ended["outcome"], "success", "{ended}");
    let metrics = r.proxy.metrics();
    assert!(
        metrics.contains(r#"kube_ws_proxy_recording_failures_total{cluster="default"} 2"#),
        "{metrics}"
    );
    // Both sessions ended for their recording, each counted under the path it had taken when
    // the disk filled.
    for kind in ["exec", "spdy_relay"] {
        let refused = format!(
            "kube_ws_proxy_sessions_total{{cluster=\"default\",kind=\"{kind}\",outcome=\"recording_failed\"}} 1"
        );
        assert!(metrics.contains(&refused), "{refused}\n{metrics}");
    }
}

/// How far a required session's output may run ahead of its recording (`AHEAD_BYTES`).
const BOUND: usize = 64 * 1024;

/// The client was shown what the recording holds, and at most [`BOUND`] bytes more. (The
/// recording may hold more than the client got: the lines of a write the disk cut short
/// that were never sent.)
fn assert_within_the_bound(shown: &str, kept: &str, path: &str) {
    assert!(
        shown.starts_with(kept) || kept.starts_with(shown),
        "{path}: the recording is not what the client was shown"
    );
    let ahead = shown.len().saturating_sub(kept.len());
    assert!(
        ahead <= BOUND,
        "{path}: the client got {ahead} bytes of output the recording lacks ({} shown, {} \
         recorded); the bound is {BOUND}",
        shown.len(),
        kept.len()
    );
    eprintln!(
        "{path}: {} bytes shown, {} recorded",
        shown.len(),
        kept.len()
    );
}

/// What a client printed for a session its recording ended: the proxy's Status message.
fn assert_told_why(printed: &str, client: &str) {
    assert!(
        printed.contains("kube-ws-proxy ended the session: its recording failed")
            && printed.contains("No space left")
            && printed.contains("--record=required"),
        "{client}: {printed}"
    );
}

/// The `ended` event of a session its full disk ended: why, and on which path.
fn assert_ended_by_the_disk(ended: &Value, path: &str) {
    assert_eq!(ended["outcome"], "recording_failed", "{ended}");
    assert_eq!(ended["protocol_path"], path, "{ended}");
    assert!(
        ended["recording_error"]
            .as_str()
            .is_some_and(|e| e.contains("No space left")),
        "{ended}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_websocket_sessions_stay_within_the_bound_of_a_disk_that_fills_up() {
    let r = Recorded::start(&["--record", "required", "--record-min-free", "0"]).await;
    let Some(_disk) = SmallDisk::mount(&r.records, 256) else {
        return;
    };
    let started = std::time::Instant::now();
    let command = ["sh", "-c", FILLS_THE_DISK];
    let (shown, status) =
        raw_websocket_exec(&r, "v4-full-disk", "v4.channel.k8s.io", &command).await;
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "ran until the command's end"
    );
    // The relay ends the session between two frames with the Status kube-apiserver sends
    // for a failed stream, on the error channel.
    let status: Value = serde_json::from_slice(&status)
        .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&status)));
    assert_eq!(status["kind"], "Status", "{status}");
    assert_eq!(status["apiVersion"], "v1", "{status}");
    assert_eq!(status["status"], "Failure", "{status}");
    assert_eq!(status["reason"], "InternalError", "{status}");
    assert_eq!(status["code"], 500, "{status}");
    assert_told_why(status["message"].as_str().unwrap_or_default(), "raw v4");
    let ended = r.ended("v4-full-disk").await;
    assert_ended_by_the_disk(&ended, "relay_websocket");
    let recording = PathBuf::from(ended["recording"].as_str().unwrap());
    assert_within_the_bound(&shown, &valid_up_to_the_cut(&recording), "relayed v4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passed_through_v5_sessions_stay_within_the_bound_of_a_disk_that_fills_up() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let r = Recorded::start_with(
        SimStreaming::New,
        &["--record", "required", "--record-min-free", "0"],
    )
    .await;
    let Some(_disk) = SmallDisk::mount(&r.records, 256) else {
        return;
    };
    let started = std::time::Instant::now();
    let mut c = r.kubectl(&k33);
    c.args(["exec", "v5-full-disk", "--", "sh", "-c", FILLS_THE_DISK]);
    c.stdin(Stdio::null());
    let o = common::harness::run(c, None, T).await;
    assert!(!o.status.success(), "kubectl 1.33 exited 0");
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "ran until the command's end"
    );
    assert_told_why(&stderr(&o), "kubectl 1.33 (passed-through v5)");
    let ended = r.ended("v5-full-disk").await;
    assert_ended_by_the_disk(&ended, "pass_through");
    let recording = PathBuf::from(ended["recording"].as_str().unwrap());
    assert_within_the_bound(
        &stdout(&o),
        &valid_up_to_the_cut(&recording),
        "passed-through v5",
    );
}

/// Fills the filesystem of `dir` to its last byte.
fn fill(dir: &Path) {
    use std::io::Write;
    let mut filler = std::fs::File::create(dir.join("filler")).unwrap();
    let block = vec![0u8; 4096];
    while filler.write_all(&block).is_ok() {}
    // The last page may have taken a partial block: nothing at all is left.
    while filler.write_all(b"x").is_ok() {}
}

/// kubectl 1.33 (WebSocket) and 1.28 (SPDY) run `echo never` on `pods`: each is refused before
/// anything goes upstream, with a Status and an audit event saying `why` (and, as no path was
/// taken under `--upstream-streaming auto`, the path `auto`).
async fn refused_at_the_start(r: &Recorded, pods: [&str; 2], why: &str) {
    let (Some(k33), Some(k28)) = (require_kubectl("1.33"), require_kubectl("1.28")) else {
        return;
    };
    for (k, pod, path) in [(&k33, pods[0], "auto"), (&k28, pods[1], "auto")] {
        let mut c = r.kubectl(k);
        c.args(["exec", pod, "--", "echo", "never"]);
        c.stdin(Stdio::null());
        let o = common::harness::run(c, None, T).await;
        assert!(!o.status.success(), "{pod}");
        assert_eq!(stdout(&o), "", "{pod}: the command ran");
        assert!(
            stderr(&o).contains("recordings are required") && stderr(&o).contains(why),
            "{pod}: {}",
            stderr(&o)
        );
        let ended = r.ended(pod).await;
        assert_eq!(ended["outcome"], "recording_failed", "{ended}");
        assert_eq!(ended["protocol_path"], path, "{ended}");
        assert!(
            ended["recording_error"]
                .as_str()
                .is_some_and(|e| e.contains(why)),
            "{ended}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_recordings_do_not_start_below_the_reserve_or_on_a_full_disk() {
    // A 1 MiB disk is below a 2 MiB reserve, though a recording would still fit.
    let r = Recorded::start(&["--record", "required", "--record-min-free", "2Mi"]).await;
    let Some(_disk) = SmallDisk::mount(&r.records, 1024) else {
        return;
    };
    refused_at_the_start(&r, ["low", "relayed-low"], "--record-min-free").await;
    assert_eq!(std::fs::read_dir(&r.records).unwrap().count(), 0);

    // A full disk still creates files; their first byte is refused.
    let r = Recorded::start(&["--record", "required", "--record-min-free", "0"]).await;
    let Some(_disk) = SmallDisk::mount(&r.records, 64) else {
        return;
    };
    fill(&r.records);
    refused_at_the_start(&r, ["full", "relayed-full"], "No space left").await;
    // No empty recording is left behind to mislead.
    assert_eq!(std::fs::read_dir(&r.records).unwrap().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_effort_sessions_outlive_a_full_disk() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let r = Recorded::start(&["--record", "best-effort", "--record-min-free", "0"]).await;
    let Some(_disk) = SmallDisk::mount(&r.records, 256) else {
        return;
    };
    let mut c = r.kubectl(&k33);
    c.args(["exec", "full-disk", "--", "seq", "1", "200000"]);
    c.stdin(Stdio::null());
    let o = common::harness::run(c, None, T).await;
    assert!(o.status.success(), "kubectl 1.33: {}", stderr(&o));
    let expected: String = (1..=200_000).map(|i| format!("{i}\n")).collect();
    assert!(stdout(&o) == expected, "the output was cut");
    let ended = r.ended("full-disk").await;
    assert_eq!(ended["outcome"], "success", "{ended}");
    assert!(
        ended["recording_error"]
            .as_str()
            .is_some_and(|e| e.contains("No space left")),
        "{ended}"
    );
    let recording = PathBuf::from(ended["recording"].as_str().unwrap());
    let kept = valid_up_to_the_cut(&recording);
    assert!(!kept.is_empty() && expected.starts_with(&kept));
}

#[test]
fn only_kubectls_ready_message_race_line_is_taken_out_of_what_it_showed() {
    let raced = "E1126 06:25:20.064338   25661 websocket.go:297] Unknown stream id 1, discarding message\n# stty size\r\n24 80\r\n";
    assert_eq!(
        without_ready_message_race(raced),
        "# stty size\r\n24 80\r\n"
    );
    // Another stream's drop is a real loss and stays visible, as does anything else.
    for kept in [
        "E1126 06:25:20.064338   25661 websocket.go:297] Unknown stream id 2, discarding message\n",
        "# echo '] Unknown stream id 1, discarding message'\r\n",
        "# stty size\r\n24 80\r\n",
    ] {
        assert_eq!(without_ready_message_race(kept), kept);
    }
}

/// Bulk output on every recorded path, best-effort, while the proxy's recording writer is
/// starved of CPU (as on a machine whose cores are busy): the moment each session's `ended`
/// event is in the audit log, its recording holds all the output the client got, and its end.
/// The session's end waits for its recording's file; before it did, the event was written
/// while the writer still had the session's output queued, and a reader who trusted the event
/// found the recording short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_path_completes_its_recording_before_its_ended_event() {
    let (Some(k33), Some(k28)) = (require_kubectl("1.33"), require_kubectl("1.28")) else {
        return;
    };
    let flags = ["--record", "best-effort", "--record-min-free", "0"];
    let seq = ["seq", "1", BULK_LINES];
    let kubectl_exec = |r: &Recorded, k: &Path, pod: &str| {
        let mut c = r.kubectl(k);
        c.args(["exec", pod, "--"]).args(seq);
        c.stdin(Stdio::null());
        common::harness::run(c, None, T)
    };

    // An SPDY-only cluster: translated (kubectl 1.33), relayed SPDY (kubectl 1.28), relayed
    // legacy WebSocket (a raw v4 client), several of each at once.
    let r = Recorded::start(&flags).await;
    let pods: Vec<String> = (0..9).map(|i| format!("bulk-{i}")).collect();
    let (rr, k33r, k28r, run_kubectl) = (&r, &k33, &k28, &kubectl_exec);
    let runs = pods.iter().enumerate().map(|(i, pod)| async move {
        match i % 3 {
            0 => stdout(&run_kubectl(rr, k33r, pod).await),
            1 => stdout(&run_kubectl(rr, k28r, pod).await),
            _ => {
                raw_websocket_exec(rr, pod, "v4.channel.k8s.io", &seq)
                    .await
                    .0
            }
        }
    });
    let shown = while_the_writer_starves(&r, &pods, futures_util::future::join_all(runs)).await;
    for (i, kept) in shown.iter().enumerate() {
        let path = ["translated", "relay_spdy", "relay_websocket"][i % 3];
        assert_recorded_whole(&r, &pods[i], path, kept).await;
    }

    // A new cluster: v5 passed through (kubectl 1.33); and one behind a gateway that drops
    // SPDY: kubectl 1.28's SPDY reverse-translated.
    for (streaming, k, path) in [
        (SimStreaming::New, &k33, "pass_through"),
        (SimStreaming::WebSocketOnly, &k28, "reverse_translated"),
    ] {
        let r = Recorded::start_with(streaming, &flags).await;
        let pods = vec![format!("bulk-{path}")];
        let client = async { vec![stdout(&kubectl_exec(&r, k, &pods[0]).await)] };
        let shown = while_the_writer_starves(&r, &pods, client).await;
        assert_recorded_whole(&r, &pods[0], path, &shown[0]).await;
    }
}

/// How many lines of `seq` the sessions of [`every_path_completes_its_recording_before_its_ended_event`]
/// print: about 1 MiB each, all of them together within the recordings' 16 MiB budget, so that
/// none waits for the starved writer while it runs.
const BULK_LINES: &str = "150000";

/// What `seq 1 BULK_LINES` prints.
fn bulk_output() -> String {
    (1..=BULK_LINES.parse::<u32>().unwrap())
        .map(|i| format!("{i}\n"))
        .collect()
}

/// Runs `clients` (sessions on `pods`, giving what each client was shown) while the proxy's
/// recording writer is starved, then lets it run; each client's output checked against
/// what its session's recording held the moment its `ended` event was written.
async fn while_the_writer_starves(
    r: &Recorded,
    pods: &[String],
    clients: impl std::future::Future<Output = Vec<String>>,
) -> Vec<String> {
    let watcher = tokio::spawn(watch_ended_recordings(r.audit.clone(), pods.to_vec()));
    let starved = StarvedWriter::start(r.proxy.pid());
    let shown = clients.await;
    drop(starved);
    let kept = watcher.await.unwrap();
    let expected = bulk_output();
    for ((pod, shown), kept) in pods.iter().zip(&shown).zip(&kept) {
        assert!(
            *shown == expected,
            "{pod}: the client got {} bytes",
            shown.len()
        );
        assert!(
            *kept == expected,
            "{pod}: its recording held {} of {} bytes when its ended event was written",
            kept.len(),
            expected.len()
        );
    }
    kept
}

/// The session on `pod` took `path`, and its `ended` event (read again, now that all is
/// written) names a whole recording of `kept`, without an error.
async fn assert_recorded_whole(r: &Recorded, pod: &str, path: &str, kept: &str) {
    let ended = r.ended(pod).await;
    assert_eq!(ended["protocol_path"], path, "{ended}");
    assert_eq!(ended["recording_error"], Value::Null, "{ended}");
    let (_, events) = events(&r.recording(&ended));
    let whole: String = events
        .iter()
        .filter(|e| e[1] == "o")
        .map(|e| e[2].as_str().unwrap())
        .collect();
    assert_eq!(whole, kept, "{path}");
}

/// Reads the audit log at `audit` every millisecond until each of `pods`' sessions has ended;
/// the output each one's recording held the moment its `ended` event was seen, in `pods`'
/// order.
async fn watch_ended_recordings(audit: PathBuf, pods: Vec<String>) -> Vec<String> {
    let mut kept: Vec<Option<String>> = vec![None; pods.len()];
    let deadline = tokio::time::Instant::now() + T;
    while kept.iter().any(Option::is_none) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all ended: {kept:?}"
        );
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        for ended in text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["stage"] == "ended")
        {
            let Some(i) = pods.iter().position(|p| ended["pod"] == p.as_str()) else {
                continue;
            };
            if kept[i].is_some() {
                continue;
            }
            let text = std::fs::read_to_string(ended["recording"].as_str().unwrap()).unwrap();
            kept[i] = Some(
                text.lines()
                    .skip(1)
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .filter(|e| e[1] == "o")
                    .map(|e| e[2].as_str().unwrap().to_owned())
                    .collect(),
            );
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    kept.into_iter().map(Option::unwrap).collect()
}

/// The recording writer thread of the proxy `pid` starved of CPU while it lives, as on a
/// machine whose cores are all busy: the proxy is pinned to one CPU, its writer thread runs
/// there under `SCHED_IDLE`, and a busy loop takes that CPU. Dropping it ends the busy loop
/// (the writer then catches up).
struct StarvedWriter {
    hog: std::process::Child,
}

impl StarvedWriter {
    fn start(pid: u32) -> StarvedWriter {
        let pin = std::process::Command::new("taskset")
            .args(["-a", "-p", "-c", "0", &pid.to_string()])
            .output()
            .expect("run taskset");
        assert!(
            pin.status.success(),
            "taskset: {}",
            String::from_utf8_lossy(&pin.stderr)
        );
        // The writer thread may still be starting on a loaded machine: look for it a while.
        let find_writer = || {
            std::fs::read_dir(format!("/proc/{pid}/task"))
                .unwrap()
                .filter_map(|t| t.ok().map(|t| t.path()))
                .find(|t| {
                    std::fs::read_to_string(t.join("comm")).is_ok_and(|c| c.trim() == "recordings")
                })
        };
        let mut writer = find_writer();
        for _ in 0..100 {
            if writer.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
            writer = find_writer();
        }
        let writer = writer.expect("the proxy's recording writer thread");
        let tid = writer.file_name().unwrap().to_str().unwrap().to_owned();
        let idle = std::process::Command::new("chrt")
            .args(["--idle", "-p", "0", &tid])
            .output()
            .expect("run chrt");
        assert!(
            idle.status.success(),
            "chrt: {}",
            String::from_utf8_lossy(&idle.stderr)
        );
        let hog = std::process::Command::new("taskset")
            .args(["-c", "0", "sh", "-c", "while :; do :; done"])
            .spawn()
            .expect("a busy loop");
        StarvedWriter { hog }
    }
}

impl Drop for StarvedWriter {
    fn drop(&mut self) {
        let _ = self.hog.kill();
        let _ = self.hog.wait();
    }
}
