//! The decoded form of a SPDY/3 name/value block.

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

/// An ordered list of header (name, value) pairs with unique, lowercase names.
///
/// SPDY/3 carries several values for one name as a single value with the parts joined by a NUL
/// byte; [`push`](Self::push) does that joining, so a name never appears twice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderBlock {
    pairs: Vec<(String, String)>,
}

/// Separates several values of one name inside a single SPDY/3 value.
const VALUE_SEPARATOR: char = '\0';

impl HeaderBlock {
    /// An empty block (what Kubernetes puts in every SYN_REPLY).
    pub fn new() -> HeaderBlock {
        HeaderBlock::default()
    }

    /// Adds a header. The name is lowercased, as spdystream does when writing. If the name is
    /// already present, the value is appended to the existing one after a NUL byte.
    pub fn push(&mut self, name: impl Into<String>, value: impl Into<String>) {
        let name = lowercase(name.into());
        let value = value.into();
        match self.pairs.iter_mut().find(|(n, _)| *n == name) {
            Some((_, existing)) => {
                existing.push(VALUE_SEPARATOR);
                existing.push_str(&value);
            }
            None => self.pairs.push((name, value)),
        }
    }

    /// The value for `name` (case-insensitive); several values come joined by NUL.
    pub fn get(&self, name: &str) -> Option<&str> {
        let found = if name.is_ascii() {
            self.pairs
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
        } else {
            let lower = name.to_lowercase();
            self.pairs.iter().find(|(n, _)| *n == lower)
        };
        found.map(|(_, v)| v.as_str())
    }

    /// The values for `name`, split at NUL bytes (empty if the name is absent).
    pub fn get_all<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a str> + 'a {
        self.get(name)
            .into_iter()
            .flat_map(|v| v.split(VALUE_SEPARATOR))
    }

    /// The pairs in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        self.pairs.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Number of distinct names.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether there are no headers.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// Appends a pair already known to be valid and new (the raw parser checks).
    pub(crate) fn push_unchecked(&mut self, name: String, value: String) {
        self.pairs.push((name, value));
    }

    /// The pairs, for the raw layout code.
    pub(crate) fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// An empty block with room for `n` pairs.
    pub(crate) fn with_capacity(n: usize) -> HeaderBlock {
        HeaderBlock {
            pairs: Vec::with_capacity(n),
        }
    }
}

impl<N: Into<String>, V: Into<String>> FromIterator<(N, V)> for HeaderBlock {
    fn from_iter<I: IntoIterator<Item = (N, V)>>(iter: I) -> HeaderBlock {
        let mut block = HeaderBlock::new();
        block.extend(iter);
        block
    }
}

impl<N: Into<String>, V: Into<String>> Extend<(N, V)> for HeaderBlock {
    fn extend<I: IntoIterator<Item = (N, V)>>(&mut self, iter: I) {
        for (name, value) in iter {
            self.push(name, value);
        }
    }
}

/// Lowercases without reallocating in the usual (ASCII) case.
fn lowercase(mut name: String) -> String {
    if name.is_ascii() {
        name.make_ascii_lowercase();
        name
    } else {
        name.to_lowercase()
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
        assert_eq!(block.get("streamtype"), Some("stdout"));
        assert_eq!(block.get("STREAMTYPE"), Some("stdout"));
        assert_eq!(block.get("requestid"), Some("0"));
        assert_eq!(block.get("port"), None);
        assert_eq!(
            block.iter().collect::<Vec<_>>(),
            [("streamtype", "stdout"), ("requestid", "0")]
        );
        assert_eq!(block.len(), 2);
        assert!(!block.is_empty());
    }

    #[test]
    fn repeated_names_join_with_nul() {
        let mut block: HeaderBlock = [("x-a", "1"), ("X-A", "2")].into_iter().collect();
        assert_eq!(block.len(), 1);
        assert_eq!(block.get("x-a"), Some("1\u{0}2"));
        assert_eq!(block.get_all("x-a").collect::<Vec<_>>(), ["1", "2"]);
        block.push("x-b", "");
        assert_eq!(block.get_all("x-b").collect::<Vec<_>>(), [""]);
        assert_eq!(block.get_all("x-c").count(), 0);
    }

    #[test]
    fn non_ascii_names() {
        let mut block = HeaderBlock::new();
        block.push("ÄÖ", "v");
        assert_eq!(block.get("äö"), Some("v"));
        assert_eq!(block.get("ÄÖ"), Some("v"));
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
