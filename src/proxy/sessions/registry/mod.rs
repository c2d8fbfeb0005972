//! Admission and draining of streaming sessions: `--max-sessions` slots, the signals a
//! graceful shutdown sends to every running session, the list of live sessions ([`live`])
//! that operators see and end, who watches it ([`watchers`]), the recordings of those that
//! ended lately ([`ended`]), and the places of those reading recordings ([`readers`]).

pub mod ended;
pub mod live;
pub mod readers;
pub mod watchers;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::proxy::client::connection_deadline::RequestInFlight;
use crate::proxy::route::cluster::Cluster;
use crate::session_stop::SessionStop;

/// Session ids for log lines, unique within one process.
static NEXT_SESSION_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh session id for a log line.
pub fn next_session_id() -> u64 {
    NEXT_SESSION_ID.fetch_add(1, Ordering::Relaxed)
}

/// Counts running sessions, refuses new ones above the limit, and carries the drain signals.
#[derive(Debug)]
pub struct Sessions {
    max: Option<usize>,
    active: AtomicUsize,
    idle: Notify,
    draining: AtomicBool,
    stop: CancellationToken,
    live: Arc<live::LiveSessions>,
    readers: readers::RecordingReaders,
}

/// Why a session was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `--max-sessions` sessions are running.
    Full,
    /// The session's cluster runs its own `max-sessions`.
    ClusterFull,
    /// The proxy is shutting down.
    Draining,
}

impl Sessions {
    /// No more than `max` concurrent sessions (`None`: no limit).
    pub fn new(max: Option<usize>) -> Arc<Sessions> {
        Arc::new(Sessions {
            max,
            active: AtomicUsize::new(0),
            idle: Notify::new(),
            draining: AtomicBool::new(false),
            stop: CancellationToken::new(),
            live: Arc::default(),
            readers: readers::RecordingReaders::default(),
        })
    }

    /// The places of those reading recordings through the sessions API.
    pub fn recording_readers(&self) -> &readers::RecordingReaders {
        &self.readers
    }

    /// The sessions live now, as operators see them.
    pub fn live(&self) -> &Arc<live::LiveSessions> {
        &self.live
    }

    /// Takes a slot for a new session to `cluster`, counted among the proxy's and the
    /// cluster's running sessions and stopped with the cluster's (its stop signal is a child of
    /// the proxy's, [`Sessions::cluster_stop`]); released when the returned guard drops.
    pub fn admit(self: &Arc<Self>, cluster: &Cluster) -> Result<SessionSlot, Refusal> {
        if self.is_draining() {
            return Err(Refusal::Draining);
        }
        if !take_below(&self.active, self.max) {
            return Err(Refusal::Full);
        }
        let mut slot = SessionSlot {
            sessions: self.clone(),
            connection_hold: None,
            cluster_sessions: None,
            stop: SessionStop::child_of(&cluster.stop_token()),
        };
        let count = cluster.session_count();
        // Refused here, the proxy's slot is released as `slot` drops.
        if !take_below(&count, cluster.max_sessions()) {
            return Err(Refusal::ClusterFull);
        }
        slot.cluster_sessions = Some(count);
        Ok(slot)
    }

    /// Sessions running now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// Whether a drain has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Begins a drain: readiness turns off and no new session is admitted.
    pub fn start_drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Tells every running session to end now.
    pub fn stop_all(&self) {
        self.stop.cancel();
    }

    /// A stop signal for one cluster's sessions: fired by [`Sessions::stop_all`] too, or on its
    /// own when the cluster leaves the configuration.
    pub fn cluster_stop(&self) -> CancellationToken {
        self.stop.child_token()
    }

