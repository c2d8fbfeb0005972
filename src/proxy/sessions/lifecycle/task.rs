//! A streaming session from its admission on is owned by a task of its own, never by its
//! client's request. hyper drops a request's future at whatever await it is in when the
//! client goes away (an HTTP/1.1 connection closed, an HTTP/2 RST_STREAM); a session set up
//! inside that future could be cut between the upstream's answer and its audit event, or leave
//! an upstream connection no one ends. So at admission the session's setup is spawned, with
//! its [`Running`] (slot, metrics, and later its audit trail) in it, and the request's future
//! only waits for the answer. When that future is dropped, the session learns its client is
//! gone ([`ClientPresence`]), checks it before it asks anything of the upstream, and ends like
//! any other session, through [`Running::finish`](super::end::Running::finish) or
//! its `unstarted` ends, counted and audited.

use std::future::Future;
use std::pin::Pin;

use http::Response;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::Instrument;

use super::end::Running;
use crate::proxy::observability::metrics::SessionKind;
use crate::proxy::sessions::registry::{next_session_id, SessionSlot};
use crate::proxy::sessions::state::ProxyState;
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::client_stream::HandshakeForm;
use crate::proxy::wire::status_response::failure;

/// A session's setup, boxed where it is made ([`answer`]).
pub type SessionSetup = Pin<Box<dyn Future<Output = Response<ProxyBody>> + Send>>;

/// Whether a session's client is still waiting for its answer: told by the drop of the
/// request's future ([`Hangup`]).
#[derive(Debug, Clone)]
pub struct ClientPresence(CancellationToken);

impl ClientPresence {
    /// A presence and the request side's hold on it.
    pub fn new() -> (ClientPresence, Hangup) {
        let token = CancellationToken::new();
        (ClientPresence(token.clone()), Hangup(token))
    }

    /// Whether the client went away before it was answered.
    pub fn is_gone(&self) -> bool {
        self.0.is_cancelled()
    }
}

/// The request's side of a [`ClientPresence`]: dropped with the request's future before the
/// answer came, it tells the session its client is gone.
#[derive(Debug)]
pub struct Hangup(CancellationToken);

/// Admits a session counted as `kind` for now (its path may change it): its metrics start
/// here (`sessions_admitted_total` and `sessions_active` together), and the [`Running`] that
/// will end it exists from here. The [`Hangup`] goes to [`answer`].
pub fn admit(
    state: &ProxyState,
    slot: SessionSlot,
    form: HandshakeForm,
    kind: SessionKind,
) -> (Running, Hangup) {
    let guard = state
        .metrics
        .session_admitted(state.cluster.metrics_label(), form, kind);
    let (presence, hangup) = ClientPresence::new();
    let running = Running::admitted(next_session_id(), slot, guard, presence);
    (running, hangup)
}

/// Runs `setup` (the admitted session, which owns its [`Running`]) as its own task, and waits
/// for its answer to the client. Dropped before the answer came (the client is gone), it tells
/// the session through `hangup`; the session goes on to its end regardless. A setup that
/// panicked panics here too, so that the request's panic layer answers and counts it.
///
/// `setup` comes boxed (a session's setup is the largest state a request has, tens of KB):
/// taken by value, it would be copied into this future, into a box, and it would grow every
/// future that awaits this one; boxed where it is made, it is copied once.
pub async fn answer(setup: SessionSetup, hangup: Hangup) -> Response<ProxyBody> {
    // Created before the first await: a drop at any await below tells the session.
    let on_drop: DropGuard = hangup.0.drop_guard();
    let task = tokio::spawn(setup.in_current_span());
    let answered = task.await;
    on_drop.disarm();
    match answered {
        Ok(resp) => resp,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down.
        Err(_) => failure(
            http::StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "kube-ws-proxy is shutting down; retry on another replica",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    use crate::proxy::observability::metrics::Metrics;
    use crate::proxy::sessions::registry::Sessions;

    fn ok() -> Response<ProxyBody> {
        failure(http::StatusCode::OK, "Ok", "answered")
    }

    #[tokio::test]
    async fn the_setup_goes_on_when_the_client_hangs_up_and_learns_it() {
        let (presence, hangup) = ClientPresence::new();
        let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let setup = async move {
            // Held at an await when the client goes.
            let _ = go_rx.await;
            let _ = seen_tx.send(presence.is_gone());
            ok()
        };
        let waiting = tokio::spawn(answer(Box::pin(setup), hangup));
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The client goes: hyper drops the request's future.
        waiting.abort();
        let _ = waiting.await;
        go_tx.send(()).unwrap();
        let gone = tokio::time::timeout(Duration::from_secs(1), seen_rx)
            .await
            .expect("the setup ran on to its end")
            .unwrap();
        assert!(gone, "the setup learned its client was gone");
    }

    #[tokio::test]
    async fn an_answered_client_is_not_gone() {
        let (presence, hangup) = ClientPresence::new();
        let check = presence.clone();
        let resp = answer(Box::pin(async { ok() }), hangup).await;
        assert_eq!(resp.status(), http::StatusCode::OK);
        assert!(!check.is_gone());
    }

    #[tokio::test]
    async fn a_panicking_setup_panics_in_the_request() {
        let (_presence, hangup) = ClientPresence::new();
        let request = tokio::spawn(answer(Box::pin(async { panic!("setup failed") }), hangup));
        let e = request.await.unwrap_err();
        assert!(e.is_panic());
    }

    #[tokio::test]
    async fn admission_counts_the_session_at_once() {
        use crate::proxy::auth::Authenticator;
        use crate::proxy::route::cluster::Cluster;
        use crate::proxy::sessions::state::Shared;
        use crate::proxy::upstream::endpoint::{Upstream, UpstreamTls};
        let upstream = Upstream::from_url("http://127.0.0.1:1", UpstreamTls::default()).unwrap();
        let cluster = Cluster::new(
            None,
            upstream,
            Authenticator::passthrough(),
            Default::default(),
        );
        let shared = Shared {
            metrics: Metrics::new(),
            sessions: Sessions::new(Some(1)),
            ..Shared::default()
        };
        let state = Arc::new(ProxyState::new(Arc::new(shared), Arc::new(cluster)));
        let slot = state.sessions.admit(&state.cluster).unwrap();
        let (running, _hangup) =
            admit(&state, slot, HandshakeForm::Http1Upgrade, SessionKind::Exec);
        let text = String::from_utf8(state.metrics.render()).unwrap();
        assert!(text.contains(
            r#"kube_ws_proxy_sessions_admitted_total{cluster="default",http_version="1.1"} 1"#
        ));
        assert!(text.contains(r#"kube_ws_proxy_sessions_active{cluster="default",kind="exec"} 1"#));
        assert!(!running.client_gone());
        drop(running);
        assert_eq!(state.sessions.active(), 0);
    }
}
