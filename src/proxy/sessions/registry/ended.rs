//! The recordings of recently ended sessions, by session id, so that the sessions API serves
//! a finished session's recording without looking for it on disk (and follows one whose file
//! is still being completed). Bounded: the last [`ENDED_KEPT`] recorded sessions; an older one
//! is found on disk by its name and header
//! ([`Recordings::find`](crate::audit::recording::Recordings::find)).

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::audit::recording::RecordingFeed;

/// How many ended recorded sessions are remembered (a few hundred bytes each).
pub const ENDED_KEPT: usize = 1024;

/// One ended recorded session.
#[derive(Debug)]
struct Ended {
    cluster: Option<String>,
    namespace: String,
    session_id: String,
    feed: RecordingFeed,
}

/// The last [`ENDED_KEPT`] ended recorded sessions, oldest first.
#[derive(Debug, Default)]
pub struct EndedRecordings {
    entries: Mutex<VecDeque<Ended>>,
}

impl EndedRecordings {
    /// Remembers that session `session_id` of `cluster` in `namespace` ended, recorded as
    /// `feed` says; the oldest is forgotten beyond [`ENDED_KEPT`].
    pub fn ended(
        &self,
        cluster: Option<&str>,
        namespace: &str,
        session_id: &str,
        feed: RecordingFeed,
    ) {
        let mut entries = self.lock();
        if entries.len() >= ENDED_KEPT {
            entries.pop_front();
        }
        entries.push_back(Ended {
            cluster: cluster.map(str::to_owned),
            namespace: namespace.to_owned(),
            session_id: session_id.to_owned(),
            feed,
        });
    }

    /// The recording of the ended session `session_id` of `cluster` in `namespace`, if it is
    /// remembered.
    pub fn find(
        &self,
        cluster: Option<&str>,
        namespace: &str,
        session_id: &str,
    ) -> Option<RecordingFeed> {
        self.lock()
            .iter()
            .rev()
            .find(|e| {
                e.session_id == session_id
                    && e.namespace == namespace
                    && e.cluster.as_deref() == cluster
            })
            .map(|e| e.feed.clone())
    }

    /// How many are remembered.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Ended>> {
        // Entries are pushed and popped whole.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_ones_are_kept_by_cluster_namespace_and_id() {
        let ended = EndedRecordings::default();
        let feed = |n: u64| RecordingFeed::finished(format!("/rec/{n}.cast").into(), n);
        for n in 0..(ENDED_KEPT as u64 + 5) {
            ended.ended(None, "a", &format!("r-{n}"), feed(n));
        }
        ended.ended(Some("prod"), "a", "r-x", feed(1));
        assert_eq!(ended.len(), ENDED_KEPT);
        assert!(ended.find(None, "a", "r-0").is_none(), "the oldest went");
        let last = ended
            .find(None, "a", &format!("r-{}", ENDED_KEPT + 4))
            .unwrap();
        assert_eq!(last.progress().written, ENDED_KEPT as u64 + 4);
        assert!(ended.find(None, "b", "r-10").is_none());
        assert!(ended.find(None, "a", "r-x").is_none());
        assert!(ended.find(Some("prod"), "a", "r-x").is_some());
    }
}
