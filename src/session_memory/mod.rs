//! What sessions may make the proxy hold: bytes read from a peer and not yet passed on or
//! dropped, whatever holds them (a read buffer, a message being put together, a queue, a frame
//! an observer follows).
//!
//! Every session direction that reads from a peer has a [`MemoryLane`]; the lanes of all
//! sessions share one [`MemoryBudget`] (`--session-memory-budget`). A lane holds up to its
//! *floor* on its own, without the budget: that much is always there, so a session keeps moving
//! (a kubectl message or frame at a time each way) however much others hold. Beyond the floor a
//! lane borrows from the budget, and never holds more than its *cap* (one largest message and
//! what is queued behind it).
//!
//! Two ways to take memory:
//! - [`MemoryLane::take_room`] for what a reader is about to read: as much as there is, waiting
//!   while there is none. The reader then reads less, or stops reading until its own bytes are
//!   passed on or others give memory back: backpressure, as a slow peer causes, never an error.
//! - [`Held::grow_to`] for what must be held whole before it can be passed on: a frame or
//!   message larger than the floor. All or nothing: past the cap, or when the budget cannot
//!   lend it, it is refused and the session that asked ends (WebSocket close 1009, a SPDY
//!   GOAWAY). Waiting for it instead would let a few sessions hold the budget for good while
//!   everyone else's large messages waited.
//!
//! What is taken is a [`Held`], given back when it drops. [`charged`] ties a `Held` to the
//! bytes it pays for, so the memory is given back when the last piece of them is dropped,
//! wherever they went (a queue, a write, a discarded message): no path can forget to.

mod budget;
mod charged;
mod lane;
mod read_room;

pub use budget::{LaneLimits, Limit, MemoryBudget};
pub use charged::charged;
pub use lane::{Held, MemoryLane, Refused};
pub use read_room::ReadRoom;

#[cfg(test)]
mod tests;
