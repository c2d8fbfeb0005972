//! WebSockets over HTTP/2 (RFC 8441): an extended `CONNECT` with `:protocol websocket` is
//! rewritten into the request an HTTP/1.1 upgrade would have been (`GET`, `Upgrade:
//! websocket`, `Connection: Upgrade`, a `Sec-WebSocket-Key`), marked
//! [`HandshakeForm::ExtendedConnect`]. Classification, authentication, admission, the handlers
//! and the relays then see one form; only the answer differs (200 instead of 101, see
//! [`ClientAnswer`](crate::proxy::client::websocket::ClientAnswer)).
//!
//! A `CONNECT` of any other kind, HTTP/1.1's included, is refused here with 405: the proxy
//! opens no tunnels, and both versions must agree on that (an HTTP/1.1 `CONNECT host:port`
//! would otherwise go upstream as a plain request).
//!
//! The key is ours: RFC 8441 drops `Sec-WebSocket-Key`/`-Accept` on HTTP/2, but a relayed
//! session's upstream is asked with an HTTP/1.1 upgrade, whose `Sec-WebSocket-Accept` the
//! proxy then checks against this key.

use base64::Engine;
use http::{header, HeaderValue, Method, Request, StatusCode, Version};

use crate::proxy::wire::client_stream::HandshakeForm;

/// The only `:protocol` served.
pub const WEBSOCKET: &str = "websocket";

/// Why a `CONNECT` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectRefusal {
    /// A plain `CONNECT` (HTTP/1.1, or HTTP/2 without `:protocol`): a tunnel to some host,
    /// which this proxy never opens.
    #[error(
        "CONNECT is not served: kube-ws-proxy opens no tunnels (it is not a forward proxy); \
         WebSockets over HTTP/2 use an extended CONNECT with :protocol websocket (RFC 8441)"
    )]
    PlainConnect,
    /// An extended `CONNECT` for a protocol other than WebSocket.
    #[error("unsupported :protocol {0:?}: only websocket is served")]
    UnsupportedProtocol(String),
}

impl ConnectRefusal {
    /// The HTTP status and Kubernetes Status reason for the client.
    pub fn status(&self) -> (StatusCode, &'static str) {
        match self {
            ConnectRefusal::PlainConnect => (StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
            ConnectRefusal::UnsupportedProtocol(_) => (StatusCode::BAD_REQUEST, "BadRequest"),
        }
    }
}

/// Whether `req` is an HTTP/2 extended `CONNECT` for a WebSocket.
pub fn is_websocket<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_2
        && req.method() == Method::CONNECT
        && req
            .extensions()
            .get::<hyper::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case(WEBSOCKET))
}

/// Rewrites an HTTP/2 extended `CONNECT` for a WebSocket into the HTTP/1.1 upgrade form;
/// leaves every other request as it is, but refuses any other `CONNECT`, whatever its HTTP
/// version.
pub fn normalize<B>(req: &mut Request<B>) -> Result<(), ConnectRefusal> {
    if req.method() != Method::CONNECT {
        return Ok(());
    }
    if req.version() != Version::HTTP_2 {
        // Extended CONNECT exists only in HTTP/2; in HTTP/1.x CONNECT means a tunnel.
        return Err(ConnectRefusal::PlainConnect);
    }
    let protocol = req.extensions().get::<hyper::ext::Protocol>();
    match protocol {
        None => return Err(ConnectRefusal::PlainConnect),
        Some(p) if !p.as_str().eq_ignore_ascii_case(WEBSOCKET) => {
            return Err(ConnectRefusal::UnsupportedProtocol(p.as_str().to_owned()))
        }
        Some(_) => {}
    }
    *req.method_mut() = Method::GET;
    let h = req.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static(WEBSOCKET));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::SEC_WEBSOCKET_KEY, fresh_key());
    req.extensions_mut().insert(HandshakeForm::ExtendedConnect);
    Ok(())
}

