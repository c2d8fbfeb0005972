//! The reverse direction (#16): kubectl ≤ 1.30 (SPDY) through kube-ws-proxy into a cluster
//! whose path takes WebSockets only (the simulated `WebSocketOnly` cluster answers every
//! `Upgrade: SPDY/3.1` with 400). With `--upstream-streaming websocket` the proxy terminates
//! the client's SPDY and speaks `v5.channel.k8s.io` upstream (exec, attach, cp), and carries
//! port-forward's SPDY inside the upstream's `SPDY/3.1+portforward.k8s.io` tunnel. The clients
//! go straight to the proxy: they speak SPDY, which the users' gateway would drop.
//!
//! kubectl 1.30 would try WebSocket first; it is pinned to SPDY here
//! (`KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false`, `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`), as an
//! old kubectl or a user who turned it off behaves.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::clients::require_kubectl;
use common::harness::{random_file, run, sha256_hex, stderr, stdout, Harness};
use common::pod_server::{send_pattern, verify_pattern, PodServer};
use common::pty::{run_script_on_pty, PtyStep};
use kube_ws_proxy::sim::{SimConfig, SimEvent, SimStreaming, Transport};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const T: Duration = Duration::from_secs(120);

async fn websocket_only() -> Harness {
    websocket_only_with("websocket").await
}

/// The WebSocket-only cluster with `--upstream-streaming setting`.
async fn websocket_only_with(setting: &str) -> Harness {
    Harness::start_with(
        SimConfig {
            streaming: SimStreaming::WebSocketOnly,
            ..SimConfig::default()
        },
        &["--upstream-streaming", setting],
    )
    .await
}

/// A kubectl command that speaks SPDY whatever its version.
fn spdy_kubectl(h: &Harness, kubectl: &Path) -> Command {
    let mut c = h.kubectl(kubectl, &h.direct);
    c.env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")
        .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false");
    c
}

/// Every exec/attach/port-forward session the cluster saw went over WebSocket (none over
/// SPDY, which it would have refused anyway), and there was at least one.
fn assert_upstream_websocket(h: &Harness) {
    let sessions: Vec<_> = h
        .sim
        .events()
        .into_iter()
        .filter_map(|e| match e {
            SimEvent::SessionStarted {
                transport,
                protocol,
                ..
            } => Some((transport, protocol)),
            _ => None,
        })
        .collect();
    assert!(!sessions.is_empty(), "no session reached the cluster");
    for (transport, protocol) in sessions {
        assert_eq!(transport, Transport::WebSocket, "{protocol}");
        assert!(
            protocol == "v5.channel.k8s.io" || protocol == "SPDY/3.1+portforward.k8s.io",
            "upstream protocol {protocol}"
        );
    }
}

async fn exec_suite(h: &Harness, kubectl: &Path) {
    let k = || spdy_kubectl(h, kubectl);

    let mut c = k();
    c.args(["exec", "web", "--", "echo", "hello"]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "exec echo failed: {}", stderr(&o));
    assert_eq!(stdout(&o), "hello\n");

    for code in [0, 1, 3, 127, 255] {
        let mut c = k();
        c.args(["exec", "web", "--", "sh", "-c", &format!("exit {code}")]);
        let o = run(c, None, T).await;
        assert_eq!(o.status.code(), Some(code), "exit {code}: {}", stderr(&o));
    }

    let mut c = k();
    c.args([
        "exec",
        "web",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]);
    let o = run(c, None, T).await;
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert_eq!(stdout(&o), "out\n");
    assert!(stderr(&o).contains("err\n"), "stderr: {}", stderr(&o));

    // stdin EOF: `cat` only ends because the client's half-close reaches the process.
    let mut c = k();
    c.args(["exec", "-i", "web", "--", "sh", "-c", "cat; echo done"]);
    let o = run(c, Some(b"in\n".to_vec()), T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "in\ndone\n");

    let mut c = k();
    c.args(["exec", "-i", "web", "--", "wc", "-c"]);
    let o = run(c, Some(vec![b'x'; 5_000_000]), T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "5000000");

    // A command that cannot start: the upstream's InternalError, printed, exit 1.
    let mut c = k();
    c.args(["exec", "web", "--", "no-such-command"]);
    let o = run(c, None, T).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("executable file not found"),
        "{}",
        stderr(&o)
    );
}

