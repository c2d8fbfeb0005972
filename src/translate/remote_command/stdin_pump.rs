//! Moves stdin from the client reader to the upstream `stdin` stream, in order, and turns the
//! v5 CLOSE signal (or the client going away) into a FIN after the earlier bytes.

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::spdy::proto::SendStream;

/// What the client reader hands to the stdin pump.
#[derive(Debug)]
pub(crate) enum StdinItem {
    Data(Bytes),
    /// `FF 00`: half-close stdin once everything before it is sent.
    Close,
}

/// Runs until the client closed stdin or went away (the channel closed), then half-closes the
/// upstream stream. Returns the number of bytes sent.
pub(crate) async fn pump_stdin(mut rx: mpsc::Receiver<StdinItem>, mut stdin: SendStream) -> u64 {
    let mut sent = 0u64;
    while let Some(item) = rx.recv().await {
        match item {
            StdinItem::Data(data) => {
                let len = data.len() as u64;
                if stdin.send(data).await.is_err() {
                    // Upstream gone: keep draining so the client reader never blocks on us.
                    while rx.recv().await.is_some() {}
                    return sent;
                }
                sent += len;
            }
            StdinItem::Close => break,
        }
    }
    let _ = stdin.finish().await;
    // Anything after CLOSE is dropped, as the reference server does once the pipe is closed.
    while rx.recv().await.is_some() {}
    sent
}
