//! Budgets per caller address, the pieces every such limit shares (TokenReviews a caller may
//! cause, refused sessions whose events it may write): how addresses are grouped, and the
//! token bucket each group has.
//!
//! Addresses are grouped as the network assigns them: an IPv4 address alone, an IPv6 address
//! by its /64 (one host usually owns the whole prefix), an IPv4-mapped IPv6 address as the IPv4
//! address it is.

use std::net::{IpAddr, Ipv6Addr};
use std::time::{Duration, Instant};

/// The unit a budget belongs to: an IPv4 address, or an IPv6 /64.
pub fn group(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(_) => addr,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// A group as logs and audit events name it: `203.0.113.7`, or `2001:db8:1:2::/64`.
pub fn describe(group: IpAddr) -> String {
    match group {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("{v6}/64"),
    }
}

/// A rate and the burst allowed above it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Tokens back per second.
    pub per_second: f64,
    /// Tokens a full bucket holds.
    pub burst: u32,
}

impl Rate {
    fn burst(self) -> f64 {
        f64::from(self.burst.max(1))
    }

    /// How long an empty bucket takes to fill up again.
    pub fn refill_time(self) -> Duration {
        Duration::from_secs_f64(self.burst() / self.per_second.max(f64::MIN_POSITIVE))
    }
}

/// One group's tokens.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    /// A full bucket at `now`.
    pub fn full(rate: Rate, now: Instant) -> Bucket {
        Bucket {
            tokens: rate.burst(),
            refilled: now,
        }
    }

    /// Adds what the rate gave back since the last refill (never above the burst).
    pub fn refill(&mut self, rate: Rate, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate.per_second).min(rate.burst());
        self.refilled = now;
    }

    /// Whether a whole token is there (after [`refill`](Self::refill)).
    pub fn has_token(&self) -> bool {
        self.tokens >= 1.0
    }

    /// Takes one token; the bucket may go into debt down to minus its burst (what was spent
    /// in flight before it was known), which is paid back before a token is there again.
    pub fn take(&mut self, rate: Rate) {
        self.tokens = (self.tokens - 1.0).max(-rate.burst());
    }

    /// How long until a whole token is there again (zero when one is).
    pub fn until_token(&self, rate: Rate) -> Duration {
        let missing = (1.0 - self.tokens).max(0.0);
        Duration::from_secs_f64(missing / rate.per_second.max(f64::MIN_POSITIVE))
    }

    /// Whether it would be full again at `now` untouched: it holds nothing worth keeping.
    pub fn settled(&self, rate: Rate, now: Instant) -> bool {
        now.saturating_duration_since(self.refilled) >= rate.refill_time()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_callers_are_grouped_by_their_64() {
        let a = group("2001:db8:1:2::1".parse().unwrap());
        assert_eq!(a, group("2001:db8:1:2:ffff::9".parse().unwrap()));
        assert_ne!(a, group("2001:db8:1:3::1".parse().unwrap()));
        assert_eq!(describe(a), "2001:db8:1:2::/64");
        let v4 = group("::ffff:10.1.1.1".parse().unwrap());
        assert_eq!(v4, "10.1.1.1".parse::<IpAddr>().unwrap());
        assert_eq!(describe(v4), "10.1.1.1");
    }

    #[test]
    fn a_bucket_refills_at_its_rate_and_pays_its_debt_first() {
        let rate = Rate {
            per_second: 2.0,
            burst: 2,
        };
        let t0 = Instant::now();
        let mut b = Bucket::full(rate, t0);
        b.take(rate);
        b.take(rate);
        assert!(!b.has_token());
        assert_eq!(b.until_token(rate), Duration::from_millis(500));
        // Two more spent in flight: the debt comes first.
        b.take(rate);
        b.take(rate);
        b.take(rate);
        assert_eq!(b.until_token(rate), Duration::from_millis(1500));
        b.refill(rate, t0 + Duration::from_millis(1500));
        assert!(b.has_token());
        assert!(!b.settled(rate, t0 + Duration::from_millis(2000)));
        assert!(b.settled(rate, t0 + Duration::from_millis(2500)));
    }
}
