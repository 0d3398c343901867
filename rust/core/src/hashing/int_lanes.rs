//! Picodata bucket ids of many int keys at once, for `route_many` of an integer array.
//!
//! The scalar path (`KeyInt::msgpack`, then `murmur3_x86_32_word`) branches on the encoding's
//! width twice per key; with keys of mixed widths those branches are mispredicted often, and
//! they keep the compiler from running several keys per instruction. Here the same encoding and
//! hash are computed with selects instead of branches, in 32-bit lanes, so one loop serves every
//! width, and that loop is compiled for AVX-512 (16 keys per instruction) and for AVX2 (8), the
//! copy chosen at run time (`is_x86_feature_detected!`), never at build time, so one wheel runs
//! on every x86-64 machine; one without AVX2 takes the scalar path (each copy's cost:
//! `benches/RESULTS.md`, "Issue 12: route_many and pool operations"). The result
//! equals the scalar path's for every 64-bit value (the tests below, and
//! `tests/test_route_many.py`).

use super::divisor::BucketDivisor;
use super::key_encoding::KeyInt;
use super::lanes::Lanes;
use super::murmur3::{fmix32, murmur3_x86_32_word, round, scramble};
use super::PICODATA_SEED;

/// MurmurHash3 (x86_32, Picodata's seed) of the most compact MessagePack encoding of the integer
/// whose two's-complement bits are `bits`, negative when `negative` (else `bits` is the value
/// itself, up to 2**64 - 1). Equal to `murmur3_x86_32_word` of `KeyInt::msgpack`.
///
/// Written in 32-bit halves only, with selects for every choice: 64-bit lanes would halve the
/// keys per instruction, and a branch would stop the compiler from using lanes at all.
#[inline(always)]
pub fn picodata_hash(bits: u64, negative: bool) -> u32 {
    let (low, high) = (bits as u32, (bits >> 32) as u32);
    // The encoding's payload is 0, 1, 2, 4 or 8 bytes. A negative value needs as many bytes as
    // its complement (-v - 1) does, with the fixint and each signed width holding half the range.
    let flip = if negative { u32::MAX } else { 0 };
    let (m_low, big) = (low ^ flip, (high ^ flip) != 0);
    let [t0, t1, t2] = if negative {
        [0x20, 0x80, 0x8000]
    } else {
        [0x80, 0x100, 0x1_0000]
    };
    let ge0 = big | (m_low >= t0);
    let ge1 = big | (m_low >= t1);
    let ge2 = big | (m_low >= t2);
    // Beyond 4 bytes: a non-negative value from 2**32, a negative one below -2**31.
    let ge3 = big | (negative & (m_low >= 0x8000_0000));
    let size = u32::from(ge0) + u32::from(ge1) + 2 * u32::from(ge2) + 4 * u32::from(ge3);
    // A fixint is its own byte; otherwise the format byte counts the width from uint8 (0xcc)
    // or int8 (0xd0).
    let base: u32 = if negative { 0xd0 } else { 0xcc };
    let head = if ge0 {
        base + u32::from(ge1) + u32::from(ge2) + u32::from(ge3)
    } else {
        low & 0xff
    };
    // The payload is the value's low `size` bytes, big-endian, as two words: the first four
    // bytes and the last four (only for size 8). Sizes 1 and 2 are the top of the swapped low
    // word shifted down.
    let swapped = low.swap_bytes();
    let shift = if ge1 { 16 } else { 24 };
    let small = if ge0 { swapped >> shift } else { 0 };
    let first = if ge3 {
        high.swap_bytes()
    } else if ge2 {
        swapped
    } else {
        small
    };
    let second = if ge3 { swapped } else { 0 };
    // The encoding as little-endian words: bytes 0-3, bytes 4-7, and byte 8.
    let block0 = head | first << 8;
    let block1 = first >> 24 | second << 8;
    let byte8 = second >> 24;
    // Encodings of 1-3 bytes are all tail, 5 bytes one block and a tail byte, 9 bytes two
    // blocks and a tail byte; a tail of zero bits scrambles to zero, so needs no special case.
    let after0 = round(PICODATA_SEED, block0);
    let after1 = round(after0, block1);
    let (h, tail) = if ge3 {
        (after1, byte8)
    } else if ge2 {
        (after0, block1)
    } else {
        (PICODATA_SEED, block0)
    };
    fmix32(h ^ scramble(tail) ^ (1 + size))
}

/// [`picodata_hash`] of a [`KeyInt`].
#[inline(always)]
pub fn picodata_hash_of(key: KeyInt) -> u32 {
    match key {
        KeyInt::Negative(v) => picodata_hash(v as u64, true),
        KeyInt::NonNegative(v) => picodata_hash(v, false),
    }
}

/// Appends the bucket id of each key to `out`: `keys` holds two's-complement bits, of signed
/// values when `signed` (so a set top bit means negative), else of unsigned ones.
pub fn append_buckets(keys: &[u64], signed: bool, divisor: BucketDivisor, out: &mut Vec<u32>) {
    let lanes = Lanes::detect();
    append_buckets_with(lanes, keys, signed, divisor, out);
}

