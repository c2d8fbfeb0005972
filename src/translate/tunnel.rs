//! The port-forward tunnel (`SPDY/3.1+portforward.k8s.io`, PROTOCOL.md §2.1): an SPDY session
//! carried inside binary WebSocket messages, relayed to an upstream SPDY connection without
//! parsing it. Message boundaries mean nothing: kubectl writes one SPDY frame as several tiny
//! messages.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::ws::{CloseCode, CloseFrame, Incoming, WebSocket};

/// Largest upstream read turned into one message (what kube-apiserver's tunnel does).
const CHUNK: usize = 32 * 1024;
/// What an idle tunnel parks its upstream read on; reads grow to [`CHUNK`] while data flows.
const IDLE_READ: usize = 512;
/// How long the closing handshake may take at the end.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

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
    ws: WebSocket<S>,
    upstream: U,
    leftover: Bytes,
    stop: CancellationToken,
) -> TunnelOutcome
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let (mut reader, mut writer) = ws.split();
    let (mut up_read, mut up_write) = tokio::io::split(upstream);
    let mut bytes_up = 0u64;
    let mut bytes_down = 0u64;

    let downstream = async {
        if !leftover.is_empty() {
            bytes_down += leftover.len() as u64;
            if writer.send_binary(&[], leftover).await.is_err() {
                return;
            }
        }
        let mut buf = BytesMut::new();
        let mut read_size = IDLE_READ;
        loop {
            // Each message is written from this buffer and dropped before the next read, so
            // the reserve reuses the same allocation.
            buf.reserve(read_size);
            tokio::select! {
                read = up_read.read_buf(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        bytes_down += n as u64;
                        read_size = if n >= read_size {
                            CHUNK
                        } else if n < IDLE_READ {
                            IDLE_READ
                        } else {
                            read_size
                        };
                        let msg = buf.split().freeze();
                        if writer.send_binary(&[], msg).await.is_err() {
                            return;
                        }
                        // A quiet tunnel parks on a small buffer.
                        if read_size == IDLE_READ && buf.capacity() > 2 * IDLE_READ {
                            buf = BytesMut::new();
                        }
                    }
                },
                // Flushing sends the pong.
                _ = writer.ping_received() => {
                    if writer.flush().await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let mut client_close = None;
    let mut violation = None;
    let upstream_dir = async {
        while let Some(msg) = reader.next().await {
            match msg {
                Ok(Incoming::Binary(data)) => {
                    if up_write.write_all(&data).await.is_err() {
                        return TunnelEnd::Upstream;
                    }
                    bytes_up += data.len() as u64;
                }
                Ok(Incoming::Close(frame)) => {
                    client_close = Some(frame);
                    return TunnelEnd::Client;
                }
                Ok(Incoming::Text(_)) => {
                    violation = Some(CloseFrame::new(
                        CloseCode::PROTOCOL,
                        "the tunnel carries binary messages only",
                    ));
                    return TunnelEnd::ClientViolation;
                }
                Err(e) => {
                    let Some(code) = e.close_code() else {
                        return TunnelEnd::Client;
                    };
                    violation = Some(CloseFrame::new(code, e.to_string()));
                    return TunnelEnd::ClientViolation;
                }
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
    let close = match (client_close, violation, ended_by) {
        // The client closed: echoing its code completes the handshake, nothing to wait for.
        (Some(frame), ..) => {
            let reply = frame.map(|f| CloseFrame::new(f.code, ""));
            let _ = tokio::time::timeout(CLOSE_WAIT, writer.close(reply)).await;
            None
        }
        (None, Some(frame), _) => Some(frame),
        (None, None, TunnelEnd::Drained) => Some(CloseFrame::new(
            CloseCode::AWAY,
            "kube-ws-proxy is shutting down",
        )),
        _ => Some(CloseFrame::new(CloseCode::NORMAL, "")),
    };
    if let Some(close) = close {
        // Give the client a moment to answer the Close so the socket ends cleanly (and never
        // wait long on one that does not read).
        let _ = tokio::time::timeout(CLOSE_WAIT, async {
            if writer.close(Some(close)).await.is_ok() {
                while let Some(Ok(_)) = reader.next().await {}
            }
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
