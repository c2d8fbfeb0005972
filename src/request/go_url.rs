//! Go's `net/url` rules for a request target, byte for byte: kube-apiserver routes and
//! authorizes on the decoded path Go's server hands it (`URL.Path`), reads options with
//! `url.ParseQuery`, and Go's server itself refuses a path it cannot decode. The proxy reads
//! requests with these rules so that what it audits is what the API server acts on;
//! `tests/go_url_differential.rs` runs them against Go's own code.

/// A `%` not followed by two hexadecimal digits: Go's "invalid URL escape".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid URL escape {escape:?}")]
pub struct BadEscape {
    /// The offending escape (up to three bytes), as sent.
    pub escape: String,
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Go's `unescape`: `%XX` becomes its byte; with `plus_is_space` (query components) `+`
/// becomes a space; a `%` without two hex digits after it is an error.
fn unescape(raw: &str, plus_is_space: bool) -> Result<Vec<u8>, BadEscape> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hi = bytes.get(i + 1).copied().and_then(hex_value);
                let lo = bytes.get(i + 2).copied().and_then(hex_value);
                let (Some(hi), Some(lo)) = (hi, lo) else {
                    let end = (i + 3).min(bytes.len());
                    return Err(BadEscape {
                        escape: String::from_utf8_lossy(&bytes[i..end]).into_owned(),
                    });
                };
                out.push(hi << 4 | lo);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// The decoded path, as Go's `url.ParseRequestURI` sets `URL.Path` (`+` stays `+`).
pub fn unescape_path(raw: &str) -> Result<Vec<u8>, BadEscape> {
    unescape(raw, false)
}

/// One query component decoded as Go's `url.QueryUnescape` does.
pub fn unescape_query_component(raw: &str) -> Result<Vec<u8>, BadEscape> {
    unescape(raw, true)
}

/// The pairs Go's `url.ParseQuery` keeps, decoded, in the order sent.
///
/// Go splits on `&` only; a piece containing `;` is dropped whole (Go 1.17+), an empty piece
/// is skipped, a piece with a bad escape in its key or value is dropped; everything else
/// becomes a pair (a piece without `=` has an empty value, `=v` has an empty key).
pub fn parse_query(raw: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    raw.split('&')
        .filter(|piece| !piece.is_empty() && !piece.contains(';'))
        .filter_map(|piece| {
            let (key, value) = piece.split_once('=').unwrap_or((piece, ""));
            let key = unescape_query_component(key).ok()?;
            let value = unescape_query_component(value).ok()?;
            Some((key, value))
        })
        .collect()
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn push_escaped(out: &mut String, b: u8) {
    out.push('%');
    out.push(HEX[usize::from(b >> 4)] as char);
    out.push(HEX[usize::from(b & 15)] as char);
}

/// Appends `decoded` as Go's `URL.EscapedPath` writes a path it has to encode itself: letters,
/// digits, `-_.~` and `$&+,/:;=@` as they are, every other byte `%XX`.
pub fn escape_path_into(out: &mut String, decoded: &[u8]) {
    for &b in decoded {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => out.push(b as char),
            b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            b'$' | b'&' | b'+' | b',' | b'/' | b':' | b';' | b'=' | b'@' => out.push(b as char),
            _ => push_escaped(out, b),
        }
    }
}

/// Appends `decoded` as Go's `url.QueryEscape` writes it: letters, digits and `-_.~` as they
/// are, a space as `+`, every other byte `%XX`.
pub fn escape_query_component_into(out: &mut String, decoded: &[u8]) {
    for &b in decoded {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => out.push(b as char),
            b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            b' ' => out.push('+'),
            _ => push_escaped(out, b),
        }
    }
}

/// apimachinery's `Convert_Slice_string_To_bool`: only the first value counts; absent, `0` or
/// `false` (any case) is false, anything else (the empty string too) is true.
pub fn slice_to_bool(first: Option<&str>) -> bool {
    match first {
        None => false,
        Some(v) => !(v == "0" || v.eq_ignore_ascii_case("false")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pairs(raw: &str) -> Vec<(String, String)> {
        parse_query(raw)
            .into_iter()
            .map(|(k, v)| (String::from_utf8(k).unwrap(), String::from_utf8(v).unwrap()))
            .collect()
    }

    #[test]
    fn paths_decode_as_go_does() {
        assert_eq!(
            unescape_path("/pods/web/%65xec").unwrap(),
            b"/pods/web/exec"
        );
        assert_eq!(unescape_path("/a+b%2Fc").unwrap(), b"/a+b/c");
        assert_eq!(unescape_path("/%ff").unwrap(), [b'/', 0xff]);
        for bad in ["/%zz", "/%", "/%6", "/a%g0"] {
            assert!(unescape_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn queries_keep_what_go_keeps() {
        assert_eq!(
            pairs("command=ls&command=-l+x&container=a&container=b"),
            [
                ("command".into(), "ls".into()),
                ("command".into(), "-l x".into()),
                ("container".into(), "a".into()),
                ("container".into(), "b".into())
            ]
        );
        // A piece with a semicolon is dropped whole; one with a bad escape too.
        assert_eq!(
            pairs("command=echo;rm&command=x&y=%zz&&z"),
            [("command".into(), "x".into()), ("z".into(), "".into())]
        );
        assert_eq!(
            pairs("=v&%63ommand=id"),
            [("".into(), "v".into()), ("command".into(), "id".into())]
        );
    }

    #[test]
    fn booleans_follow_apimachinery() {
        assert!(!slice_to_bool(None));
        assert!(!slice_to_bool(Some("0")));
        assert!(!slice_to_bool(Some("FaLsE")));
        assert!(slice_to_bool(Some("")));
        assert!(slice_to_bool(Some("yes")));
    }

    proptest! {
        #[test]
        fn escaping_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut path = String::new();
            escape_path_into(&mut path, &bytes);
            prop_assert_eq!(unescape_path(&path).unwrap(), bytes.clone());
            prop_assert!(!path.contains('?') && !path.contains('#'));
            let mut component = String::new();
            escape_query_component_into(&mut component, &bytes);
            prop_assert_eq!(unescape_query_component(&component).unwrap(), bytes);
            prop_assert!(!component.contains(['&', ';', '=', '#']));
        }
    }
}
