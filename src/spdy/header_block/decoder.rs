//! The receiving side's inflate context (PROTOCOL.md §3.3).

use flate2::{Decompress, FlushDecompress, Status};

use super::{BlockKind, HeaderBlock, HeaderBlockError, Reading, DICTIONARY, DICTIONARY_ADLER32};

/// Default cap on one decompressed block: far above anything Kubernetes sends (a few dozen
/// bytes), far below what would hurt.
pub const DEFAULT_MAX_DECOMPRESSED: usize = 64 * 1024;

/// Scratch capacity kept between blocks; a larger buffer left by an unusual block is released.
const RETAINED_SCRATCH: usize = 4096;
/// First allocation of the scratch buffer.
const INITIAL_SCRATCH: usize = 256;

/// The inflate context for one direction of one connection.
///
/// The peer compresses all its header blocks as one zlib stream, so this context lives as long
/// as the connection receives header blocks. It is allocated on the first block (about 46 KiB
/// with zlib-rs, 32 KiB of it the window a peer's stream may refer back into), and dropping
/// the decoder frees it.
#[derive(Debug)]
pub struct HeaderDecoder {
    state: State,
    /// Decompressed bytes of the block being decoded, reused between blocks.
    scratch: Vec<u8>,
    limit: usize,
}

#[derive(Debug, Default)]
enum State {
    #[default]
    Fresh,
    Active(Decompress),
    /// The stream position is unknown after an error: later blocks cannot be inflated.
    Poisoned,
}

impl Default for HeaderDecoder {
    fn default() -> Self {
        HeaderDecoder::new()
    }
}

impl HeaderDecoder {
    /// A decoder with the default limit ([`DEFAULT_MAX_DECOMPRESSED`]) and no zlib state yet.
    pub fn new() -> HeaderDecoder {
        HeaderDecoder::with_limit(DEFAULT_MAX_DECOMPRESSED)
    }

    /// A decoder that refuses blocks inflating to more than `max_decompressed` bytes.
    pub fn with_limit(max_decompressed: usize) -> HeaderDecoder {
        HeaderDecoder {
            state: State::Fresh,
            scratch: Vec::new(),
            limit: max_decompressed,
        }
    }

    /// Whether the inflate context has been allocated (it is, from the first block on).
    pub fn allocated(&self) -> bool {
        matches!(self.state, State::Active(_))
    }

    /// Inflates exactly one frame's header block and reads it as a block of `kind`, failing
    /// where spdystream refuses the frame (see [`HeaderBlock::read_raw`]): for our own
    /// sessions, which end as spdystream's would.
    ///
    /// The SPDY/3 dictionary is supplied when the stream asks for it. Every byte of
    /// `compressed` must be consumed, and the output may not exceed the limit: a header bomb is
    /// an error, not an allocation. Errors in the compressed data poison the decoder (the
    /// shared stream cannot be resumed); a block that inflates fine but breaks the header rules
    /// does not.
    pub fn decode(
        &mut self,
        compressed: &[u8],
        kind: BlockKind,
    ) -> Result<HeaderBlock, HeaderBlockError> {
        let reading = self.read(compressed, kind)?;
        match reading.refusal {
            Some(refusal) => Err(refusal),
            None => Ok(reading.headers),
        }
    }

    /// Inflates exactly one frame's header block and reads it as spdystream does, refusal or
    /// not: for an observer of a session between two other ends, which must read what the
    /// receiving end reads. Fails only where the block cannot be inflated or its layout
    /// followed.
    pub fn read(
        &mut self,
        compressed: &[u8],
        kind: BlockKind,
    ) -> Result<Reading, HeaderBlockError> {
        let inflated = self.inflate(compressed);
        if inflated.is_err() {
            self.state = State::Poisoned;
        }
        let reading = inflated.and_then(|()| HeaderBlock::read_raw(&self.scratch, kind));
        self.scratch.clear();
        self.scratch.shrink_to(RETAINED_SCRATCH);
        reading
    }

