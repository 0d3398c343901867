//! Least-loaded's random draws made in the pool: a small generator every caller shares.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// wyrand's increment and mixing constant.
const INCREMENT: u64 = 0xa076_1d64_78bd_642f;
const MIX: u64 = 0xe703_7ed1_a0b4_28db;

/// A wyrand generator: a Weyl sequence (one atomic add a draw) through a 128-bit multiply.
///
/// Implementation notes:
///     Chosen for the native least-loaded path, where a draw replaced two Python
///     `randrange` calls: one relaxed `fetch_add` and a multiply, lock-free, so concurrent
///     callers (free-threaded) each take a value of their own and never a torn state. Its
///     quality is ample for choosing among workers (wyrand passes BigCrush and PractRand);
///     it is not a source of secrets.
pub struct Draws {
    state: AtomicU64,
}

impl Draws {
    /// A generator starting at `seed`.
    pub fn seeded(seed: u64) -> Self {
        Self {
            state: AtomicU64::new(seed),
        }
    }

    /// A generator seeded from the process's random hashing keys (the operating system's
    /// randomness, read once a process, stepped for each `RandomState`).
    pub fn unpredictable() -> Self {
        Self::seeded(RandomState::new().build_hasher().finish())
    }

    /// The next value, moving the generator.
    #[inline]
    pub fn next(&self) -> u64 {
        let state = self.state.fetch_add(INCREMENT, Ordering::Relaxed);
        mix(state.wrapping_add(INCREMENT))
    }

    /// The value `next` would return now, without moving the generator.
    #[inline]
    pub fn peek(&self) -> u64 {
        mix(self.state.load(Ordering::Relaxed).wrapping_add(INCREMENT))
    }
}

#[inline]
fn mix(state: u64) -> u64 {
    let product = u128::from(state) * u128::from(state ^ MIX);
    ((product >> 64) as u64) ^ (product as u64)
}

/// Two distinct positions of `count` (at least 1; `(0, 0)` for 1) from one drawn `value`:
/// the first from its high 32 bits, the second from its low 32 bits among the other
/// `count - 1` positions, each scaled by a multiply and a shift (Lemire's method, without the
/// rejection step: a position's share is off by less than `count / 2^32`).
#[inline]
pub fn two_positions(value: u64, count: usize) -> (usize, usize) {
    if count <= 1 {
        return (0, 0);
    }
    let scaled = |bits: u64, range: usize| ((u128::from(bits) * range as u128) >> 32) as usize;
    let first = scaled(value >> 32, count);
    let second = scaled(value & 0xffff_ffff, count - 1);
    (first, second + usize::from(second >= first))
}

#[cfg(test)]
mod tests {
    use super::{two_positions, Draws};

    #[test]
    fn peek_tells_the_next_value_and_next_moves_on() {
        let draws = Draws::seeded(7);
        let peeked = draws.peek();
        assert_eq!(draws.peek(), peeked);
        assert_eq!(draws.next(), peeked);
        assert_ne!(draws.next(), peeked);
        let again = Draws::seeded(7);
        assert_eq!(again.next(), peeked); // a seed replays
    }

    #[test]
    fn the_two_positions_are_distinct_and_within_the_count() {
        let draws = Draws::seeded(1);
        for count in 2..40 {
            for _ in 0..500 {
                let (first, second) = two_positions(draws.next(), count);
                assert!(first < count && second < count && first != second);
            }
        }
        assert_eq!(two_positions(u64::MAX, 1), (0, 0));
        assert_eq!(two_positions(u64::MAX, 2), (1, 0));
        assert_eq!(two_positions(0, 5), (0, 1));
    }

    #[test]
    fn every_ordered_pair_is_drawn_about_equally_often() {
        let draws = Draws::seeded(3);
        let count = 4;
        let mut seen = [[0u32; 4]; 4];
        let draws_made = 120_000;
        for _ in 0..draws_made {
            let (first, second) = two_positions(draws.next(), count);
            seen[first][second] += 1;
        }
        let expected = f64::from(draws_made) / 12.0;
        for (first, row) in seen.iter().enumerate() {
            for (second, &times) in row.iter().enumerate() {
                if first == second {
                    assert_eq!(times, 0);
                } else {
                    // 12 pairs at 10,000 each: 5% is more than ten standard deviations
                    assert!((f64::from(times) - expected).abs() < expected * 0.05);
                }
            }
        }
    }
}
