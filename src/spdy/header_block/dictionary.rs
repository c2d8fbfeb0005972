//! The SPDY/3 zlib preset dictionary (PROTOCOL.md §3.3; SPDY/3 draft, "Compression").
//!
//! The dictionary is a wire fact: both ends must use exactly these 1,423 bytes or nothing
//! inflates. Its layout is spelled out here the way the draft describes it instead of as a hex
//! dump: a run of common header names and values, each prefixed with its 4-byte big-endian
//! length as in a header block, followed by a tail of status codes, reason phrases, dates and
//! content types without prefixes. The bytes are assembled at compile time and pinned by the
//! length and Adler-32 tests below.

/// Entries that appear with a 4-byte length prefix, in dictionary order.
const PREFIXED: &[&str] = &[
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The unprefixed tail, in dictionary order (concatenated without separators).
const TAIL: &[&str] = &[
    "100101201202205206300302303304305306307",
    "402405406407408409410411412413414415416417",
    "502504505",
    "203 Non-Authoritative Information",
    "204 No Content",
    "301 Moved Permanently",
    "400 Bad Request",
    "401 Unauthorized",
    "403 Forbidden",
    "404 Not Found",
    "500 Internal Server Error",
    "501 Not Implemented",
    "503 Service Unavailable",
    "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec",
    " 00:00:00",
    " Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT",
    "chunked,text/html,image/png,image/jpg,image/gif,",
    "application/xml,application/xhtml+xml,text/plain,text/javascript,",
    "public",
    "private",
    "max-age=",
    "gzip,deflate,sdch",
    "charset=utf-8",
    "charset=iso-8859-1,utf-,*,enq=0.",
];

/// Length of the dictionary in bytes.
const LEN: usize = 1423;

/// Lays the entries out; evaluated at compile time, and a mismatch with [`LEN`] fails the build.
const fn build() -> [u8; LEN] {
    let mut out = [0u8; LEN];
    let mut at = 0;
    let mut i = 0;
    while i < PREFIXED.len() {
        let entry = PREFIXED[i].as_bytes();
        let len = (entry.len() as u32).to_be_bytes();
        let mut j = 0;
        while j < 4 {
            out[at] = len[j];
            at += 1;
            j += 1;
        }
        at = copy(&mut out, at, entry);
        i += 1;
    }
    i = 0;
    while i < TAIL.len() {
        at = copy(&mut out, at, TAIL[i].as_bytes());
        i += 1;
    }
    assert!(
        at == LEN,
        "SPDY dictionary entries do not add up to 1423 bytes"
    );
    out
}

/// Copies `src` to `out[at..]`, returning the new end.
const fn copy(out: &mut [u8; LEN], mut at: usize, src: &[u8]) -> usize {
    let mut i = 0;
    while i < src.len() {
        out[at] = src[i];
        at += 1;
        i += 1;
    }
    at
}

/// The bytes, built once at compile time.
static BYTES: [u8; LEN] = build();

/// The SPDY/3 preset dictionary: 1,423 bytes, shared by both directions.
pub const DICTIONARY: &[u8] = &BYTES;

/// Adler-32 of [`DICTIONARY`]: the DICTID a zlib stream using it carries in its header.
pub const DICTIONARY_ADLER32: u32 = 0xE3C6_A7C2;

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1950 Adler-32, written out so the test does not trust zlib's own idea of it.
    fn adler32(data: &[u8]) -> u32 {
        const MOD: u32 = 65_521;
        let (mut a, mut b) = (1u32, 0u32);
        for &byte in data {
            a = (a + u32::from(byte)) % MOD;
            b = (b + a) % MOD;
        }
        (b << 16) | a
    }

    #[test]
    fn has_the_draft_length() {
        assert_eq!(DICTIONARY.len(), 1423);
    }

    #[test]
    fn has_the_draft_checksum() {
        assert_eq!(adler32(DICTIONARY), DICTIONARY_ADLER32);
    }

    #[test]
    fn adler32_matches_rfc_example() {
        // "Wikipedia" is the customary worked example: 0x11E60398.
        assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
    }

    #[test]
    fn starts_and_ends_as_expected() {
        assert_eq!(&DICTIONARY[..11], b"\0\0\0\x07options");
        assert!(DICTIONARY.ends_with(b"enq=0."));
    }
}
