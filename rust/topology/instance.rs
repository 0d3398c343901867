//! `Instance`: one Picodata instance as the topology last heard of it.

use pyo3::prelude::*;

use crate::py::errors::quoted;

/// An instance of the cluster: immutable; the topology replaces it on every change.
///
/// `uuid` and `replicaset_uuid` are canonical lowercase UUID strings; `name` is the instance's
/// name in the cluster (Picodata's `_pico_instance.name`), for people reading it: routing goes by
/// uuid. Fields an event has not mentioned yet are `None`.
#[pyclass(frozen, eq, hash, module = "shardline", name = "Instance", get_all)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Instance {
    pub uuid: String,
    pub replicaset_uuid: Option<String>,
    pub current_state: Option<String>,
    pub address: Option<String>,
    pub name: Option<String>,
}

#[pymethods]
impl Instance {
    #[new]
    #[pyo3(signature = (uuid, replicaset_uuid = None, current_state = None, address = None, name = None))]
    fn new(
        uuid: String,
        replicaset_uuid: Option<String>,
        current_state: Option<String>,
        address: Option<String>,
        name: Option<String>,
    ) -> Self {
        Self {
            uuid,
            replicaset_uuid,
            current_state,
            address,
            name,
        }
    }

    /// Whether the instance's current state is `"Online"`.
    #[getter]
    fn is_online(&self) -> bool {
        self.current_state.as_deref() == Some("Online")
    }

    fn __repr__(&self) -> String {
        format!(
            "Instance(uuid={}, replicaset_uuid={}, current_state={}, address={}, name={})",
            quoted(&self.uuid),
            repr_option(&self.replicaset_uuid),
            repr_option(&self.current_state),
            repr_option(&self.address),
            repr_option(&self.name),
        )
    }
}

pub fn repr_option(value: &Option<String>) -> String {
    value
        .as_ref()
        .map_or_else(|| "None".to_owned(), |v| format!("{v:?}"))
}
