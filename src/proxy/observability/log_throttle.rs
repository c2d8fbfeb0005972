//! Aggregation of repeated log lines: a caller who can make the proxy log once per request
//! (a refused request, say) must not be able to fill the disk or drown the lines operators
//! need. Per kind of event the first occurrence is logged; after that at most one line per
//! interval, carrying how many of the same kind were left unlogged since the previous line.
//!
//! Kinds are `&'static str` (a fixed set in the program text), so the table stays as small
//! as the number of kinds whatever the traffic. The lock is a plain mutex held only to read
//! and bump one entry, never across an `.await`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often, at most, one kind of event is logged by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// What to do with one occurrence of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Log it, saying that `suppressed` earlier occurrences of its kind were not logged.
    Log { suppressed: u64 },
    /// Count it and log nothing.
    Suppress,
}

/// One kind's state: when it was last logged, and how many occurrences since then were not.
#[derive(Debug, Clone, Copy)]
struct Window {
    logged_at: Instant,
    suppressed: u64,
}

/// Decides which occurrences of each kind of event are logged (see the module docs).
#[derive(Debug)]
pub struct LogThrottle {
    interval: Duration,
    windows: Mutex<HashMap<&'static str, Window>>,
}

impl Default for LogThrottle {
    fn default() -> Self {
        LogThrottle::new(DEFAULT_INTERVAL)
    }
}

impl LogThrottle {
    /// A throttle that logs each kind at most once per `interval`.
    pub fn new(interval: Duration) -> Self {
        LogThrottle {
            interval,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Whether an occurrence of `kind` now is logged.
    pub fn check(&self, kind: &'static str) -> Verdict {
        self.check_at(kind, Instant::now())
    }

    /// [`LogThrottle::check`] at a given time (tests drive the clock).
    pub fn check_at(&self, kind: &'static str, now: Instant) -> Verdict {
        // A panic elsewhere while holding the lock leaves counts that are still usable.
        let mut windows = self
            .windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match windows.get_mut(kind) {
            None => {
                windows.insert(
                    kind,
                    Window {
                        logged_at: now,
                        suppressed: 0,
                    },
                );
                Verdict::Log { suppressed: 0 }
            }
            Some(w) if now.saturating_duration_since(w.logged_at) >= self.interval => {
                let suppressed = std::mem::take(&mut w.suppressed);
                w.logged_at = now;
                Verdict::Log { suppressed }
            }
            Some(w) => {
                w.suppressed = w.suppressed.saturating_add(1);
                Verdict::Suppress
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_is_logged_then_one_line_per_interval_with_the_count() {
        let t = LogThrottle::new(Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(t.check_at("a", start), Verdict::Log { suppressed: 0 });
        for ms in 1..=1000u64 {
            assert_eq!(
                t.check_at("a", start + Duration::from_millis(ms)),
                Verdict::Suppress
            );
        }
        assert_eq!(
            t.check_at("a", start + Duration::from_secs(10)),
            Verdict::Log { suppressed: 1000 }
        );
        // The count starts again after each line.
        assert_eq!(
            t.check_at("a", start + Duration::from_secs(11)),
            Verdict::Suppress
        );
        assert_eq!(
            t.check_at("a", start + Duration::from_secs(25)),
            Verdict::Log { suppressed: 1 }
        );
    }

    #[test]
    fn kinds_are_counted_apart() {
        let t = LogThrottle::new(Duration::from_secs(10));
        let now = Instant::now();
        assert_eq!(t.check_at("a", now), Verdict::Log { suppressed: 0 });
        assert_eq!(t.check_at("b", now), Verdict::Log { suppressed: 0 });
        assert_eq!(t.check_at("a", now), Verdict::Suppress);
        assert_eq!(t.check_at("b", now), Verdict::Suppress);
        assert_eq!(t.windows.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_flood_logs_a_bounded_number_of_lines() {
        let t = LogThrottle::new(Duration::from_secs(1));
        let start = Instant::now();
        // 100,000 events over 10 s: the first, then one line a second.
        let logged = (0..100_000u64)
            .filter(|i| {
                let at = start + Duration::from_micros(i * 100);
                matches!(t.check_at("flood", at), Verdict::Log { .. })
            })
            .count();
        assert!((10..=11).contains(&logged), "{logged} lines");
    }

    #[test]
    fn a_clock_that_goes_back_suppresses_rather_than_panics() {
        let t = LogThrottle::new(Duration::from_secs(1));
        let now = Instant::now() + Duration::from_secs(5);
        t.check_at("a", now);
        assert_eq!(
            t.check_at("a", now - Duration::from_secs(3)),
            Verdict::Suppress
        );
    }
}
