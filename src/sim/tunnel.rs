//! The port-forward tunnel a new API server serves itself (`SPDY/3.1+portforward.k8s.io`,
//! PROTOCOL.md §2.1): an SPDY session carried in binary WebSocket messages. The cluster runs the
//! same SPDY port-forward server as for a plain SPDY upgrade (portforward.rs) on a byte stream
//! bridged to the WebSocket; message boundaries mean nothing in either direction.

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

use super::exec::CHUNK;
use super::streaming::TUNNEL_PROTOCOL;
use super::subprotocols::offered_subprotocols;
use super::websocket::{Framing, Protocol, Ws};

/// The one subprotocol the tunnel accepts (a new API server would take any
/// `SPDY/3.1+<x>.k8s.io` and let the kubelet negotiate `<x>`; port-forward is the only one).
pub(crate) const TUNNEL: Protocol = Protocol {
    name: TUNNEL_PROTOCOL,
    framing: Framing::Binary,
    v4: true,
    close_signal: false,
};

/// Bytes buffered between the WebSocket and the SPDY server in each direction.
const BRIDGE_BUFFER: usize = 64 * 1024;

/// Whether the request offers a tunnelled SPDY protocol (`SPDY/3.1+…k8s.io`): what routes a
/// port-forward WebSocket to the API server's tunnel handler.
pub(crate) fn offers_tunnel(headers: &http::HeaderMap) -> bool {
    offered_subprotocols(headers)
        .iter()
        .any(|p| p.starts_with("SPDY/3.1+") && p.ends_with(".k8s.io"))
}

/// Bridges the WebSocket to a byte stream: binary message payloads in, reads out as binary
/// messages; Close 1000 when the SPDY side ends. Returns the SPDY server's end of the bridge.
pub(crate) fn bridge(ws: Ws) -> DuplexStream {
    let (server_end, bridge_end) = tokio::io::duplex(BRIDGE_BUFFER);
    let (mut from_spdy, mut to_spdy) = tokio::io::split(bridge_end);
    let (mut sink, mut stream) = ws.split();
    tokio::spawn(async move {
        // Client → SPDY server. A text message is a protocol violation (ends the tunnel, as the
        // API server's tunnel does); Close or EOF ends the byte stream.
        while let Some(Ok(msg)) = stream.next().await {
            match msg {
                Message::Binary(data) => {
                    if to_spdy.write_all(&data).await.is_err() {
                        break;
                    }
                }
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
                Message::Text(_) | Message::Close(_) => break,
            }
        }
        let _ = to_spdy.shutdown().await;
    });
    tokio::spawn(async move {
        // SPDY server → client: each read becomes one binary message.
        let mut buf = vec![0u8; CHUNK];
        loop {
            match from_spdy.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let data = bytes::Bytes::copy_from_slice(&buf[..n]);
                    if sink.send(Message::Binary(data)).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = sink
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            })))
            .await;
        let _ = sink.close().await;
    });
    server_end
}
