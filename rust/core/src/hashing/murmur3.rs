//! MurmurHash3, x86 32-bit variant (Austin Appleby's public-domain algorithm), as Picodata hashes
//! sharding keys with it.

const C1: u32 = 0xcc9e_2d51;
const C2: u32 = 0x1b87_3593;

/// One block's mixing step, shared with the lane-wise hashing of int keys (`int_lanes`).
#[inline(always)]
pub fn scramble(k: u32) -> u32 {
    k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2)
}

/// Folds one scrambled block into the running hash.
#[inline(always)]
pub fn round(h: u32, k: u32) -> u32 {
    (h ^ scramble(k))
        .rotate_left(13)
        .wrapping_mul(5)
        .wrapping_add(0xe654_6b64)
}

/// The final avalanche.
#[inline(always)]
pub fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// MurmurHash3_x86_32 of `data` with `seed`.
#[inline]
pub fn murmur3_x86_32(data: &[u8], seed: u32) -> u32 {
    let mut h = seed;
    for block in data.chunks_exact(4) {
        h = round(h, block_of(block));
    }
    finish(h, data)
}

#[inline(always)]
fn block_of(block: &[u8]) -> u32 {
    u32::from_le_bytes([block[0], block[1], block[2], block[3]])
}

/// The tail (the last `len % 4` bytes) and the final mix, once every whole block is in `h`.
#[inline(always)]
fn finish(mut h: u32, data: &[u8]) -> u32 {
    let tail_len = data.len() % 4;
    let k = match data.len().checked_sub(4) {
        // The last four bytes end with the tail: shifting the others out reads it without a
        // branch on its length, which for keys of random lengths is mispredicted most of the
        // time (`benches/RESULTS.md`, "Issue 12: route_many and pool operations"). An empty
        // tail shifts out everything, and scrambles to 0 (no change).
        Some(start) => {
            let last = block_of(&data[start..]);
            (u64::from(last) >> (8 * (4 - tail_len))) as u32
        }
        None => data
            .iter()
            .enumerate()
            .fold(0, |k, (i, &byte)| k | u32::from(byte) << (8 * i)),
    };
    h ^= scramble(k);
    // The reference implementation mixes in the length as a 32-bit int.
    fmix32(h ^ data.len() as u32)
}

/// [`murmur3_x86_32`] of the first `len` (at most 16) bytes of `word` in little-endian order,
/// computed without reading memory.
#[inline]
pub fn murmur3_x86_32_word(word: u128, len: usize, seed: u32) -> u32 {
    debug_assert!(len <= 16);
    let mut h = seed;
    let blocks = len / 4;
    for i in 0..blocks {
        h = round(h, (word >> (32 * i)) as u32);
    }
    let tail_bits = 8 * (len % 4);
    if tail_bits != 0 {
        let k = (word >> (32 * blocks)) as u32 & ((1u32 << tail_bits) - 1);
        h ^= scramble(k);
    }
    fmix32(h ^ len as u32)
}

#[cfg(test)]
mod tests {
    use super::{fmix32, murmur3_x86_32, murmur3_x86_32_word, round, scramble};

    /// The reference algorithm, one byte at a time, with branches.
    fn reference(data: &[u8], seed: u32) -> u32 {
        let mut h = seed;
        let whole = data.len() / 4 * 4;
        for block in data[..whole].chunks(4) {
            h = round(h, u32::from_le_bytes(block.try_into().unwrap()));
        }
        let mut k = 0u32;
        for (i, &byte) in data[whole..].iter().enumerate() {
            k |= u32::from(byte) << (8 * i);
        }
        if whole < data.len() {
            h ^= scramble(k);
        }
        fmix32(h ^ data.len() as u32)
    }

    #[test]
    fn every_length_equals_the_reference() {
        let bytes: Vec<u8> = (0..70u8)
            .map(|b| b.wrapping_mul(151).wrapping_add(7))
            .collect();
        for len in 0..=bytes.len() {
            let data = &bytes[..len];
            for seed in [0, 13, u32::MAX] {
                assert_eq!(murmur3_x86_32(data, seed), reference(data, seed), "{len}");
            }
        }
    }

    #[test]
    fn word_form_equals_byte_form() {
        let bytes: Vec<u8> = (1..=16u8).map(|b| b.wrapping_mul(37)).collect();
        let mut padded = [0u8; 16];
        for len in 0..=16 {
            padded[..len].copy_from_slice(&bytes[..len]);
            let word = u128::from_le_bytes(padded);
            assert_eq!(
                murmur3_x86_32_word(word, len, 13),
                murmur3_x86_32(&bytes[..len], 13),
                "{len}"
            );
        }
    }

    #[test]
    fn empty_input() {
        assert_eq!(murmur3_x86_32(b"", 0), 0);
        assert_eq!(murmur3_x86_32(b"", 1), 0x514e_28b7);
        assert_eq!(murmur3_x86_32(b"", 0xffff_ffff), 0x81f1_6f39);
    }

    #[test]
    fn known_answers() {
        // Values computed with the Python `mmh3` package: mmh3.hash(data, seed, signed=False).
        assert_eq!(murmur3_x86_32(b"hello", 0), 613_153_351);
        assert_eq!(murmur3_x86_32(b"hello, world", 13), 4_273_037_157);
        assert_eq!(murmur3_x86_32(b"abc", 13), 3_408_160_902);
        assert_eq!(
            murmur3_x86_32(b"The quick brown fox jumps over the lazy dog", 0x9747_b28c),
            799_549_133
        );
    }

    #[test]
    fn every_tail_length() {
        // Tails of 0..3 bytes (seed 0x9747b28c); also checked with `mmh3`.
        assert_eq!(murmur3_x86_32(b"a", 0x9747_b28c), 0x7fa0_9ea6);
        assert_eq!(murmur3_x86_32(b"aa", 0x9747_b28c), 0x5d21_1726);
        assert_eq!(murmur3_x86_32(b"aaa", 0x9747_b28c), 0x283e_0130);
        assert_eq!(murmur3_x86_32(b"aaaa", 0x9747_b28c), 0x5a97_808a);
        assert_eq!(murmur3_x86_32(b"Hello, world!", 0x9747_b28c), 0x2488_4cba);
    }
}
