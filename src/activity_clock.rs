//! When something last happened on a session, readable from any task: the client's last bytes
//! (liveness, `--client-ping-timeout`) and the session's last data (`--stream-idle-timeout`).
//!
//! Noting activity is one clock read and one relaxed atomic store, cheap enough for every read
//! of the hot path; nobody re-arms a timer per byte. A watcher sleeps until the earliest moment
//! the quiet period could be over, looks again, and sleeps on if something happened meanwhile.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The time of the latest activity, shared between the tasks that note it and a watcher.
#[derive(Debug)]
pub struct ActivityClock {
    base: Instant,
    /// Milliseconds after `base`.
    last_ms: AtomicU64,
}

impl Default for ActivityClock {
    fn default() -> Self {
        ActivityClock::new()
    }
}

impl ActivityClock {
    /// A clock whose latest activity is now.
    pub fn new() -> ActivityClock {
        ActivityClock {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    /// Something happened now.
    pub fn touch(&self) {
        let ms = self.base.elapsed().as_millis() as u64;
        // Millisecond resolution: a watcher may wake up to a millisecond late, never early.
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// When the latest activity was.
    pub fn last(&self) -> Instant {
        self.base + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// Resolves once nothing happened for `quiet`; how long it had then been quiet.
    pub async fn quiet_for(&self, quiet: Duration) -> Duration {
        loop {
            let deadline = self.last() + quiet;
            let now = Instant::now();
            if now >= deadline {
                return now - self.last();
            }
            tokio::time::sleep_until(deadline).await;
        }
    }

    /// [`quiet_for`](Self::quiet_for) a limit that may be unset: without one, never resolves
    /// (a timeout that is off is a branch of the session's `select!` that never wins).
    pub async fn quiet_for_limit(&self, limit: Option<Duration>) -> Duration {
        match limit {
            Some(quiet) => self.quiet_for(quiet).await,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn quiet_for_waits_out_every_touch() {
        let clock = std::sync::Arc::new(ActivityClock::new());
        let start = Instant::now();
        let toucher = clock.clone();
        tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_secs(2)).await;
                toucher.touch();
            }
        });
        let quiet = clock.quiet_for(Duration::from_secs(3)).await;
        // The last touch was at 10 s; 3 s of quiet after it.
        assert_eq!(start.elapsed(), Duration::from_secs(13));
        assert_eq!(quiet, Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn last_moves_only_with_touches() {
        let clock = ActivityClock::new();
        let start = clock.last();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(clock.last(), start);
        clock.touch();
        assert_eq!(clock.last() - start, Duration::from_secs(3));
    }
}
