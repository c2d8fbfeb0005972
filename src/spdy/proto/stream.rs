//! Stream handles: a stream splits into a [`SendStream`] and a [`RecvStream`] that can live in
//! different tasks.

use std::sync::Arc;

use bytes::Bytes;

use super::error::{Error, SessionEnd};
use super::inbox::InboxReceiver;
use super::life::Life;
use super::shared::{Control, DataCmd, RecvEnd, Shared, StreamFlags};
use crate::peer_hangup::Hangup;
use crate::spdy::frame::{
    Frame, HeaderBlock, RstStatus, RstStream, StreamId, SynReply, MAX_FRAME_LEN,
};

/// An open SPDY stream. Each of its halves keeps the session alive ([`Life`]).
#[derive(Debug)]
pub struct Stream {
    headers: HeaderBlock,
    send: SendStream,
    recv: RecvStream,
}

impl Stream {
    pub(crate) fn new(
        shared: Arc<Shared>,
        life: Arc<Life>,
        id: StreamId,
        headers: HeaderBlock,
        flags: Arc<StreamFlags>,
        inbox: InboxReceiver,
    ) -> Self {
        Stream {
            headers,
            send: SendStream {
                shared: shared.clone(),
                _life: life.clone(),
                id,
                flags: flags.clone(),
            },
            recv: RecvStream {
                shared,
                _life: life,
                id,
                flags,
                inbox,
                reported: false,
            },
        }
    }

    /// The stream id.
    pub fn id(&self) -> StreamId {
        self.send.id
    }

    /// The headers of the peer's SYN_REPLY (for streams we opened) or SYN_STREAM (for streams
    /// the peer opened).
    pub fn headers(&self) -> &HeaderBlock {
        &self.headers
    }

    /// Splits the stream into its two directions.
    pub fn split(self) -> (SendStream, RecvStream) {
        (self.send, self.recv)
    }
}

/// The sending half of a stream.
#[derive(Debug)]
pub struct SendStream {
    shared: Arc<Shared>,
    /// Keeps the session up while this half exists.
    _life: Arc<Life>,
    id: StreamId,
    flags: Arc<StreamFlags>,
}

impl SendStream {
    /// The stream id.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// Sends `data` as DATA frames, waiting while the session's outgoing queue is full.
    pub async fn send(&mut self, mut data: Bytes) -> Result<(), Error> {
        while !data.is_empty() {
            let chunk = data.split_to(data.len().min(MAX_FRAME_LEN));
            self.queue(chunk, false).await?;
        }
        Ok(())
    }

    /// Half-closes our direction: an empty DATA frame with FIN. Idempotent.
    pub async fn finish(&mut self) -> Result<(), Error> {
        if self.flags.send_closed() {
            return Ok(());
        }
        self.queue(Bytes::new(), true).await?;
        self.flags.close_send();
        let mut st = self.shared.lock();
        if let Some(entry) = st.streams.get_mut(&self.id) {
            entry.local_done = true;
            if entry.is_done() {
                st.streams.remove(&self.id);
            }
        }
        Ok(())
    }

    /// Resets the stream (RST_STREAM CANCEL): both directions end.
    pub async fn reset(&mut self) {
        let was_closed = self.flags.send_closed();
        self.flags.close_send();
        self.flags.set_recv_end(RecvEnd::Reset);
        let known = self.shared.lock().streams.remove(&self.id).is_some();
        if known || !was_closed {
            let _ = self
                .shared
                .control_tx
                .send(Control::Frame(Frame::RstStream(RstStream {
                    stream_id: self.id,
                    status: RstStatus::Cancel,
                })))
                .await;
        }
    }

    async fn queue(&self, payload: Bytes, fin: bool) -> Result<(), Error> {
        if self.flags.send_closed() {
            return Err(match self.shared.ended() {
                Some(end) => Error::SessionClosed(end),
                None => Error::StreamClosed,
            });
        }
        let cmd = DataCmd {
            id: self.id,
            fin,
            payload,
        };
        self.shared
            .data_tx
            .send(cmd)
            .await
            .map_err(|_| Error::SessionClosed(self.shared.ended().unwrap_or(SessionEnd::Local)))
    }
}

/// The receiving half of a stream.
#[derive(Debug)]
pub struct RecvStream {
    shared: Arc<Shared>,
    /// Keeps the session up while this half exists.
    _life: Arc<Life>,
    id: StreamId,
    flags: Arc<StreamFlags>,
    inbox: InboxReceiver,
    reported: bool,
}

