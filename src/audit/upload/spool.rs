//! The spool's size: bytes of recordings this process knows are in `--record-dir` and not yet
//! in the store (being written, closed and waiting, or left by an earlier run), against
//! `--record-spool-max`. Counted as they are written and removed, never by reading the disk.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes in the spool; shared by the recording writer (adds what it writes), the restart scan
/// (adds what it finds) and the uploader (takes off what it removes).
#[derive(Debug, Default)]
pub struct SpoolUsage {
    bytes: AtomicU64,
}

impl SpoolUsage {
    /// `len` more bytes in the spool.
    pub fn add(&self, len: u64) {
        self.bytes.fetch_add(len, Ordering::Relaxed);
    }

    /// `len` bytes left it (a stored file removed).
    pub fn remove(&self, len: u64) {
        // Never below 0: a file that grew after it was counted (a crash's leftover) is removed
        // at its new length.
        let _ = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_sub(len))
            });
    }

    /// Bytes in the spool now.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_comes_and_goes_never_below_zero() {
        let s = SpoolUsage::default();
        s.add(100);
        s.add(50);
        s.remove(30);
        assert_eq!(s.bytes(), 120);
        s.remove(500);
        assert_eq!(s.bytes(), 0);
    }
}
