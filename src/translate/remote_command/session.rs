//! One translated exec/attach session, from the ready message to the graceful close.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::client_reader::{read_client, ClientEnd, ClientSinks};
use super::error_reader::read_error_stream;
use super::output_pump::{pump_output, OutputEnd};
use super::setup::ExecStreams;
use super::stdin_pump::pump_stdin;
use crate::activity_clock::ActivityClock;
use crate::audit::recording::Recorder;
use crate::spdy::proto::{SendStream, SessionEnd};
use crate::translate::channel::Channel;
use crate::translate::resize::TerminalSize;
use crate::translate::status::Status;
use crate::translate::status_mapping::from_upstream_error_stream;
use crate::translate::ws::{CloseCode, CloseFrame, WebSocket, WsReader, WsWriter};

/// How long a departing client's stdin FIN may take before the upstream is torn down anyway.
const STDIN_FIN_GRACE: Duration = Duration::from_millis(500);

/// Bounds of one session.
#[derive(Debug, Clone)]
pub struct SessionLimits {
    /// stdin messages queued towards a slow upstream before the client reader stops reading.
    pub stdin_queue_messages: usize,
    /// How long the final status and Close may take to reach a client that does not read,
    /// and after our Close, how long to wait for the client's Close before dropping the socket.
    pub close_drain_timeout: Duration,
    /// A session that carries no data either way (stdin, resize, stdout, stderr; pings do not
    /// count) for this long is ended with a Status (`--stream-idle-timeout`).
    pub idle_timeout: Option<Duration>,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            stdin_queue_messages: 16,
            close_drain_timeout: Duration::from_secs(10),
            idle_timeout: None,
        }
    }
}

/// How a session ended, for logs and metrics.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// stdin bytes received from the client.
    pub bytes_in: u64,
    /// stdout/stderr bytes sent to the client.
    pub bytes_out: u64,
    /// The Status the session ended with (the command's result, or the proxy's reason), as
    /// queued on channel 3; a client that no longer read may not have got it, and `end` says
    /// why the session ended. Audit events take the exit code from here either way.
    pub status: Option<Status>,
    /// Why the session ended.
    pub end: SessionEndKind,
    pub duration: Duration,
}

/// Why a translated session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEndKind {
    /// The command finished and its status was delivered.
    Completed,
    /// The client went away first; the upstream session was torn down.
    ClientGone,
    /// The client broke the protocol and was closed with an error code.
    ClientViolation,
    /// The upstream refused the session; its Status was delivered.
    UpstreamRefused,
    /// The proxy shut down before the command finished; a Failure Status said so.
    Drained,
    /// The client stopped answering pings; the upstream session was torn down.
    ClientUnresponsive,
    /// The upstream stopped answering pings; a Failure Status said so.
    UpstreamUnresponsive,
    /// No data either way for the idle timeout; a Failure Status said so.
    IdleTimeout,
    /// The recording failed under `--record=required`; a Failure Status said so.
    RecordingFailed,
}

impl SessionEndKind {
    /// How the session log says it (`close_reason`).
    pub fn describe(self) -> &'static str {
        match self {
            SessionEndKind::Completed => "completed",
            SessionEndKind::ClientGone => "client gone",
            SessionEndKind::ClientViolation => "client protocol violation",
            SessionEndKind::UpstreamRefused => "upstream refused",
            SessionEndKind::Drained => "drained",
            SessionEndKind::ClientUnresponsive => "client unresponsive",
            SessionEndKind::UpstreamUnresponsive => "upstream unresponsive",
            SessionEndKind::IdleTimeout => "idle timeout",
            SessionEndKind::RecordingFailed => "recording failed",
        }
    }
}

/// A session's recording, and whether the session must end when it fails.
#[derive(Debug)]
pub struct SessionRecording {
    pub recorder: Recorder,
    /// `--record=required`.
    pub required: bool,
}

