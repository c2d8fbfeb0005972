//! Many WebSocket sessions over ONE HTTP/2 connection (RFC 8441 extended CONNECT) versus one
//! HTTP/1.1 connection each, both over TLS to the release proxy binary, into the simulated
//! SPDY-only cluster (v5 exec, translated). Per round and form, a fresh proxy:
//!
//! * memory: N idle `cat` sessions opened (after one warm-up session), the proxy's RSS growth
//!   per session; then every session echoes a line and ends;
//! * throughput: N sessions at once, each `head -c BYTES/N /dev/zero`, all read to the end;
//!   aggregate MiB/s from the first request to the last byte.
//!
//! With `--stall`, fairness instead: one session's stdout (`head -c BYTES /dev/zero`, read to
//! the end) on an HTTP/2 connection alone, and beside a sibling on the same connection whose
//! reader has stopped with its stream window full; per round and client window setting
//! (Chromium's, the `h2` crate's defaults) a fresh proxy, the two runs interleaved.
//!
//! Run with:
//!
//!     cargo bench --bench http2_sessions -- [--sessions 100] [--bytes 1073741824] [--rounds 3]
//!     cargo bench --bench http2_sessions -- --smoke
//!     cargo bench --bench http2_sessions -- --stall [--bytes 200000000] [--rounds 5]
//!
//! Not a test: nothing here asserts on time or memory.

#[allow(dead_code)]
#[path = "../tests/common/h2_ws.rs"]
mod h2_ws;
#[allow(dead_code)]
#[path = "../tests/common/pki.rs"]
mod pki;
#[path = "common/process.rs"]
mod process;
#[allow(dead_code)]
#[path = "../tests/common/tls_client.rs"]
mod tls_client;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use kube_ws_proxy::sim::{SimCluster, SimConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Form {
    Http1,
    Http2,
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn exec_path(pod: &str, script: &str) -> String {
    let script: String = script
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!(
        "/api/v1/namespaces/default/pods/{pod}/exec?command=sh&command=-c&command={script}\
         &stdin=true&stdout=true&stderr=true"
    )
}

/// The proxy over TLS in front of the cluster; killed on drop.
struct Proxy {
    child: std::process::Child,
    addr: SocketAddr,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_proxy(upstream: &str, cert: &str, key: &str) -> Proxy {
    let port = process::free_port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_kube-ws-proxy"))
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .args([
            "--upstream",
            upstream,
            "--tls-cert-file",
            cert,
            "--tls-private-key-file",
            key,
        ])
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Proxy { child, addr }
}

/// Opens sessions in one form: over one shared HTTP/2 connection, or one TLS connection each.
enum Opener {
    Http1 { addr: SocketAddr, ca: String },
    Http2(h2_ws::H2Connection),
}

/// A v5 session, whatever carries it.
trait Session:
    futures_util::Sink<Message, Error = WsError>
    + futures_util::Stream<Item = Result<Message, WsError>>
    + Unpin
    + Send
{
}
impl<S: AsyncRead + AsyncWrite + Unpin + Send> Session for WebSocketStream<S> {}

impl Opener {
    async fn new(form: Form, addr: SocketAddr, ca: &str) -> Opener {
        match form {
            Form::Http1 => Opener::Http1 {
                addr,
                ca: ca.to_owned(),
            },
            Form::Http2 => {
                Opener::Http2(h2_ws::H2Connection::connect(addr, ca, 1 << 20, 64 << 20).await)
            }
        }
    }

