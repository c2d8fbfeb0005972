//! The writer task: the only code that writes to the socket. Control frames (PING echoes,
//! SYN_STREAM/SYN_REPLY, RST, GOAWAY) have a priority lane so they never wait behind queued
//! data; small frames are coalesced into one write, large DATA payloads are written with a
//! vectored write so their bytes are not copied again.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use super::error::SessionEnd;
use super::shared::{Control, DataCmd, Shared};
use crate::spdy::codec::FrameEncoder;
use crate::spdy::frame::{Frame, GoAway, GoAwayStatus, Ping, PingId, RstStatus, RstStream};

/// Payloads at least this large are written straight from their buffer instead of being
/// copied into the coalescing buffer.
const COPY_LIMIT: usize = 4 * 1024;
/// Stop coalescing once this much is buffered.
const BATCH_BYTES: usize = 64 * 1024;
/// How long the final shutdown of the write half may take.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

pub(crate) struct Writer<W> {
    io: W,
    shared: Arc<Shared>,
    control_rx: mpsc::Receiver<Control>,
    data_rx: mpsc::Receiver<DataCmd>,
    encoder: FrameEncoder,
    out: BytesMut,
    /// A close request met while coalescing; handled once the batch is out.
    pending_close: Option<Control>,
}

enum Step {
    Continue,
    Stop,
}

/// What the main loop picked up for the next step.
enum Work {
    Control(Control),
    Data(DataCmd),
    Ping,
}

impl<W: AsyncWrite + Unpin> Writer<W> {
    pub(crate) fn new(
        io: W,
        shared: Arc<Shared>,
        control_rx: mpsc::Receiver<Control>,
        data_rx: mpsc::Receiver<DataCmd>,
    ) -> Self {
        Writer {
            io,
            shared,
            control_rx,
            data_rx,
            encoder: FrameEncoder::new(),
            out: BytesMut::new(),
            pending_close: None,
        }
    }