fn append_buckets_with(
    lanes: Lanes,
    keys: &[u64],
    signed: bool,
    divisor: BucketDivisor,
    out: &mut Vec<u32>,
) {
    let start = out.len();
    out.resize(start + keys.len(), 0);
    let buckets = &mut out[start..];
    match lanes {
        // SAFETY: `Lanes::detect` found the features each function is compiled for.
        #[cfg(target_arch = "x86_64")]
        Lanes::Avx512 => unsafe { buckets_avx512(keys, signed, divisor, buckets) },
        #[cfg(target_arch = "x86_64")]
        Lanes::Avx2 => unsafe { buckets_avx2(keys, signed, divisor, buckets) },
        // the x86-64 baseline has no 32-bit lane multiply, and the lane-wise loop compiled for it
        // measured slower than the scalar path (`benches/RESULTS.md`, as above)
        _ => buckets_scalar(keys, signed, divisor, buckets),
    }
}

/// The lane-wise loop, inlined into each copy compiled for a set of CPU features.
#[inline(always)]
fn buckets_lanes(keys: &[u64], signed: bool, divisor: BucketDivisor, buckets: &mut [u32]) {
    // Two loops with the sign rule fixed, so neither tests `signed` per key.
    if signed {
        for (bucket, &bits) in buckets.iter_mut().zip(keys) {
            *bucket = divisor.bucket(picodata_hash(bits, (bits as i64) < 0));
        }
    } else {
        for (bucket, &bits) in buckets.iter_mut().zip(keys) {
            *bucket = divisor.bucket(picodata_hash(bits, false));
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn buckets_avx512(keys: &[u64], signed: bool, divisor: BucketDivisor, buckets: &mut [u32]) {
    buckets_lanes(keys, signed, divisor, buckets);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn buckets_avx2(keys: &[u64], signed: bool, divisor: BucketDivisor, buckets: &mut [u32]) {
    buckets_lanes(keys, signed, divisor, buckets);
}

/// The scalar path: the encoding with branches, which a CPU without lanes predicts well enough.
fn buckets_scalar(keys: &[u64], signed: bool, divisor: BucketDivisor, buckets: &mut [u32]) {
    for (bucket, &bits) in buckets.iter_mut().zip(keys) {
        let key = if signed {
            KeyInt::from_i64(bits as i64)
        } else {
            KeyInt::NonNegative(bits)
        };
        let (word, len) = key.msgpack().as_word();
        *bucket = divisor.bucket(murmur3_x86_32_word(word, len, PICODATA_SEED));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::murmur3::murmur3_x86_32_word;

    fn scalar(key: KeyInt) -> u32 {
        let (word, len) = key.msgpack().as_word();
        murmur3_x86_32_word(word, len, PICODATA_SEED)
    }

    fn edge_values() -> Vec<KeyInt> {
        let mut keys = Vec::new();
        for bit in 0..64u32 {
            let power = 1u64 << bit;
            for v in [power - 1, power, power + 1] {
                keys.push(KeyInt::NonNegative(v));
                keys.push(KeyInt::NonNegative(v | 1 << 63));
                keys.push(KeyInt::from_i64((v as i64).wrapping_neg()));
                keys.push(KeyInt::from_i64(!(v as i64)));
            }
        }
        for v in -300i64..300 {
            keys.push(KeyInt::from_i64(v));
        }
        keys.extend([
            KeyInt::NonNegative(u64::MAX),
            KeyInt::Negative(i64::MIN),
            KeyInt::Negative(i64::MIN + 1),
            KeyInt::from_i64(i64::MAX),
        ]);
        keys
    }

    #[test]
    fn equals_the_scalar_hash_at_every_width_boundary() {
        for key in edge_values() {
            assert_eq!(picodata_hash_of(key), scalar(key), "{key:?}");
        }
    }

    #[test]
    fn equals_the_scalar_hash_on_random_values() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Random widths: shift a random value right by a random amount.
            let v = state >> (state % 64);
            for key in [KeyInt::NonNegative(v), KeyInt::from_i64(v as i64)] {
                assert_eq!(picodata_hash_of(key), scalar(key), "{key:?}");
            }
        }
    }

    #[test]
    fn every_lane_width_this_cpu_has_equals_the_scalar_path() {
        let keys = edge_values();
        let divisor = BucketDivisor::new(3_000);
        let signed: Vec<u64> = keys
            .iter()
            .filter_map(|&key| match key {
                KeyInt::Negative(v) => Some(v as u64),
                KeyInt::NonNegative(v) => i64::try_from(v).ok().map(|v| v as u64),
            })
            .collect();
        let unsigned: Vec<u64> = keys
            .iter()
            .filter_map(|&key| match key {
                KeyInt::NonNegative(v) => Some(v),
                KeyInt::Negative(_) => None,
            })
            .collect();
        let want = |keys: &[u64], signed: bool| -> Vec<u32> {
            keys.iter()
                .map(|&bits| {
                    let key = if signed {
                        KeyInt::from_i64(bits as i64)
                    } else {
                        KeyInt::NonNegative(bits)
                    };
                    scalar(key) % 3_000 + 1
                })
                .collect()
        };
        for lanes in Lanes::available() {
            for (keys, signed) in [(&signed, true), (&unsigned, false)] {
                // An odd offset, so the loops' remainders run too.
                let mut out = vec![7];
                append_buckets_with(lanes, keys, signed, divisor, &mut out);
                assert_eq!(out[0], 7);
                assert_eq!(out[1..], want(keys, signed), "{lanes:?}, signed {signed}");
            }
        }
    }
}
