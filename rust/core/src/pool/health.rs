//! Passive health of a pool's workers: the state machine that ejects a sick worker and
//! re-admits it after a probe, from the outcomes of the dispatches the pool times.
//!
//! A worker is healthy, ejected until some time, on probation once that time has passed, or
//! probing (its probe in flight). Only the pool decides when to look (see `WorkerPool`); this
//! file holds the rules, and runs no Python code.
//!
//! A dispatch is told to health in one of two ways. A timed one begins with a clock reading
//! and ends with its outcome (`finish`). A token dispatch, the pool's native round-robin path
//! while every worker is healthy, costs one add: the caller holds the worker's token while the
//! call is in flight, so the token's references the pool does not own are the calls in
//! flight, and the calls handed out with it that are no longer in flight, less those reported
//! as not succeeding (only those report), are its successes. They are counted (`settle`)
//! before any decision that depends on them: a failure's, the stuck rule's, a read's.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use crate::tally::Tally;

/// What the caller saw of one dispatch.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Outcome {
    /// The worker answered (a result, or the handler's error).
    Success,
    /// The transport failed (an `RpcError`).
    Failure,
    /// The call's deadline passed first.
    Deadline,
    /// No signal about the worker (the caller cancelled, a hedge lost).
    Neutral,
}

impl Outcome {
    pub fn of(code: u8) -> Option<Self> {
        match code {
            0 => Some(Self::Success),
            1 => Some(Self::Failure),
            2 => Some(Self::Deadline),
            3 => Some(Self::Neutral),
            _ => None,
        }
    }
}

/// Why a worker was last ejected.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Reason {
    Never = 0,
    Failures = 1,
    SuccessRate = 2,
    Stuck = 3,
    Latency = 4,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Self::Never => "",
            Self::Failures => "failures",
            Self::SuccessRate => "success-rate",
            Self::Stuck => "stuck",
            Self::Latency => "latency",
        }
    }

    fn of(code: u8) -> Self {
        match code {
            1 => Self::Failures,
            2 => Self::SuccessRate,
            3 => Self::Stuck,
            4 => Self::Latency,
            _ => Self::Never,
        }
    }
}

/// The thresholds, as `shardline.pool.health.HealthPolicy` validated them (seconds as given).
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub failures: u32,
    pub success_rate: f64,
    pub stuck_multiple: f64,
    pub stuck_floor: f64,
    pub base_ejection: f64,
    pub max_ejection: f64,
    pub max_ejected_share: f64,
    pub latency_outlier: f64,
}

/// Weight of each outcome in the success-rate average (1 for a success, 0 for a failure or a
/// deadline miss), which starts at 1.
pub const SUCCESS_WEIGHT: f64 = 0.1;
/// Of the dispatches the native path hands a fast worker while every worker is healthy, one in
/// this many is timed rather than a token dispatch: what keeps its latency average current
/// (see [`Policy::times_all`] for the others).
pub const TIMED_EVERY: u64 = 32;
/// The latency-outlier rule runs at most this often (nanoseconds): it reads every worker.
pub const OUTLIER_EVERY_NS: u64 = 100_000_000;
/// The outlier rule needs this many visible workers with a latency estimate.
pub const OUTLIER_QUORUM: usize = 3;

fn ns(seconds: f64) -> u64 {
    // saturating: a policy of days is still a policy
    (seconds * 1e9) as u64
}

impl Policy {
    /// The stuck rule runs over every worker at most this often: half the floor, so a stalled
    /// worker is caught within the floor and a half of its threshold passing.
    pub fn scan_every_ns(&self) -> u64 {
        ns(self.stuck_floor) / 2
    }

    /// Whether every dispatch to a worker with latency average `latency` (NaN before any) is
    /// timed: before its first, and once the stuck threshold (`stuck_multiple` times it) is
    /// above the floor, where the stuck and latency-outlier rules depend on the average. A
    /// faster worker's threshold is the floor, and timing one dispatch in [`TIMED_EVERY`]
    /// keeps its average current enough to see it slow down; a dispatch this slow costs
    /// thousands of times what timing it does.
    #[inline]
    pub fn times_all(&self, latency: f64) -> bool {
        latency.is_nan() || self.stuck_multiple * latency > self.stuck_floor
    }

