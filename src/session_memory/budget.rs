//! The budget all sessions' lanes share, and what each lane may hold.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use super::lane::MemoryLane;

/// What one lane may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneLimits {
    /// Held without the budget: always there for the lane.
    pub floor: usize,
    /// Never more than this, floor included.
    pub cap: usize,
}

/// Which limit refused a lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The lane's own cap.
    Session,
    /// The budget all sessions share.
    Budget,
}

impl Limit {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Limit::Session => "session",
            Limit::Budget => "budget",
        }
    }
}

/// The bytes all sessions' lanes may borrow beyond their floors, together.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    lanes: LaneLimits,
    /// Borrowed by lanes now.
    borrowed: AtomicUsize,
    /// Held by all lanes now, floors included.
    held: AtomicUsize,
    /// Woken whenever bytes are given back.
    released: Notify,
    /// Sessions ended because a lane was refused, by limit.
    ended: [AtomicU64; 2],
}

impl MemoryBudget {
    /// A budget of `limit` bytes for lanes limited as `lanes` says.
    pub fn new(limit: usize, lanes: LaneLimits) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            limit,
            lanes: LaneLimits {
                floor: lanes.floor.min(lanes.cap),
                cap: lanes.cap,
            },
            borrowed: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            released: Notify::new(),
            ended: [AtomicU64::new(0), AtomicU64::new(0)],
        })
    }

    /// A new lane: one direction of one session.
    pub fn lane(self: &Arc<Self>) -> MemoryLane {
        MemoryLane::new(self.clone())
    }

    /// The budget's size.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// What each lane may hold.
    pub fn lane_limits(&self) -> LaneLimits {
        self.lanes
    }

    /// Bytes lanes have borrowed from the budget now.
    pub fn in_use(&self) -> usize {
        self.borrowed.load(Ordering::Relaxed)
    }

    /// Bytes all lanes hold now, their floors included.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Sessions ended so far because `limit` refused one of their lanes.
    pub fn sessions_ended(&self, limit: Limit) -> u64 {
        self.ended[limit as usize].load(Ordering::Relaxed)
    }

    /// Counts a session ended by `limit`.
    pub(super) fn count_ended(&self, limit: Limit) {
        self.ended[limit as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Lends `n` bytes if the budget has them.
    pub(super) fn try_borrow(&self, n: usize) -> bool {
        self.borrowed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&after| after <= self.limit)
            })
            .is_ok()
    }

    /// What the budget could lend now (others may take it first).
    pub(super) fn room(&self) -> usize {
        self.limit.saturating_sub(self.in_use())
    }

    /// Takes back `n` borrowed bytes and wakes whoever waits for some.
    pub(super) fn give_back(&self, n: usize) {
        self.borrowed.fetch_sub(n, Ordering::AcqRel);
        self.released.notify_waiters();
    }

    /// Notes that lanes now hold `grown` bytes more and `shrunk` less.
    pub(super) fn note_held(&self, grown: usize, shrunk: usize) {
        if grown > 0 {
            self.held.fetch_add(grown, Ordering::Relaxed);
        }
        if shrunk > 0 {
            self.held.fetch_sub(shrunk, Ordering::Relaxed);
        }
    }

    /// Resolves when bytes are given back after it was enabled.
    pub(super) fn released(&self) -> Notified<'_> {
        self.released.notified()
    }
}
