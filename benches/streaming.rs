//! Streaming throughput and latency, side by side, in one interleaved run (A B C A B C …):
//!
//! * `proxy`: a v5 WebSocket client → kube-ws-proxy (release binary) → the simulated SPDY-only
//!   cluster (what kubectl 1.31+ does through the proxy);
//! * `direct`: an SPDY/3.1 client straight to the simulated cluster (what kubectl ≤ 1.30 does);
//! * `relay`: the same SPDY client through a plain TCP relay (the floor of any extra hop).
//!
//! Measured: exec stdout (`head -c N /dev/zero`), exec stdin (`cat > /dev/null`), and 1-byte
//! echo round trips through `cat` (p50/p99). Medians of the rounds and ratios to `direct`
//! are printed with the targets from the benchmarks issue.
//!
//!     cargo bench --bench streaming -- [--bytes 1073741824] [--rounds 5] [--echoes 2000]
//!     cargo bench --bench streaming -- --smoke      (seconds; what CI may run)
//!
//! Not a test: nothing here asserts on time.

// The tests' WebSocket helpers (the tunnel byte-stream adapter among them).
#[allow(dead_code)]
#[path = "../tests/common/ws_client.rs"]
mod ws_client;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use kube_ws_proxy::proxy::spdy_dial::dial_spdy;
use kube_ws_proxy::proxy::upstream::{Upstream, UpstreamTls};
use kube_ws_proxy::sim::{SimCluster, SimConfig};
use kube_ws_proxy::spdy::proto::{Config, Connection};
use kube_ws_proxy::translate::exec_options::ExecOptions;
use kube_ws_proxy::translate::protocol::UpstreamVersion;
use kube_ws_proxy::translate::remote_command::{open_streams, ExecStreams};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Proxy,
    Direct,
    Relay,
}

const PATHS: [Path; 3] = [Path::Proxy, Path::Direct, Path::Relay];

struct Setup {
    proxy: SocketAddr,
    sim: SocketAddr,
    relay: SocketAddr,
    /// Pod service that sends the transfer size per connection (port-forward down).
    pod_source: u16,
    /// Pod service that reads to EOF (port-forward up).
    pod_sink: u16,
}

impl Setup {
    /// Where an SPDY client connects for `path` (direct or through the TCP relay).
    fn spdy_addr(&self, path: Path) -> SocketAddr {
        if path == Path::Direct {
            self.sim
        } else {
            self.relay
        }
    }
}

/// Waits for the command's status, then closes the session.
async fn finish_spdy(mut st: ExecStreams) {
    while let Some(Ok(_)) = st.error.recv().await {}
    st.conn.close().await;
}

fn exec_query(command: &[&str], stdin: bool) -> String {
    let mut q: Vec<String> = command
        .iter()
        .map(|c| format!("command={}", c.replace(' ', "%20").replace('>', "%3E")))
        .collect();
    q.push("stdout=true".into());
    if stdin {
        q.push("stdin=true".into());
    }
    q.join("&")
}

fn exec_path(query: &str) -> String {
    format!("/api/v1/namespaces/default/pods/bench/exec?{query}")
}

use ws_client::Ws;

async fn ws_connect(proxy: SocketAddr, query: &str) -> Ws {
    let mut req = format!("ws://{proxy}{}", exec_path(query))
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    let tcp = TcpStream::connect(proxy).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    tokio_tungstenite::client_async(req, tcp).await.unwrap().0
}

