//! What keeps a session's socket tasks running: one [`Life`], shared by every handle on the
//! session (the [`Connection`](super::Connection)'s clones and every stream half, accepted or
//! opened). When the last handle drops, nothing can read, write or close the session any more,
//! so the session is closed as [`Connection::close`](super::Connection::close) would (RST for
//! unfinished streams, GOAWAY, as far as the socket takes them at once) and ended: the writer
//! stops (its final shutdown bounded), the reader is aborted, and the socket is released. The
//! tasks themselves hold only the shared state, never the life, so they cannot keep it.

use std::sync::{Arc, OnceLock, Weak};

use tokio::sync::oneshot;
use tokio::task::AbortHandle;

use super::error::SessionEnd;
use super::shared::{Control, Shared};
use crate::spdy::frame::StreamId;

/// One session's life: the last of its handles to drop ends it.
#[derive(Debug)]
pub(crate) struct Life {
    pub(crate) shared: Arc<Shared>,
    /// The reader task, aborted at the end (it may be parked on an inbox nobody drains).
    reader: OnceLock<AbortHandle>,
}

impl Life {
    /// The life of the session `shared`; its reader is given once spawned
    /// ([`Life::set_reader`]).
    pub(crate) fn new(shared: Arc<Shared>) -> Arc<Life> {
        Arc::new(Life {
            shared,
            reader: OnceLock::new(),
        })
    }

    /// The reader task to abort when the session ends.
    pub(crate) fn set_reader(&self, reader: AbortHandle) {
        let _ = self.reader.set(reader);
    }

    /// Aborts the reader task, if it was started.
    pub(crate) fn abort_reader(&self) {
        if let Some(reader) = self.reader.get() {
            reader.abort();
        }
    }

    /// A weak handle, for the reader: the streams it hands out carry the life, the reader
    /// itself must not.
    pub(crate) fn weak(self: &Arc<Self>) -> Weak<Life> {
        Arc::downgrade(self)
    }
}

/// The writer's command that closes the session as Kubernetes does (RST_STREAM CANCEL for
/// every stream we have not finished, GOAWAY, shutdown), and what tells when it is done;
/// `None` once the session has ended.
pub(crate) fn close_command(shared: &Shared) -> Option<(Control, oneshot::Receiver<()>)> {
    let st = shared.lock();
    if st.ended.is_some() {
        return None;
    }
    let mut resets: Vec<StreamId> = st
        .streams
        .iter()
        .filter(|(_, e)| !e.local_done)
        .map(|(id, _)| *id)
        .collect();
    resets.sort();
    let (done, done_rx) = oneshot::channel();
    let close = Control::Close {
        resets,
        last_good: st.last_peer_stream,
        done,
    };
    Some((close, done_rx))
}

impl Drop for Life {
    fn drop(&mut self) {
        // Best effort and without waiting: the writer takes the close first (its lane is
        // polled before the end), writes what the socket takes at once, and gives up the rest
        // once it sees the end below.
        if let Some((close, _)) = close_command(&self.shared) {
            let _ = self.shared.control_tx.try_send(close);
        }
        self.shared.end(SessionEnd::Local);
        self.abort_reader();
    }
}
