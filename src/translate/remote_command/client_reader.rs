//! Reads the client's WebSocket: stdin and CLOSE go to the stdin pump, terminal sizes to the
//! resize pump. Pings are passed to the writer as they are read, so they are answered even
//! while stdin is backed up — until the bounded stdin queue is full, at which point reading
//! stops and TCP slows the client.

use bytes::{Buf, Bytes};
use tokio::io::AsyncRead;
use tokio::sync::{mpsc, watch};

use super::stdin_pump::StdinItem;
use crate::activity_clock::ActivityClock;
use crate::audit::recording::Recorder;
use crate::session_traffic::SessionTraffic;
use crate::translate::channel::Channel;
use crate::translate::close_signal::{CloseSignal, CLOSE_SIGNAL_BYTE};
use crate::translate::resize::{ResizeDecoder, TerminalSize};
use crate::translate::ws::{CloseCode, CloseFrame, Incoming, WsReader};

/// Why the client side stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClientEnd {
    /// The client sent a Close frame (this one).
    Closed(Option<CloseFrame>),
    /// The connection ended without a Close frame (or failed).
    Gone,
    /// The client stopped answering pings (decided by the session, not the reader).
    Unresponsive,
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
/// it returns, which is what tells the stdin pump that no more stdin will come. Every data
/// message is noted on `data` (the session's idle clock); stdin and resizes go to `recorder`.
pub(crate) async fn read_client<R>(
    reader: &mut WsReader<R>,
    mut sinks: ClientSinks,
    traffic: &SessionTraffic,
    data: &ActivityClock,
    recorder: Option<&Recorder>,
) -> ClientEnd
where
    R: AsyncRead + Unpin,
{
    let mut resize = ResizeDecoder::new();
    while let Some(msg) = reader.next().await {
        let message = match msg {
            // The reference server reads text frames as bytes too (x/net `Message.Receive`),
            // and the Python client sends string stdin as text: same channel framing.
            Ok(Incoming::Binary(message) | Incoming::Text(message)) => message,
            Ok(Incoming::Close(frame)) => return ClientEnd::Closed(frame),
            Err(e) => {
                return match e.close_code() {
                    Some(code) => ClientEnd::Violation(code, e.to_string()),
                    None => ClientEnd::Gone,
                }
            }
        };
        data.touch();
        if let Some(end) = dispatch(message, &mut sinks, &mut resize, traffic, recorder).await {
            return end;
        }
    }
    ClientEnd::Gone
}

async fn dispatch(
    data: Bytes,
    sinks: &mut ClientSinks,
    resize: &mut ResizeDecoder,
    traffic: &SessionTraffic,
    recorder: Option<&Recorder>,
) -> Option<ClientEnd> {
    let Some(&first) = data.first() else {
        // An empty message carries no channel; nothing to do.
        return None;
    };
    if first == CLOSE_SIGNAL_BYTE {
        let signal = match CloseSignal::decode(&data) {
            Ok(signal) => signal,
            // The reference server aborts the connection here; we say why.
            Err(e) => return Some(ClientEnd::Violation(CloseCode::PROTOCOL, e.to_string())),
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
            // Advancing (unlike slicing) never allocates, whatever backs the bytes.
            let mut payload = data;
            payload.advance(1);
            traffic.from_client(payload.len());
            if let (Some(recorder), Some(_)) = (recorder, &sinks.stdin) {
                recorder.input(&payload).await;
            }
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
                        if let Some(recorder) = recorder {
                            for size in &sizes {
                                recorder.resize(size.width, size.height).await;
                            }
                        }
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
                CloseCode::PROTOCOL,
                format!("unknown channel {first}"),
            ))
        }
    }
    None
}
