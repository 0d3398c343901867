//! `Topology`: instances, replicasets and per-tier bucket maps, kept from topology events, and
//! routing of keys to the master instance of the replicaset that owns their bucket.
//!
//! The lock rule: no Python code runs while `Topology::state` is locked, in either mode. Any
//! allocation of a Python object can start a garbage-collection pass, and dropping the last
//! reference to one can run its finalizer; either may call back into this topology, and would
//! then wait forever for the lock its own thread (or one it waits for) holds. So: Python
//! objects are made before the lock is taken, or after it is released from references copied
//! under it (`clone_ref` runs no code); errors are raised after the guard is released; and
//! every value a writer takes out of the state goes into a [`Displaced`] that outlives the guard.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyMapping, PyString};
use rustc_hash::FxHashMap;

use crate::bucket_divisor::BucketDivisor;
use crate::bucket_map::{sort_snapshot, BucketMap, Range, SetBy, Setting};
use crate::bucket_payload::{self, BucketPayload};
use crate::bucket_range::BucketRange;
use crate::errors::{
    invalid_argument, invalid_event, quoted, repr, short_repr, tier_without_buckets, unknown_tier,
};
use crate::events::{self, BucketChange, InstanceChange, Op, Owner, ReplicasetChange};
use crate::instance::Instance;
use crate::int_arrays::{self, BucketId, IntArray};
use crate::int_key_lanes;
use crate::map_clear::{Clear, ClearCause};
use crate::map_stats::MapStats;
use crate::out_array::OutArray;
use crate::replicaset::Replicaset;
use crate::route_explanation::{Found, RouteExplanation};
use crate::route_stats::{Miss, RouteStats, RouteTally};
use crate::sharding::{bucket_of, with_scratch, DecimalFormat, KeyHasher};
use crate::uuid;

struct ReplicasetEntry {
    tier: Box<str>,
    master: Option<u128>,
    object: Py<Replicaset>,
}

/// One tier's bucket map, and the master instance serving each of its ranges.
struct Tier {
    /// Interned: tier names are few and are keys everywhere.
    name: Py<PyString>,
    map: BucketMap<Owner>,
    /// `masters.table[slot]` serves the range in `map.slot(bucket)` (`table[0]`, no range, is
    /// None): resolved once (replicaset → master → instance) by the first lookup after the map,
    /// a replicaset or an instance changed.
    masters: OnceLock<Masters>,
    /// The lookups of this tier and their misses (`Topology.route_stats`).
    routes: RouteTally,
    /// The JSON text of the last poll applied as text, valid while the map is at `epoch`.
    last_payload: Option<Payload>,
    /// False for a tier `apply_tiers` configured with bucket_count 0 (Picodata's "arbiter"
    /// tier): its map stays empty and routing in it raises `TierWithoutBuckets`.
    has_buckets: bool,
}

/// A tier's table of masters by slot, and what `route_many` needs to know whether any bucket
/// can miss.
struct Masters {
    table: Box<[Option<Py<Instance>>]>,
    /// Every range has a master instance.
    all_mastered: bool,
    /// Buckets from 1 up that the ranges cover: all of them when it equals the bucket count.
    covered: u64,
}

impl Masters {
    /// Whether a lookup of some bucket in `1..=bucket_count` can answer None.
    fn can_miss(&self, bucket_count: u32) -> bool {
        !self.all_mastered || self.covered != u64::from(bucket_count)
    }
}

struct Payload {
    text: Py<PyAny>,
    epoch: u64,
}

/// What a writer takes out of the state. Declared before the write guard, so that on every
/// path it is dropped after the guard: dropping a Python object may run its finalizer (an
/// owner or a poll text can be a str subclass with `__del__`), which may re-enter the topology.
#[derive(Default)]
struct Displaced {
    ranges: Vec<Range<Owner>>,
    masters: Vec<Masters>,
    objects: Vec<Py<PyAny>>,
}

impl Displaced {
    /// Makes `tier` resolve its masters again, keeping the table it had.
    fn forget_masters(&mut self, tier: &mut Tier) {
        if let Some(masters) = std::mem::take(&mut tier.masters).into_inner() {
            self.masters.push(masters);
        }
    }
}

#[derive(Default)]
struct State {
    instances: FxHashMap<u128, Py<Instance>>,
    /// Replicaset uuid → the uuids of the instances whose `replicaset_uuid` names it, sorted.
    /// Kept by every write of `instances` (see [`State::join`]); a replicaset nothing names has
    /// no entry. The replicaset itself need not be known.
    members: FxHashMap<u128, Vec<u128>>,
    replicasets: FxHashMap<u128, ReplicasetEntry>,
    /// Tiers are never removed, so an index into this vector stays valid for good.
    tiers: Vec<Tier>,
    tier_index: FxHashMap<Box<str>, usize>,
    /// The index of the tier a lookup by name found last. Callers usually pass the same
    /// interned literal every time: one identity check against this tier is cheaper than
    /// encoding and hashing the name.
    last_found: AtomicUsize,
}

