//! The reader task: decodes frames from the socket and dispatches them. It is the only place
//! that blocks on a full stream inbox, which is how a slow stream reader slows the peer.
//!
//! It also decides whether the peer is still there (`Config::ping_timeout`): the writer pings
//! every interval, so a live peer is heard from at least that often. Time spent parked on a
//! full inbox does not count as the peer's silence: the peer's answers wait behind the data
//! we have not read.
//!
//! Parked on a full inbox, it leaves what the peer sent in the kernel, where the peer's FIN or
//! reset waits behind it. With a [`PeerHangup`] it looks at the socket meanwhile, and a hang-up
//! seen there tells the streams at once ([`super::RecvStream::cut`]): what they still have to
//! deliver can no longer grow, and a recorded session drains it without waiting its turn.
//!
//! With a memory budget (`Config::memory`), what it reads is held from a lane of its own until
//! it is passed on: room for each read is taken before the read (a shorter read, or a wait,
//! when there is none; the wait is not the peer's silence either), a frame larger than the
//! lane's floor is taken whole once its head is read, or the session ends
//! ([`SessionEnd::Memory`], GOAWAY), and each DATA payload carries its share to its stream's
//! reader and beyond, given back when its last piece drops.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};

use super::error::SessionEnd;
use super::inbox::{inbox, InboxSender};
use super::life::Life;
use super::shared::{Control, RecvEnd, Shared, StreamEntry, StreamFlags};
use super::stream::IncomingStream;
use crate::peer_hangup::PeerHangup;
use crate::read_sizer::ReadSizer;
use crate::session_memory::{charged, Held, ReadRoom};
use crate::spdy::codec::{FrameDecoder, COPY_UP_TO};
use crate::spdy::frame::{Data, Frame, GoAway, Ping, RstStatus, RstStream, SynReply, SynStream};

/// Room kept beyond a busy read, so the frame the read ends inside can be completed in the same
/// buffer (Kubernetes peers send DATA frames of at most 32 KiB) instead of being copied out.
const FRAME_SLACK: usize = 32 * 1024 + crate::spdy::frame::HEAD_LEN;

pub(crate) struct Reader<R> {
    io: R,
    buf: BytesMut,
    decoder: FrameDecoder,
    shared: Arc<Shared>,
    incoming: Option<mpsc::Sender<IncomingStream>>,
    /// The session's life, for the streams the peer opens; weak, so that the reader never
    /// keeps the session it serves.
    life: Weak<Life>,
    /// How much the next read asks for.
    sizer: ReadSizer,
    /// When the peer was last heard from (or the reader was last unparked).
    last_heard: Instant,
    /// The socket under `io`, looked at while the reader is parked.
    hangup: Option<PeerHangup>,
    /// The session memory held for `buf`'s bytes and the room of the next read; `None`: not
    /// counted.
    charge: Option<Held>,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    pub(crate) fn new(
        io: R,
        leftover: bytes::Bytes,
        shared: Arc<Shared>,
        incoming: Option<mpsc::Sender<IncomingStream>>,
        life: Weak<Life>,
        hangup: Option<PeerHangup>,
    ) -> Self {
        let decoder = FrameDecoder::with_limits(
            shared.config.max_control_frame,
            shared.config.max_header_block,
        );
        let charge = shared.config.memory.as_ref().map(|b| b.lane().none());
        Reader {
            io,
            buf: BytesMut::from(&leftover[..]),
            decoder,
            shared,
            incoming,
            life,
            sizer: ReadSizer::new(FRAME_SLACK),
            last_heard: Instant::now(),
            hangup,
            charge,
        }
    }

    pub(crate) async fn run(mut self) {
        let end = self.read_loop().await;
        self.shared.end(end);
    }

    async fn read_loop(&mut self) -> SessionEnd {
        let config = &self.shared.config;
        let allowed = config
            .ping_interval
            .zip(config.ping_timeout)
            .map(|(i, t)| i + t);
        // One timer for the session's life, moved forward only when it fires: no timer work
        // per read.
        let mut silence: Option<Pin<Box<Sleep>>> =
            allowed.map(|a| Box::pin(tokio::time::sleep_until(self.last_heard + a)));
        loop {
            let mut releasing = !self.decoder.header_context_released();
            if releasing && self.shared.release_decoder.load(Ordering::Acquire) {
                self.decoder.release_header_context();
                releasing = false;
            }
            match self.decoder.decode(&mut self.buf) {
                Ok(Some(frame)) => {
                    if let Err(end) = self.dispatch(frame).await {
                        return end;
                    }
                    continue;
                }
                Ok(None) => {}
                Err(e) => {
                    // A frame we cannot parse ends this session only (PROTOCOL.md §3.2).
                    self.go_away(crate::spdy::frame::GoAwayStatus::ProtocolError);
                    return SessionEnd::Protocol(e.to_string());
                }
            }
            let missing = FrameDecoder::bytes_missing(&self.buf);
            let want = self.sizer.prepare(&mut self.buf, missing);
            let want = match self.room_for(want, missing).await {
                Ok(want) => want,
                Err(refused) => {
                    self.go_away(crate::spdy::frame::GoAwayStatus::InternalError);
                    return SessionEnd::Memory(refused);
                }
            };
            let mut limited = (&mut self.buf).limit(want);
            let read = tokio::select! {
                biased;
                read = self.io.read_buf(&mut limited) => read,
                // Back to the top of the loop, which releases the context.
                _ = self.shared.release_wake.notified(), if releasing => continue,
                () = silent(&mut silence) => {
                    let allowed = allowed.expect("a timer only with a limit");
                    let deadline = self.last_heard + allowed;
                    if Instant::now() >= deadline {
                        return SessionEnd::PingTimeout(allowed);
                    }
                    if let Some(timer) = silence.as_mut() {
                        timer.as_mut().reset(deadline);
                    }
                    continue;
                }
            };
            match read {
                Ok(0) => {
                    return match self.shared.lock().goaway {
                        Some(status) => SessionEnd::GoAway(status),
                        None => SessionEnd::Eof,
                    }
                }
                Ok(n) => {
                    self.sizer.observe(n, want, missing);
                    self.last_heard = Instant::now();
                }
                Err(e) => return SessionEnd::Io(e.to_string()),
            }
        }
    }

