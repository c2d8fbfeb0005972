//! State shared by the connection handle, the stream handles and the two socket tasks. The
//! mutex is a plain `std` mutex: it guards map lookups only and is never held across `.await`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch, Notify};

use super::config::{Config, Role};
use super::error::{Error, SessionEnd};
use super::inbox::InboxSender;
use crate::peer_hangup::Hangup;
use crate::spdy::frame::{Frame, GoAwayStatus, HeaderBlock, StreamId};

/// Commands for the writer task's priority lane: everything but stream data.
#[derive(Debug)]
pub(crate) enum Control {
    /// A control frame, written as soon as the socket allows (before queued data).
    Frame(Frame),
    /// Drop the compression context: no more header blocks will be sent.
    ReleaseHeaderContext,
    /// Write RST for `streams`, then GOAWAY, shut the socket down and stop.
    Close {
        resets: Vec<StreamId>,
        last_good: StreamId,
        done: oneshot::Sender<()>,
    },
}

/// One outgoing DATA frame (or an empty FIN).
#[derive(Debug)]
pub(crate) struct DataCmd {
    pub id: StreamId,
    pub fin: bool,
    pub payload: Bytes,
}

/// How a stream's receive side ended, as seen by its reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum RecvEnd {
    Open = 0,
    Fin = 1,
    Reset = 2,
    Lost = 3,
}

/// Per-stream facts shared between the session and the stream handles.
#[derive(Debug, Default)]
pub(crate) struct StreamFlags {
    recv_end: AtomicU8,
    send_closed: AtomicBool,
}

impl StreamFlags {
    pub(crate) fn recv_end(&self) -> RecvEnd {
        match self.recv_end.load(Ordering::Acquire) {
            1 => RecvEnd::Fin,
            2 => RecvEnd::Reset,
            3 => RecvEnd::Lost,
            _ => RecvEnd::Open,
        }
    }

    /// Records the first way the receive side ended; later ones are ignored.
    pub(crate) fn set_recv_end(&self, end: RecvEnd) {
        let _ = self.recv_end.compare_exchange(
            RecvEnd::Open as u8,
            end as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    pub(crate) fn send_closed(&self) -> bool {
        self.send_closed.load(Ordering::Acquire)
    }

    pub(crate) fn close_send(&self) {
        self.send_closed.store(true, Ordering::Release);
    }
}

/// The session's record of one stream.
#[derive(Debug)]
pub(crate) struct StreamEntry {
    /// Where received DATA goes; `None` once the peer finished or reset its side.
    pub inbox: Option<Arc<InboxSender>>,
    /// Waiter for the SYN_REPLY of a stream we opened.
    pub reply: Option<oneshot::Sender<Result<HeaderBlock, Error>>>,
    /// We sent FIN or RST: nothing more goes out on this stream.
    pub local_done: bool,
    pub flags: Arc<StreamFlags>,
}

impl StreamEntry {
    pub(crate) fn new(inbox: Arc<InboxSender>, flags: Arc<StreamFlags>) -> Self {
        StreamEntry {
            inbox: Some(inbox),
            reply: None,
            local_done: false,
            flags,
        }
    }

    /// Both directions are finished: the entry can go.
    pub(crate) fn is_done(&self) -> bool {
        self.local_done && self.inbox.is_none() && self.reply.is_none()
    }
}

#[derive(Debug)]
pub(crate) struct State {
    pub streams: HashMap<StreamId, StreamEntry>,
    pub next_stream_id: u32,
    pub next_ping_id: u32,
    /// Waiters of `Connection::ping`, by ping id.
    pub pings: HashMap<u32, oneshot::Sender<()>>,
    /// Highest stream id the peer opened and we accepted (for our GOAWAY).
    pub last_peer_stream: StreamId,
    pub goaway: Option<GoAwayStatus>,
    pub ended: Option<SessionEnd>,
}

/// Everything the session's parts share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub config: Config,
    pub role: Role,
    state: Mutex<State>,
    end_tx: watch::Sender<Option<SessionEnd>>,
    /// Set once the peer is known to have closed or reset the connection while the reader
    /// was still behind (how, as first seen): nothing beyond what the kernel already holds will
    /// come.
    hangup_tx: watch::Sender<Option<Hangup>>,
    pub release_decoder: AtomicBool,
    /// Wakes a reader parked on the socket so it drops its inflate context at once: an idle
    /// session would otherwise keep it until the next frame arrives.
    pub release_wake: Notify,
    pub control_tx: mpsc::Sender<Control>,
    pub data_tx: mpsc::Sender<DataCmd>,
}

impl Shared {
    pub(crate) fn new(
        config: Config,
        role: Role,
        control_tx: mpsc::Sender<Control>,
        data_tx: mpsc::Sender<DataCmd>,
    ) -> Self {
        let first = role.first_stream_id();
        Shared {
            config,
            role,
            state: Mutex::new(State {
                streams: HashMap::new(),
                next_stream_id: first,
                next_ping_id: first,
                pings: HashMap::new(),
                last_peer_stream: StreamId::ZERO,
                goaway: None,
                ended: None,
            }),
            end_tx: watch::channel(None).0,
            hangup_tx: watch::channel(None).0,
            release_decoder: AtomicBool::new(false),
            release_wake: Notify::new(),
            control_tx,
            data_tx,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters more than losing the session, so poisoning is ignored.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why the session ended, if it has.
    pub(crate) fn ended(&self) -> Option<SessionEnd> {
        self.lock().ended.clone()
    }

    pub(crate) fn subscribe_end(&self) -> watch::Receiver<Option<SessionEnd>> {
        self.end_tx.subscribe()
    }

    pub(crate) fn subscribe_hangup(&self) -> watch::Receiver<Option<Hangup>> {
        self.hangup_tx.subscribe()
    }

    /// Whether the peer is known to have hung up (see [`Shared::note_hangup`]).
    pub(crate) fn peer_hung_up(&self) -> bool {
        self.hangup_tx.borrow().is_some()
    }

    /// The peer closed or reset the connection (seen on the socket while the reader was
    /// behind): what its streams still have to deliver can no longer grow, and after a reset
    /// what they had not finished was cut off.
    pub(crate) fn note_hangup(&self, how: Hangup) {
        self.hangup_tx.send_replace(Some(how));
    }

    /// Marks the session over: every stream's reader sees the end after its queued data, every
    /// waiter for a reply or a ping is woken. Only the first reason is kept.
    pub(crate) fn end(&self, reason: SessionEnd) {
        let entries = {
            let mut st = self.lock();
            if st.ended.is_some() {
                return;
            }
            st.ended = Some(reason.clone());
            st.pings.clear();
            std::mem::take(&mut st.streams)
        };
        // After GOAWAY or our own close, unfinished streams end like a reset (spdystream gives
        // its readers EOF); a connection that just died is reported as lost.
        let lost = if reason.is_clean() {
            RecvEnd::Reset
        } else {
            RecvEnd::Lost
        };
        for (_, mut entry) in entries {
            entry.flags.set_recv_end(lost);
            entry.flags.close_send();
            if let Some(reply) = entry.reply.take() {
                let _ = reply.send(Err(Error::SessionClosed(reason.clone())));
            }
        }
        self.end_tx.send_replace(Some(reason));
    }
}
