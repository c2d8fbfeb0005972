//! How fast the proxy sheds connections that hold descriptors without asking anything, while
//! it keeps serving: a flood of idle TCP connections against the plain listener, then of
//! half-open TLS handshakes (a ClientHello cut short) against the TLS listener. Each flood is
//! `--clients` tasks that connect, say nothing more, wait for the proxy to close, and connect
//! again; the proxy runs with `--request-header-timeout 1s`. A probe makes one real request
//! every 50 ms through the same listener.
//!
//!     cargo bench --bench shedding -- [--seconds 15] [--clients 3000]
//!
//! Prints connections shed per second (the proxy's own counter), the probe's answers and
//! latency, and the proxy's descriptors and RSS at the end. The load generator runs on the
//! same machine and shares its cores. Not run by the tests.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

#[path = "common/process.rs"]
mod process;
use process::{free_port, open_fds, raise_fd_limit, rss_kib, KillOnDrop};

const HEADER_TIMEOUT: &str = "1s";

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Proxy {
    child: KillOnDrop,
    addr: SocketAddr,
    admin: SocketAddr,
}

impl Proxy {
    async fn start(upstream: &str, extra: &[&str]) -> Proxy {
        let port = free_port();
        let admin_port = free_port();
        let child = KillOnDrop(
            std::process::Command::new(env!("CARGO_BIN_EXE_kube-ws-proxy"))
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
                .args(["--upstream", upstream])
                .args(["--request-header-timeout", HEADER_TIMEOUT])
                .args(extra)
                .env("RUST_LOG", "error")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
        while TcpStream::connect(admin).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Proxy { child, addr, admin }
    }

    async fn shed(&self) -> u64 {
        let mut s = TcpStream::connect(self.admin).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        text.lines()
            .filter(|l| l.starts_with("kube_ws_proxy_client_connections_closed_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    fn fds(&self) -> usize {
        open_fds(self.child.0.id())
    }

    fn rss_kib(&self) -> u64 {
        rss_kib(self.child.0.id())
    }
}

/// The first bytes of a TLS ClientHello record: a handshake the server must wait on.
const PARTIAL_CLIENT_HELLO: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc];

/// `clients` tasks that each connect, send `opening`, wait to be closed, and start over.
fn flood(addr: SocketAddr, clients: u64, opening: &'static [u8], stop: Arc<AtomicBool>) {
    for _ in 0..clients {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut s) = TcpStream::connect(addr).await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                if !opening.is_empty() && s.write_all(opening).await.is_err() {
                    continue;
                }
                while !matches!(s.read(&mut buf).await, Ok(0) | Err(_)) {}
            }
        });
    }
}

/// One request on a fresh connection; its latency, or `None` if it failed.
async fn probe_once<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    started: Instant,
) -> Option<Duration> {
    s.write_all(b"GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).await.ok()?;
    head.starts_with(b"HTTP/1.1 200").then(|| started.elapsed())
}

/// Probes `addr` every 50 ms (over TLS with `tls`) until `stop`.
async fn probe(
    addr: SocketAddr,
    tls: Option<tokio_rustls::TlsConnector>,
    stop: Arc<AtomicBool>,
) -> (Vec<Duration>, u64) {
    let mut latencies = Vec::new();
    let failures = AtomicU64::new(0);
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let attempt = async {
            let tcp = TcpStream::connect(addr).await.ok()?;
            match &tls {
                None => probe_once(tcp, started).await,
                Some(c) => {
                    let name = ServerName::try_from("127.0.0.1").unwrap();
                    probe_once(c.connect(name, tcp).await.ok()?, started).await
                }
            }
        };
        match tokio::time::timeout(Duration::from_secs(10), attempt).await {
            Ok(Some(l)) => latencies.push(l),
            _ => {
                failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (latencies, failures.into_inner())
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

async fn run_flood(
    name: &str,
    proxy: &Proxy,
    opening: &'static [u8],
    tls: Option<tokio_rustls::TlsConnector>,
    clients: u64,
    seconds: u64,
) {
    let stop = Arc::new(AtomicBool::new(false));
    flood(proxy.addr, clients, opening, stop.clone());
    // Warm-up: the first wave must time out before the rate settles.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let probe_stop = Arc::new(AtomicBool::new(false));
    let prober = tokio::spawn(probe(proxy.addr, tls, probe_stop.clone()));
    let before = proxy.shed().await;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let shed = proxy.shed().await - before;
    let elapsed = started.elapsed().as_secs_f64();
    let (fds, rss) = (proxy.fds(), proxy.rss_kib());
    probe_stop.store(true, Ordering::Relaxed);
    let (mut latencies, failures) = prober.await.unwrap();
    stop.store(true, Ordering::Relaxed);
    latencies.sort();
    println!(
        "{name}: {:.0} connections shed per second over {elapsed:.1} s ({clients} attackers); \
         probe: {} answered, {failures} failed, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; \
         proxy at the end: {fds} descriptors, {rss} KiB RSS",
        shed as f64 / elapsed,
        latencies.len(),
        pct(&latencies, 0.5),
        pct(&latencies, 0.99),
        latencies
            .last()
            .map_or(f64::NAN, |l| l.as_secs_f64() * 1000.0),
    );
    // Let the last wave drain before the next flood.
    tokio::time::sleep(Duration::from_secs(2)).await;
}

#[tokio::main]
async fn main() {
    let seconds = arg("--seconds", 15);
    let clients = arg("--clients", 3000);
    let limit = raise_fd_limit();
    println!(
        "shedding bench: --request-header-timeout {HEADER_TIMEOUT}, {clients} attackers, \
         {seconds} s per flood, descriptor limit {limit}"
    );
    let sim_port = free_port();
    // The cluster's pods' directories, removed after it (dropped after `_sim`).
    let sim_scratch = tempfile::tempdir().unwrap();
    let _sim = KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_kube-ws-proxy"))
            .args([
                "sim-cluster",
                "--exec-start-delay",
                "0",
                "--listen",
                &format!("127.0.0.1:{sim_port}"),
            ])
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

    let plain = Proxy::start(&upstream, &[]).await;
    run_flood("idle TCP connections", &plain, b"", None, clients, seconds).await;
    drop(plain);

    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (cert_file, key_file) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let tls = Proxy::start(
        &upstream,
        &[
            "--tls-cert-file",
            cert_file.to_str().unwrap(),
            "--tls-private-key-file",
            key_file.to_str().unwrap(),
        ],
    )
    .await;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    run_flood(
        "half-open TLS handshakes",
        &tls,
        PARTIAL_CLIENT_HELLO,
        Some(connector),
        clients,
        seconds,
    )
    .await;
}
