//! `BucketRange`: the range holding one bucket, with when and by what it was last set.

use pyo3::prelude::*;
use shardline_core::topology::ranges::Stamp;
use shardline_core::uuid;

use crate::py::errors::quoted;

/// The range of buckets that holds a bucket, its owner, and where that range came from.
///
/// `start` and `end` are inclusive. `epoch` is the tier's map epoch (`Topology.epoch`) right
/// after the change that last set this range: if the tier's epoch still equals it, nothing has
/// changed the map since. `set_at` is that change's wall-clock time (unix seconds) and `set_by`
/// its kind: `"event"` (a bucket event), `"snapshot"` (`apply_bucket_snapshot` given events or
/// rows) or `"poll"` (`apply_bucket_snapshot` given `_pico_bucket` JSON text or a
/// `BucketPayload`). A snapshot or poll that repeats a range identically (same bounds, same
/// replicaset) does not set it again, so it keeps its stamp.
#[pyclass(frozen, eq, module = "shardline", name = "BucketRange", get_all)]
#[derive(Clone, Debug, PartialEq)]
pub struct BucketRange {
    pub start: u32,
    pub end: u32,
    pub replicaset_uuid: String,
    pub epoch: u64,
    pub set_at: f64,
    pub set_by: &'static str,
}

impl BucketRange {
    /// The range `[start, end]` of replicaset `owner`, with its `stamp`.
    pub fn of(start: u32, end: u32, owner: u128, stamp: &Stamp) -> Self {
        Self {
            start,
            end,
            replicaset_uuid: uuid::format(owner),
            epoch: stamp.epoch,
            set_at: stamp.at,
            set_by: stamp.by.name(),
        }
    }
}

#[pymethods]
impl BucketRange {
    fn __repr__(&self) -> String {
        format!(
            "BucketRange(start={}, end={}, replicaset_uuid={}, epoch={}, set_at={:?}, set_by={})",
            self.start,
            self.end,
            quoted(&self.replicaset_uuid),
            self.epoch,
            self.set_at,
            quoted(self.set_by),
        )
    }
}
