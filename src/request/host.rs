//! The host a request names (HTTP/1.1 `Host`, an absolute-form target's authority, HTTP/2 and
//! RFC 8441 `:authority`) or a TLS handshake names (SNI), read as production gateways compare
//! host names: case-insensitive, the port ignored, one trailing dot dropped. Anything a
//! gateway might read another way is refused rather than guessed: bytes outside letters,
//! digits, `-` and `.` (percent escapes, `_`, `@` user info, non-ASCII, which an IDNA-aware
//! front could map to another name), empty or over-long labels, a label starting or ending with
//! `-`, a port that is not digits, several `Host` headers, and an absolute-form target whose
//! host is not the `Host` header's (RFC 9112 says the first wins, but a front may route by
//! either). A bracketed IP literal is read as a host that names no cluster.
//!
//! [`HostSuffix`] says which host names a cluster: `NAME.SUFFIX`, with NAME one label.

use std::fmt;

/// The longest host name (RFC 1035: 253 characters written without the trailing dot).
pub const MAX_HOST_NAME: usize = 253;

/// The longest label.
const MAX_LABEL: usize = 63;

/// A host name as compared: lower-case labels of letters, digits and `-`, joined by `.`,
/// without a port or a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostName(String);

/// What a request's or a handshake's host is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A host name (an IPv4 address reads as one too: its labels are digits).
    Name(HostName),
    /// A bracketed IP literal (`[::1]`): no cluster is ever named so.
    IpLiteral,
}

/// Why a host is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostRefusal {
    /// A byte no host name has (percent escapes, non-ASCII, `_`, `@`, spaces, ...).
    #[error("the request's host has a character no host name has")]
    BadByte,
    /// An empty label, one over 63 characters, one starting or ending with `-`, or a name over
    /// 253 characters.
    #[error("the request's host is not a valid host name")]
    BadName,
    /// A port that is not digits, or a malformed IP literal.
    #[error("the request's host has a malformed port or IP literal")]
    BadPort,
    /// More than one `Host` header.
    #[error("the request has more than one Host header")]
    SeveralHosts,
    /// An absolute-form target (or `:authority`) whose host is not the `Host` header's.
    #[error("the request's target and its Host header name different hosts")]
    Mismatch,
    /// An HTTP/1.1 request without a `Host` header (RFC 9112 §3.2 asks for a 400).
    #[error("the HTTP/1.1 request has no Host header")]
    MissingHost,
}

impl HostName {
    /// The name, lower case, without port or trailing dot.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Reads a bare host name (no port): an SNI name, or a configured suffix.
    pub fn parse(name: &[u8]) -> Result<HostName, HostRefusal> {
        let name = name.strip_suffix(b".").unwrap_or(name);
        if name.is_empty() || name.len() > MAX_HOST_NAME {
            return Err(HostRefusal::BadName);
        }
        for label in name.split(|&b| b == b'.') {
            if !label
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
            {
                return Err(HostRefusal::BadByte);
            }
            let hyphen_edge = label.first() == Some(&b'-') || label.last() == Some(&b'-');
            if label.is_empty() || label.len() > MAX_LABEL || hyphen_edge {
                return Err(HostRefusal::BadName);
            }
        }
        let lower = name.to_ascii_lowercase();
        Ok(HostName(
            String::from_utf8(lower).expect("only ASCII bytes are left"),
        ))
    }
}

impl fmt::Display for HostName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Host {
    /// Reads an authority as a request carries it: `host`, `host:port`, `[v6]` or `[v6]:port`.
    /// `None` for an empty one (HTTP/1.1 allows an empty `Host` for a target without one).
    pub fn parse_authority(authority: &[u8]) -> Result<Option<Host>, HostRefusal> {
        if authority.is_empty() {
            return Ok(None);
        }
        if let Some(literal) = authority.strip_prefix(b"[") {
            let end = literal
                .iter()
                .position(|&b| b == b']')
                .ok_or(HostRefusal::BadPort)?;
            let (address, after) = (&literal[..end], &literal[end + 1..]);
            let ip_byte = |b: &u8| b.is_ascii_hexdigit() || matches!(b, b':' | b'.');
            if address.is_empty() || !address.iter().all(ip_byte) {
                return Err(HostRefusal::BadPort);
            }
            port(after)?;
            return Ok(Some(Host::IpLiteral));
        }
        let (name, after) = match authority.iter().position(|&b| b == b':') {
            Some(colon) => authority.split_at(colon),
            None => (authority, &b""[..]),
        };
        port(after)?;
        HostName::parse(name).map(|name| Some(Host::Name(name)))
    }

    /// The host name, if it is one.
    pub fn name(&self) -> Option<&HostName> {
        match self {
            Host::Name(name) => Some(name),
            Host::IpLiteral => None,
        }
    }
}

