//! A stream's bounded receive queue. The bound is in bytes, not frames, because a peer may send
//! DATA frames of up to 16 MiB: a frame-count bound would let a few huge frames pile up. Each
//! item counts as at least [`MIN_ITEM`] bytes, because a tiny frame costs its queue slot and
//! allocation whatever its length: 256 KiB of one-byte frames would otherwise be 262,144 items
//! and some 16 MiB. The session's reader waits for room before it reads further from the
//! socket, so a slow stream reader slows the peer through TCP instead of growing memory.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, Semaphore};

/// The session reader's end of a stream inbox.
#[derive(Debug)]
pub(crate) struct InboxSender {
    tx: mpsc::UnboundedSender<Bytes>,
    room: Arc<Semaphore>,
    capacity: usize,
}

/// The stream handle's end of the inbox.
#[derive(Debug)]
pub(crate) struct InboxReceiver {
    rx: mpsc::UnboundedReceiver<Bytes>,
    room: Arc<Semaphore>,
    capacity: usize,
    /// Room of items taken by `try_recv_held` and not given back yet.
    held: usize,
}

/// Creates an inbox that holds at most `capacity` bytes (one larger frame is let through alone).
pub(crate) fn inbox(capacity: usize) -> (InboxSender, InboxReceiver) {
    let capacity = capacity.clamp(1, Semaphore::MAX_PERMITS);
    let room = Arc::new(Semaphore::new(capacity));
    let (tx, rx) = mpsc::unbounded_channel();
    (
        InboxSender {
            tx,
            room: room.clone(),
            capacity,
        },
        InboxReceiver {
            rx,
            room,
            capacity,
            held: 0,
        },
    )
}

/// What an item costs of the inbox at least: its queue slot, its `Bytes` and the allocation of
/// a small payload copied out of the read buffer.
pub(crate) const MIN_ITEM: usize = 64;

fn permits_for(len: usize, capacity: usize) -> u32 {
    // A frame larger than the whole inbox takes all of it: it is delivered alone.
    len.max(MIN_ITEM).min(capacity) as u32
}

impl InboxSender {
    /// Queues `data`, waiting while the inbox is full. Returns `false` if the receiver is gone,
    /// in which case the data is discarded (nobody wants it).
    pub(crate) async fn deliver(&self, data: Bytes) -> bool {
        let n = permits_for(data.len(), self.capacity);
        match self.room.acquire_many(n).await {
            Ok(permit) => permit.forget(),
            Err(_) => return false,
        }
        self.tx.send(data).is_ok()
    }

    /// Queues `data` if there is room now; gives it back if the inbox is full. `Ok(false)`: the
    /// receiver is gone and the data was discarded.
    pub(crate) fn try_deliver(&self, data: Bytes) -> Result<bool, Bytes> {
        let n = permits_for(data.len(), self.capacity);
        match self.room.try_acquire_many(n) {
            Ok(permit) => permit.forget(),
            Err(tokio::sync::TryAcquireError::Closed) => return Ok(false),
            Err(tokio::sync::TryAcquireError::NoPermits) => return Err(data),
        }
        Ok(self.tx.send(data).is_ok())
    }
}

impl InboxReceiver {
    /// The next queued item, or `None` once the sender is gone and the queue is drained.
    pub(crate) async fn recv(&mut self) -> Option<Bytes> {
        self.release_held();
        let data = self.rx.recv().await?;
        Some(self.taken(data))
    }

    /// The next queued item if one is queued now (never waits), its room still taken until
    /// [`InboxReceiver::release_held`] or the next `recv`: the reader may hold it a while
    /// (waiting for a recording's budget) without the peer sending more in its place.
    pub(crate) fn try_recv_held(&mut self) -> Option<Bytes> {
        let data = self.rx.try_recv().ok()?;
        self.held += permits_for(data.len(), self.capacity) as usize;
        Some(data)
    }

    /// Gives back the room of what `try_recv_held` took.
    pub(crate) fn release_held(&mut self) {
        if self.held > 0 {
            self.room.add_permits(std::mem::take(&mut self.held));
        }
    }

