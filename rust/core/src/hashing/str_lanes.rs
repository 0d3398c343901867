//! Picodata hashes of many str keys at once, for `route_many` of a list of str.
//!
//! A str key is hashed as its raw UTF-8 (no MessagePack header) with MurmurHash3. One key at a
//! time, the hash's block loop runs as many times as the key has 4-byte blocks, and for keys of
//! random lengths the loop's exit is mispredicted about once per key; each key's blocks also
//! depend on one another, so little of one key overlaps the next. Here the keys of a batch (up to
//! 64) are hashed side by side in 32-bit lanes instead: every key runs the same `LANE_BLOCKS`
//! rounds, a round past its last block leaving the hash unchanged (a select, not a branch), and
//! a block past a key's end reading the key's last four bytes (in bounds; not used). Keys
//! shorter than 4 bytes or longer than the lanes hold take the scalar [`murmur3_x86_32`]. With
//! AVX-512 (16 keys per instruction) the blocks are gathered from the keys in place; with AVX2
//! (8), which LLVM does not gather for here, they are first copied into one row per block
//! position, and the rounds read whole rows. The copy is chosen at run time
//! (`is_x86_feature_detected!`), never at build time; a CPU with neither runs the in-place form
//! one key after another (the x86-64 baseline has no 32-bit lane multiply), which still saves
//! the mispredicted exits. Each form was chosen by its measured cost (`benches/RESULTS.md`,
//! "Issue 12: `route_many` of a list of str in lanes"). The result
//! equals [`murmur3_x86_32`] for every length (the tests below, and
//! `tests/topology/test_route_many_str_keys.py`).

use super::lanes::Lanes;
use super::murmur3::{fmix32, murmur3_x86_32, round, scramble};
use super::PICODATA_SEED;

/// Blocks every lane runs: a key of up to 43 bytes (a 36-character UUID string included).
const LANE_BLOCKS: usize = 10;
/// The longest key the lanes take.
const LANE_MAX_LEN: usize = 4 * LANE_BLOCKS + 3;
/// Keys per batch.
const BATCH: usize = 64;

/// Keys collected for hashing together; their hashes go to a callback, in order.
pub struct StrBatch<'a> {
    lanes: Lanes,
    count: usize,
    keys: [&'a [u8]; BATCH],
}

impl Default for StrBatch<'_> {
    fn default() -> Self {
        StrBatch {
            lanes: Lanes::detect(),
            count: 0,
            keys: [&[]; BATCH],
        }
    }
}

impl<'a> StrBatch<'a> {
    /// Adds `key`; when the batch is full, hashes it and passes each hash to `f`.
    #[inline(always)]
    pub fn push(&mut self, key: &'a [u8], f: &mut impl FnMut(u32)) {
        self.keys[self.count] = key;
        self.count += 1;
        if self.count == BATCH {
            self.flush(f);
        }
    }

    /// Hashes the keys pushed since the last flush and passes each hash to `f`, in order.
    #[inline(always)]
    pub fn flush(&mut self, f: &mut impl FnMut(u32)) {
        // Called before every key of another type: nothing to clear or detect then.
        if self.count != 0 {
            self.hash_pending(f);
        }
    }

    /// [`flush`](Self::flush) of a batch holding keys.
    fn hash_pending(&mut self, f: &mut impl FnMut(u32)) {
        let keys = &self.keys[..self.count];
        self.count = 0;
        let mut hashes = [0u32; BATCH];
        let hashes = &mut hashes[..keys.len()];
        match self.lanes {
            // SAFETY: `Lanes::detect` found the features each function is compiled for.
            #[cfg(target_arch = "x86_64")]
            Lanes::Avx512 => unsafe { hash_avx512(keys, hashes) },
            #[cfg(target_arch = "x86_64")]
            Lanes::Avx2 => unsafe { hash_avx2(keys, hashes) },
            Lanes::Scalar => hash_in_place(keys, hashes),
        }
        hashes.iter().for_each(|&hash| f(hash));
    }
}

/// The four bytes at `at` of `key` as a little-endian word (`at + 4 <= key.len()`).
#[inline(always)]
fn word_at(key: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([key[at], key[at + 1], key[at + 2], key[at + 3]])
}

