//! Whether a person is typing on a recorded terminal session, and what the recordings' writer
//! does about it: it rests after each write, as long as the write took.
//!
//! Why: on a machine whose cores are busy with bulk recorded output, what delays a person's
//! echo is not the writer's share of a core (a lower priority for its thread changed nothing)
//! but the kernel's work of taking new page-cache pages for every byte written, hundreds of
//! MiB a second (writing the same bytes over pages already in the cache did not delay the echo;
//! BENCHMARKS.md, "Typing beside bulk recordings"). A writer that rests while someone types
//! lets the budget fill, so the bulk sessions wait for it and the cores have room for the echo.
//! Nobody typing, nothing rests: bulk output alone is recorded as fast as before.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus::Counter;

/// How long after a keystroke the writer still rests: the output a key asks for (a command's
/// listing after Enter) comes within it.
pub(crate) const TYPING_WINDOW: Duration = Duration::from_secs(2);

/// The longest one rest: a write the kernel itself held back (dirty pages throttled) is not
/// mirrored in full.
pub(crate) const MAX_REST: Duration = Duration::from_millis(10);

/// When someone last typed on any recorded terminal session of the proxy.
#[derive(Debug)]
pub(crate) struct Typing {
    since: Instant,
    /// Milliseconds after `since`, plus one, of the last keystroke; 0 for never.
    last: AtomicU64,
}

impl Default for Typing {
    fn default() -> Self {
        Typing {
            since: Instant::now(),
            last: AtomicU64::new(0),
        }
    }
}

impl Typing {
    /// A person typed, now.
    pub(crate) fn typed(&self) {
        let now = self.since.elapsed().as_millis() as u64 + 1;
        self.last.store(now, Ordering::Relaxed);
    }

    /// Whether someone typed within `window` of `now`.
    pub(super) fn lately_at(&self, now: Instant, window: Duration) -> bool {
        match self.last.load(Ordering::Relaxed) {
            0 => false,
            last => {
                let typed = self.since + Duration::from_millis(last - 1);
                now.saturating_duration_since(typed) <= window
            }
        }
    }
}

/// The writer's rests, and what it counts of them.
#[derive(Debug)]
pub(crate) struct Rests {
    typing: std::sync::Arc<Typing>,
    /// Seconds rested, in all.
    rested: Counter,
}

impl Rests {
    /// Rests as `typing` says, counting them in `rested`.
    pub(crate) fn new(typing: std::sync::Arc<Typing>, rested: Counter) -> Rests {
        Rests { typing, rested }
    }

    /// Rests that never come: nobody is told of keystrokes.
    #[cfg(test)]
    pub(crate) fn unused() -> Rests {
        let rested = Counter::new("rested", "rested").expect("valid counter");
        Rests::new(std::sync::Arc::new(Typing::default()), rested)
    }

    /// After a write that took `wrote`: rests as long (at most [`MAX_REST`]) if someone typed
    /// lately, else not at all.
    pub(crate) fn after_write(&self, wrote: Duration) {
        let rest = self.rest_for(wrote, Instant::now());
        if !rest.is_zero() {
            std::thread::sleep(rest);
            self.rested.inc_by(rest.as_secs_f64());
        }
    }

    /// How long to rest after a write that took `wrote`, at `now`.
    fn rest_for(&self, wrote: Duration, now: Instant) -> Duration {
        match self.typing.lately_at(now, TYPING_WINDOW) {
            true => wrote.min(MAX_REST),
            false => Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn rests() -> (Arc<Typing>, Rests) {
        let typing = Arc::new(Typing::default());
        let counter = Counter::new("rested", "rested").unwrap();
        (typing.clone(), Rests::new(typing, counter))
    }

    #[test]
    fn nobody_typing_means_no_rest() {
        let (_, r) = rests();
        let wrote = Duration::from_millis(3);
        assert_eq!(r.rest_for(wrote, Instant::now()), Duration::ZERO);
    }

    #[test]
    fn a_keystroke_makes_the_writer_rest_as_long_as_it_wrote_for_the_window() {
        let (typing, r) = rests();
        typing.typed();
        let now = Instant::now();
        let wrote = Duration::from_micros(400);
        assert_eq!(r.rest_for(wrote, now), wrote);
        // A write the kernel held back is not mirrored in full.
        assert_eq!(r.rest_for(Duration::from_secs(1), now), MAX_REST);
        // Still within the window, and no longer after it.
        let later = now + TYPING_WINDOW - Duration::from_millis(5);
        assert_eq!(r.rest_for(wrote, later), wrote);
        let after = now + TYPING_WINDOW + Duration::from_millis(5);
        assert_eq!(r.rest_for(wrote, after), Duration::ZERO);
    }

    #[test]
    fn the_rests_are_counted_in_seconds() {
        let (typing, r) = rests();
        r.after_write(Duration::from_millis(2));
        assert_eq!(r.rested.get(), 0.0);
        typing.typed();
        r.after_write(Duration::from_millis(2));
        assert!((r.rested.get() - 0.002).abs() < 1e-9, "{}", r.rested.get());
    }

    #[test]
    fn the_first_millisecond_counts_as_typed() {
        // 0 means never: a keystroke at the clock's very start must not read as that.
        let typing = Typing::default();
        typing.typed();
        assert!(typing.lately_at(Instant::now(), TYPING_WINDOW));
    }
}
