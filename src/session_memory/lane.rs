//! One direction of one session: what it holds, taken from its floor and the shared budget.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::budget::{LaneLimits, Limit, MemoryBudget};

/// The memory one direction of one session holds; cheap to clone (one lane, shared).
#[derive(Debug, Clone)]
pub struct MemoryLane(Arc<Lane>);

#[derive(Debug)]
struct Lane {
    budget: Arc<MemoryBudget>,
    limits: LaneLimits,
    /// A plain mutex: a few additions under it, never held across an await. Only the lane's
    /// own tasks (its reader and whoever passes its bytes on) take it.
    state: Mutex<LaneState>,
    /// Woken whenever the lane gives bytes back.
    released: Notify,
}

#[derive(Debug, Default)]
struct LaneState {
    /// Bytes held, floor included.
    held: usize,
    /// Of them, borrowed from the budget: always `held - floor` (or 0).
    borrowed: usize,
}

/// Why the lane could not grant bytes.
enum Short {
    Cap,
    Budget,
}

/// A lane's refusal: the session that asked must end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.reason())]
pub struct Refused {
    /// Which limit refused.
    pub limit: Limit,
    /// What was asked for.
    pub wanted: usize,
    /// The limit, in bytes.
    pub allowed: usize,
}

impl Refused {
    /// Short enough for a WebSocket close reason (123 bytes).
    fn reason(&self) -> String {
        match self.limit {
            Limit::Session => format!(
                "message too big for this session's memory limit ({} bytes)",
                self.allowed
            ),
            Limit::Budget => format!(
                "the proxy's memory for sessions ({} bytes) is in use; try again later",
                self.allowed
            ),
        }
    }
}

impl Lane {
    fn lock(&self) -> MutexGuard<'_, LaneState> {
        // A panic under the lock leaves two plain numbers; the lane goes on with them.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds `n` bytes more if the cap and the budget allow.
    fn grant(&self, st: &mut LaneState, n: usize) -> Result<(), Short> {
        let held = st.held + n;
        if held > self.limits.cap {
            return Err(Short::Cap);
        }
        let borrowed = held.saturating_sub(self.limits.floor);
        let more = borrowed - st.borrowed;
        if more > 0 && !self.budget.try_borrow(more) {
            return Err(Short::Budget);
        }
        st.held = held;
        st.borrowed = borrowed;
        self.budget.note_held(n, 0);
        Ok(())
    }

    /// What could be granted now, at most `max`.
    fn available(&self, st: &LaneState, max: usize) -> usize {
        let cap_room = self.limits.cap - st.held;
        let floor_room = self.limits.floor.saturating_sub(st.held);
        max.min(cap_room)
            .min(floor_room.saturating_add(self.budget.room()))
    }

    /// Gives `n` held bytes back: to the budget what was borrowed, and wakes the lane's waiter.
    fn release(&self, n: usize) {
        let give = {
            let mut st = self.lock();
            st.held -= n;
            let borrowed = st.held.saturating_sub(self.limits.floor);
            let give = st.borrowed - borrowed;
            st.borrowed = borrowed;
            give
        };
        self.budget.note_held(0, n);
        if give > 0 {
            self.budget.give_back(give);
        }
        self.released.notify_waiters();
    }
}

impl MemoryLane {
    pub(super) fn new(budget: Arc<MemoryBudget>) -> MemoryLane {
        let limits = budget.lane_limits();
        MemoryLane(Arc::new(Lane {
            budget,
            limits,
            state: Mutex::default(),
            released: Notify::new(),
        }))
    }

    /// What the lane may hold.
    pub fn limits(&self) -> LaneLimits {
        self.0.limits
    }

    /// Bytes the lane holds now.
    pub fn held(&self) -> usize {
        self.0.lock().held
    }

    /// Nothing held yet: a `Held` to add to.
    pub fn none(&self) -> Held {
        Held {
            lane: self.clone(),
            n: 0,
        }
    }

