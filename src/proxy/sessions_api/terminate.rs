//! `DELETE …/namespaces/NS/sessions/ID`: an operator ends a live session. The session's stop
//! signal fires with who and why; the session ends through its own path (its client told, the
//! pod's process ended as in any teardown) and its audit `ended` event names them.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use super::access::Operator;
use crate::proxy::sessions::registry::live::LiveSession;
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::{failure, status_response};
use crate::session_stop::Termination;
use crate::translate::status::{Status, StatusDetails};

/// The largest body a terminate reads (a `DeleteOptions`-style object with a `reason`).
const BODY_LIMIT: usize = 16 * 1024;
/// The longest reason kept (as JSON text, as the audit log bounds its texts); the client sees
/// it in its Status, the audit log in its event.
const REASON_LIMIT: usize = 1024;

/// Ends `session` for `operator`, with the reason the request gives.
/// `query_reason` is the request's `reason` parameter, as the front door read it.
pub async fn terminate(
    req: Request<Incoming>,
    query_reason: Option<String>,
    session: &Arc<LiveSession>,
    operator: Operator,
) -> Response<ProxyBody> {
    let reason = match reason(req, query_reason).await {
        Ok(reason) => reason,
        Err(why) => return failure(StatusCode::BAD_REQUEST, "BadRequest", why),
    };
    let ended = session.stop.terminate(Termination {
        by: operator.user,
        reason,
    });
    let name = session.info.session_id.clone();
    if !ended {
        // Already ending (an earlier terminate, or a drain): the first reason stands.
        return failure(
            StatusCode::CONFLICT,
            "Conflict",
            format!("sessions.kube-ws-proxy.io \"{name}\" is already ending"),
        );
    }
    let status = Status {
        kind: "Status".into(),
        api_version: "v1".into(),
        status: "Success".into(),
        details: Some(StatusDetails {
            name,
            group: "kube-ws-proxy.io".into(),
            kind: "sessions".into(),
            ..StatusDetails::default()
        }),
        ..Status::default()
    };
    status_response(StatusCode::OK, &status)
}

/// A terminate's body, at most [`BODY_LIMIT`] bytes.
pub(super) async fn read_body(req: Request<Incoming>) -> Result<bytes::Bytes, String> {
    Ok(Limited::new(req.into_body(), BODY_LIMIT)
        .collect()
        .await
        .map_err(|e| format!("cannot read the request's body: {e}"))?
        .to_bytes())
}

/// The reason the request gives: its `reason` query parameter (`from_query`), else a JSON
/// body's `reason` (what `kubectl delete --raw` sends with `-f`), else none.
async fn reason(req: Request<Incoming>, from_query: Option<String>) -> Result<String, String> {
    let body = read_body(req).await?;
    let mut reason = match (from_query, body.is_empty()) {
        (Some(r), _) => r,
        (None, true) => String::new(),
        (None, false) => {
            let v: serde_json::Value = serde_json::from_slice(&body)
                .map_err(|e| format!("the body is not a JSON object: {e}"))?;
            v.get("reason")
                .and_then(|r| r.as_str())
                .unwrap_or_default()
                .to_owned()
        }
    };
    crate::audit::bounds::cut_text(&mut reason, REASON_LIMIT);
    Ok(reason)
}
