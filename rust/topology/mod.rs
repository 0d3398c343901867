//! `Topology`: instances, replicasets and per-tier bucket maps, kept from topology events, and
//! routing of keys to the master instance of the replicaset that owns their bucket.
//!
//! The lock rule: no Python code runs while `Topology::state` is locked, in either mode. Any
//! allocation of a Python object can start a garbage-collection pass, and dropping the last
//! reference to one can run its finalizer; either may call back into this topology, and would
//! then wait forever for the lock its own thread (or one it waits for) holds. So: Python
//! objects are made before the lock is taken, or after it is released from references copied
//! under it (`clone_ref` runs no code); errors are raised after the guard is released; and
//! every value a writer takes out of the state goes into a `Displaced` that outlives the guard.
//!
//! This file is the class and its Python methods, each a few lines over the files that do the
//! work: `state.rs` (what the lock guards), `apply.rs` (events), `route.rs` (lookups),
//! `snapshot.rs` (whole-map snapshots).

mod apply;
pub mod bucket_range;
pub mod events;
pub mod explanation;
pub mod instance;
pub mod map_stats;
pub mod payload;
pub mod replicaset;
mod route;
pub mod route_stats;
mod snapshot;
mod state;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyMapping, PyString};
use rustc_hash::FxHashMap;

use crate::py::errors::{raise, Error};
use crate::py::int_arrays::BucketId;
use bucket_range::BucketRange;
use explanation::RouteExplanation;
use instance::Instance;
use map_stats::MapStats;
use payload::BucketPayload;
use replicaset::Replicaset;
use route::lookup_text;
use route_stats::RouteStats;
use snapshot::{copy_ranges, snapshot_tier, RangeCopy};
use state::{no_range, now, State};

/// The client's converged view of a Picodata cluster, and the router built on it.
///
/// A topology holds the static tier configuration (name → bucket count, set once by
/// `apply_tiers`), the instances and replicasets the cluster has announced, and per tier a map
/// of inclusive bucket ranges → owning replicaset. Events keep it current; whenever an event
/// makes a tier's map untrustworthy the map is cleared, so a lookup answers `None` ("unknown,
/// refresh") rather than a stale owner, until bucket events fill it again.
///
/// All methods are safe to call from many threads at once, and from finalizers; each event is
/// applied atomically, and readers see the map either wholly before or wholly after it.
///
/// Implementation notes:
///     Each map is a sorted vector of disjoint ranges. Lookups read two tables derived from it
///     on the first lookup after a change: bucket → range, and range → master instance. Writers
///     take an exclusive lock only after the event has been read and validated, so a malformed
///     event never leaves anything half-applied. No Python code runs while a lock is held:
///     results are built from references copied under the lock, replaced values are released
///     after it, so a finalizer may call the topology at any time.
#[pyclass(frozen, module = "shardline", name = "Topology")]
pub struct Topology {
    bucket_counts: OnceLock<FxHashMap<Box<str>, u32>>,
    state: RwLock<State>,
    /// Bumped under the write lock by every change of `instances` or `replicasets`, so a
    /// reader that sees a value and then takes the read lock sees at least that state.
    membership: AtomicU64,
}

#[pymethods]
impl Topology {
    #[new]
    fn new() -> Self {
        Self {
            bucket_counts: OnceLock::new(),
            state: RwLock::new(State::default()),
            membership: AtomicU64::new(0),
        }
    }

    /// Sets the static tier configuration, tier name → bucket count, and registers each tier.
    ///
    /// The configuration is set once; later calls change nothing and return False. Raises
    /// `InvalidEvent` for an empty name, a count that is not an int (a bool is refused) or is
    /// outside 0..2**32 - 1, or a count smaller than a range already mapped in that tier. From
    /// then on, a bucket event or snapshot of a tier not configured here raises `UnknownTier`.
    ///
    /// A count of 0 configures a tier without buckets (Picodata's "arbiter" tier, which holds
    /// members but no sharded data): its replicasets and instances are kept like any other,
    /// its map stays empty, `tiers` shows it with 0, and routing in it (`bucket_id`, `route`,
    /// `route_many`, `owner`, `owners`, `find_bucket_master`) raises `TierWithoutBuckets`, as
    /// does a bucket event or a snapshot holding a range for it (an empty snapshot changes
    /// nothing).
    fn apply_tiers(&self, py: Python<'_>, tiers: &Bound<'_, PyMapping>) -> PyResult<bool> {
        self.configure_tiers(py, tiers)
    }

