//! A sequence of header blocks into one `HeaderDecoder` (one shared inflate context).
//!
//! Input: a mode byte, then blocks as `length (1 byte) | bytes`.
//! - mode bit 7 set: each block is a *raw* SPDY/3 layout that the target compresses itself
//!   (zlib + SPDY dictionary + sync flush), so the fuzzer explores the block parser and its
//!   validation instead of fighting zlib's checksums;
//! - otherwise the bytes go to the decoder as they are; with bit 6 set the first block is
//!   prefixed with the real zlib header and dictionary id, to get past the header check.
//! The low bits pick the frame type the blocks are judged for.
//!
//! Checks, besides "never panics": once a decoder is poisoned it stays failed, and every block
//! that decodes survives our encoder → a fresh decoder unchanged.

#![no_main]

use bytes::BytesMut;
use flate2::{Compress, Compression, FlushCompress};
use kube_ws_proxy::spdy::header_block::{
    BlockKind, HeaderBlockError, HeaderDecoder, HeaderEncoder, DICTIONARY,
};
use libfuzzer_sys::fuzz_target;

const ZLIB_HEADER: [u8; 6] = [0x78, 0xF9, 0xE3, 0xC6, 0xA7, 0xC2];

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let kind = [
        BlockKind::SynStream,
        BlockKind::SynReply,
        BlockKind::Headers,
    ][usize::from(mode % 3)];
    let mut decoder = HeaderDecoder::with_limit(4096);
    let mut deflate = (mode & 0x80 != 0).then(|| {
        let mut deflate = Compress::new(Compression::default(), true);
        deflate
            .set_dictionary(DICTIONARY)
            .expect("fresh zlib stream");
        deflate
    });
    let mut encoder = HeaderEncoder::new();
    let mut echo = HeaderDecoder::new();
    let mut first = true;
    let mut poisoned = false;

    while let Some((&len, tail)) = rest.split_first() {
        let len = usize::from(len).min(tail.len());
        let (chunk, tail) = tail.split_at(len);
        rest = tail;

        let mut block = Vec::with_capacity(chunk.len() + 64);
        match deflate.as_mut() {
            Some(deflate) => {
                deflate
                    .compress_vec(chunk, &mut block, FlushCompress::Sync)
                    .expect("deflate into a large enough buffer");
            }
            None => {
                if first && mode & 0x40 != 0 {
                    block.extend_from_slice(&ZLIB_HEADER);
                }
                block.extend_from_slice(chunk);
            }
        }
        first = false;

        match decoder.decode(&block, kind) {
            Ok(headers) => {
                assert!(!poisoned, "a poisoned decoder decoded a block");
                let mut wire = BytesMut::new();
                if encoder.encode(&headers, &mut wire).is_ok() {
                    let again = echo.decode(&wire, kind).expect("our own block decodes");
                    assert_eq!(again, headers);
                }
            }
            Err(HeaderBlockError::Poisoned) => assert!(poisoned, "poisoned without an error"),
            Err(
                HeaderBlockError::Truncated
                | HeaderBlockError::TrailingBytes(_)
                | HeaderBlockError::EmptyName
                | HeaderBlockError::UppercaseName(_)
                | HeaderBlockError::DuplicateName(_)
                | HeaderBlockError::ForbiddenName { .. }
                | HeaderBlockError::InvalidUtf8,
            ) => {}
            Err(_) => poisoned = true,
        }
    }
});
