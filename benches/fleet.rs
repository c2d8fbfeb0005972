//! What a fleet costs: one proxy with 1 configured cluster against one with `--clusters` (100),
//! all of them the same simulated cluster under different names.
//!
//!     cargo bench --bench fleet -- [--clusters 100] [--requests 2000] [--routes 1000000]
//!
//! Prints, for each size:
//! - the routing of one request in the process (`Fleet::route`, the prefix read and the
//!   cluster looked up), in ns, 1 against N clusters;
//! - a plain request's latency through the proxy binary (`GET /clusters/NAME/version`, one
//!   keep-alive connection, sequential), p50 and p99, 1 against N;
//! - start time: from spawning the proxy until `/readyz` answers 200 (every cluster checked);
//! - memory: the proxy's RSS once ready, and after one request to every cluster (each then
//!   holds a pooled upstream connection), per configured cluster;
//! - reload time: the config file rewritten with every cluster renamed (N removed, N added),
//!   then SIGHUP, until `kube_ws_proxy_config_generation` says the new one serves; and with one
//!   cluster of N changed.
//!
//! The load generator runs on the same machine. Not run by the tests.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use kube_ws_proxy::proxy::auth::Authenticator;
use kube_ws_proxy::proxy::route::cluster::{Cluster, ClusterName};
use kube_ws_proxy::proxy::route::fleet::Fleet;
use kube_ws_proxy::proxy::upstream::endpoint::{Upstream, UpstreamTls};
use kube_ws_proxy::request::target::RequestTarget;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[path = "common/process.rs"]
mod process;
use process::{free_port, rss_kib, KillOnDrop};

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `clusters:` naming `count` clusters `PREFIX0`… at `upstream`.
fn config(prefix: &str, count: u64, upstream: &str) -> String {
    let mut yaml = String::from("clusters:\n");
    for i in 0..count {
        yaml.push_str(&format!("- name: {prefix}{i}\n  upstream: {upstream}\n"));
    }
    yaml
}

/// Routing in the process: ns per `Fleet::route` of a prefixed exec target.
fn route_ns(count: u64, routes: u64) -> f64 {
    let clusters = (0..count).map(|i| {
        let upstream = Upstream::from_url("http://127.0.0.1:1", UpstreamTls::default()).unwrap();
        Cluster::new(
            Some(ClusterName::parse(&format!("c{i}")).unwrap()),
            upstream,
            Authenticator::passthrough(),
            Default::default(),
        )
    });
    let fleet = Fleet::new(None, clusters).unwrap();
    let name = format!("c{}", count - 1);
    let path = format!("/clusters/{name}/api/v1/namespaces/default/pods/web/exec");
    let query = Some("command=sh&stdin=true&stdout=true&tty=true");
    let start = Instant::now();
    for _ in 0..routes {
        let target = RequestTarget::parse(&path, query).unwrap();
        let routed = fleet.route(None, &path, query, target).unwrap();
        std::hint::black_box(routed);
    }
    start.elapsed().as_nanos() as f64 / routes as f64
}

/// One HTTP/1.1 keep-alive connection: GET `path`, read the answer whole.
struct Conn(BufReader<TcpStream>);

impl Conn {
    async fn open(addr: SocketAddr) -> Conn {
        Conn(BufReader::new(TcpStream::connect(addr).await.unwrap()))
    }

