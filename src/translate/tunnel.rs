//! The port-forward tunnel (`SPDY/3.1+portforward.k8s.io`, PROTOCOL.md §2.1): an SPDY session
//! carried inside binary WebSocket messages, relayed to an upstream SPDY connection without
//! parsing it. Message boundaries mean nothing: kubectl writes one SPDY frame as several tiny
//! messages.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

/// Largest upstream read turned into one message (what kube-apiserver's tunnel does).
const CHUNK: usize = 32 * 1024;

/// Byte counts and the reason a tunnel ended.
#[derive(Debug, Clone)]
pub struct TunnelOutcome {
    /// Bytes from the client to the upstream.
    pub bytes_up: u64,
    /// Bytes from the upstream to the client.
    pub bytes_down: u64,
    /// Which side ended first.
    pub ended_by: TunnelEnd,
    pub duration: Duration,
}

/// Which side ended the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelEnd {
    Client,
    Upstream,
    /// The client sent something that is not a binary message.
    ClientViolation,
    /// The proxy shut down (drain timeout passed).
    Drained,
}

/// Relays until either side ends, then closes both: Close 1000 to the client, shutdown to the
/// upstream. `leftover` are bytes the upstream sent right after its 101.
/// `stop` ends the tunnel early (graceful shutdown), with Close 1001 to the client.
pub async fn run<S, U>(
    ws: WebSocketStream<S>,
    upstream: U,
    leftover: Bytes,
    stop: CancellationToken,
) -> TunnelOutcome
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let (mut sink, mut stream) = ws.split();
    let (mut up_read, mut up_write) = tokio::io::split(upstream);
    let mut bytes_up = 0u64;
    let mut bytes_down = 0u64;

    let downstream = async {
        if !leftover.is_empty() {
            bytes_down += leftover.len() as u64;
            if sink.send(Message::Binary(leftover)).await.is_err() {
                return;
            }
        }
        let mut buf = BytesMut::new();
        loop {
            buf.reserve(CHUNK);
            match up_read.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    bytes_down += n as u64;
                    let msg = buf.split().freeze();
                    if sink.send(Message::Binary(msg)).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let upstream_dir = async {
        while let Some(msg) = stream.next().await {
            match msg {
                Ok(Message::Binary(data)) => {
                    if up_write.write_all(&data).await.is_err() {
                        return TunnelEnd::Upstream;
                    }
                    bytes_up += data.len() as u64;
                }
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {}
                Ok(Message::Close(_)) => return TunnelEnd::Client,
                Ok(Message::Text(_)) | Err(_) => return TunnelEnd::ClientViolation,
            }
        }
        TunnelEnd::Client
    };
    let ended_by = tokio::select! {
        _ = downstream => TunnelEnd::Upstream,
        end = upstream_dir => end,
        _ = stop.cancelled() => TunnelEnd::Drained,
    };
    let _ = up_write.shutdown().await;
    let close = match ended_by {
        TunnelEnd::ClientViolation => CloseFrame {
            code: CloseCode::Protocol,
            reason: "the tunnel carries binary messages only".into(),
        },
        TunnelEnd::Drained => CloseFrame {
            code: CloseCode::Away,
            reason: "kube-ws-proxy is shutting down".into(),
        },
        _ => CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        },
    };
    if sink.send(Message::Close(Some(close))).await.is_ok() {
        // Give the client a moment to answer the Close so the socket ends cleanly.
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Some(Ok(_)) = stream.next().await {}
        })
        .await;
    }
    TunnelOutcome {
        bytes_up,
        bytes_down,
        ended_by,
        duration: started.elapsed(),
    }
}
