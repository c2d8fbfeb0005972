//! One reverse-translated exec/attach session: the client's SPDY streams on one side, a
//! `v5.channel.k8s.io` WebSocket to the upstream on the other.
//!
//! ```text
//! SPDY stdin  ──► [stdin pump]  ── 00+data, FF 00 at EOF ──► [upstream writer] ──► WS
//! SPDY resize ──► [resize pump] ── 04+{"Width":..}\n      ──┘        ▲ pings
//! SPDY stdout ◄── [upstream reader] ◄── 01/02 messages ◄── WS
//! SPDY stderr ◄──┘       └── 03 (Status) → SPDY error stream at the end
//! ```
//! Every hop is bounded: a slow client slows the upstream reader (SPDY's outgoing data lane), a
//! stalled upstream stops the stdin pump once a few messages are queued.

use crate::session_stop::SessionStop;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{FutureExt, Sink, SinkExt, Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::client_status::ClientStatus;
use super::client_streams::ClientStreams;
use super::v5_message::{self, decode_server, ServerMessage, StatusBytes};
use crate::activity_clock::ActivityClock;
use crate::audit::recording::{Recordable, Recorded, Recorder};
use crate::session_traffic::SessionTraffic;
use crate::spdy::proto::{Connection, RecvStream, SendStream, SessionEnd};
use crate::translate::protocol::UpstreamVersion;
use crate::translate::remote_command::{
    first_proxy_end, EndStatus, Outcome, SessionEndKind, SessionRecording,
};
use crate::translate::resize::ResizeDecoder;
use crate::translate::status::Status;
use crate::translate::CLOSE_WAIT;

/// Upstream output already received is gathered, up to this much and this many messages, and
/// passed on together (the batch's list stays with the session: it is kept short).
const BATCH_BYTES: usize = 256 * 1024;
const BATCH_MESSAGES: usize = 64;

/// Most stdin bytes per message to the upstream: what kubectl's own v5 messages carry. A
/// client's larger SPDY frame is passed on in pieces, each copied behind its channel byte only
/// as the queue takes it, so the queue holds at most its length in such pieces while the frame
/// itself stays held, and counted, in the client session's memory lane.
const STDIN_MESSAGE: usize = 32 * 1024;

/// Bounds and clocks of one reverse-translated session.
#[derive(Debug, Clone)]
pub struct ReverseLimits {
    /// Messages queued towards a slow upstream before the stdin pump stops reading.
    pub upstream_queue_messages: usize,
    /// A session carrying no data either way for this long is ended with a Status
    /// (`--stream-idle-timeout`).
    pub idle_timeout: Option<Duration>,
    /// WebSocket pings to the upstream this often (keeps middleboxes from cutting the
    /// connection, as the SPDY pings of the other direction do).
    pub upstream_ping_interval: Option<Duration>,
    /// How long after a ping was due the upstream may stay silent before the session ends.
    pub upstream_ping_timeout: Option<Duration>,
}

impl Default for ReverseLimits {
    fn default() -> Self {
        ReverseLimits {
            upstream_queue_messages: 16,
            idle_timeout: None,
            upstream_ping_interval: Some(Duration::from_secs(5)),
            upstream_ping_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// How the upstream side ended.
#[derive(Debug)]
enum UpstreamEnd {
    /// A Close frame (the status, if any, came before it).
    Closed,
    /// The connection failed or ended without a Close frame.
    Lost,
    /// The upstream broke v5 (a text message); the session is failed with this text.
    Violation(&'static str),
}

/// Why the session is ending.
enum Ending {
    /// The upstream finished (or failed): the client gets its status.
    Upstream(UpstreamEnd),
    /// The proxy ends it with this status.
    Proxy(Box<EndStatus>),
    /// The client went away or stopped answering; nothing can be told.
    Client(SessionEndKind),
}

/// Runs a session whose client streams are all open and whose upstream WebSocket negotiated
/// `v5.channel.k8s.io`: the pumps until the first end, then the upstream closed and the client
/// told the status (unless it is the one that left). What it carries is counted on `traffic`,
/// once per chunk of stdin and batch of output, and its outcome reports those counts.
pub async fn run<U>(
    client: ClientStreams,
    upstream: WebSocketStream<U>,
    limits: &ReverseLimits,
    stop: SessionStop,
    recording: Option<&SessionRecording>,
    traffic: &SessionTraffic,
) -> Outcome
where
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    // `client` keeps its unused halves until the end, so they are reset with the session.
    let ClientStreams {
        conn,
        version,
        mut error,
        stdin,
        stdout,
        stderr,
        resize,
        ..
    } = client;
    let (sink, mut source) = upstream.split();
    let writer = UpstreamWriter::start(sink, limits);
    let session = Session {
        limits,
        recording,
        stop,
        traffic,
        data: ActivityClock::new(),
        heard: ActivityClock::new(),
    };
    let mut to_client = ToClient {
        outputs: [stdout, stderr],
        status: StatusBytes::default(),
        traffic,
    };
    let ending = session
        .first_end(
            &conn,
            &writer.queue,
            (stdin, resize),
            &mut source,
            &mut to_client,
        )
        .await;
    // Whatever ended it, the upstream is done with: Close 1000 (or the answer to its Close),
    // sent while the client is finished.
    let closing = writer.close();
    let (told, kind) = what_the_client_is_told(ending, &to_client.status);
    if let Some(told) = &told {
        // The status, then the ends of the outputs, then RST + GOAWAY: what a kubelet sends.
        to_client.finish(told, version, &mut error).await;
    }
    conn.close().await;
    let _ = tokio::time::timeout(CLOSE_WAIT, closing).await;
    let (bytes_in, bytes_out) = traffic.moved();
    let status = told.map(|told| told.status);
    Outcome::since(started, bytes_in, bytes_out, status, kind)
}

/// The status the client gets (none when it is the one that left), and why the session ended.
fn what_the_client_is_told(
    ending: Ending,
    collected: &StatusBytes,
) -> (Option<ClientStatus>, SessionEndKind) {
    match ending {
        Ending::Upstream(UpstreamEnd::Violation(why)) => (
            Some(ClientStatus::proxy(Status::internal_error(why))),
            SessionEndKind::Completed,
        ),
        Ending::Upstream(UpstreamEnd::Closed | UpstreamEnd::Lost) => (
            Some(ClientStatus::from_upstream(collected.as_slice())),
            SessionEndKind::Completed,
        ),
        Ending::Proxy(end) => (Some(ClientStatus::proxy(end.status)), end.kind),
        Ending::Client(kind) => (None, kind),
    }
}

/// What goes back to the client: its output streams, the status the upstream sent on channel
/// 3, and where the output bytes passed on are counted.
struct ToClient<'a> {
    /// stdout (slot 0) and stderr (slot 1); `None` once the client's stream is gone.
    outputs: [Option<SendStream>; 2],
    status: StatusBytes,
    traffic: &'a SessionTraffic,
}

impl ToClient<'_> {
    /// Sends the status on the error stream (if this version gets one) and ends the streams.
    async fn finish(
        &mut self,
        status: &ClientStatus,
        version: UpstreamVersion,
        error: &mut SendStream,
    ) {
        if let Some(payload) = status.error_stream_payload(version) {
            let _ = error.send(payload).await;
        }
        let _ = error.finish().await;
        for out in self.outputs.iter_mut().flatten() {
            let _ = out.finish().await;
        }
    }
}

/// The task owning the upstream's sending half, and the session's handles on it.
struct UpstreamWriter {
    /// What the client's stdin and resize pumps send upstream.
    queue: mpsc::Sender<Message>,
    /// Tells the task to close the upstream (Close 1000, or the answer to its Close).
    close: CancellationToken,
    /// Tells it too when the session lets go of it without closing (its future dropped): the
    /// task, which would otherwise go on pinging, never outlives the session.
    _close_on_drop: DropGuard,
    task: JoinHandle<()>,
}

impl UpstreamWriter {
    fn start<S>(sink: S, limits: &ReverseLimits) -> UpstreamWriter
    where
        S: Sink<Message, Error = WsError> + Unpin + Send + 'static,
    {
        let (queue, rx) = mpsc::channel(limits.upstream_queue_messages.max(1));
        let close = CancellationToken::new();
        let task = tokio::spawn(write_upstream(
            sink,
            rx,
            limits.upstream_ping_interval,
            close.clone(),
        ));
        UpstreamWriter {
            queue,
            _close_on_drop: close.clone().drop_guard(),
            close,
            task,
        }
    }

    /// Stops taking messages and has the task close the upstream; the task, to await.
    fn close(self) -> JoinHandle<()> {
        drop(self.queue);
        self.close.cancel();
        self.task
    }
}

/// What the steps of one session share; the pumps borrow the counters for the whole session.
struct Session<'a> {
    limits: &'a ReverseLimits,
    recording: Option<&'a SessionRecording>,
    stop: SessionStop,
    /// What went each way: stdin counted by its pump, output by the upstream's reader.
    traffic: &'a SessionTraffic,
    /// When data last went either way (`--stream-idle-timeout`).
    data: ActivityClock,
    /// When the upstream was last heard from (its liveness).
    heard: ActivityClock,
}

impl Session<'_> {
    /// Pumps both ways until the first end: the upstream's, the client's (its SPDY session
    /// closed), or one the proxy puts (the upstream silent past its ping timeout, idle, the
    /// recording, the drain). The client's inputs ending ends nothing.
    async fn first_end<S>(
        &self,
        conn: &Connection,
        queue: &mpsc::Sender<Message>,
        (stdin, resize): (Option<RecvStream>, Option<RecvStream>),
        source: &mut S,
        to_client: &mut ToClient<'_>,
    ) -> Ending
    where
        S: Stream<Item = Result<Message, WsError>> + Unpin,
    {
        let recorder = self.recording.map(|r| &r.recorder);
        let (data, traffic) = (&self.data, self.traffic);
        let client_side = async {
            tokio::join!(
                pump_stdin(stdin, queue.clone(), traffic, data, recorder),
                pump_resize(resize, queue.clone(), data, recorder),
            );
            // The client's inputs ended; the session goes on until the upstream ends it.
            std::future::pending::<()>().await
        };
        let upstream_side = read_upstream(source, to_client, data, &self.heard, recorder);
        let limits = self.limits;
        let silent_past = limits
            .upstream_ping_interval
            .zip(limits.upstream_ping_timeout)
            .map(|(every, timeout)| every + timeout);
        let proxy_end = first_proxy_end(data, limits.idle_timeout, self.recording, &self.stop);
        tokio::select! {
            end = upstream_side => Ending::Upstream(end),
            end = conn.closed() => Ending::Client(match end {
                SessionEnd::PingTimeout(_) => SessionEndKind::ClientUnresponsive,
                // A frame the session could not hold: the client's SPDY session was ended
                // with GOAWAY.
                SessionEnd::Memory(_) => SessionEndKind::ClientViolation,
                _ => SessionEndKind::ClientGone,
            }),
            () = client_side => unreachable!("the client side never ends the session"),
            silent = self.heard.quiet_for_limit(silent_past) => Ending::Proxy(Box::new(
                EndStatus::upstream_unresponsive("WebSocket", silent),
            )),
            end = proxy_end => Ending::Proxy(Box::new(end)),
        }
    }
}

