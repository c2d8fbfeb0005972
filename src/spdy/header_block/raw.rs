//! The uncompressed SPDY/3 block layout (PROTOCOL.md §3.3), big-endian:
//!
//! ```text
//! count (4) | count x [ name length (4) | name | value length (4) | value ]
//! ```

use std::collections::HashSet;

use super::{BlockKind, HeaderBlock, HeaderBlockError};

/// Blocks with at most this many pairs are checked for duplicates pairwise; larger ones (only
/// ever seen from a hostile peer) through a hash set, so the check stays linear.
const PAIRWISE_DUPLICATE_CHECK: usize = 16;

impl HeaderBlock {
    /// Bytes the raw layout of this block takes.
    pub(crate) fn raw_len(&self) -> usize {
        self.pairs()
            .iter()
            .fold(4, |len, (n, v)| len.saturating_add(8 + n.len() + v.len()))
    }

    /// Appends the raw layout to `dst`. Fails on empty names and on lengths that do not fit
    /// their 32-bit fields.
    pub(crate) fn write_raw(&self, dst: &mut Vec<u8>) -> Result<(), HeaderBlockError> {
        let total = self.raw_len();
        if u32::try_from(total).is_err() {
            return Err(HeaderBlockError::BlockTooLarge(total));
        }
        dst.reserve(total);
        dst.extend_from_slice(&(self.len() as u32).to_be_bytes());
        for (name, value) in self.pairs() {
            if name.is_empty() {
                return Err(HeaderBlockError::EmptyName);
            }
            for part in [name, value] {
                // Cannot truncate: the whole block fits in u32, so every part does.
                dst.extend_from_slice(&(part.len() as u32).to_be_bytes());
                dst.extend_from_slice(part.as_bytes());
            }
        }
        Ok(())
    }

    /// Checks a block we are about to send against what the peer will refuse: empty and
    /// forbidden names. (Names are lowercase and unique by construction.)
    pub(crate) fn check_outgoing(&self, kind: BlockKind) -> Result<(), HeaderBlockError> {
        for (name, _) in self.pairs() {
            if name.is_empty() {
                return Err(HeaderBlockError::EmptyName);
            }
            if kind.forbids(name) {
                return Err(HeaderBlockError::ForbiddenName {
                    name: name.clone(),
                    kind,
                });
            }
        }
        Ok(())
    }

    /// Parses and validates a raw block received in a frame of type `kind`: every length must
    /// stay inside `raw`, no byte may follow the last pair, and names must be non-empty,
    /// lowercase, unique and allowed for `kind`.
    pub(crate) fn parse_raw(raw: &[u8], kind: BlockKind) -> Result<HeaderBlock, HeaderBlockError> {
        let mut rest = raw;
        let count = take_u32(&mut rest)? as usize;
        // The count is the peer's claim: never reserve more than the bytes could hold.
        let mut block = HeaderBlock::with_capacity(count.min(rest.len() / 8));
        for _ in 0..count {
            let name = take_str(&mut rest)?;
            let value = take_str(&mut rest)?;
            check_name(name, kind)?;
            block.push_unchecked(name.to_owned(), value.to_owned());
        }
        if !rest.is_empty() {
            return Err(HeaderBlockError::TrailingBytes(rest.len()));
        }
        if let Some(name) = find_duplicate(block.pairs()) {
            return Err(HeaderBlockError::DuplicateName(name.to_owned()));
        }
        Ok(block)
    }
}

fn check_name(name: &str, kind: BlockKind) -> Result<(), HeaderBlockError> {
    if name.is_empty() {
        return Err(HeaderBlockError::EmptyName);
    }
    let uppercase = if name.is_ascii() {
        name.bytes().any(|b| b.is_ascii_uppercase())
    } else {
        name.to_lowercase() != name
    };
    if uppercase {
        return Err(HeaderBlockError::UppercaseName(name.to_owned()));
    }
    if kind.forbids(name) {
        return Err(HeaderBlockError::ForbiddenName {
            name: name.to_owned(),
            kind,
        });
    }
    Ok(())
}

fn find_duplicate(pairs: &[(String, String)]) -> Option<&str> {
    if pairs.len() <= PAIRWISE_DUPLICATE_CHECK {
        return pairs
            .iter()
            .enumerate()
            .find(|(i, (name, _))| pairs[..*i].iter().any(|(earlier, _)| earlier == name))
            .map(|(_, (name, _))| name.as_str());
    }
    let mut seen = HashSet::with_capacity(pairs.len());
    pairs
        .iter()
        .map(|(name, _)| name.as_str())
        .find(|name| !seen.insert(*name))
}

fn take_u32(rest: &mut &[u8]) -> Result<u32, HeaderBlockError> {
    let (head, tail) = rest
        .split_first_chunk::<4>()
        .ok_or(HeaderBlockError::Truncated)?;
    *rest = tail;
    Ok(u32::from_be_bytes(*head))
}

