//! The spool's size: bytes of recordings this process knows are in `--record-dir` and not yet
//! in the store (being written, closed and waiting, or left by an earlier run), against
//! `--record-spool-max`. Counted as they are written and removed, never by reading the disk.
//!
//! The cap bounds files as well as bytes: each file waiting for its upload holds a queued job
//! in memory (a few hundred bytes) and an inode on disk, so a flood of tiny recordings (execs
//! that print nothing, a few hundred bytes each) would otherwise queue tens of millions of
//! them under a 10 GiB cap.

use std::sync::atomic::{AtomicU64, Ordering};

/// What one waiting file counts as when the cap is read as a number of files.
pub const FILE_SHARE: u64 = 256 * 1024;
/// The fewest files a cap lets wait, however few bytes it is.
pub const MIN_FILES: u64 = 1024;

/// `--record-spool-max`: what may wait for the store, in bytes and in files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpoolCap {
    /// Bytes (the flag's value).
    pub bytes: u64,
}

impl SpoolCap {
    /// Files: one per [`FILE_SHARE`] of the bytes, at least [`MIN_FILES`] (40,960 files
    /// under the default 10 GiB).
    pub fn files(self) -> u64 {
        (self.bytes / FILE_SHARE).max(MIN_FILES)
    }

    /// `bytes` in `files` waiting files reach the cap: no more recordings start.
    pub fn reached(self, bytes: u64, files: u64) -> bool {
        bytes >= self.bytes || files >= self.files()
    }
}

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
    fn the_cap_counts_files_as_well_as_bytes() {
        let cap = SpoolCap { bytes: 10 << 30 };
        assert_eq!(cap.files(), 40_960);
        assert!(!cap.reached((10 << 30) - 1, 40_959));
        assert!(cap.reached(10 << 30, 0));
        assert!(cap.reached(1000, 40_960));
        // A small cap in bytes still lets a thousand small files wait.
        let small = SpoolCap { bytes: 2048 };
        assert_eq!(small.files(), MIN_FILES);
        assert!(!small.reached(2047, 1023));
        assert!(small.reached(2048, 1));
        assert!(small.reached(0, 1024));
    }

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