/// Reads the upstream until it closes: output to the client's streams, the Status collected.
async fn read_upstream<S>(
    source: &mut S,
    to_client: &mut ToClient<'_>,
    data: &ActivityClock,
    heard: &ActivityClock,
    recorder: Option<&Recorder>,
) -> UpstreamEnd
where
    S: Stream<Item = Result<Message, WsError>> + Unpin,
{
    // Output that arrived together is recorded together (one wait for the recording budget),
    // then passed on in order. Reused across the loop.
    let mut batch: Vec<Output> = Vec::new();
    loop {
        let mut next = source.next().await;
        let mut gathered = 0;
        let end = loop {
            let Some(msg) = next else {
                break Some(UpstreamEnd::Lost);
            };
            heard.touch();
            match read_message(msg, &mut to_client.status) {
                Read::Output(output) => {
                    gathered += output.payload.len();
                    batch.push(output);
                }
                Read::Nothing => {}
                Read::End(end) => break Some(end),
            }
            if gathered >= BATCH_BYTES || batch.len() >= BATCH_MESSAGES {
                break None;
            }
            // Only what is there already: the batch never waits for more.
            match source.next().now_or_never() {
                Some(more) => next = more,
                None => break None,
            }
        };
        if !batch.is_empty() {
            data.touch();
            to_client.traffic.to_client(gathered);
            if let Some(recorder) = recorder {
                // Under `--record=required` a failed recording keeps the batch back; the
                // session's `first_proxy_end` ends it with a Status.
                if !recorder.record(&batch).await {
                    batch.clear();
                    return std::future::pending::<UpstreamEnd>().await;
                }
            }
            let outputs = &mut to_client.outputs;
            for Output { slot, payload } in batch.drain(..) {
                if let Some(out) = outputs[slot].as_mut() {
                    if out.send(payload).await.is_err() {
                        // The client's session is gone; it is noticed there. Keep reading
                        // meanwhile.
                        outputs[slot] = None;
                    }
                }
            }
        }
        if let Some(end) = end {
            return end;
        }
    }
}

