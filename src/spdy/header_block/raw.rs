//! The uncompressed SPDY/3 block layout (PROTOCOL.md §3.3), big-endian:
//!
//! ```text
//! count (4) | count x [ name length (4) | name | value length (4) | value ]
//! ```
//!
//! Read as Go's spdystream reads it (`parseHeaderValueBlock`, then the frame's check of
//! hop-by-hop names): every name lowercased with `strings.ToLower`, every value split at NUL
//! and added part by part with `http.Header.Add`, so a repeated name adds its parts after the
//! first one's. Go refuses the frame (and ends the connection) when a name was not lowercase
//! (or not UTF-8), when its duplicate check fires, and when a hop-by-hop name is present; it
//! still read the headers, and so do we ([`Reading`]). Its duplicate check looks the
//! lowercased name up among the `http.Header` keys, which are canonical (`Streamtype`), so it
//! only fires for names that are their own canonical key (`8080`, `x y`, the empty name): a
//! repeated `streamtype` is accepted, its first value winning.

use std::collections::HashMap;

use super::block::VALUE_SEPARATOR;
use super::go_names::{go_lowercase, is_own_key};
use super::{BlockKind, HeaderBlock, HeaderBlockError};

/// Blocks with at most this many pairs look a name up among the earlier ones pairwise; larger
/// ones (only ever seen from a hostile peer) through a map, so reading stays linear.
const PAIRWISE_LOOKUP: usize = 16;

/// A header block as spdystream reads it: the headers, and whether it refuses the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// The headers as Go's `http.Header` holds them.
    pub headers: HeaderBlock,
    /// Why spdystream refuses the frame that carries the block (ending its connection), if it
    /// does. The first reason found; the headers are read all the same.
    pub refusal: Option<HeaderBlockError>,
}

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
            for part in [name.as_bytes(), value] {
                // Cannot truncate: the whole block fits in u32, so every part does.
                dst.extend_from_slice(&(part.len() as u32).to_be_bytes());
                dst.extend_from_slice(part);
            }
        }
        Ok(())
    }

    /// Checks a block we are about to send against what the peer will refuse: empty and
    /// forbidden names. (Names are lowercase and unique by construction.) We never send an
    /// empty name, though spdystream would read one.
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

    /// Reads a raw block received in a frame of type `kind` as spdystream does (see the module
    /// notes). Fails only where the layout itself cannot be followed: a count or length past
    /// the end of `raw`, or bytes after the last pair (which spdystream would read as the start
    /// of the next block).
    pub fn read_raw(raw: &[u8], kind: BlockKind) -> Result<Reading, HeaderBlockError> {
        let mut rest = raw;
        let count = take_u32(&mut rest)? as usize;
        // The count is the peer's claim: never reserve more than the bytes could hold.
        let mut headers = HeaderBlock::with_capacity(count.min(rest.len() / 8));
        let mut index = NameIndex::default();
        let mut refusal = None;
        for _ in 0..count {
            let name = take(&mut rest)?;
            let value = take(&mut rest)?;
            let (name, changed) = go_lowercase(name);
            if changed {
                refusal.get_or_insert(HeaderBlockError::UppercaseName(name.clone()));
            }
            match index.find(&headers, &name) {
                Some(i) => {
                    if is_own_key(name.as_bytes()) {
                        refusal.get_or_insert(HeaderBlockError::DuplicateName(name));
                    }
                    if let Some(existing) = headers.value_mut(i) {
                        existing.push(VALUE_SEPARATOR);
                        existing.extend_from_slice(value);
                    }
                }
                None => {
                    index.add(&name, headers.len());
                    headers.push_new(name, value);
                }
            }
        }
        if !rest.is_empty() {
            return Err(HeaderBlockError::TrailingBytes(rest.len()));
        }
        if refusal.is_none() {
            refusal = headers
                .pairs()
                .iter()
                .find(|(name, _)| kind.forbids(name))
                .map(|(name, _)| HeaderBlockError::ForbiddenName {
                    name: name.clone(),
                    kind,
                });
        }
        Ok(Reading { headers, refusal })
    }

    /// Parses a raw block received in a frame of type `kind` as spdystream does, and fails
    /// where it refuses the frame (what an end of the connection does: our own sessions).
    #[cfg(test)]
    pub(crate) fn parse_raw(raw: &[u8], kind: BlockKind) -> Result<HeaderBlock, HeaderBlockError> {
        let reading = HeaderBlock::read_raw(raw, kind)?;
        match reading.refusal {
            Some(refusal) => Err(refusal),
            None => Ok(reading.headers),
        }
    }
}