    /// `n` bytes now if the cap and the budget allow, else the refusal (not counted: the
    /// caller says whether it ends a session).
    pub fn try_take(&self, n: usize) -> Result<Held, Refused> {
        let mut st = self.0.lock();
        match self.0.grant(&mut st, n) {
            Ok(()) => Ok(Held {
                lane: self.clone(),
                n,
            }),
            Err(Short::Cap) => Err(self.refusal(Limit::Session, n)),
            Err(Short::Budget) => Err(self.refusal(Limit::Budget, n)),
        }
    }

    /// Room for a read now, as much as there is up to `max` (`None`: none now).
    pub fn try_room(&self, max: usize) -> Option<Held> {
        if max == 0 {
            return Some(self.none());
        }
        loop {
            let mut st = self.0.lock();
            let n = self.0.available(&st, max);
            if n == 0 {
                return None;
            }
            if self.0.grant(&mut st, n).is_ok() {
                return Some(Held {
                    lane: self.clone(),
                    n,
                });
            }
            // Another lane took the budget's room between the look and the loan: look again.
        }
    }

    /// Room for a read: as much as there is up to `max`, at least one byte, waiting while
    /// there is none (until the lane's own bytes go on, or others give some back).
    pub async fn take_room(&self, max: usize) -> Held {
        loop {
            let own = self.0.released.notified();
            let others = self.0.budget.released();
            tokio::pin!(own, others);
            own.as_mut().enable();
            others.as_mut().enable();
            if let Some(room) = self.try_room(max) {
                return room;
            }
            tokio::select! {
                () = own => {}
                () = others => {}
            }
        }
    }

    fn refusal(&self, limit: Limit, wanted: usize) -> Refused {
        let allowed = match limit {
            Limit::Session => self.0.limits.cap,
            Limit::Budget => self.0.budget.limit(),
        };
        Refused {
            limit,
            wanted,
            allowed,
        }
    }

    fn ended(&self, limit: Limit, wanted: usize) -> Refused {
        self.0.budget.count_ended(limit);
        self.refusal(limit, wanted)
    }
}

/// Bytes a lane holds, given back when dropped.
#[derive(Debug)]
pub struct Held {
    lane: MemoryLane,
    n: usize,
}

impl Held {
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The lane it is held from.
    pub fn lane(&self) -> &MemoryLane {
        &self.lane
    }

    /// Moves `n` of the bytes (at most all) into a `Held` of their own.
    pub fn split_off(&mut self, n: usize) -> Held {
        let n = n.min(self.n);
        self.n -= n;
        Held {
            lane: self.lane.clone(),
            n,
        }
    }

    /// Takes over what `other` holds (from the same lane).
    pub fn absorb(&mut self, mut other: Held) {
        debug_assert!(Arc::ptr_eq(&self.lane.0, &other.lane.0), "one lane");
        self.n += std::mem::take(&mut other.n);
    }

    /// Grows to `total` bytes, all at once: what must be held whole before it can go on (a
    /// frame, with what of it is held already). Waits while the lane's other bytes fill its cap
    /// (they are on their way out); refused when `total` alone is past the cap or the budget
    /// cannot lend what is missing, and the session that asked is counted as ended by that
    /// limit. Nothing is taken when refused.
    pub async fn grow_to(&mut self, total: usize) -> Result<(), Refused> {
        if total <= self.n {
            return Ok(());
        }
        let lane = self.lane.clone();
        if total > lane.0.limits.cap {
            return Err(lane.ended(Limit::Session, total));
        }
        let more = total - self.n;
        loop {
            let released = lane.0.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let short = {
                let mut st = lane.0.lock();
                lane.0.grant(&mut st, more).err()
            };
            match short {
                None => {
                    self.n = total;
                    return Ok(());
                }
                Some(Short::Budget) => return Err(lane.ended(Limit::Budget, total)),
                Some(Short::Cap) => released.await,
            }
        }
    }

    /// Gives back all but `n` bytes.
    pub fn shrink_to(&mut self, n: usize) {
        if n < self.n {
            let give = self.n - n;
            self.n = n;
            self.lane.0.release(give);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.n > 0 {
            self.lane.0.release(self.n);
        }
    }
}
