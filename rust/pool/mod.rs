//! The uid-keyed worker pool: uid → (metadata, connection), in admission order.
//!
//! The `WorkerPool` class and its Python-facing parts; the entries, their indices and
//! rotation, the address filter, each worker's load and health and the pool's clock are the
//! core's (`shardline_core::pool`), which runs no Python code.

pub mod dispatch_times;
pub mod keyed_record;
pub mod rotation;
pub mod views;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyTuple, PyType};
use pyo3::{PyTraverseError, PyVisit};
use rustc_hash::FxHashSet;

use crate::py::errors::{missing_key, raise, Error};
use crate::py::gil_lock::GilLock;
use dispatch_times::{DispatchTimes, BOUNDS, SAMPLE_EVERY};
use keyed_record::KeyedRecord;
use shardline_core::pool::clock::{clock_ns, seconds_between};
use shardline_core::pool::draws::{two_positions, Draws};
use shardline_core::pool::entries::{self, Uid, Who};
use shardline_core::pool::filter::AddressFilter;
use shardline_core::pool::health::{
    median, Outcome, Policy, PoolHealth, State, Transition, WorkerHealth, OUTLIER_QUORUM,
};
use shardline_core::pool::load::{blend, cost, weighed_latency, Load, POOL_LATENCY_WEIGHT};
use shardline_core::tally::Tally;
use views::WorkersView;

/// What the pool holds of a worker: its uid object (handed back as the mapping's key), its
/// metadata and the connection to reach it.
pub struct Worker {
    uid: Py<PyAny>,
    metadata: Py<PyAny>,
    connection: Py<PyAny>,
    /// Its [`DispatchToken`], with health on: the references the entry does not own are its
    /// token dispatches in flight (see `dispatch_next`).
    token: Option<Py<DispatchToken>>,
}

impl Uid for Worker {
    fn address(&self) -> usize {
        self.uid.as_ptr() as usize
    }

    fn keep(&mut self, old: &mut Self) {
        // its token dispatches in flight hold the old token
        if old.token.is_some() {
            self.token = old.token.take();
        }
    }
}

impl Worker {
    /// New references to `(metadata, connection)`: taken under the lock (an incref runs no
    /// Python code), made into a tuple after it is released.
    fn pair(&self, py: Python<'_>) -> [Py<PyAny>; 2] {
        [self.metadata.clone_ref(py), self.connection.clone_ref(py)]
    }
}

type Entry = entries::Entry<Worker>;