async fn spdy_connect(addr: SocketAddr, query: &str) -> ExecStreams {
    let upstream = Upstream::from_url(&format!("http://{addr}"), UpstreamTls::default()).unwrap();
    let offered = UpstreamVersion::offer_list()
        .iter()
        .map(|v| v.name().to_owned())
        .collect();
    let up = dial_spdy(
        &upstream,
        &exec_path(query),
        http::HeaderMap::new(),
        offered,
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let version = UpstreamVersion::from_negotiated(up.protocol.as_deref());
    let conn = Connection::client(up.io, up.leftover, Config::default());
    open_streams(conn, version, &ExecOptions::from_query(query))
        .await
        .unwrap()
}

/// Seconds to receive `n` bytes of stdout.
async fn stdout_run(s: &Setup, path: Path, n: u64) -> f64 {
    let query = exec_query(&["head", "-c", &n.to_string(), "/dev/zero"], false);
    let started = Instant::now();
    let mut got = 0u64;
    match path {
        Path::Proxy => {
            let mut ws = ws_connect(s.proxy, &query).await;
            while let Some(Ok(msg)) = ws.next().await {
                match msg {
                    Message::Binary(d) if d.first() == Some(&1) => got += d.len() as u64 - 1,
                    Message::Close(_) => break,
                    _ => {}
                }
            }
        }
        Path::Direct | Path::Relay => {
            let addr = s.spdy_addr(path);
            let mut st = spdy_connect(addr, &query).await;
            let mut out = st.stdout.take().unwrap();
            while let Some(Ok(chunk)) = out.recv().await {
                got += chunk.len() as u64;
            }
            finish_spdy(st).await;
        }
    }
    assert_eq!(got, n, "{path:?} stdout");
    started.elapsed().as_secs_f64()
}

/// Seconds to send `n` bytes of stdin and see the command finish.
async fn stdin_run(s: &Setup, path: Path, n: u64) -> f64 {
    let query = exec_query(&["sh", "-c", "cat >/dev/null"], true);
    let chunk = Bytes::from(vec![b'x'; 32 * 1024]);
    let started = Instant::now();
    match path {
        Path::Proxy => {
            let mut ws = ws_connect(s.proxy, &query).await;
            let mut msg = vec![0u8; chunk.len() + 1];
            let mut sent = 0u64;
            while sent < n {
                let len = (n - sent).min(chunk.len() as u64) as usize;
                ws.feed(Message::Binary(Bytes::copy_from_slice(&msg[..len + 1])))
                    .await
                    .unwrap();
                sent += len as u64;
            }
            msg.truncate(2);
            msg.copy_from_slice(&[255, 0]);
            ws.send(Message::Binary(Bytes::from(msg))).await.unwrap();
            while let Some(Ok(m)) = ws.next().await {
                if let Message::Close(_) = m {
                    break;
                }
            }
        }
        Path::Direct | Path::Relay => {
            let addr = s.spdy_addr(path);
            let mut st = spdy_connect(addr, &query).await;
            let mut stdin = st.stdin.take().unwrap();
            let mut sent = 0u64;
            while sent < n {
                let len = (n - sent).min(chunk.len() as u64) as usize;
                stdin.send(chunk.slice(..len)).await.unwrap();
                sent += len as u64;
            }
            stdin.finish().await.unwrap();
            if let Some(mut out) = st.stdout.take() {
                while let Some(Ok(_)) = out.recv().await {}
            }
            finish_spdy(st).await;
        }
    }
    started.elapsed().as_secs_f64()
}

/// Round-trip times (µs) of `count` 1-byte echoes through `cat`.
async fn echo_run(s: &Setup, path: Path, count: usize) -> Vec<f64> {
    let query = exec_query(&["cat"], true);
    let mut rtts = Vec::with_capacity(count);
    match path {
        Path::Proxy => {
            let mut ws = ws_connect(s.proxy, &query).await;
            for _ in 0..count {
                let t = Instant::now();
                ws.send(Message::Binary(Bytes::from_static(b"\x00x")))
                    .await
                    .unwrap();
                loop {
                    match ws.next().await {
                        Some(Ok(Message::Binary(d))) if d.first() == Some(&1) && d.len() > 1 => {
                            break
                        }
                        Some(Ok(_)) => continue,
                        other => panic!("echo ended: {other:?}"),
                    }
                }
                rtts.push(t.elapsed().as_secs_f64() * 1e6);
            }
            ws.send(Message::Binary(Bytes::from_static(b"\xff\x00")))
                .await
                .unwrap();
            while let Some(Ok(m)) = ws.next().await {
                if let Message::Close(_) = m {
                    break;
                }
            }
        }
        Path::Direct | Path::Relay => {
            let addr = s.spdy_addr(path);
            let mut st = spdy_connect(addr, &query).await;
            let mut stdin = st.stdin.take().unwrap();
            let mut out = st.stdout.take().unwrap();
            for _ in 0..count {
                let t = Instant::now();
                stdin.send(Bytes::from_static(b"x")).await.unwrap();
                out.recv().await.unwrap().unwrap();
                rtts.push(t.elapsed().as_secs_f64() * 1e6);
            }
            stdin.finish().await.unwrap();
            while let Some(Ok(_)) = out.recv().await {}
            finish_spdy(st).await;
        }
    }
    rtts
}

/// An SPDY port-forward session over `path`.
async fn pf_session(s: &Setup, path: Path) -> Connection {
    let pf = "/api/v1/namespaces/default/pods/bench/portforward";
    match path {
        Path::Proxy => {
            let mut req = format!("ws://{}{pf}", s.proxy)
                .into_client_request()
                .unwrap();
            req.headers_mut().insert(
                "Sec-WebSocket-Protocol",
                "SPDY/3.1+portforward.k8s.io".parse().unwrap(),
            );
            let tcp = TcpStream::connect(s.proxy).await.unwrap();
            tcp.set_nodelay(true).unwrap();
            let ws = tokio_tungstenite::client_async(req, tcp).await.unwrap().0;
            Connection::client(ws_client::as_io(ws), Bytes::new(), Config::default())
        }
        Path::Direct | Path::Relay => {
            let addr = s.spdy_addr(path);
            let upstream =
                Upstream::from_url(&format!("http://{addr}"), UpstreamTls::default()).unwrap();
            let up = dial_spdy(
                &upstream,
                pf,
                http::HeaderMap::new(),
                vec!["portforward.k8s.io".into()],
                Duration::from_secs(30),
            )
            .await
            .unwrap();
            Connection::client(up.io, up.leftover, Config::default())
        }
    }
}

/// Seconds to move `n` bytes through a forwarded connection: `down` from the pod service
/// (which sends `n` bytes and closes) or up to it (which reads to EOF and closes).
async fn pf_run(s: &Setup, path: Path, n: u64, down: bool) -> f64 {
    use kube_ws_proxy::spdy::frame::HeaderBlock;
    let port = if down { s.pod_source } else { s.pod_sink };
    let started = Instant::now();
    let conn = pf_session(s, path).await;
    let headers = |kind: &str| {
        let mut h = HeaderBlock::new();
        h.push("streamtype", kind);
        h.push("port", port.to_string());
        h.push("requestid", "0");
        h
    };
    let _error = conn.open_stream(headers("error")).await.unwrap();
    let (mut tx, mut rx) = conn.open_stream(headers("data")).await.unwrap().split();
    let mut got = 0u64;
    if down {
        tx.finish().await.unwrap();
        while let Some(Ok(chunk)) = rx.recv().await {
            got += chunk.len() as u64;
        }
        assert_eq!(got, n, "{path:?} port-forward down");
    } else {
        let chunk = Bytes::from(vec![b'x'; 32 * 1024]);
        let mut sent = 0u64;
        while sent < n {
            let len = (n - sent).min(chunk.len() as u64) as usize;
            tx.send(chunk.slice(..len)).await.unwrap();
            sent += len as u64;
        }
        tx.finish().await.unwrap();
        while let Some(Ok(_)) = rx.recv().await {}
    }
    let elapsed = started.elapsed().as_secs_f64();
    conn.close().await;
    elapsed
}

/// Milliseconds for each of `count` sequential sessions running `true` to set up and finish.
async fn setup_run(s: &Setup, path: Path, count: usize) -> Vec<f64> {
    let query = exec_query(&["true"], false);
    let mut times = Vec::with_capacity(count);
    for _ in 0..count {
        let t = Instant::now();
        match path {
            Path::Proxy => {
                let mut ws = ws_connect(s.proxy, &query).await;
                while let Some(Ok(m)) = ws.next().await {
                    if let Message::Close(_) = m {
                        break;
                    }
                }
            }
            Path::Direct | Path::Relay => {
                let addr = s.spdy_addr(path);
                let mut st = spdy_connect(addr, &query).await;
                if let Some(mut out) = st.stdout.take() {
                    while let Some(Ok(_)) = out.recv().await {}
                }
                finish_spdy(st).await;
            }
        }
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times
}

/// User + system CPU seconds a process has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Pod services for port-forward: one sends `n` zero bytes per connection, one swallows.
async fn start_pod_services(n: u64) -> (u16, u16) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let source = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sink = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ports = (
        source.local_addr().unwrap().port(),
        sink.local_addr().unwrap().port(),
    );
    tokio::spawn(async move {
        while let Ok((mut c, _)) = source.accept().await {
            tokio::spawn(async move {
                let buf = vec![0u8; 64 * 1024];
                let mut left = n;
                while left > 0 {
                    let len = left.min(buf.len() as u64) as usize;
                    if c.write_all(&buf[..len]).await.is_err() {
                        return;
                    }
                    left -= len as u64;
                }
                let _ = c.shutdown().await;
            });
        }
    });
    tokio::spawn(async move {
        while let Ok((mut c, _)) = sink.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(k) = c.read(&mut buf).await {
                    if k == 0 {
                        break;
                    }
                }
                let _ = c.shutdown().await;
            });
        }
    });
    ports
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