async fn tty_with_resize(h: &Harness, kubectl: &Path) {
    let mut c = spdy_kubectl(h, kubectl);
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
                PtyStep::Type(b"stty size; exit 4\n"),
            ],
            T,
        )
    })
    .await
    .unwrap();
    assert_eq!(run.status.code(), Some(4), "kubectl: {:?}", run.output);
    assert!(run.output.contains("24 80"), "{:?}", run.output);
    assert!(run.output.contains("30 100"), "{:?}", run.output);
}

async fn attach(h: &Harness, kubectl: &Path) {
    let mut c = spdy_kubectl(h, kubectl);
    c.args(["attach", "-i", "attached", "-c", "main"]);
    let mut c = tokio::process::Command::from(c);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let seen = tokio::time::timeout(T, async {
        // The attach target only sees input once the session is up; resend until echoed.
        loop {
            stdin.write_all(b"ping-through-attach\n").await.unwrap();
            match tokio::time::timeout(Duration::from_millis(500), lines.next_line()).await {
                Ok(Ok(Some(line))) if line.contains("ping-through-attach") => return line,
                Ok(Ok(None)) => panic!("attach ended early"),
                _ => {}
            }
        }
    })
    .await
    .expect("attach output");
    assert!(seen.contains("attached: ping-through-attach"), "{seen}");
    let _ = child.kill().await;
}

async fn copy_files(h: &Harness, kubectl: &Path) {
    let pod = "files";
    let dir = h.sim.pod_dir("default", pod);
    std::fs::create_dir_all(&dir).unwrap();
    let name = "blob.bin";
    let local = h.dir.path().join(name);
    let sha = random_file(&local, 20_000_000, 5);
    let mut c = spdy_kubectl(h, kubectl);
    c.current_dir(h.dir.path())
        .args(["cp", name, &format!("{pod}:{name}")]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "cp up: {}", stderr(&o));
    assert_eq!(sha256_hex(&std::fs::read(dir.join(name)).unwrap()), sha);
    let mut c = spdy_kubectl(h, kubectl);
    c.current_dir(h.dir.path())
        .args(["cp", &format!("{pod}:{name}"), "back.bin"]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "cp down: {}", stderr(&o));
    let back = std::fs::read(h.dir.path().join("back.bin")).unwrap();
    assert_eq!(sha256_hex(&back), sha, "cp down differs");
}

/// `kubectl port-forward` to `remote`; returns the child and the local port.
async fn port_forward(h: &Harness, kubectl: &Path, remote: u16) -> (tokio::process::Child, u16) {
    let mut c = spdy_kubectl(h, kubectl);
    c.args(["port-forward", "--address", "127.0.0.1", "pod/web"])
        .arg(format!(":{remote}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut c = tokio::process::Command::from(c);
    c.kill_on_drop(true);
    let mut child = c.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let local = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let line = out.next_line().await.unwrap().expect("port-forward output");
            // "Forwarding from 127.0.0.1:40123 -> 8080"
            if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                let (l, _) = rest.split_once(" -> ").unwrap();
                return l.trim().parse::<u16>().unwrap();
            }
        }
    })
    .await
    .expect("port-forward ready");
    tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
    (child, local)
}