/// Output for the client's stdout (slot 0) or stderr (slot 1).
struct Output {
    slot: usize,
    payload: Bytes,
}

impl Recordable for Output {
    fn recorded(&self) -> Option<Recorded<'_>> {
        Some(Recorded::Output(&self.payload))
    }
}

/// What one upstream message means for the reader.
enum Read {
    Output(Output),
    /// Nothing for the client (a Status part, a ping).
    Nothing,
    End(UpstreamEnd),
}

fn read_message(msg: Result<Message, WsError>, status: &mut StatusBytes) -> Read {
    let message = match msg {
        Ok(Message::Binary(message)) => message,
        // client-go refuses text on v5 too.
        Ok(Message::Text(_)) => {
            return Read::End(UpstreamEnd::Violation(
                "the upstream sent a text message on a v5.channel.k8s.io connection",
            ))
        }
        Ok(Message::Close(_)) => return Read::End(UpstreamEnd::Closed),
        Ok(_) => return Read::Nothing,
        Err(_) => return Read::End(UpstreamEnd::Lost),
    };
    let (slot, payload) = match decode_server(message) {
        ServerMessage::Stdout(payload) => (0, payload),
        ServerMessage::Stderr(payload) => (1, payload),
        ServerMessage::Status(payload) => {
            status.push(&payload);
            return Read::Nothing;
        }
        ServerMessage::Ignored => return Read::Nothing,
    };
    Read::Output(Output { slot, payload })
}

