//! A hand-rolled client end for tests: masked frames out, server frames in.

use tokio::io::{AsyncRead, AsyncReadExt};

use super::frame::{FrameHead, OpCode};
use super::mask::apply_mask;

const KEY: [u8; 4] = [0x11, 0x22, 0x33, 0x44];

/// A client frame: `b0` (FIN and opcode) and a masked payload.
pub(crate) fn masked(b0: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![b0];
    match payload.len() {
        n @ 0..=125 => out.push(0x80 | n as u8),
        n @ 126..=0xFFFF => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&KEY);
    let mut body = payload.to_vec();
    apply_mask(&mut body, KEY);
    out.extend_from_slice(&body);
    out
}

/// Reads `n` server frames off the client end: (opcode, payload).
pub(crate) async fn server_frames<R: AsyncRead + Unpin>(
    client: &mut R,
    n: usize,
) -> Vec<(OpCode, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut frames = Vec::new();
    while frames.len() < n {
        match FrameHead::parse(&buf).unwrap() {
            Some(h) if buf.len() >= h.head_len + h.len as usize => {
                assert!(
                    h.fin && h.mask.is_none(),
                    "server frames are final and unmasked"
                );
                let end = h.head_len + h.len as usize;
                frames.push((h.opcode, buf[h.head_len..end].to_vec()));
                buf.drain(..end);
            }
            _ => {
                let mut chunk = [0u8; 4096];
                let k = client.read(&mut chunk).await.unwrap();
                assert!(k > 0, "server side closed early");
                buf.extend_from_slice(&chunk[..k]);
            }
        }
    }
    assert!(buf.is_empty(), "no stray bytes");
    frames
}