async fn port_forward_suite(h: &Harness, kubectl: &Path) {
    let pod = PodServer::commands().await;
    let (mut child, local) = port_forward(h, kubectl, pod.port).await;
    // Several connections through one session, each way, byte-exact.
    for round in 0..3u64 {
        let len = (8 << 20) + round * 12_345;
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", local))
            .await
            .unwrap();
        s.write_u8(b'D').await.unwrap();
        s.write_u64_le(len).await.unwrap();
        assert_eq!(verify_pattern(&mut s, len).await.unwrap(), None, "download");

        let s = tokio::net::TcpStream::connect(("127.0.0.1", local))
            .await
            .unwrap();
        let (mut r, mut w) = s.into_split();
        w.write_u8(b'U').await.unwrap();
        w.write_u64_le(len).await.unwrap();
        send_pattern(&mut w, len).await.unwrap();
        let mut answer = String::new();
        r.read_to_string(&mut answer).await.unwrap();
        assert_eq!(answer, "OK", "upload");
    }
    assert!(pod.accepted() >= 6);
    assert!(
        child.try_wait().unwrap().is_none(),
        "kubectl port-forward quit"
    );
    let _ = child.kill().await;
}

macro_rules! reverse_suite {
    ($modname:ident, $minor:literal, $setting:literal) => {
        mod $modname {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn exec_exit_codes_stdin_eof_and_tty_resize() {
                let Some(k) = require_kubectl($minor) else {
                    return;
                };
                let h = websocket_only_with($setting).await;
                exec_suite(&h, &k).await;
                tty_with_resize(&h, &k).await;
                assert_upstream_websocket(&h);
                assert!(h
                    .proxy
                    .wait_for_log("SPDY client, WebSocket upstream", T)
                    .is_some());
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn attach_cp_and_port_forward() {
                let Some(k) = require_kubectl($minor) else {
                    return;
                };
                let h = websocket_only_with($setting).await;
                attach(&h, &k).await;
                copy_files(&h, &k).await;
                port_forward_suite(&h, &k).await;
                assert_upstream_websocket(&h);
            }
        }
    };
}

reverse_suite!(kubectl_1_27, "1.27", "websocket");
reverse_suite!(kubectl_1_28, "1.28", "websocket");
reverse_suite!(kubectl_1_30, "1.30", "websocket");
// `auto` finds out (the cluster's 400 to the SPDY upgrade) and then does the same.
reverse_suite!(kubectl_1_27_auto, "1.27", "auto");
reverse_suite!(kubectl_1_30_auto, "1.30", "auto");

/// `auto` pays the SPDY refusal once per family: the first exec and the first port-forward are
/// relayed as SPDY, refused by the path, and translated; later ones go straight to the reverse
/// translator. The decision is logged once per family.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_remembers_a_path_that_refuses_spdy() {
    let Some(k) = require_kubectl("1.28") else {
        return;
    };
    let h = websocket_only_with("auto").await;
    let spdy_upgrades = |h: &Harness| {
        h.sim
            .requests()
            .iter()
            .filter(|r| {
                r.header("upgrade")
                    .is_some_and(|u| u.eq_ignore_ascii_case("SPDY/3.1"))
            })
            .count()
    };
    for i in 0..3 {
        let mut c = spdy_kubectl(&h, &k);
        c.args(["exec", "web", "--", "echo", &format!("session {i}")]);
        let o = run(c, None, T).await;
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(stdout(&o), format!("session {i}\n"));
    }
    assert_eq!(spdy_upgrades(&h), 1, "the SPDY refusal was paid again");
    for _ in 0..2 {
        let pod = PodServer::echo().await;
        let (mut child, local) = port_forward(&h, &k, pod.port).await;
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", local))
            .await
            .unwrap();
        conn.write_all(b"remembered\n").await.unwrap();
        let mut line = vec![0u8; "remembered\n".len()];
        tokio::time::timeout(T, conn.read_exact(&mut line))
            .await
            .expect("port-forward echo")
            .unwrap();
        assert_eq!(line, b"remembered\n");
        let _ = child.kill().await;
    }
    assert_eq!(spdy_upgrades(&h), 2, "one SPDY refusal per family");
    assert_upstream_websocket(&h);
    let logs = h.proxy.log_lines();
    let decided = logs
        .iter()
        .filter(|l| l.contains("upstream refuses SPDY: translating SPDY clients to WebSocket"))
        .count();
    assert_eq!(decided, 2, "one decision per family: {logs:#?}");
}

