//! Reads the upstream `error` stream to its end; the status is decoded once it is complete.

use crate::spdy::proto::RecvStream;

/// More than any Status a kubelet writes; the rest is discarded (but still drained).
const MAX_STATUS_BYTES: usize = 64 * 1024;

/// What the error stream delivered.
#[derive(Debug, Default)]
pub(crate) struct ErrorStreamResult {
    pub bytes: Vec<u8>,
    /// The stream ended by FIN or RST, not because the connection died.
    pub ended_cleanly: bool,
}

pub(crate) async fn read_error_stream(mut rx: RecvStream) -> ErrorStreamResult {
    let mut result = ErrorStreamResult {
        bytes: Vec::new(),
        ended_cleanly: true,
    };
    while let Some(chunk) = rx.recv().await {
        match chunk {
            Ok(data) => {
                let room = MAX_STATUS_BYTES.saturating_sub(result.bytes.len());
                result
                    .bytes
                    .extend_from_slice(&data[..data.len().min(room)]);
            }
            Err(_) => result.ended_cleanly = false,
        }
    }
    result
}
