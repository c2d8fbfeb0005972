//! Idle memory per exec session in the proxy, and many concurrent sessions: starts the simulated
//! SPDY-only cluster and the release proxy binary as separate processes (so each has its own
//! file-descriptor budget; more than one pair of them past [`PER_PAIR`] sessions), opens N
//! interactive v5 exec sessions (`-it`, running `cat`), waits until every upstream process
//! runs, lets them sit, reads the proxies' RSS, then checks that every session still echoes a
//! line.
//!
//!     cargo bench --bench idle_memory -- [SESSIONS ...] [--keepalive-both | --recording-both]
//!                                                                    (default: 1000 sessions)
//!
//! Prints, per N: proxy RSS before/after and the growth per session, how many sessions answered
//! and what the proxies logged. Not a timing benchmark.
//!
//! The proxies ping their clients every 2 s (so pings go out during the idle period) with a
//! client timeout longer than the run (these clients only read, and so answer pings, when a
//! line is typed). `--keepalive-both` measures every N twice, with client pings off and on,
//! and prints what keepalive costs per session; `--recording-both` does the same with
//! recordings (`--record best-effort`) off and on.

use std::time::Duration;

use futures_util::StreamExt;

#[path = "common/process.rs"]
mod process;
use process::{free_port, raise_fd_limit, rss_kib};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Each tty session holds a pty in the simulated cluster, and Linux allows 4,096 by default
/// (`kernel.pty.max`): raises that limit where allowed (root) so `ptys` fit. Returns the limit.
fn raise_pty_limit(ptys: usize) -> Option<usize> {
    const MAX: &str = "/proc/sys/kernel/pty/max";
    let current: usize = std::fs::read_to_string(MAX).ok()?.trim().parse().ok()?;
    // Room for the ptys the machine already uses and those reserved for the host's devpts.
    let wanted = ptys + 2 * 1024;
    if current >= wanted || std::fs::write(MAX, wanted.to_string()).is_err() {
        return Some(current);
    }
    Some(wanted)
}

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn open_session(proxy: std::net::SocketAddr, i: usize) -> Ws {
    let path = format!(
        "/api/v1/namespaces/default/pods/idle-{i}/exec?command=cat\
         &stdin=true&stdout=true&tty=true"
    );
    let mut req = format!("ws://{proxy}{path}").into_client_request().unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    let tcp = tokio::net::TcpStream::connect(proxy)
        .await
        .expect("connect to the proxy");
    let (ws, _) = tokio_tungstenite::client_async(req, tcp)
        .await
        .expect("WebSocket handshake");
    ws
}

/// The simulated cluster's running exec processes (its children).
fn processes_started(sim_pid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            let rest = &stat[stat.rfind(')').map(|i| i + 2).unwrap_or(0)..];
            rest.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u32>().ok())
                == Some(sim_pid)
        })
        .count()
}

/// Sessions one proxy and simulated-cluster pair carries. Every process on the machines we run
/// on has a hard limit of 20,000 descriptors; the simulated cluster holds about five per tty
/// session (socket, pty, child), the proxy two (client and upstream socket). Beyond this, the
/// bench starts more pairs: the proxy is stateless and runs as replicas in production too.
const PER_PAIR: usize = 3_400;
/// Sessions opened on each proxy before the first reading: the first ones pay for thread
/// stacks, pools and allocator arenas.
const WARM_UP: usize = 20;

/// One proxy in front of its own simulated cluster.
struct Pair {
    sim: std::process::Child,
    /// The cluster's `TMPDIR` (its pods' directories), removed after it is killed.
    sim_scratch: tempfile::TempDir,
    proxy: std::process::Child,
    addr: std::net::SocketAddr,
    log: std::path::PathBuf,
}

