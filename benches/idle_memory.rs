//! Idle memory per exec session in the proxy: starts the simulated SPDY-only cluster and the
//! release proxy binary as two processes (so each has its own file-descriptor budget), opens N interactive v5 exec sessions (`-it`, running
//! `sleep`), waits until every upstream process runs, lets them sit, and reads the proxy's RSS.
//!
//!     cargo bench --bench idle_memory -- [SESSIONS ...]     (default: 1000)
//!
//! Prints, per N: proxy RSS before/after and the growth per session. Not a timing benchmark.

use std::time::Duration;

use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Raises the open-file limit (inherited by the proxy): to 262144 where allowed (root), else to
/// the hard limit. 10,000 sessions need ~30,000 descriptors in this process (client sockets,
/// the simulated cluster's sockets and ptys) and ~20,000 in the proxy.
fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        let wanted = libc::rlimit {
            rlim_cur: 262_144,
            rlim_max: 262_144.max(lim.rlim_max),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) != 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
    }
    lim.rlim_cur
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn open_session(proxy: std::net::SocketAddr, i: usize) -> Ws {
    let path = format!(
        "/api/v1/namespaces/default/pods/idle-{i}/exec?command=sleep&command=3600\
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

async fn measure(n: usize) {
    let bin = env!("CARGO_BIN_EXE_kube-ws-proxy");
    let sim_port = free_port();
    let mut sim = std::process::Command::new(bin)
        .args(["sim-cluster", "--listen", &format!("127.0.0.1:{sim_port}")])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let sim_pid = sim.id();
    let port = free_port();
    let admin = free_port();
    let mut proxy = std::process::Command::new(bin)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .args([
            "--upstream",
            &format!("http://127.0.0.1:{sim_port}"),
            "--log-format",
            "json",
        ])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    for a in [addr, format!("127.0.0.1:{sim_port}").parse().unwrap()] {
        while tokio::net::TcpStream::connect(a).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Warm up: first sessions pay for thread stacks, pools and allocator arenas.
    let mut sessions = Vec::new();
    for i in 0..20 {
        sessions.push(open_session(addr, i).await);
    }
    while processes_started(sim_pid) < 20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rss_kib(proxy.id());
    for i in 20..20 + n {
        sessions.push(open_session(addr, i).await);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while processes_started(sim_pid) < 20 + n && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let started = processes_started(sim_pid).saturating_sub(20);
    // Idle: a few ping intervals pass; the session state is what remains.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let after = rss_kib(proxy.id());
    let per = (after.saturating_sub(before)) as f64 / n as f64;
    println!(
        "idle exec sessions: {n} (upstream processes running: {started}); proxy RSS {before} KiB \
         → {after} KiB; {per:.1} KiB per idle session (target ≤ 64 KiB)"
    );
    // Keep the sessions open until measured, then end everything.
    for ws in &mut sessions {
        let _ = ws.close(None).await;
    }
    let drain = async {
        for ws in &mut sessions {
            while let Some(Ok(_)) = ws.next().await {}
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(30), drain).await;
    let _ = proxy.kill();
    let _ = proxy.wait();
    let _ = sim.kill();
    let _ = sim.wait();
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    for n in counts {
        rt.block_on(measure(n));
    }
}
