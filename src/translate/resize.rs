//! Terminal sizes on channel 4 (PROTOCOL.md §1.7): a stream of JSON objects
//! `{"Width":80,"Height":24}` whose message boundaries mean nothing. Keys match
//! case-insensitively, like Go's decoder; the first error ends resize handling for the session.

use serde_json::Value;

/// Most bytes of one unfinished object we hold before giving up.
const MAX_PENDING: usize = 4 * 1024;

/// A terminal size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TerminalSize {
    pub width: u16,
    pub height: u16,
}

impl TerminalSize {
    /// Appends the exact bytes kubectl (Go's JSON encoder) produces: `{"Width":W,"Height":H}\n`.
    pub fn encode_json(&self, dst: &mut Vec<u8>) {
        use std::io::Write;
        let _ = writeln!(
            dst,
            "{{\"Width\":{},\"Height\":{}}}",
            self.width, self.height
        );
    }
}

/// Why resize handling stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResizeError {
    #[error("malformed terminal size: {0}")]
    Malformed(String),
    #[error("terminal size object longer than {MAX_PENDING} bytes")]
    TooLong,
    #[error("resize handling already stopped")]
    Stopped,
}

/// Incremental decoder over the concatenated channel-4 bytes.
#[derive(Debug, Default)]
pub struct ResizeDecoder {
    pending: Vec<u8>,
    failed: bool,
}

impl ResizeDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the payload of one message; returns every size completed by it.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<TerminalSize>, ResizeError> {
        if self.failed {
            return Err(ResizeError::Stopped);
        }
        self.pending.extend_from_slice(bytes);
        let result = self.drain();
        if result.is_err() {
            self.failed = true;
            self.pending = Vec::new();
        }
        result
    }

    fn drain(&mut self) -> Result<Vec<TerminalSize>, ResizeError> {
        let mut sizes = Vec::new();
        let mut stream = serde_json::Deserializer::from_slice(&self.pending).into_iter::<Value>();
        let consumed = loop {
            let offset = stream.byte_offset();
            match stream.next() {
                None => break stream.byte_offset(),
                Some(Ok(value)) => sizes.push(to_size(&value)?),
                Some(Err(e)) if e.is_eof() => break offset,
                Some(Err(e)) => return Err(ResizeError::Malformed(e.to_string())),
            }
        };
        self.pending.drain(..consumed);
        if self.pending.len() > MAX_PENDING {
            return Err(ResizeError::TooLong);
        }
        Ok(sizes)
    }
}

fn to_size(value: &Value) -> Result<TerminalSize, ResizeError> {
    let Value::Object(map) = value else {
        return Err(ResizeError::Malformed(format!(
            "expected an object, got {value}"
        )));
    };
    let field = |name: &str| -> Result<u16, ResizeError> {
        // Go picks the exact key first, then any case-insensitive match.
        let v = map.get(name).or_else(|| {
            map.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v)
        });
        match v {
            None | Some(Value::Null) => Ok(0),
            Some(Value::Number(n)) => n
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .ok_or_else(|| ResizeError::Malformed(format!("{name} out of range: {n}"))),
            Some(other) => Err(ResizeError::Malformed(format!(
                "{name} is not a number: {other}"
            ))),
        }
    };
    Ok(TerminalSize {
        width: field("Width")?,
        height: field("Height")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn size(width: u16, height: u16) -> TerminalSize {
        TerminalSize { width, height }
    }

    #[test]
    fn kubectl_encoding_is_exact() {
        let mut out = Vec::new();
        size(80, 24).encode_json(&mut out);
        assert_eq!(out, b"{\"Width\":80,\"Height\":24}\n");
    }

    #[test]
    fn split_messages_lowercase_keys_and_several_objects() {
        let mut d = ResizeDecoder::new();
        assert_eq!(d.push(b"{\"Width\":100,").unwrap(), vec![]);
        assert_eq!(d.push(b"\"Height\":40}\n").unwrap(), vec![size(100, 40)]);
        assert_eq!(
            d.push(b"{\"width\":1,\"height\":2}{\"WIDTH\":3,\"HEIGHT\":4,\"x\":9}")
                .unwrap(),
            vec![size(1, 2), size(3, 4)]
        );
    }

    #[test]
    fn first_error_stops_for_good() {
        let mut d = ResizeDecoder::new();
        assert!(d.push(b"{\"Width\":70000,\"Height\":1}").is_err());
        assert_eq!(
            d.push(b"{\"Width\":1,\"Height\":1}"),
            Err(ResizeError::Stopped)
        );
        let mut d = ResizeDecoder::new();
        assert!(d.push(b"not json").is_err());
        let mut d = ResizeDecoder::new();
        assert!(d.push(b"[1,2]").is_err());
        let mut d = ResizeDecoder::new();
        assert_eq!(d.push(&[b' '; 5000]).unwrap(), vec![]);
        let mut d = ResizeDecoder::new();
        let mut long = b"{\"Width\":1,\"pad\":\"".to_vec();
        long.extend(std::iter::repeat_n(b'a', 5000));
        assert_eq!(d.push(&long), Err(ResizeError::TooLong));
    }

    proptest! {
        #[test]
        fn any_split_gives_the_same_sizes(sizes in proptest::collection::vec((any::<u16>(), any::<u16>()), 1..6), cut in 0usize..200) {
            let mut all = Vec::new();
            for (w, h) in &sizes {
                size(*w, *h).encode_json(&mut all);
            }
            let cut = cut.min(all.len());
            let mut d = ResizeDecoder::new();
            let mut got = d.push(&all[..cut]).unwrap();
            got.extend(d.push(&all[cut..]).unwrap());
            let want: Vec<_> = sizes.iter().map(|(w, h)| size(*w, *h)).collect();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn arbitrary_bytes_never_panic(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8)) {
            let mut d = ResizeDecoder::new();
            for c in chunks {
                let _ = d.push(&c);
            }
        }
    }
}