/// What the pool reads of an entry through its worker's dispatch token, a Python object.
trait TokenDispatches {
    fn held(&self, _attached: Python<'_>) -> u32;
    fn estimate(&self, py: Python<'_>) -> (u32, f64);
    fn read(&self, py: Python<'_>) -> (u32, f64);
    fn weighed(&self, py: Python<'_>, now: u64, mean: f64) -> (u32, f64);
    fn begin(&self, py: Python<'_>, now: u64);
}

impl TokenDispatches for Entry {
    /// Its token dispatches in flight: the references to its token it does not own.
    #[inline]
    fn held(&self, _attached: Python<'_>) -> u32 {
        self.token.as_ref().map_or(0, |token| {
            // SAFETY: the entry owns a reference to the token, so it is alive; reading its
            // count runs no Python code (under the GIL, or attached in a free-threaded build)
            let count = unsafe { pyo3::ffi::Py_REFCNT(token.as_ptr()) };
            u32::try_from(count - 1).unwrap_or(0)
        })
    }

    /// Dispatches in flight (timed and token dispatches) and the latency average, NaN before
    /// any.
    fn estimate(&self, py: Python<'_>) -> (u32, f64) {
        let (inflight, latency) = self.load.estimate();
        (inflight.saturating_add(self.held(py)), latency)
    }

    /// The same, with 0.0 for no latency yet (what `health(uid)` reports).
    fn read(&self, py: Python<'_>) -> (u32, f64) {
        let (inflight, latency) = self.estimate(py);
        (inflight, if latency.is_nan() { 0.0 } else { latency })
    }

    /// Dispatches in flight and the latency least-loaded weighs at `now` against the pool's
    /// `mean` (what `load(uid)` reports): see [`weighed_latency`].
    fn weighed(&self, py: Python<'_>, now: u64, mean: f64) -> (u32, f64) {
        let (inflight, latency) = self.estimate(py);
        (
            inflight,
            weighed_latency(latency, self.load.sampled(), now, mean),
        )
    }

    /// Begins a timed dispatch at `now`; returns how many were in flight before, token
    /// dispatches included, and marks its progress when there were none.
    fn begin(&self, py: Python<'_>, now: u64) {
        let before = self.load.begin().saturating_add(self.held(py));
        if let Some(health) = &self.health {
            health.started(before, now);
        }
    }
}

type Entries = entries::Entries<Worker>;

/// A worker's dispatch token: what the native round-robin path hands its caller, with health
/// on and every worker healthy, instead of timing the dispatch; the caller holds it while the
/// call is in flight and lets it go when the call ends. Carries nothing.
#[pyclass(frozen, module = "shardline", name = "DispatchToken")]
pub struct DispatchToken;

/// The pool of workers a proxy dispatches to, keyed by each worker's uid.
///
/// Each entry is the worker's current metadata and the connection to reach it; both are
/// arbitrary objects. Identity is the uid (`metadata.uid`, a `uuid.UUID`): the pool never
/// compares or hashes metadata. Writes are last-writer-wins, and a displaced connection is not
/// closed (the layer that made it owns it). The pool also keeps each worker's load for the
/// proxy: dispatches in flight and a latency average, carried across refreshes.
///
/// The pool is a balancer's context: `workers` is its live, read-only `WorkersView`, and
/// `load(uid)` its load. It keeps the rotation the round-robin balancer reads, a cursor over
/// the admission order shared by every caller (`next_in_rotation`), and hands the proxy a
/// round-robin candidate with what a dispatch needs in one call (`dispatch_next`), and a
/// least-loaded one, drawn by the pool, the same way (`dispatch_less_loaded`); a
/// dispatch is timed on the pool's clock (`start_dispatch` / `finish_dispatch`), and, once
/// `time_dispatches` was called, counted into a latency histogram (`dispatch_counts`), which
/// also times one in `DISPATCH_SAMPLE` of the dispatches `dispatch_next` hands out uncounted
/// (`observe_dispatch`). Any
/// finalizer may use the pool, even one that runs inside a pool method (a displaced
/// connection's, or one a garbage collection runs).
///
/// Passive health (off until `configure_health`): from the outcome each `finish_dispatch`
/// reports, and the successes of the native path's token dispatches (`dispatch_next`), counted
/// from their token's references, a sick worker is ejected and hidden from every read a balancer makes (`workers`,
/// `next_in_rotation`, `rotation_order`, `dispatch_next`, `less_loaded_of`,
/// `dispatch_less_loaded`, `load`, `entry`,
/// `start_dispatch`, `begin_dispatch`, `uids`) until its ejection time passes and a probe
/// succeeds; the pool's own membership (`len(pool)`, `uid in pool`, `pooled`, `members`)
/// still counts it. The rules are `shardline.pool.health.HealthPolicy`'s; `health(uid)`,
/// `health_counts()` and `drain_health_events()` read them.
///
/// Implementation notes:
///     Keyed by the uid's 128-bit integer, read from `uid.int`, so no operation hashes a
///     `uuid.UUID` in Python; a `WorkerMetadata` brings its uid and key along (its base,
///     [`KeyedRecord`], kept them when it was made), so admitting, refreshing and evicting it
///     read no attribute at all. A second index by the uid object's address finds the pooled
///     object itself (what `uids()` and the rotation hand out, and balancers hand back) without
///     even reading `uid.int`, from the first lookup made with it on; a lock-free filter of
///     those addresses sends most other objects straight to the key. Entries keep admission
///     order in a vector with holes, so a refresh keeps its position and a removal is O(1)
///     amortised. No Python code runs while the lock is held: the uid is read before it is
///     taken, displaced entries are dropped after it is released, and readers copy references
///     under it (increfs) and build tuples and lists after. The lock is a `GilLock`: on an interpreter with a GIL, which that rule makes
///     enough, a borrow count without atomic operations; `parking_lot::RwLock` on a
///     free-threaded one. Weak-referenceable, because balancers keep their per-pool state weakly.
///
///     Health transitions are compare-and-swaps of each worker's state word under the read
///     lock (see `health.rs`), made by the calls a dispatch makes anyway, at the clock
///     readings they already take; a read checks a worker's visibility only while the
///     pool-wide count of unhealthy workers is nonzero (one relaxed load otherwise). Events
///     wait in a queue of increfs until `drain_health_events` builds their tuples.
#[pyclass(frozen, subclass, weakref, module = "shardline", name = "WorkerPool")]
pub struct WorkerPool {
    entries: GilLock<Entries>,
    addresses: AddressFilter,
    /// Dispatches `dispatch_next` and `dispatch_less_loaded` handed out (the proxy's native
    /// paths).
    dispatched: Tally,
    /// Latencies of the dispatches `finish_dispatch` ends, once `time_dispatches` was called.
    times: DispatchTimes,
    health: PoolHealth,
    /// Whether `configure_health` was called: read before the lock, to take the clock reading
    /// the health rules need.
    health_on: AtomicBool,
    events: Mutex<Vec<Event>>,
    /// Whether `events` is not empty, read without its lock by every `finish_dispatch`.
    pending: AtomicBool,
    /// The tests' clock, when pinned (`_pin_clock`); 0 for the monotonic clock.
    pinned: AtomicU64,
    /// The pool's mean latency, over every pooled worker's latency samples (`f64` bits, NaN
    /// before any): what least-loaded weighs a worker it has no fresh sample of by.
    latency_mean: AtomicU64,
    /// Where `dispatch_less_loaded` draws its two positions.
    draws: Draws,
}

/// A health transition waiting for `drain_health_events`: increfs of the worker's uid and
/// metadata, taken under the lock.
struct Event {
    uid: Py<PyAny>,
    metadata: Py<PyAny>,
    transition: Transition,
}

/// Which workers a read may show: all of them, or, while some worker is unhealthy, those
/// visible at `now`.
#[derive(Clone, Copy)]
struct Sight {
    check: bool,
    now: u64,
}

impl Sight {
    #[inline]
    fn sees(self, entry: &Entry) -> bool {
        !self.check
            || entry
                .health
                .as_ref()
                .is_none_or(|health| health.visible(self.now))
    }
}

fn key_of(uid: &Bound<'_, PyAny>) -> PyResult<u128> {
    uid.getattr(intern!(uid.py(), "int"))?.extract()
}

static HEALTH_POLICY: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static WORKER_HEALTH: PyOnceLock<Py<PyType>> = PyOnceLock::new();
/// Where `HealthPolicy` and `WorkerHealth` are defined.
const HEALTH_MODULE: &str = "shardline.pool.health";

impl WorkerPool {
    /// A reading of the pool's clock: the pinned time, or [`clock_ns`].
    #[inline]
    fn now(&self) -> u64 {
        match self.pinned.load(Ordering::Relaxed) {
            0 => clock_ns(),
            pinned => pinned,
        }
    }

    /// What a read may show now: one relaxed load, and a clock reading only while some worker
    /// is unhealthy.
    #[inline]
    fn sight(&self) -> Sight {
        if self.health.any_unhealthy() {
            Sight {
                check: true,
                now: self.now(),
            }
        } else {
            Sight {
                check: false,
                now: 0,
            }
        }
    }

    /// A dispatch to `entry` that took `seconds` ended at `now`: into its load and the pool's
    /// mean latency.
    fn sampled(&self, entry: &Entry, seconds: f64, now: u64) {
        entry.load.end(seconds, now);
        blend(&self.latency_mean, seconds, POOL_LATENCY_WEIGHT);
    }

    /// The pool's mean latency (NaN before any sample).
    fn latency_mean(&self) -> f64 {
        f64::from_bits(self.latency_mean.load(Ordering::Relaxed))
    }

    /// Queues the event of `transition` of `entry` (under the lock: increfs only).
    fn record(&self, py: Python<'_>, entry: &Entry, transition: Transition) {
        let mut events = self.events.lock();
        events.push(Event {
            uid: entry.uid.clone_ref(py),
            metadata: entry.metadata.clone_ref(py),
            transition,
        });
        self.pending.store(true, Ordering::Relaxed);
    }

    /// The hand-out of `entry` at `now` for a dispatch timed from `now`: whether it may go
    /// (claiming its probe if it is on probation, when `probe`), after the stuck rule.
    fn hand_out(
        &self,
        py: Python<'_>,
        entries: &Entries,
        entry: &Entry,
        now: u64,
        probe: bool,
    ) -> bool {
        let (Some(health), Some(policy)) = (&entry.health, &entries.policy) else {
            return true;
        };
        if probe && self.health.any_unhealthy() && !health.hand_out(now) {
            return false;
        }
        self.settle(py, entry, now);
        let (inflight, latency) = entry.estimate(py);
        let pooled = entries.index.len();
        match health.check_stuck(inflight, latency, now, policy, &self.health, pooled) {
            Some(transition) => {
                self.record(py, entry, transition);
                false
            }
            None => true,
        }
    }

    /// Counts the token dispatches of `entry` that succeeded since the last count (see
    /// `WorkerHealth::settle`), at `now`.
    #[inline]
    fn settle(&self, py: Python<'_>, entry: &Entry, now: u64) {
        let (Some(health), Some(_)) = (&entry.health, &entry.token) else {
            return;
        };
        if let Some(transition) = health.settle(u64::from(entry.held(py)), now, &self.health) {
            self.record(py, entry, transition);
        }
    }

    /// The periodic rules, run from a `finish_dispatch` at `now` when due: the stuck rule
    /// over every worker, the latency-outlier rule over the visible ones.
    fn check_all(&self, py: Python<'_>, entries: &Entries, policy: &Policy, now: u64) {
        let pooled = entries.index.len();
        if self.health.scan_due(now, policy) {
            for entry in entries.live() {
                if let Some(health) = &entry.health {
                    self.settle(py, entry, now);
                    let (inflight, latency) = entry.estimate(py);
                    let stuck =
                        health.check_stuck(inflight, latency, now, policy, &self.health, pooled);
                    if let Some(transition) = stuck {
                        self.record(py, entry, transition);
                    }
                }
            }
        }
        if self.health.outliers_due(now) {
            let sight = Sight { check: true, now };
            let estimated: Vec<(&Entry, f64)> = entries
                .live()
                .filter(|entry| sight.sees(entry))
                .map(|entry| (entry, entry.load.estimate().1))
                .filter(|(_, latency)| !latency.is_nan())
                .collect();
            if estimated.len() < OUTLIER_QUORUM {
                return;
            }
            let mut latencies: Vec<f64> = estimated.iter().map(|(_, latency)| *latency).collect();
            let bound = policy.latency_outlier * median(&mut latencies);
            for (entry, latency) in estimated {
                let Some(health) = &entry.health else {
                    continue;
                };
                if latency > bound && latency > policy.stuck_floor && health.healthy() {
                    let reason = shardline_core::pool::health::Reason::Latency;
                    if let Some(transition) =
                        health.eject(now, reason, policy, &self.health, pooled)
                    {
                        self.record(py, entry, transition);
                    }
                }
            }
        }
    }

    /// `f` of the pooled entry `uid` names, with the entries, under the read lock (so `f`
    /// runs no Python code); None when it is not pooled. Found by the object's address when
    /// it is the pooled uid object itself and was looked up before, else by its key, read
    /// from `uid.int` before the lock is taken again; a pooled uid object found by key is
    /// indexed by its address then. Ejected workers are found too.
    fn with_entry<R>(
        &self,
        uid: &Bound<'_, PyAny>,
        f: impl Fn(&Entries, &Entry) -> R,
    ) -> PyResult<Option<R>> {
        let py = uid.py();
        let address = uid.as_ptr() as usize;
        if self.addresses.may_contain(address) {
            let entries = self.entries.read(py);
            let found = entries
                .find(Who::Address(address))
                .map(|entry| f(&entries, entry));
            if found.is_some() {
                return Ok(found);
            }
        }
        let key = key_of(uid)?;
        let (found, unindexed) = {
            let entries = self.entries.read(py);
            match entries.get(key) {
                Some(entry) => (
                    Some(f(&entries, entry)),
                    !entry.indexed && entry.uid_address() == address,
                ),
                None => (None, false),
            }
        };
        if unindexed {
            let mut entries = self.entries.write(py);
            if entries.index_address(key, address) {
                self.addresses.note(&mut entries, address);
            }
        }
        Ok(found)
    }

    /// `f` of the entry `uid` names if a balancer may see it now; None otherwise.
    fn with_visible<R>(
        &self,
        uid: &Bound<'_, PyAny>,
        f: impl Fn(&Entry) -> R,
    ) -> PyResult<Option<R>> {
        let sight = self.sight();
        let found = self.with_entry(uid, |_, entry| sight.sees(entry).then(|| f(entry)))?;
        Ok(found.flatten())
    }

    /// Of the entries at `positions` of the admission order (counting every pooled worker;
    /// one hidden from `sight` stands for the next visible one after it), the one with the
    /// lower `cost` at `now` (ties: the first); None when a position is past the last worker
    /// or none is visible. Least-loaded's comparison, for `less_loaded_of` and
    /// `dispatch_less_loaded`.
    fn less_loaded<'a>(
        &self,
        py: Python<'_>,
        entries: &'a Entries,
        sight: Sight,
        now: u64,
        (first, second): (usize, usize),
    ) -> Option<&'a Entry> {
        let (a, b) = if sight.check {
            let live: Vec<&Entry> = entries.live().collect();
            let visible_from = |position: usize| {
                (position < live.len()).then_some(())?;
                (0..live.len())
                    .map(|step| live[(position + step) % live.len()])
                    .find(|entry| sight.sees(entry))
            };
            (visible_from(first)?, visible_from(second)?)
        } else {
            (entries.nth_live(first)?, entries.nth_live(second)?)
        };
        let mean = self.latency_mean();
        let weighed = |entry: &Entry| cost(entry.weighed(py, now, mean));
        Some(if weighed(a) <= weighed(b) { a } else { b })
    }

    /// `(metadata, connection)` of every visible worker, in admission order: one consistent
    /// snapshot, copied under one read lock, its tuples built after it is released.
    pub(crate) fn values_snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let sight = self.sight();
        let pairs: Vec<[Py<PyAny>; 2]> = self
            .entries
            .read(py)
            .live()
            .filter(|entry| sight.sees(entry))
            .map(|entry| entry.pair(py))
            .collect();
        let values = pairs
            .into_iter()
            .map(|pair| PyTuple::new(py, pair))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, values)
    }

    /// `(uid, (metadata, connection))` of every visible worker, in admission order: one
    /// consistent snapshot, copied under one read lock, its tuples built after it is released.
    pub(crate) fn items_snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let sight = self.sight();
        let entries: Vec<(Py<PyAny>, [Py<PyAny>; 2])> = self
            .entries
            .read(py)
            .live()
            .filter(|entry| sight.sees(entry))
            .map(|entry| (entry.uid.clone_ref(py), entry.pair(py)))
            .collect();
        let items = entries
            .into_iter()
            .map(|(uid, pair)| (uid, PyTuple::new(py, pair)?).into_pyobject(py))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// How many workers a balancer may see now (`len` of the `workers` view).
    pub(crate) fn visible_len(&self, py: Python<'_>) -> usize {
        let sight = self.sight();
        let entries = self.entries.read(py);
        if sight.check {
            entries.live().filter(|entry| sight.sees(entry)).count()
        } else {
            entries.index.len()
        }
    }

    /// Whether `uid` is pooled and a balancer may see it now (`in` of the `workers` view).
    pub(crate) fn contains_visible(&self, uid: &Bound<'_, PyAny>) -> bool {
        self.with_visible(uid, |_| ())
            .is_ok_and(|found| found.is_some())
    }

    /// The keys of the uids in `tried`, read before the lock that picks is taken: a pooled
    /// uid object's from its entry, any other's from `uid.int`.
    fn keys_of(&self, tried: Option<&Bound<'_, PyAny>>) -> PyResult<FxHashSet<u128>> {
        let mut keys = FxHashSet::default();
        let Some(tried) = tried else {
            return Ok(keys);
        };
        // a call's first candidate: an empty mapping, not worth an iterator
        if tried.len().ok() == Some(0) {
            return Ok(keys);
        }
        for uid in tried.try_iter()? {
            let uid = uid?;
            let address = uid.as_ptr() as usize;
            let pooled = if self.addresses.may_contain(address) {
                self.entries
                    .read(tried.py())
                    .get_by_address(address)
                    .map(|entry| entry.key)
            } else {
                None
            };
            keys.insert(match pooled {
                Some(key) => key,
                None => key_of(&uid)?,
            });
        }
        Ok(keys)
    }
}

/// The uid object and key of the worker `metadata` describes: those a [`KeyedRecord`] kept
/// when it was made, else read from `metadata.uid` and its `int`.
fn uid_of(metadata: &Bound<'_, PyAny>) -> PyResult<(Py<PyAny>, u128)> {
    let py = metadata.py();
    if let Ok(record) = metadata.cast::<KeyedRecord>() {
        if let Some((uid, key)) = record.get().kept() {
            return Ok((uid.clone_ref(py), *key));
        }
    }
    let uid = metadata.getattr(intern!(py, "uid"))?;
    let key = key_of(&uid)?;
    Ok((uid.unbind(), key))
}

/// The entry of `metadata` and `connection`, with its dispatch token when `health` is on
/// (made here, before the pool's lock is taken).
fn entry_of(
    metadata: &Bound<'_, PyAny>,
    connection: &Bound<'_, PyAny>,
    health: bool,
) -> PyResult<Entry> {
    let (uid, key) = uid_of(metadata)?;
    let token = if health {
        Some(Py::new(metadata.py(), DispatchToken)?)
    } else {
        None
    };
    Ok(Entry {
        key,
        worker: Worker {
            uid,
            metadata: metadata.clone().unbind(),
            connection: connection.clone().unbind(),
            token,
        },
        load: Load::default(),
        health: None,
        indexed: false,
    })
}

/// The policy in `policy`, a `HealthPolicy` (which validated its fields when it was made).
fn policy_of(policy: &Bound<'_, PyAny>) -> PyResult<Policy> {
    let py = policy.py();
    let class = HEALTH_POLICY.import(py, HEALTH_MODULE, "HealthPolicy")?;
    if !policy.is_instance(class)? {
        return Err(raise(
            py,
            Error::Type(format!(
                "configure_health takes a HealthPolicy, not {}",
                policy.get_type().name()?
            )),
        ));
    }
    let field = |name: &str| policy.getattr(name);
    Ok(Policy {
        failures: field("failures")?.extract()?,
        success_rate: field("success_rate")?.extract()?,
        stuck_multiple: field("stuck_multiple")?.extract()?,
        stuck_floor: field("stuck_floor")?.extract()?,
        base_ejection: field("base_ejection")?.extract()?,
        max_ejection: field("max_ejection")?.extract()?,
        max_ejected_share: field("max_ejected_share")?.extract()?,
        latency_outlier: field("latency_outlier")?.extract()?,
    })
}

/// Removes a worker's share of the pool-wide health counts, for an entry just evicted.
fn forget(pool: &PoolHealth, removed: Option<&Entry>) {
    if let Some(health) = removed.and_then(|entry| entry.health.as_deref()) {
        pool.forget(health);
    }
}

#[pymethods]
impl WorkerPool {
    #[new]
    fn new() -> Self {
        Self {
            entries: GilLock::new(Entries::default()),
            addresses: AddressFilter::new(),
            dispatched: Tally::default(),
            times: DispatchTimes::default(),
            health: PoolHealth::default(),
            health_on: AtomicBool::new(false),
            events: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            pinned: AtomicU64::new(0),
            latency_mean: AtomicU64::new(f64::NAN.to_bits()),
            draws: Draws::unpredictable(),
        }
    }