impl State {
    /// Moves `instance` in [`members`](Self::members) from replicaset `from` to `to`.
    fn join(&mut self, instance: u128, from: Option<u128>, to: Option<u128>) {
        if from == to {
            return;
        }
        if let Some(from) = from {
            if let Some(members) = self.members.get_mut(&from) {
                if let Ok(at) = members.binary_search(&instance) {
                    members.remove(at);
                }
                if members.is_empty() {
                    self.members.remove(&from);
                }
            }
        }
        if let Some(to) = to {
            let members = self.members.entry(to).or_default();
            if let Err(at) = members.binary_search(&instance) {
                members.insert(at, instance);
            }
        }
    }

    /// The tier named `name`: one hash lookup, whatever the number of tiers.
    fn known_tier(&self, name: &str) -> Option<&Tier> {
        self.tier_index.get(name).map(|&index| &self.tiers[index])
    }

    /// The tier found last, if `name` is the very same object as its name.
    fn last_found(&self, name: &Bound<'_, PyString>) -> Option<&Tier> {
        let tier = self.tiers.get(self.last_found.load(Ordering::Relaxed))?;
        tier.name.is(name).then_some(tier)
    }

    /// [`known_tier`](Self::known_tier), remembering the tier found for [`last_found`](Self::last_found).
    fn find_tier(&self, name: &str) -> Option<&Tier> {
        let index = *self.tier_index.get(name)?;
        if self.last_found.load(Ordering::Relaxed) != index {
            self.last_found.store(index, Ordering::Relaxed);
        }
        Some(&self.tiers[index])
    }

    /// The index of the tier named `name`, registering it (with an empty map, under the
    /// `interned` name made before the lock was taken) if it is new.
    fn register_tier(
        &mut self,
        name: &str,
        interned: Py<PyString>,
        displaced: &mut Displaced,
    ) -> usize {
        if let Some(&index) = self.tier_index.get(name) {
            displaced.objects.push(interned.into_any());
            return index;
        }
        self.tiers.push(Tier {
            name: interned,
            map: BucketMap::default(),
            masters: OnceLock::new(),
            routes: RouteTally::default(),
            last_payload: None,
            has_buckets: true,
        });
        self.tier_index.insert(name.into(), self.tiers.len() - 1);
        self.tiers.len() - 1
    }

    /// Applies `edit` to the map of the tier at `index`; the masters resolved for the old map
    /// are dropped if the map changed. What the map lets go of goes to `displaced`.
    fn edit_map<R>(
        &mut self,
        index: usize,
        displaced: &mut Displaced,
        edit: impl FnOnce(&mut BucketMap<Owner>, &mut Vec<Range<Owner>>) -> R,
    ) -> R {
        let tier = &mut self.tiers[index];
        let epoch = tier.map.epoch();
        let result = edit(&mut tier.map, &mut displaced.ranges);
        if tier.map.epoch() != epoch {
            displaced.forget_masters(tier);
        }
        result
    }

    /// Clears the map of the tier named `name`, if it has one, recording `clear` as its last
    /// clear (see `Topology.explain`).
    fn clear_tier(&mut self, name: &str, clear: &Clear, displaced: &mut Displaced) {
        if let Some(&index) = self.tier_index.get(name) {
            self.edit_map(index, displaced, |map, out| map.clear(clear, out));
        }
    }

    /// A replicaset or an instance changed: every tier resolves its masters again. O(tiers).
    fn forget_masters(&mut self, displaced: &mut Displaced) {
        for tier in &mut self.tiers {
            displaced.forget_masters(tier);
        }
    }

    /// The master instance of the replicaset `owner`, if everything on the way is known.
    fn master_instance(&self, owner: &Owner) -> Option<&Py<Instance>> {
        let master = self.replicasets.get(&owner.uuid)?.master?;
        self.instances.get(&master)
    }

    /// The master instance serving each range of `tier`, by slot (see [`Tier::masters`]).
    fn masters<'a>(&'a self, py: Python<'_>, tier: &'a Tier) -> &'a [Option<Py<Instance>>] {
        &self.resolved(py, tier).table
    }

    /// [`masters`](Self::masters), with what `route_many` reads to skip looking for misses.
    fn resolved<'a>(&'a self, py: Python<'_>, tier: &'a Tier) -> &'a Masters {
        tier.masters.get_or_init(|| {
            let ranges = tier.map.ranges();
            let resolved = ranges.iter().map(|range| {
                self.master_instance(&range.owner)
                    .map(|master| master.clone_ref(py))
            });
            let table: Box<[Option<Py<Instance>>]> =
                std::iter::once(None).chain(resolved).collect();
            Masters {
                all_mastered: table[1..].iter().all(Option::is_some),
                covered: ranges
                    .iter()
                    .filter(|range| range.end >= 1)
                    .map(|range| u64::from(range.end - range.start.max(1)) + 1)
                    .sum(),
                table,
            }
        })
    }

    /// Why a lookup of `tier` that found `slot` answered None (the cold path of a miss).
    #[cold]
    fn miss_of(&self, tier: &Tier, slot: u32) -> Miss {
        match (slot as usize).checked_sub(1) {
            None => no_range(tier),
            Some(index) => {
                let owner = &tier.map.ranges()[index].owner;
                if self.replicasets.contains_key(&owner.uuid) {
                    Miss::MasterUnknown
                } else {
                    Miss::ReplicasetUnknown
                }
            }
        }
    }

    /// Counts the misses among the `slots` a `route_many` call found in `tier`, by reason: one
    /// pass over the keys, then one add per slot that missed.
    #[cold]
    fn count_misses(&self, tier: &Tier, table: &[Option<Py<Instance>>], slots: &[u32]) {
        let mut per_slot = vec![0u64; table.len()];
        for &slot in slots {
            if table[slot as usize].is_none() {
                per_slot[slot as usize] += 1;
            }
        }
        for (slot, &count) in per_slot.iter().enumerate() {
            if count > 0 {
                tier.routes.missed(self.miss_of(tier, slot as u32), count);
            }
        }
    }
}

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