/// A random `Sec-WebSocket-Key` (16 bytes, base64).
fn fresh_key() -> HeaderValue {
    let mut nonce = [0u8; 16];
    // The key only has to differ between requests (RFC 6455 §4.1 asks for randomness so that
    // a cache cannot replay an answer); should the OS source fail, the time still does that.
    if getrandom::fill(&mut nonce).is_err() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        nonce.copy_from_slice(&now.to_le_bytes());
    }
    let key = base64::engine::general_purpose::STANDARD.encode(nonce);
    HeaderValue::from_str(&key).expect("base64 is a header value")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::client::websocket::is_valid_key;
    use crate::proxy::route::classify::{classify, Class};
    use crate::translate::exec_options::Subresource;

    fn h2_connect(protocol: Option<&'static str>, subprotocols: &str) -> Request<()> {
        let mut req = Request::builder()
            .method(Method::CONNECT)
            .version(Version::HTTP_2)
            .uri("https://proxy.example/api/v1/namespaces/default/pods/web/exec?command=ls")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-protocol", subprotocols)
            .body(())
            .unwrap();
        if let Some(p) = protocol {
            req.extensions_mut()
                .insert(hyper::ext::Protocol::from_static(p));
        }
        req
    }

    #[test]
    fn websocket_connect_becomes_the_http1_upgrade() {
        let mut req = h2_connect(Some("websocket"), "v5.channel.k8s.io");
        assert!(is_websocket(&req));
        normalize(&mut req).unwrap();
        assert_eq!(req.method(), Method::GET);
        assert_eq!(
            req.extensions().get::<HandshakeForm>(),
            Some(&HandshakeForm::ExtendedConnect)
        );
        let key = req.headers().get(header::SEC_WEBSOCKET_KEY).unwrap();
        assert!(is_valid_key(key.as_bytes()));
        // The classifier sees exactly the upgrade an HTTP/1.1 client would have sent.
        assert_eq!(
            classify(
                req.method(),
                &crate::request::target::RequestTarget::parse(req.uri().path(), None).unwrap(),
                req.headers()
            ),
            Class::Translate {
                subresource: Subresource::Exec,
                bearer: None
            }
        );
        let mut other = h2_connect(Some("websocket"), "v5.channel.k8s.io");
        normalize(&mut other).unwrap();
        assert_ne!(
            other.headers().get(header::SEC_WEBSOCKET_KEY),
            Some(key),
            "every request gets its own key"
        );
    }

    #[test]
    fn other_connects_are_refused_and_other_requests_left_alone() {
        let mut plain = h2_connect(None, "v5.channel.k8s.io");
        assert!(!is_websocket(&plain));
        assert_eq!(normalize(&mut plain), Err(ConnectRefusal::PlainConnect));
        assert_eq!(
            ConnectRefusal::PlainConnect.status().0,
            StatusCode::METHOD_NOT_ALLOWED
        );
        let mut webtransport = h2_connect(Some("webtransport"), "");
        assert_eq!(
            normalize(&mut webtransport),
            Err(ConnectRefusal::UnsupportedProtocol("webtransport".into()))
        );
        // HTTP/1.x CONNECT is a tunnel too, refused as HTTP/2's is, even with a :protocol
        // extension somehow attached.
        for version in [Version::HTTP_10, Version::HTTP_11] {
            let mut h1 = Request::builder()
                .method(Method::CONNECT)
                .version(version)
                .uri("proxy.example:443")
                .body(())
                .unwrap();
            h1.extensions_mut()
                .insert(hyper::ext::Protocol::from_static("websocket"));
            assert_eq!(normalize(&mut h1), Err(ConnectRefusal::PlainConnect));
        }
        // Other HTTP/1.1 requests are not this module's business.
        let mut h1_get = Request::builder()
            .uri("/api")
            .header("upgrade", "websocket")
            .body(())
            .unwrap();
        normalize(&mut h1_get).unwrap();
        assert_eq!(h1_get.headers().len(), 1);
        let mut get = Request::builder()
            .version(Version::HTTP_2)
            .uri("https://proxy.example/api")
            .body(())
            .unwrap();
        normalize(&mut get).unwrap();
        assert!(get.headers().is_empty());
    }
}
