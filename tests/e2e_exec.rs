//! kubectl exec / attach / cp through kube-ws-proxy into the simulated SPDY-only cluster.
//!
//! kubectl 1.31+ go through the SPDY-dropping middlebox, so only a working WebSocket→SPDY
//! translation can pass; kubectl 1.28 (an SPDY client) goes straight to the proxy and exercises
//! the relay path.

mod common;

use std::path::Path;
use std::time::Duration;

use common::clients::require_kubectl;
use common::harness::{random_file, run, sha256_hex, stderr, stdout, Harness};

const T: Duration = Duration::from_secs(120);

/// Asserts that kubectl really used WebSocket through the gateway (no SPDY fallback).
fn assert_websocket_only(h: &Harness) {
    assert!(
        h.middlebox.websockets() > 0,
        "no WebSocket upgrade reached the proxy"
    );
    assert_eq!(h.middlebox.dropped(), 0, "kubectl fell back to SPDY");
}

async fn basics(h: &Harness, kubectl: &Path, kubeconfig: &Path) {
    let k = || h.kubectl(kubectl, kubeconfig);

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
    c.args(["exec", "web", "--", "sh", "-c", "echo out; echo err >&2"]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "out\n");
    assert!(stderr(&o).contains("err\n"), "stderr: {}", stderr(&o));

    let mut c = k();
    c.args(["exec", "-i", "web", "--", "sh", "-c", "cat; echo done"]);
    let o = run(c, Some(b"in\n".to_vec()), T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "in\ndone\n");
}

async fn tty_size(h: &Harness, kubectl: &Path, kubeconfig: &Path) {
    let mut c = h.kubectl(kubectl, kubeconfig);
    c.args(["exec", "-it", "web", "--", "stty", "size"]);
    let r = tokio::task::spawn_blocking(move || {
        common::pty::run_on_pty(c, 100, 40, b"", Duration::from_millis(0), T)
    })
    .await
    .unwrap();
    assert!(r.status.success(), "exec -it failed: {}", r.output);
    assert!(r.output.contains("40 100"), "stty size saw: {:?}", r.output);
}

async fn big_transfers(h: &Harness, kubectl: &Path, kubeconfig: &Path) {
    let pod = "bulk";
    let dir = h.sim.pod_dir("default", pod);
    std::fs::create_dir_all(&dir).unwrap();
    let down_sha = random_file(&dir.join("down.bin"), 200_000_000, 7);
    let mut c = h.kubectl(kubectl, kubeconfig);
    c.args(["exec", pod, "--", "cat", "down.bin"]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout.len(), 200_000_000);
    assert_eq!(sha256_hex(&o.stdout), down_sha, "200 MB of stdout differ");

    let up = h.dir.path().join("up.bin");
    let up_sha = random_file(&up, 100_000_000, 11);
    let mut c = h.kubectl(kubectl, kubeconfig);
    c.args([
        "exec",
        "-i",
        pod,
        "--",
        "sh",
        "-c",
        "cat > up.bin; echo stored",
    ]);
    let o = run(c, Some(std::fs::read(&up).unwrap()), T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "stored\n");
    let stored = std::fs::read(dir.join("up.bin")).unwrap();
    assert_eq!(sha256_hex(&stored), up_sha, "100 MB of stdin differ");
}

async fn copy_files(h: &Harness, kubectl: &Path, kubeconfig: &Path) {
    let pod = "files";
    let dir = h.sim.pod_dir("default", pod);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, len) in [("small.bin", 3_000_000usize), ("large.bin", 100_000_000)] {
        let local = h.dir.path().join(name);
        let sha = random_file(&local, len, len as u64);
        let mut c = h.kubectl(kubectl, kubeconfig);
        c.current_dir(h.dir.path())
            .args(["cp", name, &format!("{pod}:{name}")]);
        let o = run(c, None, T).await;
        assert!(o.status.success(), "cp up {name}: {}", stderr(&o));
        let uploaded = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(sha256_hex(&uploaded), sha, "cp up {name} differs");

        let back = format!("back-{name}");
        let mut c = h.kubectl(kubectl, kubeconfig);
        c.current_dir(h.dir.path())
            .args(["cp", &format!("{pod}:{name}"), &back]);
        let o = run(c, None, T).await;
        assert!(o.status.success(), "cp down {name}: {}", stderr(&o));
        let downloaded = std::fs::read(h.dir.path().join(&back)).unwrap();
        assert_eq!(sha256_hex(&downloaded), sha, "cp down {name} differs");
    }
}

async fn attach(h: &Harness, kubectl: &Path, kubeconfig: &Path) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let c = {
        let mut c = h.kubectl(kubectl, kubeconfig);
        c.args(["attach", "-i", "attached", "-c", "main"]);
        c
    };
    let mut c = tokio::process::Command::from(c);
    c.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
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
    assert!(seen.contains("ping-through-attach"));
    let _ = child.kill().await;
}

