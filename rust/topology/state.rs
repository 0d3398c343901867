//! What a `Topology` holds under its lock: instances, replicasets, per tier the bucket map and
//! its table of masters, and what a writer takes out of it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use pyo3::types::PyString;
use rustc_hash::FxHashMap;
use shardline_core::topology::bucket_map::BucketMap;
use shardline_core::topology::clears::Clear;
use shardline_core::topology::ranges::Range;

use super::events::Owner;
use super::instance::Instance;
use super::replicaset::Replicaset;
use super::route_stats::{Miss, RouteTally};

pub(super) struct ReplicasetEntry {
    pub(super) tier: Box<str>,
    pub(super) master: Option<u128>,
    pub(super) object: Py<Replicaset>,
}

/// One tier's bucket map, and the master instance serving each of its ranges.
pub(super) struct Tier {
    /// Interned: tier names are few and are keys everywhere.
    pub(super) name: Py<PyString>,
    pub(super) map: BucketMap<Owner>,
    /// `masters.table[slot]` serves the range in `map.slot(bucket)` (`table[0]`, no range, is
    /// None): resolved once (replicaset → master → instance) by the first lookup after the map,
    /// a replicaset or an instance changed.
    pub(super) masters: OnceLock<Masters>,
    /// The lookups of this tier and their misses (`Topology.route_stats`).
    pub(super) routes: RouteTally,
    /// The JSON text of the last poll applied as text, valid while the map is at `epoch`.
    pub(super) last_payload: Option<Payload>,
    /// False for a tier `apply_tiers` configured with bucket_count 0 (Picodata's "arbiter"
    /// tier): its map stays empty and routing in it raises `TierWithoutBuckets`.
    pub(super) has_buckets: bool,
}

/// A tier's table of masters by slot, and what `route_many` needs to know whether any bucket
/// can miss.
pub(super) struct Masters {
    pub(super) table: Box<[Option<Py<Instance>>]>,
    /// Every range has a master instance.
    pub(super) all_mastered: bool,
    /// Buckets from 1 up that the ranges cover: all of them when it equals the bucket count.
    pub(super) covered: u64,
}

impl Masters {
    /// Whether a lookup of some bucket in `1..=bucket_count` can answer None.
    pub(super) fn can_miss(&self, bucket_count: u32) -> bool {
        !self.all_mastered || self.covered != u64::from(bucket_count)
    }
}

pub(super) struct Payload {
    pub(super) text: Py<PyAny>,
    pub(super) epoch: u64,
}

/// What a writer takes out of the state. Declared before the write guard, so that on every
/// path it is dropped after the guard: dropping a Python object may run its finalizer (an
/// owner or a poll text can be a str subclass with `__del__`), which may re-enter the topology.
#[derive(Default)]
pub(super) struct Displaced {
    pub(super) ranges: Vec<Range<Owner>>,
    pub(super) masters: Vec<Masters>,
    pub(super) objects: Vec<Py<PyAny>>,
}

impl Displaced {
    /// Makes `tier` resolve its masters again, keeping the table it had.
    pub(super) fn forget_masters(&mut self, tier: &mut Tier) {
        if let Some(masters) = std::mem::take(&mut tier.masters).into_inner() {
            self.masters.push(masters);
        }
    }
}

#[derive(Default)]
pub(super) struct State {
    pub(super) instances: FxHashMap<u128, Py<Instance>>,
    /// Replicaset uuid → the uuids of the instances whose `replicaset_uuid` names it, sorted.
    /// Kept by every write of `instances` (see [`State::join`]); a replicaset nothing names has
    /// no entry. The replicaset itself need not be known.
    pub(super) members: FxHashMap<u128, Vec<u128>>,
    pub(super) replicasets: FxHashMap<u128, ReplicasetEntry>,
    /// Tiers are never removed, so an index into this vector stays valid for good.
    pub(super) tiers: Vec<Tier>,
    pub(super) tier_index: FxHashMap<Box<str>, usize>,
    /// The index of the tier a lookup by name found last. Callers usually pass the same
    /// interned literal every time: one identity check against this tier is cheaper than
    /// encoding and hashing the name.
    pub(super) last_found: AtomicUsize,
}

impl State {
    /// Moves `instance` in [`members`](Self::members) from replicaset `from` to `to`.
    pub(super) fn join(&mut self, instance: u128, from: Option<u128>, to: Option<u128>) {
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
    pub(super) fn known_tier(&self, name: &str) -> Option<&Tier> {
        self.tier_index.get(name).map(|&index| &self.tiers[index])
    }

    /// The tier found last, if `name` is the very same object as its name.
    pub(super) fn last_found(&self, name: &Bound<'_, PyString>) -> Option<&Tier> {
        let tier = self.tiers.get(self.last_found.load(Ordering::Relaxed))?;
        tier.name.is(name).then_some(tier)
    }

    /// [`known_tier`](Self::known_tier), remembering the tier found for [`last_found`](Self::last_found).
    pub(super) fn find_tier(&self, name: &str) -> Option<&Tier> {
        let index = *self.tier_index.get(name)?;
        if self.last_found.load(Ordering::Relaxed) != index {
            self.last_found.store(index, Ordering::Relaxed);
        }
        Some(&self.tiers[index])
    }

    /// The index of the tier named `name`, registering it (with an empty map, under the
    /// `interned` name made before the lock was taken) if it is new.
    pub(super) fn register_tier(
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
    pub(super) fn edit_map<R>(
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
    pub(super) fn clear_tier(&mut self, name: &str, clear: &Clear, displaced: &mut Displaced) {
        if let Some(&index) = self.tier_index.get(name) {
            self.edit_map(index, displaced, |map, out| map.clear(clear, out));
        }
    }

    /// A replicaset or an instance changed: every tier resolves its masters again. O(tiers).
    pub(super) fn forget_masters(&mut self, displaced: &mut Displaced) {
        for tier in &mut self.tiers {
            displaced.forget_masters(tier);
        }
    }

    /// The master instance of the replicaset `owner`, if everything on the way is known.
    pub(super) fn master_instance(&self, owner: &Owner) -> Option<&Py<Instance>> {
        let master = self.replicasets.get(&owner.uuid)?.master?;
        self.instances.get(&master)
    }

    /// The master instance serving each range of `tier`, by slot (see [`Tier::masters`]).
    pub(super) fn masters<'a>(
        &'a self,
        py: Python<'_>,
        tier: &'a Tier,
    ) -> &'a [Option<Py<Instance>>] {
        &self.resolved(py, tier).table
    }

    /// [`masters`](Self::masters), with what `route_many` reads to skip looking for misses.
    pub(super) fn resolved<'a>(&'a self, py: Python<'_>, tier: &'a Tier) -> &'a Masters {
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
    pub(super) fn miss_of(&self, tier: &Tier, slot: u32) -> Miss {
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
    pub(super) fn count_misses(&self, tier: &Tier, table: &[Option<Py<Instance>>], slots: &[u32]) {
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

/// Why no range of `tier` holds a bucket: the map was cleared and has not been refilled over
/// the bucket since, or anything else (as `Topology.explain` tells them apart).
#[cold]
pub(super) fn no_range(tier: &Tier) -> Miss {
    if tier.map.last_clear().is_some_and(|clear| clear.filling) {
        Miss::MapCleared
    } else {
        Miss::NoRange
    }
}

/// The wall-clock time of an apply, in unix seconds: read once per apply, before the lock.
pub(super) fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}
