//! The connection handle: opens streams, pings, closes. Cheap to clone; the session ends
//! when its last handle (a clone, or a stream) drops ([`Life`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};

use super::config::{Config, Role};
use super::error::{Error, SessionEnd};
use super::inbox::inbox;
use super::life::{close_command, Life};
use super::reader::Reader;
use super::shared::{Control, Shared, StreamEntry, StreamFlags};
use super::stream::{IncomingStream, Stream};
use super::writer::Writer;
use crate::peer_hangup::PeerHangup;
use crate::spdy::frame::{Frame, HeaderBlock, Ping, PingId, StreamId, SynStream};

/// How long `close` keeps reading after GOAWAY so the peer's last frames are not answered with
/// a TCP reset.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// A SPDY/3.1 session over one upgraded connection. It lives as long as one of its handles
/// does: its clones, and the streams opened or accepted on it. When the last one drops the
/// session is closed and its socket released (its tasks never outlive every handle).
#[derive(Debug, Clone)]
pub struct Connection {
    shared: Arc<Shared>,
    life: Arc<Life>,
}

/// Streams the peer opens (server role). The queue does not keep the session alive: a
/// session whose connection and streams are all dropped ends, and `accept` then says so.
#[derive(Debug)]
pub struct Incoming {
    rx: mpsc::Receiver<IncomingStream>,
}

impl Incoming {
    /// The next stream the peer opened, or `None` once the session has ended.
    pub async fn accept(&mut self) -> Option<IncomingStream> {
        self.rx.recv().await
    }
}

