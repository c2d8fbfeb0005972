//! One translated exec/attach session, from the ready message to the graceful close.

use crate::session_stop::SessionStop;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::client_reader::{read_client, ClientEnd, ClientSinks};
use super::end_status::{first_proxy_end, EndStatus};
use super::error_reader::{read_error_stream, ErrorStreamResult};
use super::outcome::{Outcome, SessionEndKind, SessionRecording};
use super::output_pump::{pump_output, OutputEnd};
use super::setup::ExecStreams;
use super::stdin_pump::pump_stdin;
use crate::activity_clock::ActivityClock;
use crate::session_traffic::SessionTraffic;
use crate::spdy::proto::{Connection, RecvStream, SendStream, SessionEnd};
use crate::translate::channel::Channel;
use crate::translate::protocol::UpstreamVersion;
use crate::translate::resize::TerminalSize;
use crate::translate::status::Status;
use crate::translate::status_mapping::from_upstream_error_stream;
use crate::translate::ws::{CloseCode, CloseFrame, Liveness, WebSocket, WsWriter};

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

/// Runs a translated session on an accepted `v5.channel.k8s.io` WebSocket: the ready message,
/// then the pumps until the first end, then the finish that end calls for. What it carries is
/// counted on `traffic`, once per message or chunk (stdin from the client; stdout and stderr
/// to it), and its outcome reports those counts.
#[allow(clippy::too_many_arguments)]
pub async fn run<S>(
    ws: WebSocket<S>,
    upstream: ExecStreams,
    ready: Channel,
    tty: bool,
    limits: &SessionLimits,
    stop: SessionStop,
    recording: Option<&SessionRecording>,
    traffic: &SessionTraffic,
) -> Outcome
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let (mut reader, mut writer) = ws.split();
    // Ready message: an empty payload on the lowest writable channel.
    if writer
        .send_binary(&[ready.as_byte()], Bytes::new())
        .await
        .is_err()
    {
        upstream.conn.close().await;
        return Outcome::since(started, 0, 0, None, SessionEndKind::ClientGone);
    }
    let (session, pumps) = Session::start(upstream, tty, limits, recording, stop, traffic);
    let liveness = reader.liveness();
    let recorder = recording.map(|r| &r.recorder);
    let client = read_client(&mut reader, pumps.sinks, traffic, &session.data, recorder);
    tokio::pin!(client);
    let first = session
        .first_end(&mut writer, pumps.outputs, client.as_mut(), &liveness)
        .await;
    let (status, kind) = match first {
        Ok(end) => {
            session
                .finish_with_status(&mut writer, &end.status, client)
                .await;
            (Some(end.status), end.kind)
        }
        Err(end) => {
            let kind = session
                .finish_after_client(&mut writer, end, pumps.stdin)
                .await;
            (None, kind)
        }
    };
    let (bytes_in, bytes_out) = traffic.moved();
    Outcome::since(started, bytes_in, bytes_out, status, kind)
}

/// What carries the upstream's streams: the outputs and the task collecting the status, the
/// stdin pump, and where the client's reader hands stdin and terminal sizes over.
struct Pumps {
    outputs: Outputs,
    /// Sends FIN after what was queued once the client's reader drops the stdin queue.
    stdin: Option<JoinHandle<u64>>,
    sinks: ClientSinks,
}

/// The upstream's output streams and the task collecting its status.
struct Outputs {
    stdout: Option<RecvStream>,
    stderr: Option<RecvStream>,
    error: JoinHandle<ErrorStreamResult>,
}

/// What the steps of one session share; the client's reader borrows the counters for the
/// whole session.
struct Session<'a> {
    conn: Connection,
    version: UpstreamVersion,
    limits: &'a SessionLimits,
    recording: Option<&'a SessionRecording>,
    stop: SessionStop,
    /// What went each way: stdin counted by the client's reader, output by its pump.
    traffic: &'a SessionTraffic,
    /// When data last went either way (`--stream-idle-timeout`).
    data: ActivityClock,
}

impl<'a> Session<'a> {
    /// Starts reading the error stream and pumping stdin and (with a tty) terminal sizes
    /// upstream.
    fn start(
        upstream: ExecStreams,
        tty: bool,
        limits: &'a SessionLimits,
        recording: Option<&'a SessionRecording>,
        stop: SessionStop,
        traffic: &'a SessionTraffic,
    ) -> (Session<'a>, Pumps) {
        let mut pumps = Pumps {
            outputs: Outputs {
                stdout: upstream.stdout,
                stderr: upstream.stderr,
                error: tokio::spawn(read_error_stream(upstream.error)),
            },
            stdin: None,
            sinks: ClientSinks {
                stdin: None,
                resize: None,
            },
        };
        if let Some(stdin) = upstream.stdin {
            let (tx, rx) = mpsc::channel(limits.stdin_queue_messages.max(1));
            pumps.stdin = Some(tokio::spawn(pump_stdin(rx, stdin)));
            pumps.sinks.stdin = Some(tx);
        }
        if let (true, Some(resize)) = (tty, upstream.resize) {
            let (tx, rx) = watch::channel(None);
            tokio::spawn(pump_resize(rx, resize));
            pumps.sinks.resize = Some(tx);
        }
        let session = Session {
            conn: upstream.conn,
            version: upstream.version,
            limits,
            recording,
            stop,
            traffic,
            data: ActivityClock::new(),
        };
        (session, pumps)
    }

