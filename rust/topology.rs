//! `Topology`: instances, replicasets and per-tier bucket maps, kept from topology events, and
//! routing of keys to the master instance of the replicaset that owns their bucket.

use std::sync::OnceLock;

use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyMapping, PyString, PyType};
use rustc_hash::FxHashMap;

use crate::bucket_map::{sort_snapshot, BucketMap, Range};
use crate::bucket_payload::{self, BucketPayload};
use crate::errors::{invalid_event, quoted, unknown_tier};
use crate::events::{self, BucketChange, InstanceChange, Op, Owner, ReplicasetChange};
use crate::instance::Instance;
use crate::int_arrays::{self, BucketId, IntArray};
use crate::replicaset::Replicaset;
use crate::sharding::{bucket_of, with_scratch, DecimalFormat, KeyHasher};
use crate::uuid;

struct ReplicasetEntry {
    tier: Box<str>,
    master: Option<u128>,
    object: Py<Replicaset>,
}

/// One tier's bucket map, and the master instance serving each of its ranges.
struct Tier {
    /// Interned, so that a caller passing a string literal is matched by identity.
    name: Py<PyString>,
    map: BucketMap<Owner>,
    /// `masters[slot]` serves the range in `map.slot(bucket)` (`masters[0]`, no range, is None):
    /// resolved once (replicaset → master → instance) by the first lookup after the map, a
    /// replicaset or an instance changed.
    masters: OnceLock<Box<[Option<Py<Instance>>]>>,
    /// The JSON text of the last poll applied as text, valid while the map is at `epoch`.
    last_payload: Option<Payload>,
}

struct Payload {
    text: Py<PyAny>,
    epoch: u64,
}

#[derive(Default)]
struct State {
    instances: FxHashMap<u128, Py<Instance>>,
    replicasets: FxHashMap<u128, ReplicasetEntry>,
    tiers: Vec<Tier>,
    tier_index: FxHashMap<Box<str>, usize>,
}

impl State {
    /// The tier named `name`. Callers usually pass the same interned literal every time, so a
    /// scan by identity comes first: cheaper than hashing the text, which is the fallback.
    fn tier(&self, name: &Bound<'_, PyString>) -> PyResult<&Tier> {
        if let Some(tier) = self.tiers.iter().find(|tier| tier.name.is(name)) {
            return Ok(tier);
        }
        let text = name.to_str()?;
        self.known_tier(text)
            .ok_or_else(|| unknown_tier(name.py(), format!("unknown tier {}", quoted(text))))
    }

    fn known_tier(&self, name: &str) -> Option<&Tier> {
        self.tier_index.get(name).map(|&index| &self.tiers[index])
    }

    /// The index of the tier named `name`, registering it (with an empty map) if it is new.
    fn register_tier(&mut self, py: Python<'_>, name: &str) -> usize {
        if let Some(&index) = self.tier_index.get(name) {
            return index;
        }
        self.tiers.push(Tier {
            name: PyString::intern(py, name).unbind(),
            map: BucketMap::default(),
            masters: OnceLock::new(),
            last_payload: None,
        });
        self.tier_index.insert(name.into(), self.tiers.len() - 1);
        self.tiers.len() - 1
    }

    /// Applies `edit` to the tier's map (registering the tier if it is new); the masters resolved
    /// for the old map are dropped if the map changed.
    fn edit_map<R>(
        &mut self,
        py: Python<'_>,
        name: &str,
        edit: impl FnOnce(&mut BucketMap<Owner>) -> R,
    ) -> R {
        let index = self.register_tier(py, name);
        let tier = &mut self.tiers[index];
        let epoch = tier.map.epoch();
        let result = edit(&mut tier.map);
        if tier.map.epoch() != epoch {
            tier.masters = OnceLock::new();
        }
        result
    }

    fn tier_mut(&mut self, name: &str) -> &mut Tier {
        &mut self.tiers[self.tier_index[name]]
    }

