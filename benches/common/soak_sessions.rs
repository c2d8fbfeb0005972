//! The soak's sessions, each through the proxy into the simulated cluster and each checking
//! what it got end to end: exact bytes (a `seq` listing, a sha256 of the stdin sent, echoed
//! lines, port-forwarded random data, a followed log's numbered lines) and the exit code.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use kube_ws_proxy::spdy::frame::HeaderBlock;
use kube_ws_proxy::spdy::proto::{Config, Connection};
use kube_ws_proxy::translate::status::Status;
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use super::ws_client::{self, Ws};

/// The kinds of session in the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Work {
    /// exec printing a `seq` listing (cp down-like: output-heavy).
    Stdout,
    /// exec reading random stdin into `sha256sum` (cp up-like: input-heavy).
    Stdin,
    /// exec `cat`, lines typed and echoed one at a time (interactive).
    Echo,
    /// exec ending with exit code 7.
    ExitCode,
    /// the port-forward tunnel, random data echoed through forwarded connections.
    PortForward,
    /// a followed log (`kubectl logs -f`), a few lines read.
    Logs,
}

/// Every kind, in the order the mix cycles them.
pub const MIX: [Work; 6] = [
    Work::Stdout,
    Work::Stdin,
    Work::Echo,
    Work::ExitCode,
    Work::PortForward,
    Work::Logs,
];

impl Work {
    pub fn name(self) -> &'static str {
        match self {
            Work::Stdout => "exec stdout",
            Work::Stdin => "exec stdin",
            Work::Echo => "exec echo",
            Work::ExitCode => "exec exit code",
            Work::PortForward => "port-forward",
            Work::Logs => "followed log",
        }
    }
}

/// A small deterministic generator (xorshift), so a session's data is reproducible from its
/// number without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(n);
        out
    }
}

/// Runs one session of `work` against the proxy at `proxy` (`pod_echo`: the echo service the
/// port-forward reaches); `Ok` when everything it got was exactly what it should have, with
/// the bytes it moved.
pub async fn run(
    work: Work,
    proxy: SocketAddr,
    pod_echo: u16,
    rng: &mut Rng,
) -> Result<u64, String> {
    match work {
        Work::Stdout => {
            let n = 1000 + rng.below(40_000);
            let expected: String = (1..=n).map(|i| format!("{i}\n")).collect();
            let (out, status) = exec(proxy, &["seq", "1", &n.to_string()], None).await?;
            check_exit(&status, 0)?;
            if out != expected.as_bytes() {
                return Err(format!(
                    "seq 1 {n}: {} bytes, {} expected, differing",
                    out.len(),
                    expected.len()
                ));
            }
            Ok(out.len() as u64)
        }
        Work::Stdin => {
            let len = 16 * 1024 + rng.below(2 << 20) as usize;
            let data = rng.bytes(len);
            let sha = hex(&Sha256::digest(&data));
            let (out, status) = exec(proxy, &["sha256sum"], Some(Input::Whole(&data))).await?;
            check_exit(&status, 0)?;
            let got = String::from_utf8_lossy(&out);
            if got.split_whitespace().next() != Some(sha.as_str()) {
                return Err(format!(
                    "sha256 of {} bytes: {got:?}, {sha} expected",
                    data.len()
                ));
            }
            Ok(data.len() as u64)
        }
        Work::Echo => {
            let lines: Vec<String> = (0..20)
                .map(|_| format!("line-{:x}\n", rng.next()))
                .collect();
            let (out, status) = exec(proxy, &["cat"], Some(Input::Lines(&lines))).await?;
            check_exit(&status, 0)?;
            let expected = lines.concat();
            if out != expected.as_bytes() {
                return Err(format!("echo: {:?}", String::from_utf8_lossy(&out)));
            }
            Ok(2 * out.len() as u64)
        }
        Work::ExitCode => {
            let (_, status) = exec(proxy, &["sh", "-c", "exit 7"], None).await?;
            check_exit(&status, 7)?;
            Ok(0)
        }
        Work::PortForward => port_forward(proxy, pod_echo, rng).await,
        Work::Logs => followed_log(proxy).await,
    }
}

