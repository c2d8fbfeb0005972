//! Keepalive and liveness of a client WebSocket (`--client-ping-interval`,
//! `--client-ping-timeout`).
//!
//! The writer pings the client every interval, so that gateways which cut connections carrying
//! nothing see traffic, and every answer proves the client is there. The reader notes when the
//! client was last heard from (any bytes: a pong, a ping, data). A client not heard from for an
//! interval plus the timeout is gone: a laptop that closed its lid, a frozen process whose
//! kernel still acknowledges, a gateway that stopped forwarding. The session's owner watches
//! [`Liveness::lost`] beside everything else, so it notices even while a write to the client
//! is stuck.
//!
//! Silence only counts while the reader is listening: a session that stopped reading the
//! client (its stdin queue is full because the upstream is slow) cannot hear the client's pongs
//! behind the data it has not read, and must not blame the client for it. Nor while the proxy
//! itself holds the client's output back ([`Liveness::hold`]: a relay waiting for its
//! recording cannot slip a ping in, so the client has nothing to answer).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::activity_clock::ActivityClock;

/// Keepalive settings of a client WebSocket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// How often the proxy pings the client.
    pub interval: Duration,
    /// How long after a ping was due the client may stay silent before it counts as gone;
    /// `None`: pings keep gateways busy, silence is never held against the client.
    pub timeout: Option<Duration>,
}

impl Keepalive {
    /// How long a client may stay unheard from: a live client answers every ping within a
    /// round trip, so its silence never reaches an interval plus the timeout.
    pub fn silence_allowed(&self) -> Option<Duration> {
        self.timeout.map(|t| self.interval + t)
    }
}

/// What the reader tells the watcher.
#[derive(Debug, Default)]
struct Heard {
    /// When the client was last heard from (or the reader last started listening).
    clock: ActivityClock,
    /// Whether the reader is waiting for the client's bytes.
    listening: AtomicBool,
    /// How many holds of the client's output are in force ([`Liveness::hold`]).
    held: AtomicUsize,
}

/// Whether the client is still there; cheap to clone.
#[derive(Debug, Clone)]
pub struct Liveness {
    heard: Arc<Heard>,
    allowed: Option<Duration>,
}

impl Liveness {
    /// The liveness of a client pinged as `keepalive` says (never lost without a timeout).
    pub fn new(keepalive: Option<Keepalive>) -> Liveness {
        Liveness {
            heard: Arc::default(),
            allowed: keepalive.and_then(|k| k.silence_allowed()),
        }
    }

    /// The client just sent something.
    pub fn heard(&self) {
        self.heard.clock.touch();
    }

    /// The reader waits for the client until the guard is dropped: silence counts meanwhile.
    pub fn listen(&self) -> Listening {
        self.heard.clock.touch();
        self.heard.listening.store(true, Ordering::Relaxed);
        Listening(self.heard.clone())
    }

    /// Resolves once the client has not been heard from, while the reader was listening, for
    /// longer than it may be (never without keepalive); how long it had been silent.
    pub async fn lost(&self) -> Duration {
        let Some(allowed) = self.allowed else {
            return std::future::pending().await;
        };
        loop {
            let silent = self.heard.clock.quiet_for(allowed).await;
            if self.heard.listening.load(Ordering::Relaxed)
                && self.heard.held.load(Ordering::Relaxed) == 0
            {
                return silent;
            }
            // Not listening: the client's answers may be waiting behind unread data. Held: the
            // client was sent nothing it could answer.
            self.heard.clock.touch();
        }
    }

    /// The proxy holds the client's output back until the guard is dropped (a relay waiting for
    /// its recording, unable to ping between frames): the client's silence meanwhile, and for
    /// the allowed silence after, is not held against it.
    pub fn hold(&self) -> Held {
        self.heard.held.fetch_add(1, Ordering::Relaxed);
        Held(self.heard.clone())
    }
}

/// While it lives, the client's output is held back by the proxy.
pub struct Held(Arc<Heard>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.clock.touch();
        self.0.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// While it lives, the reader is waiting for the client.
pub struct Listening(Arc<Heard>);

impl Drop for Listening {
    fn drop(&mut self) {
        self.0.listening.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_allowed_is_interval_plus_timeout() {
        let k = Keepalive {
            interval: Duration::from_secs(30),
            timeout: Some(Duration::from_secs(15)),
        };
        assert_eq!(k.silence_allowed(), Some(Duration::from_secs(45)));
    }

    const K: Keepalive = Keepalive {
        interval: Duration::from_secs(2),
        timeout: Some(Duration::from_secs(3)),
    };

    #[tokio::test(start_paused = true)]
    async fn without_keepalive_a_client_is_never_lost() {
        let l = Liveness::new(None);
        let _listening = l.listen();
        let r = tokio::time::timeout(Duration::from_secs(24 * 3600), l.lost()).await;
        assert!(r.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_listening_reader_that_hears_nothing_loses_the_client() {
        let l = Liveness::new(Some(K));
        let start = tokio::time::Instant::now();
        let _listening = l.listen();
        tokio::time::sleep(Duration::from_secs(4)).await;
        l.heard();
        let silent = l.lost().await;
        assert_eq!(silent, Duration::from_secs(5));
        assert_eq!(start.elapsed(), Duration::from_secs(9));
    }

    #[tokio::test(start_paused = true)]
    async fn silence_while_the_reader_is_not_reading_does_not_count() {
        let l = Liveness::new(Some(K));
        drop(l.listen());
        let watcher = l.clone();
        let lost = tokio::spawn(async move { watcher.lost().await });
        // Parked for a minute (a slow upstream), then listening again and silent.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!lost.is_finished());
        let start = tokio::time::Instant::now();
        let _listening = l.listen();
        lost.await.unwrap();
        let allowed = K.silence_allowed().unwrap();
        assert!(start.elapsed() <= allowed, "{:?}", start.elapsed());
        assert!(
            start.elapsed() >= K.timeout.unwrap(),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn silence_while_the_proxy_holds_the_output_back_does_not_count() {
        let l = Liveness::new(Some(K));
        let _listening = l.listen();
        let watcher = l.clone();
        let lost = tokio::spawn(async move { watcher.lost().await });
        // A relay waits a minute for its recording: nothing went to the client to answer.
        let held = l.hold();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!lost.is_finished());
        // Released and still silent: lost after the allowed silence, counted from the release.
        let start = tokio::time::Instant::now();
        drop(held);
        let silent = lost.await.unwrap();
        let allowed = K.silence_allowed().unwrap();
        assert_eq!(silent, allowed);
        assert_eq!(start.elapsed(), allowed);
    }
}