    /// Tells the peer the session is over, with `status`.
    fn go_away(&self, status: crate::spdy::frame::GoAwayStatus) {
        let _ = self
            .shared
            .control_tx
            .try_send(Control::Frame(Frame::GoAway(GoAway {
                last_good_stream_id: self.shared.lock().last_peer_stream,
                status,
            })));
    }

    /// Takes what the next read needs from the session's memory and says how much it may
    /// read: a frame larger than the lane's floor whole (its head was read and checked), or
    /// refused; otherwise room for the read, as much as there is, waiting while there is none
    /// (not the peer's silence).
    async fn room_for(
        &mut self,
        want: usize,
        missing: Option<usize>,
    ) -> Result<usize, crate::session_memory::Refused> {
        let Some(charge) = self.charge.as_mut() else {
            return Ok(want);
        };
        let buffered = self.buf.len();
        let room = match charge.plan_read(buffered, want, missing) {
            ReadRoom::Now(n) => return Ok(n),
            ReadRoom::WholeFrame(frame) => {
                watching(&self.shared, self.hangup, charge.grow_to(frame)).await?;
                want
            }
            ReadRoom::Wait(more) => {
                let lane = charge.lane().clone();
                charge.absorb(watching(&self.shared, self.hangup, lane.take_room(more)).await);
                charge.len() - buffered
            }
        };
        self.last_heard = Instant::now();
        Ok(room)
    }

    async fn dispatch(&mut self, frame: Frame) -> Result<(), SessionEnd> {
        match frame {
            Frame::Data(data) => self.on_data(data).await,
            Frame::SynStream(syn) => self.on_syn_stream(syn),
            Frame::SynReply(reply) => self.on_syn_reply(reply),
            Frame::RstStream(rst) => self.on_rst(rst),
            Frame::Ping(ping) => self.on_ping(ping).await,
            Frame::GoAway(goaway) => {
                // Streams above last-good were never processed: they end as reset. The peer is
                // about to close; keep reading until it does so nothing it sent is lost.
                let mut st = self.shared.lock();
                st.goaway = Some(goaway.status);
                let last = goaway.last_good_stream_id;
                let role = self.shared.role;
                st.streams.retain(|id, entry| {
                    if role.owns_id(id.get()) && *id > last {
                        entry.flags.set_recv_end(RecvEnd::Reset);
                        entry.flags.close_send();
                        if let Some(reply) = entry.reply.take() {
                            let _ = reply.send(Err(super::Error::GoingAway(goaway.status)));
                        }
                        false
                    } else {
                        true
                    }
                });
                Ok(())
            }
            // Accepted and ignored: Kubernetes peers have no flow control and no use for these.
            Frame::Settings(_) | Frame::WindowUpdate(_) | Frame::Headers(_) => Ok(()),
        }
    }

    async fn on_data(&mut self, data: Data) -> Result<(), SessionEnd> {
        let target = {
            let mut st = self.shared.lock();
            match st.streams.get_mut(&data.stream_id) {
                Some(entry) => {
                    let inbox = if data.fin {
                        entry.flags.set_recv_end(RecvEnd::Fin);
                        entry.inbox.take()
                    } else {
                        entry.inbox.clone()
                    };
                    if data.fin && entry.is_done() {
                        st.streams.remove(&data.stream_id);
                    }
                    inbox
                }
                // DATA for an unknown or finished stream is ignored, as spdystream does.
                None => None,
            }
        };
        // The payload's share of the read's memory goes with it (a copied small one's stays
        // with the reader until its next read).
        let len = data.payload.len();
        let payload = match self.charge.as_mut() {
            Some(charge) if len > COPY_UP_TO => charged(data.payload, charge.split_off(len)),
            _ => data.payload,
        };
        if let Some(inbox) = target {
            if !payload.is_empty() {
                if let Err(payload) = inbox.try_deliver(payload) {
                    // Parked until the stream's reader makes room: not the peer's silence.
                    park(&self.shared, self.hangup, &inbox, payload).await;
                    self.last_heard = Instant::now();
                }
            }
        }
        Ok(())
    }