/// Runs a translated session on an accepted `v5.channel.k8s.io` WebSocket.
pub async fn run<S>(
    ws: WebSocket<S>,
    upstream: ExecStreams,
    ready: Channel,
    tty: bool,
    limits: &SessionLimits,
    stop: CancellationToken,
    recording: Option<&SessionRecording>,
) -> Outcome
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let recorder = recording.map(|r| &r.recorder);
    let ExecStreams {
        conn,
        version,
        error,
        stdin,
        stdout,
        stderr,
        resize,
    } = upstream;
    let (mut reader, mut writer) = ws.split();
    let liveness = reader.liveness();
    let mut bytes_out = 0u64;
    // When data last went either way (`--stream-idle-timeout`).
    let data = ActivityClock::new();

    // Ready message: an empty payload on the lowest writable channel.
    if writer
        .send_binary(&[ready.as_byte()], Bytes::new())
        .await
        .is_err()
    {
        conn.close().await;
        return outcome(0, 0, None, SessionEndKind::ClientGone, started);
    }

    let error_task = tokio::spawn(read_error_stream(error));
    let bytes_in = AtomicU64::new(0);
    let mut sinks = ClientSinks {
        stdin: None,
        resize: None,
    };
    let mut stdin_task = None;
    if let Some(stdin) = stdin {
        let (tx, rx) = mpsc::channel(limits.stdin_queue_messages.max(1));
        stdin_task = Some(tokio::spawn(pump_stdin(rx, stdin)));
        sinks.stdin = Some(tx);
    }
    if let (true, Some(resize)) = (tty, resize) {
        let (tx, rx) = watch::channel(None);
        tokio::spawn(pump_resize(rx, resize));
        sinks.resize = Some(tx);
    }

    // Phase 1: until the command is over (outputs and the error stream ended) or the client left.
    let client = read_client(&mut reader, sinks, &bytes_in, &data, recorder);
    tokio::pin!(client);
    let upstream_done = async {
        let out = pump_output(&mut writer, stdout, stderr, &mut bytes_out, &data, recorder).await;
        match out {
            OutputEnd::ClientGone => return None,
            // The session ends with the recording's Status (`recording_failed` below).
            OutputEnd::RecordingFailed => std::future::pending::<()>().await,
            OutputEnd::UpstreamDone => {}
        }
        // The outputs ended (or there were none): pings still need answers until the status.
        Some(
            writer
                .answer_pings_until(error_task)
                .await
                .unwrap_or_default(),
        )
    };
    let idle = async {
        match limits.idle_timeout {
            Some(limit) => data.quiet_for(limit).await,
            None => std::future::pending().await,
        }
    };
    // Only a required recording's failure ends the session; a best-effort one just stops.
    let recording_failed = async {
        match recording.filter(|r| r.required) {
            Some(r) => r.recorder.failed().await,
            None => std::future::pending().await,
        }
    };
    // Either the session ends with a Status (the command's, or the shutdown's), or the client
    // ended it first.
    let ended = tokio::select! {
        result = upstream_done => match (result, conn.end_reason()) {
            // The outputs ended because the upstream stopped answering pings, not because the
            // command finished: say so, rather than the generic "connection lost" status.
            (Some(_), Some(SessionEnd::PingTimeout(silent))) => Ok((
                Status::failure(
                    504,
                    "Timeout",
                    format!(
                        "the upstream stopped answering: no reply to SPDY pings for {silent:?} \
                         (kube-ws-proxy --upstream-ping-timeout); the session was ended"
                    ),
                ),
                SessionEndKind::UpstreamUnresponsive,
            )),
            (Some(result), _) => Ok((
                from_upstream_error_stream(version, &result.bytes, result.ended_cleanly),
                SessionEndKind::Completed,
            )),
            (None, _) => Err(ClientEnd::Gone),
        },
        end = &mut client => Err(end),
        // A client that answers nothing cannot be told anything either.
        _ = liveness.lost() => Err(ClientEnd::Unresponsive),
        quiet = idle => Ok((
            Status::failure(
                504,
                "Timeout",
                format!(
                    "kube-ws-proxy ended the session: idle for {quiet:?}, no data either way \
                     (--stream-idle-timeout)"
                ),
            ),
            SessionEndKind::IdleTimeout,
        )),
        why = recording_failed => Ok((
            Status::failure(
                500,
                "InternalError",
                format!(
                    "kube-ws-proxy ended the session: its recording failed ({why}) and \
                     recordings are required (--record=required)"
                ),
            ),
            SessionEndKind::RecordingFailed,
        )),
        // Shutdown: the command is still running; say so rather than cutting the socket.
        _ = stop.cancelled() => Ok((
            Status::failure(
                503,
                "ServiceUnavailable",
                "kube-ws-proxy is shutting down: the session was ended after the drain timeout".into(),
            ),
            SessionEndKind::Drained,
        )),
    };
    let client_end = match ended {
        Ok((status, kind)) => {
            // Phase 2: deliver the status, close, and drain the client.
            let delivered = deliver_status(&mut writer, &status, limits.close_drain_timeout).await;
            conn.close().await;
            if delivered {
                // Keep reading (and discarding) so a late client frame never meets a TCP
                // reset that would destroy output the client has not read yet.
                let _ = tokio::time::timeout(limits.close_drain_timeout, &mut client).await;
            }
            let bytes_in = bytes_in.load(Ordering::Relaxed);
            return outcome(bytes_in, bytes_out, Some(status), kind, started);
        }
        Err(end) => end,
    };

    // The client left or misbehaved first: answer it at once (a client that closed completes
    // its closing handshake with its own code echoed), but never wait long on one that does
    // not read.
    let (kind, answer) = match client_end {
        ClientEnd::Violation(code, reason) => (
            SessionEndKind::ClientViolation,
            Some(Some(CloseFrame::new(code, reason))),
        ),
        ClientEnd::Closed(frame) => (
            SessionEndKind::ClientGone,
            Some(frame.map(|f| CloseFrame::new(f.code, ""))),
        ),
        ClientEnd::Gone => (SessionEndKind::ClientGone, None),
        ClientEnd::Unresponsive => (SessionEndKind::ClientUnresponsive, None),
    };
    if let Some(frame) = answer {
        let _ = tokio::time::timeout(limits.close_drain_timeout, writer.close(frame)).await;
    }
    // Its reader has returned and dropped the stdin queue, so the stdin pump sends FIN after
    // what was queued; give it a moment (it may be stuck on a stalled upstream), then tear the
    // session down (RST + GOAWAY).
    if let Some(task) = stdin_task {
        let _ = tokio::time::timeout(STDIN_FIN_GRACE, task).await;
    }
    conn.close().await;
    outcome(
        bytes_in.load(Ordering::Relaxed),
        bytes_out,
        None,
        kind,
        started,
    )
}

