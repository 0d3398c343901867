//! Applying events: the tier configuration, instances, replicasets and bucket events, each
//! checked before the write lock is taken and applied whole under it.

use std::sync::atomic::Ordering;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyMapping, PyString};
use rustc_hash::FxHashMap;
use shardline_core::topology::clears::{Clear, ClearCause};
use shardline_core::topology::ranges::{SetBy, Setting};
use shardline_core::uuid;

use super::events::{BucketChange, InstanceChange, Op, ReplicasetChange};
use super::instance::Instance;
use super::replicaset::Replicaset;
use super::state::{now, Displaced, ReplicasetEntry, State};
use super::Topology;
use crate::py::errors::{quoted, raise, repr, Error};

/// The uuid of the replicaset an instance names, if any. Instances are made here, from
/// `uuid::format`, so the text always parses.
pub(super) fn replicaset_of(instance: &Instance) -> Option<u128> {
    instance.replicaset_uuid.as_deref().and_then(uuid::parse)
}

/// One entry of `apply_tiers`: a name that is non-empty text, a count that is an int (not a
/// bool) in `0..=u32::MAX`.
pub(super) fn tier_entry(item: &Bound<'_, PyAny>) -> PyResult<(Box<str>, u32)> {
    let py = item.py();
    let malformed = || {
        raise(
            py,
            Error::InvalidEvent(format!(
                "a tier must map a str to an int, got {}",
                repr(item)
            )),
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
        return Err(raise(
            py,
            Error::InvalidEvent("a tier name must not be empty".to_owned()),
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
            raise(
                py,
                Error::InvalidEvent(format!(
                    "tier {} has an invalid bucket_count {}",
                    quoted(&name),
                    repr(&count)
                )),
            )
        })?;
    Ok((name.into_boxed_str(), count))
}

impl Topology {
    /// Bucket events and snapshots may name any tier until `apply_tiers`; from then on only a
    /// configured one, else `UnknownTier`. Returns the tier's bucket count, if configured.
    pub(super) fn check_configured(&self, py: Python<'_>, tier: &str) -> PyResult<Option<u32>> {
        let Some(counts) = self.bucket_counts.get() else {
            return Ok(None);
        };
        match counts.get(tier) {
            Some(&count) => Ok(Some(count)),
            None => Err(raise(
                py,
                Error::UnknownTier(format!(
                    "tier {} is not in apply_tiers: it has no bucket map",
                    quoted(tier)
                )),
            )),
        }
    }

    /// A range ending at `end` may be mapped in `tier` (see `check_configured`), within the
    /// tier's bucket count (else `InvalidEvent`); no range may be mapped in a tier without
    /// buckets (`TierWithoutBuckets`).
    pub(super) fn check_range_fits(&self, py: Python<'_>, tier: &str, end: u32) -> PyResult<()> {
        let Some(count) = self.check_configured(py, tier)? else {
            return Ok(());
        };
        if count == 0 {
            return Err(raise(py, Error::TierWithoutBuckets(format!(
                    "tier {} has no buckets (bucket_count 0): it takes no bucket range, got one ending at {end}",
                    quoted(tier)
                ))));
        }
        if end > count {
            let error = Error::BeyondBucketCount {
                tier: tier.to_owned(),
                end,
                count,
            };
            return Err(raise(py, error));
        }
        Ok(())
    }

    /// The index of the tier named `name`, registering it if it is new. Its interned name is
    /// made before the write lock is taken.
    pub(super) fn registered_tier(&self, py: Python<'_>, name: &str) -> usize {
        if let Some(&index) = self.state.read().tier_index.get(name) {
            return index;
        }
        let interned = PyString::intern(py, name).unbind();
        let mut displaced = Displaced::default();
        let mut state = self.state.write();
        state.register_tier(name, interned, &mut displaced)
    }

    /// Called under the write lock, after the change: see [`Topology::membership`].
    pub(super) fn membership_moved(&self) {
        self.membership.fetch_add(1, Ordering::Release);
    }

    pub(super) fn apply_instance_change(
        &self,
        py: Python<'_>,
        change: InstanceChange,
    ) -> PyResult<()> {
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
        let key = change.uuid;
        self.merge_until_current(
            |state| state.instances.get(&key).map(|known| known.clone_ref(py)),
            |state| state.instances.get(&key).map(Py::as_ptr),
            |known: &Py<Instance>| known.as_ptr(),
            |known| {
                let known = known.map(Py::get);
                let merged = match known {
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
                        uuid: uuid::format(key),
                        replicaset_uuid: change.replicaset_uuid.map(uuid::format),
                        current_state: change.current_state.clone(),
                        address: change.address.clone(),
                        name: change.name.clone(),
                    },
                };
                let changed = known.is_none_or(|known| *known != merged);
                let from = known.and_then(replicaset_of);
                let to = replicaset_of(&merged);
                Ok((Py::new(py, merged)?, changed, from, to))
            },
            |state, displaced, (object, changed, from, to)| {
                if let Some(old) = state.instances.insert(key, object) {
                    displaced.objects.push(old.into_any());
                }
                state.join(key, from, to);
                changed
            },
        )
    }

    pub(super) fn apply_replicaset_change(
        &self,
        py: Python<'_>,
        change: ReplicasetChange,
    ) -> PyResult<()> {
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
        let key = change.uuid;
        self.merge_until_current(
            |state| {
                let known = state.replicasets.get(&key)?;
                Some((known.tier.clone(), known.master, known.object.clone_ref(py)))
            },
            |state| {
                state
                    .replicasets
                    .get(&key)
                    .map(|entry| entry.object.as_ptr())
            },
            |(_, _, object): &(Box<str>, Option<u128>, Py<Replicaset>)| object.as_ptr(),
            |known| {
                let (old_tier, old_master, old_object) = match known {
                    Some((tier, master, object)) => (Some(tier), *master, Some(object)),
                    None => (None, None, None),
                };
                let tier: Box<str> = match (&change.tier, old_tier) {
                    (Some(tier), _) => tier.as_str().into(),
                    (None, Some(tier)) => tier.clone(),
                    (None, None) => {
                        return Err(raise(
                            py,
                            Error::InvalidEvent(format!(
                                "field 'tier' is required for a replicaset not yet known: {}",
                                uuid::format(key)
                            )),
                        ))
                    }
                };
                let master = change.current_master_uuid.or(old_master);
                let name = change
                    .name
                    .clone()
                    .or_else(|| old_object.and_then(|object| object.get().name.clone()));
                let merged = Replicaset {
                    uuid: uuid::format(key),
                    tier: tier.to_string(),
                    current_master_uuid: master.map(uuid::format),
                    name,
                };
                let changed = old_object.is_none_or(|old| *old.get() != merged);
                let object = Py::new(py, merged)?;
                let clear = match old_tier {
                    None => Some(ClearCause::ReplicasetJoined {
                        replicaset: key,
                        tier: tier.clone(),
                    }),
                    Some(old) if *old != tier => Some(ClearCause::ReplicasetMoved {
                        replicaset: key,
                        from: old.clone(),
                        to: tier.clone(),
                    }),
                    Some(_) => None,
                }
                .map(|cause| Clear { cause, at: now() });
                let entry = ReplicasetEntry {
                    tier,
                    master,
                    object,
                };
                Ok((entry, old_tier.cloned(), clear, changed))
            },
            |state, displaced, (entry, old_tier, clear, changed)| {
                // A new member may take buckets from any replicaset of its tier; a member
                // moving between tiers, from any of either.
                if let Some(clear) = &clear {
                    if let Some(old) = old_tier.as_deref().filter(|old| **old != *entry.tier) {
                        state.clear_tier(old, clear, displaced);
                    }
                    state.clear_tier(&entry.tier, clear, displaced);
                }
                if let Some(old) = state.replicasets.insert(key, entry) {
                    displaced.objects.push(old.object.into_any());
                }
                changed
            },
        )
    }

    /// Stores an instance or a replicaset merged from the one it replaces, with no lock held
    /// while it is made: `copy` takes the current entry's references under the read lock,
    /// `merge` makes the new entry from them, and `store` writes it under the write lock (after
    /// every tier forgot its masters) if the entry is still the one copied, compared by the
    /// address of its object (`address_in` the state's, `address_of` the copy's: the copy's
    /// reference keeps that address from being reused); else it merges again from the newer
    /// one. `store` returns whether the entry changed, which moves `membership_version`.
    fn merge_until_current<K, M>(
        &self,
        copy: impl Fn(&State) -> Option<K>,
        address_in: impl Fn(&State) -> Option<*mut pyo3::ffi::PyObject>,
        address_of: impl Fn(&K) -> *mut pyo3::ffi::PyObject,
        mut merge: impl FnMut(Option<&K>) -> PyResult<M>,
        mut store: impl FnMut(&mut State, &mut Displaced, M) -> bool,
    ) -> PyResult<()> {
        loop {
            let known = copy(&self.state.read());
            let merged = merge(known.as_ref())?;
            // Declared before the guard, so dropped after it (see `Displaced`).
            let mut displaced = Displaced::default();
            let mut state = self.state.write();
            if address_in(&state) != known.as_ref().map(&address_of) {
                continue;
            }
            state.forget_masters(&mut displaced);
            if store(&mut state, &mut displaced, merged) {
                self.membership_moved();
            }
            return Ok(());
        }
    }

    pub(super) fn apply_bucket_change(&self, py: Python<'_>, change: BucketChange) -> PyResult<()> {
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

    /// `apply_tiers`: sets the tier configuration once, registering each tier.
    pub(super) fn configure_tiers(
        &self,
        py: Python<'_>,
        tiers: &Bound<'_, PyMapping>,
    ) -> PyResult<bool> {
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
            Some((name, last, count)) => Err(raise(
                py,
                Error::InvalidEvent(format!(
                    "tier {} already maps bucket {last} beyond bucket_count {count}",
                    quoted(&name)
                )),
            )),
            None => Ok(true),
        }
    }

    /// `clear`: forgets every instance, replicaset and range in one critical section.
    pub(super) fn forget_all(&self) -> bool {
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
}