    /// Inflates `input` into `self.scratch`.
    fn inflate(&mut self, mut input: &[u8]) -> Result<(), HeaderBlockError> {
        if matches!(self.state, State::Fresh) {
            self.state = State::Active(Decompress::new(true));
        }
        let State::Active(inflate) = &mut self.state else {
            return Err(HeaderBlockError::Poisoned);
        };
        self.scratch.clear();
        loop {
            if self.scratch.len() == self.scratch.capacity() {
                // Grow up to one byte past the limit: filling that byte proves the overflow.
                let cap = self.scratch.capacity();
                if cap > self.limit {
                    return Err(HeaderBlockError::DecompressedTooLarge { limit: self.limit });
                }
                let target = (cap * 2)
                    .max(INITIAL_SCRATCH)
                    .min(self.limit.saturating_add(1));
                self.scratch.reserve_exact(target - cap);
            }
            let (in_before, out_before) = (inflate.total_in(), inflate.total_out());
            let result = inflate.decompress_vec(input, &mut self.scratch, FlushDecompress::Sync);
            let consumed = (inflate.total_in() - in_before) as usize;
            let produced = (inflate.total_out() - out_before) as usize;
            input = &input[consumed..];
            match result {
                Ok(Status::StreamEnd) => return Err(HeaderBlockError::StreamEnded),
                Ok(Status::Ok | Status::BufError) => {}
                Err(e) => match e.needs_dictionary() {
                    Some(DICTIONARY_ADLER32) => {
                        inflate.set_dictionary(DICTIONARY).map_err(corrupt)?;
                        continue;
                    }
                    Some(other) => return Err(HeaderBlockError::WrongDictionary(other)),
                    None => return Err(corrupt(e)),
                },
            }
            let room_left = self.scratch.len() < self.scratch.capacity();
            // All input taken and output space to spare: everything inflatable is out.
            if input.is_empty() && room_left {
                break;
            }
            if room_left && consumed == 0 && produced == 0 {
                return Err(HeaderBlockError::UnconsumedInput(input.len()));
            }
        }
        if self.scratch.len() > self.limit {
            return Err(HeaderBlockError::DecompressedTooLarge { limit: self.limit });
        }
        Ok(())
    }
}

fn corrupt(e: impl std::fmt::Display) -> HeaderBlockError {
    HeaderBlockError::Corrupt(e.to_string())
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;

    use super::*;
    use crate::spdy::header_block::HeaderEncoder;

    fn streamtype(value: &str) -> HeaderBlock {
        let mut block = HeaderBlock::new();
        block.push("streamtype", value);
        block
    }

    #[test]
    fn allocates_lazily_and_round_trips() {
        let mut encoder = HeaderEncoder::new();
        let mut decoder = HeaderDecoder::new();
        assert!(!decoder.allocated());
        for value in ["error", "stdin", "stdout", "stderr", "resize"] {
            let mut out = BytesMut::new();
            encoder.encode(&streamtype(value), &mut out).unwrap();
            let block = decoder.decode(&out, BlockKind::SynStream).unwrap();
            assert_eq!(block, streamtype(value));
        }
        assert!(decoder.allocated());
    }

    #[test]
    fn refuses_garbage() {
        let mut decoder = HeaderDecoder::new();
        let err = decoder
            .decode(b"\x00\x01garbage", BlockKind::SynReply)
            .unwrap_err();
        assert!(matches!(err, HeaderBlockError::Corrupt(_)), "{err:?}");
        assert_eq!(
            decoder.decode(b"x", BlockKind::SynReply),
            Err(HeaderBlockError::Poisoned)
        );
    }

    #[test]
    fn refuses_a_foreign_dictionary() {
        // A zlib header announcing dictionary id 0x01020304.
        let header = [0x78, 0xF9, 0x01, 0x02, 0x03, 0x04, 0x00];
        let err = HeaderDecoder::new()
            .decode(&header, BlockKind::SynReply)
            .unwrap_err();
        assert_eq!(err, HeaderBlockError::WrongDictionary(0x0102_0304));
    }

    #[test]
    fn limits_below_the_initial_scratch_size() {
        let mut out = BytesMut::new();
        HeaderEncoder::new()
            .encode(&streamtype("error"), &mut out)
            .unwrap();
        // The block inflates to 27 bytes.
        for (limit, ok) in [(0, false), (26, false), (27, true), (usize::MAX, true)] {
            let result = HeaderDecoder::with_limit(limit).decode(&out, BlockKind::SynStream);
            match result {
                Ok(block) => assert!(ok && block == streamtype("error"), "limit {limit}"),
                Err(e) => {
                    assert!(!ok, "limit {limit}: {e:?}");
                    assert_eq!(e, HeaderBlockError::DecompressedTooLarge { limit });
                }
            }
        }
    }

    #[test]
    fn empty_input_is_a_truncated_block() {
        let err = HeaderDecoder::new()
            .decode(&[], BlockKind::SynReply)
            .unwrap_err();
        assert_eq!(err, HeaderBlockError::Truncated);
    }

    #[test]
    fn is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<HeaderDecoder>();
    }
}
