//! How many refused sessions one caller address may write into the audit log. Every session
//! writes its `started` event before anything goes upstream, when nobody knows yet whether the
//! upstream will open it; a session the upstream then refuses (or whose client never completes
//! its upgrade) costs its address one token of a bucket ([`RefusalLimits`]). Once an address's
//! tokens are spent, the proxy refuses that address's new streaming sessions itself (429 with
//! `Retry-After`) without asking the upstream: nothing goes upstream for them and no session
//! event is written. The log says so once per report interval, in one `refused` event naming
//! how many sessions each address had refused and which addresses they came from.
//!
//! Accepted sessions cost nothing: an address whose sessions the upstream opens is never
//! limited. Addresses are grouped as [`crate::address_budget::group`] groups them (an IPv6
//! /64). At most [`MAX_TRACKED`] addresses are tracked; when that many have refusals to pay
//! back, further addresses share one bucket, so many addresses at once write at most
//! `MAX_TRACKED + 1` buckets' worth.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::address_budget::{describe, group, Bucket, Rate};

/// Most addresses tracked at once.
pub const MAX_TRACKED: usize = 10_000;
/// Most addresses a `refused` event names; the others are counted.
pub const REPORT_ADDRESSES: usize = 100;

/// How many refused sessions an address may have audited.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RefusalLimits {
    /// Refused sessions an address may have in a row (`--audit-refusal-burst`).
    pub burst: u32,
    /// One more refused session is allowed every this long (`--audit-refusal-refill`).
    pub refill: Duration,
}

impl Default for RefusalLimits {
    fn default() -> Self {
        RefusalLimits {
            burst: 30,
            refill: Duration::from_secs(10),
        }
    }
}

impl RefusalLimits {
    fn rate(self) -> Rate {
        Rate {
            per_second: 1.0 / self.refill.as_secs_f64().max(1e-3),
            burst: self.burst,
        }
    }
}

#[derive(Debug)]
struct Entry {
    bucket: Bucket,
    /// Sessions refused for its spent budget since the last report.
    refused: u64,
}

#[derive(Debug, Default)]
struct Table {
    callers: HashMap<IpAddr, Entry>,
    /// The bucket the addresses share that did not fit in `callers`.
    overflow: Option<Entry>,
}

/// The refusal budgets of every caller address.
#[derive(Debug)]
pub struct RefusalBudget {
    limits: RefusalLimits,
    table: Mutex<Table>,
}

/// The refusals the proxy answered itself since the last report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefusalReport {
    /// Sessions refused without being started, all addresses.
    pub sessions_refused: u64,
    /// The addresses with the most refusals, most first.
    pub addresses: Vec<AddressRefusals>,
    /// Further addresses with refusals, counted only.
    pub addresses_omitted: u64,
    /// Sessions refused from addresses past [`MAX_TRACKED`], which shared one bucket.
    pub untracked_sessions_refused: u64,
}

/// One address's refusals in a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AddressRefusals {
    /// `203.0.113.7`, or an IPv6 /64.
    pub address: String,
    pub sessions_refused: u64,
}