    fn clear_tier(&mut self, py: Python<'_>, name: &str) {
        self.edit_map(py, name, BucketMap::clear);
    }

    /// A replicaset or an instance changed: every tier resolves its masters again. O(tiers).
    fn forget_masters(&mut self) {
        for tier in &mut self.tiers {
            tier.masters = OnceLock::new();
        }
    }

    /// The master instance of the replicaset `owner`, if everything on the way is known.
    fn master_instance(&self, owner: &Owner) -> Option<&Py<Instance>> {
        let master = self.replicasets.get(&owner.uuid)?.master?;
        self.instances.get(&master)
    }

    /// The master instance serving each range of `tier`, by slot (see [`Tier::masters`]).
    fn masters<'a>(&'a self, py: Python<'_>, tier: &'a Tier) -> &'a [Option<Py<Instance>>] {
        tier.masters.get_or_init(|| {
            let resolved = tier.map.ranges().iter().map(|range| {
                self.master_instance(&range.owner)
                    .map(|master| master.clone_ref(py))
            });
            std::iter::once(None).chain(resolved).collect()
        })
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
/// All methods are safe to call from many threads at once; each event is applied atomically,
/// and readers see the map either wholly before or wholly after it.
///
/// Implementation notes:
///     Each map is a sorted vector of disjoint ranges. Lookups read two tables derived from it
///     on the first lookup after a change: bucket → range, and range → master instance. Writers
///     take an exclusive lock only after the event has been read and validated, so a malformed
///     event never leaves anything half-applied; nothing calls back into Python while a lock is
///     held.
#[pyclass(frozen, module = "shardline", name = "Topology")]
pub struct Topology {
    bucket_counts: OnceLock<FxHashMap<Box<str>, u32>>,
    state: RwLock<State>,
}

static EVENT_CLASSES: PyOnceLock<[Py<PyType>; 3]> = PyOnceLock::new();

fn event_classes(py: Python<'_>) -> PyResult<&[Py<PyType>; 3]> {
    EVENT_CLASSES.get_or_try_init(py, || {
        let module = py.import("shardline.topology.events")?;
        let class = |name: &str| -> PyResult<Py<PyType>> {
            Ok(module.getattr(name)?.cast_into::<PyType>()?.unbind())
        };
        Ok([
            class("InstanceEvent")?,
            class("ReplicasetEvent")?,
            class("BucketEvent")?,
        ])
    })
}

impl Topology {
    fn bucket_count(&self, py: Python<'_>, tier: &str) -> PyResult<u32> {
        self.bucket_counts
            .get()
            .and_then(|counts| counts.get(tier).copied())
            .ok_or_else(|| {
                unknown_tier(
                    py,
                    format!(
                        "tier {} has no bucket count: it is not in apply_tiers",
                        quoted(tier)
                    ),
                )
            })
    }

    fn check_range_fits(&self, py: Python<'_>, tier: &str, end: u32) -> PyResult<()> {
        if let Some(&count) = self.bucket_counts.get().and_then(|counts| counts.get(tier)) {
            if end > count {
                return Err(invalid_event(
                    py,
                    format!(
                        "bucket range end {end} exceeds the bucket_count {count} of tier {}",
                        quoted(tier)
                    ),
                ));
            }
        }
        Ok(())
    }

    fn apply_instance_change(&self, py: Python<'_>, change: InstanceChange) -> PyResult<()> {
        let mut state = self.state.write();
        state.forget_masters();
        if change.op == Op::Delete {
            state.instances.remove(&change.uuid);
            return Ok(());
        }
        let merged = match state.instances.get(&change.uuid).map(|known| known.get()) {
            Some(known) => Instance {
                uuid: known.uuid.clone(),
                replicaset_uuid: change
                    .replicaset_uuid
                    .map(uuid::format)
                    .or_else(|| known.replicaset_uuid.clone()),
                current_state: change.current_state.or_else(|| known.current_state.clone()),
                address: change.address.or_else(|| known.address.clone()),
            },
            None => Instance {
                uuid: uuid::format(change.uuid),
                replicaset_uuid: change.replicaset_uuid.map(uuid::format),
                current_state: change.current_state,
                address: change.address,
            },
        };
        state.instances.insert(change.uuid, Py::new(py, merged)?);
        Ok(())
    }

