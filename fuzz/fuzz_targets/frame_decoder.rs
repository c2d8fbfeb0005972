//! Arbitrary bytes into `FrameDecoder`, delivered in two pieces.
//!
//! Checks, besides "never panics": `Ok(None)` consumes nothing, and every decoded frame that
//! our encoder agrees to send decodes back to itself (on a second, independent pair of zlib
//! contexts, as a peer would have).

#![no_main]

use bytes::BytesMut;
use kube_ws_proxy::spdy::codec::{FrameDecoder, FrameEncoder};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, data)) = data.split_first() else {
        return;
    };
    // Small limits so the fuzzer reaches the limit checks with small inputs.
    let mut decoder = FrameDecoder::with_limits(16 * 1024, 8 * 1024);
    let mut encoder = FrameEncoder::new();
    let mut echo = FrameDecoder::new();
    let mut echo_wire = BytesMut::new();

    let split = usize::from(split) * data.len() / 255;
    let mut buf = BytesMut::from(&data[..split]);
    for rest in [&data[split..], &[][..]] {
        loop {
            let before = buf.clone();
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    if encoder.encode(&frame, &mut echo_wire).is_ok() {
                        let again = echo.decode(&mut echo_wire).expect("our own frame decodes");
                        assert_eq!(again.as_ref(), Some(&frame));
                        assert!(echo_wire.is_empty());
                    }
                }
                Ok(None) => {
                    assert_eq!(buf, before, "Ok(None) must not consume");
                    break;
                }
                Err(_) => return,
            }
        }
        buf.extend_from_slice(rest);
    }
});