/// What an exec session sends.
enum Input<'a> {
    /// All of it, then end of input.
    Whole(&'a [u8]),
    /// One line at a time, each once the previous one came back; then end of input.
    Lines(&'a [String]),
}

/// Runs `command` over v5 through the proxy: its stdout and final Status.
async fn exec(
    proxy: SocketAddr,
    command: &[&str],
    input: Option<Input<'_>>,
) -> Result<(Vec<u8>, Status), String> {
    let path = ws_client::exec_path("soak", command, input.is_some(), true, false);
    let (mut ws, _) = ws_client::connect(proxy, &path, "v5.channel.k8s.io")
        .await
        .map_err(|e| format!("upgrade: {e}"))?;
    let mut out = Vec::new();
    let mut status = None;
    match input {
        None => {}
        Some(Input::Whole(data)) => {
            // Sent while reading, so that a full pipe in either direction cannot deadlock.
            let (mut sink, mut stream) = ws.split();
            let send = async {
                for chunk in data.chunks(32 * 1024) {
                    let mut m = Vec::with_capacity(chunk.len() + 1);
                    m.push(0);
                    m.extend_from_slice(chunk);
                    sink.send(Message::Binary(m.into())).await?;
                }
                sink.send(Message::Binary(Bytes::from_static(&[255, 0])))
                    .await?;
                Ok::<_, tokio_tungstenite::tungstenite::Error>(sink)
            };
            let receive = read_session(&mut stream, &mut out, &mut status);
            let (sent, ()) = tokio::join!(send, receive);
            // The sink is done with: the session ended.
            drop(sent.map_err(|e| format!("stdin: {e}"))?);
            return finish(out, status);
        }
        Some(Input::Lines(lines)) => {
            for line in lines {
                let mut m = vec![0u8];
                m.extend_from_slice(line.as_bytes());
                ws.send(Message::Binary(m.into()))
                    .await
                    .map_err(|e| format!("stdin: {e}"))?;
                let want = out.len() + line.len();
                while out.len() < want {
                    match ws.next().await {
                        Some(Ok(Message::Binary(d))) if d.first() == Some(&1) => {
                            out.extend_from_slice(&d[1..])
                        }
                        Some(Ok(Message::Binary(d))) if d.first() == Some(&3) => {
                            return Err(format!(
                                "ended early: {}",
                                String::from_utf8_lossy(&d[1..])
                            ))
                        }
                        Some(Ok(Message::Close(c))) => return Err(format!("closed early: {c:?}")),
                        Some(Ok(_)) => {}
                        Some(Err(e)) => return Err(format!("read: {e}")),
                        None => return Err("ended early".into()),
                    }
                }
            }
            ws.send(Message::Binary(Bytes::from_static(&[255, 0])))
                .await
                .map_err(|e| format!("stdin close: {e}"))?;
        }
    }
    read_session(&mut ws, &mut out, &mut status).await;
    finish(out, status)
}

/// Reads stdout and the Status until the proxy closes.
async fn read_session<S>(stream: &mut S, out: &mut Vec<u8>, status: &mut Option<Status>)
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    while let Some(Ok(m)) = stream.next().await {
        match m {
            Message::Binary(d) => match d.first() {
                Some(1) => out.extend_from_slice(&d[1..]),
                Some(3) => *status = serde_json::from_slice(&d[1..]).ok(),
                _ => {}
            },
            Message::Close(_) => break,
            _ => {}
        }
    }
}

fn finish(out: Vec<u8>, status: Option<Status>) -> Result<(Vec<u8>, Status), String> {
    let status = status.ok_or_else(|| format!("no Status after {} bytes", out.len()))?;
    Ok((out, status))
}

fn check_exit(status: &Status, want: u8) -> Result<(), String> {
    match status.exit_code() {
        Some(code) if code == want => Ok(()),
        _ => Err(format!("Status {}, exit {want} expected", status.summary())),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A port-forward tunnel with one to three forwarded connections, each echoing random data.
async fn port_forward(proxy: SocketAddr, port: u16, rng: &mut Rng) -> Result<u64, String> {
    let mut req = format!("ws://{proxy}/api/v1/namespaces/default/pods/soak/portforward")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "SPDY/3.1+portforward.k8s.io".parse().unwrap(),
    );
    let tcp = TcpStream::connect(proxy)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let ws: Ws = tokio_tungstenite::client_async(req, tcp)
        .await
        .map_err(|e| format!("upgrade: {e}"))?
        .0;
    let conn = Connection::client(ws_client::as_io(ws), Bytes::new(), Config::default());
    let mut moved = 0;
    for request in 0..1 + rng.below(3) {
        let headers = |kind: &str| {
            let mut h = HeaderBlock::new();
            h.push("streamtype", kind);
            h.push("port", port.to_string());
            h.push("requestid", request.to_string());
            h
        };
        let _error = conn
            .open_stream(headers("error"))
            .await
            .map_err(|e| format!("error stream: {e}"))?;
        let (mut tx, mut rx) = conn
            .open_stream(headers("data"))
            .await
            .map_err(|e| format!("data stream: {e}"))?
            .split();
        let len = 1024 + rng.below(512 * 1024) as usize;
        let data = Bytes::from(rng.bytes(len));
        let send = async {
            for chunk in data.chunks(32 * 1024) {
                tx.send(data.slice_ref(chunk)).await?;
            }
            tx.finish().await
        };
        let receive = async {
            let mut got = Vec::with_capacity(data.len());
            while got.len() < data.len() {
                match rx.recv().await {
                    Some(Ok(chunk)) => got.extend_from_slice(&chunk),
                    _ => break,
                }
            }
            got
        };
        let (sent, got) = tokio::join!(send, receive);
        sent.map_err(|e| format!("forwarded send: {e}"))?;
        if got != data {
            return Err(format!(
                "forwarded connection {request}: {} of {} bytes back, differing",
                got.len(),
                data.len()
            ));
        }
        moved += 2 * data.len() as u64;
    }
    conn.close().await;
    Ok(moved)
}

/// A followed log: its first lines arrive in order (the simulated kubelet writes `log line N`,
/// one more every 200 ms while followed); the client then goes away, as `kubectl logs -f`
/// stopped with ^C does.
async fn followed_log(proxy: SocketAddr) -> Result<u64, String> {
    use http_body_util::{BodyExt, Empty};
    let tcp = TcpStream::connect(proxy)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    let req = http::Request::get("/api/v1/namespaces/default/pods/soak/log?follow=true")
        .header(http::header::HOST, proxy.to_string())
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("status {}", resp.status()));
    }
    let mut body = resp.into_body();
    let mut text = Vec::new();
    let want = 12;
    while text.iter().filter(|&&b| b == b'\n').count() < want {
        match tokio::time::timeout(Duration::from_secs(10), body.frame()).await {
            Ok(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    text.extend_from_slice(d);
                }
            }
            Ok(other) => return Err(format!("log ended early: {other:?}")),
            Err(_) => return Err("no log line for 10 s".into()),
        }
    }
    let text = String::from_utf8_lossy(&text);
    for (i, line) in text.lines().take(want).enumerate() {
        if line != format!("log line {}", i + 1) {
            return Err(format!("log line {}: {line:?}", i + 1));
        }
    }
    Ok(text.len() as u64)
}
