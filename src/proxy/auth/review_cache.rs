//! The review answers the proxy remembers (TokenReviews, access reviews): positive answers for
//! their TTL, negative ones briefly. Each kind has its own bounded room and, when full, forgets
//! its oldest entry first, so a caller trying bogus tokens (or forbidden requests) only ever
//! pushes out other negative answers: the answers of real callers stay cached, and nothing is
//! flushed whole.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::review::Review;

/// Most entries of each kind (accepted, rejected).
pub const MAX_PER_KIND: usize = 10_000;

/// An answer the cache keeps: positive answers and negative ones live in separate rooms.
pub trait Answer: Clone {
    /// Whether it grants (an authenticated token, an allowed request).
    fn is_positive(&self) -> bool;
}

impl Answer for Review {
    fn is_positive(&self) -> bool {
        matches!(self, Review::Authenticated(_))
    }
}

/// Entries of one kind, in the order they expire (every entry of a kind has the same TTL, so
/// insertion order is expiry order).
#[derive(Debug)]
struct Room<A> {
    entries: HashMap<String, (A, Instant)>,
    order: VecDeque<(String, Instant)>,
}

impl<A> Default for Room<A> {
    fn default() -> Self {
        Room {
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<A> Room<A> {
    fn get(&self, token: &str, now: Instant) -> Option<&A> {
        self.entries
            .get(token)
            .filter(|(_, until)| *until > now)
            .map(|(review, _)| review)
    }

    fn insert(&mut self, token: &str, review: A, until: Instant, capacity: usize) {
        self.expire(Instant::now());
        while self.entries.len() >= capacity {
            if !self.pop_oldest() {
                break;
            }
        }
        self.entries.insert(token.to_owned(), (review, until));
        self.order.push_back((token.to_owned(), until));
        if self.order.len() > 2 * capacity {
            // Places left stale by answers given again: drop them so the queue stays bounded.
            let entries = &self.entries;
            self.order
                .retain(|(t, u)| entries.get(t).is_some_and(|(_, until)| until == u));
        }
    }

    fn remove(&mut self, token: &str) {
        // Its place in `order` goes stale and is skipped when reached.
        self.entries.remove(token);
    }

    /// Drops expired entries from the front.
    fn expire(&mut self, now: Instant) {
        while self.order.front().is_some_and(|(_, until)| *until <= now) {
            self.pop_oldest();
        }
    }

    /// Forgets the oldest entry; false when there is none.
    fn pop_oldest(&mut self) -> bool {
        let Some((token, until)) = self.order.pop_front() else {
            return false;
        };
        // A token answered again later has a newer deadline: this place in the queue is stale.
        if self.entries.get(&token).is_some_and(|(_, u)| *u == until) {
            self.entries.remove(&token);
        }
        true
    }
}

/// Positive and negative answers by key (a token, a caller and request), each kind bounded.
#[derive(Debug)]
pub struct ReviewCache<A = Review> {
    accepted: Room<A>,
    rejected: Room<A>,
    capacity: usize,
}

impl<A> Default for ReviewCache<A> {
    fn default() -> Self {
        ReviewCache::with_capacity(MAX_PER_KIND)
    }
}

impl<A> ReviewCache<A> {
    /// At most `capacity` entries of each kind.
    pub fn with_capacity(capacity: usize) -> Self {
        ReviewCache {
            accepted: Room::default(),
            rejected: Room::default(),
            capacity: capacity.max(1),
        }
    }
}

impl<A: Answer> ReviewCache<A> {
    /// The remembered answer for `token`, if still fresh.
    pub fn get(&self, token: &str) -> Option<A> {
        let now = Instant::now();
        self.accepted
            .get(token, now)
            .or_else(|| self.rejected.get(token, now))
            .cloned()
    }

    /// Remembers `review` for `ttl`.
    pub fn insert(&mut self, token: &str, review: A, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let until = Instant::now() + ttl;
        let (room, other) = if review.is_positive() {
            (&mut self.accepted, &mut self.rejected)
        } else {
            (&mut self.rejected, &mut self.accepted)
        };
        other.remove(token);
        room.insert(token, review, until, self.capacity);
    }

    /// Entries held (fresh or not yet dropped), accepted and rejected.
    #[cfg(test)]
    pub fn len(&self) -> (usize, usize) {
        (self.accepted.entries.len(), self.rejected.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::proxy::auth::Identity;

    fn alice() -> Review {
        Review::Authenticated(Identity::new("alice", vec![], BTreeMap::new()).unwrap())
    }

    const TTL: Duration = Duration::from_secs(60);

    #[test]
    fn bogus_tokens_never_push_out_real_callers() {
        let mut cache = ReviewCache::with_capacity(100);
        cache.insert("alice-token", alice(), TTL);
        for i in 0..10_000 {
            cache.insert(&format!("bogus-{i}"), Review::Rejected, TTL);
        }
        assert_eq!(cache.get("alice-token"), Some(alice()));
        let (accepted, rejected) = cache.len();
        assert_eq!((accepted, rejected), (1, 100));
        // The newest rejections are the ones kept.
        assert_eq!(cache.get("bogus-9999"), Some(Review::Rejected));
        assert_eq!(cache.get("bogus-0"), None);
    }

    #[test]
    fn a_full_room_forgets_its_oldest_entry_only() {
        let mut cache = ReviewCache::with_capacity(3);
        for t in ["a", "b", "c", "d"] {
            cache.insert(t, alice(), TTL);
        }
        assert_eq!(cache.get("a"), None);
        for t in ["b", "c", "d"] {
            assert_eq!(cache.get(t), Some(alice()), "{t}");
        }
    }

    #[test]
    fn an_answer_again_replaces_the_old_one_and_its_stale_place() {
        let mut cache = ReviewCache::with_capacity(2);
        cache.insert("a", Review::Rejected, TTL);
        cache.insert("a", alice(), TTL);
        assert_eq!(cache.get("a"), Some(alice()));
        assert_eq!(cache.len(), (1, 0));
        // "a" again: its first place in the queue is stale and must not evict the new one.
        cache.insert("a", alice(), TTL);
        cache.insert("b", alice(), TTL);
        assert_eq!(cache.get("a"), Some(alice()));
        assert_eq!(cache.get("b"), Some(alice()));
    }

    #[test]
    fn expired_entries_are_not_served() {
        let mut cache = ReviewCache::with_capacity(10);
        cache.insert("a", alice(), Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(cache.get("a"), None);
        cache.insert("b", alice(), Duration::ZERO);
        assert_eq!(cache.get("b"), None);
    }
}
