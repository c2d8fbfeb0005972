//! The sessions live on this replica, as the sessions API lists, shows and ends them. A
//! session is listed from the moment its audit trail starts (the caller identified, its
//! recording open, before anything of it goes upstream) until its end; its [`Listing`] is held
//! by its `Running` and takes it off the list when dropped, whichever way the session ends.
//!
//! Each entry holds what the session's audit events say of it (a few hundred bytes) and its
//! stop signal, through which an operator ends it. Changes are numbered (the list's
//! `resourceVersion`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use tokio::sync::broadcast;

use crate::audit::{ProtocolPath, SessionInfo};
use crate::session_stop::SessionStop;

/// One live session.
#[derive(Debug)]
pub struct LiveSession {
    /// What its audit events say of it (its id, cluster, pod, caller, command, path).
    pub info: SessionInfo,
    /// When it was admitted.
    pub started: SystemTime,
    /// Its stop signal: what a terminate fires.
    pub stop: SessionStop,
    /// The path and protocol it took, once the upstream's answer decided them (`info` says
    /// what was known at its start: `auto` under `--upstream-streaming auto`).
    agreed: Mutex<Option<(ProtocolPath, Option<String>)>>,
}

impl LiveSession {
    /// A session described by `info`, ended through `stop`, starting now.
    pub fn new(info: SessionInfo, stop: SessionStop) -> LiveSession {
        LiveSession {
            info,
            started: SystemTime::now(),
            stop,
            agreed: Mutex::new(None),
        }
    }

    /// The path it took, and the protocol it speaks where known.
    pub fn path(&self) -> (ProtocolPath, Option<String>) {
        let agreed = self.agreed.lock().unwrap_or_else(|e| e.into_inner());
        match &*agreed {
            Some((path, protocol)) => (*path, protocol.clone()),
            None => (self.info.protocol_path, self.info.protocol.clone()),
        }
    }

    /// It took `path`, speaking `protocol` (where known).
    pub fn agreed(&self, path: ProtocolPath, protocol: Option<String>) {
        *self.agreed.lock().unwrap_or_else(|e| e.into_inner()) = Some((path, protocol));
    }

    /// Whether it is a session of `cluster` in `namespace` (`None`: any).
    pub fn is_in(&self, cluster: Option<&str>, namespace: Option<&str>) -> bool {
        self.info.cluster.as_deref() == cluster
            && namespace.is_none_or(|ns| self.info.namespace == ns)
    }
}

/// The live sessions of this replica, all clusters together.
#[derive(Debug)]
pub struct LiveSessions {
    /// By the session's number (its id's counter), so that a listing is in start order.
    entries: Mutex<BTreeMap<u64, Arc<LiveSession>>>,
    /// Bumped on every change: the list's `resourceVersion`.
    version: AtomicU64,
    /// Every change, to the watches ([`LiveSessions::watch`]).
    changes: broadcast::Sender<Change>,
}

impl Default for LiveSessions {
    fn default() -> Self {
        LiveSessions {
            entries: Mutex::default(),
            version: AtomicU64::new(0),
            changes: broadcast::channel(WATCH_BACKLOG).0,
        }
    }
}

/// How many changes a watch may fall behind before it is ended (its client lists again, as
/// after any watch's end): what a slow watcher makes the proxy hold is bounded.
pub const WATCH_BACKLOG: usize = 1024;

/// What happened to a live session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    /// An operator terminated it (it is ending).
    Modified,
    Deleted,
}

/// A change, as a watch sees it.
#[derive(Debug, Clone)]
pub struct Change {
    pub kind: ChangeKind,
    pub session: Arc<LiveSession>,
    /// The list's version after it.
    pub version: u64,
}

/// Changes from a [`LiveSessions::watch`]: the sessions live when it began, then every change.
pub type Changes = broadcast::Receiver<Change>;

/// A session's place on the list; dropping it takes the session off.
#[derive(Debug)]
pub struct Listing {
    live: Arc<LiveSessions>,
    number: u64,
}

impl Listing {
    /// The listed session.
    pub fn session(&self) -> Option<Arc<LiveSession>> {
        self.live.lock().get(&self.number).cloned()
    }
}

impl Drop for Listing {
    fn drop(&mut self) {
        let mut entries = self.live.lock();
        if let Some(session) = entries.remove(&self.number) {
            self.live.changed(ChangeKind::Deleted, session);
        }
    }
}

impl LiveSessions {
    /// Lists session `number`, described by `info`, ended through `stop`, until the returned
    /// [`Listing`] drops.
    pub fn list(self: &Arc<Self>, number: u64, info: SessionInfo, stop: SessionStop) -> Listing {
        let session = Arc::new(LiveSession::new(info, stop));
        let mut entries = self.lock();
        entries.insert(number, session.clone());
        self.changed(ChangeKind::Added, session);
        drop(entries);
        Listing {
            live: self.clone(),
            number,
        }
    }

