//! The sessions live on this replica, as the sessions API lists, shows and ends them. A
//! session is listed from the moment its audit trail starts (the caller identified, its
//! recording open, before anything of it goes upstream) until its end; its [`Listing`] is held
//! by its `Running` and takes it off the list when dropped, whichever way the session ends.
//!
//! Each entry shares with the session what its audit events say of it (one [`SessionInfo`],
//! cut to the audit's caps, held once by both), its traffic counter (counted by its runner)
//! and its stop signal, through which an operator ends it: a few hundred bytes of its own
//! (`benches/registry_memory.rs`), and a recorded session's feed, through which operators
//! follow its recording. Changes are numbered (the list's `resourceVersion`). A recorded
//! session's feed outlives it in [`EndedRecordings`], so that its recording stays readable by
//! id.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::broadcast;

use super::ended::EndedRecordings;
use super::watchers::Watchers;
use crate::audit::recording::RecordingFeed;
use crate::audit::{ProtocolPath, SessionInfo};
use crate::session_stop::SessionStop;
use crate::session_traffic::SessionTraffic;

/// One live session.
#[derive(Debug)]
pub struct LiveSession {
    /// Its number on this replica (the last part of its id).
    pub number: u64,
    /// What its audit events say of it (its id, cluster, pod, caller, command, path), shared
    /// with its audit trail.
    pub info: Arc<SessionInfo>,
    /// What it carried each way and when it last did, counted by its runner.
    pub traffic: Arc<SessionTraffic>,
    /// Its stop signal: what a terminate fires.
    pub stop: SessionStop,
    /// Its recording as followers read it, if it is recorded.
    pub recording: Option<RecordingFeed>,
    /// The list's version that added it: a watch that has not seen that change yet does not
    /// tell of its traffic.
    added: u64,
    /// Its bytes (both ways together) as the latest traffic refresh saw them, and the refresh
    /// that last saw them move ([`LiveSessions::refresh_traffic`]).
    reported: AtomicU64,
    moved_in: AtomicU64,
    /// The path and protocol it took, once the upstream's answer decided them (`info` says
    /// what was known at its start: `auto` under `--upstream-streaming auto`).
    agreed: Mutex<Option<(ProtocolPath, Option<String>)>>,
}

impl LiveSession {
    /// Session `number`, described by `info`, counted on `traffic`, ended through `stop`.
    pub fn new(
        number: u64,
        info: Arc<SessionInfo>,
        traffic: Arc<SessionTraffic>,
        stop: SessionStop,
    ) -> LiveSession {
        LiveSession {
            number,
            info,
            traffic,
            stop,
            recording: None,
            added: 0,
            reported: AtomicU64::new(0),
            moved_in: AtomicU64::new(0),
            agreed: Mutex::new(None),
        }
    }

    /// The same session, recorded as `feed` says (`None`: not recorded).
    pub fn recorded(self, feed: Option<RecordingFeed>) -> LiveSession {
        LiveSession {
            recording: feed,
            ..self
        }
    }

    /// Whether a watch that has seen the list's changes up to `version` and the traffic
    /// refreshes up to `refresh` should tell of its traffic: it knows the session, and the
    /// session moved bytes since.
    pub fn moved_since(&self, version: u64, refresh: u64) -> bool {
        self.added <= version && self.moved_in.load(Ordering::Relaxed) > refresh
    }

    /// When it was admitted.
    pub fn started(&self) -> SystemTime {
        self.traffic.started()
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
    /// The watches running, per caller and in all ([`LiveSessions::watchers`]).
    watchers: Watchers,
    /// The latest traffic refresh: when, and its number ([`LiveSessions::refresh_traffic`]).
    refreshed: Mutex<(Option<Instant>, u64)>,
    /// The recordings of the sessions that ended last.
    ended: EndedRecordings,
}

impl Default for LiveSessions {
    fn default() -> Self {
        LiveSessions {
            entries: Mutex::default(),
            version: AtomicU64::new(0),
            changes: broadcast::channel(WATCH_BACKLOG).0,
            watchers: Watchers::default(),
            refreshed: Mutex::new((None, 0)),
            ended: EndedRecordings::default(),
        }
    }
}

/// How often watches tell of sessions' traffic: at most once per this time a session whose
/// bytes moved is sent again (`MODIFIED`), however much it carries; an idle one is not.
pub const TRAFFIC_REFRESH: Duration = Duration::from_secs(5);

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
        let Some(session) = entries.remove(&self.number) else {
            return;
        };
        // Remembered before the session leaves the list: a reader never finds it in neither.
        if let Some(feed) = &session.recording {
            let info = &session.info;
            let ended = &self.live.ended;
            ended.ended(
                info.cluster.as_deref(),
                &info.namespace,
                &info.session_id,
                feed.clone(),
            );
        }
        self.live.changed(ChangeKind::Deleted, session);
    }
}

