//! The terminal-size stream (PROTOCOL.md §1.7): concatenated JSON objects
//! `{"Width":W,"Height":H}`, message boundaries meaningless, keys case-insensitive, the first
//! malformed value ends resize handling for the session.

use serde_json::Value;

/// Most bytes buffered while waiting for the rest of one JSON object.
const MAX_PENDING: usize = 4096;

/// Incremental decoder for the resize stream.
#[derive(Debug, Default)]
pub(crate) struct SizeDecoder {
    buf: Vec<u8>,
    failed: bool,
}

impl SizeDecoder {
    /// Feeds bytes; returns the complete sizes they finish (width, height). After a decode
    /// error it returns nothing, for good.
    pub(crate) fn push(&mut self, data: &[u8]) -> Vec<(u16, u16)> {
        let mut out = Vec::new();
        if self.failed {
            return out;
        }
        self.buf.extend_from_slice(data);
        let mut consumed = 0;
        {
            let mut iter = serde_json::Deserializer::from_slice(&self.buf).into_iter::<Value>();
            loop {
                match iter.next() {
                    None => {
                        consumed = self.buf.len();
                        break;
                    }
                    Some(Ok(v)) => {
                        consumed = iter.byte_offset();
                        match size_of(&v) {
                            Some(s) => out.push(s),
                            None => {
                                self.failed = true;
                                break;
                            }
                        }
                    }
                    Some(Err(e)) if e.is_eof() => break,
                    Some(Err(_)) => {
                        self.failed = true;
                        break;
                    }
                }
            }
        }
        if self.failed {
            self.buf = Vec::new();
            return out;
        }
        self.buf.drain(..consumed);
        if self.buf.len() > MAX_PENDING {
            self.failed = true;
            self.buf = Vec::new();
        }
        out
    }
}

fn size_of(v: &Value) -> Option<(u16, u16)> {
    let obj = v.as_object()?;
    let mut width = 0u16;
    let mut height = 0u16;
    for (k, val) in obj {
        let target = if k.eq_ignore_ascii_case("width") {
            &mut width
        } else if k.eq_ignore_ascii_case("height") {
            &mut height
        } else {
            continue;
        };
        *target = u16::try_from(val.as_u64()?).ok()?;
    }
    Some((width, height))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_lowercase() {
        let mut d = SizeDecoder::default();
        assert!(d.push(br#"{"Width":100,"#).is_empty());
        assert_eq!(
            d.push(b"\"Height\":40}\n{\"width\":1,\"height\":2}\n"),
            vec![(100, 40), (1, 2)]
        );
    }

    #[test]
    fn malformed_stops_for_good() {
        let mut d = SizeDecoder::default();
        assert_eq!(d.push(b"{\"Width\":3,\"Height\":4}x"), vec![(3, 4)]);
        assert!(d.push(b"{\"Width\":5,\"Height\":6}").is_empty());
        let mut d = SizeDecoder::default();
        assert!(d.push(b"{\"Width\":70000,\"Height\":4}").is_empty());
        assert!(d.push(b"{\"Width\":5,\"Height\":6}").is_empty());
    }
}
