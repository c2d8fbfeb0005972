//! The soak's sessions, each through the proxy into the simulated cluster and each checking
//! what it got end to end: exact bytes (a `seq` listing, a sha256 of the stdin sent, echoed
//! lines, tar archives both ways as `kubectl cp` moves them, port-forwarded random data, a
//! followed log's numbered lines) and the exit code.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
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
    /// `kubectl cp` from a pod: `tar cf -` of a directory, the archive checked byte for byte.
    TarDown,
    /// `kubectl cp` into a pod: an archive into `tar xf -`, the files it made checked by sha256.
    TarUp,
    /// the port-forward tunnel, random data echoed through forwarded connections.
    PortForward,
    /// a followed log (`kubectl logs -f`), a few lines read.
    Logs,
}

/// Every kind, in the order the mix cycles them.
pub const MIX: [Work; 8] = [
    Work::Stdout,
    Work::Stdin,
    Work::Echo,
    Work::TarDown,
    Work::ExitCode,
    Work::PortForward,
    Work::TarUp,
    Work::Logs,
];

impl Work {
    pub fn name(self) -> &'static str {
        match self {
            Work::Stdout => "exec stdout",
            Work::Stdin => "exec stdin",
            Work::Echo => "exec echo",
            Work::ExitCode => "exec exit code",
            Work::TarDown => "cp from pod (tar)",
            Work::TarUp => "cp into pod (tar)",
            Work::PortForward => "port-forward",
            Work::Logs => "followed log",
        }
    }
}

/// How a failed session ended, as its client saw it: what the soak reports per fault, and
/// what tells an explained failure (the proxy said what happened) from a silent one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ending {
    /// The upgrade or request was answered with this HTTP status (a Status body).
    Refused(u16),
    /// No connection or no upgrade answer at all.
    Unreachable,
    /// A Failure Status on the error stream, by its reason and the start of its message.
    Status(String),
    /// A close frame with this code and no Status before it.
    Closed(u16),
    /// The connection ended with neither a Status nor a close frame.
    Dropped,
    /// A forwarded connection's stream ended (reset or cut) before all its bytes came back; the
    /// tunnel itself ended with the close code, if any.
    ForwardCut(Option<u16>),
    /// The followed log ended, or went quiet for 10 s.
    LogCut,
    /// Wrong bytes or exit code although the session said it succeeded: silent corruption.
    Wrong,
}

impl Ending {
    /// Whether the client was told what happened (a Status, an HTTP error, a close code, a
    /// reset stream or an ended response), rather than left with bytes that are silently wrong.
    pub fn explained(&self) -> bool {
        !matches!(self, Ending::Wrong)
    }

    /// How the soak's report names it.
    pub fn label(&self) -> String {
        match self {
            Ending::Refused(code) => format!("HTTP {code}"),
            Ending::Unreachable => "no connection".into(),
            Ending::Status(s) => format!("Status {s}"),
            Ending::Closed(code) => format!("close {code}, no Status"),
            Ending::Dropped => "connection ended, no Status or close".into(),
            Ending::ForwardCut(Some(code)) => format!("forwarded stream cut, tunnel close {code}"),
            Ending::ForwardCut(None) => "forwarded stream cut, tunnel ended without close".into(),
            Ending::LogCut => "log response ended or stalled".into(),
            Ending::Wrong => "WRONG BYTES OR EXIT CODE".into(),
        }
    }
}

/// Why one session failed.
#[derive(Debug, Clone)]
pub struct Failure {
    pub ending: Ending,
    pub detail: String,
}

impl Failure {
    fn new(ending: Ending, detail: impl Into<String>) -> Failure {
        Failure {
            ending,
            detail: detail.into(),
        }
    }

