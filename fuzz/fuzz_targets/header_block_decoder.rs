//! A sequence of header blocks into `HeaderDecoder`s (one shared inflate context each), read
//! both ways: as our own sessions read them (`decode`, refusing what spdystream refuses) and
//! as an observer does (`read`, spdystream's reading whether or not it refuses), then the
//! Kubernetes headers read from them as the kubelet reads them (`StreamHeaders`).
//!
//! Input: a mode byte, then blocks as `length (1 byte) | bytes`.
//! - mode bit 7 set: each block is a *raw* SPDY/3 layout that the target compresses itself
//!   (zlib + SPDY dictionary + sync flush), so the fuzzer explores the block reading and its
//!   refusals instead of fighting zlib's checksums;
//! - otherwise the bytes go to the decoders as they are; with bit 6 set the first block is
//!   prefixed with the real zlib header and dictionary id, to get past the header check.
//! The low bits pick the frame type the blocks are judged for.
//!
//! Checks, besides "never panics": once a decoder is poisoned it stays failed; the two ways
//! agree (a session's block is the observer's reading without a refusal, a session's refusal
//! is the observer's reading's refusal, other errors are the same); `get` is the first
//! NUL-separated part of the value and the port is the kubelet's decimal rule; and every
//! reading survives our encoder → a fresh decoder unchanged.

#![no_main]

use bytes::BytesMut;
use flate2::{Compress, Compression, FlushCompress};
use kube_ws_proxy::spdy::header_block::{
    BlockKind, HeaderBlock, HeaderBlockError, HeaderDecoder, HeaderEncoder, Reading, DICTIONARY,
};
use kube_ws_proxy::spdy::kube_headers::StreamHeaders;
use libfuzzer_sys::fuzz_target;

const ZLIB_HEADER: [u8; 6] = [0x78, 0xF9, 0xE3, 0xC6, 0xA7, 0xC2];

/// The kubelet's port rule, written the plain way: digits only, 1 to 65535.
fn reference_port(value: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(value).ok()?;
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let trimmed = text.trim_start_matches('0');
    if trimmed.len() > 5 {
        return None;
    }
    trimmed.parse::<u32>().ok().and_then(|p| u16::try_from(p).ok()).filter(|&p| p > 0)
}

/// What holds of every reading.
fn check_reading(headers: &HeaderBlock, kind: BlockKind) {
    for (name, value) in headers.iter() {
        let parts: Vec<&[u8]> = value.split(|&b| b == 0).collect();
        assert_eq!(headers.get(name), parts.first().copied(), "{name:?}");
        assert_eq!(headers.get_all(name).collect::<Vec<_>>(), parts);
    }
    let kube = StreamHeaders::read(headers);
    assert_eq!(
        kube.port(),
        reference_port(headers.get("port").unwrap_or_default())
    );
    // Our encoder → a fresh decoder: the same reading (our encoder refuses empty names).
    let mut wire = BytesMut::new();
    if HeaderEncoder::new().encode(headers, &mut wire).is_ok() {
        let again = HeaderDecoder::new().read(&wire, kind).expect("our own block reads");
        assert_eq!(&again.headers, headers);
    }
}

/// A refusal spdystream makes of a block it has read.
fn is_refusal(e: &HeaderBlockError) -> bool {
    matches!(
        e,
        HeaderBlockError::UppercaseName(_)
            | HeaderBlockError::DuplicateName(_)
            | HeaderBlockError::ForbiddenName { .. }
    )
}

fn agree(
    session: &Result<HeaderBlock, HeaderBlockError>,
    observer: &Result<Reading, HeaderBlockError>,
) {
    match (session, observer) {
        (Ok(block), Ok(reading)) => {
            assert_eq!(reading.refusal, None);
            assert_eq!(&reading.headers, block);
        }
        (Err(refusal), Ok(reading)) => {
            assert!(is_refusal(refusal), "{refusal:?}");
            assert_eq!(reading.refusal.as_ref(), Some(refusal));
        }
        (Err(a), Err(b)) => assert_eq!(a, b),
        (Ok(_), Err(e)) => panic!("a session read what an observer could not: {e:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let kind = [
        BlockKind::SynStream,
        BlockKind::SynReply,
        BlockKind::Headers,
    ][usize::from(mode % 3)];
    let mut session = HeaderDecoder::with_limit(4096);
    let mut observer = HeaderDecoder::with_limit(4096);
    let mut deflate = (mode & 0x80 != 0).then(|| {
        let mut deflate = Compress::new(Compression::default(), true);
        deflate
            .set_dictionary(DICTIONARY)
            .expect("fresh zlib stream");
        deflate
    });
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

        let decoded = session.decode(&block, kind);
        let read = observer.read(&block, kind);
        agree(&decoded, &read);
        match read {
            Ok(reading) => {
                assert!(!poisoned, "a poisoned decoder decoded a block");
                check_reading(&reading.headers, kind);
            }
            Err(HeaderBlockError::Poisoned) => assert!(poisoned, "poisoned without an error"),
            Err(HeaderBlockError::Truncated | HeaderBlockError::TrailingBytes(_)) => {}
            Err(_) => poisoned = true,
        }
    }
});
