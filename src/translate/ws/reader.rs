//! The reading half: frames off the client's socket into whole messages. Payloads are unmasked
//! in the read buffer and handed on without a copy; pings are passed to the writer to answer.
//!
//! What the reader reads is held from its session's memory lane (`session_memory`) until it
//! is passed on: room for each read is taken before the read (as much as there is; the read
//! waits while there is none), a frame larger than the lane's floor is taken whole before its
//! payload is read (refused: the message is too big for the session or the proxy now, Close
//! 1009), and each message carries its share with it, given back when it is dropped.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::watch;

use super::close::CloseFrame;
use super::frame::{FrameHead, OpCode, MAX_HEAD_LEN};
use super::keepalive::Liveness;
use super::mask::apply_mask;
use super::Error;
use crate::read_sizer::ReadSizer;
use crate::session_memory::{charged, Held, MemoryLane, ReadRoom};

/// Room kept beyond a busy read, so the message the read ends inside is completed in the same
/// buffer (kubectl sends at most 32 KiB and a channel byte per message) instead of being moved.
const FRAME_SLACK: usize = 32 * 1024 + 1 + MAX_HEAD_LEN;
/// Payloads up to this size are copied out (one small allocation), so the read buffer stays
/// unshared and is reused by the next read; larger ones are split off it without a copy.
const COPY_UP_TO: usize = 256;

/// A whole message from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// A binary message.
    Binary(Bytes),
    /// A text message (checked to be UTF-8), as its bytes.
    Text(Bytes),
    /// The client's close frame; nothing follows it.
    Close(Option<CloseFrame>),
}

/// A fragmented message being put together.
struct Fragmented {
    text: bool,
    data: BytesMut,
    /// The memory its fragments held in the read buffer, now theirs.
    held: Option<Held>,
}

/// Reads messages from a client.
pub struct WsReader<R> {
    io: R,
    buf: BytesMut,
    /// How much the next read asks for.
    sizer: ReadSizer,
    max_message: usize,
    fragmented: Option<Fragmented>,
    /// The latest ping's payload, for the writer to answer.
    pings: watch::Sender<Option<Bytes>>,
    /// Notes every read from the client.
    liveness: Liveness,
    /// A close frame, an error or the end of the stream was returned: nothing more to read.
    done: bool,
    /// The session memory held for `buf`'s bytes and the room of the next read; `None`: not
    /// counted.
    charge: Option<Held>,
}

impl<R: AsyncRead + Unpin> WsReader<R> {
    pub(super) fn new(
        io: R,
        max_message: usize,
        pings: watch::Sender<Option<Bytes>>,
        liveness: Liveness,
        memory: Option<MemoryLane>,
    ) -> Self {
        WsReader {
            io,
            buf: BytesMut::new(),
            sizer: ReadSizer::new(FRAME_SLACK),
            max_message,
            fragmented: None,
            pings,
            liveness,
            done: false,
            charge: memory.map(|lane| lane.none()),
        }
    }

    /// Whether the client is still there: it is heard from whenever this reader reads.
    pub fn liveness(&self) -> Liveness {
        self.liveness.clone()
    }

    /// The next message. `None` once the stream ended (with or without a close frame), after
    /// a close frame or after an error.
    pub async fn next(&mut self) -> Option<Result<Incoming, Error>> {
        if self.done {
            return None;
        }
        // Also when this future is dropped half way: nobody listens any more.
        let _listening = self.liveness.listen();
        self.read_message().await
    }

    /// Reads (and discards) until the peer's Close or the end of the connection: what a
    /// closing side does so that a late frame never meets a TCP reset.
    pub async fn drain(&mut self) {
        while let Some(Ok(_)) = self.next().await {}
    }