    async fn get(&mut self, path: &str) -> u16 {
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
        self.0
            .get_mut()
            .write_all(request.as_bytes())
            .await
            .unwrap();
        let mut line = String::new();
        self.0.read_line(&mut line).await.unwrap();
        let status: u16 = line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut length = 0usize;
        loop {
            line.clear();
            self.0.read_line(&mut line).await.unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        self.0.read_exact(&mut body).await.unwrap();
        status
    }
}

async fn admin_get(admin: SocketAddr, path: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(admin).await else {
        return (0, String::new());
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text).await;
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

async fn generation(admin: SocketAddr) -> Option<f64> {
    let (_, text) = admin_get(admin, "/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix("kube_ws_proxy_config_generation "))
        .and_then(|v| v.trim().parse().ok())
}

struct Proxy {
    child: KillOnDrop,
    addr: SocketAddr,
    admin: SocketAddr,
    /// From spawn until `/readyz` answered 200.
    started_in: Duration,
}

impl Proxy {
    async fn start(config: &Path) -> Proxy {
        let (port, admin_port) = (free_port(), free_port());
        let spawned = Instant::now();
        let child = KillOnDrop(
            std::process::Command::new(env!("CARGO_BIN_EXE_kube-ws-proxy"))
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
                .args(["--config", config.to_str().unwrap()])
                .env("RUST_LOG", "error")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
        while admin_get(admin, "/readyz").await.0 != 200 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Proxy {
            started_in: spawned.elapsed(),
            child,
            addr,
            admin,
        }
    }

    fn rss_kib(&self) -> u64 {
        rss_kib(self.child.0.id())
    }

    /// Writes `text` over the config file, sends SIGHUP, and waits for generation `to`.
    async fn reload(&self, config: &Path, text: &str, to: f64) -> Duration {
        let staged = config.with_extension("tmp");
        std::fs::write(&staged, text).unwrap();
        std::fs::rename(&staged, config).unwrap();
        let sent = Instant::now();
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.0.id() as i32, libc::SIGHUP) };
        while generation(self.admin).await != Some(to) {
            assert!(sent.elapsed() < Duration::from_secs(30), "no reload");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        sent.elapsed()
    }
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

/// What one size measured.
struct Sized {
    count: u64,
    route_ns: f64,
    p50_us: f64,
    p99_us: f64,
    start_ms: f64,
    rss_ready: u64,
    rss_warm: u64,
    reload_all_ms: f64,
    reload_one_ms: f64,
}

async fn measure(count: u64, upstream: &str, requests: u64, routes: u64) -> Sized {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, config("c", count, upstream)).unwrap();
    let route_ns = route_ns(count, routes);
    let proxy = Proxy::start(&file).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_ready = proxy.rss_kib();
    let mut conn = Conn::open(proxy.addr).await;
    for i in 0..count {
        assert_eq!(conn.get(&format!("/clusters/c{i}/version")).await, 200);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_warm = proxy.rss_kib();
    let last = format!("/clusters/c{}/version", count - 1);
    for _ in 0..200 {
        conn.get(&last).await;
    }
    let mut times = Vec::with_capacity(requests as usize);
    for _ in 0..requests {
        let t = Instant::now();
        assert_eq!(conn.get(&last).await, 200);
        times.push(t.elapsed());
    }
    times.sort();
    let reload_all = proxy
        .reload(&file, &config("d", count, upstream), 2.0)
        .await;
    // One of them changed: its upstream URL written differently (a trailing slash).
    let mut one = config("d", count, upstream);
    one = one.replacen(
        &format!("- name: d0\n  upstream: {upstream}\n"),
        &format!("- name: d0\n  upstream: {upstream}/\n"),
        1,
    );
    let reload_one = proxy.reload(&file, &one, 3.0).await;
    Sized {
        count,
        route_ns,
        p50_us: pct(&times, 0.5),
        p99_us: pct(&times, 0.99),
        start_ms: proxy.started_in.as_secs_f64() * 1e3,
        rss_ready,
        rss_warm,
        reload_all_ms: reload_all.as_secs_f64() * 1e3,
        reload_one_ms: reload_one.as_secs_f64() * 1e3,
    }
}

#[tokio::main]
async fn main() {
    let clusters = arg("--clusters", 100);
    let requests = arg("--requests", 2000);
    let routes = arg("--routes", 1_000_000);
    let sim_port = free_port();
    let sim_scratch = tempfile::tempdir().unwrap();
    let _sim = KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_kube-ws-proxy"))
            .args(["sim-cluster", "--listen", &format!("127.0.0.1:{sim_port}")])
            .env("TMPDIR", sim_scratch.path())
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let upstream = format!("http://127.0.0.1:{sim_port}");
    while TcpStream::connect(("127.0.0.1", sim_port)).await.is_err() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "fleet bench: 1 vs {clusters} clusters, {requests} sequential requests, {routes} routes"
    );
    let one = measure(1, &upstream, requests, routes).await;
    let many = measure(clusters, &upstream, requests, routes).await;
    println!(
        "| clusters | route (ns) | request p50 / p99 (µs) | start to ready (ms) | RSS ready / \
         after a request to each (KiB) | reload: all renamed / one changed (ms) |"
    );
    println!("|---|---|---|---|---|---|");
    for s in [&one, &many] {
        println!(
            "| {} | {:.0} | {:.0} / {:.0} | {:.1} | {} / {} | {:.1} / {:.1} |",
            s.count,
            s.route_ns,
            s.p50_us,
            s.p99_us,
            s.start_ms,
            s.rss_ready,
            s.rss_warm,
            s.reload_all_ms,
            s.reload_one_ms
        );
    }
    let per = |a: u64, b: u64| (b as f64 - a as f64) / (many.count - one.count) as f64;
    println!(
        "per configured cluster: {:.1} KiB idle, {:.1} KiB with its pooled connection; \
         routing {:+.0} ns; p50 {:+.0} µs",
        per(one.rss_ready, many.rss_ready),
        per(one.rss_warm, many.rss_warm),
        many.route_ns - one.route_ns,
        many.p50_us - one.p50_us
    );
}