    /// Tier name → bucket count, as set by `apply_tiers` (empty before); 0 for a tier without
    /// buckets.
    #[getter]
    fn tiers(&self) -> FxHashMap<String, u32> {
        self.bucket_counts
            .get()
            .into_iter()
            .flatten()
            .map(|(name, &count)| (name.to_string(), count))
            .collect()
    }

    /// Instance uuid → `Instance`, a snapshot copy.
    #[getter]
    fn instances<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let objects: Vec<Py<Instance>> = self
            .state
            .read()
            .instances
            .values()
            .map(|object| object.clone_ref(py))
            .collect();
        by_uuid(py, objects, |instance| &instance.uuid)
    }

    /// Replicaset uuid → `Replicaset`, a snapshot copy.
    #[getter]
    fn replicasets<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let objects: Vec<Py<Replicaset>> = self
            .state
            .read()
            .replicasets
            .values()
            .map(|entry| entry.object.clone_ref(py))
            .collect();
        by_uuid(py, objects, |replicaset| &replicaset.uuid)
    }

    /// Tier → its ranges as `(start, end, replicaset_uuid)` sorted by start, a snapshot copy.
    #[getter]
    fn bucket_maps<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let tiers: Vec<(Py<PyString>, RangeCopy)> = self
            .state
            .read()
            .tiers
            .iter()
            .map(|tier| (tier.name.clone_ref(py), copy_ranges(py, &tier.map)))
            .collect();
        let out = PyDict::new(py);
        for (name, ranges) in tiers {
            out.set_item(name, PyList::new(py, ranges)?)?;
        }
        Ok(out)
    }

    /// The ranges of `tier` as `(start, end, replicaset_uuid)`, sorted by start.
    fn ranges<'py>(
        &self,
        py: Python<'py>,
        tier: &Bound<'py, PyString>,
    ) -> PyResult<Bound<'py, PyList>> {
        let ranges = self.read_tier(tier, |_, known| copy_ranges(py, &known.map))?;
        PyList::new(py, ranges)
    }

    /// A counter that moves on every change of `tier`'s map and never otherwise: a decision made
    /// at one epoch was made on a superseded map if the epoch has moved since.
    fn epoch(&self, tier: &Bound<'_, PyString>) -> PyResult<u64> {
        self.read_tier(tier, |_, known| known.map.epoch())
    }

    /// `tier`'s map counted over its life: epoch, ranges, clears by cause, time spent empty
    /// (see `MapStats`). Raises `UnknownTier` for a tier not configured.
    ///
    /// Implementation notes:
    ///     The counters are kept where the map changes; this copies them under the read lock
    ///     and builds the result after it, so reading them costs the lookups nothing.
    fn map_stats(&self, tier: &Bound<'_, PyString>) -> PyResult<MapStats> {
        let now = now();
        let (epoch, ranges, history) = self.read_tier(tier, |_, known| {
            (
                known.map.epoch(),
                known.map.ranges().len(),
                known.map.history().clone(),
            )
        })?;
        MapStats::new(tier.py(), lookup_text(tier)?, epoch, ranges, &history, now)
    }

    /// `tier`'s lookups counted since the topology was made: keys and buckets looked up, and
    /// those answered None by reason (see `RouteStats`). Raises `UnknownTier` for a tier not
    /// configured.
    ///
    /// Implementation notes:
    ///     The lookups add to counters beside the tier's map; this copies them under the read
    ///     lock and builds the result after it.
    fn route_stats(&self, tier: &Bound<'_, PyString>) -> PyResult<RouteStats> {
        let (routes, misses) = self.read_tier(tier, |_, known| known.routes.read())?;
        RouteStats::new(tier.py(), lookup_text(tier)?, routes, misses)
    }

    /// Forgets every instance, replicaset and bucket range, as one change: readers see the
    /// whole view or none of it. The tier configuration stays. A source calls this before
    /// rebuilding from a fresh snapshot (after a reconnect). Returns whether anything was known.
    fn clear(&self) -> bool {
        self.forget_all()
    }

    /// Applies an `InstanceEvent`, a `ReplicasetEvent` or a `BucketEvent`, by the rules of
    /// `apply_instance`, `apply_replicaset` and `apply_bucket`.
    ///
    /// Raises `InvalidEvent`, naming the field and the value, for a malformed event or an
    /// object that is no event, and `UnknownTier` (`TierWithoutBuckets` for a tier whose
    /// bucket count is 0) for a bucket event of a tier it cannot map; nothing of the event is
    /// applied then.
    fn apply(&self, event: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = event.py();
        match events::kind_of(event)? {
            Some(events::Kind::Instance) => self.apply_instance(event),
            Some(events::Kind::Replicaset) => self.apply_replicaset(event),
            Some(events::Kind::Bucket) => self.apply_bucket(event),
            None => Err(raise(
                py,
                Error::InvalidEvent(format!(
                    "not a topology event: {}",
                    event.get_type().name()?
                )),
            )),
        }
    }

    /// Replace upserts the fields the event gives (None leaves a field unchanged); delete
    /// removes the instance. Instances never affect bucket maps.
    fn apply_instance(&self, event: &Bound<'_, PyAny>) -> PyResult<()> {
        let change = events::instance_change(event)?;
        self.apply_instance_change(event.py(), change)
    }

    /// Keeps the replicaset and clears bucket maps that can no longer be trusted:
    ///
    /// - delete removes the replicaset and clears its tier's map;
    /// - replace of a replicaset not yet known registers it and clears its tier's map (a new
    ///   member may take buckets from any other); `tier` is required then;
    /// - replace of a known replicaset updates the given fields and leaves maps alone, unless
    ///   its tier changed: then both the old and the new tier's maps are cleared.
    fn apply_replicaset(&self, event: &Bound<'_, PyAny>) -> PyResult<()> {
        let change = events::replicaset_change(event)?;
        self.apply_replicaset_change(event.py(), change)
    }

    /// Applies one bucket event to its tier's map.
    ///
    /// Replace: if `[start, end]` overlaps any range of the tier other than an identical one
    /// (same bounds, same replicaset), the map is cleared first; then the range is upserted. An
    /// identical redelivery changes nothing. Delete removes the identical range, clears the map
    /// on a partial overlap, and is a no-op otherwise. Once `apply_tiers` has been called, an
    /// event of a tier it did not configure raises `UnknownTier`.
    fn apply_bucket(&self, event: &Bound<'_, PyAny>) -> PyResult<()> {
        let change = events::bucket_change(event, None)?;
        self.apply_bucket_change(event.py(), change)
    }

    /// Makes `tier`'s map exactly the given full poll, atomically.
    ///
    /// `events_or_rows` is the poll: `BucketEvent`s, rows of `SELECT _pico_bucket(tier)`
    /// (dicts), the JSON text (str or bytes) that query returns, or that text already read into
    /// a `BucketPayload` of this tier. Ranges absent from the snapshot are gone afterwards;
    /// readers see the old map or the new one, never a mix. A snapshot whose ranges overlap each
    /// other, name another tier, or break the tier's bounds — or text that `BucketPayload`
    /// refuses (not strict JSON, not an array, longer than 64 MiB, nested deeper than 128
    /// levels) — raises `InvalidEvent` and the old map stays; so does a `tier` that is empty or
    /// not valid text. Once `apply_tiers` has been called, a tier it did not configure raises
    /// `UnknownTier`. Returns whether the map changed (an unchanged poll leaves the epoch alone).
    ///
    /// Implementation notes:
    ///     Text (or a payload's text) equal to the last text applied to the tier, while nothing
    ///     else has changed the map since, is recognised without being read: a quiet cluster's
    ///     poll costs one comparison of the payload. Other text is streamed into ranges in Rust
    ///     (see `BucketPayload`), at a small fraction of its size in extra memory.
    fn apply_bucket_snapshot(
        &self,
        tier: &Bound<'_, PyString>,
        events_or_rows: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let py = tier.py();
        let tier = snapshot_tier(tier)?;
        self.check_configured(py, tier)?;
        if events_or_rows.is_instance_of::<PyString>()
            || events_or_rows.is_instance_of::<PyBytes>()
            || events_or_rows.is_instance_of::<BucketPayload>()
        {
            return self.apply_bucket_payload(tier, events_or_rows);
        }
        let ranges = self.snapshot_ranges(tier, events_or_rows)?;
        Ok(self.replace_tier(py, tier, ranges, None))
    }

    /// The uuid of the replicaset owning `bucket_id` in `tier`, or None when no range covers it.
    /// Raises `UnknownTier` for a tier never registered, `TierWithoutBuckets` for a tier
    /// configured with bucket_count 0, and `InvalidArgument` for a `bucket_id` that is not an
    /// int from 0 to 2**32 - 1 (a bool is not).
    fn owner(
        &self,
        tier: &Bound<'_, PyString>,
        bucket_id: BucketId,
    ) -> PyResult<Option<Py<PyString>>> {
        let py = tier.py();
        self.read_routable(tier, |_, known| {
            known.routes.routed(1);
            let found = known.map.lookup(bucket_id.0);
            if found.is_none() {
                known.routes.missed(no_range(known), 1);
            }
            found.map(|owner| owner.name.clone_ref(py))
        })
    }

    /// The master instance of the replicaset owning `bucket_id`, or None when the range, the
    /// replicaset, its master or the master instance is unknown. `bucket_id` as for `owner`.
    fn find_bucket_master(
        &self,
        tier: &Bound<'_, PyString>,
        bucket_id: BucketId,
    ) -> PyResult<Option<Py<Instance>>> {
        let py = tier.py();
        self.read_routable(tier, |state, known| {
            known.routes.routed(1);
            let slot = known.map.slot(bucket_id.0);
            let master = state.masters(py, known)[slot as usize].as_ref();
            if master.is_none() {
                known.routes.missed(state.miss_of(known, slot), 1);
            }
            master.map(|instance| instance.clone_ref(py))
        })
    }

    /// The bucket id of `key` (one value or a tuple of values) in `tier`, by the Picodata scheme.
    /// Raises `UnknownTier` for a tier not in `apply_tiers`, `TierWithoutBuckets` for one
    /// configured with bucket_count 0.
    fn bucket_id(&self, tier: &Bound<'_, PyString>, key: &Bound<'_, PyAny>) -> PyResult<u32> {
        self.key_bucket(tier, key)
    }

    /// The master instance that should serve `key` in `tier`: the bucket id and the lookup in one
    /// call. None when any link of the chain is unknown (see `find_bucket_master`).
    fn route(
        &self,
        tier: &Bound<'_, PyString>,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Py<Instance>>> {
        let bucket = self.key_bucket(tier, key)?;
        self.find_bucket_master(tier, BucketId(bucket))
    }

    /// `owner` for many bucket ids (a sequence of ints or a one-dimensional integer array), as a
    /// list. A bad id raises `InvalidArgument` naming it and its position, as does an array that
    /// is not one-dimensional.
    fn owners<'py>(
        &self,
        tier: &Bound<'py, PyString>,
        bucket_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.owners_of(tier, bucket_ids)
    }

    /// `route` for many keys (an iterable of keys, or a one-dimensional integer array), as a
    /// list of `Instance | None`. All keys are routed on the same map. An array that is not
    /// one-dimensional raises `InvalidArgument`.
    ///
    /// With `out` (a writable one-dimensional array of 32- or 64-bit integers, one item per key,
    /// such as `numpy.empty(len(keys), dtype=numpy.intp)`), the answer comes as indices instead:
    /// `out[i]` is set to the index, in the returned list, of the route of key `i`, and the list
    /// holds each distinct route once, in the order keys first reach it (None among them if some
    /// key has no master). So `[routes[j] for j in out]` equals `route_many(tier, keys)`, and
    /// `out == j` selects the keys that go to `routes[j]`. `out` is checked before any key is
    /// hashed (`InvalidArgument` if it is not such an array, or its length differs from the
    /// number of keys) and written only once every key is routed: a bad key or a bad `out`
    /// leaves it untouched.
    ///
    /// Implementation notes:
    ///     The keys are hashed to buckets first (an integer array lane-wise, see
    ///     `int_lanes.rs` (shardline-core)); under the read lock each bucket becomes its range's slot in the
    ///     tier's table of masters, and the references the answer needs are copied (increfs);
    ///     the list is built after the lock is released.
    #[pyo3(signature = (tier, keys, *, out = None))]
    fn route_many<'py>(
        &self,
        tier: &Bound<'py, PyString>,
        keys: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.route_keys(tier, keys, out)
    }

    /// The range of `tier` holding `bucket_id`, with where it came from, or None when no range
    /// covers it. Raises as `owner` does.
    ///
    /// The answer an operator needs when a request went to an unexpected node: the range's
    /// bounds and replicaset, the tier's map epoch right after the change that last set the
    /// range, that change's wall-clock time and kind (see `BucketRange`). A range repeated
    /// identically by a later snapshot or poll keeps its stamp; an overlapping bucket event or
    /// a cleared map sets the ranges that come after it anew.
    ///
    /// Implementation notes:
    ///     Stamps live in a vector beside the ranges (24 bytes per range), read only here;
    ///     `owner`, `route` and `route_many` never touch them. The clock is read once per
    ///     apply that may set ranges, before the lock.
    fn bucket_range(
        &self,
        tier: &Bound<'_, PyString>,
        bucket_id: BucketId,
    ) -> PyResult<Option<BucketRange>> {
        let found = self.read_tier(tier, |_, known| {
            known
                .map
                .range(bucket_id.0)
                .map(|(range, stamp)| (range.start, range.end, range.owner.uuid, *stamp))
        })?;
        Ok(found.map(|(start, end, owner, stamp)| BucketRange::of(start, end, owner, &stamp)))
    }

    /// Why `route(tier, key)` answers what it answers, as a `RouteExplanation`: the key's
    /// bucket, the range holding it and what last set that range, the owning replicaset, its
    /// master with the master's address and state, the tier's epoch, and, for a key that does
    /// not route, a reason and a sentence naming it (for a map left empty by a clear: the
    /// clear's cause, time and epoch). `explanation.routed` is what `route` returns on the same
    /// view, and `reason` is None exactly when it is an instance.
    ///
    /// Raises what `route` raises, before anything is read: `UnknownTier` for a tier not in
    /// `apply_tiers`, `TierWithoutBuckets` for one configured with bucket_count 0,
    /// `UnhashableKey` for a key the Picodata scheme cannot hash; the message says why.
    ///
    /// Implementation notes:
    ///     One read of the state under the read lock copies the chain (range and stamp,
    ///     replicaset, master, the master `route` reads from its table, the last clear); the
    ///     explanation is built from the copies after the lock is released. Clears are
    ///     recorded where maps are cleared, so `owner`, `route` and `route_many` pay nothing.
    fn explain(
        &self,
        tier: &Bound<'_, PyString>,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<RouteExplanation> {
        self.explain_key(tier, key)
    }

    /// A counter that moves whenever an instance or a replicaset is added, changed (a replace
    /// whose fields differ from what was known) or deleted, and when `clear` forgets any; it
    /// does not move on bucket changes, nor on a replace that changes nothing. A cache derived
    /// from `instances`, `replicasets` or `replicaset_instances` is current while this has not
    /// moved since the cache was built (read it before reading them).
    ///
    /// Implementation notes:
    ///     An atomic, bumped under the write lock after the change: a reader that sees a value
    ///     and then reads the state sees that change or a later one.
    #[getter]
    fn membership_version(&self) -> u64 {
        self.membership.load(Ordering::Acquire)
    }

    /// The instances whose `replicaset_uuid` is `replicaset_uuid`, in every state, sorted by
    /// uuid: a snapshot copy, taken atomically. Empty when no instance names it (the
    /// replicaset need not be known). `replicaset_uuid` is a UUID in its canonical form, either
    /// case, or 32 bare hex digits; anything else raises `InvalidArgument`.
    ///
    /// Implementation notes:
    ///     An index replicaset → member uuids, kept by every instance write, makes this
    ///     O(members) rather than O(instances).
    fn replicaset_instances<'py>(
        &self,
        replicaset_uuid: &Bound<'py, PyString>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.members(replicaset_uuid)
    }

    fn __repr__(&self) -> String {
        let state = self.state.read();
        format!(
            "<Topology: {} tiers, {} replicasets, {} instances>",
            state.tiers.len(),
            state.replicasets.len(),
            state.instances.len()
        )
    }
}

/// `objects` (copied under the lock) as a dict by their uuids, built after it is released.
fn by_uuid<'py, T>(
    py: Python<'py>,
    objects: Vec<Py<T>>,
    uuid: impl Fn(&T) -> &String,
) -> PyResult<Bound<'py, PyDict>>
where
    T: pyo3::PyClass<Frozen = pyo3::pyclass::boolean_struct::True> + Sync,
{
    let out = PyDict::new(py);
    for object in objects {
        out.set_item(uuid(object.get()), &object)?;
    }
    Ok(out)
}