/// The text of a tier name given to a lookup: a str that is not text (it holds a lone
/// surrogate) names no tier.
fn lookup_text<'a>(tier: &'a Bound<'_, PyString>) -> PyResult<&'a str> {
    tier.to_str().map_err(|_| {
        unknown_tier(
            tier.py(),
            format!("unknown tier {}: not valid text", repr(tier.as_any())),
        )
    })
}

/// The tier name given to `apply_bucket_snapshot`, validated like an event's field.
fn snapshot_tier<'a>(tier: &'a Bound<'_, PyString>) -> PyResult<&'a str> {
    let py = tier.py();
    match tier.to_str() {
        Ok("") => Err(invalid_event(
            py,
            "field 'tier' must not be empty".to_owned(),
        )),
        Ok(text) => Ok(text),
        Err(_) => Err(invalid_event(
            py,
            format!(
                "field 'tier' must be valid text, got {}",
                repr(tier.as_any())
            ),
        )),
    }
}

/// The uuid of the replicaset an instance names, if any. Instances are made here, from
/// `uuid::format`, so the text always parses.
fn replicaset_of(instance: &Instance) -> Option<u128> {
    instance.replicaset_uuid.as_deref().and_then(uuid::parse)
}

/// The wall-clock time of an apply, in unix seconds: read once per apply, before the lock.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// One tier's ranges as `(start, end, owner)`, copied out of the state to be built after the
/// lock is released.
type RangeCopy = Vec<(u32, u32, Py<PyString>)>;

fn copy_ranges(py: Python<'_>, map: &BucketMap<Owner>) -> RangeCopy {
    map.ranges()
        .iter()
        .map(|range| (range.start, range.end, range.owner.name.clone_ref(py)))
        .collect()
}

impl Topology {
    /// The tier's bucket count, to hash keys with: never 0 (a tier without buckets raises
    /// `TierWithoutBuckets`, a tier not configured `UnknownTier`).
    fn bucket_count(&self, py: Python<'_>, tier: &str) -> PyResult<u32> {
        match self
            .bucket_counts
            .get()
            .and_then(|counts| counts.get(tier).copied())
        {
            Some(0) => Err(no_route_in(py, tier)),
            Some(count) => Ok(count),
            None => Err(unknown_tier(
                py,
                format!(
                    "tier {} has no bucket count: it is not in apply_tiers",
                    quoted(tier)
                ),
            )),
        }
    }

    /// Bucket events and snapshots may name any tier until `apply_tiers`; from then on only a
    /// configured one, else `UnknownTier`. Returns the tier's bucket count, if configured.
    fn check_configured(&self, py: Python<'_>, tier: &str) -> PyResult<Option<u32>> {
        let Some(counts) = self.bucket_counts.get() else {
            return Ok(None);
        };
        match counts.get(tier) {
            Some(&count) => Ok(Some(count)),
            None => Err(unknown_tier(
                py,
                format!(
                    "tier {} is not in apply_tiers: it has no bucket map",
                    quoted(tier)
                ),
            )),
        }
    }

    /// A range ending at `end` may be mapped in `tier` (see `check_configured`), within the
    /// tier's bucket count (else `InvalidEvent`); no range may be mapped in a tier without
    /// buckets (`TierWithoutBuckets`).
    fn check_range_fits(&self, py: Python<'_>, tier: &str, end: u32) -> PyResult<()> {
        let Some(count) = self.check_configured(py, tier)? else {
            return Ok(());
        };
        if count == 0 {
            return Err(tier_without_buckets(
                py,
                format!(
                    "tier {} has no buckets (bucket_count 0): it takes no bucket range, got one ending at {end}",
                    quoted(tier)
                ),
            ));
        }
        if end > count {
            return Err(invalid_event(
                py,
                format!(
                    "bucket range end {end} exceeds the bucket_count {count} of tier {}",
                    quoted(tier)
                ),
            ));
        }
        Ok(())
    }

    /// Reads the tier named `tier` under the read lock: `read` must only copy (no Python
    /// object is made under the lock). Raises `UnknownTier` after the lock is released.
    ///
    /// O(1) in the number of tiers: the name is compared by identity with the tier found last,
    /// else encoded (with no lock held: an unencodable name raises) and hashed.
    fn read_tier<R>(
        &self,
        tier: &Bound<'_, PyString>,
        read: impl FnOnce(&State, &Tier) -> R,
    ) -> PyResult<R> {
        {
            let state = self.state.read();
            if let Some(known) = state.last_found(tier) {
                return Ok(read(&state, known));
            }
        }
        let text = lookup_text(tier)?;
        let found = {
            let state = self.state.read();
            state.find_tier(text).map(|known| read(&state, known))
        };
        found.ok_or_else(|| unknown_tier(tier.py(), format!("unknown tier {}", quoted(text))))
    }

