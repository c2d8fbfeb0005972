//! kubectl exec / attach / cp through kube-ws-proxy into the simulated SPDY-only cluster.
//!
//! kubectl 1.31+ go through the SPDY-dropping middlebox, so only a working WebSocket→SPDY
//! translation can pass; kubectl 1.28 (an SPDY client) goes straight to the proxy and exercises
//! the relay path.

use crate::common;

use std::time::Duration;

use common::clients::require_kubectl;
use common::exec_suite::{attach, basics, big_transfers, copy_files, tty_size};
use common::harness::{random_file, stderr, stdout, Harness};

/// Asserts that kubectl really used WebSocket through the gateway (no SPDY fallback).
fn assert_websocket_only(h: &Harness) {
    assert!(
        h.middlebox.websockets() > 0,
        "no WebSocket upgrade reached the proxy"
    );
    assert_eq!(h.middlebox.dropped(), 0, "kubectl fell back to SPDY");
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