fn take_str<'a>(rest: &mut &'a [u8]) -> Result<&'a str, HeaderBlockError> {
    let len = take_u32(rest)? as usize;
    if len > rest.len() {
        return Err(HeaderBlockError::Truncated);
    }
    let (bytes, tail) = rest.split_at(len);
    *rest = tail;
    std::str::from_utf8(bytes).map_err(|_| HeaderBlockError::InvalidUtf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `streamtype: error`, as in PROTOCOL.md §6.2.
    const STREAMTYPE_ERROR: &[u8] =
        b"\x00\x00\x00\x01\x00\x00\x00\x0Astreamtype\x00\x00\x00\x05error";

    fn raw(pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut out = (pairs.len() as u32).to_be_bytes().to_vec();
        for (n, v) in pairs {
            out.extend_from_slice(&(n.len() as u32).to_be_bytes());
            out.extend_from_slice(n.as_bytes());
            out.extend_from_slice(&(v.len() as u32).to_be_bytes());
            out.extend_from_slice(v.as_bytes());
        }
        out
    }

    fn parse(raw: &[u8]) -> Result<HeaderBlock, HeaderBlockError> {
        HeaderBlock::parse_raw(raw, BlockKind::SynStream)
    }

    #[test]
    fn writes_the_documented_layout() {
        let mut block = HeaderBlock::new();
        block.push("streamtype", "error");
        let mut out = Vec::new();
        block.write_raw(&mut out).unwrap();
        assert_eq!(out, STREAMTYPE_ERROR);
        assert_eq!(block.raw_len(), out.len());
        assert_eq!(parse(&out).unwrap(), block);
    }

    #[test]
    fn empty_block_is_four_zero_bytes() {
        let mut out = Vec::new();
        HeaderBlock::new().write_raw(&mut out).unwrap();
        assert_eq!(out, [0, 0, 0, 0]);
        assert!(parse(&out).unwrap().is_empty());
    }

    #[test]
    fn accepts_any_order_and_empty_values() {
        let block = parse(&raw(&[("requestid", "0"), ("port", "8080"), ("x", "")])).unwrap();
        assert_eq!(block.get("port"), Some("8080"));
        assert_eq!(block.get("x"), Some(""));
    }

    #[test]
    fn rejects_truncation_and_trailing_bytes() {
        assert_eq!(parse(&[0, 0, 0]), Err(HeaderBlockError::Truncated));
        assert_eq!(
            parse(&STREAMTYPE_ERROR[..STREAMTYPE_ERROR.len() - 1]),
            Err(HeaderBlockError::Truncated)
        );
        assert_eq!(
            parse(&[0, 0, 0, 1, 0, 0, 0, 9, b'a']),
            Err(HeaderBlockError::Truncated)
        );
        assert_eq!(
            parse(&[0xFF, 0xFF, 0xFF, 0xFF]),
            Err(HeaderBlockError::Truncated)
        );
        let mut long = STREAMTYPE_ERROR.to_vec();
        long.push(0);
        assert_eq!(parse(&long), Err(HeaderBlockError::TrailingBytes(1)));
    }

    #[test]
    fn rejects_bad_names() {
        assert_eq!(parse(&raw(&[("", "v")])), Err(HeaderBlockError::EmptyName));
        assert_eq!(
            parse(&raw(&[("StreamType", "error")])),
            Err(HeaderBlockError::UppercaseName("StreamType".into()))
        );
        assert_eq!(
            parse(&raw(&[("ÄB", "v")])),
            Err(HeaderBlockError::UppercaseName("ÄB".into()))
        );
        assert_eq!(
            parse(&raw(&[("port", "1"), ("port", "2")])),
            Err(HeaderBlockError::DuplicateName("port".into()))
        );
        assert_eq!(
            parse(&[0, 0, 0, 1, 0, 0, 0, 1, 0xFF, 0, 0, 0, 0]),
            Err(HeaderBlockError::InvalidUtf8)
        );
    }

    #[test]
    fn finds_duplicates_in_large_blocks() {
        let mut pairs: Vec<(String, String)> =
            (0..100).map(|i| (format!("h{i}"), String::new())).collect();
        let refs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        assert_eq!(parse(&raw(&refs)).unwrap().len(), 100);
        pairs.push(("h42".into(), String::new()));
        let refs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            parse(&raw(&refs)),
            Err(HeaderBlockError::DuplicateName("h42".into()))
        );
    }

    #[test]
    fn forbidden_names_on_read() {
        for name in [
            "connection",
            "host",
            "keep-alive",
            "proxy-connection",
            "transfer-encoding",
        ] {
            let block = raw(&[(name, "x")]);
            assert_eq!(
                parse(&block),
                Err(HeaderBlockError::ForbiddenName {
                    name: name.into(),
                    kind: BlockKind::SynStream
                })
            );
            let reply = HeaderBlock::parse_raw(&block, BlockKind::SynReply);
            assert_eq!(reply.is_ok(), name == "host", "{name}");
            let headers = HeaderBlock::parse_raw(&block, BlockKind::Headers);
            assert_eq!(headers.is_ok(), name == "host", "{name}");
        }
    }

    #[test]
    fn outgoing_checks() {
        let mut block = HeaderBlock::new();
        block.push("Host", "x");
        assert!(block.check_outgoing(BlockKind::SynReply).is_ok());
        assert_eq!(
            block.check_outgoing(BlockKind::SynStream),
            Err(HeaderBlockError::ForbiddenName {
                name: "host".into(),
                kind: BlockKind::SynStream
            })
        );
        let mut empty = HeaderBlock::new();
        empty.push("", "x");
        assert_eq!(
            empty.check_outgoing(BlockKind::Headers),
            Err(HeaderBlockError::EmptyName)
        );
        assert_eq!(
            empty.write_raw(&mut Vec::new()),
            Err(HeaderBlockError::EmptyName)
        );
    }
}
