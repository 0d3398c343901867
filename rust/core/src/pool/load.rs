//! A worker's load as the pool keeps it: dispatches in flight and a latency average.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Weight of each new latency sample in the moving average: a worker that slows down is
/// noticed within a few dispatches.
pub const LATENCY_WEIGHT: f64 = 0.2;

/// A worker's dispatches in flight and latency average. Atomics, because dispatches begin and
/// end under the pool's read lock, possibly on several threads at once.
pub struct Load {
    pub inflight: AtomicU32,
    /// `f64` bits; NaN until the first dispatch ends.
    pub latency: AtomicU64,
}

impl Default for Load {
    fn default() -> Self {
        Self {
            inflight: AtomicU32::new(0),
            latency: AtomicU64::new(f64::NAN.to_bits()),
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

    #[inline]
    pub fn end(&self, seconds: f64) {
        self.leave();
        let _ = self
            .latency
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let previous = f64::from_bits(bits);
                let average = if previous.is_nan() {
                    seconds
                } else {
                    previous + LATENCY_WEIGHT * (seconds - previous)
                };
                Some(average.to_bits())
            });
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Load;

    #[test]
    fn load_counts_inflight_saturating_and_averages_latency() {
        let load = Load::default();
        assert_eq!(load.estimate().0, 0);
        assert!(load.estimate().1.is_nan());
        load.begin();
        load.begin();
        load.end(0.5);
        assert_eq!(load.estimate(), (1, 0.5));
        load.end(1.5);
        load.end(1.5);
        let (inflight, latency) = load.carry().estimate();
        assert_eq!(inflight, 0);
        assert!((latency - (0.5 + 0.2 * 1.0 + 0.2 * (1.5 - 0.7))).abs() < 1e-12);
    }
}