    async fn open(&self, path: &str) -> Box<dyn Session> {
        match self {
            Opener::Http1 { addr, ca } => {
                let tls = tls_client::connect(*addr, ca, None, &[b"http/1.1"])
                    .await
                    .unwrap();
                let mut req = format!("wss://127.0.0.1:{}{path}", addr.port())
                    .into_client_request()
                    .unwrap();
                req.headers_mut().insert(
                    "Sec-WebSocket-Protocol",
                    "v5.channel.k8s.io".parse().unwrap(),
                );
                let (ws, _) = tokio_tungstenite::client_async(req, tls).await.unwrap();
                Box::new(ws)
            }
            Opener::Http2(conn) => {
                let (ws, _) = conn.websocket(path, "v5.channel.k8s.io").await.unwrap();
                Box::new(ws)
            }
        }
    }
}

/// Reads a session to its end; stdout bytes.
async fn drain(ws: &mut Box<dyn Session>) -> usize {
    let mut n = 0;
    while let Some(Ok(m)) = ws.next().await {
        match m {
            Message::Binary(b) if b.first() == Some(&1) => n += b.len() - 1,
            Message::Close(_) => break,
            _ => {}
        }
    }
    n
}

/// Proxy RSS growth per idle session, KiB; every session then echoes and ends.
async fn memory(form: Form, proxy: &Proxy, ca: &str, sessions: usize) -> f64 {
    let opener = Opener::new(form, proxy.addr, ca).await;
    let mut warm = opener.open(&exec_path("warm", "cat")).await;
    let _ = warm.send(Message::Binary(vec![255u8, 0].into())).await;
    drain(&mut warm).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = process::rss_kib(proxy.child.id());
    let mut open = Vec::new();
    for i in 0..sessions {
        open.push(opener.open(&exec_path(&format!("idle-{i}"), "cat")).await);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = process::rss_kib(proxy.child.id());
    for ws in open.iter_mut() {
        let _ = ws.send(Message::Binary(b"\0line\n".to_vec().into())).await;
        let _ = ws.send(Message::Binary(vec![255u8, 0].into())).await;
    }
    let echoed = futures_util::future::join_all(open.iter_mut().map(drain)).await;
    assert!(
        echoed.iter().all(|&n| n == 5),
        "a session did not echo: {echoed:?}"
    );
    (after as f64 - before as f64) / sessions as f64
}

/// Aggregate MiB/s of `sessions` concurrent stdout transfers of `bytes` in all.
async fn throughput(form: Form, proxy: &Proxy, ca: &str, sessions: usize, bytes: usize) -> f64 {
    let opener = Opener::new(form, proxy.addr, ca).await;
    let each = bytes / sessions;
    let started = Instant::now();
    let runs = (0..sessions).map(|i| {
        let opener = &opener;
        async move {
            let mut ws = opener
                .open(&exec_path(
                    &format!("tp-{i}"),
                    &format!("head -c {each} /dev/zero"),
                ))
                .await;
            drain(&mut ws).await
        }
    });
    let got = futures_util::future::join_all(runs).await;
    let secs = started.elapsed().as_secs_f64();
    assert!(got.iter().all(|&n| n == each), "short transfer: {got:?}");
    (each * sessions) as f64 / (1 << 20) as f64 / secs
}

/// Client receive windows of an HTTP/2 connection.
#[derive(Clone, Copy)]
struct Windows {
    name: &'static str,
    stream: u32,
    connection: u32,
}

const CHROMIUM: Windows = Windows {
    name: "6 MiB stream / 15 MiB connection (Chromium's)",
    stream: 6 << 20,
    connection: 15 << 20,
};

/// RFC 9113's initial 65,535 for both, which the `h2` crate keeps unless told otherwise.
const H2_DEFAULTS: Windows = Windows {
    name: "64 KiB stream / 64 KiB connection (the h2 crate's defaults)",
    stream: 65_535,
    connection: 65_535,
};

/// How a measured session went: MiB/s, or the bytes it got before `limit` ran out.
enum Run {
    Finished(f64),
    Stuck(usize),
}

/// A measured run and what the stalled sibling held unread meanwhile (bytes).
struct Beside {
    run: Run,
    held: usize,
}

/// One session's stdout (`bytes` of zeros) over a fresh HTTP/2 connection with `windows`;
/// with `stalled`, beside a sibling on that connection that reads nothing once its stream is
/// open (its stream window fills and stays full: what it holds is unreleased connection window
/// too).
async fn beside(
    proxy: &Proxy,
    ca: &str,
    windows: Windows,
    bytes: usize,
    stalled: bool,
    limit: Duration,
) -> Beside {
    let conn =
        h2_ws::H2Connection::connect(proxy.addr, ca, windows.stream, windows.connection).await;
    let script = format!("head -c {bytes} /dev/zero");
    let mut sibling = None;
    let mut held = 0;
    if stalled {
        let (resp, send) = conn
            .connect_stream(
                &exec_path("stalled", &script),
                Some("websocket"),
                &[
                    ("sec-websocket-version", "13"),
                    ("sec-websocket-protocol", "v5.channel.k8s.io"),
                ],
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), http::StatusCode::OK);
        let mut recv = resp.into_body();
        // Full: what it holds stopped growing (at its stream window, or what was left of the
        // connection's).
        let mut last = (0, Instant::now());
        loop {
            let held = recv.flow_control().used_capacity();
            if held != last.0 {
                last = (held, Instant::now());
            } else if held > 0 && last.1.elapsed() > Duration::from_millis(300) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        held = last.0;
        sibling = Some((recv, send));
    }
    let started = Instant::now();
    let (mut ws, _) = conn
        .websocket(&exec_path("measured", &script), "v5.channel.k8s.io")
        .await
        .unwrap();
    let mut got = 0;
    let finished = tokio::time::timeout(limit, async {
        while let Some(Ok(m)) = ws.next().await {
            match m {
                Message::Binary(b) if b.first() == Some(&1) => got += b.len() - 1,
                Message::Close(_) => break,
                _ => {}
            }
        }
    })
    .await
    .is_ok();
    let secs = started.elapsed().as_secs_f64();
    drop(sibling);
    let run = match finished {
        true => {
            assert_eq!(got, bytes, "short transfer");
            Run::Finished(bytes as f64 / (1 << 20) as f64 / secs)
        }
        false => Run::Stuck(got),
    };
    Beside { run, held }
}

/// `--stall`: a sibling's throughput beside a stalled session, per client window setting.
async fn stall(sim: &SimCluster, cert: &str, key: &str, ca: &str, bytes: usize, rounds: usize) {
    const LIMIT: Duration = Duration::from_secs(10);
    println!("stall: {bytes} bytes per run, rounds: {rounds}");
    let mut table = Vec::new();
    for windows in [CHROMIUM, H2_DEFAULTS] {
        let (mut alone, mut stalled, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let mut stuck = Vec::new();
        for round in 0..rounds {
            let proxy = start_proxy(&sim.url(), cert, key).await;
            // Interleaved: every other round starts with the stalled run.
            let mut runs = [false, true];
            if round % 2 == 1 {
                runs.reverse();
            }
            let mut pair = [0.0; 2];
            let mut held = 0;
            for with_stall in runs {
                let b = beside(&proxy, ca, windows, bytes, with_stall, LIMIT).await;
                held = held.max(b.held);
                match b.run {
                    Run::Finished(mibs) => pair[with_stall as usize] = mibs,
                    Run::Stuck(got) => {
                        assert!(with_stall, "a session alone did not finish");
                        stuck.push(got);
                    }
                }
            }
            alone.push(pair[0]);
            if pair[1] > 0.0 {
                stalled.push(pair[1]);
                ratios.push(pair[1] / pair[0]);
            }
            println!(
                "{}, round {}: alone {:.0} MiB/s, beside a stalled sibling (holding {held} bytes \
                 unread) {}",
                windows.name,
                round + 1,
                pair[0],
                if pair[1] > 0.0 {
                    format!("{:.0} MiB/s", pair[1])
                } else {
                    format!("stuck ({} bytes in {LIMIT:?})", stuck.last().unwrap())
                }
            );
        }
        let row = match (stalled.is_empty(), stuck.is_empty()) {
            (false, true) => format!(
                "| {} | {:.0} | {:.0} | {:.2}× |",
                windows.name,
                median(&mut alone),
                median(&mut stalled),
                median(&mut ratios)
            ),
            _ => format!(
                "| {} | {:.0} | stuck in {}/{rounds} rounds: at most {} bytes in {LIMIT:?} | — |",
                windows.name,
                median(&mut alone),
                stuck.len(),
                stuck.iter().max().unwrap()
            ),
        };
        table.push(row);
    }
    println!("\n| client windows | alone, MiB/s (median of {rounds}) | beside a stalled sibling, MiB/s | stalled / alone (median of per-round ratios) |");
    println!("|---|---|---|---|");
    for row in table {
        println!("{row}");
    }
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--smoke");
    let stall_mode = std::env::args().any(|a| a == "--stall");
    let sessions: usize = arg("--sessions")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 10 } else { 100 });
    let bytes: usize = arg("--bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 16 << 20 } else { 1 << 30 });
    let rounds: usize = arg("--rounds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 1 } else { 3 });
    process::raise_fd_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sim = SimCluster::start(SimConfig {
            // Benchmarks measure the proxy: the cluster starts commands at once.
            exec_start_delay: std::time::Duration::ZERO,
            ..SimConfig::default()
        }).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca = pki::Ca::new("bench");
        let (cert, key) = ca.server().write(dir.path(), "serving");
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        if stall_mode {
            let bytes = arg("--bytes")
                .and_then(|v| v.parse().ok())
                .unwrap_or(if smoke { 16 << 20 } else { 200_000_000 });
            let rounds = arg("--rounds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(if smoke { 1 } else { 5 });
            stall(&sim, &cert, &key, &ca.pem, bytes, rounds).await;
            sim.shutdown().await;
            return;
        }
        println!("sessions: {sessions}, bytes per throughput run: {bytes}, rounds: {rounds}");
        let mut mem = [Vec::new(), Vec::new()];
        let mut tp = [Vec::new(), Vec::new()];
        for round in 0..rounds {
            for (i, form) in [Form::Http1, Form::Http2].into_iter().enumerate() {
                let proxy = start_proxy(&sim.url(), &cert, &key).await;
                mem[i].push(memory(form, &proxy, &ca.pem, sessions).await);
                drop(proxy);
                let proxy = start_proxy(&sim.url(), &cert, &key).await;
                tp[i].push(throughput(form, &proxy, &ca.pem, sessions, bytes).await);
            }
            println!("round {} done", round + 1);
        }
        let m: Vec<f64> = mem.iter_mut().map(|v| median(v)).collect();
        let t: Vec<f64> = tp.iter_mut().map(|v| median(v)).collect();
        println!("\n| measure (median of {rounds}) | {sessions} HTTP/1.1 connections | {sessions} sessions on one HTTP/2 connection | HTTP/2 / HTTP/1.1 |");
        println!("|---|---|---|---|");
        println!("| proxy RSS per idle session, KiB | {:.1} | {:.1} | {:.2}× |", m[0], m[1], m[1] / m[0]);
        println!(
            "| stdout, {sessions} sessions at once, {:.0} MiB in all, MiB/s | {:.0} | {:.0} | {:.2}× |",
            bytes as f64 / (1 << 20) as f64,
            t[0], t[1], t[1] / t[0]
        );
        sim.shutdown().await;
    });
}
