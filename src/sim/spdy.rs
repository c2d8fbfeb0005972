//! The kubelet's SPDY side of exec and attach: the `Upgrade: SPDY/3.1` handshake with version
//! negotiation (PROTOCOL.md §3.1) and the server stream choreography (§3.5).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::exec::{self, ExecIo, Target, CHANNEL_DEPTH};
use super::kill::KillSwitch;
use super::resize::SizeDecoder;
use super::response::{text_response, Body};
use super::{Inner, SimEvent};
use crate::spdy::kube_headers::StreamHeaders;
use crate::spdy::proto::{Config, Connection, Incoming, SendStream, SessionEnd, Stream};

/// Remote-command versions an old kubelet supports, in its preference order (no v5).
pub(crate) const REMOTE_COMMAND_VERSIONS: [&str; 4] = [
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];
/// The only port-forward version.
pub(crate) const PORT_FORWARD_VERSIONS: [&str; 1] = ["portforward.k8s.io"];
/// How long the client has to create its streams (kubelet `StreamCreationTimeout`).
pub(crate) const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether the request asks for a SPDY upgrade (`Upgrade` names `spdy/3.1`).
pub(crate) fn wants_spdy(headers: &HeaderMap) -> bool {
    header_tokens(headers, http::header::UPGRADE).any(|t| t.eq_ignore_ascii_case("spdy/3.1"))
}

fn header_tokens(
    headers: &HeaderMap,
    name: http::header::HeaderName,
) -> impl Iterator<Item = &str> + '_ {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Negotiates like `httpstream.Handshake`: the first version the client lists that we support
/// (repeated header lines and comma lists both count). On failure, the error response.
// The refusal is the response itself; it is built once per failed request.
#[allow(clippy::result_large_err)]
pub(crate) fn negotiate(
    headers: &HeaderMap,
    supported: &[&'static str],
) -> Result<String, Response<Body>> {
    let connection_upgrade =
        header_tokens(headers, http::header::CONNECTION).any(|t| t.eq_ignore_ascii_case("upgrade"));
    if !connection_upgrade || !wants_spdy(headers) {
        return Err(text_response(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: missing upgrade headers in request",
        ));
    }
    let offered: Vec<&str> = header_tokens(
        headers,
        http::header::HeaderName::from_static("x-stream-protocol-version"),
    )
    .collect();
    if offered.is_empty() {
        return Err(text_response(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: header X-Stream-Protocol-Version does not exist in request",
        ));
    }
    if let Some(v) = offered.iter().find(|v| supported.contains(v)) {
        return Ok(v.to_string());
    }
    let mut resp = text_response(
        StatusCode::FORBIDDEN,
        &format!(
            "unable to upgrade: unable to negotiate protocol: client supports [{}], server accepts [{}]",
            offered.join(" "),
            supported.join(" ")
        ),
    );
    for v in supported {
        resp.headers_mut().append(
            "x-accepted-stream-protocol-versions",
            HeaderValue::from_static(v),
        );
    }
    Err(resp)
}

/// The 101 answer to a SPDY upgrade.
pub(crate) fn switching_protocols(version: &str) -> Response<Body> {
    let mut resp = Response::new(super::response::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(
        http::header::CONNECTION,
        HeaderValue::from_static("Upgrade"),
    );
    h.insert(http::header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    if let Ok(v) = HeaderValue::from_str(version) {
        h.insert("x-stream-protocol-version", v);
    }
    resp
}

/// Starts a server session the way a kubelet does (it never pings).
pub(crate) fn server_session<T>(io: T) -> (Connection, Incoming)
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    Connection::server(
        io,
        Bytes::new(),
        Config {
            ping_interval: None,
            ..Config::default()
        },
    )
}

/// Cancels `cancel` when the peer ends the session (GOAWAY, TCP close, error).
pub(crate) fn watch_peer(conn: &Connection, cancel: &CancellationToken) {
    let conn = conn.clone();
    let cancel = cancel.clone();
    tokio::spawn(async move {
        tokio::select! {
            end = conn.closed() => {
                if end != SessionEnd::Local {
                    cancel.cancel();
                }
            }
            _ = cancel.cancelled() => {}
        }
    });
}

/// Numeric protocol version: 4, 3, 2 or 1.
fn version_number(version: &str) -> u8 {
    match version {
        "v4.channel.k8s.io" => 4,
        "v3.channel.k8s.io" => 3,
        "v2.channel.k8s.io" => 2,
        _ => 1,
    }
}

/// The streams of one exec or attach session, by type.
#[derive(Default)]
struct ExecStreams {
    error: Option<Stream>,
    stdin: Option<Stream>,
    stdout: Option<Stream>,
    stderr: Option<Stream>,
    resize: Option<Stream>,
}

impl ExecStreams {
    /// Files `stream` under its type. Like the kubelet: every known type counts (a repeated
    /// type replaces the first); unknown types are replied to and ignored (`false`).
    fn place(&mut self, kind: &[u8], stream: Stream, v: u8, session: u64) -> bool {
        let slot = match kind {
            b"error" => &mut self.error,
            b"stdin" => &mut self.stdin,
            b"stdout" => &mut self.stdout,
            b"stderr" => &mut self.stderr,
            b"resize" if v >= 3 => &mut self.resize,
            other => {
                let other = String::from_utf8_lossy(other);
                tracing::debug!(session, stream_type = %other, "unexpected stream type");
                return false;
            }
        };
        *slot = Some(stream);
        true
    }
}

/// Serves one upgraded SPDY exec/attach connection to the end.
pub(crate) async fn serve_exec<T>(
    inner: Arc<Inner>,
    io: T,
    version: String,
    target: Target,
    kill: KillSwitch,
    session: u64,
) where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let reason = run_exec_session(&inner, io, &version, &target, &kill, session).await;
    inner.event(SimEvent::SessionEnded {
        session,
        reason: reason.to_string(),
    });
}

/// The session's order: accept the client's streams, wire them to the container side, run,
/// then report and close. Returns why it ended.
async fn run_exec_session<T>(
    inner: &Arc<Inner>,
    io: T,
    version: &str,
    target: &Target,
    kill: &KillSwitch,
    session: u64,
) -> &'static str
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let v = version_number(version);
    let (conn, mut incoming) = server_session(io);
    let cancel = inner.shutdown.child_token();
    let _cancel_on_exit = cancel.clone().drop_guard();

    let accepted = accept_exec_streams(&conn, &mut incoming, v, target, &cancel, session).await;
    let streams = match accepted {
        Ok(streams) => streams,
        Err(reason) => return reason,
    };
    refuse_later_streams(incoming);
    watch_peer(&conn, &cancel);

    let Wired {
        io,
        keep,
        outputs,
        mut error,
    } = wire_streams(streams, v, target, kill, &cancel).await;

    // Run; then status, FIN on the outputs, and close (RST all + GOAWAY + TCP close).
    let status = exec::run(inner, session, target, io, &cancel).await;
    let Some(status) = status else {
        if let Err(dying) = close_cut_short(&conn, target, kill).await {
            return dying;
        }
        return if inner.shutdown.is_cancelled() {
            "shutdown"
        } else {
            "client gone"
        };
    };
    let finished = finished_outputs(outputs).await;
    if cancel.is_cancelled() {
        let closed = close_cut_short(&conn, target, kill).await;
        return closed.err().unwrap_or("client gone");
    }
    if let (Some(err), Some(payload)) = (error.as_mut(), status.error_channel_payload(v >= 4)) {
        let _ = err.send(Bytes::from(payload)).await;
    }
    for mut send in finished {
        let _ = send.finish().await;
    }
    conn.close().await;
    drop(keep);
    "completed"
}

