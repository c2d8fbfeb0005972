//! Header names as Go reads them. spdystream lowercases every name it reads with
//! `strings.ToLower` and refuses the frame when that changed it; the names then become the
//! keys of an `http.Header`, which `textproto.CanonicalMIMEHeaderKey` puts in canonical form
//! (`streamtype` → `Streamtype`), except names holding a byte that is not an HTTP token
//! character, which it leaves as they are. `Header.Get` looks a name up the same way.

/// HTTP token characters (RFC 7230 `tchar`), the bytes `CanonicalMIMEHeaderKey` accepts in
/// a name it canonicalises.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_token(name: &[u8]) -> bool {
    name.iter().all(|&b| is_token_byte(b))
}

/// Whether Go files `a` and `b` under one `http.Header` key: their canonical forms are equal.
/// A name of token characters is canonicalised by setting each letter's case from its place,
/// so two of them share a key when they differ in ASCII case only; any other name is its own
/// key, and never equals a canonical one.
pub(crate) fn same_key(a: &[u8], b: &[u8]) -> bool {
    match (is_token(a), is_token(b)) {
        (true, true) => a.eq_ignore_ascii_case(b),
        (false, false) => a == b,
        _ => false,
    }
}

/// Whether `name` is its own canonical key (`CanonicalMIMEHeaderKey(name) == name`): it holds
/// a non-token byte, or every ASCII letter already has the case its place gives it (upper
/// first and after `-`, lower elsewhere). spdystream's duplicate check looks the lowercased
/// name up among the canonical keys, so it only ever finds names like these.
pub(crate) fn is_own_key(name: &[u8]) -> bool {
    if !is_token(name) {
        return true;
    }
    let mut upper = true;
    for &b in name {
        if (upper && b.is_ascii_lowercase()) || (!upper && b.is_ascii_uppercase()) {
            return false;
        }
        upper = b == b'-';
    }
    true
}

/// `name` lowercased as Go's `strings.ToLower` does it, and whether that changed it: ASCII
/// letters lowercased, other characters mapped by their simple lowercase mapping (U+0130 `İ`
/// becomes a plain `i`), and every byte that is not part of valid UTF-8 replaced by U+FFFD.
/// (The mappings are Rust's Unicode tables; Go's are of an older Unicode version and differ
/// only for characters that gained a case since.)
pub(crate) fn go_lowercase(name: &[u8]) -> (String, bool) {
    if name.is_ascii() {
        let changed = name.iter().any(u8::is_ascii_uppercase);
        let lower = name.to_ascii_lowercase();
        // ASCII is UTF-8.
        return (String::from_utf8(lower).unwrap_or_default(), changed);
    }
    let mut out = String::with_capacity(name.len());
    let mut changed = false;
    let mut rest = name;
    while !rest.is_empty() {
        let (valid, bad) = match std::str::from_utf8(rest) {
            Ok(all) => (all, 0),
            Err(e) => {
                let (valid, tail) = rest.split_at(e.valid_up_to());
                // The invalid sequence, or what is left of a sequence cut short: Go replaces
                // each of its bytes on its own.
                let bad = e.error_len().unwrap_or(tail.len());
                (std::str::from_utf8(valid).unwrap_or_default(), bad)
            }
        };
        for c in valid.chars() {
            if c == '\u{130}' {
                out.push('i');
                changed = true;
                continue;
            }
            let before = out.len();
            out.extend(c.to_lowercase());
            changed |= out[before..].chars().ne(std::iter::once(c));
        }
        for _ in 0..bad {
            out.push(char::REPLACEMENT_CHARACTER);
            changed = true;
        }
        rest = &rest[valid.len() + bad..];
    }
    (out, changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_names_share_a_key_across_ascii_case() {
        assert!(same_key(b"streamtype", b"StreamType"));
        assert!(same_key(b"streamtype", b"STREAMTYPE"));
        assert!(same_key(b"x-a", b"X-A"));
        assert!(!same_key(b"streamtype", b"streamtype2"));
        assert!(!same_key(b"port", b"por"));
        // Not tokens: their own keys, compared as they are.
        assert!(same_key(b"x y", b"x y"));
        assert!(!same_key(b"x y", b"X Y"));
        assert!(!same_key(b"port\0", b"port"));
        assert!(!same_key("pört".as_bytes(), "PÖRT".as_bytes()));
        assert!(same_key(b"", b""));
    }

    #[test]
    fn own_keys_are_those_canonicalisation_leaves_alone() {
        for own in [
            &b"Streamtype"[..],
            b"X-Forwarded-For",
            b"1a",
            b"0-1",
            b"",
            b"a b",
            b"x\xff",
            b"-",
        ] {
            assert!(is_own_key(own), "{own:?}");
        }
        for not_own in [
            &b"streamtype"[..],
            b"x-a",
            b"X-a",
            b"STREAMTYPE",
            b"-a",
            b"1-b",
        ] {
            assert!(!is_own_key(not_own), "{not_own:?}");
        }
    }

    #[test]
    fn lowercasing_as_go_does() {
        assert_eq!(go_lowercase(b"streamtype"), ("streamtype".into(), false));
        assert_eq!(go_lowercase(b"StreamType"), ("streamtype".into(), true));
        assert_eq!(go_lowercase(b"x y\0"), ("x y\0".into(), false));
        assert_eq!(go_lowercase("äö".as_bytes()), ("äö".into(), false));
        assert_eq!(go_lowercase("ÄÖ".as_bytes()), ("äö".into(), true));
        // The simple mapping: one character, not `i` and a combining dot.
        assert_eq!(go_lowercase("İd".as_bytes()), ("id".into(), true));
        // The Kelvin sign lowercases to an ASCII `k`.
        assert_eq!(go_lowercase("\u{212A}".as_bytes()), ("k".into(), true));
        // Already lowercase: the long s and a final sigma stay.
        assert_eq!(go_lowercase("ſς".as_bytes()), ("ſς".into(), false));
        // U+FFFD itself is kept; each byte of a broken sequence becomes one.
        assert_eq!(
            go_lowercase("\u{FFFD}".as_bytes()),
            ("\u{FFFD}".into(), false)
        );
        assert_eq!(
            go_lowercase(b"a\xe2\x82b\xff"),
            ("a\u{FFFD}\u{FFFD}b\u{FFFD}".into(), true)
        );
        assert_eq!(go_lowercase(b"\xf0\x9f\x98"), ("\u{FFFD}".repeat(3), true));
    }
}
