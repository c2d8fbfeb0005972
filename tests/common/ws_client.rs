//! A raw WebSocket client for protocol-level tests (what kubectl would never send).

use std::net::SocketAddr;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

pub type Ws = WebSocketStream<TcpStream>;

/// Opens a WebSocket to `path` on `addr` offering `protocols`.
pub async fn connect(
    addr: SocketAddr,
    path: &str,
    protocols: &str,
) -> Result<(Ws, http::Response<Option<Vec<u8>>>), tokio_tungstenite::tungstenite::Error> {
    let mut req = format!("ws://{addr}{path}").into_client_request().unwrap();
    if !protocols.is_empty() {
        req.headers_mut()
            .insert("Sec-WebSocket-Protocol", protocols.parse().unwrap());
    }
    let tcp = TcpStream::connect(addr).await.unwrap();
    tokio_tungstenite::client_async(req, tcp).await
}

/// The exec URL for `pod` running `command` with the given streams.
pub fn exec_path(pod: &str, command: &[&str], stdin: bool, stdout: bool, stderr: bool) -> String {
    let mut q: Vec<String> = command
        .iter()
        .map(|c| format!("command={}", urlencode(c)))
        .collect();
    for (name, on) in [("stdin", stdin), ("stdout", stdout), ("stderr", stderr)] {
        if on {
            q.push(format!("{name}=true"));
        }
    }
    format!("/api/v1/namespaces/default/pods/{pod}/exec?{}", q.join("&"))
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Everything a session delivered, split by channel, plus how it was closed.
#[derive(Debug, Default)]
pub struct Transcript {
    /// Messages in arrival order (channel byte included).
    pub messages: Vec<Vec<u8>>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub status: Vec<u8>,
    pub close: Option<CloseFrame>,
}

/// Reads until the server closes, answering nothing (tungstenite answers pings).
pub async fn read_to_close(ws: &mut Ws) -> Transcript {
    let mut t = Transcript::default();
    while let Some(msg) = ws.next().await {
        match msg {
            Ok(Message::Binary(data)) => {
                match data.first() {
                    Some(1) => t.stdout.extend_from_slice(&data[1..]),
                    Some(2) => t.stderr.extend_from_slice(&data[1..]),
                    Some(3) => t.status.extend_from_slice(&data[1..]),
                    _ => {}
                }
                t.messages.push(data.to_vec());
            }
            Ok(Message::Close(frame)) => {
                t.close = frame;
                break;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    t
}

/// Sends one binary message.
pub async fn send(ws: &mut Ws, data: &[u8]) {
    ws.send(Message::Binary(data.to_vec().into()))
        .await
        .unwrap();
}

/// Carries a WebSocket's binary messages as a byte stream (what kubectl's tunnel does).
pub fn as_io<S>(ws: WebSocketStream<S>) -> tokio::io::DuplexStream
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    as_io_keeping_close(ws).0
}

/// [`as_io`], keeping the code of the close frame that ended the stream (1005 for one without
/// a code), if one did.
pub fn as_io_keeping_close<S>(
    ws: WebSocketStream<S>,
) -> (
    tokio::io::DuplexStream,
    std::sync::Arc<std::sync::Mutex<Option<u16>>>,
)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let close = std::sync::Arc::new(std::sync::Mutex::new(None));
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    let (mut rd, mut wr) = tokio::io::split(theirs);
    let (mut sink, mut stream) = ws.split();
    let seen = close.clone();
    tokio::spawn(async move {
        while let Some(Ok(msg)) = stream.next().await {
            match msg {
                Message::Binary(b) if wr.write_all(&b).await.is_err() => break,
                Message::Close(c) => {
                    *seen.lock().unwrap() = Some(c.map_or(1005, |c| u16::from(c.code)));
                    break;
                }
                _ => {}
            }
        }
        let _ = wr.shutdown().await;
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink
                        .send(Message::Binary(buf[..n].to_vec().into()))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        let _ = sink.close().await;
    });
    (ours, close)
}

/// Reads an HTTP response head; returns it and the bytes after it.
pub async fn read_http_head(tcp: &mut TcpStream) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            return (head, buf[end + 4..].to_vec());
        }
        let n = tcp.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed before the response head");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Opens an exec WebSocket on `path` offering `v5.channel.k8s.io` by hand, so the caller may
/// send what a WebSocket library would not (a frame that never ends); the connection after
/// the 101 and whatever came with it.
pub async fn raw_v5(addr: SocketAddr, path: &str) -> (TcpStream, Vec<u8>) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n"
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let (head, leftover) = read_http_head(&mut tcp).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    (tcp, leftover)
}