    /// An upgrade that failed: the HTTP status it was answered with, if any.
    fn upgrade(e: tokio_tungstenite::tungstenite::Error) -> Failure {
        use tokio_tungstenite::tungstenite::Error;
        let ending = match &e {
            Error::Http(resp) => Ending::Refused(resp.status().as_u16()),
            _ => Ending::Unreachable,
        };
        Failure::new(ending, format!("upgrade: {e}"))
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.ending.label(), self.detail)
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
) -> Result<u64, Failure> {
    match work {
        Work::Stdout => {
            let n = 1000 + rng.below(40_000);
            let expected: String = (1..=n).map(|i| format!("{i}\n")).collect();
            let out = exec(proxy, &["seq", "1", &n.to_string()], None, 0).await?;
            if out != expected.as_bytes() {
                return Err(Failure::new(
                    Ending::Wrong,
                    format!(
                        "seq 1 {n}: {} bytes, {} expected, differing",
                        out.len(),
                        expected.len()
                    ),
                ));
            }
            Ok(out.len() as u64)
        }
        Work::Stdin => {
            let len = 16 * 1024 + rng.below(2 << 20) as usize;
            let data = rng.bytes(len);
            let sha = hex(&Sha256::digest(&data));
            let out = exec(proxy, &["sha256sum"], Some(Input::Whole(&data)), 0).await?;
            let got = String::from_utf8_lossy(&out);
            if got.split_whitespace().next() != Some(sha.as_str()) {
                return Err(Failure::new(
                    Ending::Wrong,
                    format!("sha256 of {} bytes: {got:?}, {sha} expected", data.len()),
                ));
            }
            Ok(data.len() as u64)
        }
        Work::Echo => {
            let lines: Vec<String> = (0..20)
                .map(|_| format!("line-{:x}\n", rng.next()))
                .collect();
            let out = exec(proxy, &["cat"], Some(Input::Lines(&lines)), 0).await?;
            let expected = lines.concat();
            if out != expected.as_bytes() {
                return Err(Failure::new(
                    Ending::Wrong,
                    format!("echo: {:?}", String::from_utf8_lossy(&out)),
                ));
            }
            Ok(2 * out.len() as u64)
        }
        Work::ExitCode => {
            exec(proxy, &["sh", "-c", "exit 7"], None, 7).await?;
            Ok(0)
        }
        Work::TarDown => {
            let cp = TarFixture::get();
            let dir = cp.dir.to_str().expect("a UTF-8 temp path");
            let out = exec(proxy, &["tar", "cf", "-", "-C", dir, "."], None, 0).await?;
            if out != cp.archive {
                return Err(Failure::new(
                    Ending::Wrong,
                    format!(
                        "tar cf: {} bytes, {} expected, differing",
                        out.len(),
                        cp.archive.len()
                    ),
                ));
            }
            Ok(out.len() as u64)
        }
        Work::TarUp => {
            let cp = TarFixture::get();
            // Unpacked into a directory of its own, as `kubectl cp` does, then each file read back.
            // The directory is in the pod's, which goes with the cluster when a fault kills the
            // shell before its `rm`.
            let script = "d=$(mktemp -d -p .) && tar xf - -C \"$d\" && cd \"$d\" && sha256sum f*; \
                          s=$?; rm -rf \"$d\"; exit $s";
            let out = exec(
                proxy,
                &["sh", "-c", script],
                Some(Input::Whole(&cp.archive)),
                0,
            )
            .await?;
            if out != cp.sums.as_bytes() {
                return Err(Failure::new(
                    Ending::Wrong,
                    format!("tar xf: {:?}", String::from_utf8_lossy(&out)),
                ));
            }
            Ok(cp.archive.len() as u64)
        }
        Work::PortForward => port_forward(proxy, pod_echo, rng).await,
        Work::Logs => followed_log(proxy).await,
    }
}

/// What the cp-like sessions move: a directory of random files on this machine (where the
/// simulated cluster runs its commands too), its tar archive as this machine's `tar` makes it,
/// and `sha256sum f*` of the files as the pod prints it.
struct TarFixture {
    dir: PathBuf,
    archive: Vec<u8>,
    sums: String,
}

static TAR_FIXTURE: OnceLock<TarFixture> = OnceLock::new();

