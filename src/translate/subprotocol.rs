//! The client's `Sec-WebSocket-Protocol` offer (PROTOCOL.md §1.2): every header line,
//! comma-split, with the bearer-token entry taken out before any protocol is chosen.

use base64::Engine;
use http::header::{HeaderMap, SEC_WEBSOCKET_PROTOCOL};

use super::protocol::{ChannelProtocol, TUNNEL_PREFIX, TUNNEL_SUFFIX};

/// Prefix of the entry browsers use to carry a bearer token.
pub const BEARER_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

/// A bearer token from the subprotocol list. Its `Debug` never shows the token.
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken(String);

impl BearerToken {
    /// The token itself, for the upstream `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

/// Why a bearer entry was refused (the reference authenticator's rules).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubprotocolError {
    #[error("more than one bearer token subprotocol offered")]
    MultipleTokens,
    #[error("bearer token subprotocol is not valid unpadded base64url")]
    InvalidBase64,
    #[error("bearer token is not valid UTF-8")]
    InvalidUtf8,
    #[error("bearer token is empty")]
    EmptyToken,
    #[error("a bearer token subprotocol must be offered with at least one other subprotocol")]
    TokenAlone,
    #[error("a Sec-WebSocket-Protocol line is not visible ASCII")]
    NotVisibleAscii,
}

/// The offered subprotocols, in client order, without the bearer entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OfferedProtocols {
    entries: Vec<String>,
    bearer: Option<BearerToken>,
}

impl OfferedProtocols {
    /// Parses all `Sec-WebSocket-Protocol` lines of `headers`. A line with any byte that is not
    /// visible ASCII, space or tab is refused as a whole: it cannot hold a valid token, and
    /// skipping it would let a bearer entry in it travel on unexamined.
    pub fn from_headers(headers: &HeaderMap) -> Result<OfferedProtocols, SubprotocolError> {
        let mut lines = Vec::new();
        for value in headers.get_all(SEC_WEBSOCKET_PROTOCOL) {
            // `to_str` accepts exactly visible ASCII, space and tab.
            lines.push(
                value
                    .to_str()
                    .map_err(|_| SubprotocolError::NotVisibleAscii)?,
            );
        }
        Self::parse(lines)
    }

    /// Parses header values (each may be a comma-separated list).
    pub fn parse<'a>(
        lines: impl IntoIterator<Item = &'a str>,
    ) -> Result<OfferedProtocols, SubprotocolError> {
        let mut entries = Vec::new();
        let mut bearer = None;
        for entry in lines
            .into_iter()
            .flat_map(|l| l.split(','))
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            if let Some(encoded) = entry.strip_prefix(BEARER_PREFIX) {
                if bearer.is_some() {
                    return Err(SubprotocolError::MultipleTokens);
                }
                bearer = Some(decode_token(encoded)?);
            } else {
                entries.push(entry.to_owned());
            }
        }
        if bearer.is_some() && entries.is_empty() {
            return Err(SubprotocolError::TokenAlone);
        }
        Ok(OfferedProtocols { entries, bearer })
    }

    /// The entries other than the bearer token, in client order.
    pub fn entries(&self) -> &[String] {
        &self.entries
    }

    /// The bearer token, if one was offered.
    pub fn bearer(&self) -> Option<&BearerToken> {
        self.bearer.as_ref()
    }

    /// Takes the bearer token out.
    pub fn take_bearer(&mut self) -> Option<BearerToken> {
        self.bearer.take()
    }

    /// Whether `name` was offered.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.iter().any(|e| e == name)
    }

    /// The remote-command protocol a server supporting all of them would choose: v5 wherever it
    /// is listed (the translator accepts only v5), else the first supported in client order.
    pub fn choose_exec(&self) -> Option<ChannelProtocol> {
        if self.contains(ChannelProtocol::V5.name()) {
            return Some(ChannelProtocol::V5);
        }
        self.entries
            .iter()
            .find_map(|e| ChannelProtocol::from_name(e))
    }

    /// De-prefixed names of all `SPDY/3.1+<name>.k8s.io` entries.
    pub fn tunnel_protocols(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter_map(|e| e.strip_prefix(TUNNEL_PREFIX))
            .filter(|n| n.ends_with(TUNNEL_SUFFIX))
            .map(str::to_owned)
            .collect()
    }
}