    /// `read_tier` for a lookup by bucket: a tier without buckets raises `TierWithoutBuckets`
    /// (after the lock is released).
    fn read_routable<R>(
        &self,
        tier: &Bound<'_, PyString>,
        read: impl FnOnce(&State, &Tier) -> R,
    ) -> PyResult<R> {
        self.read_tier(tier, |state, known| {
            known.has_buckets.then(|| read(state, known))
        })?
        .ok_or_else(|| no_route_in(tier.py(), &tier.to_string_lossy()))
    }

    /// The index of the tier named `name`, registering it if it is new. Its interned name is
    /// made before the write lock is taken.
    fn registered_tier(&self, py: Python<'_>, name: &str) -> usize {
        if let Some(&index) = self.state.read().tier_index.get(name) {
            return index;
        }
        let interned = PyString::intern(py, name).unbind();
        let mut displaced = Displaced::default();
        let mut state = self.state.write();
        state.register_tier(name, interned, &mut displaced)
    }

    /// Called under the write lock, after the change: see [`Topology::membership`].
    fn membership_moved(&self) {
        self.membership.fetch_add(1, Ordering::Release);
    }

    fn apply_instance_change(&self, py: Python<'_>, change: InstanceChange) -> PyResult<()> {
        if change.op == Op::Delete {
            let mut displaced = Displaced::default();
            let mut state = self.state.write();
            state.forget_masters(&mut displaced);
            if let Some(gone) = state.instances.remove(&change.uuid) {
                state.join(change.uuid, replicaset_of(gone.get()), None);
                self.membership_moved();
                displaced.objects.push(gone.into_any());
            }
            return Ok(());
        }
        // The merged instance is made with no lock held, from the one known then; it is stored
        // only if that one is still current (we hold a reference, so its address cannot be
        // reused), else merged again from the newer one.
        loop {
            let known = self
                .state
                .read()
                .instances
                .get(&change.uuid)
                .map(|known| known.clone_ref(py));
            let merged = match known.as_ref().map(Py::get) {
                Some(known) => Instance {
                    uuid: known.uuid.clone(),
                    replicaset_uuid: change
                        .replicaset_uuid
                        .map(uuid::format)
                        .or_else(|| known.replicaset_uuid.clone()),
                    current_state: change
                        .current_state
                        .clone()
                        .or_else(|| known.current_state.clone()),
                    address: change.address.clone().or_else(|| known.address.clone()),
                    name: change.name.clone().or_else(|| known.name.clone()),
                },
                None => Instance {
                    uuid: uuid::format(change.uuid),
                    replicaset_uuid: change.replicaset_uuid.map(uuid::format),
                    current_state: change.current_state.clone(),
                    address: change.address.clone(),
                    name: change.name.clone(),
                },
            };
            let known = known.as_ref();
            let changed = known.is_none_or(|known| *known.get() != merged);
            let from = known.and_then(|known| replicaset_of(known.get()));
            let to = replicaset_of(&merged);
            let object = Py::new(py, merged)?;
            let mut displaced = Displaced::default();
            let mut state = self.state.write();
            if state.instances.get(&change.uuid).map(Py::as_ptr) != known.map(Py::as_ptr) {
                continue;
            }
            state.forget_masters(&mut displaced);
            if let Some(old) = state.instances.insert(change.uuid, object) {
                displaced.objects.push(old.into_any());
            }
            state.join(change.uuid, from, to);
            if changed {
                self.membership_moved();
            }
            return Ok(());
        }
    }

