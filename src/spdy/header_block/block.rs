//! The decoded form of a SPDY/3 name/value block.

use super::go_names::{go_lowercase, same_key};

/// Which frame type carries a block. The hop-by-hop names a block must not contain depend on
/// it (PROTOCOL.md §3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockKind {
    /// Opening a stream: `host` is also forbidden.
    SynStream,
    /// Accepting a stream.
    SynReply,
    /// Extra headers on an open stream.
    Headers,
}

impl BlockKind {
    /// Names spdystream refuses in a block of this kind.
    pub fn forbidden_names(self) -> &'static [&'static str] {
        const SYN_STREAM: &[&str] = &[
            "connection",
            "host",
            "keep-alive",
            "proxy-connection",
            "transfer-encoding",
        ];
        const OTHERS: &[&str] = &[
            "connection",
            "keep-alive",
            "proxy-connection",
            "transfer-encoding",
        ];
        match self {
            BlockKind::SynStream => SYN_STREAM,
            BlockKind::SynReply | BlockKind::Headers => OTHERS,
        }
    }

    /// Whether `name` (already lowercase) is forbidden in this kind of block.
    pub fn forbids(self, name: &str) -> bool {
        self.forbidden_names().contains(&name)
    }
}

/// An ordered list of header (name, value) pairs with unique, lowercase names: the form Go's
/// `http.Header` takes on the SPDY wire.
///
/// SPDY/3 carries several values for one name as a single value with the parts joined by a
/// NUL byte; [`push`](Self::push) does that joining, so a name never appears twice. Values are
/// bytes: spdystream takes any. Read back, a value is what Go's `Header.Get` returns
/// ([`get`](Self::get)): the first part, never the joined whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderBlock {
    pairs: Vec<(String, Vec<u8>)>,
}

/// Separates several values of one name inside a single SPDY/3 value.
pub(crate) const VALUE_SEPARATOR: u8 = 0;

impl HeaderBlock {
    /// An empty block (what Kubernetes puts in every SYN_REPLY).
    pub fn new() -> HeaderBlock {
        HeaderBlock::default()
    }

    /// Adds a header. The name is lowercased as spdystream does when writing. If the name is
    /// already present, the value is appended to the existing one after a NUL byte (Go's
    /// `Header.Add`).
    pub fn push(&mut self, name: impl Into<String>, value: impl AsRef<[u8]>) {
        let name: String = name.into();
        let (name, _) = go_lowercase(name.as_bytes());
        self.append(name, value.as_ref());
    }

    /// Appends `value` under `name` (already lowercased), after the values it has.
    fn append(&mut self, name: String, value: &[u8]) {
        match self.pairs.iter_mut().find(|(n, _)| *n == name) {
            Some((_, existing)) => {
                existing.push(VALUE_SEPARATOR);
                existing.extend_from_slice(value);
            }
            None => self.pairs.push((name, value.to_vec())),
        }
    }

    /// The value of `name` as Go's `http.Header.Get` reads it: the first of its NUL-separated
    /// values, found under Go's canonical key (any ASCII case, for a name of HTTP token
    /// characters; exactly, for any other). `None` where Go reads `""` because the name is
    /// absent; `Some(b"")` where the value itself is empty.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.get_all(name).next()
    }

    /// The values of `name`, split at NUL bytes, empty parts kept (Go's `Header.Values`);
    /// none if the name is absent.
    pub fn get_all<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.pairs
            .iter()
            .find(|(n, _)| same_key(n.as_bytes(), name.as_bytes()))
            .into_iter()
            .flat_map(|(_, v)| v.split(|&b| b == VALUE_SEPARATOR))
    }

    /// The pairs in order, each value as it goes on the wire (its parts joined by NUL).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &[u8])> + '_ {
        self.pairs.iter().map(|(n, v)| (n.as_str(), v.as_slice()))
    }

    /// Number of distinct names.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether there are no headers.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The pairs, for the raw layout code.
    pub(crate) fn pairs(&self) -> &[(String, Vec<u8>)] {
        &self.pairs
    }

    /// Appends a pair whose name is known to be new.
    pub(crate) fn push_new(&mut self, name: String, value: &[u8]) {
        self.pairs.push((name, value.to_vec()));
    }

    /// The value of the pair at `index`, to append to.
    pub(crate) fn value_mut(&mut self, index: usize) -> Option<&mut Vec<u8>> {
        self.pairs.get_mut(index).map(|(_, v)| v)
    }

    /// An empty block with room for `n` pairs.
    pub(crate) fn with_capacity(n: usize) -> HeaderBlock {
        HeaderBlock {
            pairs: Vec::with_capacity(n),
        }
    }
}