/// Waits for the streams the request calls for (error + stdin? + stdout? + stderr? +
/// resize?), within the kubelet's stream creation timeout. `Err` is why the session ended.
async fn accept_exec_streams(
    conn: &Connection,
    incoming: &mut Incoming,
    v: u8,
    target: &Target,
    cancel: &CancellationToken,
    session: u64,
) -> Result<ExecStreams, &'static str> {
    let stderr = target.stderr && !target.tty;
    let expected = 1
        + usize::from(target.stdin)
        + usize::from(target.stdout)
        + usize::from(stderr)
        + usize::from(target.tty && v >= 3);
    let mut streams = ExecStreams::default();
    let mut received = 0;
    let deadline = tokio::time::Instant::now() + STREAM_CREATION_TIMEOUT;
    while received < expected {
        let next = tokio::select! {
            r = tokio::time::timeout_at(deadline, incoming.accept()) => r,
            _ = cancel.cancelled() => {
                conn.close().await;
                return Err("shutdown");
            }
        };
        let s = match next {
            Ok(Some(s)) => s,
            Ok(None) => return Err("client gone"),
            Err(_) => {
                tracing::info!(session, "timed out waiting for client to create streams");
                conn.close().await;
                return Err("stream creation timeout");
            }
        };
        // Read as the kubelet reads it: `stdout\0` is stdout.
        let kind = StreamHeaders::read(s.headers()).stream_type.to_vec();
        let stream = match s.accept().await {
            Ok(stream) => stream,
            Err(_) => return Err("client gone"),
        };
        if streams.place(&kind, stream, v, session) {
            received += 1;
        }
    }
    Ok(streams)
}