/// Where each name read so far sits in the block: searched pairwise while the block is small,
/// through a map once it is not.
#[derive(Default)]
struct NameIndex {
    map: Option<HashMap<String, usize>>,
}

impl NameIndex {
    fn find(&mut self, headers: &HeaderBlock, name: &str) -> Option<usize> {
        if self.map.is_none() && headers.len() > PAIRWISE_LOOKUP {
            let map = headers
                .pairs()
                .iter()
                .enumerate()
                .map(|(i, (n, _))| (n.clone(), i))
                .collect();
            self.map = Some(map);
        }
        match &self.map {
            Some(map) => map.get(name).copied(),
            None => headers.pairs().iter().position(|(n, _)| n == name),
        }
    }

    fn add(&mut self, name: &str, at: usize) {
        if let Some(map) = &mut self.map {
            map.insert(name.to_owned(), at);
        }
    }
}

fn take_u32(rest: &mut &[u8]) -> Result<u32, HeaderBlockError> {
    let (head, tail) = rest
        .split_first_chunk::<4>()
        .ok_or(HeaderBlockError::Truncated)?;
    *rest = tail;
    Ok(u32::from_be_bytes(*head))
}

fn take<'a>(rest: &mut &'a [u8]) -> Result<&'a [u8], HeaderBlockError> {
    let len = take_u32(rest)? as usize;
    if len > rest.len() {
        return Err(HeaderBlockError::Truncated);
    }
    let (bytes, tail) = rest.split_at(len);
    *rest = tail;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spdy::header_block::go_names::go_lowercase;

    /// `streamtype: error`, as in PROTOCOL.md §6.2.
    const STREAMTYPE_ERROR: &[u8] =
        b"\x00\x00\x00\x01\x00\x00\x00\x0Astreamtype\x00\x00\x00\x05error";

    fn raw(pairs: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut out = (pairs.len() as u32).to_be_bytes().to_vec();
        for (n, v) in pairs {
            out.extend_from_slice(&(n.len() as u32).to_be_bytes());
            out.extend_from_slice(n);
            out.extend_from_slice(&(v.len() as u32).to_be_bytes());
            out.extend_from_slice(v);
        }
        out
    }

    fn parse(raw: &[u8]) -> Result<HeaderBlock, HeaderBlockError> {
        HeaderBlock::parse_raw(raw, BlockKind::SynStream)
    }

    fn read(raw: &[u8]) -> Reading {
        HeaderBlock::read_raw(raw, BlockKind::SynStream).unwrap()
    }

    fn some(v: &[u8]) -> Option<&[u8]> {
        Some(v)
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
        let block = parse(&raw(&[
            (b"requestid", b"0"),
            (b"port", b"8080"),
            (b"x", b""),
        ]))
        .unwrap();
        assert_eq!(block.get("port"), some(b"8080"));
        assert_eq!(block.get("x"), some(b""));
    }

    /// Finding 2 of issue 35: the kubelet reads the first NUL-separated part.
    #[test]
    fn a_value_is_read_up_to_its_first_nul() {
        // streamtype: "stdout\0", byte for byte.
        let block =
            parse(b"\x00\x00\x00\x01\x00\x00\x00\x0Astreamtype\x00\x00\x00\x07stdout\x00").unwrap();
        assert_eq!(block.get("streamtype"), some(b"stdout"));
        assert_eq!(
            block.get_all("streamtype").collect::<Vec<_>>(),
            [&b"stdout"[..], b""]
        );
        let block = parse(&raw(&[(b"port", b"8080\0junk"), (b"requestid", b"\x007")])).unwrap();
        assert_eq!(block.get("port"), some(b"8080"));
        // An empty first part is what Get returns: the kubelet takes it as missing.
        assert_eq!(block.get("requestid"), some(b""));
    }

    #[test]
    fn values_are_bytes() {
        let block = parse(&raw(&[
            (b"streamtype", b"stdout\0\xff\xfe"),
            (b"x", b"\xff"),
        ]))
        .unwrap();
        assert_eq!(block.get("streamtype"), some(b"stdout"));
        assert_eq!(block.get("x"), some(b"\xff"));
    }

    #[test]
    fn a_repeated_name_adds_its_parts_after_the_first_ones() {
        // Go files `streamtype` under `Streamtype`, so its duplicate check never sees it.
        let reading = read(&raw(&[
            (b"streamtype", b"stdout"),
            (b"port", b"1"),
            (b"streamtype", b"stderr\0x"),
        ]));
        assert_eq!(reading.refusal, None);
        assert_eq!(reading.headers.len(), 2);
        assert_eq!(reading.headers.get("streamtype"), some(b"stdout"));
        assert_eq!(
            reading.headers.get_all("streamtype").collect::<Vec<_>>(),
            [&b"stdout"[..], b"stderr", b"x"]
        );
    }

    #[test]
    fn the_duplicate_check_fires_only_for_names_that_are_their_own_key() {
        for name in [&b"8080"[..], b"x y", b"", b"1a", b"a\0"] {
            let reading = read(&raw(&[(name, b"a"), (name, b"b")]));
            let lower = String::from_utf8(name.to_vec()).unwrap();
            assert_eq!(
                reading.refusal,
                Some(HeaderBlockError::DuplicateName(lower)),
                "{name:?}"
            );
            // Read all the same.
            assert_eq!(reading.headers.len(), 1);
        }
        // An empty name alone is accepted, as Go accepts it.
        assert_eq!(read(&raw(&[(b"", b"v")])).refusal, None);
    }

    #[test]
    fn a_name_that_is_not_lowercase_is_refused_and_read_lowercased() {
        let reading = read(&raw(&[(b"StreamType", b"stdout")]));
        assert_eq!(
            reading.refusal,
            Some(HeaderBlockError::UppercaseName("streamtype".into()))
        );
        assert_eq!(reading.headers.get("streamtype"), some(b"stdout"));
        // Lowercased, it repeats a name already there: added after it.
        let reading = read(&raw(&[(b"port", b"1"), (b"PORT", b"2")]));
        assert_eq!(reading.headers.get_all("port").count(), 2);
        assert!(reading.refusal.is_some());
        // Bytes that are not UTF-8 make Go's lowercasing change the name too.
        let reading = read(&raw(&[(b"x\xff", b"v")]));
        assert_eq!(
            reading.refusal,
            Some(HeaderBlockError::UppercaseName("x\u{FFFD}".into()))
        );
        assert_eq!(
            parse(&raw(&[("ÄB".as_bytes(), b"v")])),
            Err(HeaderBlockError::UppercaseName("äb".into()))
        );
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
        assert_eq!(
            HeaderBlock::read_raw(&long, BlockKind::SynStream),
            Err(HeaderBlockError::TrailingBytes(1))
        );
    }

    #[test]
    fn large_blocks_are_read_through_a_map() {
        let names: Vec<String> = (0..100).map(|i| format!("h{i}")).collect();
        let mut pairs: Vec<(&[u8], &[u8])> =
            names.iter().map(|n| (n.as_bytes(), &b""[..])).collect();
        assert_eq!(parse(&raw(&pairs)).unwrap().len(), 100);
        pairs.push((b"h42", b"again"));
        pairs.push((b"4242", b"a"));
        pairs.push((b"4242", b"b"));
        let reading = read(&raw(&pairs));
        assert_eq!(reading.headers.len(), 101);
        assert_eq!(
            reading.headers.get_all("h42").collect::<Vec<_>>(),
            [&b""[..], b"again"]
        );
        assert_eq!(
            reading.refusal,
            Some(HeaderBlockError::DuplicateName("4242".into()))
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
            let block = raw(&[(name.as_bytes(), b"x")]);
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
            // Read all the same.
            let reading = read(&block);
            assert_eq!(reading.headers.get(name), some(b"x"));
        }
        // Not a token: its own key, not `Host`.
        assert!(parse(&raw(&[(b"host ", b"x")])).is_ok());
    }

    /// An `http.Header`: canonical keys and their values, in the order they came.
    type GoHeader = Vec<(Vec<u8>, Vec<Vec<u8>>)>;

    /// Go's algorithm transcribed literally: an `http.Header` map keyed by
    /// `CanonicalMIMEHeaderKey`, the duplicate check looking the lowercased name up in it.
    fn go_model(pairs: &[(Vec<u8>, Vec<u8>)]) -> (GoHeader, bool) {
        fn canonical(name: &[u8]) -> Vec<u8> {
            let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            if !name.iter().all(|&b| token(b)) {
                return name.to_vec();
            }
            let mut upper = true;
            name.iter()
                .map(|&b| {
                    let c = if upper {
                        b.to_ascii_uppercase()
                    } else {
                        b.to_ascii_lowercase()
                    };
                    upper = c == b'-';
                    c
                })
                .collect()
        }
        let mut map: GoHeader = Vec::new();
        let mut refused = false;
        for (name, value) in pairs {
            let (lower, changed) = go_lowercase(name);
            refused |= changed;
            refused |= map.iter().any(|(k, _)| *k == lower.as_bytes());
            let key = canonical(lower.as_bytes());
            let at = match map.iter().position(|(k, _)| *k == key) {
                Some(at) => at,
                None => {
                    map.push((key, Vec::new()));
                    map.len() - 1
                }
            };
            map[at]
                .1
                .extend(value.split(|&b| b == 0).map(<[u8]>::to_vec));
        }
        refused |= map.iter().any(|(k, _)| {
            [
                &b"Connection"[..],
                b"Host",
                b"Keep-Alive",
                b"Proxy-Connection",
                b"Transfer-Encoding",
            ]
            .contains(&k.as_slice())
        });
        (map, refused)
    }

    proptest::proptest! {
        /// The reading is Go's algorithm, whatever the names and values.
        #[test]
        fn reads_as_gos_algorithm(
            pairs in proptest::collection::vec(
                (
                    proptest::collection::vec(proptest::sample::select(b"aAzZ0- \0\xff\xc3\x84".to_vec()), 0..4),
                    proptest::collection::vec(proptest::sample::select(b"a0\0\xff".to_vec()), 0..4),
                ),
                0..24,
            )
        ) {
            let reading = read(&raw(&pairs.iter().map(|(n, v)| (n.as_slice(), v.as_slice())).collect::<Vec<_>>()));
            let (model, refused) = go_model(&pairs);
            proptest::prop_assert_eq!(reading.refusal.is_some(), refused);
            proptest::prop_assert_eq!(reading.headers.len(), model.len());
            for (name, value) in reading.headers.iter() {
                let parts: Vec<Vec<u8>> = value.split(|&b| b == 0).map(<[u8]>::to_vec).collect();
                let found = model.iter().find(|(k, _)| super::super::go_names::same_key(k, name.as_bytes()));
                proptest::prop_assert_eq!(found.map(|(_, v)| v), Some(&parts));
                proptest::prop_assert_eq!(reading.headers.get(name), parts.first().map(Vec::as_slice));
            }
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