impl TarFixture {
    /// Made at first use: eight files of 1 KiB to 256 KiB.
    fn get() -> &'static TarFixture {
        TAR_FIXTURE.get_or_init(|| {
            let dir =
                std::env::temp_dir().join(format!("kube-ws-proxy-soak-cp-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("the cp fixture's directory");
            let mut rng = Rng::new(0x7a72);
            let mut sums = String::new();
            for i in 0..8 {
                let len = 1024 + rng.below(255 * 1024) as usize;
                let data = rng.bytes(len);
                let name = format!("f{i}");
                std::fs::write(dir.join(&name), &data).expect("a cp fixture file");
                sums.push_str(&format!("{}  {name}\n", hex(&Sha256::digest(&data))));
            }
            let tar = std::process::Command::new("tar")
                .args(["cf", "-", "-C"])
                .arg(&dir)
                .arg(".")
                .output()
                .expect("tar, for the cp-like sessions");
            assert!(tar.status.success(), "tar cf: {:?}", tar.status);
            TarFixture {
                dir,
                archive: tar.stdout,
                sums,
            }
        })
    }
}

/// Removes the cp-like sessions' files, if any were made.
pub fn remove_tar_fixture() {
    if let Some(cp) = TAR_FIXTURE.get() {
        let _ = std::fs::remove_dir_all(&cp.dir);
    }
}

/// What an exec session sends.
enum Input<'a> {
    /// All of it, then end of input.
    Whole(&'a [u8]),
    /// One line at a time, each once the previous one came back; then end of input.
    Lines(&'a [String]),
}

/// What the client saw at the end of an exec session.
#[derive(Default)]
struct Seen {
    status: Option<Status>,
    close: Option<u16>,
}

impl Seen {
    /// Takes in one message other than stdout; false once the session is over.
    fn message(&mut self, m: &Message) -> bool {
        match m {
            Message::Binary(d) if d.first() == Some(&3) => {
                self.status = serde_json::from_slice(&d[1..]).ok();
                true
            }
            Message::Close(c) => {
                self.close = Some(c.as_ref().map_or(1005, |c| u16::from(c.code)));
                false
            }
            _ => true,
        }
    }

    /// How a session that ended before it was done ended.
    fn failure(&self, detail: String) -> Failure {
        match (&self.status, self.close) {
            (Some(status), _) => Failure::new(Ending::Status(status_label(status)), detail),
            (None, Some(code)) => Failure::new(Ending::Closed(code), detail),
            (None, None) => Failure::new(Ending::Dropped, detail),
        }
    }
}

/// A Status by its reason and the start of its message (without the numbers, so that the
/// report groups alike ones).
fn status_label(status: &Status) -> String {
    if let Some(code) = status.exit_code() {
        return format!("exit {code}");
    }
    // kube-apiserver's prefix for every InternalError says nothing here.
    let message = status
        .message
        .trim_start_matches("Internal error occurred: ");
    let message: String = message
        .chars()
        .take(56)
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect();
    format!("{}: {message}", status.reason)
}

/// Runs `command` over v5 through the proxy: its stdout, once its Status said exit code
/// `want`.
async fn exec(
    proxy: SocketAddr,
    command: &[&str],
    input: Option<Input<'_>>,
    want: u8,
) -> Result<Vec<u8>, Failure> {
    let path = ws_client::exec_path("soak", command, input.is_some(), true, false);
    let (mut ws, _) = ws_client::connect(proxy, &path, "v5.channel.k8s.io")
        .await
        .map_err(Failure::upgrade)?;
    let mut out = Vec::new();
    let mut seen = Seen::default();
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
            let receive = read_session(&mut stream, &mut out, &mut seen);
            let (sent, ()) = tokio::join!(send, receive);
            // A send that failed because the session ended early is told by what was read.
            if let Err(e) = sent {
                if seen.status.is_none() {
                    return Err(seen.failure(format!("stdin: {e}")));
                }
            }
            return finish(out, &seen, want);
        }
        Some(Input::Lines(lines)) => {
            for line in lines {
                let mut m = vec![0u8];
                m.extend_from_slice(line.as_bytes());
                if let Err(e) = ws.send(Message::Binary(m.into())).await {
                    return Err(seen.failure(format!("stdin: {e}")));
                }
                let want = out.len() + line.len();
                while out.len() < want {
                    match ws.next().await {
                        Some(Ok(Message::Binary(d))) if d.first() == Some(&1) => {
                            out.extend_from_slice(&d[1..])
                        }
                        Some(Ok(m)) => {
                            if !seen.message(&m) || seen.status.is_some() {
                                let detail = format!(
                                    "ended after {} of {} echoed bytes",
                                    out.len(),
                                    lines.concat().len()
                                );
                                // `cat` exits only at the end of its input: an exit code now
                                // would be a lie.
                                if seen.status.as_ref().and_then(Status::exit_code).is_some() {
                                    return Err(Failure::new(Ending::Wrong, detail));
                                }
                                return Err(seen.failure(detail));
                            }
                        }
                        Some(Err(e)) => return Err(seen.failure(format!("read: {e}"))),
                        None => return Err(seen.failure("ended early".into())),
                    }
                }
            }
            if let Err(e) = ws
                .send(Message::Binary(Bytes::from_static(&[255, 0])))
                .await
            {
                return Err(seen.failure(format!("stdin close: {e}")));
            }
        }
    }
    read_session(&mut ws, &mut out, &mut seen).await;
    finish(out, &seen, want)
}

/// Reads stdout and the Status until the proxy closes.
async fn read_session<S>(stream: &mut S, out: &mut Vec<u8>, seen: &mut Seen)
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    while let Some(Ok(m)) = stream.next().await {
        match &m {
            Message::Binary(d) if d.first() == Some(&1) => out.extend_from_slice(&d[1..]),
            _ => {
                if !seen.message(&m) {
                    break;
                }
            }
        }
    }
}

