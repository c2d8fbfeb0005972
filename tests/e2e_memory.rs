//! What sessions can make the proxy hold (SECURITY.md, "Memory"): many sessions each sending a
//! huge message they never finish, or each holding input or output their peer does not take,
//! against the real binary with a small `--session-memory-budget` (set through the
//! environment, so that a binary without the setting starts all the same and shows what it
//! holds without one). The proxy's resident memory stays within the budget and a stated
//! allowance, sessions past the budget end with Close 1009, kubectl 1.33 execs beside them
//! complete, and the process lives on.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::clients::require_kubectl;
use common::exec_suite::copy_files;
use common::harness::{run, stderr, stdout, Harness};
use common::proxy_process::ProxyProcess;
use common::ws_client::{connect, exec_path, raw_v5};
use futures_util::SinkExt;
use kube_ws_proxy::sim::SimConfig;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

const MIB: usize = 1 << 20;
const T: Duration = Duration::from_secs(60);

/// The proxy in front of the simulated cluster with a session memory budget of `budget` bytes.
async fn with_budget(budget: usize) -> Harness {
    let budget = budget.to_string();
    Harness::start_with_env(
        SimConfig::default(),
        &[],
        &[("KUBE_WS_PROXY_SESSION_MEMORY_BUDGET", budget.as_str())],
    )
    .await
}

/// kubectl 1.33 through the WebSocket-only gateway: an exec with stdin beside the load.
async fn healthy_exec(h: &Harness, kubectl: &std::path::Path) {
    let mut cmd = h.kubectl(kubectl, &h.via_gateway);
    cmd.args(["exec", "-i", "web", "--", "sh", "-c", "cat; echo done"]);
    let o = run(cmd, Some(b"beside the load\n".to_vec()), T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "beside the load\ndone\n");
}

/// The proxy's resident memory now.
fn rss(proxy: &ProxyProcess) -> usize {
    proxy.footprint().0 as usize
}

/// The highest resident memory seen over `period`.
async fn peak_rss(proxy: &ProxyProcess, period: Duration) -> usize {
    let until = Instant::now() + period;
    let mut peak = rss(proxy);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak = peak.max(rss(proxy));
    }
    peak
}

/// The proxy with `budget`, a kubectl 1.33 exec through it, and its resident memory then.
async fn started(budget: usize, kubectl: &std::path::Path) -> (Harness, usize) {
    let h = with_budget(budget).await;
    healthy_exec(&h, kubectl).await;
    let before = rss(&h.proxy);
    (h, before)
}

/// How far the proxy's resident memory grew from `before` to its peak over `period`, said
/// with `what` the load was.
async fn growth(proxy: &ProxyProcess, before: usize, period: Duration, what: &str) -> usize {
    let peak = peak_rss(proxy, period).await;
    eprintln!(
        "RSS {} MiB before, {} MiB at the peak; {what}",
        before / MIB,
        peak / MIB
    );
    peak.saturating_sub(before)
}