    /// Gives the room `data` held back to the sender.
    fn taken(&self, data: Bytes) -> Bytes {
        self.room
            .add_permits(permits_for(data.len(), self.capacity) as usize);
        data
    }
}

impl InboxReceiver {
    /// Whether data is queued right now (`recv` would not wait).
    pub(crate) fn has_queued(&self) -> bool {
        !self.rx.is_empty()
    }
}

impl Drop for InboxReceiver {
    fn drop(&mut self) {
        // Wakes a reader waiting for room so it discards instead of blocking the session.
        self.room.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// `n` bytes of `b`.
    fn bytes(b: u8, n: usize) -> Bytes {
        Bytes::from(vec![b; n])
    }

    #[tokio::test]
    async fn full_inbox_blocks_until_read() {
        let (tx, mut rx) = inbox(1000);
        assert!(tx.deliver(bytes(1, 1000)).await);
        let blocked =
            tokio::time::timeout(Duration::from_millis(50), tx.deliver(bytes(2, 1))).await;
        assert!(blocked.is_err(), "second delivery must wait for room");
        assert_eq!(rx.recv().await.unwrap(), bytes(1, 1000));
        assert!(tx.deliver(bytes(2, 1)).await);
        assert_eq!(rx.recv().await.unwrap(), bytes(2, 1));
    }

    #[tokio::test]
    async fn a_tiny_item_counts_as_min_item_bytes() {
        let (tx, mut rx) = inbox(4 * MIN_ITEM);
        for i in 0..4 {
            assert_eq!(tx.try_deliver(bytes(i, 1)), Ok(true));
        }
        let more = bytes(9, 1);
        assert_eq!(tx.try_deliver(more.clone()), Err(more));
        assert_eq!(rx.recv().await.unwrap(), bytes(0, 1));
        assert_eq!(tx.try_deliver(bytes(9, 1)), Ok(true));
    }

    #[tokio::test]
    async fn try_recv_held_takes_what_is_queued_and_keeps_its_room_until_released() {
        let (tx, mut rx) = inbox(1000);
        assert_eq!(rx.try_recv_held(), None);
        assert!(tx.deliver(bytes(1, 400)).await);
        assert!(tx.deliver(bytes(2, 600)).await);
        assert_eq!(rx.try_recv_held().unwrap(), bytes(1, 400));
        assert_eq!(rx.try_recv_held().unwrap(), bytes(2, 600));
        assert_eq!(rx.try_recv_held(), None);
        // Taken but held: the peer may not send more in its place yet.
        let x = bytes(3, 100);
        assert_eq!(tx.try_deliver(x.clone()), Err(x.clone()));
        rx.release_held();
        assert_eq!(tx.try_deliver(bytes(4, 1000)), Ok(true));
        // `recv` gives back what is still held too.
        assert_eq!(rx.try_recv_held().unwrap(), bytes(4, 1000));
        assert_eq!(tx.try_deliver(x.clone()), Err(x.clone()));
        let waiting = tokio::spawn(async move {
            let got = rx.recv().await;
            (rx, got)
        });
        assert!(tx.deliver(x.clone()).await);
        drop(tx);
        let (mut rx, got) = waiting.await.unwrap();
        assert_eq!(got, Some(x));
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn oversized_frame_passes_alone() {
        let (tx, mut rx) = inbox(4);
        assert!(tx.deliver(Bytes::from(vec![1u8; 100])).await);
        assert_eq!(rx.recv().await.unwrap().len(), 100);
    }

    #[tokio::test]
    async fn dropped_receiver_discards_instead_of_blocking() {
        let (tx, rx) = inbox(4);
        assert!(tx.deliver(Bytes::from_static(b"abcd")).await);
        drop(rx);
        assert!(!tx.deliver(Bytes::from_static(b"more")).await);
    }

    #[tokio::test]
    async fn sender_gone_ends_after_queued_data() {
        let (tx, mut rx) = inbox(64);
        assert!(tx.deliver(Bytes::from_static(b"last")).await);
        drop(tx);
        assert_eq!(rx.recv().await.unwrap(), Bytes::from_static(b"last"));
        assert!(rx.recv().await.is_none());
    }
}