/// Client keepalive flags of the proxies.
fn keepalive_flags(pings: bool) -> [&'static str; 4] {
    if pings {
        // Interval short enough to ping during the idle period; timeout beyond the run.
        [
            "--client-ping-interval",
            "2s",
            "--client-ping-timeout",
            "1h",
        ]
    } else {
        ["--client-ping-interval", "0", "--client-ping-timeout", "0"]
    }
}

impl Pair {
    async fn start(index: usize, pings: bool, record_dir: Option<&std::path::Path>) -> Pair {
        let bin = env!("CARGO_BIN_EXE_kube-ws-proxy");
        let sim_port = free_port();
        let sim_scratch = tempfile::tempdir().unwrap();
        let sim = std::process::Command::new(bin)
            .args([
                "sim-cluster",
                "--exec-start-delay",
                "0",
                "--listen",
                &format!("127.0.0.1:{sim_port}"),
            ])
            .env("RUST_LOG", "warn")
            .env("TMPDIR", sim_scratch.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let port = free_port();
        let admin = free_port();
        let log = std::env::temp_dir().join(format!(
            "kube-ws-proxy-idle-{}-{index}.log",
            std::process::id()
        ));
        let log_file = std::fs::File::create(&log).unwrap();
        let proxy = std::process::Command::new(bin)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .args([
                "--upstream",
                &format!("http://127.0.0.1:{sim_port}"),
                "--log-format",
                "json",
            ])
            .args(keepalive_flags(pings))
            .args(record_dir.map_or_else(Vec::new, |dir| {
                vec![
                    "--record".to_owned(),
                    "best-effort".to_owned(),
                    "--record-dir".to_owned(),
                    dir.display().to_string(),
                ]
            }))
            .env("RUST_LOG", "warn")
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap();
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        for a in [addr, format!("127.0.0.1:{sim_port}").parse().unwrap()] {
            while tokio::net::TcpStream::connect(a).await.is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Pair {
            sim,
            sim_scratch,
            proxy,
            addr,
            log,
        }
    }

    /// Warnings and errors the proxy logged.
    fn complaints(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"WARN\"") || l.contains("\"ERROR\""))
            .count()
    }

    fn stop(mut self) {
        let _ = self.proxy.kill();
        let _ = self.proxy.wait();
        let _ = self.sim.kill();
        let _ = self.sim.wait();
        let _ = std::fs::remove_file(&self.log);
        drop(self.sim_scratch);
    }
}