    fn apply_replicaset_change(&self, py: Python<'_>, change: ReplicasetChange) -> PyResult<()> {
        if change.op == Op::Delete {
            let clear = Clear {
                cause: ClearCause::ReplicasetDeleted {
                    replicaset: change.uuid,
                },
                at: now(),
            };
            let mut displaced = Displaced::default();
            let mut state = self.state.write();
            state.forget_masters(&mut displaced);
            if let Some(gone) = state.replicasets.remove(&change.uuid) {
                state.clear_tier(&gone.tier, &clear, &mut displaced);
                self.membership_moved();
                displaced.objects.push(gone.object.into_any());
            }
            return Ok(());
        }
        if let Some(tier) = &change.tier {
            self.registered_tier(py, tier);
        }
        // As for instances: made with no lock held, stored only if the entry it was made from
        // is still current.
        loop {
            let known = self
                .state
                .read()
                .replicasets
                .get(&change.uuid)
                .map(|known| (known.tier.clone(), known.master, known.object.clone_ref(py)));
            let (old_tier, old_master, old_object) = match known {
                Some((tier, master, object)) => (Some(tier), master, Some(object)),
                None => (None, None, None),
            };
            let tier: Box<str> = match (&change.tier, &old_tier) {
                (Some(tier), _) => tier.as_str().into(),
                (None, Some(tier)) => tier.clone(),
                (None, None) => {
                    return Err(invalid_event(
                        py,
                        format!(
                            "field 'tier' is required for a replicaset not yet known: {}",
                            uuid::format(change.uuid)
                        ),
                    ))
                }
            };
            let master = change.current_master_uuid.or(old_master);
            let name = change.name.clone().or_else(|| {
                old_object
                    .as_ref()
                    .and_then(|object| object.get().name.clone())
            });
            let merged = Replicaset {
                uuid: uuid::format(change.uuid),
                tier: tier.to_string(),
                current_master_uuid: master.map(uuid::format),
                name,
            };
            let changed = old_object.as_ref().is_none_or(|old| *old.get() != merged);
            let object = Py::new(py, merged)?;
            let clear = match &old_tier {
                None => Some(ClearCause::ReplicasetJoined {
                    replicaset: change.uuid,
                    tier: tier.clone(),
                }),
                Some(old) if *old != tier => Some(ClearCause::ReplicasetMoved {
                    replicaset: change.uuid,
                    from: old.clone(),
                    to: tier.clone(),
                }),
                Some(_) => None,
            }
            .map(|cause| Clear { cause, at: now() });
            let mut displaced = Displaced::default();
            let mut state = self.state.write();
            let current = state
                .replicasets
                .get(&change.uuid)
                .map(|entry| entry.object.as_ptr());
            if current != old_object.as_ref().map(Py::as_ptr) {
                continue;
            }
            state.forget_masters(&mut displaced);
            // A new member may take buckets from any replicaset of its tier; a member moving
            // between tiers, from any of either.
            if let Some(clear) = &clear {
                if let Some(old) = old_tier.as_deref().filter(|old| **old != *tier) {
                    state.clear_tier(old, clear, &mut displaced);
                }
                state.clear_tier(&tier, clear, &mut displaced);
            }
            let entry = ReplicasetEntry {
                tier,
                master,
                object,
            };
            if let Some(old) = state.replicasets.insert(change.uuid, entry) {
                displaced.objects.push(old.object.into_any());
            }
            if changed {
                self.membership_moved();
            }
            return Ok(());
        }
    }

    fn apply_bucket_change(&self, py: Python<'_>, change: BucketChange) -> PyResult<()> {
        self.check_range_fits(py, &change.tier, change.end)?;
        let BucketChange {
            op,
            tier,
            start,
            end,
            owner,
        } = change;
        // Declared before the guard (so dropped after it), with the owner it may keep.
        let mut displaced = Displaced::default();
        match op {
            Op::Replace => {
                let index = self.registered_tier(py, &tier);
                let setting = Setting {
                    at: now(),
                    by: SetBy::Event,
                };
                let mut state = self.state.write();
                state.edit_map(index, &mut displaced, |map, out| {
                    map.upsert(start, end, owner, setting, out)
                });
            }
            Op::Delete => {
                let at = now();
                let mut state = self.state.write();
                if let Some(&index) = state.tier_index.get(&*tier) {
                    state.edit_map(index, &mut displaced, |map, out| {
                        map.remove(start, end, &owner, at, out)
                    });
                }
                displaced.objects.push(owner.name.into_any());
            }
        }
        Ok(())
    }

    /// Reads one snapshot item: a `_pico_bucket` row (dict) or a `BucketEvent`-like object.
    fn snapshot_range(
        item: &Bound<'_, PyAny>,
        tier: &str,
        likely: Option<&Owner>,
    ) -> PyResult<Range<Owner>> {
        let py = item.py();
        let range = if item.is_instance_of::<PyDict>() {
            let row = events::bucket_row(item, likely)?;
            let item_tier = row.tier.to_str()?;
            if item_tier != tier {
                return Err(other_tier(py, tier, item_tier));
            }
            Range {
                start: row.start,
                end: row.end,
                owner: row.owner,
            }
        } else {
            let change = events::bucket_change(item, likely)?;
            if change.op != Op::Replace {
                return Err(invalid_event(
                    py,
                    format!(
                        "a bucket snapshot holds only 'replace' events, got op 'delete' for [{}, {}]",
                        change.start, change.end
                    ),
                ));
            }
            if change.tier != tier {
                return Err(other_tier(py, tier, &change.tier));
            }
            Range {
                start: change.start,
                end: change.end,
                owner: change.owner,
            }
        };
        Ok(range)
    }

    /// The bucket of each key, hashed before any lock is taken (hashing may call into Python).
    fn buckets_of_keys(&self, bucket_count: u32, keys: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        let divisor = BucketDivisor::new(bucket_count);
        if let Some(array) = IntArray::of(keys, "keys")? {
            let mut buckets = Vec::with_capacity(array.len());
            array.for_each_chunk_of_bits(|bits, signed| {
                int_key_lanes::append_buckets(bits, signed, divisor, &mut buckets);
            });
            return Ok(buckets);
        }
        let mut buckets =
            Vec::with_capacity(keys.cast_exact::<PyList>().map_or(0, |list| list.len()));
        KeyHasher::default().picodata_each(keys, |hash| buckets.push(divisor.bucket(hash)))?;
        Ok(buckets)
    }