macro_rules! websocket_suite {
    ($modname:ident, $minor:literal) => {
        mod $modname {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn exec_basics() {
                let Some(k) = require_kubectl($minor) else {
                    return;
                };
                let h = Harness::start().await;
                basics(&h, &k, &h.via_gateway).await;
                assert_websocket_only(&h);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn exec_tty_size() {
                let Some(k) = require_kubectl($minor) else {
                    return;
                };
                let h = Harness::start().await;
                tty_size(&h, &k, &h.via_gateway).await;
                assert_websocket_only(&h);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn exec_big_transfers() {
                let Some(k) = require_kubectl($minor) else {
                    return;
                };
                let h = Harness::start().await;
                big_transfers(&h, &k, &h.via_gateway).await;
                assert_websocket_only(&h);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cp_up_and_down() {
                let Some(k) = require_kubectl($minor) else {
                    return;
                };
                let h = Harness::start().await;
                copy_files(&h, &k, &h.via_gateway).await;
                assert_websocket_only(&h);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn attach_stdin() {
                let Some(k) = require_kubectl($minor) else {
                    return;
                };
                let h = Harness::start().await;
                attach(&h, &k, &h.via_gateway).await;
                assert_websocket_only(&h);
            }
        }
    };
}

websocket_suite!(kubectl_1_31, "1.31");
websocket_suite!(kubectl_1_32, "1.32");
websocket_suite!(kubectl_1_33, "1.33");

/// kubectl 1.28 speaks SPDY: straight to the proxy, which relays it.
mod kubectl_1_28_spdy_relay {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn exec_basics_tty_and_attach() {
        let Some(k) = require_kubectl("1.28") else {
            return;
        };
        let h = Harness::start().await;
        basics(&h, &k, &h.direct).await;
        tty_size(&h, &k, &h.direct).await;
        attach(&h, &k, &h.direct).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn big_transfers_and_cp() {
        let Some(k) = require_kubectl("1.28") else {
            return;
        };
        let h = Harness::start().await;
        big_transfers(&h, &k, &h.direct).await;
        copy_files(&h, &k, &h.direct).await;
    }
}

/// The exec issue's bar: 1 GB of stdout and 300 MB of stdin through the gateway and the
/// proxy into the SPDY-only cluster, byte-exact, with the command's exit code. Streams are
/// hashed as they flow, so the test holds no gigabyte in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_33_gigabyte_stdout_and_300_mb_stdin() {
    use sha2::Digest;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let h = Harness::start().await;
    let pod = "gigabyte";
    let dir = h.sim.pod_dir("default", pod);
    std::fs::create_dir_all(&dir).unwrap();
    const PIECE: usize = 50_000_000;
    random_file(&dir.join("piece.bin"), PIECE, 23);
    let piece = std::fs::read(dir.join("piece.bin")).unwrap();
    let mut want = sha2::Sha256::new();
    for _ in 0..20 {
        want.update(&piece);
    }
    let want = want.finalize();

    // 20 × 50 MB = 1 GB of stdout, then exit 7.
    let mut c = h.kubectl(&k, &h.via_gateway);
    c.args([
        "exec",
        pod,
        "--",
        "sh",
        "-c",
        "for i in $(seq 20); do cat piece.bin; done; exit 7",
    ]);
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut c = tokio::process::Command::from(c);
    c.kill_on_drop(true);
    let mut child = c.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let read = async {
        let mut got = sha2::Sha256::new();
        let mut total = 0usize;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = out.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.update(&buf[..n]);
            total += n;
        }
        (total, got.finalize())
    };
    let ((total, got), status) = tokio::time::timeout(Duration::from_secs(300), async {
        tokio::join!(read, child.wait())
    })
    .await
    .expect("1 GB exec timed out");
    assert_eq!(total, 20 * PIECE);
    assert!(got == want, "1 GB of stdout differ");
    assert_eq!(status.unwrap().code(), Some(7));

    // 6 × 50 MB = 300 MB of stdin, hashed in the pod.
    let mut c = h.kubectl(&k, &h.via_gateway);
    c.args(["exec", "-i", pod, "--", "sh", "-c", "sha256sum; exit 5"]);
    c.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut c = tokio::process::Command::from(c);
    c.kill_on_drop(true);
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = tokio::spawn(async move {
        for _ in 0..6 {
            stdin.write_all(&piece).await.unwrap();
        }
        stdin.shutdown().await.unwrap();
    });
    let o = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .expect("300 MB exec timed out")
        .unwrap();
    writer.await.unwrap();
    let mut want = sha2::Sha256::new();
    let piece = std::fs::read(dir.join("piece.bin")).unwrap();
    for _ in 0..6 {
        want.update(&piece);
    }
    let want: String = want.finalize().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        stdout(&o).split_whitespace().next(),
        Some(want.as_str()),
        "300 MB of stdin differ"
    );
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert_websocket_only(&h);
}
