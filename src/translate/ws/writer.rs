//! The writing half: messages to the client. A message's head (and a prefix such as the channel
//! byte) goes into a small buffer; a large payload is written from its own buffer with a
//! vectored write, uncopied. Queued messages go out together in one write, and a pong for the
//! latest ping goes out behind them, as does a keepalive ping when one is due.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::pin::Pin;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

use super::close::CloseFrame;
use super::frame::{FrameHead, OpCode, MAX_HEAD_LEN};
use super::Error;

/// Payloads shorter than this are copied next to their head: one slice instead of two.
const COPY_LIMIT: usize = 1024;
/// Slices per vectored write.
const MAX_SLICES: usize = 64;
/// Slices of a typical write (a head and a payload, a pong).
const FEW_SLICES: usize = 4;
/// The small buffer is let go once it grew beyond this (a burst of small messages).
const SHRINK_ABOVE: usize = 64 * 1024;
/// The small buffer grows at least this much at a time, so a batch's heads share one allocation
/// (it is reused once the batch is written).
const SMALL_CHUNK: usize = 512;

/// Writes messages to a client.
pub struct WsWriter<W> {
    io: W,
    /// Heads and small payloads not yet moved to `segments`.
    small: BytesMut,
    /// What is queued, in order; the front may be partly written.
    segments: VecDeque<Bytes>,
    pings: watch::Receiver<Option<Bytes>>,
    /// The payload of a ping seen and not yet answered.
    pong_due: Option<Bytes>,
    /// The reader is gone: no more pings to answer.
    reader_gone: bool,
    /// Keepalive pings: when the next is due, and how often.
    ping_timer: Option<(Pin<Box<Sleep>>, Duration)>,
    /// A keepalive ping goes out with the next flush.
    ping_due: bool,
    close_sent: bool,
}

impl<W: AsyncWrite + Unpin> WsWriter<W> {
    /// A writer answering the pings `pings` brings, and pinging every `ping_every`.
    pub(super) fn new(
        io: W,
        pings: watch::Receiver<Option<Bytes>>,
        ping_every: Option<Duration>,
    ) -> Self {
        WsWriter {
            io,
            small: BytesMut::new(),
            segments: VecDeque::new(),
            pings,
            pong_due: None,
            reader_gone: false,
            // One timer for the session's life, re-armed in place (no allocation per ping).
            ping_timer: ping_every.map(|every| (Box::pin(tokio::time::sleep(every)), every)),
            ping_due: false,
            close_sent: false,
        }
    }

    /// Queues a binary message: `prefix` (a channel byte, say) followed by `payload`. Nothing
    /// is written until [`flush`](Self::flush).
    pub fn queue_binary(&mut self, prefix: &[u8], payload: Bytes) -> Result<(), Error> {
        if self.close_sent {
            return Err(Error::Closed);
        }
        self.queue(OpCode::Binary, prefix, payload);
        Ok(())
    }

    /// Queues a binary message and writes everything queued.
    pub async fn send_binary(&mut self, prefix: &[u8], payload: Bytes) -> Result<(), Error> {
        self.queue_binary(prefix, payload)?;
        self.flush().await
    }

    /// Sends a close frame (after anything queued); no message may follow it.
    pub async fn close(&mut self, frame: Option<CloseFrame>) -> Result<(), Error> {
        if self.close_sent {
            return Err(Error::Closed);
        }
        let body = frame.map(|f| f.encode()).unwrap_or_default();
        self.queue(OpCode::Close, &[], Bytes::from(body));
        self.close_sent = true;
        self.flush().await
    }

    /// Resolves when a control frame is due: a pong for the client's ping, or a keepalive
    /// ping. A loop that waits on something else selects on this and then calls
    /// [`flush`](Self::flush), which sends it.
    pub async fn control_due(&mut self) {
        if self.close_sent {
            // After our close frame nothing more is sent.
            return std::future::pending().await;
        }
        loop {
            tokio::select! {
                changed = self.pings.changed(), if !self.reader_gone => match changed {
                    Ok(()) => {
                        self.pong_due = self.pings.borrow_and_update().clone();
                        return;
                    }
                    Err(_) => self.reader_gone = true,
                },
                () = next_ping(&mut self.ping_timer) => {
                    self.ping_due = true;
                    return;
                }
            }
        }
    }