impl<N: Into<String>, V: AsRef<[u8]>> FromIterator<(N, V)> for HeaderBlock {
    fn from_iter<I: IntoIterator<Item = (N, V)>>(iter: I) -> HeaderBlock {
        let mut block = HeaderBlock::new();
        block.extend(iter);
        block
    }
}

impl<N: Into<String>, V: AsRef<[u8]>> Extend<(N, V)> for HeaderBlock {
    fn extend<I: IntoIterator<Item = (N, V)>>(&mut self, iter: I) {
        for (name, value) in iter {
            self.push(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_lowercases_and_get_ignores_case() {
        let mut block = HeaderBlock::new();
        block.push("StreamType", "stdout");
        block.push("requestID", "0");
        assert_eq!(block.get("streamtype"), Some(&b"stdout"[..]));
        assert_eq!(block.get("STREAMTYPE"), Some(&b"stdout"[..]));
        assert_eq!(block.get("requestid"), Some(&b"0"[..]));
        assert_eq!(block.get("port"), None);
        assert_eq!(
            block.iter().collect::<Vec<_>>(),
            [("streamtype", &b"stdout"[..]), ("requestid", b"0")]
        );
        assert_eq!(block.len(), 2);
        assert!(!block.is_empty());
    }

    #[test]
    fn repeated_names_join_with_nul_and_get_reads_the_first_part() {
        let mut block: HeaderBlock = [("x-a", "1"), ("X-A", "2")].into_iter().collect();
        assert_eq!(block.len(), 1);
        assert_eq!(block.iter().next(), Some(("x-a", &b"1\x002"[..])));
        assert_eq!(block.get("x-a"), Some(&b"1"[..]));
        assert_eq!(block.get_all("x-a").collect::<Vec<_>>(), [b"1", b"2"]);
        block.push("x-b", "");
        assert_eq!(block.get_all("x-b").collect::<Vec<_>>(), [b""]);
        assert_eq!(block.get("x-b"), Some(&b""[..]));
        assert_eq!(block.get_all("x-c").count(), 0);
        // A value with NULs of its own: the parts, empty ones too.
        block.push("streamtype", "stdout\0");
        assert_eq!(block.get("streamtype"), Some(&b"stdout"[..]));
        assert_eq!(
            block.get_all("streamtype").collect::<Vec<_>>(),
            [&b"stdout"[..], b""]
        );
    }

    #[test]
    fn names_that_are_not_tokens_are_looked_up_exactly() {
        let mut block = HeaderBlock::new();
        block.push("ÄÖ", "v");
        block.push("x y", [0xFF, 0, 1]);
        assert_eq!(block.get("äö"), Some(&b"v"[..]));
        // Go's Get leaves a non-token name as it is: no case folding.
        assert_eq!(block.get("ÄÖ"), None);
        assert_eq!(block.get("x y"), Some(&[0xFF][..]));
        assert_eq!(block.get("X Y"), None);
    }

    #[test]
    fn forbidden_names_depend_on_kind() {
        assert!(BlockKind::SynStream.forbids("host"));
        assert!(!BlockKind::SynReply.forbids("host"));
        assert!(!BlockKind::Headers.forbids("host"));
        for kind in [
            BlockKind::SynStream,
            BlockKind::SynReply,
            BlockKind::Headers,
        ] {
            for name in [
                "connection",
                "keep-alive",
                "proxy-connection",
                "transfer-encoding",
            ] {
                assert!(kind.forbids(name), "{kind:?} {name}");
            }
            assert!(!kind.forbids("streamtype"));
        }
    }
}