    /// A poll's ranges, validated whole, sorted and checked for overlaps.
    fn snapshot_ranges(&self, tier: &str, items: &Bound<'_, PyAny>) -> PyResult<Vec<Range<Owner>>> {
        let py = items.py();
        // A poll usually repeats the map it replaces, range for range: the owners already mapped
        // let most rows skip parsing their uuid. Copied out, so no lock is held while rows are read.
        let mapped: Vec<Owner> =
            self.state
                .read()
                .known_tier(tier)
                .map_or_else(Vec::new, |known| {
                    known
                        .map
                        .ranges()
                        .iter()
                        .map(|range| range.owner.clone_ref(py))
                        .collect()
                });
        let mut ranges = items
            .try_iter()?
            .enumerate()
            .map(|(i, item)| Self::snapshot_range(&item?, tier, mapped.get(i)))
            .collect::<PyResult<Vec<_>>>()?;
        sort_snapshot(&mut ranges)
            .map_err(|overlap| invalid_event(py, overlap.message(&quoted(tier))))?;
        if let Some(last) = ranges.last() {
            self.check_range_fits(py, tier, last.end)?;
        }
        Ok(ranges)
    }

    /// Replaces the tier's map, remembering the payload text it came from (if any) with the
    /// epoch it produced, in the same critical section. Ranges it sets are stamped as set by
    /// a poll if it came from a payload, else by a snapshot.
    fn replace_tier(
        &self,
        py: Python<'_>,
        tier: &str,
        ranges: Vec<Range<Owner>>,
        payload: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        let index = self.registered_tier(py, tier);
        let setting = Setting {
            at: now(),
            by: if payload.is_some() {
                SetBy::Poll
            } else {
                SetBy::Snapshot
            },
        };
        let payload = payload.map(|text| text.clone().unbind());
        let mut displaced = Displaced::default();
        let mut state = self.state.write();
        let changed = state.edit_map(index, &mut displaced, |map, out| {
            map.replace_all(ranges, setting, out)
        });
        if let Some(text) = payload {
            let known = &mut state.tiers[index];
            let epoch = known.map.epoch();
            if let Some(old) = known.last_payload.replace(Payload { text, epoch }) {
                displaced.objects.push(old.text);
            }
        }
        changed
    }

    /// `apply_bucket_snapshot` of the JSON text `_pico_bucket(tier)` returns, or of a
    /// `BucketPayload` (that text, already read).
    fn apply_bucket_payload(&self, tier: &str, payload: &Bound<'_, PyAny>) -> PyResult<bool> {
        let py = payload.py();
        let parsed = payload.cast::<BucketPayload>().ok().map(Bound::get);
        let text = match parsed {
            Some(parsed) => {
                let parsed_tier = parsed.tier_name(py)?;
                if parsed_tier != tier {
                    return Err(other_tier(py, tier, &parsed_tier));
                }
                parsed.text(py).clone()
            }
            None => payload.clone(),
        };
        let last = self.state.read().known_tier(tier).and_then(|known| {
            known
                .last_payload
                .as_ref()
                .filter(|last| last.epoch == known.map.epoch())
                .map(|last| last.text.clone_ref(py))
        });
        if let Some(last) = last {
            if last.bind(py).eq(&text)? {
                return Ok(false);
            }
        }
        let ranges = match parsed {
            Some(parsed) => parsed.ranges(py),
            None => bucket_payload::parse(tier, &text, None)?,
        };
        if let Some(last) = ranges.last() {
            self.check_range_fits(py, tier, last.end)?;
        }
        Ok(self.replace_tier(py, tier, ranges, Some(&text)))
    }
}

/// Why no range of `tier` holds a bucket: the map was cleared and has not been refilled over
/// the bucket since, or anything else (as `Topology.explain` tells them apart).
#[cold]
fn no_range(tier: &Tier) -> Miss {
    if tier.map.last_clear().is_some_and(|clear| clear.filling) {
        Miss::MapCleared
    } else {
        Miss::NoRange
    }
}

/// Turns each slot in `routes` into the index of its master in the returned list of distinct
/// masters (by identity, None included), in the order the slots first reach them. Runs under the
/// read lock: it only copies references.
fn distinct_routes(
    py: Python<'_>,
    masters: &[Option<Py<Instance>>],
    routes: &mut [u32],
) -> Vec<Option<Py<Instance>>> {
    const UNSEEN: u32 = u32::MAX;
    let mut index_of_slot = vec![UNSEEN; masters.len()];
    let mut index_of_master: FxHashMap<usize, u32> = FxHashMap::default();
    let mut distinct: Vec<Option<Py<Instance>>> = Vec::new();
    for route in routes {
        let slot = *route as usize;
        if index_of_slot[slot] == UNSEEN {
            // First key in this range: ranges of one replicaset share its master.
            let master = masters[slot].as_ref();
            let address = master.map_or(0, |instance| instance.as_ptr() as usize);
            index_of_slot[slot] = *index_of_master.entry(address).or_insert_with(|| {
                distinct.push(master.map(|instance| instance.clone_ref(py)));
                (distinct.len() - 1) as u32
            });
        }
        *route = index_of_slot[slot];
    }
    distinct
}

/// Routing by key or bucket in a tier configured with bucket_count 0.
fn no_route_in(py: Python<'_>, tier: &str) -> PyErr {
    tier_without_buckets(
        py,
        format!(
            "tier {} has no buckets (bucket_count 0, an arbiter tier): no key or bucket routes to it",
            quoted(tier)
        ),
    )
}

fn other_tier(py: Python<'_>, tier: &str, item_tier: &str) -> PyErr {
    invalid_event(
        py,
        format!(
            "snapshot of tier {} holds a range of tier {}",
            quoted(tier),
            quoted(item_tier)
        ),
    )
}

