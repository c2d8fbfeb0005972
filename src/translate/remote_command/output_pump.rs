//! Copies upstream stdout/stderr to the client as channel 1/2 binary messages.

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::{Sink, SinkExt};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use crate::spdy::proto::RecvStream;
use crate::translate::channel::Channel;

/// Upstream DATA larger than this is split into several messages, so a client never has to
/// hold a multi-MiB message (Kubernetes peers send ≤ 32 KiB frames anyway).
const MAX_MESSAGE_PAYLOAD: usize = 64 * 1024;

/// How the output side ended.
#[derive(Debug)]
pub(crate) enum OutputEnd {
    /// stdout and stderr both ended (FIN, RST, or the upstream went away).
    UpstreamDone,
    /// Writing to the client failed: it is gone.
    ClientGone,
}

/// Frames `data` behind a channel byte, reusing `scratch`'s allocation when the previous
/// message has been written.
pub(crate) fn frame_message(scratch: &mut BytesMut, channel: Channel, data: &[u8]) -> Bytes {
    scratch.reserve(1 + data.len());
    scratch.put_u8(channel.as_byte());
    scratch.extend_from_slice(data);
    scratch.split().freeze()
}

/// Pumps until both outputs ended. Returns the bytes forwarded.
pub(crate) async fn pump_output<S>(
    sink: &mut S,
    mut stdout: Option<RecvStream>,
    mut stderr: Option<RecvStream>,
    bytes_out: &mut u64,
) -> OutputEnd
where
    S: Sink<Message, Error = WsError> + Unpin,
{
    let mut scratch = BytesMut::new();
    loop {
        let (channel, next) = tokio::select! {
            next = recv_opt(&mut stdout), if stdout.is_some() => (Channel::Stdout, next),
            next = recv_opt(&mut stderr), if stderr.is_some() => (Channel::Stderr, next),
            else => return OutputEnd::UpstreamDone,
        };
        let data = match next {
            Some(Ok(data)) => data,
            // FIN, RST or a dead connection all end the output; the status tells which.
            Some(Err(_)) | None => {
                match channel {
                    Channel::Stdout => stdout = None,
                    _ => stderr = None,
                }
                continue;
            }
        };
        for chunk in data.chunks(MAX_MESSAGE_PAYLOAD) {
            let msg = frame_message(&mut scratch, channel, chunk);
            if sink.feed(Message::Binary(msg)).await.is_err() {
                return OutputEnd::ClientGone;
            }
            *bytes_out += chunk.len() as u64;
        }
        // Flush unless more output is already waiting: batches small messages into one write.
        if !output_ready(&stdout) && !output_ready(&stderr) && sink.flush().await.is_err() {
            return OutputEnd::ClientGone;
        }
    }
}

async fn recv_opt(rx: &mut Option<RecvStream>) -> Option<Result<Bytes, crate::spdy::proto::Error>> {
    match rx {
        Some(rx) => rx.recv().await,
        None => None,
    }
}

fn output_ready(rx: &Option<RecvStream>) -> bool {
    rx.as_ref().is_some_and(|rx| rx.has_queued())
}