impl RefusalBudget {
    /// Budgets with these limits.
    pub fn new(limits: RefusalLimits) -> RefusalBudget {
        RefusalBudget {
            limits,
            table: Mutex::new(Table::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `caller` may start a session: `Err` with how long until it may again, when its
    /// refusals have spent its budget (counted for the next report).
    pub fn admit(&self, caller: IpAddr) -> Result<(), Duration> {
        self.admit_at(caller, Instant::now())
    }

    fn admit_at(&self, caller: IpAddr, now: Instant) -> Result<(), Duration> {
        let rate = self.limits.rate();
        let mut table = self.lock();
        let table = &mut *table;
        let tracked = table.callers.len();
        let entry = match table.callers.get_mut(&group(caller)) {
            Some(entry) => entry,
            // Untracked: free unless the table is full, when the shared bucket decides.
            None if tracked < MAX_TRACKED => return Ok(()),
            None => match table.overflow.as_mut() {
                Some(entry) => entry,
                None => return Ok(()),
            },
        };
        entry.bucket.refill(rate, now);
        if entry.bucket.has_token() {
            return Ok(());
        }
        entry.refused += 1;
        Err(entry.bucket.until_token(rate))
    }

    /// Charges `caller` one session that was refused after its `started` event.
    pub fn charge(&self, caller: IpAddr) {
        self.charge_at(caller, Instant::now());
    }

    fn charge_at(&self, caller: IpAddr, now: Instant) {
        let rate = self.limits.rate();
        let caller = group(caller);
        let mut table = self.lock();
        let table = &mut *table;
        if table.callers.len() >= MAX_TRACKED && !table.callers.contains_key(&caller) {
            // Entries with nothing owed and nothing to report go first.
            table
                .callers
                .retain(|_, e| e.refused > 0 || !e.bucket.settled(rate, now));
        }
        let fresh = || Entry {
            bucket: Bucket::full(rate, now),
            refused: 0,
        };
        let entry = if table.callers.len() < MAX_TRACKED || table.callers.contains_key(&caller) {
            table.callers.entry(caller).or_insert_with(fresh)
        } else {
            table.overflow.get_or_insert_with(fresh)
        };
        entry.bucket.refill(rate, now);
        entry.bucket.take(rate);
    }

    /// The refusals counted since the last report, and starts counting anew; `None` when there
    /// were none. Addresses that owe nothing are forgotten.
    pub fn take_report(&self) -> Option<RefusalReport> {
        let rate = self.limits.rate();
        let now = Instant::now();
        let mut table = self.lock();
        let mut counted: Vec<(u64, IpAddr)> = Vec::new();
        for (addr, entry) in table.callers.iter_mut() {
            if entry.refused > 0 {
                counted.push((entry.refused, *addr));
                entry.refused = 0;
            }
        }
        let untracked = table
            .overflow
            .as_mut()
            .map_or(0, |e| std::mem::take(&mut e.refused));
        table.callers.retain(|_, e| !e.bucket.settled(rate, now));
        if table
            .overflow
            .as_ref()
            .is_some_and(|e| e.bucket.settled(rate, now))
        {
            table.overflow = None;
        }
        drop(table);
        if counted.is_empty() && untracked == 0 {
            return None;
        }
        counted.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let total = counted.iter().map(|(n, _)| n).sum::<u64>() + untracked;
        let omitted = counted.len().saturating_sub(REPORT_ADDRESSES) as u64;
        counted.truncate(REPORT_ADDRESSES);
        Some(RefusalReport {
            sessions_refused: total,
            addresses: counted
                .into_iter()
                .map(|(n, addr)| AddressRefusals {
                    address: describe(addr),
                    sessions_refused: n,
                })
                .collect(),
            addresses_omitted: omitted,
            untracked_sessions_refused: untracked,
        })
    }

    /// Addresses tracked now.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.lock().callers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(burst: u32, refill_ms: u64) -> RefusalBudget {
        RefusalBudget::new(RefusalLimits {
            burst,
            refill: Duration::from_millis(refill_ms),
        })
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_address_is_refused_once_its_refusals_spend_its_budget() {
        let b = budget(3, 1000);
        let (a, t0) = (ip("203.0.113.7"), Instant::now());
        for _ in 0..3 {
            assert_eq!(b.admit_at(a, t0), Ok(()));
            b.charge_at(a, t0);
        }
        assert_eq!(b.admit_at(a, t0), Err(Duration::from_secs(1)));
        assert_eq!(b.admit_at(a, t0), Err(Duration::from_secs(1)));
        // Another address is not touched, and a refill gives one session back.
        assert_eq!(b.admit_at(ip("203.0.113.8"), t0), Ok(()));
        assert_eq!(b.admit_at(a, t0 + Duration::from_millis(1000)), Ok(()));
        let report = b.take_report().unwrap();
        assert_eq!(report.sessions_refused, 2);
        assert_eq!(
            report.addresses,
            [AddressRefusals {
                address: "203.0.113.7".into(),
                sessions_refused: 2
            }]
        );
        assert_eq!(b.take_report(), None, "counted once");
    }

    #[test]
    fn sessions_that_were_never_refused_cost_nothing() {
        let b = budget(1, 60_000);
        let a = ip("2001:db8:1:2::1");
        for _ in 0..100 {
            assert_eq!(b.admit(a), Ok(()));
        }
        assert_eq!(b.tracked(), 0);
        b.charge(a);
        // The whole /64 shares the spent budget.
        assert!(b.admit(ip("2001:db8:1:2::99")).is_err());
        let report = b.take_report().unwrap();
        assert_eq!(report.addresses[0].address, "2001:db8:1:2::/64");
    }

    #[test]
    fn addresses_past_the_table_share_one_bucket() {
        let b = budget(1, 3_600_000);
        let t0 = Instant::now();
        for i in 0..MAX_TRACKED as u32 {
            b.charge_at(IpAddr::V4((0x0a00_0000 + i).into()), t0);
        }
        assert_eq!(b.tracked(), MAX_TRACKED);
        // Two newcomers: the first spends the shared bucket, the second finds it spent.
        let (x, y) = (ip("192.0.2.1"), ip("192.0.2.2"));
        assert_eq!(b.admit_at(x, t0), Ok(()));
        b.charge_at(x, t0);
        assert!(b.admit_at(y, t0).is_err());
        assert_eq!(b.tracked(), MAX_TRACKED);
        let report = b.take_report().unwrap();
        assert_eq!(report.untracked_sessions_refused, 1);
        assert_eq!(report.sessions_refused, 1);
    }

    #[test]
    fn a_report_names_the_busiest_addresses_and_counts_the_rest() {
        let b = budget(1, 3_600_000);
        let t0 = Instant::now();
        for i in 0..(REPORT_ADDRESSES as u32 + 5) {
            let a = IpAddr::V4((0xc000_0200 + i).into());
            b.charge_at(a, t0);
            for _ in 0..=i {
                let _ = b.admit_at(a, t0);
            }
        }
        let report = b.take_report().unwrap();
        assert_eq!(report.addresses.len(), REPORT_ADDRESSES);
        assert_eq!(report.addresses_omitted, 5);
        assert_eq!(
            report.addresses[0].sessions_refused,
            REPORT_ADDRESSES as u64 + 5
        );
        let n = REPORT_ADDRESSES as u64 + 5;
        assert_eq!(report.sessions_refused, n * (n + 1) / 2);
    }
}
