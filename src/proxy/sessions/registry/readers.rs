//! How many recordings are being read through the sessions API at once (`…/recording`, followed
//! or not): [`READERS_MAX`] in all and [`READERS_PER_ADDRESS`] per client address (an IPv6
//! /64 as one), so that what readers make the proxy hold (a file handle, a task and a few
//! chunks each) is bounded, and one client cannot take every place.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::address_budget;

/// Recordings read at once, all clients together.
pub const READERS_MAX: usize = 256;
/// Recordings read at once by one client address.
pub const READERS_PER_ADDRESS: usize = 8;

/// The places for recording readers.
#[derive(Debug)]
pub struct RecordingReaders {
    max: usize,
    per_address: usize,
    counts: Arc<Mutex<Counts>>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

/// Why a reader got no place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadersFull {
    /// [`READERS_MAX`] readers are reading.
    All,
    /// Its address has [`READERS_PER_ADDRESS`] reading.
    Address,
}

/// A reader's place; given back when dropped.
#[derive(Debug)]
pub struct ReaderPlace {
    counts: Arc<Mutex<Counts>>,
    address: IpAddr,
}

impl Default for RecordingReaders {
    fn default() -> Self {
        RecordingReaders::new(READERS_MAX, READERS_PER_ADDRESS)
    }
}

impl RecordingReaders {
    /// At most `max` readers, `per_address` of them from one address.
    pub fn new(max: usize, per_address: usize) -> RecordingReaders {
        RecordingReaders {
            max,
            per_address,
            counts: Arc::default(),
        }
    }

    /// A place for a reader from `address`, if there is one.
    pub fn take(&self, address: IpAddr) -> Result<ReaderPlace, ReadersFull> {
        let address = address_budget::group(address);
        let mut counts = lock(&self.counts);
        if counts.total >= self.max {
            return Err(ReadersFull::All);
        }
        let mine = counts.by_address.entry(address).or_default();
        if *mine >= self.per_address {
            return Err(ReadersFull::Address);
        }
        *mine += 1;
        counts.total += 1;
        Ok(ReaderPlace {
            counts: self.counts.clone(),
            address,
        })
    }

    /// Readers reading now.
    pub fn reading(&self) -> usize {
        lock(&self.counts).total
    }
}

impl Drop for ReaderPlace {
    fn drop(&mut self) {
        let mut counts = lock(&self.counts);
        counts.total -= 1;
        if let Some(mine) = counts.by_address.get_mut(&self.address) {
            *mine -= 1;
            if *mine == 0 {
                counts.by_address.remove(&self.address);
            }
        }
    }
}

fn lock(counts: &Mutex<Counts>) -> std::sync::MutexGuard<'_, Counts> {
    // Counts change in whole steps under the lock.
    counts.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_are_bounded_in_all_and_per_address() {
        let readers = RecordingReaders::new(3, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "2001:db8::1".parse().unwrap();
        let b_too: IpAddr = "2001:db8::2".parse().unwrap();
        let a1 = readers.take(a).unwrap();
        let _a2 = readers.take(a).unwrap();
        assert_eq!(readers.take(a).unwrap_err(), ReadersFull::Address);
        let _b1 = readers.take(b).unwrap();
        assert_eq!(readers.take(b_too).unwrap_err(), ReadersFull::All);
        drop(a1);
        // One /64 is one address.
        let _b2 = readers.take(b_too).unwrap();
        assert_eq!(readers.take(b).unwrap_err(), ReadersFull::All);
        assert_eq!(readers.reading(), 3);
    }

    #[test]
    fn a_place_given_back_leaves_nothing_behind() {
        let readers = RecordingReaders::default();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        drop(readers.take(a).unwrap());
        assert_eq!(readers.reading(), 0);
        assert!(lock(&readers.counts).by_address.is_empty());
    }
}
