//! Reads the client's WebSocket: stdin and CLOSE go to the stdin pump, terminal sizes to the
//! resize pump. Pings are answered by the WebSocket layer while we keep reading, so they are
//! answered even while stdin is backed up — until the bounded stdin queue is full, at which
//! point reading stops and TCP slows the client.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::stdin_pump::StdinItem;
use crate::translate::channel::Channel;
use crate::translate::close_signal::{CloseSignal, CLOSE_SIGNAL_BYTE};
use crate::translate::resize::{ResizeDecoder, TerminalSize};

/// Why the client side stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClientEnd {
    /// The client sent a Close frame.
    Closed,
    /// The connection ended without a Close frame (or failed).
    Gone,
    /// The client broke the protocol; close with this code and reason.
    Violation(CloseCode, String),
}

/// Where the client reader delivers what it decodes.
pub(crate) struct ClientSinks {
    pub stdin: Option<mpsc::Sender<StdinItem>>,
    /// Terminal sizes (tty sessions with a resize stream only); latest wins.
    pub resize: Option<watch::Sender<Option<TerminalSize>>>,
}

/// Reads until the client closes, goes away or breaks the protocol. The sinks are dropped when
/// it returns, which is what tells the stdin pump that no more stdin will come.
pub(crate) async fn read_client<S>(
    stream: &mut S,
    mut sinks: ClientSinks,
    bytes_in: &AtomicU64,
) -> ClientEnd
where
    S: Stream<Item = Result<Message, WsError>> + Unpin,
{
    let mut resize = ResizeDecoder::new();
    while let Some(msg) = stream.next().await {
        let data = match msg {
            Ok(Message::Binary(data)) => data,
            // The reference server reads text frames as bytes too (x/net `Message.Receive`),
            // and the Python client sends string stdin as text: same channel framing.
            Ok(Message::Text(text)) => Bytes::from(text),
            Ok(Message::Close(_)) => return ClientEnd::Closed,
            Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => continue,
            Err(WsError::Capacity(e)) => {
                return ClientEnd::Violation(CloseCode::Size, format!("message too large: {e}"))
            }
            Err(WsError::Protocol(e)) => {
                return ClientEnd::Violation(CloseCode::Protocol, e.to_string())
            }
            Err(_) => return ClientEnd::Gone,
        };
        if let Some(end) = dispatch(data, &mut sinks, &mut resize, bytes_in).await {
            return end;
        }
    }
    ClientEnd::Gone
}

async fn dispatch(
    data: Bytes,
    sinks: &mut ClientSinks,
    resize: &mut ResizeDecoder,
    bytes_in: &AtomicU64,
) -> Option<ClientEnd> {
    let Some(&first) = data.first() else {
        // An empty message carries no channel; nothing to do.
        return None;
    };
    if first == CLOSE_SIGNAL_BYTE {
        let signal = match CloseSignal::decode(&data) {
            Ok(signal) => signal,
            // The reference server aborts the connection here; we say why.
            Err(e) => return Some(ClientEnd::Violation(CloseCode::Protocol, e.to_string())),
        };
        match signal.channel() {
            Channel::Stdin => {
                if let Some(stdin) = sinks.stdin.take() {
                    let _ = stdin.send(StdinItem::Close).await;
                }
            }
            Channel::Resize => sinks.resize = None,
            // Closing an output channel has no effect (PROTOCOL.md §1.4).
            _ => {}
        }
        return None;
    }
    match Channel::from_byte(first) {
        Some(Channel::Stdin) => {
            let payload = data.slice(1..);
            bytes_in.fetch_add(payload.len() as u64, Ordering::Relaxed);
            if let Some(stdin) = &sinks.stdin {
                if !payload.is_empty() && stdin.send(StdinItem::Data(payload)).await.is_err() {
                    sinks.stdin = None;
                }
            }
        }
        Some(Channel::Resize) => {
            if let Some(tx) = &sinks.resize {
                match resize.push(&data[1..]) {
                    Ok(sizes) => {
                        if let Some(last) = sizes.into_iter().last() {
                            let _ = tx.send(Some(last));
                        }
                    }
                    // Like the reference: a bad size silently ends resize handling.
                    Err(_) => sinks.resize = None,
                }
            }
        }
        // Server-to-client channels sent by a client are ignored (PROTOCOL.md §6.3 #13).
        Some(Channel::Stdout | Channel::Stderr | Channel::Error) => {}
        None => {
            return Some(ClientEnd::Violation(
                CloseCode::Protocol,
                format!("unknown channel {first}"),
            ))
        }
    }
    None
}