    async fn read_message(&mut self) -> Option<Result<Incoming, Error>> {
        loop {
            match self.decode() {
                Ok(Some(msg)) => {
                    self.done = matches!(msg, Incoming::Close(_));
                    return Some(Ok(msg));
                }
                Ok(None) => {}
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
            match self.fill().await {
                Ok(true) => {}
                Ok(false) => {
                    self.done = true;
                    return None;
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }

    /// Whether the start of a further data frame is already here: [`next`](Self::next) will
    /// return more data without waiting for the client to send anything new (at most for the
    /// rest of a frame the client is in the middle of sending).
    pub fn data_frame_pending(&self) -> bool {
        // The opcode is in the first byte: continuation, text or binary.
        self.buf.first().is_some_and(|b| b & 0x0F <= 0x2)
    }

    /// Whether the start of a further data frame of at most `limit` payload bytes is already
    /// here (a frame whose length is not here yet counts): the rest of it is on its way, and
    /// short enough to be worth waiting for.
    pub fn data_frame_arriving(&self, limit: u64) -> bool {
        if !self.data_frame_pending() {
            return false;
        }
        match FrameHead::parse(&self.buf) {
            Ok(Some(head)) => head.len <= limit,
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// Takes frames off the buffer until one completes a message, or more bytes are needed.
    fn decode(&mut self) -> Result<Option<Incoming>, Error> {
        loop {
            let Some(head) = FrameHead::parse(&self.buf)? else {
                return Ok(None);
            };
            let Some(key) = head.mask else {
                return Err(Error::Protocol("unmasked frame from a client"));
            };
            self.check_size(&head)?;
            let len = head.len as usize;
            if self.buf.len() < head.head_len + len {
                return Ok(None);
            }
            self.buf.advance(head.head_len);
            let payload = if len <= COPY_UP_TO {
                apply_mask(&mut self.buf[..len], key);
                let copy = Bytes::copy_from_slice(&self.buf[..len]);
                self.buf.advance(len);
                copy
            } else {
                let mut payload = self.buf.split_to(len);
                apply_mask(&mut payload, key);
                payload.freeze()
            };
            match head.opcode {
                OpCode::Ping => {
                    // Only the latest ping needs an answer (RFC 6455 §5.5.3).
                    self.pings.send_replace(Some(payload));
                }
                OpCode::Pong => {}
                OpCode::Close => return Ok(Some(Incoming::Close(CloseFrame::decode(&payload)?))),
                OpCode::Text | OpCode::Binary => {
                    if self.fragmented.is_some() {
                        return Err(Error::Protocol("a new message inside a fragmented one"));
                    }
                    let text = head.opcode == OpCode::Text;
                    if head.fin {
                        // A copied payload's bytes left the buffer: the reader's charge is
                        // trimmed before its next read.
                        let payload = match self.take_charge(len).filter(|_| len > COPY_UP_TO) {
                            Some(held) => charged(payload, held),
                            None => payload,
                        };
                        return complete(text, payload).map(Some);
                    }
                    self.fragmented = Some(Fragmented {
                        text,
                        data: BytesMut::from(&payload[..]),
                        held: self.take_charge(len),
                    });
                }
                OpCode::Continuation => {
                    let held = self.take_charge(len);
                    let Some(f) = self.fragmented.as_mut() else {
                        return Err(Error::Protocol("a continuation frame outside a message"));
                    };
                    // Rare (kubectl and the Python client send whole messages): copied together.
                    f.data.extend_from_slice(&payload);
                    if let (Some(all), Some(held)) = (f.held.as_mut(), held) {
                        all.absorb(held);
                    }
                    if head.fin {
                        let f = self.fragmented.take().expect("checked above");
                        let data = match f.held {
                            Some(held) => charged(f.data.freeze(), held),
                            None => f.data.freeze(),
                        };
                        return complete(f.text, data).map(Some);
                    }
                }
            }
        }
    }

    /// Refuses a frame, from its head, that would make a message larger than the limit, before
    /// any of its payload is held.
    fn check_size(&self, head: &FrameHead) -> Result<(), Error> {
        let earlier = match (head.opcode, &self.fragmented) {
            (OpCode::Continuation, Some(f)) => f.data.len() as u64,
            _ => 0,
        };
        let size = earlier + head.len;
        if size > self.max_message as u64 {
            return Err(Error::TooLarge {
                size,
                max: self.max_message,
            });
        }
        Ok(())
    }

    /// The memory of `len` payload bytes that just left the read buffer, for the message they
    /// are now part of.
    fn take_charge(&mut self, len: usize) -> Option<Held> {
        self.charge.as_mut().map(|charge| charge.split_off(len))
    }

    /// Reads more bytes; `false` at the end of the stream. A frame whose head is in the
    /// buffer is completed by a read that stops on its boundary, so its payload stays in the
    /// buffer it started in; otherwise a busy read leaves room to do that for its last frame.
    async fn fill(&mut self) -> Result<bool, Error> {
        let missing = match FrameHead::parse(&self.buf) {
            Ok(Some(head)) => (head.head_len as u64 + head.len)
                .checked_sub(self.buf.len() as u64)
                .filter(|&m| m > 0)
                .map(|m| m as usize),
            _ => None,
        };
        let want = self.sizer.prepare(&mut self.buf, missing);
        let want = self.room_for(want, missing).await?;
        let n = self.io.read_buf(&mut (&mut self.buf).limit(want)).await?;
        self.sizer.observe(n, want, missing);
        if n > 0 {
            self.liveness.heard();
        }
        Ok(n > 0)
    }

    /// Takes what the next read needs from the session's memory, and says how much it may
    /// read: a frame larger than the lane's floor is taken whole (all of it read before it
    /// goes on, so all of it held), or refused; otherwise room for the read, as much as there
    /// is (a shorter read), waiting while there is none. Waiting is not the client's silence.
    async fn room_for(&mut self, want: usize, missing: Option<usize>) -> Result<usize, Error> {
        let Some(charge) = self.charge.as_mut() else {
            return Ok(want);
        };
        let buffered = self.buf.len();
        match charge.plan_read(buffered, want, missing) {
            ReadRoom::Now(n) => Ok(n),
            ReadRoom::WholeFrame(frame) => {
                let _held = self.liveness.hold();
                charge.grow_to(frame).await?;
                Ok(want)
            }
            ReadRoom::Wait(more) => {
                let _held = self.liveness.hold();
                let lane = charge.lane().clone();
                charge.absorb(lane.take_room(more).await);
                Ok(charge.len() - buffered)
            }
        }
    }
}

fn complete(text: bool, data: Bytes) -> Result<Incoming, Error> {
    if !text {
        return Ok(Incoming::Binary(data));
    }
    std::str::from_utf8(&data).map_err(|_| Error::InvalidUtf8)?;
    Ok(Incoming::Text(data))
}