/// The session's stdout once its Status said exit code `want`; a Success or the wrong exit
/// code with bytes that turn out wrong is silent corruption, told apart by the caller.
fn finish(out: Vec<u8>, seen: &Seen, want: u8) -> Result<Vec<u8>, Failure> {
    let Some(status) = &seen.status else {
        return Err(seen.failure(format!("no Status after {} bytes", out.len())));
    };
    match status.exit_code() {
        Some(code) if code == want => Ok(out),
        // The command's own exit code, but the wrong one: only a broken translation does that.
        Some(code) => Err(Failure::new(
            Ending::Wrong,
            format!("exit {code}, exit {want} expected"),
        )),
        None => Err(seen.failure(format!("after {} bytes", out.len()))),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A port-forward tunnel with one to three forwarded connections, each echoing random data.
async fn port_forward(proxy: SocketAddr, port: u16, rng: &mut Rng) -> Result<u64, Failure> {
    let mut req = format!("ws://{proxy}/api/v1/namespaces/default/pods/soak/portforward")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "SPDY/3.1+portforward.k8s.io".parse().unwrap(),
    );
    let tcp = TcpStream::connect(proxy)
        .await
        .map_err(|e| Failure::new(Ending::Unreachable, format!("connect: {e}")))?;
    let ws: Ws = tokio_tungstenite::client_async(req, tcp)
        .await
        .map_err(Failure::upgrade)?
        .0;
    let (io, close) = ws_client::as_io_keeping_close(ws);
    let cut = |detail: String| {
        let code = *close.lock().unwrap();
        Failure::new(Ending::ForwardCut(code), detail)
    };
    let conn = Connection::client(io, Bytes::new(), Config::default());
    let mut moved = 0;
    for request in 0..1 + rng.below(3) {
        let headers = |kind: &str| {
            let mut h = HeaderBlock::new();
            h.push("streamtype", kind);
            h.push("port", port.to_string());
            h.push("requestid", request.to_string());
            h
        };
        let (_error_tx, mut error_rx) = conn
            .open_stream(headers("error"))
            .await
            .map_err(|e| cut(format!("error stream: {e}")))?
            .split();
        let (mut tx, mut rx) = conn
            .open_stream(headers("data"))
            .await
            .map_err(|e| cut(format!("data stream: {e}")))?
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
        if got.len() < data.len() {
            // The kubelet's error stream says why a forwarded connection failed, if it can.
            let said = match tokio::time::timeout(Duration::from_millis(100), error_rx.recv()).await
            {
                Ok(Some(Ok(text))) if !text.is_empty() => {
                    format!(", error stream: {}", String::from_utf8_lossy(&text))
                }
                _ => String::new(),
            };
            return Err(cut(format!(
                "forwarded connection {request}: {} of {} bytes back{said}",
                got.len(),
                data.len()
            )));
        }
        if got != data {
            return Err(Failure::new(
                Ending::Wrong,
                format!(
                    "forwarded connection {request}: {} bytes back, differing",
                    got.len()
                ),
            ));
        }
        sent.map_err(|e| cut(format!("forwarded send: {e}")))?;
        moved += 2 * data.len() as u64;
    }
    conn.close().await;
    Ok(moved)
}

/// A followed log: its first lines arrive in order (the simulated kubelet writes `log line N`,
/// one more every 200 ms while followed); the client then goes away, as `kubectl logs -f`
/// stopped with ^C does.
async fn followed_log(proxy: SocketAddr) -> Result<u64, Failure> {
    use http_body_util::{BodyExt, Empty};
    let unreachable = |what: &str, e: &dyn std::fmt::Display| {
        Failure::new(Ending::Unreachable, format!("{what}: {e}"))
    };
    let tcp = TcpStream::connect(proxy)
        .await
        .map_err(|e| unreachable("connect", &e))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .map_err(|e| unreachable("handshake", &e))?;
    tokio::spawn(conn);
    let req = http::Request::get("/api/v1/namespaces/default/pods/soak/log?follow=true")
        .header(http::header::HOST, proxy.to_string())
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| unreachable("request", &e))?;
    if !resp.status().is_success() {
        return Err(Failure::new(
            Ending::Refused(resp.status().as_u16()),
            "followed log",
        ));
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
            Ok(other) => {
                return Err(Failure::new(
                    Ending::LogCut,
                    format!("log ended early: {other:?}"),
                ))
            }
            Err(_) => return Err(Failure::new(Ending::LogCut, "no log line for 10 s")),
        }
    }
    let text = String::from_utf8_lossy(&text);
    for (i, line) in text.lines().take(want).enumerate() {
        if line != format!("log line {}", i + 1) {
            return Err(Failure::new(
                Ending::Wrong,
                format!("log line {}: {line:?}", i + 1),
            ));
        }
    }
    Ok(text.len() as u64)
}