    /// Admits the worker `metadata.uid`, or replaces its entry (keeping its position, load
    /// and health).
    fn add_worker(
        &self,
        metadata: &Bound<'_, PyAny>,
        connection: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let entry = entry_of(metadata, connection, self.health_on.load(Ordering::Relaxed))?;
        let mut entries = self.entries.write(metadata.py());
        let displaced = entries.put(entry);
        drop(entries);
        // the guard is gone: the displaced objects' finalizers may use the pool
        drop(displaced);
        Ok(())
    }

    /// Refreshes the entry of `metadata.uid` if it is pooled, keeping its load and health;
    /// otherwise changes nothing (a refresh never admits). Returns whether the worker was
    /// pooled.
    fn update_worker(
        &self,
        metadata: &Bound<'_, PyAny>,
        connection: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let entry = entry_of(metadata, connection, self.health_on.load(Ordering::Relaxed))?;
        let mut entries = self.entries.write(metadata.py());
        let refreshed = entries.refresh(entry);
        drop(entries);
        let pooled = refreshed.is_ok();
        // the guard is gone: the displaced (or refused) objects' finalizers may use the pool
        drop(refreshed);
        Ok(pooled)
    }

    /// Evicts the worker `metadata.uid`, forgetting its health; a no-op when it is not pooled.
    fn remove_worker(&self, metadata: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = metadata.py();
        if let Ok(record) = metadata.cast::<KeyedRecord>() {
            if let Some((_, key)) = record.get().kept() {
                // the key is at hand: no address lookup to spare reading it
                let removed = self.entries.write(py).remove(Who::Key(*key));
                forget(&self.health, removed.as_ref());
                // the guard is gone: the removed objects' finalizers may use the pool
                drop(removed);
                return Ok(());
            }
        }
        let uid = metadata.getattr(intern!(py, "uid"))?;
        let address = uid.as_ptr() as usize;
        let removed = if self.addresses.may_contain(address) {
            self.entries.write(py).remove(Who::Address(address))
        } else {
            None
        };
        let removed = match removed {
            Some(entry) => Some(entry),
            None => {
                let key = key_of(&uid)?;
                self.entries.write(py).remove(Who::Key(key))
            }
        };
        forget(&self.health, removed.as_ref());
        // the guard is gone: the removed objects' finalizers may use the pool
        drop(removed);
        Ok(())
    }