    fn on_syn_stream(&mut self, syn: SynStream) -> Result<(), SessionEnd> {
        let id = syn.stream_id;
        let refuse = |status| {
            let _ = self
                .shared
                .control_tx
                .try_send(Control::Frame(Frame::RstStream(RstStream {
                    stream_id: id,
                    status,
                })));
        };
        let Some(incoming_tx) = self.incoming.as_ref() else {
            refuse(RstStatus::RefusedStream);
            return Ok(());
        };
        // Every handle dropped: the session is ending, nobody would take the stream.
        let Some(life) = self.life.upgrade() else {
            refuse(RstStatus::RefusedStream);
            return Ok(());
        };
        let flags = Arc::new(StreamFlags::default());
        let (tx, rx) = inbox(self.shared.config.stream_inbox_bytes);
        {
            let mut st = self.shared.lock();
            if self.shared.role.owns_id(id.get()) || id <= st.last_peer_stream {
                drop(st);
                refuse(RstStatus::ProtocolError);
                return Ok(());
            }
            if st.goaway.is_some() || st.ended.is_some() {
                drop(st);
                refuse(RstStatus::RefusedStream);
                return Ok(());
            }
            st.last_peer_stream = id;
            let mut entry = StreamEntry::new(Arc::new(tx), flags.clone());
            if syn.fin {
                entry.inbox = None;
                flags.set_recv_end(RecvEnd::Fin);
            }
            st.streams.insert(id, entry);
        }
        let stream = IncomingStream::new(self.shared.clone(), life, id, syn.headers, flags, rx);
        if incoming_tx.try_send(stream).is_err() {
            // Nobody accepts streams fast enough: refuse rather than queue without bound.
            self.shared.lock().streams.remove(&id);
            refuse(RstStatus::RefusedStream);
        }
        Ok(())
    }

    fn on_syn_reply(&mut self, reply: SynReply) -> Result<(), SessionEnd> {
        let mut st = self.shared.lock();
        if let Some(entry) = st.streams.get_mut(&reply.stream_id) {
            if let Some(waiter) = entry.reply.take() {
                if reply.fin {
                    entry.flags.set_recv_end(RecvEnd::Fin);
                    entry.inbox = None;
                }
                let _ = waiter.send(Ok(reply.headers));
            }
        }
        Ok(())
    }

    fn on_rst(&mut self, rst: RstStream) -> Result<(), SessionEnd> {
        let mut st = self.shared.lock();
        if let Some(mut entry) = st.streams.remove(&rst.stream_id) {
            entry.flags.set_recv_end(RecvEnd::Reset);
            entry.flags.close_send();
            if let Some(waiter) = entry.reply.take() {
                let _ = waiter.send(Err(super::Error::StreamReset(rst.status)));
            }
            // Dropping the inbox sender ends the reader after the data queued before the RST.
        }
        Ok(())
    }

    async fn on_ping(&mut self, ping: Ping) -> Result<(), SessionEnd> {
        if self.shared.role.owns_id(ping.id.0) {
            // The answer to one of our pings.
            if let Some(waiter) = self.shared.lock().pings.remove(&ping.id.0) {
                let _ = waiter.send(());
            }
            return Ok(());
        }
        // Echo at once through the priority lane; it never waits behind queued data.
        if self
            .shared
            .control_tx
            .send(Control::Frame(Frame::Ping(ping)))
            .await
            .is_err()
        {
            return Err(SessionEnd::Local);
        }
        Ok(())
    }
}

/// Waits for room in `inbox` for `payload`, watching the socket meanwhile ([`watching`]).
async fn park(
    shared: &Shared,
    hangup: Option<PeerHangup>,
    inbox: &InboxSender,
    payload: bytes::Bytes,
) {
    let _ = watching(shared, hangup, inbox.deliver(payload)).await;
}

/// Waits for `fut` (room in an inbox, room in the session's memory lane), watching the socket
/// meanwhile for the peer's hang-up (once seen, it is not looked for again): while the reader
/// waits, the peer's FIN or reset waits in the kernel behind what it sent. A reset means the
/// streams not finished by then were cut off ([`super::RecvStream::cut`]), so a recorded
/// session drains what they hold through the cut lane instead of at its turn; a FIN is how a
/// session that ended well ends too, so its streams drain at their turn, and one that ends
/// unfinished is cut once the reader reaches the connection's end.
async fn watching<F: std::future::Future>(
    shared: &Shared,
    hangup: Option<PeerHangup>,
    fut: F,
) -> F::Output {
    let Some(hangup) = hangup.filter(|_| !shared.peer_hung_up()) else {
        return fut.await;
    };
    tokio::pin!(fut);
    tokio::select! {
        biased;
        out = &mut fut => return out,
        how = hangup.hung_up() => shared.note_hangup(how),
    }
    fut.await
}

/// Resolves when the silence timer fires (never without one).
async fn silent(timer: &mut Option<Pin<Box<Sleep>>>) {
    match timer {
        Some(t) => t.as_mut().await,
        None => std::future::pending().await,
    }
}
