//! Client connections waiting for a request head, all together: at most
//! `--max-pending-connections` at once, the one that has waited longest shed first.
//!
//! A connection waits from its accept (TLS handshake included) to its first complete request
//! head, and again whenever it has no request in flight (an idle keep-alive or HTTP/2
//! connection). While it waits it may hold an unfinished head of up to
//! `--max-request-header-bytes` (and TLS buffers) for `--request-header-timeout`, and nobody
//! knows yet who sent it: without a cap, thousands of trickling heads hold 64 KiB each.
//!
//! Beyond the cap the proxy sheds the *oldest* waiting connection rather than refusing the new
//! one (or leaving it in the kernel's backlog): kubectl sends its head within milliseconds of
//! the handshake, so a real client is almost never the oldest, while an attacker who holds the
//! cap full must now open more than *cap* connections within one real client's handshake to
//! shed it, not merely *cap* per request-header timeout.
//!
//! A shed connection is closed gracefully where it can be: HTTP/2 gets a GOAWAY (so the client
//! knows no stream of it was processed), an idle HTTP/1.1 keep-alive connection is closed
//! cleanly, and a request head that completes meanwhile gets its answer with
//! `Connection: close`. That grace is bounded so that shedding still frees what it must: at
//! most [`SHED_GRACE`] per connection and [`SHED_GRACE_AT_ONCE`] connections at once (a shed
//! connection beyond them is closed at once, as an attacker's trickling head should be).
//!
//! The admin listener caps *all* its connections (probes must always get in): when it is full,
//! a new connection asks [`WaitingConnections::shed_oldest`] for room, the same way.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Connections waiting for a request head at once by default (`--max-pending-connections`).
pub const DEFAULT_MAX_PENDING: u32 = 1024;

/// The longest a shed connection may take to close cleanly before it is cut.
pub const SHED_GRACE: Duration = Duration::from_secs(1);
/// Shed connections closing gracefully at once; a shed connection beyond them is cut at once.
pub const SHED_GRACE_AT_ONCE: usize = 8;

/// Every connection waiting for a request head, oldest first.
#[derive(Debug)]
pub struct WaitingConnections {
    max: usize,
    inner: Mutex<Queue>,
    /// Room for shed connections closing gracefully.
    grace: Arc<Semaphore>,
}

#[derive(Debug, Default)]
struct Queue {
    next: u64,
    /// By the order they began to wait.
    waiting: BTreeMap<u64, Arc<Waiter>>,
}