/// Streams opened after the set is complete are refused.
fn refuse_later_streams(mut incoming: Incoming) {
    tokio::spawn(async move {
        while let Some(s) = incoming.accept().await {
            s.reject().await;
        }
    });
}

/// The streams wired to the container side.
struct Wired {
    io: ExecIo,
    /// Send halves nobody writes to, kept open until the session closes.
    keep: Vec<SendStream>,
    /// The output forwarders; each gives back its stream to finish after the status.
    outputs: Vec<JoinHandle<Option<SendStream>>>,
    error: Option<SendStream>,
}

/// Connects each stream to its channel of [`ExecIo`].
async fn wire_streams(
    mut streams: ExecStreams,
    v: u8,
    target: &Target,
    kill: &KillSwitch,
    cancel: &CancellationToken,
) -> Wired {
    let mut io = ExecIo::default();
    let mut keep: Vec<SendStream> = Vec::new();
    if let Some(stream) = streams.stdin.take() {
        let (send, rx) = wire_stdin(stream, v).await;
        keep.push(send);
        io.stdin = Some(rx);
    }
    let mut outputs: Vec<JoinHandle<Option<SendStream>>> = Vec::new();
    for (stream, is_stdout) in [
        (streams.stdout.take(), true),
        (streams.stderr.take(), false),
    ] {
        let Some(stream) = stream else { continue };
        let (send, _recv) = stream.split();
        let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
        if is_stdout {
            io.stdout = Some(tx);
        } else {
            io.stderr = Some(tx);
        }
        let dying = target.dying.then(|| (kill.clone(), cancel.clone()));
        outputs.push(tokio::spawn(forward_output(rx, send, dying)));
    }
    if let Some(stream) = streams.resize.take() {
        let (send, rx) = wire_resize(stream);
        keep.push(send);
        io.resize = Some(rx);
    }
    Wired {
        io,
        keep,
        outputs,
        error: streams.error.take().map(|s| s.split().0),
    }
}

/// Stdin's data to a channel; its send half is returned to keep.
async fn wire_stdin(stream: Stream, v: u8) -> (SendStream, mpsc::Receiver<Bytes>) {
    let (mut send, mut recv) = stream.split();
    if v == 1 {
        // v1 servers half-close stdin from their side at once (PROTOCOL.md §3.5).
        let _ = send.finish().await;
    }
    let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
    tokio::spawn(async move {
        while let Some(Ok(chunk)) = recv.recv().await {
            if tx.send(chunk).await.is_err() {
                break;
            }
        }
    });
    (send, rx)
}

/// The resize stream's terminal sizes to a channel; its send half is returned to keep.
fn wire_resize(stream: Stream) -> (SendStream, mpsc::Receiver<(u16, u16)>) {
    let (send, mut recv) = stream.split();
    let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
    tokio::spawn(async move {
        let mut decoder = SizeDecoder::default();
        while let Some(Ok(chunk)) = recv.recv().await {
            for size in decoder.push(&chunk) {
                if tx.send(size).await.is_err() {
                    return;
                }
            }
        }
    });
    (send, rx)
}

/// Ends a session cut short: a `dying-*` pod's connection is dropped (`Err("dying pod")`),
/// any other is closed.
async fn close_cut_short(
    conn: &Connection,
    target: &Target,
    kill: &KillSwitch,
) -> Result<(), &'static str> {
    if target.dying {
        kill.kill();
        return Err("dying pod");
    }
    conn.close().await;
    Ok(())
}

/// The output streams whose forwarders ended cleanly, to finish after the status.
async fn finished_outputs(outputs: Vec<JoinHandle<Option<SendStream>>>) -> Vec<SendStream> {
    let mut finished = Vec::new();
    for out in outputs {
        if let Ok(Some(send)) = out.await {
            finished.push(send);
        }
    }
    finished
}

/// Process output → SPDY stream. Returns the stream (to be finished after the status) unless
/// the pod is a `dying-*` one, which drops the connection after the first chunk.
async fn forward_output(
    mut rx: mpsc::Receiver<Bytes>,
    mut send: SendStream,
    dying: Option<(KillSwitch, CancellationToken)>,
) -> Option<SendStream> {
    let mut broken = false;
    while let Some(chunk) = rx.recv().await {
        if broken {
            continue;
        }
        if send.send(chunk).await.is_err() {
            // The session is gone; keep draining so the process side finishes.
            broken = true;
            continue;
        }
        if let Some((kill, cancel)) = &dying {
            // Give the chunk a moment to reach the socket, then drop the connection.
            tokio::time::sleep(Duration::from_millis(100)).await;
            kill.kill();
            cancel.cancel();
            return None;
        }
    }
    (!broken).then_some(send)
}
