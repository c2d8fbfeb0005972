//! An upstream that would not open a session the client asked for over HTTP (the tunnel, and
//! the reverse translator for SPDY clients): counted, audited, and answered as kube-apiserver
//! answers it, a refusal ≥ 400 replayed as the upstream sent it and anything else a 502
//! `Status` (PROTOCOL.md §2.1).

use bytes::Bytes;
use http::{header, HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use super::lifecycle::end::Running;
use super::state::ProxyState;
use crate::proxy::upstream::error::{reported, UpstreamFailure};
use crate::proxy::upstream::spdy_dial::DialError;
use crate::proxy::upstream::websocket_dial::WebSocketDialError;
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::headers::is_hop_by_hop;
use crate::proxy::wire::status_response::failure;
use crate::spdy::upgrade::UpgradeError;

/// The upstream's answer other than 101, as it came.
pub struct Refused {
    pub status: StatusCode,
    pub headers: Box<HeaderMap>,
    pub body: Bytes,
}

/// A failed upstream dial of either kind (SPDY or WebSocket).
pub trait DialFailure: UpstreamFailure + Sized {
    /// The upstream's HTTP status when it answered; 0 when it did not.
    fn upstream_status(&self) -> u16;
    /// The upstream's answer, when it gave one; else the error itself.
    fn into_refused(self) -> Result<Refused, Self>;
}

impl DialFailure for DialError {
    fn upstream_status(&self) -> u16 {
        DialError::upstream_status(self)
    }

    fn into_refused(self) -> Result<Refused, Self> {
        match self {
            DialError::Upgrade(UpgradeError::Refused {
                status,
                headers,
                body,
            }) => Ok(Refused {
                status,
                headers,
                body,
            }),
            e => Err(e),
        }
    }
}

impl DialFailure for WebSocketDialError {
    fn upstream_status(&self) -> u16 {
        WebSocketDialError::upstream_status(self)
    }

    fn into_refused(self) -> Result<Refused, Self> {
        match self {
            WebSocketDialError::Refused {
                status,
                headers,
                body,
            } => Ok(Refused {
                status,
                headers,
                body,
            }),
            e => Err(e),
        }
    }
}

/// Ends `running`, which its upstream would not open (`e`), and answers the client.
pub fn refuse(state: &ProxyState, running: Running, e: impl DialFailure) -> Response<ProxyBody> {
    let status = e.upstream_status();
    state
        .metrics
        .upstream_upgrade_failure(state.cluster.metrics_label(), status);
    running.upstream_refused(format!("upstream refused: {e}"), status);
    response(e)
}

/// The client's answer to a failed upstream dial.
fn response(e: impl DialFailure) -> Response<ProxyBody> {
    match e.into_refused() {
        Ok(refused) if refused.status.as_u16() >= 400 => replay(refused),
        Ok(refused) => failure(
            StatusCode::BAD_GATEWAY,
            "BadGateway",
            format!(
                "invalid upgrade response: status code {}",
                refused.status.as_u16()
            ),
        ),
        // The cause goes to the log; the client, who may be anyone, gets its kind.
        Err(e) => failure(
            StatusCode::BAD_GATEWAY,
            "BadGateway",
            format!("error dialing the upstream: {}", reported(&e)),
        ),
    }
}

/// The upstream's refusal, as it sent it (hop-by-hop headers and its length aside: the body
/// may have been capped).
fn replay(refused: Refused) -> Response<ProxyBody> {
    let mut resp = Response::new(
        Full::new(refused.body)
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = refused.status;
    for (name, value) in refused.headers.iter() {
        if is_hop_by_hop(name) || name == header::CONTENT_LENGTH {
            continue;
        }
        resp.headers_mut().append(name.clone(), value.clone());
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn refused(status: u16) -> WebSocketDialError {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        WebSocketDialError::Refused {
            status: StatusCode::from_u16(status).unwrap(),
            headers: Box::new(headers),
            body: Bytes::from_static(b"{\"kind\":\"Status\"}"),
        }
    }

    #[test]
    fn a_refusal_of_400_or_more_is_replayed_without_hop_by_hop_headers() {
        let resp = response(refused(403));
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
        assert!(resp.headers().get(header::CONNECTION).is_none());
        assert!(resp.headers().get(header::CONTENT_LENGTH).is_none());
    }

    #[test]
    fn a_redirect_or_other_non_101_below_400_is_a_502() {
        let resp = response(refused(302));
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
        let resp = response(DialError::Upgrade(UpgradeError::Refused {
            status: StatusCode::OK,
            headers: Box::default(),
            body: Bytes::new(),
        }));
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    }

    #[test]
    fn no_answer_at_all_is_a_502() {
        let resp = response(DialError::Timeout(std::time::Duration::from_secs(1)));
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
        let resp = response(WebSocketDialError::BadHandshake("no accept"));
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    }
}
