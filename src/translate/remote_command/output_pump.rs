//! Copies upstream stdout/stderr to the client as channel 1/2 binary messages, and answers the
//! client's pings while it waits.

use bytes::Bytes;
use tokio::io::AsyncWrite;

use crate::activity_clock::ActivityClock;
use crate::audit::recording::Recorder;
use crate::session_traffic::SessionTraffic;
use crate::spdy::proto::RecvStream;
use crate::translate::channel::Channel;
use crate::translate::ws::WsWriter;

/// Upstream DATA larger than this is split into several messages, so a client never has to
/// hold a multi-MiB message (Kubernetes peers send ≤ 32 KiB frames anyway).
const MAX_MESSAGE_PAYLOAD: usize = 64 * 1024;
/// Output already waiting is written together, up to this much per write.
const BATCH_BYTES: usize = 256 * 1024;
/// And at most this many chunks per batch: the batch's list stays with the session, and an
/// idle one should not keep a long one after a burst of small chunks.
const BATCH_CHUNKS: usize = 64;

/// How the output side ended.
#[derive(Debug)]
pub(crate) enum OutputEnd {
    /// stdout and stderr both ended (FIN, RST, or the upstream went away).
    UpstreamDone,
    /// Writing to the client failed: it is gone.
    ClientGone,
    /// The recording failed under `--record=required`: what it could not hold was not sent.
    RecordingFailed,
}

/// Pumps until both outputs ended, counting the bytes forwarded on `traffic`, noting
/// each output on `activity` (the session's idle clock) and on `recorder`.
pub(crate) async fn pump_output<W>(
    writer: &mut WsWriter<W>,
    mut stdout: Option<RecvStream>,
    mut stderr: Option<RecvStream>,
    traffic: &SessionTraffic,
    activity: &ActivityClock,
    recorder: Option<&Recorder>,
) -> OutputEnd
where
    W: AsyncWrite + Unpin,
{
    // Output already queued behind a chunk is handled with it (reused across the loop).
    let mut batch: Vec<Bytes> = Vec::new();
    loop {
        let (channel, next) = tokio::select! {
            next = recv_opt(&mut stdout), if stdout.is_some() => (Channel::Stdout, next),
            next = recv_opt(&mut stderr), if stderr.is_some() => (Channel::Stderr, next),
            // Flushing sends the pong or the keepalive ping.
            () = writer.control_due(), if stdout.is_some() || stderr.is_some() => {
                if writer.flush().await.is_err() {
                    return OutputEnd::ClientGone;
                }
                continue;
            }
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
        let rx = match channel {
            Channel::Stdout => &mut stdout,
            _ => &mut stderr,
        };
        let gathered = gather(data, rx, &mut batch);
        traffic.to_client(gathered);
        activity.touch();
        if let Some(recorder) = recorder {
            // What the client is sent, as it is sent: the batch waits for the recording
            // budget once, however many chunks it holds (and under `--record=required`, for
            // the writer to be within its bound). Meanwhile the client is still pinged and
            // answered: a session held back by its recording has not lost its client, and a
            // keepalive that fell silent here would end it as "client unresponsive". Output
            // the upstream cut off can only be drained: it stops waiting in turn (the
            // recorder's cut lane), so a cut session ends without waiting on everyone else's.
            let recorded = recorder.outputs_until_cut(&batch, cut(rx.as_ref()));
            if !writer.answer_pings_until(recorded).await {
                batch.clear();
                return OutputEnd::RecordingFailed;
            }
        }
        // Until now the batch held its room in the stream's inbox: a session waiting for the
        // recording budget holds no more than its inbox, however long it waits.
        if let Some(rx) = rx.as_mut() {
            rx.release_held();
        }
        for data in batch.drain(..) {
            if queue(writer, channel, data).is_err() {
                return OutputEnd::ClientGone;
            }
        }
        // Write unless more output is already waiting: small messages go out together.
        let more = output_ready(&stdout) || output_ready(&stderr);
        if (!more || writer.queued() >= BATCH_BYTES) && writer.flush().await.is_err() {
            return OutputEnd::ClientGone;
        }
    }
}

/// Resolves once the upstream has cut `rx` off (see [`RecvStream::cut`]).
async fn cut(rx: Option<&RecvStream>) {
    match rx {
        Some(rx) => rx.cut().await,
        None => std::future::pending().await,
    }
}

/// Puts `first` and whatever `rx` already holds behind it (up to [`BATCH_BYTES`] and
/// [`BATCH_CHUNKS`]) into `batch`, their inbox room still held; their length.
fn gather(first: Bytes, rx: &mut Option<RecvStream>, batch: &mut Vec<Bytes>) -> usize {
    let mut gathered = first.len();
    batch.push(first);
    while gathered < BATCH_BYTES && batch.len() < BATCH_CHUNKS {
        match rx.as_mut().and_then(RecvStream::try_recv_held) {
            Some(more) => {
                gathered += more.len();
                batch.push(more);
            }
            None => break,
        }
    }
    gathered
}

/// Queues `data` as messages behind the channel byte; the payload is not copied.
fn queue<W: AsyncWrite + Unpin>(
    writer: &mut WsWriter<W>,
    channel: Channel,
    mut data: Bytes,
) -> Result<(), crate::translate::ws::Error> {
    if data.is_empty() {
        return Ok(());
    }
    while data.len() > MAX_MESSAGE_PAYLOAD {
        writer.queue_binary(&[channel.as_byte()], data.split_to(MAX_MESSAGE_PAYLOAD))?;
    }
    writer.queue_binary(&[channel.as_byte()], data)
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