impl RecvStream {
    /// The stream id.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// The next chunk of data. `None` means the peer finished (FIN) or reset the stream, after
    /// all data received before that was delivered. If the connection died instead, one
    /// `Some(Err(..))` is returned before `None`.
    pub async fn recv(&mut self) -> Option<Result<Bytes, Error>> {
        if let Some(data) = self.inbox.recv().await {
            return Some(Ok(data));
        }
        if self.flags.recv_end() == RecvEnd::Lost && !self.reported {
            self.reported = true;
            let end = self.shared.ended().unwrap_or(SessionEnd::Eof);
            return Some(Err(Error::SessionClosed(end)));
        }
        None
    }

    /// Data already received, without waiting; `None` when nothing is queued now (how the
    /// stream ended is told by `recv` only). Its room in the stream's inbox stays taken until
    /// [`RecvStream::release_held`] or the next `recv`, so that holding it a while does not let
    /// the peer send more in its place.
    pub fn try_recv_held(&mut self) -> Option<Bytes> {
        self.inbox.try_recv_held()
    }

    /// Gives back the inbox room of what `try_recv_held` took.
    pub fn release_held(&mut self) {
        self.inbox.release_held();
    }

    /// Whether the stream was cut off: the peer reset it, or the connection ended, before it
    /// finished. What is queued then is all there will be.
    pub fn is_cut(&self) -> bool {
        matches!(self.flags.recv_end(), RecvEnd::Reset | RecvEnd::Lost)
    }

    /// Resolves once this stream is known to be cut off, so what it has left to deliver can
    /// no longer grow and will not end well: the connection ended with the stream unfinished
    /// ([`RecvStream::is_cut`]), or its peer was seen to reset the connection while the
    /// session's reader was behind and before the stream's own end was read (what the peer
    /// sent before the reset is still delivered). Never if the stream finished first, nor on
    /// the peer's plain close (FIN) alone: that is how a session that ended well ends too, and
    /// whether the stream was finished shows only once the reader reaches the connection's
    /// end. A reset of this stream alone, with the connection alive, is seen by `is_cut` only.
    pub async fn cut(&self) {
        let mut end = self.shared.subscribe_end();
        let mut hangup = self.shared.subscribe_hangup();
        loop {
            if *hangup.borrow_and_update() == Some(Hangup::Reset)
                && self.flags.recv_end() != RecvEnd::Fin
            {
                return;
            }
            // The session marks its streams before it announces its end.
            if end.borrow_and_update().is_some() {
                if self.is_cut() {
                    return;
                }
                return std::future::pending().await;
            }
            let changed = tokio::select! {
                changed = end.changed() => changed,
                changed = hangup.changed() => changed,
            };
            if changed.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Whether data is queued right now, so `recv` would return without waiting.
    pub fn has_queued(&self) -> bool {
        self.inbox.has_queued()
    }

    /// Whether the peer reset the stream rather than finishing it (meaningful after `recv`
    /// returned `None`).
    pub fn was_reset(&self) -> bool {
        self.flags.recv_end() == RecvEnd::Reset
    }
}

/// A stream the peer opened, waiting to be accepted or refused.
#[derive(Debug)]
pub struct IncomingStream {
    stream: Stream,
}

impl IncomingStream {
    pub(crate) fn new(
        shared: Arc<Shared>,
        life: Arc<Life>,
        id: StreamId,
        headers: HeaderBlock,
        flags: Arc<StreamFlags>,
        inbox: InboxReceiver,
    ) -> Self {
        IncomingStream {
            stream: Stream::new(shared, life, id, headers, flags, inbox),
        }
    }

    /// The stream id.
    pub fn id(&self) -> StreamId {
        self.stream.id()
    }

    /// The headers of the peer's SYN_STREAM.
    pub fn headers(&self) -> &HeaderBlock {
        self.stream.headers()
    }

    /// Accepts the stream with an empty SYN_REPLY (what Kubernetes servers send).
    pub async fn accept(self) -> Result<Stream, Error> {
        let shared = self.stream.send.shared.clone();
        shared
            .control_tx
            .send(Control::Frame(Frame::SynReply(SynReply {
                stream_id: self.stream.id(),
                fin: false,
                headers: HeaderBlock::new(),
            })))
            .await
            .map_err(|_| Error::SessionClosed(shared.ended().unwrap_or(SessionEnd::Local)))?;
        Ok(self.stream)
    }

    /// Refuses the stream with RST_STREAM CANCEL, as Kubernetes servers do.
    pub async fn reject(self) {
        let (mut send, _recv) = self.stream.split();
        send.reset().await;
    }
}