    fn apply_replicaset_change(&self, py: Python<'_>, change: ReplicasetChange) -> PyResult<()> {
        let mut state = self.state.write();
        state.forget_masters();
        if change.op == Op::Delete {
            if let Some(gone) = state.replicasets.remove(&change.uuid) {
                state.clear_tier(py, &gone.tier);
            }
            return Ok(());
        }
        let (old_tier, old_master) = match state.replicasets.get(&change.uuid) {
            Some(known) => (Some(known.tier.clone()), known.master),
            None => (None, None),
        };
        let tier: Box<str> = match (change.tier, &old_tier) {
            (Some(tier), _) => tier.into(),
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
        let object = Py::new(
            py,
            Replicaset {
                uuid: uuid::format(change.uuid),
                tier: tier.to_string(),
                current_master_uuid: master.map(uuid::format),
            },
        )?;
        match old_tier {
            // A new member may take buckets from any replicaset of its tier.
            None => state.clear_tier(py, &tier),
            Some(old) if old != tier => {
                state.clear_tier(py, &old);
                state.clear_tier(py, &tier);
            }
            Some(_) => {}
        }
        state.replicasets.insert(
            change.uuid,
            ReplicasetEntry {
                tier,
                master,
                object,
            },
        );
        Ok(())
    }

    fn apply_bucket_change(&self, py: Python<'_>, change: BucketChange) -> PyResult<()> {
        self.check_range_fits(py, &change.tier, change.end)?;
        let mut state = self.state.write();
        match change.op {
            Op::Replace => {
                state.edit_map(py, &change.tier, |map| {
                    map.upsert(change.start, change.end, change.owner)
                });
            }
            Op::Delete => {
                if state.known_tier(&change.tier).is_some() {
                    state.edit_map(py, &change.tier, |map| {
                        map.remove(change.start, change.end, &change.owner)
                    });
                }
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
    fn buckets_of_keys(
        &self,
        py: Python<'_>,
        tier: &str,
        keys: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<u32>> {
        let count = self.bucket_count(py, tier)?;
        let mut hasher = KeyHasher::default();
        if let Some(array) = IntArray::of(keys, "keys")? {
            return Ok(array.map_in_chunks(|key| bucket_of(hasher.picodata_int(key), count)));
        }
        keys.try_iter()?
            .map(|key| {
                Ok(bucket_of(
                    hasher.picodata(&key?, DecimalFormat::Binary)?,
                    count,
                ))
            })
            .collect()
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
        sort_snapshot(&mut ranges).map_err(|overlap| {
            invalid_event(
                py,
                format!(
                    "snapshot of tier {} has overlapping ranges {:?} and {:?}",
                    quoted(tier),
                    overlap.first,
                    overlap.second
                ),
            )
        })?;
        if let Some(last) = ranges.last() {
            self.check_range_fits(py, tier, last.end)?;
        }
        Ok(ranges)
    }

    /// Replaces the tier's map, remembering the payload text it came from (if any) with the
    /// epoch it produced, in the same critical section.
    fn replace_tier(
        &self,
        py: Python<'_>,
        tier: &str,
        ranges: Vec<Range<Owner>>,
        payload: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        let mut state = self.state.write();
        let changed = state.edit_map(py, tier, |map| map.replace_all(ranges));
        if let Some(payload) = payload {
            let known = state.tier_mut(tier);
            known.last_payload = Some(Payload {
                text: payload.clone().unbind(),
                epoch: known.map.epoch(),
            });
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

#[pymethods]
impl Topology {
    #[new]
    fn new() -> Self {
        Self {
            bucket_counts: OnceLock::new(),
            state: RwLock::new(State::default()),
        }
    }

    /// Sets the static tier configuration, tier name → bucket count, and registers each tier.
    ///
    /// The configuration is set once; later calls change nothing and return False. Raises
    /// `InvalidEvent` for an empty name, a count below 1, or a count smaller than a range
    /// already mapped in that tier.
    fn apply_tiers(&self, py: Python<'_>, tiers: &Bound<'_, PyMapping>) -> PyResult<bool> {
        if self.bucket_counts.get().is_some() {
            return Ok(false);
        }
        let mut counts = FxHashMap::default();
        for item in tiers.items()?.iter() {
            let (name, count): (String, i64) = item.extract().map_err(|_| {
                invalid_event(py, format!("a tier must map a str to an int, got {item}"))
            })?;
            if name.is_empty() {
                return Err(invalid_event(
                    py,
                    "a tier name must not be empty".to_owned(),
                ));
            }
            let count = u32::try_from(count)
                .ok()
                .filter(|&c| c >= 1)
                .ok_or_else(|| {
                    invalid_event(
                        py,
                        format!("tier {} has an invalid bucket_count {count}", quoted(&name)),
                    )
                })?;
            counts.insert(name.into_boxed_str(), count);
        }
        let mut state = self.state.write();
        for (name, &count) in &counts {
            if let Some(last) = state
                .known_tier(name)
                .and_then(|tier| tier.map.ranges().last())
            {
                if last.end > count {
                    return Err(invalid_event(
                        py,
                        format!(
                            "tier {} already maps bucket {} beyond bucket_count {count}",
                            quoted(name),
                            last.end
                        ),
                    ));
                }
            }
        }
        let names: Vec<Box<str>> = counts.keys().cloned().collect();
        // Another thread's call may have won since the check above: then this one changes nothing.
        if self.bucket_counts.set(counts).is_err() {
            return Ok(false);
        }
        for name in &names {
            state.register_tier(py, name);
        }
        Ok(true)
    }

    /// Tier name → bucket count, as set by `apply_tiers` (empty before).
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
        let out = PyDict::new(py);
        for object in self.state.read().instances.values() {
            out.set_item(&object.get().uuid, object.bind(py))?;
        }
        Ok(out)
    }

    /// Replicaset uuid → `Replicaset`, a snapshot copy.
    #[getter]
    fn replicasets<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for entry in self.state.read().replicasets.values() {
            out.set_item(&entry.object.get().uuid, entry.object.bind(py))?;
        }
        Ok(out)
    }

    /// Tier → its ranges as `(start, end, replicaset_uuid)` sorted by start, a snapshot copy.
    #[getter]
    fn bucket_maps<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for tier in &self.state.read().tiers {
            out.set_item(tier.name.bind(py), ranges_list(py, &tier.map)?)?;
        }
        Ok(out)
    }

    /// The ranges of `tier` as `(start, end, replicaset_uuid)`, sorted by start.
    fn ranges<'py>(
        &self,
        py: Python<'py>,
        tier: &Bound<'py, PyString>,
    ) -> PyResult<Bound<'py, PyList>> {
        ranges_list(py, &self.state.read().tier(tier)?.map)
    }

    /// A counter that moves on every change of `tier`'s map and never otherwise: a decision made
    /// at one epoch was made on a superseded map if the epoch has moved since.
    fn epoch(&self, tier: &Bound<'_, PyString>) -> PyResult<u64> {
        Ok(self.state.read().tier(tier)?.map.epoch())
    }

    /// Forgets every instance, replicaset and bucket range, as one change: readers see the
    /// whole view or none of it. The tier configuration stays. A source calls this before
    /// rebuilding from a fresh snapshot (after a reconnect). Returns whether anything was known.
    fn clear(&self) -> bool {
        let (instances, replicasets, had_ranges) = {
            let mut state = self.state.write();
            let mut had_ranges = false;
            for tier in &mut state.tiers {
                had_ranges |= !tier.map.ranges().is_empty();
                tier.map.clear();
                tier.masters = OnceLock::new();
                tier.last_payload = None;
            }
            (
                std::mem::take(&mut state.instances),
                std::mem::take(&mut state.replicasets),
                had_ranges,
            )
        };
        // the objects are released when they go out of scope here, after the write lock, which
        // readers are waiting on
        had_ranges || !instances.is_empty() || !replicasets.is_empty()
    }

    /// Applies an `InstanceEvent`, a `ReplicasetEvent` or a `BucketEvent`.
    fn apply(&self, event: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = event.py();
        let [instance, replicaset, bucket] = event_classes(py)?;
        if event.is_instance(instance.bind(py))? {
            self.apply_instance(event)
        } else if event.is_instance(replicaset.bind(py))? {
            self.apply_replicaset(event)
        } else if event.is_instance(bucket.bind(py))? {
            self.apply_bucket(event)
        } else {
            Err(invalid_event(
                py,
                format!("not a topology event: {}", event.get_type().name()?),
            ))
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
    /// on a partial overlap, and is a no-op otherwise.
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
    /// levels) — raises `InvalidEvent` and the old map stays. Returns whether the map changed
    /// (an unchanged poll leaves the epoch alone).
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
        let tier = tier.to_str()?;
        if tier.is_empty() {
            return Err(invalid_event(
                py,
                "field 'tier' must not be empty".to_owned(),
            ));
        }
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
    /// Raises `UnknownTier` for a tier never registered, and `InvalidArgument` for a `bucket_id`
    /// that is not an int from 0 to 2**32 - 1 (a bool is not).
    fn owner(
        &self,
        tier: &Bound<'_, PyString>,
        bucket_id: BucketId,
    ) -> PyResult<Option<Py<PyString>>> {
        let state = self.state.read();
        Ok(state
            .tier(tier)?
            .map
            .lookup(bucket_id.0)
            .map(|owner| owner.name.clone_ref(tier.py())))
    }

    /// The master instance of the replicaset owning `bucket_id`, or None when the range, the
    /// replicaset, its master or the master instance is unknown. `bucket_id` as for `owner`.
    fn find_bucket_master(
        &self,
        tier: &Bound<'_, PyString>,
        bucket_id: BucketId,
    ) -> PyResult<Option<Py<Instance>>> {
        let py = tier.py();
        let state = self.state.read();
        let tier = state.tier(tier)?;
        let master = &state.masters(py, tier)[tier.map.slot(bucket_id.0) as usize];
        Ok(master.as_ref().map(|instance| instance.clone_ref(py)))
    }

    /// The bucket id of `key` (one value or a tuple of values) in `tier`, by the Picodata scheme.
    fn bucket_id(&self, tier: &Bound<'_, PyString>, key: &Bound<'_, PyAny>) -> PyResult<u32> {
        let count = self.bucket_count(tier.py(), tier.to_str()?)?;
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
        let state = self.state.read();
        let map = &state.tier(tier)?.map;
        PyList::new(
            py,
            ids.into_iter()
                .map(|id| map.lookup(id).map(|owner| owner.name.bind(py))),
        )
    }

    /// `route` for many keys (a sequence of keys, or a one-dimensional integer array), as a list
    /// of `Instance | None`. All keys are routed on the same map. An array that is not
    /// one-dimensional raises `InvalidArgument`.
    fn route_many<'py>(
        &self,
        tier: &Bound<'py, PyString>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = tier.py();
        let buckets = self.buckets_of_keys(py, tier.to_str()?, keys)?;
        let state = self.state.read();
        let tier = state.tier(tier)?;
        let masters = state.masters(py, tier);
        PyList::new(
            py,
            buckets.into_iter().map(|bucket| {
                masters[tier.map.slot(bucket) as usize]
                    .as_ref()
                    .map(|instance| instance.bind(py))
            }),
        )
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

fn ranges_list<'py>(py: Python<'py>, map: &BucketMap<Owner>) -> PyResult<Bound<'py, PyList>> {
    PyList::new(
        py,
        map.ranges()
            .iter()
            .map(|range| (range.start, range.end, range.owner.name.bind(py))),
    )
}