/// Checks what follows a host: nothing, or `:` and at most five digits (`:` alone too, which
/// RFC 3986 allows).
fn port(after: &[u8]) -> Result<(), HostRefusal> {
    match after.split_first() {
        None => Ok(()),
        Some((b':', digits)) if digits.len() <= 5 && digits.iter().all(u8::is_ascii_digit) => {
            Ok(())
        }
        Some(_) => Err(HostRefusal::BadPort),
    }
}

/// The host of a request: its target's authority (absolute form, or HTTP/2's `:authority`),
/// else its `Host` header; `None` when it names none. Refused: a host that is not one, several
/// `Host` headers, none where one is `required` (HTTP/1.1, as Go's server refuses it too), or a
/// target and a `Host` header that name different hosts.
pub fn request_host<'h>(
    authority: Option<&[u8]>,
    mut host_headers: impl Iterator<Item = &'h [u8]>,
    required: bool,
) -> Result<Option<Host>, HostRefusal> {
    let header = host_headers.next();
    if host_headers.next().is_some() {
        return Err(HostRefusal::SeveralHosts);
    }
    if required && header.is_none() {
        return Err(HostRefusal::MissingHost);
    }
    let header = header.map(Host::parse_authority).transpose()?.flatten();
    let Some(authority) = authority else {
        return Ok(header);
    };
    let target = Host::parse_authority(authority)?;
    match (&target, &header) {
        (Some(t), Some(h)) if t != h => Err(HostRefusal::Mismatch),
        (Some(_), _) => Ok(target),
        (None, _) => Ok(header),
    }
}

/// The domain under which each cluster has its own host name, `NAME.SUFFIX`
/// (`--cluster-host-suffix`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSuffix(HostName);

impl HostSuffix {
    /// `suffix` as a host name (a leading dot is allowed: `.kube.example.com`).
    pub fn parse(suffix: &str) -> Result<HostSuffix, HostRefusal> {
        let bare = suffix.strip_prefix('.').unwrap_or(suffix);
        HostName::parse(bare.as_bytes()).map(HostSuffix)
    }