/// Answers a session the upstream refused: the client's WebSocket is accepted, gets the ready
/// message and the upstream's Status on channel 3, then Close 1000. An HTTP error on the
/// handshake instead would send kubectl into its SPDY fallback, which our users' gateway drops.
pub async fn refuse<S>(
    ws: WebSocket<S>,
    ready: Channel,
    status: Status,
    limits: &SessionLimits,
) -> Outcome
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let (mut reader, mut writer) = ws.split();
    // Ready, status and Close go out in one write.
    let delivered = writer
        .queue_binary(&[ready.as_byte()], Bytes::new())
        .is_ok()
        && deliver_status(&mut writer, &status, limits.close_drain_timeout).await;
    if delivered {
        let _ = tokio::time::timeout(limits.close_drain_timeout, drain(&mut reader)).await;
    }
    outcome(0, 0, Some(status), SessionEndKind::UpstreamRefused, started)
}

/// Sends the status on channel 3 and Close 1000, behind whatever is queued. Returns whether
/// both went out. A client that stopped reading (its socket full of output it never took) gets
/// `limit` for them: the session ends, and releases its upstream, whatever the client does.
async fn deliver_status<W: AsyncWrite + Unpin>(
    writer: &mut WsWriter<W>,
    status: &Status,
    limit: Duration,
) -> bool {
    let json = Bytes::from(status.to_json_bytes());
    if writer
        .queue_binary(&[Channel::Error.as_byte()], json)
        .is_err()
    {
        return false;
    }
    let close = writer.close(Some(CloseFrame::new(CloseCode::NORMAL, "")));
    matches!(tokio::time::timeout(limit, close).await, Ok(Ok(())))
}

/// Reads (and discards) until the client's close frame or the end of the connection.
async fn drain<R: AsyncRead + Unpin>(reader: &mut WsReader<R>) {
    while let Some(Ok(_)) = reader.next().await {}
}

/// Forwards the latest terminal size to the upstream resize stream.
async fn pump_resize(mut rx: watch::Receiver<Option<TerminalSize>>, mut resize: SendStream) {
    let mut json = Vec::with_capacity(32);
    while rx.changed().await.is_ok() {
        let Some(size) = *rx.borrow_and_update() else {
            continue;
        };
        json.clear();
        size.encode_json(&mut json);
        if resize
            .send(bytes::Bytes::copy_from_slice(&json))
            .await
            .is_err()
        {
            return;
        }
    }
}

fn outcome(
    bytes_in: u64,
    bytes_out: u64,
    status: Option<Status>,
    end: SessionEndKind,
    started: Instant,
) -> Outcome {
    Outcome {
        bytes_in,
        bytes_out,
        status,
        end,
        duration: started.elapsed(),
    }
}