    /// Waits for `fut`, answering pings and sending keepalive pings meanwhile (clients such as
    /// kubectl close a connection whose pings go unanswered).
    pub async fn answer_pings_until<F: std::future::Future>(&mut self, fut: F) -> F::Output {
        tokio::pin!(fut);
        loop {
            tokio::select! {
                out = &mut fut => return out,
                // A failed write means the client is gone; its reader will say so.
                () = self.control_due() => { let _ = self.flush().await; }
            }
        }
    }

    /// Writes everything queued, with a pong for the latest unanswered ping and a due keepalive
    /// ping behind it. If the future is dropped part way, the rest goes out with the next flush:
    /// frames are never cut.
    pub async fn flush(&mut self) -> Result<(), Error> {
        if self.pings.has_changed().unwrap_or(false) {
            self.pong_due = self.pings.borrow_and_update().clone();
        }
        if let Some(payload) = self.pong_due.take().filter(|_| !self.close_sent) {
            self.queue(OpCode::Pong, &[], payload);
        }
        if std::mem::take(&mut self.ping_due) && !self.close_sent {
            self.queue(OpCode::Ping, &[], Bytes::new());
        }
        if !self.small.is_empty() {
            let small = self.small.split().freeze();
            self.segments.push_back(small);
        }
        while !self.segments.is_empty() {
            // Most writes are a head and a payload: a small slice array is cheaper to set up.
            let written = if self.segments.len() <= FEW_SLICES {
                self.write_some::<FEW_SLICES>().await?
            } else {
                self.write_some::<MAX_SLICES>().await?
            };
            if written == 0 {
                return Err(Error::Io(std::io::ErrorKind::WriteZero.into()));
            }
            self.consume(written);
        }
        if self.small.capacity() > SHRINK_ABOVE {
            self.small = BytesMut::new();
        }
        self.io.flush().await?;
        Ok(())
    }

    /// One vectored write of the first (up to) `N` segments.
    async fn write_some<const N: usize>(&mut self) -> std::io::Result<usize> {
        let mut slices = [IoSlice::new(&[]); N];
        let mut count = 0;
        for (slot, seg) in slices.iter_mut().zip(&self.segments) {
            *slot = IoSlice::new(seg);
            count += 1;
        }
        self.io.write_vectored(&slices[..count]).await
    }

    /// Bytes queued and not yet written.
    pub fn queued(&self) -> usize {
        self.small.len() + self.segments.iter().map(Bytes::len).sum::<usize>()
    }

    fn queue(&mut self, opcode: OpCode, prefix: &[u8], payload: Bytes) {
        let mut head = [0u8; MAX_HEAD_LEN];
        let n = FrameHead::encode_server(opcode, prefix.len() + payload.len(), &mut head);
        let copy = payload.len() < COPY_LIMIT;
        let needed = n + prefix.len() + if copy { payload.len() } else { 0 };
        if self.small.capacity() - self.small.len() < needed {
            self.small.reserve(needed.max(SMALL_CHUNK));
        }
        self.small.extend_from_slice(&head[..n]);
        self.small.extend_from_slice(prefix);
        if copy {
            self.small.extend_from_slice(&payload);
        } else {
            let small = self.small.split().freeze();
            self.segments.push_back(small);
            self.segments.push_back(payload);
        }
    }

    /// Drops `n` written bytes off the front of the queue.
    fn consume(&mut self, mut n: usize) {
        while n > 0 {
            let front = self
                .segments
                .front_mut()
                .expect("wrote more than was queued");
            if n < front.len() {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.segments.pop_front();
        }
    }
}

/// Resolves when the next keepalive ping is due (never without keepalive), and re-arms the timer
/// an interval from now: a writer that was stuck sends one ping, not a burst of missed ones.
async fn next_ping(timer: &mut Option<(Pin<Box<Sleep>>, Duration)>) {
    match timer {
        Some((sleep, every)) => {
            sleep.as_mut().await;
            let next = Instant::now() + *every;
            sleep.as_mut().reset(next);
        }
        None => std::future::pending().await,
    }
}