    /// The suffix, without a leading dot.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The one label in front of the suffix, if `host` is `LABEL.SUFFIX`: the name of the
    /// cluster it asks for (which may not be configured).
    pub fn label_of<'a>(&self, host: &'a HostName) -> Option<&'a str> {
        let front = host.as_str().strip_suffix(self.0.as_str())?;
        let label = front.strip_suffix('.')?;
        (!label.is_empty() && !label.contains('.')).then_some(label)
    }

    /// The host name of cluster `name`.
    pub fn host_of(&self, name: &str) -> String {
        format!("{name}.{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(host: &str) -> String {
        match Host::parse_authority(host.as_bytes()) {
            Ok(Some(Host::Name(n))) => n.to_string(),
            other => panic!("{host:?}: {other:?}"),
        }
    }

    #[test]
    fn names_compare_as_gateways_compare_them() {
        assert_eq!(name("a.kube.example.com"), "a.kube.example.com");
        assert_eq!(name("A.Kube.EXAMPLE.com"), "a.kube.example.com");
        assert_eq!(name("a.kube.example.com:8443"), "a.kube.example.com");
        assert_eq!(name("a.kube.example.com.:443"), "a.kube.example.com");
        assert_eq!(name("a.kube.example.com:"), "a.kube.example.com");
        assert_eq!(name("127.0.0.1:6443"), "127.0.0.1");
        assert_eq!(name("xn--bcher-kva.example"), "xn--bcher-kva.example");
        assert_eq!(
            Host::parse_authority(b"[::1]:8443"),
            Ok(Some(Host::IpLiteral))
        );
        assert_eq!(Host::parse_authority(b""), Ok(None));
    }

    #[test]
    fn odd_hosts_are_refused_not_guessed() {
        use HostRefusal::*;
        for (host, why) in [
            (&b"a%2Eb.example"[..], BadByte),
            (b"a_b.example", BadByte),
            (b"user@a.example", BadByte),
            ("b\u{fc}cher.example".as_bytes(), BadByte),
            (b"\xff.example", BadByte),
            (b"a b.example", BadByte),
            (b"a.example\0", BadByte),
            (b"a/b", BadByte),
            (b"a\\b", BadByte),
            (b"a..example", BadName),
            (b".a.example", BadName),
            (b"a.example..", BadName),
            (b".", BadName),
            (b"-a.example", BadName),
            (b"a-.example", BadName),
            (b"a.example:x", BadPort),
            (b"a.example:443:1", BadPort),
            (b"a.example:123456", BadPort),
            (b"[::1", BadPort),
            (b"[::1]x", BadPort),
            (b"[]", BadPort),
            (b"[::1%25eth0]", BadPort),
        ] {
            assert_eq!(
                Host::parse_authority(host),
                Err(why),
                "{:?}",
                String::from_utf8_lossy(host)
            );
        }
        let long_label = format!("{}.example", "a".repeat(64));
        assert_eq!(Host::parse_authority(long_label.as_bytes()), Err(BadName));
        let long_name = format!("{}a", "a.".repeat(127));
        assert_eq!(long_name.len(), 255);
        assert_eq!(Host::parse_authority(long_name.as_bytes()), Err(BadName));
    }

    #[test]
    fn the_target_wins_and_must_agree_with_the_host_header() {
        let host = |authority: Option<&str>, headers: &[&str]| {
            request_host(
                authority.map(str::as_bytes),
                headers.iter().map(|h| h.as_bytes()),
                false,
            )
            .map(|h| h.and_then(|h| h.name().map(|n| n.to_string())))
        };
        assert_eq!(host(None, &["a.k:1"]), Ok(Some("a.k".into())));
        assert_eq!(host(Some("a.k:1"), &[]), Ok(Some("a.k".into())));
        assert_eq!(host(Some("A.k"), &["a.k.:99"]), Ok(Some("a.k".into())));
        assert_eq!(host(None, &[]), Ok(None));
        assert_eq!(host(None, &[""]), Ok(None));
        assert_eq!(host(Some("a.k"), &["b.k"]), Err(HostRefusal::Mismatch));
        assert_eq!(host(None, &["a.k", "a.k"]), Err(HostRefusal::SeveralHosts));
        assert_eq!(host(Some("a.k"), &["%"]), Err(HostRefusal::BadByte));
        // HTTP/1.1 needs a Host header, also beside an absolute-form target.
        let http1 = |authority: Option<&[u8]>| request_host(authority, std::iter::empty(), true);
        assert_eq!(http1(Some(b"a.k")), Err(HostRefusal::MissingHost));
        assert_eq!(http1(None), Err(HostRefusal::MissingHost));
    }

    #[test]
    fn a_suffix_names_clusters_one_label_deep() {
        let suffix = HostSuffix::parse(".Kube.Example.com.").unwrap();
        assert_eq!(suffix.as_str(), "kube.example.com");
        let label = |h: &str| {
            let h = HostName::parse(h.as_bytes()).unwrap();
            suffix.label_of(&h).map(str::to_owned)
        };
        assert_eq!(label("prod-eu.kube.example.com"), Some("prod-eu".into()));
        assert_eq!(label("PROD-EU.kube.example.com."), Some("prod-eu".into()));
        assert_eq!(label("kube.example.com"), None);
        assert_eq!(label("a.b.kube.example.com"), None);
        assert_eq!(label("akube.example.com"), None);
        assert_eq!(label("a.kube.example.com.evil"), None);
        assert_eq!(suffix.host_of("a"), "a.kube.example.com");
        assert!(HostSuffix::parse("").is_err());
        assert!(HostSuffix::parse("*.kube.example.com").is_err());
    }

    proptest::proptest! {
        /// Whatever the bytes, the reading ends in a name a gateway compares the same way, or a
        /// refusal: an accepted name is lower-case LDH labels, reads back as itself, and every
        /// spelling of it (case, a port, a trailing dot) reads as it.
        #[test]
        fn any_bytes_read_as_a_canonical_name_or_are_refused(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80),
            port in 0u32..70000,
        ) {
            let Ok(Some(Host::Name(n))) = Host::parse_authority(&bytes) else {
                return Ok(());
            };
            let s = n.as_str();
            proptest::prop_assert!(s.len() <= MAX_HOST_NAME);
            proptest::prop_assert!(s.bytes().all(|b| b.is_ascii_lowercase()
                || b.is_ascii_digit() || b == b'-' || b == b'.'));
            proptest::prop_assert!(s.split('.').all(|l| !l.is_empty() && l.len() <= MAX_LABEL));
            for spelling in [
                s.to_ascii_uppercase(),
                format!("{s}."),
                format!("{s}:{}", port % 65536),
                format!("{}.:{}", s.to_ascii_uppercase(), port % 65536),
            ] {
                proptest::prop_assert_eq!(
                    Host::parse_authority(spelling.as_bytes()),
                    Ok(Some(Host::Name(n.clone())))
                );
            }
        }

        /// Names made of host-like pieces: the same properties, reached far more often than
        /// from random bytes.
        #[test]
        fn host_like_pieces_read_consistently(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                "a", "B", "0", "-", ".", ":", "443", "%2E", "_", "@", "[", "]", "::1", "\u{e9}",
                "xn--", "kube", "example", "com", " ", "\t",
            ]), 0..12),
        ) {
            let host = pieces.concat();
            let read = Host::parse_authority(host.as_bytes());
            if let Ok(Some(Host::Name(n))) = &read {
                let odd = host.contains(['%', '_', '@', ' ', '\t', '\u{e9}']);
                proptest::prop_assert!(!odd, "{:?} read as {}", host, n);
                proptest::prop_assert_eq!(
                    Host::parse_authority(n.as_str().as_bytes()),
                    read.clone()
                );
                let suffix = HostSuffix::parse("kube.example.com").unwrap();
                if let Some(label) = suffix.label_of(n) {
                    let again = HostName::parse(suffix.host_of(label).as_bytes());
                    proptest::prop_assert_eq!(again.as_ref(), Ok(n));
                }
            }
        }
    }
}
