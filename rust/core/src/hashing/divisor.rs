//! `hash % bucket_count + 1` for one bucket count and many hashes, without a division per hash.
//!
//! A hardware 32-bit division costs tens of cycles and cannot run several keys per instruction;
//! routing 100,000 keys divides by the same count every time. So the count's reciprocal is
//! computed once (Granlund and Montgomery, "Division by invariant integers using
//! multiplication", 1994, figure 4.1) and each remainder costs a multiply, two shifts and a
//! subtraction, all in 32-bit lanes the compiler can vectorise. The result is exactly `%`'s for
//! every `u32` hash and count (proved in the paper; checked in the tests below). A
//! "multiply-shift" range reduction (`hash * count >> 32`) would be cheaper still, but it maps
//! hashes to different buckets than Picodata's `%` does, so it is not an option.

/// A bucket count (1 to 2**32 - 1) ready to reduce hashes to bucket ids.
#[derive(Clone, Copy, Debug)]
pub struct BucketDivisor {
    count: u32,
    /// `floor(2**32 * (2**l - count) / count) + 1`, with `l = ceil(log2(count))`.
    magic: u32,
    /// `min(l, 1)` and `max(l - 1, 0)`.
    shift1: u32,
    shift2: u32,
}

impl BucketDivisor {
    /// The divisor for `count`, which must be at least 1.
    pub fn new(count: u32) -> Self {
        assert!(count >= 1, "a bucket count is at least 1");
        let l = u32::BITS - (count - 1).leading_zeros();
        // 2**l - count < count, so the quotient is below 2**32 and the magic fits in 32 bits.
        let magic = (((1u64 << l) - u64::from(count)) << 32) / u64::from(count) + 1;
        Self {
            count,
            magic: magic as u32,
            shift1: l.min(1),
            shift2: l.saturating_sub(1),
        }
    }

    /// `hash % count + 1`: the Picodata and vshard bucket id of a hash.
    #[inline(always)]
    pub fn bucket(self, hash: u32) -> u32 {
        let t = ((u64::from(hash) * u64::from(self.magic)) >> 32) as u32;
        // t <= hash, so neither step overflows.
        let quotient = (t + ((hash - t) >> self.shift1)) >> self.shift2;
        hash - quotient * self.count + 1
    }
}

#[cfg(test)]
mod tests {
    use super::BucketDivisor;

    /// A fixed-seed xorshift: enough spread to reach every bit pattern class.
    fn xorshift(state: &mut u64) -> u32 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        (*state >> 16) as u32
    }

    fn check(count: u32, hashes: impl IntoIterator<Item = u32>) {
        let divisor = BucketDivisor::new(count);
        for hash in hashes {
            assert_eq!(divisor.bucket(hash), hash % count + 1, "{hash} % {count}");
        }
    }

    #[test]
    fn equals_the_remainder_at_the_edges() {
        let edges = [
            0,
            1,
            2,
            3,
            2_999,
            3_000,
            3_001,
            1 << 31,
            u32::MAX - 1,
            u32::MAX,
        ];
        let mut counts: Vec<u32> = vec![1, 2, 3, 7, 16, 3_000, 30_000, 65_536, u32::MAX];
        for bit in 0..32 {
            let power = 1u32 << bit;
            counts.extend([power, power.wrapping_sub(1).max(1), power.saturating_add(1)]);
        }
        for count in counts {
            // Multiples of the count and their neighbours are where a wrong quotient shows.
            let near_multiples = (1..=4u64).flat_map(|k| {
                let m = k * u64::from(count);
                [m.saturating_sub(1), m, m + 1]
            });
            let near_multiples = near_multiples.filter_map(|m| u32::try_from(m).ok());
            check(count, edges.into_iter().chain(near_multiples));
            let top = u32::MAX - u32::MAX % count;
            check(count, [top.saturating_sub(1), top, top.saturating_add(1)]);
        }
    }

    #[test]
    fn equals_the_remainder_on_random_counts_and_hashes() {
        let mut state = 0x2545_f491_4f6c_dd1d;
        for _ in 0..2_000 {
            let count = xorshift(&mut state) >> (xorshift(&mut state) % 32);
            let count = count.max(1);
            let hashes: Vec<u32> = (0..500).map(|_| xorshift(&mut state)).collect();
            check(count, hashes);
        }
    }
}