    /// Phase 1: until the command is over (outputs and the error stream ended), the proxy ends
    /// the session (each with the Status to deliver), or the client ended it first (`Err`).
    async fn first_end<W, C>(
        &self,
        writer: &mut WsWriter<W>,
        outputs: Outputs,
        client: Pin<&mut C>,
        liveness: &Liveness,
    ) -> Result<EndStatus, ClientEnd>
    where
        W: AsyncWrite + Unpin,
        C: Future<Output = ClientEnd>,
    {
        let recorder = self.recording.map(|r| &r.recorder);
        let command_done = async {
            let Outputs {
                stdout,
                stderr,
                error,
            } = outputs;
            match pump_output(writer, stdout, stderr, self.traffic, &self.data, recorder).await {
                OutputEnd::ClientGone => return None,
                // The session ends with the recording's Status (`first_proxy_end`).
                OutputEnd::RecordingFailed => std::future::pending::<()>().await,
                OutputEnd::UpstreamDone => {}
            }
            // The outputs ended (or there were none): pings still need answers until the status.
            Some(writer.answer_pings_until(error).await.unwrap_or_default())
        };
        let proxy_end = first_proxy_end(
            &self.data,
            self.limits.idle_timeout,
            self.recording,
            &self.stop,
        );
        tokio::select! {
            result = command_done => match result {
                Some(result) => Ok(self.command_status(result)),
                None => Err(ClientEnd::Gone),
            },
            end = client => Err(end),
            // A client that answers nothing cannot be told anything either.
            _ = liveness.lost() => Err(ClientEnd::Unresponsive),
            end = proxy_end => Ok(end),
        }
    }

    /// The status of a command whose outputs and error stream ended.
    fn command_status(&self, result: ErrorStreamResult) -> EndStatus {
        match self.conn.end_reason() {
            // The outputs ended because the upstream stopped answering pings, not because the
            // command finished: say so, rather than the generic "connection lost" status.
            Some(SessionEnd::PingTimeout(silent)) => {
                EndStatus::upstream_unresponsive("SPDY", silent)
            }
            // Or because the upstream sent a frame this session's memory could not hold.
            Some(SessionEnd::Memory(refused)) => EndStatus::upstream_frame_refused(&refused),
            _ => EndStatus {
                status: from_upstream_error_stream(
                    self.version,
                    &result.bytes,
                    result.ended_cleanly,
                ),
                kind: SessionEndKind::Completed,
            },
        }
    }

    /// Phase 2 of a session that ends with a status: deliver it, close, and drain the client.
    async fn finish_with_status<W, C>(
        &self,
        writer: &mut WsWriter<W>,
        status: &Status,
        client: Pin<&mut C>,
    ) where
        W: AsyncWrite + Unpin,
        C: Future<Output = ClientEnd>,
    {
        let limit = self.limits.close_drain_timeout;
        let delivered = deliver_status(writer, status, limit).await;
        self.conn.close().await;
        if delivered {
            // Keep reading (and discarding) so a late client frame never meets a TCP reset
            // that would destroy output the client has not read yet.
            let _ = tokio::time::timeout(limit, client).await;
        }
    }

    /// The client left or misbehaved first: answer it at once (a client that closed completes
    /// its closing handshake with its own code echoed), but never wait long on one that does
    /// not read; then tear the upstream down. Returns why the session ended.
    async fn finish_after_client<W: AsyncWrite + Unpin>(
        &self,
        writer: &mut WsWriter<W>,
        end: ClientEnd,
        stdin_pump: Option<JoinHandle<u64>>,
    ) -> SessionEndKind {
        let (kind, answer) = match end {
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
            let limit = self.limits.close_drain_timeout;
            let _ = tokio::time::timeout(limit, writer.close(frame)).await;
        }
        // Its reader has returned and dropped the stdin queue, so the stdin pump sends FIN
        // after what was queued; give it a moment (it may be stuck on a stalled upstream), then
        // tear the session down (RST + GOAWAY).
        if let Some(task) = stdin_pump {
            let _ = tokio::time::timeout(STDIN_FIN_GRACE, task).await;
        }
        self.conn.close().await;
        kind
    }
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
        let _ = tokio::time::timeout(limits.close_drain_timeout, reader.drain()).await;
    }
    Outcome::since(started, 0, 0, Some(status), SessionEndKind::UpstreamRefused)
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
