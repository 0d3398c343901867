//! `DispatchTimes`: a histogram of a pool's dispatch latencies, kept only once asked for
//! (`WorkerPool.time_dispatches`), for metrics read on scrape.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::tally::{FloatTally, Tally};

/// Upper bounds of the buckets, in seconds; a last bucket takes everything above. From a
/// dispatch to a worker on the same host (tens of microseconds) to a slow call (10 s).
pub const BOUNDS: [f64; 18] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Dispatch latencies by bucket (not cumulative), their sum, and whether to keep them.
#[derive(Default)]
pub struct DispatchTimes {
    on: AtomicBool,
    counts: [Tally; BOUNDS.len() + 1],
    sum: FloatTally,
}

impl DispatchTimes {
    /// From now on, dispatches are timed (never turned off: a collector may come back).
    pub fn turn_on(&self) {
        self.on.store(true, Ordering::Relaxed);
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// One dispatch took `seconds`: counted in the first bucket whose bound is at least that.
    pub fn observe(&self, seconds: f64) {
        let bucket = BOUNDS.partition_point(|&bound| bound < seconds);
        self.counts[bucket].add(1);
        self.sum.add(seconds);
    }

    /// The counts by bucket (the last one above every bound) and the sum, or None while off.
    pub fn read(&self) -> Option<(Vec<u64>, f64)> {
        self.is_on()
            .then(|| (self.counts.iter().map(Tally::get).collect(), self.sum.get()))
    }
}

#[cfg(test)]
mod tests {
    use super::{DispatchTimes, BOUNDS};

    #[test]
    fn each_latency_lands_in_the_first_bucket_that_bounds_it() {
        let times = DispatchTimes::default();
        assert!(times.read().is_none());
        times.turn_on();
        times.observe(0.0);
        times.observe(0.000_025);
        times.observe(0.000_026);
        times.observe(11.0);
        let (counts, sum) = times.read().unwrap();
        assert_eq!(counts.len(), BOUNDS.len() + 1);
        assert_eq!((counts[0], counts[1], counts[BOUNDS.len()]), (2, 1, 1));
        assert_eq!(counts.iter().sum::<u64>(), 4);
        assert!((sum - 11.000_051).abs() < 1e-12);
    }
}