/// One entry of `apply_tiers`: a name that is non-empty text, a count that is an int (not a
/// bool) in `0..=u32::MAX`.
fn tier_entry(item: &Bound<'_, PyAny>) -> PyResult<(Box<str>, u32)> {
    let py = item.py();
    let malformed = || {
        invalid_event(
            py,
            format!("a tier must map a str to an int, got {}", repr(item)),
        )
    };
    let (name, count): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
        item.extract().map_err(|_| malformed())?;
    let name = name
        .cast::<PyString>()
        .ok()
        .and_then(|name| name.to_str().ok().map(str::to_owned))
        .ok_or_else(malformed)?;
    if name.is_empty() {
        return Err(invalid_event(
            py,
            "a tier name must not be empty".to_owned(),
        ));
    }
    // A bool is an int by accident: refused as a count, like any other non-count.
    let number = if count.is_instance_of::<PyBool>() {
        None
    } else {
        Some(count.extract::<i64>().map_err(|_| malformed())?)
    };
    let count = number
        .and_then(|number| u32::try_from(number).ok())
        .ok_or_else(|| {
            invalid_event(
                py,
                format!(
                    "tier {} has an invalid bucket_count {}",
                    quoted(&name),
                    repr(&count)
                ),
            )
        })?;
    Ok((name.into_boxed_str(), count))
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
        if self.bucket_counts.get().is_some() {
            return Ok(false);
        }
        let mut counts = FxHashMap::default();
        for item in tiers.items()?.iter() {
            let (name, count) = tier_entry(&item)?;
            counts.insert(name, count);
        }
        let interned: Vec<(Box<str>, Py<PyString>)> = counts
            .keys()
            .map(|name| (name.clone(), PyString::intern(py, name).unbind()))
            .collect();
        let mut displaced = Displaced::default();
        let too_small = {
            let mut state = self.state.write();
            let too_small = counts.iter().find_map(|(name, &count)| {
                let last = state.known_tier(name)?.map.ranges().last()?.end;
                (last > count).then(|| (name.clone(), last, count))
            });
            if too_small.is_none() {
                // Another thread's call may have won since the check above: then this one
                // changes nothing.
                if self.bucket_counts.set(counts).is_err() {
                    return Ok(false);
                }
                let counts = self.bucket_counts.get();
                for (name, interned) in interned {
                    let index = state.register_tier(&name, interned, &mut displaced);
                    let count = counts.and_then(|counts| counts.get(&name));
                    state.tiers[index].has_buckets = count != Some(&0);
                }
            }
            too_small
        };
        match too_small {
            Some((name, last, count)) => Err(invalid_event(
                py,
                format!(
                    "tier {} already maps bucket {last} beyond bucket_count {count}",
                    quoted(&name)
                ),
            )),
            None => Ok(true),
        }
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
        let out = PyDict::new(py);
        for object in objects {
            out.set_item(&object.get().uuid, &object)?;
        }
        Ok(out)
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
        let out = PyDict::new(py);
        for object in objects {
            out.set_item(&object.get().uuid, &object)?;
        }
        Ok(out)
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
        let clear = Clear {
            cause: ClearCause::TopologyCleared,
            at: now(),
        };
        let mut displaced = Displaced::default();
        let (instances, replicasets, had_ranges) = {
            let mut state = self.state.write();
            let mut had_ranges = false;
            for tier in &mut state.tiers {
                had_ranges |= !tier.map.ranges().is_empty();
                tier.map.clear(&clear, &mut displaced.ranges);
                displaced.forget_masters(tier);
                if let Some(payload) = tier.last_payload.take() {
                    displaced.objects.push(payload.text);
                }
            }
            let instances = std::mem::take(&mut state.instances);
            let replicasets = std::mem::take(&mut state.replicasets);
            state.members.clear();
            if !instances.is_empty() || !replicasets.is_empty() {
                self.membership_moved();
            }
            (instances, replicasets, had_ranges)
        };
        had_ranges || !instances.is_empty() || !replicasets.is_empty()
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
            None => Err(invalid_event(
                py,
                format!("not a topology event: {}", event.get_type().name()?),
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
        let count = self.bucket_count(tier.py(), lookup_text(tier)?)?;
        let hash = with_scratch(|hasher| hasher.picodata(key, DecimalFormat::Binary))?;
        Ok(bucket_of(hash, count))
    }

    /// The master instance that should serve `key` in `tier`: the bucket id and the lookup in one
    /// call. None when any link of the chain is unknown (see `find_bucket_master`).
    fn route(
        &self,
        tier: &Bound<'_, PyString>,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Py<Instance>>> {
        let bucket = self.bucket_id(tier, key)?;
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
        let py = tier.py();
        let ids = int_arrays::bucket_ids(bucket_ids)?;
        let owners: Vec<Option<Py<PyString>>> = self.read_routable(tier, |_, known| {
            known.routes.routed(ids.len() as u64);
            ids.into_iter()
                .map(|id| {
                    let found = known.map.lookup(id);
                    if found.is_none() {
                        known.routes.missed(no_range(known), 1);
                    }
                    found.map(|owner| owner.name.clone_ref(py))
                })
                .collect()
        })?;
        PyList::new(py, owners)
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
    ///     `int_key_lanes.rs`); under the read lock each bucket becomes its range's slot in the
    ///     tier's table of masters, and the references the answer needs are copied (increfs);
    ///     the list is built after the lock is released.
    #[pyo3(signature = (tier, keys, *, out = None))]
    fn route_many<'py>(
        &self,
        tier: &Bound<'py, PyString>,
        keys: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = tier.py();
        let out = out.map(|out| OutArray::of(out, "out")).transpose()?;
        let bucket_count = self.bucket_count(py, lookup_text(tier)?)?;
        let mut routes = self.buckets_of_keys(bucket_count, keys)?;
        // Counted on the map the keys are routed on, once per call.
        let tally = |state: &State, known: &Tier, masters: &Masters, slots: &[u32]| {
            known.routes.routed(slots.len() as u64);
            if masters.can_miss(bucket_count) {
                state.count_misses(known, &masters.table, slots);
            }
        };
        let Some(out) = out else {
            // The list is built after the lock is released, from copied references: of the
            // table of masters when there are more keys than ranges (a smaller copy, and the
            // list then takes its items straight from it), else of each key's master.
            let (table, per_key) = self.read_tier(tier, |state, known| {
                let resolved = state.resolved(py, known);
                let masters = &resolved.table;
                known.map.slots_in_place(&mut routes);
                tally(state, known, resolved, &routes);
                let copy = |master: &Option<Py<Instance>>| {
                    master.as_ref().map(|instance| instance.clone_ref(py))
                };
                if routes.len() >= masters.len() {
                    (masters.iter().map(copy).collect(), Vec::new())
                } else {
                    let per_key = routes.iter().map(|&slot| copy(&masters[slot as usize]));
                    (Vec::new(), per_key.collect())
                }
            })?;
            // The table always holds at least the "no range" entry.
            if table.is_empty() {
                return PyList::new(py, per_key);
            }
            return PyList::new(py, routes.iter().map(|&slot| table[slot as usize].as_ref()));
        };
        if out.len() != routes.len() {
            return Err(invalid_argument(
                py,
                format!(
                    "out must have one item per key: it has {} items, for {} keys",
                    out.len(),
                    routes.len()
                ),
            ));
        }
        let distinct = self.read_tier(tier, |state, known| {
            let resolved = state.resolved(py, known);
            known.map.slots_in_place(&mut routes);
            tally(state, known, resolved, &routes);
            distinct_routes(py, &resolved.table, &mut routes)
        })?;
        // At most one index per instance plus None, far below any item's limit; checked anyway
        // rather than writing a wrapped index.
        if (distinct.len() as u64).saturating_sub(1) > out.max_index() {
            return Err(invalid_argument(
                py,
                format!(
                    "out cannot hold the indices of {} routes: use 64-bit items",
                    distinct.len()
                ),
            ));
        }
        out.write(&routes);
        PyList::new(py, distinct)
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
        Ok(found.map(|(start, end, owner, stamp)| BucketRange {
            start,
            end,
            replicaset_uuid: uuid::format(owner),
            epoch: stamp.epoch,
            set_at: stamp.at,
            set_by: stamp.by.name(),
        }))
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
        let py = tier.py();
        // As `bucket_id` does, inline: a precaution, so that `route` stays the only Rust caller
        // of `bucket_id` and LLVM's inlining of it into `route` cannot change.
        let count = self.bucket_count(py, lookup_text(tier)?)?;
        let bucket = bucket_of(
            with_scratch(|hasher| hasher.picodata(key, DecimalFormat::Binary))?,
            count,
        );
        let key_repr = short_repr(key);
        let found = self.read_routable(tier, |state, known| {
            let routed = state.masters(py, known)[known.map.slot(bucket) as usize]
                .as_ref()
                .map(|instance| instance.clone_ref(py));
            let range = known.map.range(bucket);
            let entry = range.and_then(|(range, _)| state.replicasets.get(&range.owner.uuid));
            Found {
                bucket,
                epoch: known.map.epoch(),
                ranges: known.map.ranges().len(),
                range: range
                    .map(|(range, stamp)| (range.start, range.end, range.owner.uuid, *stamp)),
                replicaset: entry.map(|entry| (entry.object.clone_ref(py), entry.master)),
                master: entry
                    .and_then(|entry| state.instances.get(&entry.master?))
                    .map(|instance| instance.clone_ref(py)),
                routed,
                last_clear: known.map.last_clear().cloned(),
            }
        })?;
        RouteExplanation::new(py, lookup_text(tier)?, key_repr, found)
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
        let py = replicaset_uuid.py();
        let key = replicaset_uuid
            .to_str()
            .ok()
            .and_then(uuid::parse)
            .ok_or_else(|| {
                invalid_argument(
                    py,
                    format!(
                        "replicaset_uuid must be a UUID, got {}",
                        repr(replicaset_uuid.as_any())
                    ),
                )
            })?;
        let members: Vec<Py<Instance>> = {
            let state = self.state.read();
            state.members.get(&key).map_or_else(Vec::new, |members| {
                members
                    .iter()
                    .filter_map(|member| state.instances.get(member))
                    .map(|instance| instance.clone_ref(py))
                    .collect()
            })
        };
        PyList::new(py, members)
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