    /// How many workers may be ejected at once in a pool of `pooled`: the share, but always one.
    pub fn cap(&self, pooled: usize) -> usize {
        ((self.max_ejected_share * pooled as f64).floor() as usize).max(1)
    }

    /// The length of a worker's `times`th ejection, in seconds.
    pub fn ejection(&self, times: u32) -> f64 {
        (self.base_ejection * f64::from(times)).min(self.max_ejection)
    }

    /// Whether a worker with `inflight` calls, latency average `latency` (NaN before any) and
    /// its last progress at `progress` is stuck at `now`.
    pub fn stuck(&self, inflight: u32, latency: f64, progress: u64, now: u64) -> bool {
        if inflight == 0 || latency.is_nan() {
            return false;
        }
        let threshold = self.stuck_floor.max(self.stuck_multiple * latency);
        now.saturating_sub(progress) as f64 * 1e-9 > threshold
    }
}

/// The state word's low two bits; the rest is a time on the pool's clock.
const HEALTHY: u64 = 0;
/// Ejected until the time in the word; on probation from then on.
const EJECTED: u64 = 1;
/// Its probe, the dispatch started at the time in the word, is in flight.
const PROBING: u64 = 2;
const TAG: u64 = 3;

fn word(tag: u64, at: u64) -> u64 {
    (at << 2) | tag
}

/// A worker's state as reported (`WorkerHealth.state`), with the ejection's time left.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum State {
    Healthy,
    Ejected { left_ns: u64 },
    Probation,
    Probing,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Ejected { .. } => "ejected",
            Self::Probation => "probation",
            Self::Probing => "probing",
        }
    }
}

/// A transition that makes an event for the proxy to log.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Transition {
    Ejected { reason: Reason, seconds: f64 },
    Readmitted,
}

/// The pool-wide part: how many workers are not healthy (what every read checks first, and
/// what the share cap counts), the times of the last periodic checks, and the totals.
#[derive(Default)]
pub struct PoolHealth {
    unhealthy: AtomicUsize,
    last_scan: AtomicU64,
    last_outlier: AtomicU64,
    ejections: AtomicU64,
    readmissions: AtomicU64,
}

impl PoolHealth {
    /// Whether any worker may be hidden: the one relaxed load every read makes first.
    #[inline(always)]
    pub fn any_unhealthy(&self) -> bool {
        self.unhealthy.load(Ordering::Relaxed) != 0
    }

    /// `(ejections, re-admissions, workers not healthy now)`.
    pub fn counts(&self) -> (u64, u64, usize) {
        (
            self.ejections.load(Ordering::Relaxed),
            self.readmissions.load(Ordering::Relaxed),
            self.unhealthy.load(Ordering::Relaxed),
        )
    }

