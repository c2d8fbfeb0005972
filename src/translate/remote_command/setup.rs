//! Opening the remote-command streams in the order kubelets expect (PROTOCOL.md §3.5).

use crate::spdy::frame::HeaderBlock;
use crate::spdy::proto::{Connection, Error, RecvStream, SendStream};
use crate::translate::exec_options::{ExecOptions, StreamKind};
use crate::translate::protocol::UpstreamVersion;

/// The upstream side of one translated exec/attach session.
#[derive(Debug)]
pub struct ExecStreams {
    /// The SPDY session (closed by the translator at the end).
    pub conn: Connection,
    /// The negotiated remote-command version.
    pub version: UpstreamVersion,
    /// Where the status arrives.
    pub error: RecvStream,
    pub stdin: Option<SendStream>,
    pub stdout: Option<RecvStream>,
    pub stderr: Option<RecvStream>,
    pub resize: Option<SendStream>,
}

/// Creates the streams one at a time, each waiting for its SYN_REPLY, then releases the
/// session's header-compression state: no further stream will be opened (a kubelet would block
/// on one anyway).
pub async fn open_streams(
    conn: Connection,
    version: UpstreamVersion,
    options: &ExecOptions,
) -> Result<ExecStreams, Error> {
    let mut error = None;
    let mut stdin = None;
    let mut stdout = None;
    let mut stderr = None;
    let mut resize = None;
    for kind in options.upstream_streams(version) {
        let mut headers = HeaderBlock::new();
        headers.push("streamtype", kind.wire_name());
        let (tx, rx) = conn.open_stream(headers).await?.split();
        match kind {
            StreamKind::Error => error = Some(rx),
            StreamKind::Stdin => stdin = Some(tx),
            StreamKind::Stdout => stdout = Some(rx),
            StreamKind::Stderr => stderr = Some(rx),
            StreamKind::Resize => resize = Some(tx),
            StreamKind::Data => {}
        }
    }
    conn.release_header_contexts();
    let error = error.ok_or_else(|| Error::Protocol("no error stream in the stream set".into()))?;
    Ok(ExecStreams {
        conn,
        version,
        error,
        stdin,
        stdout,
        stderr,
        resize,
    })
}