async fn start_relay(target: SocketAddr) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut u = TcpStream::connect(target).await.unwrap();
                let _ = c.set_nodelay(true);
                let _ = u.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
            });
        }
    });
    addr
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--smoke");
    let bytes: u64 = arg("--bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 8 << 20 } else { 1 << 30 });
    let rounds: usize = arg("--rounds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 1 } else { 5 });
    let echoes: usize = arg("--echoes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 50 } else { 2000 });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sim = SimCluster::start(SimConfig::default()).await.unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut proxy = std::process::Command::new(env!("CARGO_BIN_EXE_kube-ws-proxy"))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--admin-listen", "127.0.0.1:0"])
            .args(["--upstream", &sim.url(), "--log-format", "json"])
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap();
        let proxy_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        while TcpStream::connect(proxy_addr).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (pod_source, pod_sink) = start_pod_services(bytes).await;
        let s = Setup {
            proxy: proxy_addr,
            sim: sim.addr(),
            relay: start_relay(sim.addr()).await,
            pod_source,
            pod_sink,
        };
        println!("bytes per transfer: {bytes}, rounds: {rounds}, echoes per round: {echoes}");

        let setups: usize = if smoke { 10 } else { 200 };
        let mut out_t = vec![Vec::new(); 3];
        let mut in_t = vec![Vec::new(); 3];
        let mut pf_down = vec![Vec::new(); 3];
        let mut pf_up = vec![Vec::new(); 3];
        let mut rtt = vec![Vec::new(); 3];
        let mut setup = vec![Vec::new(); 3];
        let mut proxy_cpu = 0.0;
        let mut proxy_bytes = 0u64;
        for round in 0..rounds {
            for (i, &p) in PATHS.iter().enumerate() {
                let cpu0 = cpu_seconds(proxy.id());
                out_t[i].push(stdout_run(&s, p, bytes).await);
                in_t[i].push(stdin_run(&s, p, bytes).await);
                pf_down[i].push(pf_run(&s, p, bytes, true).await);
                pf_up[i].push(pf_run(&s, p, bytes, false).await);
                if p == Path::Proxy {
                    proxy_cpu += cpu_seconds(proxy.id()) - cpu0;
                    proxy_bytes += 4 * bytes;
                }
                rtt[i].extend(echo_run(&s, p, echoes).await);
                setup[i].extend(setup_run(&s, p, setups).await);
            }
            println!("round {} done", round + 1);
        }
        let mib = bytes as f64 / (1 << 20) as f64;
        println!("\n| measure | proxy (WebSocket) | direct SPDY | SPDY via TCP relay | proxy / direct | target |");
        println!("|---|---|---|---|---|---|");
        for (name, t) in [
            ("exec stdout", &mut out_t),
            ("exec stdin", &mut in_t),
            ("port-forward down", &mut pf_down),
            ("port-forward up", &mut pf_up),
        ] {
            let m: Vec<f64> = t.iter_mut().map(|v| median(v)).collect();
            let ratio = m[0] / m[1];
            println!(
                "| {name} {mib:.0} MiB, median s | {:.3} ({:.0} MiB/s) | {:.3} ({:.0} MiB/s) | {:.3} ({:.0} MiB/s) | {ratio:.2}× | ≤ 1.10× {} |",
                m[0], mib / m[0], m[1], mib / m[1], m[2], mib / m[2],
                if ratio <= 1.10 { "met" } else { "NOT met" }
            );
        }
        let p50: Vec<f64> = rtt.iter_mut().map(|v| percentile(v, 0.50)).collect();
        let p99: Vec<f64> = rtt.iter_mut().map(|v| percentile(v, 0.99)).collect();
        println!("| 1-byte echo p50, µs | {:.0} | {:.0} | {:.0} | +{:.0} µs | |", p50[0], p50[1], p50[2], p50[0] - p50[1]);
        let added = p99[0] - p99[1];
        println!(
            "| 1-byte echo p99, µs | {:.0} | {:.0} | {:.0} | +{added:.0} µs | added ≤ 200 µs {} |",
            p99[0], p99[1], p99[2],
            if added <= 200.0 { "met" } else { "NOT met" }
        );
        let s50: Vec<f64> = setup.iter_mut().map(|v| percentile(v, 0.50)).collect();
        let s99: Vec<f64> = setup.iter_mut().map(|v| percentile(v, 0.99)).collect();
        println!(
            "| exec session setup+teardown p50, ms ({:.0}/s sequential) | {:.2} | {:.2} | {:.2} | {:.2}× | |",
            1e3 / s50[0], s50[0], s50[1], s50[2], s50[0] / s50[1]
        );
        println!("| exec session setup+teardown p99, ms | {:.2} | {:.2} | {:.2} | | |", s99[0], s99[1], s99[2]);
        let gb = proxy_bytes as f64 / 1e9;
        println!(
            "\nproxy CPU: {proxy_cpu:.2} s for {gb:.2} GB relayed through it = {:.2} CPU s/GB",
            proxy_cpu / gb
        );
        let _ = proxy.kill();
        let _ = proxy.wait();
        sim.shutdown().await;
    });
}