    /// Resolves once no session is running.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.active() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Adds one to `counter` unless it is already at `max` (`None`: no limit); whether it did.
fn take_below(counter: &AtomicUsize, max: Option<usize>) -> bool {
    let mut current = counter.load(Ordering::Acquire);
    loop {
        if max.is_some_and(|max| current >= max) {
            return false;
        }
        match counter.compare_exchange_weak(
            current,
            current + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return true,
            Err(now) => current = now,
        }
    }
}

/// One admitted session; dropping it frees the slot.
#[derive(Debug)]
pub struct SessionSlot {
    sessions: Arc<Sessions>,
    /// An HTTP/2 session is a stream of a connection that stays open for it: the connection
    /// counts it as a request in flight (its idle clock stopped) for as long as it runs.
    connection_hold: Option<RequestInFlight>,
    /// The running sessions of the session's cluster, which count it while it runs.
    cluster_sessions: Option<Arc<AtomicUsize>>,
    /// Fires when the session must end now: the proxy's stop, its cluster's, or an operator's
    /// termination of this session alone.
    stop: SessionStop,
}

impl SessionSlot {
    /// The slot, keeping `hold` (the session's place on its client connection) until it
    /// drops.
    pub fn holding(mut self, hold: Option<RequestInFlight>) -> SessionSlot {
        self.connection_hold = hold;
        self
    }

    /// Fires when the session must end now: a shutdown's drain timeout has passed, or that of
    /// its cluster leaving the configuration, or an operator terminated it; it says which.
    pub fn stop(&self) -> SessionStop {
        self.stop.clone()
    }
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        if let Some(count) = &self.cluster_sessions {
            count.fetch_sub(1, Ordering::AcqRel);
        }
        if self.sessions.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.sessions.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::auth::Authenticator;
    use crate::proxy::upstream::endpoint::{Upstream, UpstreamTls};

    fn cluster(port: u16) -> Cluster {
        let url = format!("http://127.0.0.1:{port}");
        Cluster::new(
            None,
            Upstream::from_url(&url, UpstreamTls::default()).unwrap(),
            Authenticator::passthrough(),
            Default::default(),
        )
    }

    #[tokio::test]
    async fn limit_drain_and_idle() {
        let s = Sessions::new(Some(2));
        let on = cluster(1);
        let a = s.admit(&on).unwrap();
        let b = s.admit(&on).unwrap();
        assert_eq!(s.admit(&on).unwrap_err(), Refusal::Full);
        drop(a);
        let c = s.admit(&on).unwrap();
        s.start_drain();
        assert_eq!(s.admit(&on).unwrap_err(), Refusal::Draining);
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.wait_idle().await }
        });
        drop(b);
        assert!(!waiter.is_finished());
        drop(c);
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(s.active(), 0);
    }

    #[test]
    fn a_cluster_stops_its_own_sessions_and_a_shutdown_stops_all() {
        let s = Sessions::new(None);
        let a = cluster(1).stopped_by(s.cluster_stop());
        let b = cluster(2).stopped_by(s.cluster_stop());
        let on_a = s.admit(&a).unwrap();
        let on_b = s.admit(&b).unwrap();
        a.stop_sessions();
        assert!(on_a.stop().is_stopped());
        assert!(!on_b.stop().is_stopped());
        s.stop_all();
        assert!(on_b.stop().is_stopped());
    }

    #[test]
    fn a_cluster_runs_at_most_its_own_max_sessions_and_the_proxys() {
        let s = Sessions::new(Some(3));
        let small = cluster(1).with_max_sessions(Some(1));
        let other = cluster(2);
        let first = s.admit(&small).unwrap();
        assert_eq!(s.admit(&small).unwrap_err(), Refusal::ClusterFull);
        // The refused one held no slot of the proxy's, nor of the cluster's.
        assert_eq!((s.active(), small.active_sessions()), (1, 1));
        let o1 = s.admit(&other).unwrap();
        let _o2 = s.admit(&other).unwrap();
        assert_eq!(s.admit(&other).unwrap_err(), Refusal::Full);
        drop(first);
        assert_eq!(small.active_sessions(), 0);
        // Its own room back, the proxy's taken by another cluster: the proxy's limit holds.
        let _o3 = s.admit(&other).unwrap();
        assert_eq!(s.admit(&small).unwrap_err(), Refusal::Full);
        drop(o1);
        let _again = s.admit(&small).unwrap();
        assert_eq!(
            (s.active(), small.active_sessions(), other.active_sessions()),
            (3, 1, 2)
        );
    }
}