    pub(crate) async fn run(mut self) {
        let mut ping_timer = self.shared.config.ping_interval.map(|period| {
            let mut t = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        let mut end_rx = self.shared.subscribe_end();
        // A step was given up half-way: the peer is not taking bytes, so shutdown would wait too.
        let mut abandoned = false;
        loop {
            let work = if let Some(close) = self.pending_close.take() {
                Work::Control(close)
            } else {
                tokio::select! {
                    biased;
                    cmd = self.control_rx.recv() => match cmd {
                        Some(cmd) => Work::Control(cmd),
                        None => break,
                    },
                    () = ended(&mut end_rx) => break,
                    cmd = self.data_rx.recv() => match cmd {
                        Some(cmd) => Work::Data(cmd),
                        None => break,
                    },
                    () = tick(&mut ping_timer) => Work::Ping,
                }
            };
            // A step waits for the socket. Once the session is over (ping timeout, close that
            // timed out, ...) a peer that stopped reading would hold the task and the socket for
            // ever, so the step is dropped then. It is polled first: what the socket takes at
            // once still goes out, the hot path never polls the watch, and Close, which ends the
            // session itself just before it returns (same poll, no await in between), is never
            // cut short by its own end.
            let step = tokio::select! {
                biased;
                step = self.step(work) => step,
                () = ended(&mut end_rx) => {
                    abandoned = true;
                    Ok(Step::Stop)
                }
            };
            match step {
                Ok(Step::Continue) => {}
                Ok(Step::Stop) => break,
                Err(e) => {
                    self.shared.end(SessionEnd::Io(e.to_string()));
                    break;
                }
            }
        }
        if !abandoned {
            // Bounded: a TLS shutdown writes close_notify, which a frozen peer never takes.
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, self.io.shutdown()).await;
        }
    }

    async fn step(&mut self, work: Work) -> std::io::Result<Step> {
        match work {
            Work::Control(cmd) => self.control(cmd).await,
            Work::Data(cmd) => self.data(cmd).await,
            Work::Ping => self.ping().await,
        }
    }

    fn encode(&mut self, frame: &Frame) -> std::io::Result<()> {
        self.encoder
            .encode(frame, &mut self.out)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    async fn control(&mut self, cmd: Control) -> std::io::Result<Step> {
        match cmd {
            Control::Frame(frame) => {
                self.encode(&frame)?;
                self.drain_control()?;
                self.flush().await?;
                Ok(Step::Continue)
            }
            Control::ReleaseHeaderContext => {
                self.encoder.release_header_context();
                Ok(Step::Continue)
            }
            Control::Close {
                resets,
                last_good,
                done,
            } => {
                // Data already queued was sent before close was asked for: it goes out first,
                // so a final status or FIN is never overtaken by the RST/GOAWAY below.
                while let Ok(cmd) = self.data_rx.try_recv() {
                    FrameEncoder::encode_data_head(
                        cmd.id,
                        cmd.fin,
                        cmd.payload.len(),
                        &mut self.out,
                    );
                    self.out.extend_from_slice(&cmd.payload);
                }
                for id in resets {
                    self.encode(&Frame::RstStream(RstStream {
                        stream_id: id,
                        status: RstStatus::Cancel,
                    }))?;
                }
                self.encode(&Frame::GoAway(GoAway {
                    last_good_stream_id: last_good,
                    status: GoAwayStatus::Ok,
                }))?;
                let result = self.flush().await;
                let _ = self.io.shutdown().await;
                // No await from here on: `run` drops a step once the session has ended, and this
                // end must not cut the close short.
                self.shared.end(SessionEnd::Local);
                let _ = done.send(());
                result.map(|_| Step::Stop)
            }
        }
    }

    /// Encodes every control frame already waiting, so a burst goes out in one write.
    fn drain_control(&mut self) -> std::io::Result<()> {
        while self.out.len() < BATCH_BYTES {
            match self.control_rx.try_recv() {
                Ok(Control::Frame(frame)) => self.encode(&frame)?,
                Ok(Control::ReleaseHeaderContext) => self.encoder.release_header_context(),
                Ok(close @ Control::Close { .. }) => {
                    // Runs after this batch is written, from the main loop.
                    self.pending_close = Some(close);
                    break;
                }
                Err(_) => break,
            }
        }
        Ok(())
    }

    async fn data(&mut self, first: DataCmd) -> std::io::Result<Step> {
        let mut next = Some(first);
        while let Some(cmd) = next.take() {
            FrameEncoder::encode_data_head(cmd.id, cmd.fin, cmd.payload.len(), &mut self.out);
            if cmd.payload.len() >= COPY_LIMIT {
                write_all_vectored(&mut self.io, &mut self.out, cmd.payload).await?;
            } else {
                self.out.extend_from_slice(&cmd.payload);
            }
            if self.out.len() >= BATCH_BYTES {
                break;
            }
            // Control frames first, then more data that is already waiting.
            self.drain_control()?;
            next = self.data_rx.try_recv().ok();
        }
        self.flush().await?;
        Ok(Step::Continue)
    }

    async fn ping(&mut self) -> std::io::Result<Step> {
        let id = {
            let mut st = self.shared.lock();
            if st.goaway.is_some() {
                return Ok(Step::Continue);
            }
            let id = st.next_ping_id;
            st.next_ping_id = st.next_ping_id.wrapping_add(2);
            id
        };
        self.encode(&Frame::Ping(Ping { id: PingId(id) }))?;
        self.flush().await?;
        Ok(Step::Continue)
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            self.io.write_all(&self.out).await?;
            self.out.clear();
            if self.out.capacity() > 2 * BATCH_BYTES {
                self.out = BytesMut::new();
            }
        }
        self.io.flush().await
    }
}

/// Resolves once the session has ended (at once if it already has).
async fn ended(rx: &mut watch::Receiver<Option<SessionEnd>>) {
    // An error means the sender is gone, which only happens with the session itself.
    let _ = rx.wait_for(Option::is_some).await;
}

async fn tick(timer: &mut Option<tokio::time::Interval>) {
    match timer {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Writes `head` followed by `payload` without copying the payload, then clears `head`.
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    io: &mut W,
    head: &mut BytesMut,
    mut payload: bytes::Bytes,
) -> std::io::Result<()> {
    while head.has_remaining() {
        let slices = [IoSlice::new(head), IoSlice::new(&payload)];
        let n = io.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let from_head = n.min(head.len());
        head.advance(from_head);
        payload.advance(n - from_head);
    }
    io.write_all(&payload).await?;
    head.clear();
    Ok(())
}
