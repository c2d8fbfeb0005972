//! What the client is told when the upstream accepted a relayed upgrade. On HTTP/1.1: the
//! upstream's 101, headers verbatim (the two ends agreed on them). On HTTP/2 (RFC 8441) the
//! proxy asked the upstream with an HTTP/1.1 WebSocket upgrade in the client's name: it checks
//! the upstream's `Sec-WebSocket-Accept` against the key it sent, and answers 200 with the
//! upstream's choices (`Sec-WebSocket-Protocol`, `-Extensions`). The frames that follow are
//! the same on both, so the byte relay is unchanged.

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use crate::proxy::wire::client_stream::HandshakeForm;
use crate::proxy::wire::headers::remove_hop_by_hop;

/// Why an upstream's 101 cannot be passed on to an HTTP/2 client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayAnswerError {
    #[error("the upstream switched to {0:?}, not to a WebSocket")]
    NotWebSocket(String),
    #[error("the upstream's Sec-WebSocket-Accept does not match the key the proxy sent")]
    BadAccept,
}

/// The answer for a client whose upgrade the upstream accepted with `upstream` (its 101's
/// headers); `sent_key` is the `Sec-WebSocket-Key` sent upstream.
pub fn accepted<B: Default>(
    form: HandshakeForm,
    sent_key: Option<&HeaderValue>,
    mut upstream: HeaderMap,
) -> Result<Response<B>, RelayAnswerError> {
    let mut resp = Response::new(B::default());
    if form == HandshakeForm::Http1Upgrade {
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        *resp.headers_mut() = upstream;
        return Ok(resp);
    }
    let upgrade = upstream
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim()
        .to_owned();
    if !upgrade.eq_ignore_ascii_case("websocket") {
        return Err(RelayAnswerError::NotWebSocket(upgrade));
    }
    let want = sent_key.map(|k| derive_accept_key(k.as_bytes()));
    let got = upstream
        .get(header::SEC_WEBSOCKET_ACCEPT)
        .and_then(|v| v.to_str().ok());
    if want.is_none() || want.as_deref() != got {
        return Err(RelayAnswerError::BadAccept);
    }
    upstream.remove(header::SEC_WEBSOCKET_ACCEPT);
    remove_hop_by_hop(&mut upstream);
    upstream.remove(header::CONTENT_LENGTH);
    *resp.headers_mut() = upstream;
    Ok(resp)
}

/// Whether an upstream answer that is not a 101 may go to the client as it is: on HTTP/2 a
/// 2xx to a CONNECT would open the stream as a tunnel the upstream never agreed to.
pub fn may_pass_refusal(form: HandshakeForm, status: StatusCode) -> bool {
    form == HandshakeForm::Http1Upgrade || !status.is_success()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
    const ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

    fn upstream_101(accept: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        h.insert(header::CONNECTION, "Upgrade".parse().unwrap());
        h.insert(header::SEC_WEBSOCKET_ACCEPT, accept.parse().unwrap());
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            "base64.binary.k8s.io".parse().unwrap(),
        );
        h
    }

    #[test]
    fn http1_gets_the_101_verbatim() {
        let resp: Response<()> =
            accepted(HandshakeForm::Http1Upgrade, None, upstream_101("anything")).unwrap();
        assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(resp.headers()[header::SEC_WEBSOCKET_ACCEPT], "anything");
        assert_eq!(resp.headers()[header::UPGRADE], "websocket");
    }

    #[test]
    fn http2_gets_200_with_the_upstreams_choice_once_its_accept_checks_out() {
        let key = HeaderValue::from_static(KEY);
        let resp: Response<()> = accepted(
            HandshakeForm::ExtendedConnect,
            Some(&key),
            upstream_101(ACCEPT),
        )
        .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let names: Vec<_> = resp.headers().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["sec-websocket-protocol"]);
        assert_eq!(
            accepted::<()>(
                HandshakeForm::ExtendedConnect,
                Some(&key),
                upstream_101("AAAAAAAAAAAAAAAAAAAAAAAAAAA=")
            )
            .unwrap_err(),
            RelayAnswerError::BadAccept
        );
        let mut spdy = upstream_101(ACCEPT);
        spdy.insert(header::UPGRADE, "SPDY/3.1".parse().unwrap());
        assert!(matches!(
            accepted::<()>(HandshakeForm::ExtendedConnect, Some(&key), spdy),
            Err(RelayAnswerError::NotWebSocket(_))
        ));
    }

    #[test]
    fn a_2xx_refusal_never_reaches_an_http2_client() {
        assert!(may_pass_refusal(
            HandshakeForm::Http1Upgrade,
            StatusCode::OK
        ));
        assert!(!may_pass_refusal(
            HandshakeForm::ExtendedConnect,
            StatusCode::OK
        ));
        assert!(may_pass_refusal(
            HandshakeForm::ExtendedConnect,
            StatusCode::FORBIDDEN
        ));
    }
}
