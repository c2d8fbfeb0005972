//! Accepting the streams a SPDY remote-command client opens (PROTOCOL.md §3.5, server side):
//! wait until the expected set (error, stdin?, stdout?, stderr unless tty, resize if tty and
//! v3+) has arrived, as a kubelet does, within the stream-creation timeout. Streams of another
//! type are accepted and ignored; streams after the set are refused.

use std::time::Duration;

use crate::spdy::kube_headers::StreamHeaders;
use crate::spdy::proto::{Connection, Incoming, RecvStream, SendStream};
use crate::translate::exec_options::{ExecOptions, StreamKind};
use crate::translate::protocol::UpstreamVersion;

/// The client side of one reverse-translated exec/attach session.
#[derive(Debug)]
pub struct ClientStreams {
    /// The SPDY session with the client (closed by the translator at the end).
    pub conn: Connection,
    /// The negotiated remote-command version.
    pub version: UpstreamVersion,
    /// Where the status goes.
    pub error: SendStream,
    pub stdin: Option<RecvStream>,
    pub stdout: Option<SendStream>,
    pub stderr: Option<SendStream>,
    pub resize: Option<RecvStream>,
    /// The halves nobody writes to (stdin's, resize's): kept so they are reset, not dropped,
    /// when the session closes.
    _unused: Vec<SendStream>,
}

/// Why the streams were not all there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcceptError {
    /// The kubelet's wording.
    #[error("timed out waiting for client to create streams")]
    Timeout,
    #[error("the client went away before creating its streams")]
    Gone,
}

/// Waits (at most `timeout`) for the streams `options` call for under `version`.
pub async fn accept_streams(
    conn: Connection,
    mut incoming: Incoming,
    version: UpstreamVersion,
    options: &ExecOptions,
    timeout: Duration,
) -> Result<ClientStreams, AcceptError> {
    let expected = options.upstream_streams(version);
    let mut error = None;
    let mut stdin = None;
    let mut stdout = None;
    let mut stderr = None;
    let mut resize = None;
    let mut unused = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut missing = expected.clone();
    while !missing.is_empty() {
        let next = match tokio::time::timeout_at(deadline, incoming.accept()).await {
            Ok(Some(next)) => next,
            Ok(None) => return Err(AcceptError::Gone),
            Err(_) => return Err(AcceptError::Timeout),
        };
        // As the kubelet reads it: `stdout\0` is stdout.
        let kind = StreamHeaders::read(next.headers())
            .stream_type_str()
            .and_then(StreamKind::from_wire)
            .filter(|k| expected.contains(k));
        let stream = next.accept().await.map_err(|_| AcceptError::Gone)?;
        let Some(kind) = kind else {
            // Like the kubelet: replied to, not counted. Its data is discarded unread.
            continue;
        };
        missing.retain(|k| *k != kind);
        // A repeated type replaces the first, as in the kubelet.
        let (send, recv) = stream.split();
        match kind {
            StreamKind::Error => error = Some(send),
            StreamKind::Stdin => {
                stdin = Some(recv);
                unused.push(send);
            }
            StreamKind::Stdout => stdout = Some(send),
            StreamKind::Stderr => stderr = Some(send),
            StreamKind::Resize => {
                resize = Some(recv);
                unused.push(send);
            }
            StreamKind::Data => {}
        }
    }
    // Streams after the set are refused (a kubelet would leave them hanging).
    tokio::spawn(async move {
        while let Some(s) = incoming.accept().await {
            s.reject().await;
        }
    });
    Ok(ClientStreams {
        conn,
        version,
        error: error.ok_or(AcceptError::Gone)?,
        stdin,
        stdout,
        stderr,
        resize,
        _unused: unused,
    })
}