/// Client stdin to the upstream: `00`+data per DATA frame, `FF 00` when the client half-closes.
async fn pump_stdin(
    stdin: Option<RecvStream>,
    tx: mpsc::Sender<Message>,
    traffic: &SessionTraffic,
    data: &ActivityClock,
    recorder: Option<&Recorder>,
) {
    let Some(mut stdin) = stdin else { return };
    loop {
        match stdin.recv().await {
            Some(Ok(chunk)) => {
                if chunk.is_empty() {
                    continue;
                }
                data.touch();
                traffic.from_client(chunk.len());
                if let Some(recorder) = recorder {
                    recorder.input(&chunk).await;
                }
                for piece in chunk.chunks(STDIN_MESSAGE) {
                    if tx
                        .send(Message::Binary(v5_message::stdin(piece)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
            // The client's connection died: no EOF to pass on, the session is ending.
            Some(Err(_)) => return,
            // FIN (or RST): stdin reached its end.
            None => {
                let _ = tx.send(Message::Binary(v5_message::close_stdin())).await;
                return;
            }
        }
    }
}

/// Client terminal sizes to the upstream, re-encoded as kubectl writes them; the first
/// malformed size stops resizing (the reference does the same), not the session.
async fn pump_resize(
    resize: Option<RecvStream>,
    tx: mpsc::Sender<Message>,
    data: &ActivityClock,
    recorder: Option<&Recorder>,
) {
    let Some(mut resize) = resize else { return };
    let mut decoder = ResizeDecoder::new();
    let mut forwarding = true;
    while let Some(Ok(chunk)) = resize.recv().await {
        data.touch();
        if !forwarding {
            // Still drained, so the client's session never waits on this stream.
            continue;
        }
        match decoder.push(&chunk) {
            Ok(sizes) => {
                for size in sizes {
                    if let Some(recorder) = recorder {
                        recorder.resize(size.width, size.height).await;
                    }
                    if tx
                        .send(Message::Binary(v5_message::resize(size)))
                        .await
                        .is_err()
                    {
                        forwarding = false;
                    }
                }
            }
            Err(_) => forwarding = false,
        }
    }
}

/// Owns the upstream's sending half: queued messages in order, keepalive pings, and at the
/// end (`close`) a Close 1000.
async fn write_upstream<S>(
    mut sink: S,
    mut rx: mpsc::Receiver<Message>,
    ping_every: Option<Duration>,
    close: CancellationToken,
) where
    S: Sink<Message, Error = WsError> + Unpin,
{
    let mut pings = ping_every.map(|every| {
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    let mut queue_open = true;
    let mut broken = false;
    loop {
        let next = tokio::select! {
            biased;
            () = close.cancelled() => break,
            msg = rx.recv(), if queue_open => match msg {
                Some(msg) => msg,
                None => {
                    queue_open = false;
                    continue;
                }
            },
            _ = tick(&mut pings), if !broken => Message::Ping(Bytes::new()),
        };
        if broken {
            // Drained, so the pumps never wait on a dead upstream.
            continue;
        }
        tokio::select! {
            sent = sink.send(next) => broken = sent.is_err(),
            () = close.cancelled() => break,
        }
    }
    if !broken {
        let frame = CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        };
        let _ = tokio::time::timeout(CLOSE_WAIT, async {
            // After the upstream's own Close this only flushes the echo.
            let _ = sink.send(Message::Close(Some(frame))).await;
            let _ = sink.close().await;
        })
        .await;
    }
}

async fn tick(timer: &mut Option<tokio::time::Interval>) {
    match timer {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}
