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

use crate::audit::SessionInfo;
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
}

/// The live sessions of this replica, all clusters together.
#[derive(Debug, Default)]
pub struct LiveSessions {
    /// By the session's number (its id's counter), so that a listing is in start order.
    entries: Mutex<BTreeMap<u64, Arc<LiveSession>>>,
    /// Bumped on every change: the list's `resourceVersion`.
    version: AtomicU64,
}

/// A session's place on the list; dropping it takes the session off.
#[derive(Debug)]
pub struct Listing {
    live: Arc<LiveSessions>,
    number: u64,
}

impl Drop for Listing {
    fn drop(&mut self) {
        if self.live.lock().remove(&self.number).is_some() {
            self.live.version.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl LiveSessions {
    /// Lists session `number`, described by `info`, ended through `stop`, until the returned
    /// [`Listing`] drops.
    pub fn list(self: &Arc<Self>, number: u64, info: SessionInfo, stop: SessionStop) -> Listing {
        let session = Arc::new(LiveSession {
            info,
            started: SystemTime::now(),
            stop,
        });
        self.lock().insert(number, session);
        self.version.fetch_add(1, Ordering::AcqRel);
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
            .filter(|s| s.info.cluster.as_deref() == cluster)
            .filter(|s| namespace.is_none_or(|ns| s.info.namespace == ns))
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
