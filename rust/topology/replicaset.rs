//! `Replicaset`: one replicaset, its tier and its current master.

use pyo3::prelude::*;

use super::instance::repr_option;
use crate::py::errors::quoted;

/// A replicaset of the cluster: immutable; the topology replaces it on every change. `name` is
/// its name in the cluster (Picodata's `_pico_replicaset.name`), for people reading it.
#[pyclass(frozen, eq, hash, module = "shardline", name = "Replicaset", get_all)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Replicaset {
    pub uuid: String,
    pub tier: String,
    pub current_master_uuid: Option<String>,
    pub name: Option<String>,
}

#[pymethods]
impl Replicaset {
    #[new]
    #[pyo3(signature = (uuid, tier, current_master_uuid = None, name = None))]
    fn new(
        uuid: String,
        tier: String,
        current_master_uuid: Option<String>,
        name: Option<String>,
    ) -> Self {
        Self {
            uuid,
            tier,
            current_master_uuid,
            name,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Replicaset(uuid={}, tier={}, current_master_uuid={}, name={})",
            quoted(&self.uuid),
            quoted(&self.tier),
            repr_option(&self.current_master_uuid),
            repr_option(&self.name),
        )
    }
}
