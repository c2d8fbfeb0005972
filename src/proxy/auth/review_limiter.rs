//! How many TokenReviews one caller address may cause: a rate (token bucket) and a number in
//! flight. Every distinct bogus token misses the cache and costs the API server a review; without
//! a bound per caller, one client could turn the proxy into a TokenReview amplifier.
//!
//! Addresses are grouped as the network assigns them ([`crate::address_budget::group`]: an
//! IPv6 address by its /64). Only reviews actually made count: cached answers and callers
//! waiting on a review already in flight cost nothing.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::address_budget::{group, Bucket, Rate};

/// Limits on the reviews of one caller address.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReviewLimits {
    /// Sustained reviews per second.
    pub per_second: f64,
    /// Reviews allowed in a burst above the rate.
    pub burst: u32,
    /// Reviews in flight at once.
    pub in_flight: usize,
}

impl Default for ReviewLimits {
    fn default() -> Self {
        // Generous: many users may share one address behind a corporate gateway, and each
        // token is reviewed once per cache TTL.
        ReviewLimits {
            per_second: 10.0,
            burst: 50,
            in_flight: 8,
        }
    }
}

/// Most caller addresses tracked; beyond it, addresses with nothing to remember are dropped.
const MAX_TRACKED: usize = 50_000;

#[derive(Debug)]
struct Entry {
    bucket: Bucket,
    in_flight: usize,
}

/// Per-caller review budgets.
#[derive(Debug)]
pub struct ReviewLimiter {
    limits: ReviewLimits,
    callers: Mutex<HashMap<IpAddr, Entry>>,
}

/// A caller's review budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited;

/// Permission for one review; dropping it ends the review.
#[derive(Debug)]
pub struct ReviewPermit {
    limiter: Arc<ReviewLimiter>,
    caller: IpAddr,
}

impl Drop for ReviewPermit {
    fn drop(&mut self) {
        let mut callers = self.limiter.lock();
        if let Some(b) = callers.get_mut(&self.caller) {
            b.in_flight = b.in_flight.saturating_sub(1);
        }
    }
}

impl ReviewLimiter {
    /// A limiter with these limits.
    pub fn new(limits: ReviewLimits) -> Arc<ReviewLimiter> {
        Arc::new(ReviewLimiter {
            limits,
            callers: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Entry>> {
        self.callers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes one review from `caller`'s budget, or says it is spent.
    pub fn acquire(self: &Arc<Self>, caller: IpAddr) -> Result<ReviewPermit, Limited> {
        self.acquire_at(caller, Instant::now())
    }

    fn acquire_at(self: &Arc<Self>, caller: IpAddr, now: Instant) -> Result<ReviewPermit, Limited> {
        let caller = group(caller);
        let rate = self.rate();
        let mut callers = self.lock();
        if callers.len() >= MAX_TRACKED && !callers.contains_key(&caller) {
            self.forget_settled(&mut callers, now);
            if callers.len() >= MAX_TRACKED {
                // A flood from very many addresses at once: newcomers wait until it settles,
                // callers already known keep their budgets.
                return Err(Limited);
            }
        }
        let e = callers.entry(caller).or_insert(Entry {
            bucket: Bucket::full(rate, now),
            in_flight: 0,
        });
        e.bucket.refill(rate, now);
        if e.in_flight >= self.limits.in_flight.max(1) || !e.bucket.has_token() {
            return Err(Limited);
        }
        e.bucket.take(rate);
        e.in_flight += 1;
        Ok(ReviewPermit {
            limiter: self.clone(),
            caller,
        })
    }

    /// Drops callers whose bucket is full again and who have nothing in flight: they carry no
    /// state worth keeping.
    fn forget_settled(&self, callers: &mut HashMap<IpAddr, Entry>, now: Instant) {
        let rate = self.rate();
        callers.retain(|_, e| e.in_flight > 0 || !e.bucket.settled(rate, now));
    }

    fn rate(&self) -> Rate {
        Rate {
            per_second: self.limits.per_second,
            burst: self.limits.burst,
        }
    }

    /// Caller addresses tracked now.
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limiter(per_second: f64, burst: u32, in_flight: usize) -> Arc<ReviewLimiter> {
        ReviewLimiter::new(ReviewLimits {
            per_second,
            burst,
            in_flight,
        })
    }

    #[test]
    fn a_burst_then_the_rate() {
        let l = limiter(2.0, 3, 100);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let t0 = Instant::now();
        let permits: Vec<_> = (0..3).map(|_| l.acquire_at(ip, t0).unwrap()).collect();
        assert_eq!(l.acquire_at(ip, t0).unwrap_err(), Limited);
        // Another caller has its own budget.
        assert!(l.acquire_at("10.0.0.2".parse().unwrap(), t0).is_ok());
        // Half a second later, one more (2 per second).
        assert!(l.acquire_at(ip, t0 + Duration::from_millis(500)).is_ok());
        assert!(l.acquire_at(ip, t0 + Duration::from_millis(500)).is_err());
        drop(permits);
    }

    #[test]
    fn reviews_in_flight_are_bounded_per_caller() {
        let l = limiter(1000.0, 1000, 2);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let a = l.acquire(ip).unwrap();
        let _b = l.acquire(ip).unwrap();
        assert!(l.acquire(ip).is_err());
        drop(a);
        assert!(l.acquire(ip).is_ok());
    }

    #[test]
    fn ipv6_callers_are_grouped_by_their_64() {
        let l = limiter(0.001, 1, 10);
        let t0 = Instant::now();
        let _p = l
            .acquire_at("2001:db8:1:2::1".parse().unwrap(), t0)
            .unwrap();
        assert!(l
            .acquire_at("2001:db8:1:2:ffff::9".parse().unwrap(), t0)
            .is_err());
        assert!(l.acquire_at("2001:db8:1:3::1".parse().unwrap(), t0).is_ok());
        // An IPv4-mapped address is the IPv4 caller.
        let _q = l.acquire_at("10.1.1.1".parse().unwrap(), t0).unwrap();
        assert!(l
            .acquire_at("::ffff:10.1.1.1".parse().unwrap(), t0)
            .is_err());
    }

    #[test]
    fn settled_callers_are_forgotten_when_the_table_is_full() {
        let l = limiter(1000.0, 1, 1);
        let t0 = Instant::now();
        for i in 0..MAX_TRACKED as u32 {
            drop(l.acquire_at(IpAddr::V4(i.into()), t0).unwrap());
        }
        assert_eq!(l.tracked(), MAX_TRACKED);
        // A second later every bucket is full again: the newcomer makes room.
        let later = t0 + Duration::from_secs(1);
        drop(l.acquire_at("192.0.2.1".parse().unwrap(), later).unwrap());
        assert_eq!(l.tracked(), 1);
    }
}
