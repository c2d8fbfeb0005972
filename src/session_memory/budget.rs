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

/// The bytes all sessions' lanes may borrow beyond their floors, together. A budget made with
/// [`counting`](Self::counting) is the same budget (the same bytes, the same totals) whose
/// lanes' ended sessions are also told to a counter of its own: a cluster's, say.
pub struct MemoryBudget {
    pool: Arc<Pool>,
    /// Told of each session ended by a lane taken from this handle.
    on_end: Option<Box<dyn Fn(Limit) + Send + Sync>>,
}

/// What every handle of one budget shares.
#[derive(Debug)]
struct Pool {
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

impl std::fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("pool", &self.pool)
            .field("counted", &self.on_end.is_some())
            .finish()
    }
}

impl MemoryBudget {
    /// A budget of `limit` bytes for lanes limited as `lanes` says.
    pub fn new(limit: usize, lanes: LaneLimits) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            pool: Arc::new(Pool {
                limit,
                lanes: LaneLimits {
                    floor: lanes.floor.min(lanes.cap),
                    cap: lanes.cap,
                },
                borrowed: AtomicUsize::new(0),
                held: AtomicUsize::new(0),
                released: Notify::new(),
                ended: [AtomicU64::new(0), AtomicU64::new(0)],
            }),
            on_end: None,
        })
    }

    /// This budget, for lanes whose ended sessions `count` is also told of (they count in
    /// [`sessions_ended`](Self::sessions_ended) as any other).
    pub fn counting(&self, count: impl Fn(Limit) + Send + Sync + 'static) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            pool: self.pool.clone(),
            on_end: Some(Box::new(count)),
        })
    }

    /// A new lane: one direction of one session.
    pub fn lane(self: &Arc<Self>) -> MemoryLane {
        MemoryLane::new(self.clone())
    }

    /// The budget's size.
    pub fn limit(&self) -> usize {
        self.pool.limit
    }

    /// What each lane may hold.
    pub fn lane_limits(&self) -> LaneLimits {
        self.pool.lanes
    }

    /// Bytes lanes have borrowed from the budget now.
    pub fn in_use(&self) -> usize {
        self.pool.borrowed.load(Ordering::Relaxed)
    }

    /// Bytes all lanes hold now, their floors included.
    pub fn held(&self) -> usize {
        self.pool.held.load(Ordering::Relaxed)
    }

    /// Sessions ended so far because `limit` refused one of their lanes (every handle's).
    pub fn sessions_ended(&self, limit: Limit) -> u64 {
        self.pool.ended[limit as usize].load(Ordering::Relaxed)
    }

    /// Counts a session ended by `limit`.
    pub(super) fn count_ended(&self, limit: Limit) {
        self.pool.ended[limit as usize].fetch_add(1, Ordering::Relaxed);
        if let Some(count) = &self.on_end {
            count(limit);
        }
    }

    /// Lends `n` bytes if the budget has them.
    pub(super) fn try_borrow(&self, n: usize) -> bool {
        let limit = self.pool.limit;
        self.pool
            .borrowed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&after| after <= limit)
            })
            .is_ok()
    }

    /// What the budget could lend now (others may take it first).
    pub(super) fn room(&self) -> usize {
        self.pool.limit.saturating_sub(self.in_use())
    }

    /// Takes back `n` borrowed bytes and wakes whoever waits for some.
    pub(super) fn give_back(&self, n: usize) {
        self.pool.borrowed.fetch_sub(n, Ordering::AcqRel);
        self.pool.released.notify_waiters();
    }

    /// Notes that lanes now hold `grown` bytes more and `shrunk` less.
    pub(super) fn note_held(&self, grown: usize, shrunk: usize) {
        if grown > 0 {
            self.pool.held.fetch_add(grown, Ordering::Relaxed);
        }
        if shrunk > 0 {
            self.pool.held.fetch_sub(shrunk, Ordering::Relaxed);
        }
    }

    /// Resolves when bytes are given back after it was enabled.
    pub(super) fn released(&self) -> Notified<'_> {
        self.pool.released.notified()
    }
}
