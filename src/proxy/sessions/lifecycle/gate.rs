//! What the proxy answers itself before a streaming session starts, so that nothing goes
//! upstream for it and it writes no audit event: a kubelet session through
//! `nodes/{node}/proxy` under `--node-proxy-sessions=refuse` (403); a caller address whose
//! refused sessions have spent its budget (429, [`RefusalBudget`]); and, in passthrough mode
//! with the audit log on, a caller the upstream does not authenticate (401).
//!
//! [`RefusalBudget`]: crate::audit::refusals::RefusalBudget

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use tracing::debug;

use super::audit::{outbound_credentials, REVIEW_TIMEOUT};
use crate::proxy::auth::self_subject_review::SelfReview;
use crate::proxy::auth::{AuthMode, Caller};
use crate::proxy::observability::metrics::HandshakeRejection;
use crate::proxy::route::kubelet::NodeProxySessions;
use crate::proxy::sessions::state::ProxyState;
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::failure;
use crate::request::node::{form_media_type, FormBody};

/// The answer to a session that must not start, or `None`. `kubelet`: the request is a
/// kubelet call through `nodes/{node}/proxy`.
pub async fn check(
    state: &ProxyState,
    caller: &Caller,
    headers: &HeaderMap,
    kubelet: bool,
) -> Option<Response<ProxyBody>> {
    if kubelet && state.node_proxy_sessions == NodeProxySessions::Refuse {
        return Some(refuse_kubelet_session(state));
    }
    if let Some(refusal) = spent_budget(state, caller) {
        return Some(refusal);
    }
    refuse_unauthenticated(state, caller, headers).await
}

/// The 403 for a kubelet session under `--node-proxy-sessions=refuse`.
fn refuse_kubelet_session(state: &ProxyState) -> Response<ProxyBody> {
    state.metrics.handshake_rejected(
        state.cluster.metrics_label(),
        HandshakeRejection::NodeProxySession,
    );
    failure(
        StatusCode::FORBIDDEN,
        "Forbidden",
        "kube-ws-proxy refuses exec, attach, portForward and run on the kubelet through \
         nodes/{node}/proxy (--node-proxy-sessions=refuse); use the pod's exec, attach or \
         portforward subresource",
    )
}

/// The 429 for a caller address whose refused sessions spent its budget.
fn spent_budget(state: &ProxyState, caller: &Caller) -> Option<Response<ProxyBody>> {
    let log = state.audit.as_ref()?;
    let wait = log.refusals().admit(caller.address()).err()?;
    state.metrics.handshake_rejected(
        state.cluster.metrics_label(),
        HandshakeRejection::RefusedSessions,
    );
    debug!(caller = %caller.address(), "refused: the address's refused sessions spent its budget");
    let mut resp = failure(
        StatusCode::TOO_MANY_REQUESTS,
        "TooManyRequests",
        "too many refused sessions from this address (--audit-refusal-burst); try again later",
    );
    let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    Some(resp)
}

/// In passthrough mode with the audit log on, the refusal of a caller the upstream does not
/// authenticate: its SelfSubjectReview (made with the credentials its session would carry, or
/// none) was answered 401, so its session would be too. The proxy answers that 401 itself:
/// unauthenticated callers cannot fill the audit log. The answer is kept per credential for
/// a few seconds, and the session's own identity comes from it.
async fn refuse_unauthenticated(
    state: &ProxyState,
    caller: &Caller,
    headers: &HeaderMap,
) -> Option<Response<ProxyBody>> {
    if state.audit.is_none() || state.cluster.auth.mode() != AuthMode::Passthrough {
        return None;
    }
    // Asked anonymously when the session would carry no credentials.
    let credentials =
        outbound_credentials(state, caller, headers).unwrap_or(HeaderValue::from_static(""));
    let timeout = state.handshake_timeout.min(REVIEW_TIMEOUT);
    let review = state
        .cluster
        .self_reviews
        .review(
            &state.cluster.client,
            &state.cluster.upstream,
            credentials,
            timeout,
        )
        .await;
    (review == SelfReview::Unauthenticated).then(|| {
        state
            .metrics
            .auth_rejected(state.cluster.metrics_label(), "upstream_unauthenticated");
        failure(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
    })
}

/// The 400 for a kubelet streaming session whose request has a form body: the kubelet reads
/// its stream options from such a body before the query, which the proxy reads them from.
pub fn refuse_form_body(headers: &HeaderMap, body: &[u8]) -> Option<Response<ProxyBody>> {
    let content_type = headers.get(header::CONTENT_TYPE)?.to_str().unwrap_or("");
    if body.is_empty() || form_media_type(content_type).is_none() {
        return None;
    }
    Some(failure(
        StatusCode::BAD_REQUEST,
        "BadRequest",
        "kube-ws-proxy does not take a form body with a kubelet session: put its options in \
         the query",
    ))
}

/// The 400 for a kubelet `run` whose body is multipart, which the proxy does not read.
pub fn refuse_multipart(headers: &HeaderMap) -> Option<Response<ProxyBody>> {
    let content_type = headers.get(header::CONTENT_TYPE)?.to_str().unwrap_or("");
    (form_media_type(content_type) == Some(FormBody::Multipart)).then(|| {
        failure(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "kube-ws-proxy does not read a multipart body for the kubelet's run: send cmd \
             form-encoded or in the query",
        )
    })
}
