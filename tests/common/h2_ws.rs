//! WebSockets over one HTTP/2 connection (RFC 8441 extended CONNECT) with the `h2` crate as
//! the client: what a browser does once the server's SETTINGS allow it, with every knob a test
//! needs (its own windows, resets, streams it stops reading).

use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use h2::client::SendRequest;
use h2::{RecvStream, SendStream};
use http::{Method, Request, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;

/// One HTTP/2 connection to the proxy over TLS.
pub struct H2Connection {
    send: SendRequest<Bytes>,
    /// `host:port` for the `:authority`.
    authority: String,
    /// Ends when the connection does (with the GOAWAY's error if any).
    pub driver: tokio::task::JoinHandle<Result<(), h2::Error>>,
}

/// A WebSocket on one HTTP/2 stream.
pub type H2Ws = WebSocketStream<H2Io>;

/// What the proxy answered an extended CONNECT it did not accept.
#[derive(Debug)]
pub struct Refused {
    pub status: StatusCode,
    pub body: String,
}

impl H2Connection {
    /// Connects to `addr` trusting `ca_pem`, offering only `h2`, with the given receive windows
    /// (bytes), and waits for the proxy's SETTINGS.
    pub async fn connect(
        addr: std::net::SocketAddr,
        ca_pem: &str,
        stream_window: u32,
        connection_window: u32,
    ) -> H2Connection {
        Self::connect_as(addr, "127.0.0.1", ca_pem, stream_window, connection_window).await
    }

    /// [`connect`](Self::connect), asking (SNI) for `server_name`, which is also the
    /// `:authority`'s host until [`set_authority`](Self::set_authority).
    pub async fn connect_as(
        addr: std::net::SocketAddr,
        server_name: &str,
        ca_pem: &str,
        stream_window: u32,
        connection_window: u32,
    ) -> H2Connection {
        let tls = super::tls_client::connect_as(addr, server_name, ca_pem, None, &[b"h2"])
            .await
            .expect("TLS to the proxy");
        assert_eq!(
            tls.get_ref().1.alpn_protocol(),
            Some(&b"h2"[..]),
            "the proxy did not pick h2"
        );
        let (send, conn) = h2::client::Builder::new()
            .initial_window_size(stream_window)
            .initial_connection_window_size(connection_window)
            .handshake::<_, Bytes>(tls)
            .await
            .expect("HTTP/2 handshake");
        let driver = tokio::spawn(conn);
        let mut c = H2Connection {
            send,
            authority: format!("{server_name}:{}", addr.port()),
            driver,
        };
        // The server's SETTINGS come in with the first frames the driver reads.
        let mut waited = Duration::ZERO;
        while !c.send.is_extended_connect_protocol_enabled() && waited < Duration::from_secs(2) {
            tokio::time::sleep(Duration::from_millis(10)).await;
            waited += Duration::from_millis(10);
        }
        c.send = c.send.clone().ready().await.expect("connection ready");
        c
    }

    /// The `:authority` of the streams opened from now on (`host:port`).
    pub fn set_authority(&mut self, authority: String) {
        self.authority = authority;
    }

    /// Whether the proxy's SETTINGS carried SETTINGS_ENABLE_CONNECT_PROTOCOL = 1.
    pub fn extended_connect_enabled(&self) -> bool {
        self.send.is_extended_connect_protocol_enabled()
    }

    /// Sends `CONNECT` for `path` with `:protocol` (none: a plain CONNECT to the authority)
    /// and the given headers; the answer's head and the stream.
    pub async fn connect_stream(
        &self,
        path: &str,
        protocol: Option<&'static str>,
        headers: &[(&str, &str)],
    ) -> Result<(http::Response<RecvStream>, SendStream<Bytes>), h2::Error> {
        let (response, stream) = self.start_stream(path, protocol, headers).await?;
        Ok((response.await?, stream))
    }

    /// Sends `CONNECT` as [`connect_stream`](Self::connect_stream) does, without waiting for
    /// the answer: its future, and the stream (which the caller may reset meanwhile).
    pub async fn start_stream(
        &self,
        path: &str,
        protocol: Option<&'static str>,
        headers: &[(&str, &str)],
    ) -> Result<(h2::client::ResponseFuture, SendStream<Bytes>), h2::Error> {
        let uri = match protocol {
            Some(_) => format!("https://{}{path}", self.authority),
            None => self.authority.clone(),
        };
        let mut req = Request::builder().method(Method::CONNECT).uri(uri);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let mut req = req.body(()).unwrap();
        if let Some(p) = protocol {
            req.extensions_mut()
                .insert(h2::ext::Protocol::from_static(p));
        }
        let mut send = self.send.clone().ready().await?;
        send.send_request(req, false)
    }

    /// A plain `GET` of `path` on the connection: the answer's status and body.
    pub async fn get(&self, path: &str) -> (StatusCode, String) {
        let req = Request::builder()
            .method(Method::GET)
            .uri(format!("https://{}{path}", self.authority))
            .body(())
            .unwrap();
        let mut send = self.send.clone().ready().await.expect("connection ready");
        let (answer, _) = send.send_request(req, true).expect("GET sent");
        let (parts, body) = answer.await.expect("an answer").into_parts();
        (parts.status, read_body(body).await)
    }

    /// Opens a WebSocket on `path` offering `protocols`, as a browser would.
    pub async fn websocket(&self, path: &str, protocols: &str) -> Result<(H2Ws, String), Refused> {
        let mut headers = vec![("sec-websocket-version", "13")];
        if !protocols.is_empty() {
            headers.push(("sec-websocket-protocol", protocols));
        }
        let (resp, send) = self
            .connect_stream(path, Some("websocket"), &headers)
            .await
            .map_err(|e| Refused {
                status: StatusCode::from_u16(599).unwrap(),
                body: format!("stream error: {e}"),
            })?;
        let (parts, recv) = resp.into_parts();
        if parts.status != StatusCode::OK {
            return Err(Refused {
                status: parts.status,
                body: read_body(recv).await,
            });
        }
        let chosen = parts
            .headers
            .get("sec-websocket-protocol")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let ws = WebSocketStream::from_raw_socket(H2Io::new(send, recv), Role::Client, None).await;
        Ok((ws, chosen))
    }
}

/// The rest of a stream as text (an error answer's Status).
pub async fn read_body(mut recv: RecvStream) -> String {
    let mut out = Vec::new();
    while let Some(Ok(chunk)) = recv.data().await {
        let _ = recv.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One HTTP/2 stream as a byte stream: reads release window as they are consumed (a stream
/// nobody reads keeps its window closed), writes wait for the peer's window.
pub struct H2Io {
    send: SendStream<Bytes>,
    recv: RecvStream,
    pending: Bytes,
}

impl H2Io {
    pub fn new(send: SendStream<Bytes>, recv: RecvStream) -> H2Io {
        H2Io {
            send,
            recv,
            pending: Bytes::new(),
        }
    }
}

impl AsyncRead for H2Io {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        while self.pending.is_empty() {
            match ready!(self.recv.poll_data(cx)) {
                None => return Poll::Ready(Ok(())),
                Some(Ok(data)) => self.pending = data,
                Some(Err(e)) => return Poll::Ready(Err(std::io::Error::other(e))),
            }
        }
        let n = self.pending.len().min(buf.remaining());
        buf.put_slice(&self.pending[..n]);
        self.pending.advance(n);
        let _ = self.recv.flow_control().release_capacity(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Io {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        self.send.reserve_capacity(buf.len());
        loop {
            let available = self.send.capacity();
            if available > 0 {
                let n = available.min(buf.len());
                self.send
                    .send_data(Bytes::copy_from_slice(&buf[..n]), false)
                    .map_err(std::io::Error::other)?;
                return Poll::Ready(Ok(n));
            }
            match ready!(self.send.poll_capacity(cx)) {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Poll::Ready(Err(std::io::Error::other(e))),
                None => return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let _ = self.send.send_data(Bytes::new(), true);
        Poll::Ready(Ok(()))
    }
}

impl H2Io {
    /// Resets the stream (RST_STREAM) with `reason`.
    pub fn reset(&mut self, reason: h2::Reason) {
        self.send.send_reset(reason);
    }
}