fn decode_token(encoded: &str) -> Result<BearerToken, SubprotocolError> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded)
        .map_err(|_| SubprotocolError::InvalidBase64)?;
    let token = String::from_utf8(bytes).map_err(|_| SubprotocolError::InvalidUtf8)?;
    if token.is_empty() {
        return Err(SubprotocolError::EmptyToken);
    }
    Ok(BearerToken(token))
}

/// The subprotocol entry carrying `token` (for clients and tests).
pub fn bearer_entry(token: &str) -> String {
    format!(
        "{BEARER_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bearer_vector() {
        assert_eq!(
            bearer_entry("mytoken"),
            "base64url.bearer.authorization.k8s.io.bXl0b2tlbg"
        );
        let o = OfferedProtocols::parse([
            "base64url.bearer.authorization.k8s.io.bXl0b2tlbg, v5.channel.k8s.io",
        ])
        .unwrap();
        assert_eq!(o.bearer().unwrap().expose(), "mytoken");
        assert_eq!(o.entries(), ["v5.channel.k8s.io"]);
        assert_eq!(
            format!("{:?}", o.bearer().unwrap()),
            "BearerToken(<redacted>)"
        );
    }

    #[test]
    fn bearer_rules() {
        let t = bearer_entry("a");
        let u = bearer_entry("b");
        assert_eq!(
            OfferedProtocols::parse([t.as_str(), u.as_str(), "v5.channel.k8s.io"]),
            Err(SubprotocolError::MultipleTokens)
        );
        assert_eq!(
            OfferedProtocols::parse([t.as_str()]),
            Err(SubprotocolError::TokenAlone)
        );
        assert_eq!(
            OfferedProtocols::parse([
                "base64url.bearer.authorization.k8s.io.!!!, v5.channel.k8s.io"
            ]),
            Err(SubprotocolError::InvalidBase64)
        );
        assert_eq!(
            OfferedProtocols::parse([
                "base64url.bearer.authorization.k8s.io.bXl0b2tlbg==, v4.channel.k8s.io"
            ]),
            Err(SubprotocolError::InvalidBase64)
        );
        assert_eq!(
            OfferedProtocols::parse([
                "base64url.bearer.authorization.k8s.io._w, v4.channel.k8s.io"
            ]),
            Err(SubprotocolError::InvalidUtf8)
        );
    }

    #[test]
    fn a_line_that_is_not_visible_ascii_is_refused() {
        let mut h = HeaderMap::new();
        h.append(SEC_WEBSOCKET_PROTOCOL, "v5.channel.k8s.io".parse().unwrap());
        let line = format!("{}, v4.channel.k8s.io\u{e9}", bearer_entry("secret"));
        h.append(
            SEC_WEBSOCKET_PROTOCOL,
            http::HeaderValue::from_bytes(line.as_bytes()).unwrap(),
        );
        assert_eq!(
            OfferedProtocols::from_headers(&h),
            Err(SubprotocolError::NotVisibleAscii)
        );
        // The same entries, all visible ASCII, are fine.
        h.remove(SEC_WEBSOCKET_PROTOCOL);
        let line = format!("{}, v4.channel.k8s.io", bearer_entry("secret"));
        h.append(SEC_WEBSOCKET_PROTOCOL, line.parse().unwrap());
        assert!(OfferedProtocols::from_headers(&h).is_ok());
    }

    #[test]
    fn selection() {
        let o = OfferedProtocols::parse(["v4.channel.k8s.io, v5.channel.k8s.io"]).unwrap();
        assert_eq!(o.choose_exec(), Some(ChannelProtocol::V5));
        let o =
            OfferedProtocols::parse(["v3.channel.k8s.io", "base64.channel.k8s.io,channel.k8s.io"])
                .unwrap();
        assert_eq!(o.choose_exec(), Some(ChannelProtocol::V1Base64));
        let o = OfferedProtocols::parse(["v3.channel.k8s.io"]).unwrap();
        assert_eq!(o.choose_exec(), None);
        let o = OfferedProtocols::parse(["SPDY/3.1+portforward.k8s.io", "SPDY/3.1+bogus"]).unwrap();
        assert_eq!(o.tunnel_protocols(), ["portforward.k8s.io"]);
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".{0,200}") {
            let _ = OfferedProtocols::parse([s.as_str()]);
        }

        #[test]
        fn any_token_round_trips(token in "[ -~]{1,64}") {
            let entry = bearer_entry(&token);
            let o = OfferedProtocols::parse([entry.as_str(), "v5.channel.k8s.io"]).unwrap();
            prop_assert_eq!(o.bearer().unwrap().expose(), token.as_str());
        }
    }
}