/// An upstream refusal reaches the SPDY client as the cluster's own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_28_sees_the_clusters_refusal() {
    let Some(k) = require_kubectl("1.28") else {
        return;
    };
    let h = websocket_only().await;
    let mut c = spdy_kubectl(&h, &k);
    c.args(["exec", "forbidden-pod", "--", "true"]);
    let o = run(c, None, T).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("forbidden"), "{}", stderr(&o));
}

/// Against a SPDY-only cluster nothing changes by default: kubectl 1.28's SPDY is relayed byte
/// for byte, and the cluster sees SPDY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_28_against_a_spdy_only_cluster_is_still_relayed() {
    let Some(k) = require_kubectl("1.28") else {
        return;
    };
    let h = Harness::start_with(SimConfig::default(), &[]).await;
    let mut c = spdy_kubectl(&h, &k);
    c.args(["exec", "-i", "web", "--", "sh", "-c", "cat; exit 3"]);
    let o = run(c, Some(b"relayed\n".to_vec()), T).await;
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert_eq!(stdout(&o), "relayed\n");
    assert!(h
        .proxy
        .wait_for_log("relayed upgrade finished", T)
        .is_some_and(|l| l.contains("spdy_relay")));
    assert!(h.sim.events().iter().any(|e| matches!(
        e,
        SimEvent::SessionStarted {
            transport: Transport::Spdy,
            ..
        }
    )));
}

/// The reverse path is audited and recorded like the others: the ended events name it
/// (`reverse_translated`), carry the exit code and the port-forward's connections, and the
/// recording holds what kubectl printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_28_sessions_are_audited_and_recorded() {
    let Some(k) = require_kubectl("1.28") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.log");
    let records = dir.path().join("recordings");
    std::fs::create_dir(&records).unwrap();
    let h = Harness::start_with(
        SimConfig {
            streaming: SimStreaming::WebSocketOnly,
            ..SimConfig::default()
        },
        &[
            "--upstream-streaming",
            "websocket",
            "--audit-log",
            audit.to_str().unwrap(),
            "--record",
            "best-effort",
            "--record-dir",
            records.to_str().unwrap(),
        ],
    )
    .await;
    let mut c = spdy_kubectl(&h, &k);
    c.args([
        "exec",
        "audited",
        "--",
        "sh",
        "-c",
        "echo hi-reverse; exit 3",
    ]);
    let o = run(c, None, T).await;
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let ended = common::replay::ended_event(&audit, "audited", "reverse_translated").await;
    assert_eq!(ended["exit_code"], 3, "{ended}");
    assert_eq!(ended["outcome"], "non_zero_exit", "{ended}");
    let recording = std::fs::read_dir(&records)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .find(|r| r.contains("hi-reverse"));
    assert!(recording.is_some(), "no recording holds the output");

    let pod = PodServer::echo().await;
    let (mut child, local) = port_forward(&h, &k, pod.port).await;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", local))
        .await
        .unwrap();
    s.write_all(b"echo through the reverse tunnel")
        .await
        .unwrap();
    let mut back = [0u8; 31];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"echo through the reverse tunnel");
    drop(s);
    // The connection is listed once kubectl's session ends.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = child.kill().await;
    let ended = common::replay::ended_event(&audit, "web", "reverse_translated").await;
    assert_eq!(ended["verb"], "portforward", "{ended}");
    let connections = ended["connections"].as_array().expect("connections");
    assert_eq!(connections.len(), 1, "{ended}");
    assert_eq!(connections[0]["port"], pod.port, "{ended}");
    assert_eq!(connections[0]["bytes_in"], 31, "{ended}");
}