impl WaitingConnections {
    /// A registry that lets at most `max` (at least 1) connections wait at once.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(WaitingConnections {
            max: max.max(1),
            inner: Mutex::new(Queue::default()),
            grace: Arc::new(Semaphore::new(SHED_GRACE_AT_ONCE)),
        })
    }

    /// A newly accepted connection, waiting from now. It stops counting when the guard drops.
    pub fn join(self: &Arc<Self>) -> WaitingGuard {
        let waiter = Arc::new(Waiter {
            registry: self.clone(),
            place: Mutex::new(Place::default()),
            evicted: AtomicBool::new(false),
            wake: Notify::new(),
        });
        waiter.start_waiting();
        WaitingGuard(waiter)
    }

    /// A shed connection's room to close gracefully (for up to [`SHED_GRACE`], given back when
    /// dropped); `None` when [`SHED_GRACE_AT_ONCE`] are already closing: it is cut at once.
    pub fn grace(&self) -> Option<OwnedSemaphorePermit> {
        self.grace.clone().try_acquire_owned().ok()
    }

    /// Sheds the connection that has waited longest, however few wait: room for a new
    /// connection where a cap on *all* connections is reached (the admin listener's). Whether
    /// one was waiting to be shed.
    pub fn shed_oldest(&self) -> bool {
        self.lock().shed_oldest()
    }

    /// How many connections wait now.
    pub fn len(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Queue {
    /// Takes the oldest waiting connection out and tells it it is shed; `false` if none waits.
    fn shed_oldest(&mut self) -> bool {
        let Some((_, oldest)) = self.waiting.pop_first() else {
            return false;
        };
        // Lock order: the queue (held by the caller), then a waiter's place.
        oldest.lock_place().key = None;
        oldest.evicted.store(true, Ordering::Release);
        oldest.wake.notify_one();
        true
    }
}

#[derive(Debug, Default)]
struct Place {
    /// Its key in the queue while it waits.
    key: Option<u64>,
    /// The connection is gone: it never waits again.
    closed: bool,
}

/// One connection's place among the waiting ones.
#[derive(Debug)]
pub struct Waiter {
    registry: Arc<WaitingConnections>,
    place: Mutex<Place>,
    evicted: AtomicBool,
    wake: Notify,
}

impl Waiter {
    /// The connection has no request in flight: it waits (as the youngest), and the oldest
    /// waiting connection is shed if that makes one too many.
    pub fn start_waiting(self: &Arc<Self>) {
        // Lock order: the queue, then a waiter's place.
        let mut queue = self.registry.lock();
        let mut place = self.lock_place();
        if place.closed || place.key.is_some() {
            return;
        }
        let key = queue.next;
        queue.next += 1;
        place.key = Some(key);
        drop(place);
        queue.waiting.insert(key, self.clone());
        while queue.waiting.len() > self.registry.max {
            if !queue.shed_oldest() {
                break;
            }
        }
    }

    /// A request head is complete: the connection no longer waits (and a shedding that raced
    /// with the head is forgotten: the connection holds no unfinished head now).
    pub fn stop_waiting(&self) {
        let mut queue = self.registry.lock();
        let mut place = self.lock_place();
        if let Some(key) = place.key.take() {
            queue.waiting.remove(&key);
        }
        self.evicted.store(false, Ordering::Release);
    }

    /// Resolves when the connection has been shed to make room for a younger one.
    pub async fn evicted(&self) {
        loop {
            let notified = self.wake.notified();
            if self.evicted.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    fn close(&self) {
        let mut queue = self.registry.lock();
        let mut place = self.lock_place();
        place.closed = true;
        if let Some(key) = place.key.take() {
            queue.waiting.remove(&key);
        }
    }

    fn lock_place(&self) -> std::sync::MutexGuard<'_, Place> {
        self.place.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The connection's hold on its [`Waiter`]: dropping it (the connection ends) takes the
/// connection out of the count for good.
#[derive(Debug)]
pub struct WaitingGuard(Arc<Waiter>);

impl WaitingGuard {
    /// The waiter, for whoever tracks the connection's requests.
    pub fn waiter(&self) -> Arc<Waiter> {
        self.0.clone()
    }
}

impl Drop for WaitingGuard {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn is_evicted(w: &Waiter) -> bool {
        w.evicted.load(Ordering::Acquire)
    }

    #[test]
    fn beyond_the_cap_the_oldest_waiting_connection_is_shed() {
        let registry = WaitingConnections::new(2);
        let a = registry.join();
        let b = registry.join();
        assert_eq!(registry.len(), 2);
        let c = registry.join();
        assert_eq!(registry.len(), 2);
        assert!(is_evicted(&a.0), "the oldest goes");
        assert!(!is_evicted(&b.0) && !is_evicted(&c.0));
        drop(a);
        assert_eq!(registry.len(), 2);
        drop((b, c));
        assert!(registry.is_empty());
    }

    #[test]
    fn a_connection_with_a_request_in_flight_does_not_count_and_waits_again_as_the_youngest() {
        let registry = WaitingConnections::new(2);
        let a = registry.join();
        let b = registry.join();
        a.waiter().stop_waiting();
        let c = registry.join();
        assert!(!is_evicted(&b.0), "a busy connection left room");
        // `a` idles again: it is now younger than `b`, which is shed.
        a.waiter().start_waiting();
        assert!(is_evicted(&b.0));
        assert!(!is_evicted(&a.0) && !is_evicted(&c.0));
        assert_eq!(registry.len(), 2);
    }

    #[test]
    fn a_closed_connection_never_counts_again() {
        let registry = WaitingConnections::new(4);
        let a = registry.join();
        let waiter = a.waiter();
        drop(a);
        waiter.start_waiting();
        assert!(registry.is_empty());
    }

    #[test]
    fn a_head_that_completes_as_the_connection_is_shed_cancels_the_shedding() {
        let registry = WaitingConnections::new(1);
        let a = registry.join();
        let _b = registry.join();
        assert!(is_evicted(&a.0));
        a.waiter().stop_waiting();
        assert!(!is_evicted(&a.0));
    }

    #[test]
    fn room_is_made_by_shedding_the_oldest_waiting_connection_whatever_the_count() {
        let registry = WaitingConnections::new(8);
        let a = registry.join();
        let b = registry.join();
        let busy = registry.join();
        busy.waiter().stop_waiting();
        a.waiter().stop_waiting();
        a.waiter().start_waiting();
        // `b` has waited longest (`a` waits again since, `busy` has a request in flight).
        assert!(registry.shed_oldest());
        assert!(is_evicted(&b.0));
        assert!(!is_evicted(&a.0) && !is_evicted(&busy.0));
        assert!(registry.shed_oldest());
        assert!(is_evicted(&a.0));
        assert!(!registry.shed_oldest(), "a busy connection is never shed");
        assert!(!is_evicted(&busy.0));
        assert!(registry.is_empty());
    }

    #[tokio::test]
    async fn the_shed_connection_is_told() {
        let registry = WaitingConnections::new(1);
        let a = registry.join();
        let waiter = a.waiter();
        let told = tokio::spawn(async move { waiter.evicted().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!told.is_finished());
        let _b = registry.join();
        tokio::time::timeout(Duration::from_secs(5), told)
            .await
            .expect("told at once")
            .unwrap();
    }

    #[test]
    fn only_so_many_shed_connections_close_gracefully_at_once() {
        let registry = WaitingConnections::new(1);
        let rooms: Vec<_> = (0..SHED_GRACE_AT_ONCE)
            .map(|_| registry.grace().expect("room to close gracefully"))
            .collect();
        assert!(registry.grace().is_none(), "beyond them: cut at once");
        drop(rooms);
        assert!(registry.grace().is_some());
    }
}
