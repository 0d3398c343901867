//! The pool's clock: monotonic nanoseconds, never 0.

use std::sync::OnceLock;
use std::time::Instant;

/// Nanoseconds on a monotonic clock since the first reading in this process, plus one: what a
/// timed dispatch's start is, so the proxy reads no clock in Python, and never 0, which
/// `dispatch_next` returns for a dispatch it does not time.
///
/// `Instant` (`clock_gettime(CLOCK_MONOTONIC)` through the vDSO) costs more a reading than a
/// raw TSC read (`benches/RESULTS.md`, "Instrumentation cost (issue 15)"), but the TSC needs
/// calibrating and is not monotonic on every machine and VM; read on one sampled dispatch in
/// several, the difference is small a dispatch.
#[inline]
pub fn clock_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let elapsed = EPOCH.get_or_init(Instant::now).elapsed();
    u64::try_from(elapsed.as_nanos())
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}

/// Seconds from `started` to `now` (readings of the pool's clock); 0 for a reading from the
/// future.
#[inline]
pub fn seconds_between(started: u64, now: u64) -> f64 {
    now.saturating_sub(started) as f64 * 1e-9
}
