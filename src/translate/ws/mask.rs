//! Client-to-server masking (RFC 6455 §5.3): every payload byte XORed with the 4-byte key,
//! in place. Every stdin byte passes through here, so it works on 32-byte blocks, which the
//! compiler turns into vector instructions — 256-bit ones where the CPU has AVX2.

const BLOCK: usize = 32;

/// Unmasks (or masks: the operation is its own inverse) `buf`, whose first byte is at key
/// position 0.
pub fn apply_mask(buf: &mut [u8], key: [u8; 4]) {
    #[cfg(target_arch = "x86_64")]
    if buf.len() >= 2 * BLOCK && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { apply_mask_avx2(buf, key) };
    }
    apply_mask_blocks(buf, key);
}

/// The same loop, compiled for AVX2 (the default x86-64 target stops at SSE2).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn apply_mask_avx2(buf: &mut [u8], key: [u8; 4]) {
    apply_mask_blocks(buf, key);
}

#[inline(always)]
fn apply_mask_blocks(buf: &mut [u8], key: [u8; 4]) {
    let mut pattern = [0u8; BLOCK];
    for (i, p) in pattern.iter_mut().enumerate() {
        *p = key[i % 4];
    }
    let mut blocks = buf.chunks_exact_mut(BLOCK);
    for block in &mut blocks {
        for (b, p) in block.iter_mut().zip(pattern.iter()) {
            *b ^= p;
        }
    }
    // A block is a multiple of 4 bytes, so the tail starts at key position 0 again.
    for (i, b) in blocks.into_remainder().iter_mut().enumerate() {
        *b ^= key[i % 4];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(buf: &mut [u8], key: [u8; 4]) {
        for (i, b) in buf.iter_mut().enumerate() {
            *b ^= key[i % 4];
        }
    }

    #[test]
    fn rfc6455_hello() {
        let mut masked = [0x7f, 0x9f, 0x4d, 0x51, 0x58];
        apply_mask(&mut masked, [0x37, 0xfa, 0x21, 0x3d]);
        assert_eq!(&masked, b"Hello");
    }

    #[test]
    fn matches_the_definition_at_every_length_and_alignment() {
        let key = [0x6d, 0xb6, 0xb2, 0x80];
        let data: Vec<u8> = (0..200u32).map(|i| (i * 7 + 3) as u8).collect();
        for start in 0..4 {
            for len in 0..data.len() - start {
                let mut fast = data[start..start + len].to_vec();
                let mut portable = fast.clone();
                let mut slow = fast.clone();
                apply_mask(&mut fast, key);
                apply_mask_blocks(&mut portable, key);
                naive(&mut slow, key);
                assert_eq!(fast, slow, "start {start} len {len}");
                assert_eq!(portable, slow, "start {start} len {len}");
            }
        }
    }
}
