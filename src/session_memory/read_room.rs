//! How much a reader may read next, as every session reader decides it (the SPDY session's
//! and the WebSocket reader): the policy is here once; each reader only does the waiting, with
//! what it must watch or hold meanwhile.

use super::lane::Held;

/// What a reader's next read needs from its lane ([`Held::plan_read`]).
#[derive(Debug, PartialEq, Eq)]
pub enum ReadRoom {
    /// It may read this many bytes now.
    Now(usize),
    /// A frame or message of this many bytes in all, larger than the lane's floor, must be held
    /// whole first ([`Held::grow_to`], refused past the limits); then the read goes on as wanted.
    WholeFrame(usize),
    /// There is no room now: wait for this much more ([`MemoryLane::take_room`](super::MemoryLane::take_room)),
    /// [`absorb`](Held::absorb) it, then read what is held beyond the buffer.
    Wait(usize),
}

impl Held {
    /// Plans a read of `want` bytes by a reader whose buffer holds `buffered` bytes (what this
    /// `Held` pays for, with the room of its reads), `missing` bytes short of the frame it is
    /// in (`None`: between frames, or not yet known). A frame larger than the floor is taken
    /// whole; otherwise room for the read, as much as there is: what is held beyond the buffer
    /// is trimmed to the read, or more is taken now if it can be.
    pub fn plan_read(&mut self, buffered: usize, want: usize, missing: Option<usize>) -> ReadRoom {
        if let Some(missing) = missing {
            let frame = buffered + missing;
            if frame > self.lane().limits().floor {
                return if frame > self.len() {
                    ReadRoom::WholeFrame(frame)
                } else {
                    ReadRoom::Now(want)
                };
            }
        }
        let need = buffered + want;
        if need <= self.len() {
            self.shrink_to(need);
            return ReadRoom::Now(want);
        }
        match self.lane().try_room(need - self.len()) {
            Some(more) => {
                self.absorb(more);
                ReadRoom::Now(self.len() - buffered)
            }
            None => ReadRoom::Wait(need - self.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{LaneLimits, MemoryBudget};
    use super::*;

    fn held(budget: usize) -> Held {
        MemoryBudget::new(
            budget,
            LaneLimits {
                floor: 100,
                cap: 1000,
            },
        )
        .lane()
        .none()
    }

    #[test]
    fn a_frame_past_the_floor_is_held_whole_first() {
        let mut h = held(1000);
        assert_eq!(h.plan_read(10, 50, Some(200)), ReadRoom::WholeFrame(210));
        assert_eq!(h.len(), 0, "nothing taken by the plan");
        // A frame within the floor is read as room allows.
        assert_eq!(h.plan_read(10, 50, Some(20)), ReadRoom::Now(50));
    }

    #[test]
    fn room_held_beyond_the_read_is_trimmed_and_missing_room_taken_or_waited_for() {
        let mut h = held(0);
        assert_eq!(h.plan_read(0, 60, None), ReadRoom::Now(60));
        assert_eq!(h.len(), 60);
        assert_eq!(h.plan_read(10, 20, None), ReadRoom::Now(20));
        assert_eq!(h.len(), 30, "trimmed to the buffer and the read");
        // The floor (100) allows 70 more of the 90 asked for.
        assert_eq!(h.plan_read(30, 160, None), ReadRoom::Now(70));
        assert_eq!(h.len(), 100);
        assert_eq!(h.plan_read(100, 10, None), ReadRoom::Wait(10));
    }
}
