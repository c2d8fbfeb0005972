//! The signal that tells one running session to end now, and why: the proxy's drain timeout
//! passed, its cluster left the configuration, or an operator terminated it (the sessions
//! API). Each session has a signal of its own, a child of its cluster's (which is a child of
//! the proxy's), so that ending one session touches no other, and every path that ends a
//! session on the signal can tell its client why.

use std::sync::{Arc, OnceLock};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Who ended a session through the sessions API, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Termination {
    /// The operator's user name.
    pub by: String,
    /// What they gave as the reason (possibly empty).
    pub reason: String,
}

impl Termination {
    /// What the session's client is told: `terminated by <user>: <reason>`.
    pub fn message(&self) -> String {
        match self.reason.is_empty() {
            true => format!("kube-ws-proxy ended the session: terminated by {}", self.by),
            false => format!(
                "kube-ws-proxy ended the session: terminated by {}: {}",
                self.by, self.reason
            ),
        }
    }
}

/// Why a session was told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason<'a> {
    /// The proxy's drain timeout passed, or the session's cluster left the configuration.
    Drain,
    /// An operator ended it.
    Terminated(&'a Termination),
}

/// One session's stop signal; clones share it.
#[derive(Debug, Clone, Default)]
pub struct SessionStop {
    token: CancellationToken,
    terminated: Arc<OnceLock<Termination>>,
}

impl SessionStop {
    /// A session's own signal, fired too when `parent` (its cluster's) fires.
    pub fn child_of(parent: &CancellationToken) -> SessionStop {
        SessionStop {
            token: parent.child_token(),
            terminated: Arc::default(),
        }
    }

    /// Resolves once the session must end.
    pub async fn stopped(&self) {
        self.token.cancelled().await
    }

    /// [`stopped`](Self::stopped), owning what it waits on.
    pub fn stopped_owned(&self) -> WaitForCancellationFutureOwned {
        self.token.clone().cancelled_owned()
    }

    /// Whether the session must end.
    pub fn is_stopped(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Why it must end (a drain unless an operator terminated it); `None` while it need not.
    pub fn reason(&self) -> Option<StopReason<'_>> {
        if !self.is_stopped() {
            return None;
        }
        Some(match self.terminated.get() {
            Some(t) => StopReason::Terminated(t),
            None => StopReason::Drain,
        })
    }

    /// Who terminated it, if an operator did (whether or not it has ended yet).
    pub fn termination(&self) -> Option<&Termination> {
        self.terminated.get()
    }

    /// Ends the session for `termination`; `false` when it was already told to end (by a drain
    /// or an earlier termination, whose reason stands).
    pub fn terminate(&self, termination: Termination) -> bool {
        if self.is_stopped() {
            return false;
        }
        let first = self.terminated.set(termination).is_ok();
        self.token.cancel();
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by(user: &str) -> Termination {
        Termination {
            by: user.into(),
            reason: "enough".into(),
        }
    }

    #[test]
    fn a_termination_stops_one_session_and_says_who() {
        let cluster = CancellationToken::new();
        let (a, b) = (
            SessionStop::child_of(&cluster),
            SessionStop::child_of(&cluster),
        );
        assert_eq!(a.reason(), None);
        assert!(a.terminate(by("alice")));
        assert!(a.is_stopped() && !b.is_stopped() && !cluster.is_cancelled());
        assert_eq!(a.reason(), Some(StopReason::Terminated(&by("alice"))));
        assert_eq!(
            a.termination().unwrap().message(),
            "kube-ws-proxy ended the session: terminated by alice: enough"
        );
        // A second operator does not rewrite the first one's reason.
        assert!(!a.terminate(by("bob")));
        assert_eq!(a.termination(), Some(&by("alice")));
    }

    #[test]
    fn a_drain_is_a_drain_and_a_later_termination_does_not_claim_it() {
        let cluster = CancellationToken::new();
        let a = SessionStop::child_of(&cluster);
        cluster.cancel();
        assert_eq!(a.reason(), Some(StopReason::Drain));
        assert!(!a.terminate(by("alice")));
        assert_eq!(a.reason(), Some(StopReason::Drain));
    }

    #[tokio::test]
    async fn stopped_resolves_on_either() {
        let cluster = CancellationToken::new();
        let a = SessionStop::child_of(&cluster);
        let waiting = tokio::spawn(a.stopped_owned());
        a.terminate(by("alice"));
        tokio::time::timeout(std::time::Duration::from_secs(1), waiting)
            .await
            .unwrap()
            .unwrap();
    }
}