    /// `(metadata, connection)` of the worker `uid`; raises `KeyError` when it is not pooled
    /// or is ejected.
    pub(crate) fn entry<'py>(&self, uid: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
        let py = uid.py();
        let missing = || missing_key(uid.clone().unbind());
        let pair = self.with_visible(uid, |entry| entry.pair(py));
        let pair = pair.map_err(|_| missing())?.ok_or_else(missing)?;
        PyTuple::new(py, pair)
    }

    /// `(metadata, connection)` of the worker `uid`, ejected or not; None when it is not
    /// pooled (the proxy's bookkeeping, not a balancer's read).
    fn pooled<'py>(&self, uid: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let py = uid.py();
        match self.with_entry(uid, |_, entry| entry.pair(py))? {
            Some(pair) => Ok(Some(PyTuple::new(py, pair)?)),
            None => Ok(None),
        }
    }

    /// `(uid, metadata, connection)` of every pooled worker, ejected or not, in admission
    /// order (a snapshot).
    fn members<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let members: Vec<[Py<PyAny>; 3]> = self
            .entries
            .read(py)
            .live()
            .map(|entry| {
                let [metadata, connection] = entry.pair(py);
                [entry.uid.clone_ref(py), metadata, connection]
            })
            .collect();
        let members = members
            .into_iter()
            .map(|member| PyTuple::new(py, member))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, members)
    }

    /// `(metadata, connection)` of the worker `uid`, counting one more dispatch in flight to
    /// it; raises `KeyError` when it is not pooled or is ejected. Pair with `end_dispatch`,
    /// which reports no outcome: such a dispatch is never a probe.
    fn begin_dispatch<'py>(&self, uid: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
        let py = uid.py();
        // the stuck rule needs to know when a worker stopped being idle
        let now = if self.health_on.load(Ordering::Relaxed) {
            self.now()
        } else {
            0
        };
        let pair = self.with_visible(uid, |entry| {
            entry.begin(py, now);
            entry.pair(py)
        });
        let missing = || missing_key(uid.clone().unbind());
        let pair = pair.map_err(|_| missing())?.ok_or_else(missing)?;
        PyTuple::new(py, pair)
    }

    /// A dispatch to `uid` that took `seconds` has ended, however it ended; a no-op when the
    /// worker has left.
    fn end_dispatch(&self, uid: &Bound<'_, PyAny>, seconds: f64) -> PyResult<()> {
        let now = self.now();
        self.with_entry(uid, |_, entry| self.sampled(entry, seconds, now))?;
        Ok(())
    }

    /// `(metadata, connection, started)` of the worker `uid`, counting one more dispatch in
    /// flight to it, where `started` is an opaque reading of the pool's clock; raises
    /// `KeyError` when it is not pooled or is ejected (or, with health on, is found stuck now
    /// and ejected). Pair with `finish_dispatch(uid, started, outcome)`, which times the
    /// dispatch: the caller reads no clock. With health on, the first such dispatch to a
    /// worker on probation is its probe.
    fn start_dispatch<'py>(&self, uid: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
        let py = uid.py();
        let now = self.now();
        let sight = Sight {
            check: self.health.any_unhealthy(),
            now,
        };
        let pair = self.with_entry(uid, |entries, entry| {
            if !sight.sees(entry) || !self.hand_out(py, entries, entry, now, true) {
                return None;
            }
            entry.begin(py, now);
            Some(entry.pair(py))
        });
        let missing = || missing_key(uid.clone().unbind());
        let [metadata, connection] = pair.map_err(|_| missing())?.flatten().ok_or_else(missing)?;
        (metadata, connection, self.times.stamp(now, true)).into_pyobject(py)
    }

    /// Runs the periodic health rules now (the stuck rule over every worker, the latency
    /// outliers when due), as a `finish_dispatch` does; returns `(pending, busy)`: whether
    /// health events wait to be drained, and whether any worker has dispatches in flight.
    /// `(False, False)` before `configure_health`. For a timer of the caller's: when a
    /// stalled worker holds every caller, no dispatch ends or starts to run the rules until
    /// their deadlines; with nothing in flight, nothing can be stuck, and the timer may wait
    /// longer.
    fn check_health(&self, py: Python<'_>) -> (bool, bool) {
        if !self.health_on.load(Ordering::Relaxed) {
            return (false, false);
        }
        let now = self.now();
        let busy = {
            let entries = self.entries.read(py);
            if let Some(policy) = &entries.policy {
                self.check_all(py, &entries, policy, now);
            }
            let busy = entries.live().any(|entry| entry.estimate(py).0 > 0);
            busy
        };
        (self.pending.load(Ordering::Relaxed), busy)
    }

    /// The dispatch to `uid` begun by `start_dispatch` or a counted `dispatch_next` (which
    /// returned `started`) has ended with `outcome` (an `OUTCOME_*` code: success, the
    /// default, also when the handler raised; failure of the transport; a missed deadline;
    /// neutral, when the caller cancelled). Its latency is the time since, on the pool's
    /// clock, and goes into the worker's load (a no-op when the worker has left; a deadline
    /// or neutral outcome leaves the average alone, as the time was the caller's) and, once
    /// `time_dispatches` was called, into the pool's histogram (even if it has left), unless
    /// `dispatch_next` timed it for health alone (`DispatchTimes::stamp`). With
    /// health on, the outcome feeds the worker's health and the pool's periodic checks run
    /// when due. Returns whether health events wait for `drain_health_events`.
    ///
    /// A token dispatch (`dispatch_next` returned a token and `started` 0) reports here,
    /// with `started` 0 and once its caller has let the token go, only an outcome other than
    /// a success: it was never timed, so only health hears of it.
    #[pyo3(signature = (uid, started, outcome = 0))]
    fn finish_dispatch(&self, uid: &Bound<'_, PyAny>, started: u64, outcome: u8) -> PyResult<bool> {
        let py = uid.py();
        let outcome = Outcome::of(outcome).ok_or_else(|| {
            raise(
                py,
                Error::Value(format!("outcome must be 0, 1, 2 or 3, not {outcome}")),
            )
        })?;
        let now = self.now();
        let timed = started != 0;
        let seconds = seconds_between(started, now);
        if timed && self.times.observes(started) {
            self.times.observe(seconds);
        }
        self.with_entry(uid, |entries, entry| {
            match outcome {
                _ if !timed => {
                    if let (Some(health), Some(_), false) =
                        (&entry.health, &entry.token, outcome == Outcome::Success)
                    {
                        health.token_missed();
                    }
                }
                Outcome::Success | Outcome::Failure => self.sampled(entry, seconds, now),
                Outcome::Deadline | Outcome::Neutral => entry.load.leave(),
            }
            let (Some(health), Some(policy)) = (&entry.health, &entries.policy) else {
                return;
            };
            // the successes before this outcome count first
            self.settle(py, entry, now);
            let pooled = entries.index.len();
            // a token dispatch's success is counted once its token is let go, not here
            let finished = (timed || outcome != Outcome::Success)
                .then(|| health.finish(outcome, started, now, policy, &self.health, pooled));
            if let Some(transition) = finished.flatten() {
                self.record(py, entry, transition);
            }
            self.check_all(py, entries, policy, now);
        })?;
        Ok(self.pending.load(Ordering::Relaxed))
    }

    /// With health on, of the uncounted dispatches `dispatch_next` hands a fast, healthy
    /// worker (see `dispatch_next`), one in this many is timed; the others are token
    /// dispatches.
    #[classattr]
    #[allow(non_snake_case)]
    fn HEALTH_TIMED_EVERY() -> u64 {
        shardline_core::pool::health::TIMED_EVERY
    }

    /// The outcome codes of `finish_dispatch`.
    #[classattr]
    #[allow(non_snake_case)]
    fn OUTCOME_SUCCESS() -> u8 {
        0
    }

    #[classattr]
    #[allow(non_snake_case)]
    fn OUTCOME_FAILURE() -> u8 {
        1
    }

    #[classattr]
    #[allow(non_snake_case)]
    fn OUTCOME_DEADLINE() -> u8 {
        2
    }

    #[classattr]
    #[allow(non_snake_case)]
    fn OUTCOME_NEUTRAL() -> u8 {
        3
    }

    /// The dispatch `dispatch_next` handed out uncounted but timed (a nonzero `started`) has
    /// ended, however it ended: its latency goes into the pool's histogram, and nowhere else
    /// (it was never counted in flight, so no worker's load or health changes).
    fn observe_dispatch(&self, started: u64) {
        self.times.observe(seconds_between(started, self.now()));
    }

    /// From now on, `finish_dispatch` also counts each latency in the pool's histogram
    /// (`dispatch_counts`), and `dispatch_next` times one in `DISPATCH_SAMPLE` of the
    /// dispatches it hands out uncounted. Idempotent; there is no turning it off.
    fn time_dispatches(&self) {
        self.times.turn_on();
    }

    /// `(dispatched, latency)`: how many dispatches `dispatch_next` and `dispatch_less_loaded`
    /// handed out, and the
    /// latencies `finish_dispatch` and `observe_dispatch` saw since `time_dispatches` as
    /// `(counts, sum)`, where
    /// `counts[i]` is the number of dispatches that took at most `DISPATCH_BUCKETS[i]` seconds
    /// and more than the bound before it, the last count those above every bound, and `sum`
    /// their total in seconds; latency is None before `time_dispatches`.
    ///
    /// Implementation notes:
    ///     Counted in the pool, on the calls a dispatch makes anyway: one plain add each (see
    ///     `Tally`), and the clock only in `start_dispatch`, a counted or sampled
    ///     `dispatch_next`, `finish_dispatch` and `observe_dispatch`.
    #[allow(clippy::type_complexity)]
    fn dispatch_counts(&self) -> (u64, Option<(Vec<u64>, f64)>) {
        (self.dispatched.get(), self.times.read())
    }

    /// The upper bounds, in seconds, of the buckets of `dispatch_counts` (a last bucket takes
    /// everything above).
    #[classattr]
    #[allow(non_snake_case)]
    fn DISPATCH_BUCKETS() -> Vec<f64> {
        BOUNDS.to_vec()
    }

    /// Of the dispatches `dispatch_next` hands out uncounted, the latency histogram times one
    /// in this many, once `time_dispatches` was called: the pool's `DISPATCH_SAMPLE`th,
    /// `2 * DISPATCH_SAMPLE`th… (counting every dispatch it handed out since it was made).
    #[classattr]
    #[allow(non_snake_case)]
    fn DISPATCH_SAMPLE() -> u64 {
        SAMPLE_EVERY
    }

    /// The next visible pooled worker of the pool's rotation that is not in `tried` (any
    /// iterable of uids), moving the rotation past it; None when every visible worker is in
    /// `tried`.
    ///
    /// The rotation is a cursor over admission order, shared by every caller on this pool:
    /// successive calls go round the pool, a worker admitted later takes its turn when the
    /// cursor reaches it, and an evicted or ejected one is skipped.
    #[pyo3(signature = (tried = None))]
    pub(crate) fn next_in_rotation<'py>(
        &self,
        py: Python<'py>,
        tried: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Py<PyAny>>> {
        let skip = self.keys_of(tried)?;
        let sight = self.sight();
        let entries = self.entries.read(py);
        let uid = entries
            .next_in_rotation(|entry| {
                (!skip.is_empty() && skip.contains(&entry.key)) || !sight.sees(entry)
            })
            .map(|entry| entry.uid.clone_ref(py));
        Ok(uid)
    }

    /// The visible pooled uids in the order `next_in_rotation` would hand them out from where
    /// the rotation stands now, without moving it (a snapshot: a concurrent caller may move
    /// it).
    fn rotation_order<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let sight = self.sight();
        let uids: Vec<Py<PyAny>> = {
            let entries = self.entries.read(py);
            entries
                .rotation_order()
                .filter(|entry| sight.sees(entry))
                .map(|entry| entry.uid.clone_ref(py))
                .collect()
        };
        PyList::new(py, uids)
    }

    /// `(uid, metadata, connection, started, token)` of the next visible pooled worker of
    /// the rotation not in `tried`, as `next_in_rotation` picks it, in one call; None when
    /// there is none. Either way a worker handed out counts as one dispatch in
    /// `dispatch_counts`.
    ///
    /// A timed dispatch is counted in flight, `started` is a reading of the pool's clock for
    /// `finish_dispatch`, and `token` is None: every dispatch with `count`; with health on,
    /// also every one to a worker on probation (it is its probe), to a worker with no latency
    /// average yet or one above `stuck_floor / stuck_multiple` (where the stuck rule's
    /// threshold depends on it), one in `HEALTH_TIMED_EVERY` to a faster worker, and the
    /// latency histogram's samples. With health on, a worker found stuck when a timed
    /// dispatch hands it out is ejected and passed over.
    ///
    /// With health on, any other is a token dispatch: `started` is 0 and `token` the worker's
    /// dispatch token, which the caller holds while the call is in flight and lets go of when
    /// it ends (every reference to it is a call in flight); a token dispatch that does not
    /// succeed is then reported as `finish_dispatch(uid, 0, outcome)`, and one that succeeds
    /// not at all. It reads no clock and makes no second call.
    ///
    /// With health off and no `count`, nothing is counted in flight, `token` is None, and
    /// `started` is 0 unless the dispatch is one the latency histogram samples (after
    /// `time_dispatches`, one in `DISPATCH_SAMPLE`), when it is a nonzero reading for
    /// `observe_dispatch`.
    #[pyo3(signature = (tried = None, count = false))]
    fn dispatch_next<'py>(
        &self,
        py: Python<'py>,
        tried: Option<&Bound<'py, PyAny>>,
        count: bool,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let skip = self.keys_of(tried)?;
        let health_on = self.health_on.load(Ordering::Relaxed);
        // the latency histogram's sample is the pool's next dispatch
        let sampled = self.times.samples(self.dispatched.get().wrapping_add(1));
        let mut now = if count { self.now() } else { 0 };
        let entries = self.entries.read(py);
        let (entry, timed) = loop {
            // re-read each turn: a worker passed over just now is hidden from the next
            let check = self.health.any_unhealthy();
            if check && now == 0 {
                now = self.now();
            }
            let sight = Sight { check, now };
            let Some(entry) = entries.next_in_rotation(|entry| {
                (!skip.is_empty() && skip.contains(&entry.key)) || !sight.sees(entry)
            }) else {
                return Ok(None);
            };
            if !health_on {
                break (entry, count);
            }
            // With health on, the dispatch is timed when the caller counts it, for the
            // histogram's sample, when the worker is slow or new, when it is on probation (its
            // probe to claim) and on a fast worker's timed turns; otherwise it is a token
            // dispatch.
            let timed = count
                || sampled
                || entry.token.is_none()
                || entries
                    .policy
                    .as_ref()
                    .is_none_or(|policy| policy.times_all(entry.load.estimate().1))
                || entry
                    .health
                    .as_ref()
                    .is_none_or(|health| !health.healthy() || health.timed_turn());
            if !timed {
                break (entry, false);
            }
            if now == 0 {
                now = self.now();
            }
            if self.hand_out(py, &entries, entry, now, true) {
                break (entry, true);
            }
        };
        let token = match (&entry.health, &entry.token) {
            _ if timed => {
                entry.begin(py, now);
                None
            }
            (Some(health), Some(token)) if health_on => {
                health.token_handed();
                Some(token.clone_ref(py))
            }
            _ => None,
        };
        self.dispatched.add(1);
        let uid = entry.uid.clone_ref(py);
        let [metadata, connection] = entry.pair(py);
        drop(entries);
        let started = if timed {
            // with health on, a dispatch timed for health alone stays out of the histogram
            self.times.stamp(now, count || sampled)
        } else if sampled && !health_on {
            if now == 0 {
                self.now()
            } else {
                now
            }
        } else {
            0
        };
        Ok(Some(
            (uid, metadata, connection, started, token).into_pyobject(py)?,
        ))
    }

    /// The live, read-only view uid → `(metadata, connection)` of this pool's visible
    /// workers, in admission order (see `WorkersView`).
    #[getter]
    fn workers(slf: &Bound<'_, Self>) -> WorkersView {
        WorkersView::of(slf)
    }

    /// `(dispatches in flight, latency in seconds)` of the worker `uid`, the latency its
    /// average moved toward the pool's mean latency the longer ago its last sample came
    /// (halfway after 0.1 s), or the pool's mean before its first (0.0 while the pool has
    /// none); `(0, 0.0)` for a worker not pooled or ejected. What least-loaded weighs.
    fn load(&self, uid: &Bound<'_, PyAny>) -> PyResult<(u32, f64)> {
        let py = uid.py();
        let (now, mean) = (self.now(), self.latency_mean());
        Ok(self
            .with_visible(uid, |entry| entry.weighed(py, now, mean))?
            .unwrap_or((0, 0.0)))
    }

    /// Of the pooled workers at positions `first` and `second` of the admission order, the uid
    /// of the one with the lower cost, `latency x (dispatches in flight + 1)` as `load(uid)`
    /// reads them (ties: fewer in flight, then `first`); None when a position is past the
    /// last worker.
    /// Positions count every pooled worker, as `len(pool)` does: one that falls on an ejected
    /// worker stands for the next visible one after it (round the admission order), and None
    /// comes back when none is visible. `LeastLoadedLoadBalancer`'s draw in one call, without
    /// listing the pool.
    fn less_loaded_of(&self, py: Python<'_>, first: usize, second: usize) -> Option<Py<PyAny>> {
        let sight = self.sight();
        let now = if sight.check { sight.now } else { self.now() };
        let entries = self.entries.read(py);
        let pick = self.less_loaded(py, &entries, sight, now, (first, second))?;
        Some(pick.uid.clone_ref(py))
    }

    /// `(uid, metadata, connection, started, None)` of the worker `less_loaded_of` picks at
    /// two positions the pool draws at random (two distinct ones, or `(0, 0)` for one worker),
    /// its dispatch started as `start_dispatch` starts one (counted in flight, `started` a
    /// reading of the pool's clock for `finish_dispatch`; with health on, the first dispatch
    /// to a worker on probation is its probe, and a worker found stuck is ejected); None when
    /// no worker is visible. A worker the pool cannot hand out now (found stuck, or its probe
    /// taken meanwhile) is hidden from then on, and the pool draws again. Counts one dispatch
    /// in `dispatch_counts`. The same shape as `dispatch_next`'s answer (the last item, its
    /// token, is always None): the proxy's native first attempt for least-loaded.
    ///
    /// Implementation notes:
    ///     The positions come from the pool's own generator ([`Draws`], one atomic add), which
    ///     `next_draw` reads without moving; the draw, the comparison and the start of the
    ///     dispatch are one call and one read lock, where the Python path made a `select`
    ///     frame, two `randrange`, `less_loaded_of` and `start_dispatch`.
    fn dispatch_less_loaded<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let now = self.now();
        let entries = self.entries.read(py);
        let entry = loop {
            // re-read each turn: a worker passed over just now is hidden from the next
            let sight = Sight {
                check: self.health.any_unhealthy(),
                now,
            };
            let positions = two_positions(self.draws.next(), entries.index.len());
            let Some(entry) = self.less_loaded(py, &entries, sight, now, positions) else {
                return Ok(None);
            };
            if self.hand_out(py, &entries, entry, now, true) {
                break entry;
            }
        };
        entry.begin(py, now);
        self.dispatched.add(1);
        let uid = entry.uid.clone_ref(py);
        let [metadata, connection] = entry.pair(py);
        drop(entries);
        Ok(Some(
            (
                uid,
                metadata,
                connection,
                self.times.stamp(now, true),
                py.None(),
            )
                .into_pyobject(py)?,
        ))
    }

    /// The two positions the next `dispatch_less_loaded` would draw with the pool as it is
    /// now (`(0, 0)` while fewer than two workers are pooled), without moving the pool's
    /// generator: what `explain` shows. A concurrent caller may draw first.
    fn next_draw(&self, py: Python<'_>) -> (usize, usize) {
        let count = self.entries.read(py).index.len();
        two_positions(self.draws.peek(), count)
    }

    /// The visible pooled uids, in admission order (a snapshot; `members()` lists every
    /// pooled worker).
    pub(crate) fn uids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let sight = self.sight();
        let uids: Vec<Py<PyAny>> = self
            .entries
            .read(py)
            .live()
            .filter(|entry| sight.sees(entry))
            .map(|entry| entry.uid.clone_ref(py))
            .collect();
        PyList::new(py, uids)
    }

    /// Whether `uid` is pooled, ejected or not.
    pub(crate) fn __contains__(&self, uid: &Bound<'_, PyAny>) -> bool {
        self.with_entry(uid, |_, _| ())
            .is_ok_and(|found| found.is_some())
    }

    /// How many workers are pooled, ejected or not.
    pub(crate) fn __len__(&self, py: Python<'_>) -> usize {
        self.entries.read(py).index.len()
    }

    /// Turns passive health on with `policy` (a `shardline.pool.health.HealthPolicy`), or
    /// replaces the policy in force; the workers' health so far is kept.
    fn configure_health(&self, policy: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = policy.py();
        let policy = policy_of(policy)?;
        let now = self.now();
        // the tokens are made before the lock is taken; a worker admitted meanwhile without
        // one has its dispatches timed
        let untokened = self
            .entries
            .read(py)
            .live()
            .filter(|e| e.token.is_none())
            .count();
        let mut tokens = (0..untokened)
            .map(|_| Py::new(py, DispatchToken))
            .collect::<PyResult<Vec<_>>>()?;
        let mut entries = self.entries.write(py);
        for entry in entries.slots.iter_mut().flatten() {
            // calls already in flight count as started now
            entry
                .health
                .get_or_insert_with(|| Box::new(WorkerHealth::new(now)));
            if entry.token.is_none() {
                entry.token = tokens.pop();
            }
        }
        entries.policy = Some(policy);
        drop(entries);
        self.health.restart();
        self.health_on.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// The health of the worker `uid` as a `shardline.pool.health.WorkerHealth`, ejected or
    /// not; None when it is not pooled or health was never configured.
    fn health<'py>(&self, uid: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = uid.py();
        let now = self.now();
        let read = self.with_entry(uid, |entries, entry| {
            let (health, policy) = (entry.health.as_ref()?, entries.policy.as_ref()?);
            self.settle(py, entry, now);
            let state = health.state(now);
            let (consecutive, success, times, reason) = health.read(now, policy);
            let (inflight, latency) = entry.read(py);
            let left = match state {
                State::Ejected { left_ns } => left_ns as f64 * 1e-9,
                _ => 0.0,
            };
            Some((
                state.name(),
                consecutive,
                inflight,
                latency,
                success,
                times,
                left,
                reason,
            ))
        })?;
        let Some(fields) = read.flatten() else {
            return Ok(None);
        };
        let class = WORKER_HEALTH.import(py, HEALTH_MODULE, "WorkerHealth")?;
        class.call1(fields).map(Some)
    }

    /// `(ejections, re-admissions, workers ejected now)`, where ejected now counts those on
    /// probation too (not yet re-admitted), as the cap on ejections does.
    fn health_counts(&self) -> (u64, u64, usize) {
        self.health.counts()
    }

    /// The health events since the last call, oldest first, each
    /// `(uid, metadata, kind, reason, seconds)`: kind "ejected" (reason why, seconds the
    /// ejection's length) or "readmitted" (reason "", seconds 0.0).
    fn drain_health_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = {
            let mut events = self.events.lock();
            self.pending.store(false, Ordering::Relaxed);
            std::mem::take(&mut *events)
        };
        let events = events
            .into_iter()
            .map(|event| {
                let (kind, reason, seconds) = match event.transition {
                    Transition::Ejected { reason, seconds } => ("ejected", reason.name(), seconds),
                    Transition::Readmitted => ("readmitted", "", 0.0),
                };
                (event.uid, event.metadata, kind, reason, seconds).into_pyobject(py)
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, events)
    }

    /// Pins the pool's clock at `ns` nanoseconds (a positive time), or unpins it with None:
    /// the tests' seam for time. Only for tests: readings taken before and after pinning are
    /// not comparable.
    #[pyo3(signature = (ns, /))]
    fn _pin_clock(&self, py: Python<'_>, ns: Option<u64>) -> PyResult<()> {
        if ns == Some(0) || ns.is_some_and(|ns| ns >= 1 << 62) {
            return Err(raise(
                py,
                Error::Value(format!(
                    "the pinned clock must be in 1..2**62 ns, not {ns:?}"
                )),
            ));
        }
        self.pinned.store(ns.unwrap_or(0), Ordering::Relaxed);
        Ok(())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // The collector runs with every other thread stopped; a writer holding the lock now
        // would be mid-operation, and its objects are also reachable from its own frame.
        if let Some(entries) = self.entries.try_read() {
            for entry in entries.live() {
                visit.call(&entry.uid)?;
                visit.call(&entry.metadata)?;
                visit.call(&entry.connection)?;
            }
        }
        if let Some(events) = self.events.try_lock() {
            for event in events.iter() {
                visit.call(&event.uid)?;
                visit.call(&event.metadata)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        // the collector calls this attached (under the GIL), with no token to show for it
        let entries = Python::attach(|py| std::mem::take(&mut *self.entries.write(py)));
        self.health.reset();
        let events = std::mem::take(&mut *self.events.lock());
        self.pending.store(false, Ordering::Relaxed);
        // the guards are gone: the entries' finalizers may use the pool
        drop(entries);
        drop(events);
    }
}
