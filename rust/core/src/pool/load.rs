//! A worker's load as the pool keeps it: dispatches in flight and a latency average.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::clock::seconds_between;

/// Weight of each new latency sample in the moving average: a worker that slows down is
/// noticed within a few dispatches.
pub const LATENCY_WEIGHT: f64 = 0.2;

/// Weight of each latency sample in the pool's mean (every worker's samples, one average):
/// about the last 32 dispatches, so one slow sample moves it little.
pub const POOL_LATENCY_WEIGHT: f64 = 1.0 / 32.0;

/// Seconds since a worker's last latency sample after which least-loaded weighs its average
/// halfway to the pool's mean (see [`weighed_latency`]).
pub const LATENCY_MEMORY: f64 = 0.1;

/// Moves the moving average in `cell` (`f64` bits, NaN before any sample) toward `sample` by
/// `weight`; the first sample is the average.
#[inline]
pub fn blend(cell: &AtomicU64, sample: f64, weight: f64) {
    let _ = cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
        let previous = f64::from_bits(bits);
        let average = if previous.is_nan() {
            sample
        } else {
            previous + weight * (sample - previous)
        };
        Some(average.to_bits())
    });
}

/// The latency least-loaded weighs a worker by at `now`: its average `latency` (NaN before its
/// first sample, taken at `sampled`) moved toward the pool's `mean` by the share
/// `age / (LATENCY_MEMORY + age)`, `age` the seconds since that sample; `mean` before its first
/// sample; 0.0 while neither is known.
///
/// Implementation notes:
///     Least-loaded avoids a slow worker, so it stops sampling it: without this, a worker that
///     was slow once would keep its average, and be avoided, for good. Moving toward the mean
///     with time makes it an ordinary candidate again after a few `LATENCY_MEMORY`s, and its
///     next dispatch re-measures it (a worker still slow is avoided again at once). Decay
///     toward the mean rather than toward zero (Finagle's and Tower's peak EWMA), so a worker
///     forgotten is offered as an average one, not flooded as the fastest; a fixed 100 ms,
///     because the average's staleness is in time (a worker at thousands of calls a second
///     is re-sampled every millisecond and barely moves), and a hyperbola rather than an
///     exponential so the Python reference model computes the same `f64` exactly.
#[inline]
pub fn weighed_latency(latency: f64, sampled: u64, now: u64, mean: f64) -> f64 {
    let known = |value: f64| if value.is_nan() { 0.0 } else { value };
    if latency.is_nan() || mean.is_nan() {
        return known(if latency.is_nan() { mean } else { latency });
    }
    let age = seconds_between(sampled, now);
    latency + (mean - latency) * (age / (LATENCY_MEMORY + age))
}

/// Least-loaded's cost of a worker with `(inflight, latency)` as weighed by
/// [`weighed_latency`]: what a new dispatch expects to wait, `latency x (inflight + 1)`, then
/// fewer in flight (so a pool with no latency yet compares dispatches in flight).
#[inline]
pub fn cost((inflight, latency): (u32, f64)) -> (f64, u32) {
    (latency * (f64::from(inflight) + 1.0), inflight)
}

/// A worker's dispatches in flight and latency average. Atomics, because dispatches begin and
/// end under the pool's read lock, possibly on several threads at once.
pub struct Load {
    pub inflight: AtomicU32,
    /// `f64` bits; NaN until the first dispatch ends.
    pub latency: AtomicU64,
    /// The pool's clock when the last latency sample came (0 before any).
    pub sampled: AtomicU64,
}

impl Default for Load {
    fn default() -> Self {
        Self {
            inflight: AtomicU32::new(0),
            latency: AtomicU64::new(f64::NAN.to_bits()),
            sampled: AtomicU64::new(0),
        }
    }
}

impl Load {
    /// One more dispatch in flight; returns how many there were before.
    #[inline]
    pub fn begin(&self) -> u32 {
        self.inflight.fetch_add(1, Ordering::Relaxed)
    }

    /// One dispatch fewer in flight, whose time says nothing of the worker (a deadline it
    /// missed, a call cancelled).
    #[inline]
    pub fn leave(&self) {
        // saturating: a worker evicted and admitted again mid-dispatch starts from zero
        let _ = self
            .inflight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// One dispatch fewer in flight, which took `seconds`, ended at `now` (the pool's clock).
    #[inline]
    pub fn end(&self, seconds: f64, now: u64) {
        self.leave();
        blend(&self.latency, seconds, LATENCY_WEIGHT);
        self.sampled.store(now, Ordering::Relaxed);
    }

    /// When the last latency sample came.
    #[inline]
    pub fn sampled(&self) -> u64 {
        self.sampled.load(Ordering::Relaxed)
    }

    /// Dispatches in flight and the latency average, NaN before any.
    #[inline]
    pub fn estimate(&self) -> (u32, f64) {
        (
            self.inflight.load(Ordering::Relaxed),
            f64::from_bits(self.latency.load(Ordering::Relaxed)),
        )
    }

    /// The same counts, for the entry that replaces this one (a refresh keeps the load).
    #[inline]
    pub fn carry(&self) -> Self {
        Self {
            inflight: AtomicU32::new(self.inflight.load(Ordering::Relaxed)),
            latency: AtomicU64::new(self.latency.load(Ordering::Relaxed)),
            sampled: AtomicU64::new(self.sampled()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{cost, weighed_latency, Load};

    #[test]
    fn load_counts_inflight_saturating_and_averages_latency() {
        let load = Load::default();
        assert_eq!(load.estimate().0, 0);
        assert!(load.estimate().1.is_nan());
        load.begin();
        load.begin();
        load.end(0.5, 7);
        assert_eq!(load.estimate(), (1, 0.5));
        load.end(1.5, 8);
        load.end(1.5, 9);
        let carried = load.carry();
        let (inflight, latency) = carried.estimate();
        assert_eq!(inflight, 0);
        assert_eq!(carried.sampled(), 9);
        assert!((latency - (0.5 + 0.2 * 1.0 + 0.2 * (1.5 - 0.7))).abs() < 1e-12);
    }

    #[test]
    fn a_latency_not_sampled_lately_moves_toward_the_pools_mean() {
        let nan = f64::NAN;
        assert_eq!(weighed_latency(nan, 0, 5, nan), 0.0);
        assert_eq!(weighed_latency(nan, 0, 5, 0.25), 0.25); // no sample yet: the mean
        assert_eq!(weighed_latency(1.0, 3, 3, 0.25), 1.0); // fresh: its own
        let second = 1_000_000_000;
        let halfway = weighed_latency(1.0, second, second + 100_000_000, 0.2);
        assert!((halfway - 0.6).abs() < 1e-12);
        let later = weighed_latency(1.0, second, 100 * second, 0.2);
        assert!(later > 0.2 && later < 0.201);
        assert_eq!(weighed_latency(1.0, second, 0, 0.2), 1.0); // a reading from the past
    }

    #[test]
    fn the_cost_is_latency_times_one_more_in_flight_then_fewer_in_flight() {
        assert_eq!(cost((3, 0.5)), (2.0, 3));
        assert!(cost((9, 0.1)) < cost((0, 1.1)));
        assert!(cost((1, 0.0)) < cost((2, 0.0)));
    }
}
