//! The sending side's deflate context (PROTOCOL.md §3.3).

use bytes::BytesMut;
use flate2::{Compress, Compression, FlushCompress};

use super::{HeaderBlock, HeaderBlockError, DICTIONARY, DICTIONARY_ADLER32};

/// Deflate window: 2^10 = 1 KiB.
///
/// Memory, not ratio, decides this. zlib's deflate state is about 2^(wbits+2) bytes (window
/// plus chain table) on top of a hash table and literal buffers that depend only on memLevel,
/// which flate2 does not expose. Measured with the zlib-rs backend: 251 KiB at wbits 10 against
/// 375 KiB at wbits 15. Our blocks are tiny (a few dozen bytes) and only ever match recent
/// text, so the ratio does not suffer: over the 5 exec blocks and 400 port-forward blocks of a
/// typical session, wbits 10 and 15 differ by 3 bytes in total (the first block reaches less
/// of the dictionary). 10 rather than 9 because that first block is 3 bytes shorter for 2 KiB.
/// The peer inflates with its own 32 KiB window, which is always enough.
const WINDOW_BITS: u8 = 10;

/// The zlib stream header (RFC 1950) written before the first block, byte for byte what
/// spdystream writes: CMF `78` (deflate, window field 7 = 32 KiB), FLG `F9` (FLEVEL 3 = level
/// 9, FDICT set, FCHECK 25 so that `CMF*256 + FLG` is a multiple of 31), then the dictionary's
/// Adler-32 as DICTID.
///
/// We write it ourselves around a raw deflate stream instead of letting zlib wrap it, because
/// zlib would record our 1 KiB window (`28 EE ...`). Both are valid — the window field only
/// bounds the distances used, and ours stay far below 32 KiB — but the standard header keeps our
/// first block recognisable next to every Go peer's. The raw stream also skips the running
/// Adler-32 of all input, which only matters for a trailer that a never-finished SPDY stream
/// does not have.
const ZLIB_HEADER: [u8; 6] = {
    let [d0, d1, d2, d3] = DICTIONARY_ADLER32.to_be_bytes();
    [0x78, 0xF9, d0, d1, d2, d3]
};

/// Largest raw block we compress. It keeps the compressed block (at worst a few bytes per
/// 16 KiB larger than the input) well inside the 24-bit frame length, so a frame can never be
/// refused after its block has already advanced the shared context.
const MAX_RAW_BLOCK: usize = 8 << 20;

/// The deflate context for one direction of one connection.
///
/// SPDY/3 compresses every header block of a connection with one zlib stream, each block
/// ending in a sync flush, so the context lives as long as the connection sends header blocks.
/// It is allocated on the first block, and dropping the encoder frees it.
#[derive(Debug, Default)]
pub struct HeaderEncoder {
    state: State,
    /// The raw block being compressed; kept to avoid an allocation per block.
    raw: Vec<u8>,
}

#[derive(Debug, Default)]
enum State {
    /// Nothing allocated, nothing written yet.
    #[default]
    Fresh,
    /// The zlib header is out; later blocks continue the stream.
    Active(Compress),
    /// A compression error left the stream in an unknown state: no further block can be
    /// produced that the peer could inflate.
    Poisoned,
}

impl HeaderEncoder {
    /// An encoder with no zlib state yet.
    pub fn new() -> HeaderEncoder {
        HeaderEncoder::default()
    }

    /// Whether the deflate context has been allocated (it is, from the first block on).
    pub fn allocated(&self) -> bool {
        matches!(self.state, State::Active(_))
    }

    /// Appends `block`, compressed, to `dst`: the zlib header before the first block, then the
    /// deflate data ending in exactly one sync flush (`00 00 FF FF`), so the peer can inflate
    /// the whole block from this frame alone.
    ///
    /// A block that cannot be serialised (an empty name, an absurd size) is refused before the
    /// context is touched. If zlib itself fails the encoder is poisoned and every later call
    /// fails too. On error nothing is appended to `dst`.
    pub fn encode(
        &mut self,
        block: &HeaderBlock,
        dst: &mut BytesMut,
    ) -> Result<(), HeaderBlockError> {
        self.raw.clear();
        block.write_raw(&mut self.raw)?;
        if self.raw.len() > MAX_RAW_BLOCK {
            return Err(HeaderBlockError::BlockTooLarge(self.raw.len()));
        }
        let start = dst.len();
        let result = self.compress(dst);
        if result.is_err() {
            dst.truncate(start);
            self.state = State::Poisoned;
        }
        // A huge block should not pin its buffer for the connection's life.
        if self.raw.capacity() > RETAINED_SCRATCH {
            self.raw = Vec::new();
        }
        result
    }

