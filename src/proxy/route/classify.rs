//! Every request on the main listener is classified once, here (DESIGN.md "One request, one
//! decision"). A pure function of method, the request target as the API server reads it
//! (decoded: `%65xec` is an exec) and headers; the table in the tests is the spec.

use http::{header, HeaderMap, Method};

use crate::request::pod::{pod_subresource, Subresource};
use crate::request::target::RequestTarget;
use crate::translate::protocol::ChannelProtocol;
use crate::translate::subprotocol::{BearerToken, OfferedProtocols};

/// What kind of relay an upgrade gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayKind {
    /// `Upgrade: SPDY/3.1` (kubectl ≤ 1.30 and kubectl's fallback).
    Spdy,
    /// A WebSocket the upstream serves natively (legacy exec/port-forward protocols, logs).
    WebSocket,
    /// Any other upgrade.
    Other,
}

/// The handler a request goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Class {
    /// exec/attach WebSocket offering `v5.channel.k8s.io`: translate to SPDY, or pass through
    /// to a cluster that serves it (`--upstream-streaming`, src/proxy/sessions/pass_through.rs).
    Translate {
        subresource: Subresource,
        bearer: Option<BearerToken>,
    },
    /// WebSocket offering `SPDY/3.1+<name>.k8s.io`: tunnel (or pass through, as for
    /// `Translate`); `protocols` are de-prefixed.
    Tunnel {
        protocols: Vec<String>,
        bearer: Option<BearerToken>,
    },
    /// Relay the upgrade byte for byte; `bearer` is a subprotocol token (passthrough mode turns
    /// it into `Authorization`).
    Relay {
        kind: RelayKind,
        bearer: Option<BearerToken>,
    },
    /// No upgrade: reverse proxy.
    Forward,
    /// A request we must refuse before doing anything (e.g. a malformed bearer subprotocol).
    BadRequest(String),
}

fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
            .unwrap_or(false)
    })
}

/// What an `Upgrade` other than exactly `websocket` asks for, as the kubelet reads its first
/// value: its SPDY upgrader takes any value that contains `SPDY/3.1` (any case), so
/// `h2c, SPDY/3.1` and `websocket, SPDY/3.1` are SPDY (the kubelet's WebSocket check wants the
/// whole value to be `websocket`). A value starting with `SPDY` is relayed as SPDY too.
fn upgrade_kind(upgrade: &str) -> RelayKind {
    let spdy = upgrade.to_ascii_lowercase().contains("spdy/3.1")
        || (upgrade.len() >= 4 && upgrade[..4].eq_ignore_ascii_case("spdy"));
    if spdy {
        RelayKind::Spdy
    } else {
        RelayKind::Other
    }
}

