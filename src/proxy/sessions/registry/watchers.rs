//! The watches of the live sessions, bounded: each holds a task, a queue of events and a
//! subscription to every change, for up to half an hour, so a caller may keep at most
//! [`WATCHES_PER_CALLER`] open at once and the replica at most [`WATCHES_PER_REPLICA`]; one
//! more is refused (429 with `Retry-After`), as kube-apiserver refuses requests past its
//! in-flight limit. A caller is whom its request was authorized as ([`WatcherKey`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

/// Watches one caller may keep open on a replica.
pub const WATCHES_PER_CALLER: usize = 16;
/// Watches a replica keeps open, all callers together.
pub const WATCHES_PER_REPLICA: usize = 512;

/// Whom a watch is charged to: a hash of who the caller is (its authenticated user, or where
/// an unauthenticated passthrough caller's reviews are charged: its address), never the name
/// itself, so that each entry is the same few bytes however long the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WatcherKey([u8; 16]);

impl WatcherKey {
    /// The key of `kind` (`user`, `address`) `who`.
    pub fn new(kind: &str, who: &str) -> WatcherKey {
        let mut hash = Sha256::new();
        hash.update((kind.len() as u64).to_be_bytes());
        hash.update(kind);
        hash.update(who);
        let mut key = [0u8; 16];
        key.copy_from_slice(&hash.finalize()[..16]);
        WatcherKey(key)
    }
}

/// Why a watch was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TooManyWatches {
    /// The caller has [`WATCHES_PER_CALLER`] open.
    Caller,
    /// The replica has [`WATCHES_PER_REPLICA`] open.
    Replica,
}

/// The watches open now.
#[derive(Debug)]
pub struct Watchers {
    per_caller: usize,
    per_replica: usize,
    open: Arc<Mutex<Open>>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    /// Only callers with a watch open: at most `per_replica` entries.
    by_caller: HashMap<WatcherKey, usize>,
}

impl Default for Watchers {
    fn default() -> Self {
        Watchers::with_limits(WATCHES_PER_CALLER, WATCHES_PER_REPLICA)
    }
}

impl Watchers {
    /// At most `per_caller` watches per caller and `per_replica` in all.
    pub fn with_limits(per_caller: usize, per_replica: usize) -> Watchers {
        Watchers {
            per_caller,
            per_replica,
            open: Arc::default(),
        }
    }

    /// A watch for `caller`, counted until the returned permit drops; or why not.
    pub fn admit(&self, caller: WatcherKey) -> Result<WatchPermit, TooManyWatches> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.total >= self.per_replica {
            return Err(TooManyWatches::Replica);
        }
        let mine = open.by_caller.get(&caller).copied().unwrap_or(0);
        if mine >= self.per_caller {
            return Err(TooManyWatches::Caller);
        }
        open.by_caller.insert(caller, mine + 1);
        open.total += 1;
        Ok(WatchPermit {
            open: self.open.clone(),
            caller,
        })
    }

    /// Watches open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

/// One open watch; dropping it (the watch ended) gives its place back.
#[derive(Debug)]
pub struct WatchPermit {
    open: Arc<Mutex<Open>>,
    caller: WatcherKey,
}

impl Drop for WatchPermit {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.total -= 1;
        if let Some(mine) = open.by_caller.get_mut(&self.caller) {
            *mine -= 1;
            if *mine == 0 {
                open.by_caller.remove(&self.caller);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_keeps_its_own_few_and_the_replica_its_many() {
        let w = Watchers::with_limits(2, 3);
        let (alice, bob) = (
            WatcherKey::new("user", "alice"),
            WatcherKey::new("user", "bob"),
        );
        let a1 = w.admit(alice).unwrap();
        let _a2 = w.admit(alice).unwrap();
        assert_eq!(w.admit(alice).unwrap_err(), TooManyWatches::Caller);
        let _b1 = w.admit(bob).unwrap();
        assert_eq!(w.admit(bob).unwrap_err(), TooManyWatches::Replica);
        assert_eq!(w.open(), 3);
        drop(a1);
        let _b2 = w.admit(bob).unwrap();
        assert_eq!(w.admit(alice).unwrap_err(), TooManyWatches::Replica);
    }

    #[test]
    fn ended_watches_leave_nothing_behind() {
        let w = Watchers::default();
        let permits: Vec<_> = (0..WATCHES_PER_REPLICA)
            .map(|n| w.admit(WatcherKey::new("address", &n.to_string())).unwrap())
            .collect();
        assert_eq!(w.open(), WATCHES_PER_REPLICA);
        drop(permits);
        let open = w.open.lock().unwrap();
        assert_eq!((open.total, open.by_caller.len()), (0, 0));
    }

    #[test]
    fn kinds_of_caller_do_not_share_a_key() {
        assert_ne!(
            WatcherKey::new("user", "x"),
            WatcherKey::new("address", "x")
        );
        assert_ne!(WatcherKey::new("us", "erx"), WatcherKey::new("user", "x"));
    }
}
