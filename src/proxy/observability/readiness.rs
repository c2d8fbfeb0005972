//! `/readyz`'s upstream check, shared: a probe dials the upstream (TCP, and TLS when it is
//! https), and its verdict answers every probe for [`READY_CACHE`]; probes that come while a
//! check runs wait for that check rather than start their own. However often `/readyz` is
//! asked, the upstream sees at most one connection per cache period from it.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// How long one check's verdict answers probes: short enough that a load balancer sees the
/// upstream go and come back within a probe period or two.
pub const READY_CACHE: Duration = Duration::from_secs(1);

/// `Ok`, or why the upstream is not ready (the probe's answer body).
pub type Verdict = Result<(), String>;

/// The last check and the one running, if any.
#[derive(Debug)]
pub struct Readiness {
    cache: Duration,
    slot: Mutex<Slot>,
}

#[derive(Debug)]
enum Slot {
    Empty,
    /// A check runs; its verdict arrives here.
    Checking(watch::Receiver<Option<Verdict>>),
    Checked {
        at: Instant,
        verdict: Verdict,
    },
}

impl Readiness {
    /// No check yet; verdicts answer probes for `cache`.
    pub fn new(cache: Duration) -> Arc<Readiness> {
        Arc::new(Readiness {
            cache,
            slot: Mutex::new(Slot::Empty),
        })
    }

    /// The verdict of a check finished less than the cache period ago, or of the running
    /// check, or of a new one made with `probe` (on its own task, so that a probe that gives
    /// up waiting does not cancel the check the others wait for).
    pub async fn check<F, Fut>(self: &Arc<Self>, probe: F) -> Verdict
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Verdict> + Send + 'static,
    {
        let mut running = {
            let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
            match &*slot {
                Slot::Checked { at, verdict } if at.elapsed() < self.cache => {
                    return verdict.clone()
                }
                // A check whose task died (a panic) never answers: start another.
                Slot::Checking(rx) if rx.has_changed().is_ok() => rx.clone(),
                _ => {
                    let (tx, rx) = watch::channel(None);
                    *slot = Slot::Checking(rx.clone());
                    let check = probe();
                    let this = self.clone();
                    tokio::spawn(async move {
                        let verdict = check.await;
                        *this.slot.lock().unwrap_or_else(PoisonError::into_inner) = Slot::Checked {
                            at: Instant::now(),
                            verdict: verdict.clone(),
                        };
                        let _ = tx.send(Some(verdict));
                    });
                    rx
                }
            }
        };
        // The slot's lock is released: waiting holds only this receiver.
        let verdict = match running.wait_for(Option::is_some).await {
            Ok(verdict) => verdict.clone(),
            Err(_) => None,
        };
        verdict.unwrap_or_else(|| Err("the readiness check ended without a verdict".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A probe that takes 100 ms and answers what `up` says, counting its runs.
    fn probe(
        runs: &Arc<AtomicUsize>,
        up: bool,
    ) -> impl FnOnce() -> std::pin::Pin<Box<dyn Future<Output = Verdict> + Send>> {
        let runs = runs.clone();
        move || {
            runs.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if up {
                    Ok(())
                } else {
                    Err("upstream: connection refused".into())
                }
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_probes_share_one_check() {
        let r = Readiness::new(READY_CACHE);
        let runs = Arc::new(AtomicUsize::new(0));
        let probes: Vec<_> = (0..500)
            .map(|_| {
                let r = r.clone();
                let p = probe(&runs, true);
                tokio::spawn(async move { r.check(p).await })
            })
            .collect();
        for p in probes {
            assert_eq!(p.await.unwrap(), Ok(()));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_verdict_answers_for_the_cache_period_then_a_change_is_seen() {
        let r = Readiness::new(READY_CACHE);
        let runs = Arc::new(AtomicUsize::new(0));
        assert_eq!(r.check(probe(&runs, true)).await, Ok(()));
        // Within the cache period the upstream going away is not seen yet, and not dialled.
        for _ in 0..9 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(r.check(probe(&runs, false)).await, Ok(()));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(r.check(probe(&runs, false)).await.is_err());
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        // 2,000 probes over 2 s cost three checks at most.
        for _ in 0..2000 {
            tokio::time::sleep(Duration::from_millis(1)).await;
            let _ = r.check(probe(&runs, true)).await;
        }
        assert!(runs.load(Ordering::SeqCst) <= 5, "{runs:?}");
    }

    async fn a_probe_with_a_bug() -> Verdict {
        panic!("a bug in the probe")
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_that_died_is_replaced() {
        let r = Readiness::new(READY_CACHE);
        let died = r.check(a_probe_with_a_bug).await;
        assert!(died.is_err());
        let runs = Arc::new(AtomicUsize::new(0));
        assert_eq!(r.check(probe(&runs, true)).await, Ok(()));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