    /// A worker that was not healthy left the pool (under the write lock).
    pub fn forget(&self, health: &WorkerHealth) {
        if health.state.load(Ordering::Relaxed) & TAG != HEALTHY {
            self.unhealthy.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Restarts the periodic checks' clocks (a new policy).
    pub fn restart(&self) {
        self.last_scan.store(0, Ordering::Relaxed);
        self.last_outlier.store(0, Ordering::Relaxed);
    }

    /// Everything forgotten: the pool was cleared.
    pub fn reset(&self) {
        self.unhealthy.store(0, Ordering::Relaxed);
    }

    /// Whether the periodic check whose last run is in `last` is due at `now`, every `every`
    /// ns; claims the run when it is.
    fn due(last: &AtomicU64, now: u64, every: u64) -> bool {
        let then = last.load(Ordering::Relaxed);
        now.saturating_sub(then) >= every
            && last
                .compare_exchange(then, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    pub fn scan_due(&self, now: u64, policy: &Policy) -> bool {
        Self::due(&self.last_scan, now, policy.scan_every_ns())
    }

    pub fn outliers_due(&self, now: u64) -> bool {
        Self::due(&self.last_outlier, now, OUTLIER_EVERY_NS)
    }
}

/// One worker's health. Atomics: dispatches begin and end under the pool's read lock,
/// possibly on several threads at once; every transition is one compare-and-swap of `state`.
pub struct WorkerHealth {
    /// Tag and time (see [`HEALTHY`], [`EJECTED`], [`PROBING`]).
    state: AtomicU64,
    consecutive: AtomicU32,
    /// `f64` bits of the success-rate average.
    success: AtomicU64,
    times: AtomicU32,
    reason: AtomicU8,
    /// When a call last completed, or one started with none in flight.
    progress: AtomicU64,
    /// Since when `times` has been decaying: the last re-admission or decay.
    healthy_since: AtomicU64,
    /// Native dispatches handed the worker while health was on: which of them are timed.
    turns: Tally,
    /// Token dispatches handed out.
    token_handed: Tally,
    /// Token dispatches reported as ending otherwise than with a success.
    token_missed: AtomicU64,
    /// Token dispatches counted as successes so far (see `settle`).
    token_counted: AtomicU64,
    /// Whether a check last saw the worker with nothing in flight: the first check that sees
    /// it busy again counts as its progress, as the start of a timed dispatch from idle does.
    idle: AtomicBool,
}

impl WorkerHealth {
    /// A healthy worker whose last progress is `now`.
    pub fn new(now: u64) -> Self {
        Self {
            state: AtomicU64::new(HEALTHY),
            consecutive: AtomicU32::new(0),
            success: AtomicU64::new(1.0f64.to_bits()),
            times: AtomicU32::new(0),
            reason: AtomicU8::new(Reason::Never as u8),
            progress: AtomicU64::new(now),
            healthy_since: AtomicU64::new(now),
            turns: Tally::default(),
            token_handed: Tally::default(),
            token_missed: AtomicU64::new(0),
            token_counted: AtomicU64::new(0),
            idle: AtomicBool::new(true),
        }
    }

    /// Whether the native path's next dispatch to this fast, healthy worker is timed rather
    /// than a token dispatch: one in [`TIMED_EVERY`].
    #[inline]
    pub fn timed_turn(&self) -> bool {
        self.turns.add(1) % TIMED_EVERY == 0
    }

    /// A token dispatch was handed out.
    #[inline]
    pub fn token_handed(&self) {
        self.token_handed.add(1);
    }

    /// A token dispatch, its token already let go, ended otherwise than with a success.
    pub fn token_missed(&self) {
        self.token_missed.fetch_add(1, Ordering::Relaxed);
    }

    /// Token dispatches that succeeded and are not counted yet, with `held` of them in flight.
    fn token_successes(&self, held: u64) -> (u64, u64) {
        let done = self
            .token_handed
            .get()
            .saturating_sub(held)
            .saturating_sub(self.token_missed.load(Ordering::Relaxed));
        let counted = self.token_counted.load(Ordering::Relaxed);
        (done.saturating_sub(counted), counted)
    }

    /// Counts the token dispatches that succeeded since the last count, at `now`, with `held`
    /// token dispatches in flight: each is a success as a timed dispatch's (its failures in a
    /// row end, the success rate rises, a worker ejected as stuck is re-admitted), and they
    /// are progress now, which is no earlier than when they completed.
    pub fn settle(&self, held: u64, now: u64, pool: &PoolHealth) -> Option<Transition> {
        let (new, counted) = self.token_successes(held);
        if new == 0
            || self
                .token_counted
                .compare_exchange(counted, counted + new, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return None;
        }
        let state = self.state.load(Ordering::Acquire);
        self.succeeded(new, false, state, now, pool)
    }

    /// Whether a balancer may be offered the worker at `now` (call only when the pool has an
    /// unhealthy worker: a healthy one is always visible).
    #[inline]
    pub fn visible(&self, now: u64) -> bool {
        let state = self.state.load(Ordering::Acquire);
        match state & TAG {
            HEALTHY => true,
            EJECTED => now >= state >> 2,
            _ => false,
        }
    }

    pub fn state(&self, now: u64) -> State {
        let state = self.state.load(Ordering::Acquire);
        match state & TAG {
            HEALTHY => State::Healthy,
            EJECTED if now >= state >> 2 => State::Probation,
            EJECTED => State::Ejected {
                left_ns: (state >> 2) - now,
            },
            _ => State::Probing,
        }
    }

    /// `(consecutive failures, success rate, times ejected, reason)` at `now` (after
    /// `settle`, when the worker has token dispatches).
    pub fn read(&self, now: u64, policy: &Policy) -> (u32, f64, u32, &'static str) {
        (
            self.consecutive.load(Ordering::Relaxed),
            f64::from_bits(self.success.load(Ordering::Relaxed)),
            self.times_ejected(now, policy),
            Reason::of(self.reason.load(Ordering::Relaxed)).name(),
        )
    }

    /// Times ejected, less one per `max_ejection` spent healthy since the last re-admission.
    fn times_ejected(&self, now: u64, policy: &Policy) -> u32 {
        let times = self.times.load(Ordering::Relaxed);
        if self.state.load(Ordering::Relaxed) & TAG != HEALTHY || times == 0 {
            return times;
        }
        let healthy = now.saturating_sub(self.healthy_since.load(Ordering::Relaxed));
        let decayed = healthy / ns(policy.max_ejection).max(1);
        times.saturating_sub(u32::try_from(decayed).unwrap_or(u32::MAX))
    }

    /// A dispatch started at `now` with `before` calls already in flight: one from idle is
    /// progress (a worker that was idle cannot have been stuck).
    #[inline]
    pub fn started(&self, before: u32, now: u64) {
        if before == 0 {
            self.progress.store(now, Ordering::Relaxed);
            self.idle.store(false, Ordering::Relaxed);
        }
    }

    /// Whether the worker may be handed out at `now` for a dispatch that will report its
    /// outcome (timed from `now`): a worker on probation may, and this dispatch is its probe,
    /// unless another caller claimed the probe first. Call only when the pool has an unhealthy
    /// worker.
    pub fn hand_out(&self, now: u64) -> bool {
        let state = self.state.load(Ordering::Acquire);
        match state & TAG {
            HEALTHY => true,
            EJECTED if now >= state >> 2 => self
                .state
                .compare_exchange(
                    state,
                    word(PROBING, now),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok(),
            _ => false,
        }
    }

    /// Ejects the worker at `now` for `reason`, if it is healthy and the cap allows or if it
    /// is probing; `pooled` is the pool's size.
    pub fn eject(
        &self,
        now: u64,
        reason: Reason,
        policy: &Policy,
        pool: &PoolHealth,
        pooled: usize,
    ) -> Option<Transition> {
        let state = self.state.load(Ordering::Acquire);
        let reserved = match state & TAG {
            HEALTHY => {
                let cap = policy.cap(pooled);
                pool.unhealthy
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                        (n < cap).then_some(n + 1)
                    })
                    .ok()?;
                true
            }
            PROBING => false,
            _ => return None,
        };
        let times = self.times_ejected(now, policy).saturating_add(1);
        let seconds = policy.ejection(times);
        let ejected = self.state.compare_exchange(
            state,
            word(EJECTED, now.saturating_add(ns(seconds))),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        if ejected.is_err() {
            if reserved {
                pool.unhealthy.fetch_sub(1, Ordering::Relaxed);
            }
            return None;
        }
        self.times.store(times, Ordering::Relaxed);
        self.reason.store(reason as u8, Ordering::Relaxed);
        pool.ejections.fetch_add(1, Ordering::Relaxed);
        Some(Transition::Ejected { reason, seconds })
    }

    /// Whether the worker is stuck at `now` (healthy or probing, with `inflight` calls and
    /// latency average `latency`); ejects it if so.
    pub fn check_stuck(
        &self,
        inflight: u32,
        latency: f64,
        now: u64,
        policy: &Policy,
        pool: &PoolHealth,
        pooled: usize,
    ) -> Option<Transition> {
        if self.state.load(Ordering::Relaxed) & TAG == EJECTED {
            return None;
        }
        if inflight == 0 {
            self.idle.store(true, Ordering::Relaxed);
            return None;
        }
        if self.idle.swap(false, Ordering::Relaxed) {
            // busy since the last check: its calls started no earlier than that
            self.progress.store(now, Ordering::Relaxed);
            return None;
        }
        let progress = self.progress.load(Ordering::Relaxed);
        if !policy.stuck(inflight, latency, progress, now) {
            return None;
        }
        self.eject(now, Reason::Stuck, policy, pool, pooled)
    }

    /// Whether the worker is healthy (the latency-outlier rule weighs only those).
    pub fn healthy(&self) -> bool {
        self.state.load(Ordering::Relaxed) & TAG == HEALTHY
    }

    /// The dispatch started at `started` ended at `now` with `outcome`.
    pub fn finish(
        &self,
        outcome: Outcome,
        started: u64,
        now: u64,
        policy: &Policy,
        pool: &PoolHealth,
        pooled: usize,
    ) -> Option<Transition> {
        let state = self.state.load(Ordering::Acquire);
        let probe = state & TAG == PROBING && state >> 2 == started;
        match outcome {
            Outcome::Success => self.succeeded(1, probe, state, now, pool),
            Outcome::Failure | Outcome::Deadline => {
                let consecutive = self.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
                let success = self.average(0.0);
                if probe {
                    self.eject(now, Reason::Failures, policy, pool, pooled)
                } else if state & TAG != HEALTHY {
                    None
                } else if consecutive >= policy.failures {
                    self.eject(now, Reason::Failures, policy, pool, pooled)
                } else if success < policy.success_rate {
                    self.eject(now, Reason::SuccessRate, policy, pool, pooled)
                } else {
                    None
                }
            }
            Outcome::Neutral => {
                if probe {
                    // back on probation: visible, and its next hand-out is a probe
                    let _ = self.state.compare_exchange(
                        state,
                        word(EJECTED, now),
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    );
                }
                None
            }
        }
    }

    /// `count` dispatches ended with a success at `now` (one of them the probe when `probe`),
    /// the worker's state word read as `state` before.
    fn succeeded(
        &self,
        count: u64,
        probe: bool,
        state: u64,
        now: u64,
        pool: &PoolHealth,
    ) -> Option<Transition> {
        self.progress.store(now, Ordering::Relaxed);
        if self.consecutive.load(Ordering::Relaxed) != 0 {
            self.consecutive.store(0, Ordering::Relaxed);
        }
        self.average_successes(count);
        // A worker ejected as stuck that completes a call was slow, not stuck (a process the
        // scheduler left waiting, a long call): it comes back at once, rather than hold one
        // of the cap's places while a sick worker stays in.
        let unstuck =
            state & TAG == EJECTED && self.reason.load(Ordering::Relaxed) == Reason::Stuck as u8;
        if !probe && !unstuck {
            return None;
        }
        self.state
            .compare_exchange(state, HEALTHY, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        if unstuck {
            // this ejection does not lengthen the next one
            let _ = self
                .times
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
        self.consecutive.store(0, Ordering::Relaxed);
        self.success.store(1.0f64.to_bits(), Ordering::Relaxed);
        self.healthy_since.store(now, Ordering::Relaxed);
        pool.unhealthy.fetch_sub(1, Ordering::Relaxed);
        pool.readmissions.fetch_add(1, Ordering::Relaxed);
        Some(Transition::Readmitted)
    }

    /// Moves the success-rate average by `count` successes: toward 1 as `count` samples of 1.
    fn average_successes(&self, count: u64) {
        // (1 - w)^count is 0 in f64 long before count leaves an i32
        let kept = (1.0 - SUCCESS_WEIGHT).powi(i32::try_from(count).unwrap_or(i32::MAX));
        let _ = self
            .success
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let previous = f64::from_bits(bits);
                let average = 1.0 - (1.0 - previous) * kept;
                (average != previous).then(|| average.to_bits())
            });
    }

    /// Moves the success-rate average toward `sample`; returns the new average.
    fn average(&self, sample: f64) -> f64 {
        let mut average = 0.0;
        let _ = self
            .success
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let previous = f64::from_bits(bits);
                average = previous + SUCCESS_WEIGHT * (sample - previous);
                (average != previous).then(|| average.to_bits())
            });
        average
    }
}

/// The median of `values` (sorted in place): the middle one, or the mean of the two middle ones.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let half = values.len() / 2;
    if values.len() % 2 == 1 {
        values[half]
    } else {
        (values[half - 1] + values[half]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn policy() -> Policy {
        Policy {
            failures: 5,
            success_rate: 0.6,
            stuck_multiple: 8.0,
            stuck_floor: 0.02,
            base_ejection: 1.0,
            max_ejection: 30.0,
            max_ejected_share: 0.1,
            latency_outlier: 5.0,
        }
    }

    #[test]
    fn consecutive_failures_eject_and_the_probe_readmits() {
        let (policy, pool) = (policy(), PoolHealth::default());
        let health = WorkerHealth::new(SECOND);
        for n in 1..5 {
            assert_eq!(
                health.finish(Outcome::Failure, SECOND, SECOND, &policy, &pool, 4),
                None,
                "{n}"
            );
        }
        let ejected = health.finish(Outcome::Deadline, SECOND, SECOND, &policy, &pool, 4);
        assert_eq!(
            ejected,
            Some(Transition::Ejected {
                reason: Reason::Failures,
                seconds: 1.0
            })
        );
        assert!(pool.any_unhealthy());
        assert!(!health.visible(SECOND + SECOND / 2));
        assert_eq!(health.state(2 * SECOND), State::Probation);
        assert!(health.hand_out(2 * SECOND));
        assert_eq!(health.state(2 * SECOND), State::Probing);
        assert!(!health.hand_out(2 * SECOND));
        // an old call's outcome decides nothing
        assert_eq!(
            health.finish(Outcome::Success, SECOND, 2 * SECOND, &policy, &pool, 4),
            None
        );
        assert_eq!(health.state(2 * SECOND), State::Probing);
        let readmitted = health.finish(Outcome::Success, 2 * SECOND, 3 * SECOND, &policy, &pool, 4);
        assert_eq!(readmitted, Some(Transition::Readmitted));
        assert_eq!(pool.counts(), (1, 1, 0));
        assert_eq!(health.read(3 * SECOND, &policy), (0, 1.0, 1, "failures"));
    }

    #[test]
    fn a_failed_probe_ejects_for_longer_and_a_neutral_one_stays_on_probation() {
        let (policy, pool) = (policy(), PoolHealth::default());
        let health = WorkerHealth::new(0);
        health.eject(0, Reason::Stuck, &policy, &pool, 4).unwrap();
        assert!(health.hand_out(SECOND));
        assert_eq!(
            health.finish(Outcome::Neutral, SECOND, SECOND, &policy, &pool, 4),
            None
        );
        assert_eq!(health.state(SECOND), State::Probation);
        assert!(health.hand_out(SECOND + 1));
        let again = health.finish(Outcome::Failure, SECOND + 1, 2 * SECOND, &policy, &pool, 4);
        assert_eq!(
            again,
            Some(Transition::Ejected {
                reason: Reason::Failures,
                seconds: 2.0
            })
        );
        assert_eq!(health.state(3 * SECOND), State::Ejected { left_ns: SECOND });
        assert_eq!(pool.counts(), (2, 0, 1));
    }

    #[test]
    fn the_cap_holds_and_times_decay_while_healthy() {
        let (policy, pool) = (policy(), PoolHealth::default());
        let (a, b) = (WorkerHealth::new(0), WorkerHealth::new(0));
        assert!(a.eject(0, Reason::Latency, &policy, &pool, 19).is_some());
        assert!(b.eject(0, Reason::Latency, &policy, &pool, 19).is_none());
        assert!(b.visible(0));
        assert!(b.eject(0, Reason::Latency, &policy, &pool, 20).is_some());
        assert_eq!(policy.ejection(40), 30.0);
        // re-admitted at 1 s after its first ejection: one decays after 30 s healthy
        assert!(a.hand_out(SECOND));
        a.finish(Outcome::Success, SECOND, SECOND, &policy, &pool, 20);
        assert_eq!(a.times_ejected(30 * SECOND, &policy), 1);
        assert_eq!(a.times_ejected(31 * SECOND, &policy), 0);
    }

    #[test]
    fn stuck_needs_calls_in_flight_an_estimate_and_the_threshold_passed() {
        let policy = policy();
        assert!(!policy.stuck(0, 0.001, 0, SECOND));
        assert!(!policy.stuck(3, f64::NAN, 0, SECOND));
        // floor 20 ms over 8 x 1 ms
        assert!(!policy.stuck(1, 0.001, 0, 20_000_000));
        assert!(policy.stuck(1, 0.001, 0, 20_000_001));
        // 8 x 10 ms over the floor
        assert!(!policy.stuck(1, 0.01, 0, 80_000_000));
        assert!(policy.stuck(1, 0.01, 0, 80_000_001));
    }

    #[test]
    fn failing_every_other_call_crosses_the_success_rate() {
        let (policy, pool) = (policy(), PoolHealth::default());
        let health = WorkerHealth::new(0);
        let mut failures = 0;
        for n in 0.. {
            let outcome = if n % 2 == 0 {
                Outcome::Failure
            } else {
                Outcome::Success
            };
            failures += u32::from(outcome == Outcome::Failure);
            if let Some(transition) = health.finish(outcome, 0, 0, &policy, &pool, 4) {
                assert_eq!(
                    transition,
                    Transition::Ejected {
                        reason: Reason::SuccessRate,
                        seconds: 1.0
                    }
                );
                break;
            }
        }
        assert_eq!(failures, 7);
    }

    #[test]
    fn token_successes_count_once_settled_and_readmit_a_worker_ejected_as_stuck() {
        let (policy, pool) = (policy(), PoolHealth::default());
        let health = WorkerHealth::new(0);
        for _ in 0..3 {
            health.token_handed();
        }
        // one of the three fails and is let go: two still in flight, none succeeded
        health.token_missed();
        assert_eq!(health.settle(2, SECOND, &pool), None);
        health.finish(Outcome::Failure, 0, SECOND, &policy, &pool, 4);
        assert_eq!(health.read(SECOND, &policy).0, 1);
        assert!(health
            .eject(SECOND, Reason::Stuck, &policy, &pool, 4)
            .is_some());
        // one of the two completes: a success, which ends the run of failures and re-admits
        assert_eq!(
            health.settle(1, 2 * SECOND, &pool),
            Some(Transition::Readmitted)
        );
        assert_eq!(health.read(2 * SECOND, &policy).0, 0);
        // counted once
        assert_eq!(health.settle(1, 3 * SECOND, &pool), None);
        assert_eq!(pool.counts(), (1, 1, 0));
    }

    #[test]
    fn a_check_that_sees_a_worker_busy_after_idle_counts_that_as_progress() {
        let (policy, pool) = (policy(), PoolHealth::default());
        let health = WorkerHealth::new(0);
        // idle since it was made; its token dispatches started unseen, long after
        let ms = SECOND / 1000;
        assert_eq!(
            health.check_stuck(2, 0.001, 10 * SECOND, &policy, &pool, 4),
            None
        );
        assert_eq!(
            health.check_stuck(2, 0.001, 10 * SECOND + 20 * ms, &policy, &pool, 4),
            None
        );
        assert!(health
            .check_stuck(2, 0.001, 10 * SECOND + 21 * ms, &policy, &pool, 4)
            .is_some());
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
