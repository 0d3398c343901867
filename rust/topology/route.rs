//! Lookups: a tier found by name under the read lock, keys hashed to buckets, and buckets to
//! the masters that serve them.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};
use rustc_hash::FxHashMap;
use shardline_core::hashing::divisor::BucketDivisor;
use shardline_core::hashing::int_lanes;
use shardline_core::uuid;

use super::explanation::{Found, RouteExplanation};
use super::instance::Instance;
use super::state::{no_range, Masters, State, Tier};
use super::Topology;
use crate::hashing::{bucket_of, with_scratch, DecimalFormat, KeyHasher};
use crate::py::errors::short_repr;
use crate::py::errors::{quoted, raise, repr, Error};
use crate::py::int_arrays::{self, IntArray};
use crate::py::out_array::OutArray;

/// The text of a tier name given to a lookup: a str that is not text (it holds a lone
/// surrogate) names no tier.
pub(super) fn lookup_text<'a>(tier: &'a Bound<'_, PyString>) -> PyResult<&'a str> {
    tier.to_str().map_err(|_| {
        raise(
            tier.py(),
            Error::UnknownTier(format!(
                "unknown tier {}: not valid text",
                repr(tier.as_any())
            )),
        )
    })
}

/// Turns each slot in `routes` into the index of its master in the returned list of distinct
/// masters (by identity, None included), in the order the slots first reach them. Runs under the
/// read lock: it only copies references.
pub(super) fn distinct_routes(
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
pub(super) fn no_route_in(py: Python<'_>, tier: &str) -> PyErr {
    raise(py, Error::TierWithoutBuckets(format!(
            "tier {} has no buckets (bucket_count 0, an arbiter tier): no key or bucket routes to it",
            quoted(tier)
        )))
}

impl Topology {
    /// The tier's bucket count, to hash keys with: never 0 (a tier without buckets raises
    /// `TierWithoutBuckets`, a tier not configured `UnknownTier`).
    pub(super) fn bucket_count(&self, py: Python<'_>, tier: &str) -> PyResult<u32> {
        match self
            .bucket_counts
            .get()
            .and_then(|counts| counts.get(tier).copied())
        {
            Some(0) => Err(no_route_in(py, tier)),
            Some(count) => Ok(count),
            None => Err(raise(
                py,
                Error::UnknownTier(format!(
                    "tier {} has no bucket count: it is not in apply_tiers",
                    quoted(tier)
                )),
            )),
        }
    }

    /// Reads the tier named `tier` under the read lock: `read` must only copy (no Python
    /// object is made under the lock). Raises `UnknownTier` after the lock is released.
    ///
    /// O(1) in the number of tiers: the name is compared by identity with the tier found last,
    /// else encoded (with no lock held: an unencodable name raises) and hashed.
    pub(super) fn read_tier<R>(
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
        found.ok_or_else(|| {
            raise(
                tier.py(),
                Error::UnknownTier(format!("unknown tier {}", quoted(text))),
            )
        })
    }

    /// `read_tier` for a lookup by bucket: a tier without buckets raises `TierWithoutBuckets`
    /// (after the lock is released).
    pub(super) fn read_routable<R>(
        &self,
        tier: &Bound<'_, PyString>,
        read: impl FnOnce(&State, &Tier) -> R,
    ) -> PyResult<R> {
        self.read_tier(tier, |state, known| {
            known.has_buckets.then(|| read(state, known))
        })?
        .ok_or_else(|| no_route_in(tier.py(), &tier.to_string_lossy()))
    }

    /// The bucket of each key, hashed before any lock is taken (hashing may call into Python).
    pub(super) fn buckets_of_keys(
        &self,
        bucket_count: u32,
        keys: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<u32>> {
        let divisor = BucketDivisor::new(bucket_count);
        if let Some(array) = IntArray::of(keys, "keys")? {
            let mut buckets = Vec::with_capacity(array.len());
            array.for_each_chunk_of_bits(|bits, signed| {
                int_lanes::append_buckets(bits, signed, divisor, &mut buckets);
            });
            return Ok(buckets);
        }
        let mut buckets =
            Vec::with_capacity(keys.cast_exact::<PyList>().map_or(0, |list| list.len()));
        KeyHasher::default().picodata_each(keys, |hash| buckets.push(divisor.bucket(hash)))?;
        Ok(buckets)
    }

    /// The bucket of `key` in `tier` by the Picodata scheme (`bucket_id`, `route`, `explain`).
    #[inline]
    pub(super) fn key_bucket(
        &self,
        tier: &Bound<'_, PyString>,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<u32> {
        let count = self.bucket_count(tier.py(), lookup_text(tier)?)?;
        let hash = with_scratch(|hasher| hasher.picodata(key, DecimalFormat::Binary))?;
        Ok(bucket_of(hash, count))
    }

    /// `route_many`: the keys hashed with no lock held, their slots and masters read under it.
    pub(super) fn route_keys<'py>(
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
            return Err(raise(
                py,
                Error::InvalidArgument(format!(
                    "out must have one item per key: it has {} items, for {} keys",
                    out.len(),
                    routes.len()
                )),
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
            return Err(raise(
                py,
                Error::InvalidArgument(format!(
                    "out cannot hold the indices of {} routes: use 64-bit items",
                    distinct.len()
                )),
            ));
        }
        out.write(&routes);
        PyList::new(py, distinct)
    }

    /// `explain`: the chain from `key` to its master, copied under the read lock.
    pub(super) fn explain_key(
        &self,
        tier: &Bound<'_, PyString>,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<RouteExplanation> {
        let py = tier.py();
        let bucket = self.key_bucket(tier, key)?;
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

    /// `owners`: each bucket id's owner, read under one read lock.
    pub(super) fn owners_of<'py>(
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

    /// `replicaset_instances`: the members the index names, copied under the read lock.
    pub(super) fn members<'py>(
        &self,
        replicaset_uuid: &Bound<'py, PyString>,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = replicaset_uuid.py();
        let key = replicaset_uuid
            .to_str()
            .ok()
            .and_then(uuid::parse)
            .ok_or_else(|| {
                raise(
                    py,
                    Error::InvalidArgument(format!(
                        "replicaset_uuid must be a UUID, got {}",
                        repr(replicaset_uuid.as_any())
                    )),
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
}
