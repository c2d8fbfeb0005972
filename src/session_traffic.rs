//! What one session has carried so far and when it last carried anything, as the sessions API
//! shows it (`bytesFromClient`, `bytesToClient`, `lastActivity`, `idleSeconds`): shared by the
//! session's runner, which counts every chunk or frame it passes on, once, where it passes it
//! on, and the registry of live sessions, which reads it when asked.
//!
//! Counting is two relaxed atomic operations and one clock read per chunk: no lock, no
//! allocation, nothing that waits. The activity clock is coarse (whole seconds after the
//! session's start): a status read by people needs no finer one, and the idle timeouts keep
//! their own millisecond [`ActivityClock`](crate::activity_clock::ActivityClock)s. The byte
//! counts are what the session's `ended` audit event and its metrics report at its end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// One session's byte counts each way and its activity clock.
#[derive(Debug)]
pub struct SessionTraffic {
    /// When the session started (admitted), on both clocks.
    started: Instant,
    started_wall: SystemTime,
    from_client: AtomicU64,
    to_client: AtomicU64,
    /// Whole seconds after `started` of the latest chunk either way.
    last_secs: AtomicU64,
}

impl Default for SessionTraffic {
    fn default() -> Self {
        SessionTraffic::new()
    }
}

impl SessionTraffic {
    /// A session starting now, that has carried nothing.
    pub fn new() -> SessionTraffic {
        SessionTraffic::started_at(Instant::now(), SystemTime::now())
    }

    /// A session that started at `started` (`wall` on the wall clock).
    pub fn started_at(started: Instant, wall: SystemTime) -> SessionTraffic {
        SessionTraffic {
            started,
            started_wall: wall,
            from_client: AtomicU64::new(0),
            to_client: AtomicU64::new(0),
            last_secs: AtomicU64::new(0),
        }
    }

    /// `n` bytes went from the client towards the upstream, now.
    #[inline]
    pub fn from_client(&self, n: usize) {
        self.from_client.fetch_add(n as u64, Ordering::Relaxed);
        self.touch();
    }

    /// `n` bytes went from the upstream towards the client, now.
    #[inline]
    pub fn to_client(&self, n: usize) {
        self.to_client.fetch_add(n as u64, Ordering::Relaxed);
        self.touch();
    }

    /// Notes activity now. Read first: while bytes flow the second changes once a second, so
    /// nearly every chunk costs a load only; the clock moves on with a `fetch_max`, never back
    /// (two directions on two threads may race at a second's turn).
    #[inline]
    fn touch(&self) {
        let secs = self.started.elapsed().as_secs();
        if self.last_secs.load(Ordering::Relaxed) < secs {
            self.last_secs.fetch_max(secs, Ordering::Relaxed);
        }
    }

    /// Bytes from the client so far.
    pub fn bytes_from_client(&self) -> u64 {
        self.from_client.load(Ordering::Relaxed)
    }

    /// Bytes to the client so far.
    pub fn bytes_to_client(&self) -> u64 {
        self.to_client.load(Ordering::Relaxed)
    }

    /// When the session started, on the wall clock.
    pub fn started(&self) -> SystemTime {
        self.started_wall
    }

    /// When it last carried a byte (its start if it never did), to the second.
    pub fn last_activity(&self) -> SystemTime {
        self.started_wall + Duration::from_secs(self.last_secs.load(Ordering::Relaxed))
    }

    /// Whole seconds since it last carried a byte (since its start if it never did).
    pub fn idle_seconds(&self) -> u64 {
        let now = self.started.elapsed().as_secs();
        now.saturating_sub(self.last_secs.load(Ordering::Relaxed))
    }

    /// Both counts together: what changes when the session carries anything.
    pub fn moved(&self) -> (u64, u64) {
        (self.bytes_from_client(), self.bytes_to_client())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started_secs_ago(secs: u64) -> SessionTraffic {
        let ago = Duration::from_secs(secs);
        SessionTraffic::started_at(Instant::now() - ago, SystemTime::UNIX_EPOCH)
    }

    #[test]
    fn counts_each_way_apart() {
        let t = SessionTraffic::new();
        t.from_client(5);
        t.to_client(7);
        t.to_client(3);
        assert_eq!((t.bytes_from_client(), t.bytes_to_client()), (5, 10));
        assert_eq!(t.moved(), (5, 10));
    }

    #[test]
    fn idle_is_counted_from_the_start_until_the_first_byte() {
        let t = started_secs_ago(30);
        assert!(t.idle_seconds() >= 30);
        assert_eq!(t.last_activity(), SystemTime::UNIX_EPOCH);
        t.from_client(1);
        assert_eq!(t.idle_seconds(), 0);
        let last = t.last_activity();
        assert!(last >= SystemTime::UNIX_EPOCH + Duration::from_secs(30));
        assert!(last <= SystemTime::UNIX_EPOCH + Duration::from_secs(31));
    }

    #[test]
    fn the_clock_only_moves_on() {
        let t = started_secs_ago(10);
        t.to_client(1);
        let first = t.last_activity();
        // A writer whose clock read was older than another's store cannot move it back.
        t.last_secs.store(20, Ordering::Relaxed);
        t.from_client(1);
        assert_eq!(
            t.last_activity(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(20)
        );
        assert!(t.last_activity() > first);
    }

    #[test]
    fn counts_from_many_threads_add_up() {
        let t = std::sync::Arc::new(SessionTraffic::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        t.from_client(2);
                        t.to_client(1);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(t.moved(), (8000, 4000));
    }
}