/// MurmurHash3 (x86_32, Picodata's seed) of each of `keys` (at most [`BATCH`]) into `hashes`,
/// through rows of blocks (for AVX2).
#[inline(always)]
fn hash_lanes(keys: &[&[u8]], hashes: &mut [u32]) {
    let n = keys.len().min(hashes.len());
    // Row `i` holds each key's block `i`; the last row its last four bytes, whose top `len % 4`
    // are the tail. A key the lanes do not take reads as empty rows, and is hashed apart below.
    let mut rows = [[0u32; BATCH]; LANE_BLOCKS + 1];
    let mut lens = [0u32; BATCH];
    for (j, key) in keys[..n].iter().enumerate() {
        let len = key.len();
        if !(4..=LANE_MAX_LEN).contains(&len) {
            continue;
        }
        lens[j] = len as u32;
        for (i, row) in rows[..LANE_BLOCKS].iter_mut().enumerate() {
            row[j] = word_at(key, (4 * i).min(len - 4));
        }
        rows[LANE_BLOCKS][j] = word_at(key, len - 4);
    }
    for j in 0..n {
        let len = lens[j];
        let blocks = len as usize / 4;
        let mut h = PICODATA_SEED;
        for (i, row) in rows[..LANE_BLOCKS].iter().enumerate() {
            let next = round(h, row[j]);
            h = if i < blocks { next } else { h };
        }
        let tail = len % 4;
        let last = rows[LANE_BLOCKS][j];
        let k = if tail == 0 {
            0
        } else {
            last >> (8 * (4 - tail))
        };
        hashes[j] = fmix32(h ^ scramble(k) ^ len);
    }
    for (hash, key) in hashes.iter_mut().zip(keys) {
        if !(4..=LANE_MAX_LEN).contains(&key.len()) {
            *hash = murmur3_x86_32(key, PICODATA_SEED);
        }
    }
}

/// [`hash_in_place`] compiled for AVX-512, whose gathers read each key's blocks in place.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn hash_avx512(keys: &[&[u8]], hashes: &mut [u32]) {
    hash_in_place(keys, hashes);
}

/// [`hash_lanes`] reading each key's blocks in place: no rows. For AVX-512 (gathers) and for a
/// CPU without AVX2, where it runs one key after another, still without a branch per block.
#[inline(always)]
fn hash_in_place(keys: &[&[u8]], hashes: &mut [u32]) {
    // A key the lanes do not take is read as four zero bytes instead, and hashed apart below.
    static PLACEHOLDER: [u8; 4] = [0; 4];
    let n = keys.len().min(hashes.len());
    let mut ptrs = [PLACEHOLDER.as_ptr(); BATCH];
    let mut lens = [4u32; BATCH];
    for (j, key) in keys[..n].iter().enumerate() {
        if (4..=LANE_MAX_LEN).contains(&key.len()) {
            ptrs[j] = key.as_ptr();
            lens[j] = key.len() as u32;
        }
    }
    for ((hash, &ptr), &len) in hashes[..n].iter_mut().zip(&ptrs[..n]).zip(&lens[..n]) {
        let blocks = len / 4;
        let mut h = PICODATA_SEED;
        for i in 0..LANE_BLOCKS as u32 {
            // Past the key's blocks, read its last four bytes and keep `h`.
            let at = (4 * i).min(len - 4);
            // SAFETY: `4 <= len` and `at + 4 <= len`: within the key, or the placeholder.
            let block = unsafe { ptr.add(at as usize).cast::<u32>().read_unaligned() };
            let next = round(h, u32::from_le(block));
            h = if i < blocks { next } else { h };
        }
        let tail = len % 4;
        // SAFETY: as above.
        let last = unsafe { ptr.add(len as usize - 4).cast::<u32>().read_unaligned() };
        let last = u32::from_le(last);
        let k = if tail == 0 {
            0
        } else {
            last >> (8 * (4 - tail))
        };
        *hash = fmix32(h ^ scramble(k) ^ len);
    }
    for (hash, key) in hashes.iter_mut().zip(keys) {
        if !(4..=LANE_MAX_LEN).contains(&key.len()) {
            *hash = murmur3_x86_32(key, PICODATA_SEED);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn hash_avx2(keys: &[&[u8]], hashes: &mut [u32]) {
    hash_lanes(keys, hashes);
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
        for lanes in Lanes::available() {
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
            for lanes in Lanes::available() {
                assert_eq!(batch_hashes(lanes, &keys), want, "{lanes:?} {count}");
            }
        }
    }
}
