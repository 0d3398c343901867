//! `RouteStats`: what one tier's lookups counted (`Topology.route_stats`), for metrics read on
//! scrape.
//!
//! Each tier keeps a [`RouteTally`] beside its map: the lookups add to it under the read lock
//! (a plain add, see [`Tally`]), and a miss, the cold path, finds its reason there too.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::py::errors::quoted;
use shardline_core::tally::Tally;

/// Why a lookup answered None, with the words `Topology.explain` uses for the same thing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// No range covers the bucket, and none has come since the map was last cleared.
    MapCleared,
    /// No range covers the bucket for another reason (never mapped, deleted, not polled).
    NoRange,
    /// The range's owner is not a known replicaset.
    ReplicasetUnknown,
    /// The replicaset has no current master, or its master is not a known instance.
    MasterUnknown,
}

/// The reasons' names, in the order of [`Miss`].
pub const MISS_NAMES: [&str; 4] = [
    "map-cleared",
    "no-range",
    "replicaset-unknown",
    "master-unknown",
];

/// One tier's lookups: keys or buckets looked up, and those that found nothing, by reason.
#[derive(Default)]
pub struct RouteTally {
    routes: Tally,
    misses: [Tally; 4],
}

impl RouteTally {
    /// `n` more keys or buckets looked up (one add per call, however many keys).
    #[inline(always)]
    pub fn routed(&self, n: u64) {
        self.routes.add(n);
    }

    /// `n` of them found nothing, because of `miss`.
    #[cold]
    pub fn missed(&self, miss: Miss, n: u64) {
        self.misses[miss as usize].add(n);
    }

    /// The counts, copied (under the lock: no Python object is made).
    pub fn read(&self) -> (u64, [u64; 4]) {
        (self.routes.get(), self.misses.each_ref().map(Tally::get))
    }
}

/// One tier's lookups, counted since the topology was made.
///
/// `routes` counts the keys and buckets looked up by `owner`, `owners`, `find_bucket_master`,
/// `route` and `route_many` (each key of a batch once; `explain` is not counted), `misses`
/// those among them answered None, by reason: `"map-cleared"` (no range covers the bucket, and
/// none has come since the map was last cleared), `"no-range"` (no range covers it for another
/// reason), `"replicaset-unknown"` (the range's owner is not a known replicaset),
/// `"master-unknown"` (the owner has no current master, or its master is not a known
/// instance): the reasons `Topology.explain` gives. Every reason is present, 0 until it
/// happens. `owner` and `owners` answer a replicaset, so they miss only for want of a range.
/// A call that raises (an unknown tier, a bad key) counts nothing.
///
/// Implementation notes:
///     The counts live beside the tier's map and are added under the read lock the lookup
///     takes anyway, one plain add per call (see `Tally`); a miss finds its reason on the
///     cold path. `route_many` looks for misses only when the tier's table of masters says
///     some bucket can miss (a hole in the map, a range without a master).
#[pyclass(frozen, module = "shardline", name = "RouteStats", get_all)]
pub struct RouteStats {
    pub tier: String,
    pub routes: u64,
    pub misses: Py<PyDict>,
}

impl RouteStats {
    /// From the counts [`RouteTally::read`] copied under the lock.
    pub fn new(py: Python<'_>, tier: &str, routes: u64, misses: [u64; 4]) -> PyResult<Self> {
        let dict = PyDict::new(py);
        for (name, count) in MISS_NAMES.iter().zip(misses) {
            dict.set_item(name, count)?;
        }
        Ok(Self {
            tier: tier.to_owned(),
            routes,
            misses: dict.unbind(),
        })
    }
}

#[pymethods]
impl RouteStats {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "RouteStats(tier={}, routes={}, misses={})",
            quoted(&self.tier),
            self.routes,
            self.misses.bind(py).repr()?
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{Miss, RouteTally, MISS_NAMES};

    #[test]
    fn misses_count_by_reason_in_the_order_of_the_names() {
        let tally = RouteTally::default();
        tally.routed(5);
        tally.missed(Miss::NoRange, 2);
        tally.missed(Miss::MasterUnknown, 1);
        let (routes, misses) = tally.read();
        assert_eq!(routes, 5);
        assert_eq!(misses, [0, 2, 0, 1]);
        assert_eq!(MISS_NAMES[Miss::NoRange as usize], "no-range");
        assert_eq!(MISS_NAMES[Miss::MasterUnknown as usize], "master-unknown");
    }
}