/// What the list knows of a session's recording.
#[derive(Debug, Clone)]
pub enum RecordingLookup {
    /// The session is live or ended lately, and recorded: its recording.
    Recorded(RecordingFeed),
    /// The session is live and not recorded.
    NotRecorded,
    /// The session is neither live nor among those that ended lately.
    Unknown,
}

impl LiveSessions {
    /// Lists `session` (numbered as its `number` says) until the returned [`Listing`] drops.
    pub fn list(self: &Arc<Self>, mut session: LiveSession) -> Listing {
        let number = session.number;
        let mut entries = self.lock();
        // Its own change's version: the next one, numbered under the same lock.
        session.added = self.version.load(Ordering::Acquire) + 1;
        let session = Arc::new(session);
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

    /// The session whose id is `id` in cluster `cluster` and `namespace`, if it is live. The
    /// id is read as a session id (`<replica>-<number>`, [`read_id`]), not compared as text:
    /// `ABCD0123-07` names the session `abcd0123-7`; one of another replica is not here.
    pub fn find(
        &self,
        cluster: Option<&str>,
        namespace: &str,
        id: &str,
    ) -> Option<Arc<LiveSession>> {
        let number = read_id(id, crate::audit::instance::instance_id())?;
        self.lock()
            .get(&number)
            .filter(|s| s.info.namespace == namespace && s.info.cluster.as_deref() == cluster)
            .cloned()
    }

    /// The recording of session `id` of `cluster` in `namespace`: a live session's, or one
    /// that ended lately. The id is read as [`LiveSessions::find`] reads it.
    pub fn recording(&self, cluster: Option<&str>, namespace: &str, id: &str) -> RecordingLookup {
        if let Some(session) = self.find(cluster, namespace, id) {
            return match &session.recording {
                Some(feed) => RecordingLookup::Recorded(feed.clone()),
                None => RecordingLookup::NotRecorded,
            };
        }
        let Some(number) = read_id(id, crate::audit::instance::instance_id()) else {
            return RecordingLookup::Unknown;
        };
        let id = crate::audit::instance::session_id(number);
        match self.ended.find(cluster, namespace, &id) {
            Some(feed) => RecordingLookup::Recorded(feed),
            None => RecordingLookup::Unknown,
        }
    }

    /// Who watches, bounded per caller and in all.
    pub fn watchers(&self) -> &Watchers {
        &self.watchers
    }

    /// Tells the watches that `session` changed (an operator terminated it).
    pub fn modified(&self, session: &Arc<LiveSession>) {
        let _entries = self.lock();
        self.changed(ChangeKind::Modified, session.clone());
    }

    /// The sessions of `cluster` in `namespace` (as [`LiveSessions::of`]), the list's version
    /// then, and every change from then on, none lost between the two.
    pub fn watch(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
    ) -> (Vec<Arc<LiveSession>>, u64, Changes) {
        let entries = self.lock();
        let changes = self.changes.subscribe();
        let version = self.version.load(Ordering::Acquire);
        let sessions = entries
            .values()
            .filter(|s| s.is_in(cluster, namespace))
            .cloned()
            .collect();
        (sessions, version, changes)
    }

    /// The number of the latest traffic refresh, made now first if the last one is
    /// [`TRAFFIC_REFRESH`] old: each live session whose bytes moved since the one before is
    /// marked with it. Made by the first watch to ask in each period (nobody watching, none
    /// is made): one look at two counters per session, whatever the number of watches.
    pub fn refresh_traffic(&self, now: Instant) -> u64 {
        let mut refreshed = self.refreshed.lock().unwrap_or_else(|e| e.into_inner());
        let (at, number) = *refreshed;
        if at.is_some_and(|at| now < at + TRAFFIC_REFRESH) {
            return number;
        }
        let number = number + 1;
        for session in self.lock().values() {
            let (from, to) = session.traffic.moved();
            let total = from.wrapping_add(to);
            if session.reported.swap(total, Ordering::Relaxed) != total {
                session.moved_in.store(number, Ordering::Relaxed);
            }
        }
        *refreshed = (Some(now), number);
        number
    }

    /// The sessions of `cluster` in `namespace` a watch that has seen the list up to
    /// `version` and the traffic refreshes up to `refresh` should tell of again.
    pub fn moved(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        version: u64,
        refresh: u64,
    ) -> Vec<Arc<LiveSession>> {
        self.lock()
            .values()
            .filter(|s| s.is_in(cluster, namespace) && s.moved_since(version, refresh))
            .cloned()
            .collect()
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

/// The number of the session `id` names if it is one of replica `replica`'s: `<replica>-<n>`,
/// the replica's hex id in either case, `n` in decimal digits (leading zeros allowed).
pub fn read_id(id: &str, replica: &str) -> Option<u64> {
    let (of, number) = id.rsplit_once('-')?;
    if !of.eq_ignore_ascii_case(replica) || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    number.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::instance::{instance_id, session_id};

    fn info(n: u64, cluster: Option<&str>, namespace: &str) -> Arc<SessionInfo> {
        Arc::new(SessionInfo {
            session_id: session_id(n),
            cluster: cluster.map(str::to_owned),
            namespace: namespace.into(),
            ..crate::audit::event::tests::info()
        })
    }

    fn listed(n: u64, cluster: Option<&str>, ns: &str) -> LiveSession {
        let traffic = Arc::new(SessionTraffic::new());
        LiveSession::new(n, info(n, cluster, ns), traffic, SessionStop::default())
    }

    fn list(live: &Arc<LiveSessions>, n: u64, cluster: Option<&str>, ns: &str) -> Listing {
        live.list(listed(n, cluster, ns))
    }

    fn numbers(s: Vec<Arc<LiveSession>>) -> Vec<u64> {
        s.iter().map(|s| s.number).collect()
    }

    #[test]
    fn a_session_is_listed_until_its_listing_drops() {
        let live = Arc::new(LiveSessions::default());
        let a = list(&live, 1, None, "a");
        let b = list(&live, 2, Some("prod"), "a");
        let _c = list(&live, 3, None, "b");
        let (all, v1) = live.of(None, None);
        assert_eq!(numbers(all), [1, 3]);
        assert_eq!(numbers(live.of(None, Some("a")).0), [1]);
        assert_eq!(numbers(live.of(Some("prod"), None).0), [2]);
        // Another cluster's session is not found by its id, nor one in another namespace.
        assert!(live.find(None, "a", &session_id(2)).is_none());
        assert!(live.find(None, "b", &session_id(1)).is_none());
        assert!(live.find(None, "a", &session_id(1)).is_some());
        drop(a);
        drop(b);
        let (left, v2) = live.of(None, None);
        assert_eq!(numbers(left), [3]);
        assert!(v2 > v1);
        assert_eq!(live.len(), 1);
    }

    #[test]
    fn a_session_is_found_by_its_id_in_any_spelling_of_it() {
        let live = Arc::new(LiveSessions::default());
        let _s = list(&live, 7, None, "a");
        let me = instance_id();
        for id in [
            format!("{me}-7"),
            format!("{}-7", me.to_ascii_uppercase()),
            format!("{me}-007"),
        ] {
            assert_eq!(live.find(None, "a", &id).map(|s| s.number), Some(7), "{id}");
        }
        for id in [
            format!("{me}-8"),
            format!("{me}-+7"),
            format!("{me}-7 "),
            format!("{me}7"),
            "0badcafe-7".to_owned(),
            "7".to_owned(),
            format!("{me}-"),
        ] {
            assert!(live.find(None, "a", &id).is_none(), "{id}");
        }
    }

    #[test]
    fn ids_are_read_as_replica_and_number() {
        assert_eq!(read_id("abcd0123-42", "abcd0123"), Some(42));
        assert_eq!(read_id("ABCD0123-0042", "abcd0123"), Some(42));
        assert_eq!(read_id("abcd0123-99999999999999999999", "abcd0123"), None);
        assert_eq!(read_id("abcd0124-42", "abcd0123"), None);
        assert_eq!(read_id("x-abcd0123-42", "abcd0123"), None);
    }

    #[test]
    fn a_watch_sees_what_was_there_then_each_change_in_order() {
        let live = Arc::new(LiveSessions::default());
        let a = list(&live, 1, None, "a");
        let (now, _, mut changes) = live.watch(None, None);
        assert_eq!(now.len(), 1);
        let b = list(&live, 2, None, "a");
        live.modified(&now[0]);
        drop(a);
        drop(b);
        let seen: Vec<(ChangeKind, u64)> = std::iter::from_fn(|| changes.try_recv().ok())
            .map(|c| (c.kind, c.session.number))
            .collect();
        assert_eq!(
            seen,
            [
                (ChangeKind::Added, 2),
                (ChangeKind::Modified, 1),
                (ChangeKind::Deleted, 1),
                (ChangeKind::Deleted, 2),
            ]
        );
    }

    #[test]
    fn a_refresh_marks_the_sessions_that_moved_once_per_period() {
        let live = Arc::new(LiveSessions::default());
        let (a, b) = (list(&live, 1, None, "a"), list(&live, 2, None, "a"));
        let (_, version, _changes) = live.watch(None, None);
        let t0 = Instant::now();
        let first = live.refresh_traffic(t0);
        let moved =
            |refresh: u64| -> Vec<u64> { numbers(live.moved(None, None, version, refresh)) };
        assert!(moved(0).is_empty(), "nothing carried yet");
        a.session().unwrap().traffic.to_client(10);
        // Within the period: the same refresh, nothing new seen.
        assert_eq!(live.refresh_traffic(t0 + TRAFFIC_REFRESH / 2), first);
        assert!(moved(first).is_empty());
        let second = live.refresh_traffic(t0 + TRAFFIC_REFRESH);
        assert_eq!(second, first + 1);
        assert_eq!(moved(first), [1]);
        assert!(moved(second).is_empty(), "told of once");
        // Idle since: not marked again.
        let third = live.refresh_traffic(t0 + TRAFFIC_REFRESH * 2);
        assert!(moved(second).is_empty());
        b.session().unwrap().traffic.from_client(1);
        live.refresh_traffic(t0 + TRAFFIC_REFRESH * 3);
        assert_eq!(moved(third), [2]);
        // A watch that has not seen a session's ADDED yet does not tell of its traffic.
        let c = list(&live, 3, None, "a");
        c.session().unwrap().traffic.from_client(1);
        let fourth = live.refresh_traffic(t0 + TRAFFIC_REFRESH * 4);
        assert_eq!(numbers(live.moved(None, None, version, third)), [2]);
        assert_eq!(
            numbers(live.moved(None, None, version + 1, fourth - 1)),
            [3]
        );
    }

    #[test]
    fn a_recorded_sessions_recording_outlives_it_and_an_unrecorded_one_has_none() {
        let live = Arc::new(LiveSessions::default());
        let feed = RecordingFeed::finished("/rec/x_r-1.cast".into(), 7);
        let a = live.list(listed(1, None, "a").recorded(Some(feed)));
        let b = list(&live, 2, None, "a");
        let path = |l: RecordingLookup| match l {
            RecordingLookup::Recorded(feed) => feed.path().display().to_string(),
            other => format!("{other:?}"),
        };
        let (one, two) = (session_id(1), session_id(2));
        assert_eq!(path(live.recording(None, "a", &one)), "/rec/x_r-1.cast");
        assert!(matches!(
            live.recording(None, "a", &two),
            RecordingLookup::NotRecorded
        ));
        drop(a);
        drop(b);
        assert_eq!(path(live.recording(None, "a", &one)), "/rec/x_r-1.cast");
        // Read as an id, not compared as text.
        let shouted = one.to_uppercase().replace('-', "-0");
        assert_eq!(path(live.recording(None, "a", &shouted)), "/rec/x_r-1.cast");
        assert!(matches!(
            live.recording(None, "b", &one),
            RecordingLookup::Unknown
        ));
        assert!(matches!(
            live.recording(None, "a", &two),
            RecordingLookup::Unknown
        ));
    }

    #[test]
    fn a_watch_that_falls_behind_is_told_so() {
        let live = Arc::new(LiveSessions::default());
        let (_, _, mut changes) = live.watch(None, None);
        for n in 0..(WATCH_BACKLOG as u64 + 10) {
            drop(list(&live, n, None, "a"));
        }
        assert!(matches!(
            changes.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(_))
        ));
    }
}
