//! `DispatchTimes`: a histogram of a pool's dispatch latencies, kept only once asked for
//! (`WorkerPool.time_dispatches`), for metrics read on scrape, and which of the pool's native
//! dispatches it samples.

use std::sync::atomic::{AtomicBool, Ordering};

use shardline_core::tally::{FloatTally, Tally};

/// Upper bounds of the buckets, in seconds; a last bucket takes everything above. From a
/// dispatch to a worker on the same host (tens of microseconds) to a slow call (10 s).
pub const BOUNDS: [f64; 18] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Of the dispatches `dispatch_next` hands out without counting them in flight, the histogram
/// times one in this many: the pool's `SAMPLE_EVERY`th, `2 * SAMPLE_EVERY`th… (by its dispatch
/// tally). Timing every one cost the round-robin path well over issue 15's 10% (two clock
/// readings and one more call into the pool per dispatch); one in 8 keeps it within them
/// (`benches/RESULTS.md`, "Instrumentation cost (issue 15)").
pub const SAMPLE_EVERY: u64 = 8;

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

    /// Whether the `nth` dispatch of the native path is timed: one in [`SAMPLE_EVERY`], and
    /// none while off.
    #[inline(always)]
    pub fn samples(&self, nth: u64) -> bool {
        nth % SAMPLE_EVERY == 0 && self.is_on()
    }

    /// What a dispatch started at `now` (a reading of the pool's clock, never 0) hands its
    /// caller as `started`, for `finish_dispatch`: while the histogram is on, `now` made odd
    /// when the histogram is to take the dispatch (`observed`) and even when it is not (never
    /// 0); `now` itself while off.
    ///
    /// Implementation notes:
    ///     With health on, the native round-robin path times some dispatches for health alone:
    ///     every one to a slow, new or unhealthy worker, one in `TIMED_EVERY` to a fast one.
    ///     Counting those would weigh the histogram toward slow workers, so only its own one
    ///     in [`SAMPLE_EVERY`] may go in, and `finish_dispatch` must tell them apart with no
    ///     second argument on the hot path: the lowest bit of the reading (a nanosecond)
    ///     carries it.
    #[inline]
    pub fn stamp(&self, now: u64, observed: bool) -> u64 {
        match (self.is_on(), observed) {
            (false, _) => now,
            (true, true) => now | 1,
            (true, false) => (now & !1).max(2),
        }
    }

    /// Whether the dispatch that `stamp` made `started` goes into the histogram.
    #[inline]
    pub fn observes(&self, started: u64) -> bool {
        started & 1 == 1 && self.is_on()
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
    use super::{DispatchTimes, BOUNDS, SAMPLE_EVERY};

    #[test]
    fn only_every_nth_dispatch_is_sampled_and_none_while_off() {
        let times = DispatchTimes::default();
        assert!(!(1..=2 * SAMPLE_EVERY).any(|nth| times.samples(nth)));
        times.turn_on();
        let sampled: Vec<u64> = (1..=3 * SAMPLE_EVERY)
            .filter(|&nth| times.samples(nth))
            .collect();
        assert_eq!(sampled, [SAMPLE_EVERY, 2 * SAMPLE_EVERY, 3 * SAMPLE_EVERY]);
    }

    #[test]
    fn a_stamp_says_whether_the_histogram_takes_the_dispatch_only_while_on() {
        let times = DispatchTimes::default();
        assert_eq!(times.stamp(10, false), 10);
        assert!(!times.observes(11));
        times.turn_on();
        for now in [1, 2, 10, 11, u64::MAX - 1] {
            let (taken, left) = (times.stamp(now, true), times.stamp(now, false));
            assert!(times.observes(taken) && !times.observes(left));
            assert!(taken.abs_diff(now) <= 1 && left.abs_diff(now) <= 1 && left != 0);
        }
    }

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