    /// The sessions of cluster `cluster` (`None`: the unnamed upstream) in `namespace`
    /// (`None`: all), in the order they started, and the list's version.
    pub fn of(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
    ) -> (Vec<Arc<LiveSession>>, u64) {
        let entries = self.lock();
        let version = self.version.load(Ordering::Acquire);
        let sessions = entries
            .values()
            .filter(|s| s.is_in(cluster, namespace))
            .cloned()
            .collect();
        (sessions, version)
    }

    /// The session whose id is `id` in cluster `cluster` and `namespace`, if it is live.
    pub fn find(
        &self,
        cluster: Option<&str>,
        namespace: &str,
        id: &str,
    ) -> Option<Arc<LiveSession>> {
        self.lock()
            .values()
            .find(|s| {
                s.info.session_id == id
                    && s.info.namespace == namespace
                    && s.info.cluster.as_deref() == cluster
            })
            .cloned()
    }

    /// Tells the watches that `session` changed (an operator terminated it).
    pub fn modified(&self, session: &Arc<LiveSession>) {
        let _entries = self.lock();
        self.changed(ChangeKind::Modified, session.clone());
    }

    /// The sessions of `cluster` in `namespace` (as [`LiveSessions::of`]) and every change
    /// from then on, none lost between the two.
    pub fn watch(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
    ) -> (Vec<Arc<LiveSession>>, Changes) {
        let entries = self.lock();
        let changes = self.changes.subscribe();
        let sessions = entries
            .values()
            .filter(|s| s.is_in(cluster, namespace))
            .cloned()
            .collect();
        (sessions, changes)
    }

    /// Numbers a change and tells the watches; called with the entries locked, so that
    /// watches see changes in their order.
    fn changed(&self, kind: ChangeKind, session: Arc<LiveSession>) {
        let version = self.version.fetch_add(1, Ordering::AcqRel) + 1;
        // No watch: nobody to tell.
        let _ = self.changes.send(Change {
            kind,
            session,
            version,
        });
    }

    /// How many sessions are listed.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<LiveSession>>> {
        // Entries are inserted and removed whole: a panic elsewhere cannot leave one half-made.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, cluster: Option<&str>, namespace: &str) -> SessionInfo {
        SessionInfo {
            session_id: id.into(),
            cluster: cluster.map(str::to_owned),
            namespace: namespace.into(),
            ..crate::audit::event::tests::info()
        }
    }

    #[test]
    fn a_session_is_listed_until_its_listing_drops() {
        let live = Arc::new(LiveSessions::default());
        let a = live.list(1, info("r-1", None, "a"), SessionStop::default());
        let b = live.list(2, info("r-2", Some("prod"), "a"), SessionStop::default());
        let _c = live.list(3, info("r-3", None, "b"), SessionStop::default());
        let names = |s: Vec<Arc<LiveSession>>| -> Vec<String> {
            s.iter().map(|s| s.info.session_id.clone()).collect()
        };
        let (all, v1) = live.of(None, None);
        assert_eq!(names(all), ["r-1", "r-3"]);
        assert_eq!(names(live.of(None, Some("a")).0), ["r-1"]);
        assert_eq!(names(live.of(Some("prod"), None).0), ["r-2"]);
        // Another cluster's session is not found by its id, nor one in another namespace.
        assert!(live.find(None, "a", "r-2").is_none());
        assert!(live.find(None, "b", "r-1").is_none());
        assert!(live.find(None, "a", "r-1").is_some());
        drop(a);
        drop(b);
        let (left, v2) = live.of(None, None);
        assert_eq!(names(left), ["r-3"]);
        assert!(v2 > v1);
        assert_eq!(live.len(), 1);
    }

    #[test]
    fn a_watch_sees_what_was_there_then_each_change_in_order() {
        let live = Arc::new(LiveSessions::default());
        let a = live.list(1, info("r-1", None, "a"), SessionStop::default());
        let (now, mut changes) = live.watch(None, None);
        assert_eq!(now.len(), 1);
        let b = live.list(2, info("r-2", None, "a"), SessionStop::default());
        live.modified(&now[0]);
        drop(a);
        drop(b);
        let seen: Vec<(ChangeKind, String)> = std::iter::from_fn(|| changes.try_recv().ok())
            .map(|c| (c.kind, c.session.info.session_id.clone()))
            .collect();
        assert_eq!(
            seen,
            [
                (ChangeKind::Added, "r-2".to_owned()),
                (ChangeKind::Modified, "r-1".to_owned()),
                (ChangeKind::Deleted, "r-1".to_owned()),
                (ChangeKind::Deleted, "r-2".to_owned()),
            ]
        );
    }

    #[test]
    fn a_watch_that_falls_behind_is_told_so() {
        let live = Arc::new(LiveSessions::default());
        let (_, mut changes) = live.watch(None, None);
        for n in 0..(WATCH_BACKLOG as u64 + 10) {
            drop(live.list(n, info("r", None, "a"), SessionStop::default()));
        }
        assert!(matches!(
            changes.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(_))
        ));
    }
}