/// Classifies one request.
pub fn classify(method: &Method, target: &RequestTarget, headers: &HeaderMap) -> Class {
    // Checked on every request, upgrade or not: a malformed offer (a bad bearer entry, a line
    // that is not visible ASCII) is refused outright, so nothing is forwarded on its behalf.
    let mut offered = match OfferedProtocols::from_headers(headers) {
        Ok(o) => o,
        Err(e) => return Class::BadRequest(format!("invalid WebSocket subprotocol: {e}")),
    };
    let Some(upgrade) = headers.get(header::UPGRADE).and_then(|v| v.to_str().ok()) else {
        return Class::Forward;
    };
    if !has_token(headers, header::CONNECTION, "upgrade") {
        // `Upgrade` without `Connection: upgrade` is not an upgrade request (RFC 9110 §7.8).
        return Class::Forward;
    }
    let upgrade = upgrade.trim();
    let relay = |kind, offered: &mut OfferedProtocols| Class::Relay {
        kind,
        bearer: offered.take_bearer(),
    };
    if !upgrade.eq_ignore_ascii_case("websocket") {
        return relay(upgrade_kind(upgrade), &mut offered);
    }
    let _ = method;
    let subresource = pod_subresource(target.path());
    // Only port-forward is tunnelled, as kube-apiserver tunnels only port-forward: a tunnel
    // offered on an exec path would carry a SPDY exec inside the WebSocket, which nothing on
    // the way could record.
    let tunnel = offered.tunnel_protocols();
    if !tunnel.is_empty() && subresource == Some(Subresource::PortForward) {
        return Class::Tunnel {
            protocols: tunnel,
            bearer: offered.take_bearer(),
        };
    }
    if let Some(subresource) = subresource {
        let exec_like = matches!(subresource, Subresource::Exec | Subresource::Attach);
        if exec_like && offered.contains(ChannelProtocol::V5.name()) {
            return Class::Translate {
                subresource,
                bearer: offered.take_bearer(),
            };
        }
    }
    relay(RelayKind::WebSocket, &mut offered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::subprotocol::bearer_entry;

    const EXEC: &str = "/api/v1/namespaces/default/pods/web/exec";
    const ATTACH: &str = "/api/v1/namespaces/default/pods/web/attach";
    const PF: &str = "/api/v1/namespaces/default/pods/web/portforward";
    const LOG: &str = "/api/v1/namespaces/default/pods/web/log";

    fn ws(protocols: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        h.insert(header::CONNECTION, "Upgrade".parse().unwrap());
        for p in protocols {
            h.append(header::SEC_WEBSOCKET_PROTOCOL, p.parse().unwrap());
        }
        h
    }

    fn ws_header_only(protocols: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, protocols.parse().unwrap());
        h
    }

    fn spdy() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, "SPDY/3.1".parse().unwrap());
        h.insert(header::CONNECTION, "Upgrade".parse().unwrap());
        h
    }

    fn upgrade(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, value.parse().unwrap());
        h.insert(header::CONNECTION, "Upgrade".parse().unwrap());
        h
    }

    fn ws_relay() -> Class {
        Class::Relay {
            kind: RelayKind::WebSocket,
            bearer: None,
        }
    }

    fn translate(sub: Subresource) -> Class {
        Class::Translate {
            subresource: sub,
            bearer: None,
        }
    }

    #[test]
    fn the_table() {
        use Class::*;
        let token = bearer_entry("secret");
        let token_v5 = format!("{token}, v5.channel.k8s.io");
        let cases: Vec<(&str, Method, &str, HeaderMap, Class)> = vec![
            ("kubectl 1.31+ exec", Method::GET, EXEC, ws(&["v5.channel.k8s.io"]), translate(Subresource::Exec)),
            ("kubectl attach", Method::GET, ATTACH, ws(&["v5.channel.k8s.io"]), translate(Subresource::Attach)),
            ("v5 after v4", Method::GET, EXEC, ws(&["v4.channel.k8s.io, v5.channel.k8s.io"]), translate(Subresource::Exec)),
            ("v5 on a second header line", Method::GET, EXEC, ws(&["v4.channel.k8s.io", "v5.channel.k8s.io"]), translate(Subresource::Exec)),
            ("v4 exec is relayed", Method::GET, EXEC, ws(&["v4.channel.k8s.io"]), ws_relay()),
            ("v1 exec is relayed", Method::GET, EXEC, ws(&["channel.k8s.io"]), ws_relay()),
            ("base64 exec is relayed", Method::GET, EXEC, ws(&["base64.channel.k8s.io"]), ws_relay()),
            ("no subprotocol is relayed", Method::GET, EXEC, ws(&[]), ws_relay()),
            ("only v3 is relayed (upstream refuses)", Method::GET, EXEC, ws(&["v3.channel.k8s.io"]), ws_relay()),
            ("tunnel", Method::GET, PF, ws(&["SPDY/3.1+portforward.k8s.io"]), Tunnel { protocols: vec!["portforward.k8s.io".into()], bearer: None }),
            ("python offers v5,v4 on portforward", Method::GET, PF, ws(&["v5.channel.k8s.io, v4.channel.k8s.io"]), ws_relay()),
            ("legacy portforward", Method::GET, PF, ws(&["v4.channel.k8s.io"]), ws_relay()),
            ("log over websocket", Method::GET, LOG, ws(&["binary.k8s.io"]), ws_relay()),
            ("v5 on a log is relayed", Method::GET, LOG, ws(&["v5.channel.k8s.io"]), ws_relay()),
            ("kubectl SPDY exec", Method::POST, EXEC, spdy(), Relay { kind: RelayKind::Spdy, bearer: None }),
            ("kubectl SPDY portforward", Method::POST, PF, spdy(), Relay { kind: RelayKind::Spdy, bearer: None }),
            ("h2c, SPDY/3.1 is SPDY to the kubelet", Method::POST, EXEC, upgrade("h2c, SPDY/3.1"), Relay { kind: RelayKind::Spdy, bearer: None }),
            ("websocket, SPDY/3.1 is SPDY too", Method::POST, EXEC, upgrade("websocket, SPDY/3.1"), Relay { kind: RelayKind::Spdy, bearer: None }),
            ("spdy/3.1 in any case", Method::POST, PF, upgrade("foo-Spdy/3.1x"), Relay { kind: RelayKind::Spdy, bearer: None }),
            ("SPDY/3.1 on a second Upgrade line is not read", Method::POST, EXEC, { let mut h = upgrade("h2c"); h.append(header::UPGRADE, "SPDY/3.1".parse().unwrap()); h }, Relay { kind: RelayKind::Other, bearer: None }),
            ("a kubelet exec through the node proxy is relayed", Method::POST, "/api/v1/nodes/w/proxy/exec/ns/p/c", spdy(), Relay { kind: RelayKind::Spdy, bearer: None }),
            ("a kubelet v5 exec through the node proxy is relayed, never translated", Method::GET, "/api/v1/nodes/w/proxy/exec/ns/p/c", ws(&["v5.channel.k8s.io"]), ws_relay()),
            ("h2c or other upgrade", Method::GET, "/api", { let mut h = HeaderMap::new(); h.insert(header::UPGRADE, "h2c".parse().unwrap()); h.insert(header::CONNECTION, "Upgrade, HTTP2-Settings".parse().unwrap()); h }, Relay { kind: RelayKind::Other, bearer: None }),
            ("plain GET", Method::GET, "/api/v1/pods", HeaderMap::new(), Forward),
            ("watch", Method::GET, "/api/v1/pods?watch=true", HeaderMap::new(), Forward),
            ("POST create", Method::POST, "/api/v1/namespaces/default/pods", HeaderMap::new(), Forward),
            ("Upgrade without Connection", Method::GET, EXEC, { let mut h = ws(&["v5.channel.k8s.io"]); h.remove(header::CONNECTION); h }, Forward),
            ("exec path without upgrade", Method::POST, EXEC, HeaderMap::new(), Forward),
            ("bearer + v5", Method::GET, EXEC, ws(&[&token_v5]), Translate { subresource: Subresource::Exec, bearer: OfferedProtocols::parse([token_v5.as_str()]).unwrap().take_bearer() }),
            ("bearer alone", Method::GET, EXEC, ws(&[&token]), BadRequest("invalid WebSocket subprotocol: a bearer token subprotocol must be offered with at least one other subprotocol".into())),
            ("bearer alone on a relayed log", Method::GET, LOG, ws(&[&token]), BadRequest("invalid WebSocket subprotocol: a bearer token subprotocol must be offered with at least one other subprotocol".into())),
            ("bearer + v4 relayed", Method::GET, EXEC, ws(&[&format!("{token}, v4.channel.k8s.io")]), Relay { kind: RelayKind::WebSocket, bearer: OfferedProtocols::parse([token_v5.as_str()]).unwrap().take_bearer() }),
            ("bearer on a SPDY upgrade", Method::POST, EXEC, { let mut h = spdy(); h.insert(header::SEC_WEBSOCKET_PROTOCOL, token_v5.parse().unwrap()); h }, Relay { kind: RelayKind::Spdy, bearer: OfferedProtocols::parse([token_v5.as_str()]).unwrap().take_bearer() }),
            ("non-ASCII subprotocol line", Method::GET, EXEC, { let mut h = ws(&["v5.channel.k8s.io"]); h.append(header::SEC_WEBSOCKET_PROTOCOL, http::HeaderValue::from_bytes(format!("{token}, v4.channel.k8s.io\u{e9}").as_bytes()).unwrap()); h }, BadRequest("invalid WebSocket subprotocol: a Sec-WebSocket-Protocol line is not visible ASCII".into())),
            ("malformed bearer on a plain request", Method::GET, "/api/v1/pods", ws_header_only(&token), BadRequest("invalid WebSocket subprotocol: a bearer token subprotocol must be offered with at least one other subprotocol".into())),
            ("pods list is not a subresource", Method::GET, "/api/v1/namespaces/default/pods/exec", ws(&["v5.channel.k8s.io"]), ws_relay()),
            ("a tunnel offered on an exec path is relayed", Method::GET, EXEC, ws(&["SPDY/3.1+v4.channel.k8s.io"]), ws_relay()),
            ("a tunnel offered on a log path is relayed", Method::GET, LOG, ws(&["SPDY/3.1+portforward.k8s.io"]), ws_relay()),
            ("a tunnel beside v5 on an exec path: v5", Method::GET, EXEC, ws(&["SPDY/3.1+portforward.k8s.io, v5.channel.k8s.io"]), translate(Subresource::Exec)),
            ("percent-encoded portforward tunnel", Method::GET, "/api/v1/namespaces/default/pods/web/%70ortforward", ws(&["SPDY/3.1+portforward.k8s.io"]), Tunnel { protocols: vec!["portforward.k8s.io".into()], bearer: None }),
            ("percent-encoded exec", Method::GET, "/api/v1/namespaces/default/pods/web/%65xec", ws(&["v5.channel.k8s.io"]), translate(Subresource::Exec)),
            ("percent-encoded attach", Method::GET, "/api/v1/namespaces/default/pods/web/%61ttach", ws(&["v5.channel.k8s.io"]), translate(Subresource::Attach)),
            ("encoded slash before exec", Method::GET, "/api/v1/namespaces/default/pods/web%2Fexec", ws(&["v5.channel.k8s.io"]), translate(Subresource::Exec)),
        ];
        for (name, method, path, headers, want) in cases {
            let target = RequestTarget::parse_path_and_query(path).unwrap();
            assert_eq!(classify(&method, &target, &headers), want, "case: {name}");
        }
    }
}