    fn compress(&mut self, dst: &mut BytesMut) -> Result<(), HeaderBlockError> {
        if matches!(self.state, State::Fresh) {
            let mut deflate =
                Compress::new_with_window_bits(Compression::best(), false, WINDOW_BITS);
            deflate.set_dictionary(DICTIONARY).map_err(corrupt)?;
            self.state = State::Active(deflate);
            dst.extend_from_slice(&ZLIB_HEADER);
        }
        let State::Active(deflate) = &mut self.state else {
            return Err(HeaderBlockError::Poisoned);
        };
        let mut input = &self.raw[..];
        // Room for the worst case (zlib's deflateBound: stored blocks cost a few bytes per
        // 16 KiB, plus the flush marker), so the flush completes in one call. That matters:
        // had the output filled up exactly at the end of a flush, zlib would answer the next
        // call with a second, empty flush marker. The loop only guards against a wrong bound.
        let mut room = input.len() + input.len() / 2048 + 64;
        loop {
            let at = dst.len();
            dst.resize(at + room, 0);
            let (in_before, out_before) = (deflate.total_in(), deflate.total_out());
            let status = deflate.compress(input, &mut dst[at..], FlushCompress::Sync);
            let consumed = (deflate.total_in() - in_before) as usize;
            let produced = (deflate.total_out() - out_before) as usize;
            dst.truncate(at + produced);
            status.map_err(corrupt)?;
            input = &input[consumed..];
            // With a sync flush, all input taken and output space to spare means the block,
            // flush marker included, is complete.
            if input.is_empty() && produced < room {
                return Ok(());
            }
            if consumed == 0 && produced == 0 {
                return Err(HeaderBlockError::Corrupt("deflate made no progress".into()));
            }
            room = room.max(256) * 2;
        }
    }
}

/// Scratch capacity kept between blocks.
const RETAINED_SCRATCH: usize = 4096;

fn corrupt(e: impl std::fmt::Display) -> HeaderBlockError {
    HeaderBlockError::Corrupt(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_a_valid_zlib_header() {
        let [cmf, flg, ..] = ZLIB_HEADER;
        assert_eq!((u16::from(cmf) * 256 + u16::from(flg)) % 31, 0);
        assert_eq!(cmf & 0x0F, 8, "deflate");
        assert_ne!(flg & 0x20, 0, "FDICT");
        assert_eq!(flg >> 6, 3, "FLEVEL for level 9");
        assert_eq!(ZLIB_HEADER, [0x78, 0xF9, 0xE3, 0xC6, 0xA7, 0xC2]);
    }

    #[test]
    fn allocates_lazily() {
        let mut encoder = HeaderEncoder::new();
        assert!(!encoder.allocated());
        let mut out = BytesMut::new();
        encoder.encode(&HeaderBlock::new(), &mut out).unwrap();
        assert!(encoder.allocated());
        assert!(out.starts_with(&ZLIB_HEADER));
        assert!(out.ends_with(&[0x00, 0x00, 0xFF, 0xFF]));
    }

    #[test]
    fn refused_block_leaves_context_and_output_alone() {
        let mut encoder = HeaderEncoder::new();
        let mut bad = HeaderBlock::new();
        bad.push("", "x");
        let mut out = BytesMut::from(&b"ab"[..]);
        assert_eq!(
            encoder.encode(&bad, &mut out),
            Err(HeaderBlockError::EmptyName)
        );
        assert_eq!(&out[..], b"ab");
        assert!(!encoder.allocated());
        encoder.encode(&HeaderBlock::new(), &mut out).unwrap();
        assert!(out[2..].starts_with(&ZLIB_HEADER));
    }

    #[test]
    fn incompressible_blocks_end_in_one_flush() {
        let mut block = HeaderBlock::new();
        let mut x = 0x1234_5678u32;
        let value: String = (0..100_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                char::from(b'!' + (x % 90) as u8)
            })
            .collect();
        block.push("big", value);
        let mut encoder = HeaderEncoder::new();
        for _ in 0..3 {
            let mut out = BytesMut::new();
            encoder.encode(&block, &mut out).unwrap();
            assert!(out.ends_with(&[0x00, 0x00, 0xFF, 0xFF]));
            let markers = out.windows(4).filter(|w| *w == [0, 0, 0xFF, 0xFF]).count();
            assert_eq!(markers, 1);
        }
    }

    #[test]
    fn is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<HeaderEncoder>();
    }
}
