//! `Tally`: a counter bumped on a hot path (a lookup, a dispatch) and read on scrape.

use std::sync::atomic::{AtomicU64, Ordering};

/// A count that only grows, bumped where the work is done and read by a metrics scrape.
///
/// Every caller holds the thread state of an interpreter with a GIL, so no two adds run at
/// once: an add is a plain load and store (a relaxed atomic, no read-modify-write), cheaper on a
/// lookup than a locked add (`benches/RESULTS.md`, "Instrumentation cost (issue 15)"). Built
/// with the feature `free-threaded` (which the extension turns on, and must, for a
/// free-threaded interpreter; never the abi3 wheel), it adds with `fetch_add` instead, so no
/// count is lost there either. Reads are relaxed: a scrape sees each count at some recent value.
#[derive(Default)]
pub struct Tally(AtomicU64);

impl Tally {
    /// Adds `n`; returns the count it makes (what a caller sampling every Nth add tests).
    #[inline(always)]
    pub fn add(&self, n: u64) -> u64 {
        #[cfg(feature = "free-threaded")]
        return self.0.fetch_add(n, Ordering::Relaxed).wrapping_add(n);
        #[cfg(not(feature = "free-threaded"))]
        {
            let count = self.0.load(Ordering::Relaxed).wrapping_add(n);
            self.0.store(count, Ordering::Relaxed);
            count
        }
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A running sum of `f64` values (seconds), added like a [`Tally`].
#[derive(Default)]
pub struct FloatTally(AtomicU64);

impl FloatTally {
    pub fn add(&self, value: f64) {
        let add = |bits: u64| (f64::from_bits(bits) + value).to_bits();
        #[cfg(feature = "free-threaded")]
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| Some(add(bits)));
        #[cfg(not(feature = "free-threaded"))]
        self.0
            .store(add(self.0.load(Ordering::Relaxed)), Ordering::Relaxed);
    }

    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::{FloatTally, Tally};

    #[test]
    fn tallies_add_up() {
        let tally = Tally::default();
        assert_eq!(tally.add(1), 1);
        assert_eq!(tally.add(41), 42);
        assert_eq!(tally.get(), 42);
        let sum = FloatTally::default();
        assert_eq!(sum.get(), 0.0);
        sum.add(0.25);
        sum.add(0.5);
        assert_eq!(sum.get(), 0.75);
    }
}
