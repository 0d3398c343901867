//! shardline's extension module (`shardline._core`): the Python classes and functions, over the
//! pure core in `rust/core` (crate `shardline-core`). This file only wires modules; each concept
//! has its own folder (see docs/architecture.md).

mod hashing;
mod pool;
mod py;
mod topology;
mod wire;

// The core's counters add without a read-modify-write, which is exact only where a GIL
// serialises the adds: a build for an interpreter without one must make them atomic.
#[cfg(all(Py_GIL_DISABLED, not(feature = "free-threaded")))]
compile_error!("a free-threaded interpreter needs the `free-threaded` feature");

use pyo3::prelude::*;

#[pymodule(gil_used = false)]
mod _core {
    #[pymodule_export]
    use crate::hashing::bucket_id;
    #[pymodule_export]
    use crate::pool::keyed_record::KeyedRecord;
    #[pymodule_export]
    use crate::pool::rotation::PoolRotationSelect;
    #[pymodule_export]
    use crate::pool::views::WorkersView;
    #[pymodule_export]
    use crate::pool::WorkerPool;
    #[pymodule_export]
    use crate::topology::bucket_range::BucketRange;
    #[pymodule_export]
    use crate::topology::events::parse_bucket_row;
    #[pymodule_export]
    use crate::topology::explanation::RouteExplanation;
    #[pymodule_export]
    use crate::topology::instance::Instance;
    #[pymodule_export]
    use crate::topology::map_stats::MapStats;
    #[pymodule_export]
    use crate::topology::payload::BucketPayload;
    #[pymodule_export]
    use crate::topology::replicaset::Replicaset;
    #[pymodule_export]
    use crate::topology::route_stats::RouteStats;
    #[pymodule_export]
    use crate::topology::Topology;
    #[pymodule_export]
    use crate::wire::coroutine::coroutine_send;
    #[pymodule_export]
    use crate::wire::decode::msgpack_unpack;
    #[pymodule_export]
    use crate::wire::encode::{
        msgpack_answer, msgpack_call, msgpack_plain, msgpack_request, msgpack_result,
    };
    #[pymodule_export]
    use crate::wire::reader::MsgpackReader;
}