/// The server's frames on `r` (the bytes in `buf` first) until its Close: its code. `None` if
/// none came within `wait` (or the connection ended without one).
async fn close_code<R: AsyncRead + Unpin>(
    r: &mut R,
    mut buf: Vec<u8>,
    wait: Duration,
) -> Option<u16> {
    let until = tokio::time::Instant::now() + wait;
    loop {
        while buf.len() >= 2 {
            let (len, at) = match buf[1] & 0x7F {
                126 if buf.len() >= 4 => (u16::from_be_bytes([buf[2], buf[3]]) as usize, 4),
                127 if buf.len() >= 10 => (
                    u64::from_be_bytes(buf[2..10].try_into().unwrap()) as usize,
                    10,
                ),
                126 | 127 => break,
                n => (n as usize, 2),
            };
            if buf.len() < at + len {
                break;
            }
            if buf[0] & 0x0F == 0x8 {
                return (len >= 2).then(|| u16::from_be_bytes([buf[at], buf[at + 1]]));
            }
            buf.drain(..at + len);
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(until, r.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
}

/// A session whose client sends all but the last byte of a `len`-byte binary message (one
/// frame), and the proxy's Close code if it answered with one meanwhile. The connection is
/// kept (returned) so that a session still holding the message goes on holding it.
async fn unfinished_message(addr: SocketAddr, len: usize) -> (Option<u16>, TcpStream) {
    let path = exec_path("web", &["sleep", "600"], true, true, false);
    let (tcp, leftover) = raw_v5(addr, &path).await;
    let (mut rd, mut wr) = tcp.into_split();
    let write = async move {
        // A masked binary frame with a 64-bit length and a zero mask: payload as it is.
        let mut head = vec![0x82, 0x80 | 127];
        head.extend_from_slice(&(len as u64).to_be_bytes());
        head.extend_from_slice(&[0; 4]);
        let chunk = vec![0u8; MIB];
        let mut sent = 0;
        if wr.write_all(&head).await.is_ok() {
            while sent < len - 1 {
                let n = (len - 1 - sent).min(MIB);
                if wr.write_all(&chunk[..n]).await.is_err() {
                    break;
                }
                sent += n;
            }
        }
        wr
    };
    // Until the whole message (but its last byte) is written, or the proxy closes.
    tokio::pin!(write);
    let (code, wr) = tokio::select! {
        code = close_code(&mut rd, leftover, T) => (code, None),
        wr = &mut write => (None, Some(wr)),
    };
    let (code, wr) = match (code, wr) {
        // Closed: the writer stops at its next write.
        (Some(code), _) => {
            let wr = tokio::time::timeout(Duration::from_secs(5), write).await;
            (
                Some(code),
                wr.expect("the writer stops once the proxy closed"),
            )
        }
        // Written: an answer, if any, is on its way.
        (None, Some(wr)) => (
            close_code(&mut rd, Vec::new(), Duration::from_secs(1)).await,
            wr,
        ),
        (None, None) => panic!("no Close and the message not written within {T:?}"),
    };
    (code, rd.reunite(wr).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_unfinished_messages_end_their_sessions_past_the_budget() {
    let Some(kubectl) = require_kubectl("1.33") else {
        return;
    };
    const BUDGET: usize = 64 * MIB;
    const SESSIONS: usize = 12;
    const MESSAGE: usize = 30 * MIB;
    let (h, before) = started(BUDGET, &kubectl).await;
    let mut attackers = Vec::new();
    for _ in 0..SESSIONS {
        attackers.push(tokio::spawn(unfinished_message(h.proxy.addr, MESSAGE)));
    }
    let mut held = Vec::new();
    let mut refused = 0;
    for a in attackers {
        let (code, tcp) = a.await.unwrap();
        match code {
            Some(1009) => refused += 1,
            Some(other) => panic!("closed with {other}"),
            None => {}
        }
        held.push(tcp);
    }
    let what = format!("{refused} of {SESSIONS} sessions refused");
    let grown = growth(&h.proxy, before, Duration::from_secs(2), &what).await;
    // The budget, and 32 MiB for everything else (a dozen sessions' own state, reads under way,
    // the allocator's slack); without a budget the messages alone are 360 MiB.
    assert!(grown < BUDGET + 32 * MIB, "RSS grew by {} MiB", grown / MIB);
    // Two 30 MiB messages fit in the budget; every other session was ended with 1009.
    assert!(refused >= SESSIONS - BUDGET / MESSAGE, "{refused} refused");
    // The process lives on, and serves a real client beside the sessions still holding.
    healthy_exec(&h, &kubectl).await;
    let metrics = h.proxy.metrics();
    assert!(
        metrics.contains(&format!(
            "kube_ws_proxy_sessions_ended_by_memory_total{{cluster=\"default\",limit=\"budget\"}} {refused}"
        )),
        "{metrics}"
    );
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_a_command_never_reads_is_held_within_the_budget() {
    let Some(kubectl) = require_kubectl("1.33") else {
        return;
    };
    const BUDGET: usize = 32 * MIB;
    const SESSIONS: usize = 12;
    let (h, before) = started(BUDGET, &kubectl).await;
    let path = exec_path("web", &["sleep", "600"], true, true, false);
    let mut sessions = Vec::new();
    let mut refused = 0;
    for _ in 0..SESSIONS {
        let (mut ws, _) = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
            .await
            .unwrap();
        // 1 MiB messages (the Python client sends each write as one) until the proxy stops
        // taking them (backpressure) or ends the session.
        let mut message = vec![0u8; MIB + 1];
        message[0] = 0;
        for _ in 0..40 {
            let send = ws.send(Message::Binary(message.clone().into()));
            match tokio::time::timeout(Duration::from_secs(2), send).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    refused += 1;
                    break;
                }
                Err(_) => break,
            }
        }
        sessions.push(ws);
    }
    let what = format!("{refused} of {SESSIONS} sessions ended");
    let grown = growth(&h.proxy, before, Duration::from_secs(2), &what).await;
    // Without a budget each session held its 16 queued messages and more: over 200 MiB.
    assert!(grown < BUDGET + 32 * MIB, "RSS grew by {} MiB", grown / MIB);
    healthy_exec(&h, &kubectl).await;
    drop(sessions);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_a_client_never_reads_is_held_within_the_budget() {
    let Some(kubectl) = require_kubectl("1.33") else {
        return;
    };
    const BUDGET: usize = 8 * MIB;
    const SESSIONS: usize = 100;
    let (h, before) = started(BUDGET, &kubectl).await;
    let path = exec_path(
        "web",
        &["head", "-c", "100000000", "/dev/zero"],
        false,
        true,
        false,
    );
    // Clients that never read a byte of their output.
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(raw_v5(h.proxy.addr, &path).await);
    }
    let what = format!("with {SESSIONS} stalled sessions");
    let grown = growth(&h.proxy, before, Duration::from_secs(5), &what).await;
    // The budget, and 300 KiB per session: its upstream lane's 65 KiB floor, its state and
    // its read and write buffers (about 220 KiB in all here; SECURITY.md, "Memory"). Without a
    // budget each held its inbox and a batch for the client: 55 MiB here.
    assert!(
        grown < BUDGET + SESSIONS * 300 * 1024,
        "RSS grew by {} MiB",
        grown / MIB
    );
    healthy_exec(&h, &kubectl).await;
    drop(sessions);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_copy_large_files_while_the_budget_is_spent() {
    let (Some(k33), Some(k28)) = (require_kubectl("1.33"), require_kubectl("1.28")) else {
        return;
    };
    const BUDGET: usize = 64 * MIB;
    const MESSAGE: usize = 30 * MIB;
    let h = with_budget(BUDGET).await;
    // Two sessions hold 60 MiB of the budget with messages they never finish.
    let mut held = Vec::new();
    for _ in 0..2 {
        let (code, tcp) = unfinished_message(h.proxy.addr, MESSAGE).await;
        assert_eq!(code, None, "a 30 MiB message fits in the budget");
        held.push(tcp);
    }
    // kubectl writes 32 KiB messages (WebSocket) and frames (SPDY): each session's own floor
    // carries them, whatever the budget has left. 3 MB and 100 MB up and down, byte-exact.
    copy_files(&h, &k33, &h.via_gateway).await;
    copy_files(&h, &k28, &h.direct).await;
    let metrics = h.proxy.metrics();
    let ended: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("kube_ws_proxy_sessions_ended_by_memory_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(ended, 0.0, "{metrics}");
    drop(held);
}