impl Connection {
    /// Starts a client session on an upgraded connection. `leftover` holds bytes that arrived
    /// after the upgrade response. Streams the peer tries to open are refused.
    pub fn client<T>(io: T, leftover: Bytes, config: Config) -> Connection
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        Self::start(io, leftover, config, Role::Client, None, None)
    }

    /// [`Connection::client`] on a connection whose socket `hangup` watches (the TCP socket
    /// under `io`): while the reader is parked on a full stream inbox it looks there for the
    /// peer's FIN or reset, so that its streams learn at once that what they have left to
    /// deliver can no longer grow ([`super::RecvStream::cut`]).
    pub fn client_watching<T>(
        io: T,
        leftover: Bytes,
        config: Config,
        hangup: PeerHangup,
    ) -> Connection
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        Self::start(io, leftover, config, Role::Client, None, Some(hangup))
    }

    /// Starts a server session: the peer opens streams, which arrive on [`Incoming`].
    pub fn server<T>(io: T, leftover: Bytes, config: Config) -> (Connection, Incoming)
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (tx, rx) = mpsc::channel(config.accept_backlog.max(1));
        let conn = Self::start(io, leftover, config, Role::Server, Some(tx), None);
        (conn, Incoming { rx })
    }

    fn start<T>(
        io: T,
        leftover: Bytes,
        config: Config,
        role: Role,
        incoming: Option<mpsc::Sender<IncomingStream>>,
        hangup: Option<PeerHangup>,
    ) -> Connection
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (control_tx, control_rx) = mpsc::channel(32);
        let (data_tx, data_rx) = mpsc::channel(config.data_queue_frames.max(1));
        let shared = Arc::new(Shared::new(config, role, control_tx, data_tx));
        let (read_half, write_half) = tokio::io::split(io);
        let life = Life::new(shared.clone());
        let writer = Writer::new(write_half, shared.clone(), control_rx, data_rx);
        tokio::spawn(writer.run());
        let reader = Reader::new(
            read_half,
            leftover,
            shared.clone(),
            incoming,
            life.weak(),
            hangup,
        );
        life.set_reader(tokio::spawn(reader.run()).abort_handle());
        Connection { shared, life }
    }

    /// Opens a stream with `headers` and waits for the peer's SYN_REPLY (up to
    /// `Config::syn_reply_timeout`).
    pub async fn open_stream(&self, headers: HeaderBlock) -> Result<Stream, Error> {
        let flags = Arc::new(StreamFlags::default());
        let (tx, rx) = inbox(self.shared.config.stream_inbox_bytes);
        let (reply_tx, reply_rx) = oneshot::channel();
        // Peers reject a stream id that is not above every earlier one, so the id is taken and
        // the SYN_STREAM queued under one lock: queue order is id order.
        let permit = match self.shared.control_tx.reserve().await {
            Ok(permit) => permit,
            Err(_) => return Err(self.closed_error()),
        };
        let id = {
            let mut st = self.shared.lock();
            if let Some(end) = &st.ended {
                return Err(Error::SessionClosed(end.clone()));
            }
            if let Some(status) = st.goaway {
                return Err(Error::GoingAway(status));
            }
            let id = st.next_stream_id;
            if id > 0x7FFF_FFFF {
                return Err(Error::StreamIdsExhausted);
            }
            st.next_stream_id += 2;
            let id = StreamId::new(id);
            let mut entry = StreamEntry::new(Arc::new(tx), flags.clone());
            entry.reply = Some(reply_tx);
            st.streams.insert(id, entry);
            permit.send(Control::Frame(Frame::SynStream(SynStream {
                stream_id: id,
                associated_stream_id: StreamId::ZERO,
                priority: 0,
                slot: 0,
                fin: false,
                unidirectional: false,
                headers,
            })));
            id
        };
        let timeout = self.shared.config.syn_reply_timeout;
        match tokio::time::timeout(timeout, reply_rx).await {
            Ok(Ok(Ok(headers))) => Ok(Stream::new(
                self.shared.clone(),
                self.life.clone(),
                id,
                headers,
                flags,
                rx,
            )),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(self.closed_error()),
            Err(_) => {
                self.shared.lock().streams.remove(&id);
                Err(Error::SynReplyTimeout)
            }
        }
    }

    /// Sends one PING and waits for its answer, returning the round-trip time.
    pub async fn ping(&self) -> Result<Duration, Error> {
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut st = self.shared.lock();
            if let Some(end) = &st.ended {
                return Err(Error::SessionClosed(end.clone()));
            }
            let id = st.next_ping_id;
            st.next_ping_id = st.next_ping_id.wrapping_add(2);
            st.pings.insert(id, tx);
            id
        };
        let started = Instant::now();
        let ping = Frame::Ping(Ping { id: PingId(id) });
        if self
            .shared
            .control_tx
            .send(Control::Frame(ping))
            .await
            .is_err()
        {
            return Err(self.closed_error());
        }
        rx.await.map_err(|_| self.closed_error())?;
        Ok(started.elapsed())
    }

    /// Drops both header-compression contexts. Call it once no more streams will be opened or
    /// accepted: an idle session then holds no zlib state (~200 KiB less).
    pub fn release_header_contexts(&self) {
        self.shared.release_decoder.store(true, Ordering::Release);
        self.shared.release_wake.notify_one();
        let _ = self
            .shared
            .control_tx
            .try_send(Control::ReleaseHeaderContext);
    }

    /// Closes the session the way Kubernetes does: RST_STREAM CANCEL for every stream we have
    /// not finished, GOAWAY, then the socket is shut down.
    pub async fn close(&self) {
        let Some((close, done)) = close_command(&self.shared) else {
            // The writer stops by itself once the session has ended, even in the middle of
            // a write the peer never takes; with the reader gone too the socket is released.
            self.life.abort_reader();
            return;
        };
        if self.shared.control_tx.send(close).await.is_ok() {
            let _ = tokio::time::timeout(CLOSE_GRACE, done).await;
        }
        self.shared.end(SessionEnd::Local);
        // The reader may be parked on a stream inbox nobody drains any more. (The abort is
        // kept apart from the life: a handle held here would keep the session.)
        let life = Arc::downgrade(&self.life);
        tokio::spawn(async move {
            tokio::time::sleep(CLOSE_GRACE).await;
            if let Some(life) = life.upgrade() {
                life.abort_reader();
            }
        });
    }

    /// Resolves when the session has ended, with the reason.
    pub async fn closed(&self) -> SessionEnd {
        let mut rx = self.shared.subscribe_end();
        loop {
            if let Some(end) = rx.borrow_and_update().clone() {
                return end;
            }
            if rx.changed().await.is_err() {
                return SessionEnd::Local;
            }
        }
    }

    /// Why the session ended, if it has.
    pub fn end_reason(&self) -> Option<SessionEnd> {
        self.shared.ended()
    }

    /// Whether the peer has sent GOAWAY.
    pub fn is_going_away(&self) -> bool {
        self.shared.lock().goaway.is_some()
    }

    fn closed_error(&self) -> Error {
        Error::SessionClosed(self.shared.ended().unwrap_or(SessionEnd::Local))
    }
}
