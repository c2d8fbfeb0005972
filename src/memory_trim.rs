//! Giving freed memory back to the operating system on a timer.
//!
//! glibc's allocator keeps the pages a burst of sessions took (a reconnect storm after an
//! upstream fault, say) until frees happen to empty the top of a heap; and after the first large
//! free it raises its own trim threshold, so a long-running proxy's RSS drifts by several MiB
//! with the order of its frees rather than with its load. `malloc_trim(0)` hands every free page
//! of every arena back at once. Done every few seconds off the runtime's workers, it keeps RSS
//! close to what the sessions actually hold, at no cost on the per-frame path (unlike a lower
//! `mmap` threshold, which made every 64 KiB read buffer an `mmap`/`munmap` pair and cost 60%
//! more CPU per relayed GB in the streaming bench).
//!
//! Other allocators and C libraries return memory their own way: there this does nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;

/// A running trim timer; dropping it stops the timer.
#[derive(Debug)]
pub struct MemoryTrim {
    task: Option<JoinHandle<()>>,
}

impl MemoryTrim {
    /// Trims every `interval` on a blocking thread. `None`, or a C library without
    /// `malloc_trim`, starts nothing.
    pub fn start(interval: Option<Duration>) -> MemoryTrim {
        let task = interval
            .filter(|_| SUPPORTED)
            .map(|interval| tokio::spawn(trim_every(interval)));
        MemoryTrim { task }
    }

    /// Whether a timer is running.
    pub fn is_running(&self) -> bool {
        self.task.is_some()
    }
}

impl Drop for MemoryTrim {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn trim_every(interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    // After a stall (a frozen process, a busy machine) one trim is enough, not a burst.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        // A trim walks every arena's free chunks holding that arena's lock: keep it off the
        // workers so no session's task waits behind it.
        if tokio::task::spawn_blocking(trim_now).await.is_err() {
            return;
        }
        TRIMS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether this build's C library can give free heap pages back on demand.
pub const SUPPORTED: bool = cfg!(all(target_os = "linux", target_env = "gnu"));

/// Trims the timers of this process have done.
static TRIMS: AtomicU64 = AtomicU64::new(0);

/// How many timed trims this process has done.
pub fn timed_trims() -> u64 {
    TRIMS.load(Ordering::Relaxed)
}

/// Gives every whole free page of every malloc arena back to the operating system now.
/// Returns whether any memory was released.
pub fn trim_now() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only takes the allocator's own locks and touches its own free
        // lists; it is safe to call from any thread at any time.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// Bytes the allocator holds free in its arenas (not counting mmapped chunks).
    fn free_in_arenas() -> usize {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        unsafe { libc::mallinfo2().fordblks }
    }

    #[test]
    fn a_trim_gives_freed_pages_back() {
        // Many mid-sized blocks (below the mmap threshold, so they live in the heap), every
        // other one freed: holes the heap cannot trim from its top.
        let mut blocks: Vec<Vec<u8>> = (0..2048).map(|i| vec![i as u8; 16 * 1024]).collect();
        let kept: Vec<Vec<u8>> = blocks
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| i % 2 == 1)
            .map(|(_, b)| std::mem::take(b))
            .collect();
        drop(blocks);
        assert!(
            free_in_arenas() >= 8 * 1024 * 1024,
            "the holes are free memory"
        );
        // What the holes' pages cost is only visible as RSS, which other tests in this process
        // move too: the allocator's word that it released something is the check here.
        assert!(trim_now(), "malloc_trim released nothing");
        drop(kept);
    }

    #[tokio::test(start_paused = true)]
    async fn the_timer_runs_until_dropped() {
        let before = timed_trims();
        let trim = MemoryTrim::start(Some(Duration::from_secs(10)));
        assert!(trim.is_running());
        // Not at start (nothing to give back yet), then once per interval.
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(timed_trims() - before, 2);
        drop(trim);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(timed_trims() - before, 2, "a dropped timer trims no more");
        assert!(!MemoryTrim::start(None).is_running());
    }
}