/// Waits until the simulated clusters run `n` exec processes in all (or 5 minutes pass).
async fn wait_for_processes(pairs: &[Pair], n: usize) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        let running: usize = pairs.iter().map(|p| processes_started(p.sim.id())).sum();
        if running >= n || tokio::time::Instant::now() >= deadline {
            return running;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Types a line into a session's `cat` and waits for it to come back: the whole path, client
/// → proxy → cluster → process and back, still works.
async fn answers(ws: &mut Ws, i: usize) -> bool {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let line = format!("alive {i}\n");
    let mut msg = vec![0u8];
    msg.extend_from_slice(line.as_bytes());
    if ws.send(Message::Binary(msg.into())).await.is_err() {
        return false;
    }
    let expect = format!("alive {i}");
    let mut seen = Vec::new();
    let wait = async {
        while let Some(Ok(m)) = ws.next().await {
            if let Message::Binary(b) = m {
                if b.first() == Some(&1) {
                    seen.extend_from_slice(&b[1..]);
                    if String::from_utf8_lossy(&seen).contains(&expect) {
                        return true;
                    }
                }
            }
        }
        false
    };
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .unwrap_or(false)
}

/// Measures `n` idle sessions; the proxy RSS growth per session, in KiB.
async fn measure(n: usize, pings: bool, record_dir: Option<&std::path::Path>) -> f64 {
    let pair_count = n.div_ceil(PER_PAIR);
    let mut pairs = Vec::new();
    for i in 0..pair_count {
        pairs.push(Pair::start(i, pings, record_dir).await);
    }
    let mut warm = Vec::new();
    for (p, pair) in pairs.iter().enumerate() {
        for i in 0..WARM_UP {
            warm.push(open_session(pair.addr, p * 100_000 + i).await);
        }
    }
    wait_for_processes(&pairs, WARM_UP * pair_count).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before: u64 = pairs.iter().map(|p| rss_kib(p.proxy.id())).sum();
    // Round-robin over the proxies, like a Service in front of replicas.
    let mut sessions = Vec::with_capacity(n);
    for i in 0..n {
        let pair = &pairs[i % pair_count];
        sessions.push(open_session(pair.addr, 1_000_000 + i).await);
    }
    let started = wait_for_processes(&pairs, (WARM_UP * pair_count) + n)
        .await
        .saturating_sub(WARM_UP * pair_count);
    // Idle: a few ping intervals pass; the session state is what remains.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let after: u64 = pairs.iter().map(|p| rss_kib(p.proxy.id())).sum();
    let per = (after.saturating_sub(before)) as f64 / n as f64;
    // Every session still carries bytes both ways.
    let alive = futures_util::stream::iter(sessions.iter_mut().enumerate())
        .map(|(i, ws)| answers(ws, i))
        .buffer_unordered(200)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    let complaints: usize = pairs.iter().map(Pair::complaints).sum();
    println!(
        "idle exec sessions: {n} over {pair_count} proxies (each with its own simulated cluster), \
         client pings {}, recording {}; upstream processes running: {started}; answering after \
         the idle period: {alive}; warnings and errors in the proxy logs: {complaints}",
        if pings { "every 2 s" } else { "off" },
        if record_dir.is_some() { "on" } else { "off" }
    );
    println!(
        "proxy RSS {before} KiB → {after} KiB in all; {per:.1} KiB per idle session \
         (target ≤ 64 KiB: {})",
        if per <= 64.0 { "met" } else { "NOT met" }
    );
    if n >= 10_000 {
        let clean = started == n && alive == n && complaints == 0;
        println!(
            "{n} concurrent exec sessions without errors (target: 10,000): {}",
            if clean { "met" } else { "NOT met" }
        );
    }
    // Keep the sessions open until measured, then end everything.
    for ws in sessions.iter_mut().chain(warm.iter_mut()) {
        let _ = ws.close(None).await;
    }
    let drain = async {
        for ws in sessions.iter_mut().chain(warm.iter_mut()) {
            while let Some(Ok(_)) = ws.next().await {}
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(30), drain).await;
    for pair in pairs {
        pair.stop();
    }
    per
}

fn main() {
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .filter_map(|a| a.parse().ok())
        .collect();
    let counts = if counts.is_empty() {
        vec![1000]
    } else {
        counts
    };
    let limit = raise_fd_limit();
    println!("file descriptor limit: {limit}");
    let most = counts.iter().max().copied().unwrap_or(0);
    if let Some(ptys) = raise_pty_limit(most + 100) {
        println!("pty limit (kernel.pty.max): {ptys}");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let both = std::env::args().any(|a| a == "--keepalive-both");
    let recording_both = std::env::args().any(|a| a == "--recording-both");
    for n in counts {
        if recording_both {
            let dir = tempfile::tempdir().unwrap();
            let off = rt.block_on(measure(n, true, None));
            let on = rt.block_on(measure(n, true, Some(dir.path())));
            println!(
                "recording costs {:+.2} KiB per idle session at {n} sessions \
                 (target ≤ +8 KiB: {})",
                on - off,
                if on - off <= 8.0 { "met" } else { "NOT met" }
            );
        } else if both {
            let off = rt.block_on(measure(n, false, None));
            let on = rt.block_on(measure(n, true, None));
            println!(
                "client keepalive costs {:+.2} KiB per idle session at {n} sessions \
                 (target ≤ +1 KiB: {})",
                on - off,
                if on - off <= 1.0 { "met" } else { "NOT met" }
            );
        } else {
            rt.block_on(measure(n, true, None));
        }
    }
}
