//! `MapStats`: what one tier's bucket map counts over its life (`Topology.map_stats`), for
//! metrics read on scrape.
//!
//! The topology copies the map's plain counters under its read lock; the Python objects are
//! built here, after the lock is released.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::py::errors::quoted;
use shardline_core::topology::clears::{ClearHistory, CAUSE_NAMES};

/// One tier's bucket map, counted over its life.
///
/// `epoch` is the map's epoch and `ranges` how many ranges it holds. `clears` counts the
/// clears that removed ranges, by cause: `"replicaset-deleted"`, `"replicaset-joined"`,
/// `"replicaset-moved"`, `"bucket-overlap"` and `"topology-cleared"` (every cause is present,
/// 0 until it happens). `empty_seconds` is the time the map spent empty after having held
/// ranges (by the wall clock, up to the call, the current period included), and
/// `empty_since` the unix time the map was left empty while it still is, None while it holds
/// ranges or before it ever held any.
///
/// Implementation notes:
///     The counters move only where the map changes (the times are those each change reads
///     before the write lock), never on a lookup, so `owner`, `route` and `route_many` pay
///     nothing for them.
#[pyclass(frozen, module = "shardline", name = "MapStats", get_all)]
pub struct MapStats {
    pub tier: String,
    pub epoch: u64,
    pub ranges: usize,
    pub clears: Py<PyDict>,
    pub empty_seconds: f64,
    pub empty_since: Option<f64>,
}

impl MapStats {
    /// Builds the stats of `tier` from what was copied under the lock (`now`: the time the
    /// call read before the lock).
    pub fn new(
        py: Python<'_>,
        tier: &str,
        epoch: u64,
        ranges: usize,
        history: &ClearHistory,
        now: f64,
    ) -> PyResult<Self> {
        let clears = PyDict::new(py);
        for (name, count) in CAUSE_NAMES.iter().zip(history.clears) {
            clears.set_item(name, count)?;
        }
        Ok(Self {
            tier: tier.to_owned(),
            epoch,
            ranges,
            clears: clears.unbind(),
            empty_seconds: history.empty_seconds_until(now),
            empty_since: history.empty_since,
        })
    }
}

#[pymethods]
impl MapStats {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        // as Python writes these values: the tier quoted, a missing time as None
        let empty_since = self
            .empty_since
            .map_or_else(|| "None".to_owned(), |since| format!("{since:?}"));
        Ok(format!(
            "MapStats(tier={}, epoch={}, ranges={}, clears={}, empty_seconds={:?}, \
             empty_since={})",
            quoted(&self.tier),
            self.epoch,
            self.ranges,
            self.clears.bind(py).repr()?,
            self.empty_seconds,
            empty_since
        ))
    }
}
