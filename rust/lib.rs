//! shardline's Rust core. This file only wires modules; each concept has its own file.

mod bucket_divisor;
mod bucket_map;
mod bucket_payload;
mod bucket_range;
mod coroutine_send;
mod cpu_lanes;
mod crc32c;
mod dispatch_times;
mod errors;
mod events;
mod gil_lock;
mod health;
mod instance;
mod int_arrays;
mod int_key_lanes;
mod key_encoding;
mod keyed_record;
mod lua_tostring;
mod map_clear;
mod map_stats;
mod msgpack_rpc;
mod murmur3;
mod out_array;
mod pool;
mod replicaset;
mod round_robin;
mod route_explanation;
mod route_stats;
mod sharding;
mod str_key_lanes;
mod tally;
mod topology;
mod uuid;
mod workers_view;

use pyo3::prelude::*;

#[pymodule(gil_used = false)]
mod _core {
    #[pymodule_export]
    use crate::bucket_payload::BucketPayload;
    #[pymodule_export]
    use crate::bucket_range::BucketRange;
    #[pymodule_export]
    use crate::coroutine_send::coroutine_send;
    #[pymodule_export]
    use crate::events::parse_bucket_row;
    #[pymodule_export]
    use crate::instance::Instance;
    #[pymodule_export]
    use crate::keyed_record::KeyedRecord;
    #[pymodule_export]
    use crate::map_stats::MapStats;
    #[pymodule_export]
    use crate::msgpack_rpc::{
        msgpack_answer, msgpack_call, msgpack_plain, msgpack_request, msgpack_result,
        msgpack_unpack, MsgpackReader,
    };
    #[pymodule_export]
    use crate::pool::WorkerPool;
    #[pymodule_export]
    use crate::replicaset::Replicaset;
    #[pymodule_export]
    use crate::round_robin::PoolRotationSelect;
    #[pymodule_export]
    use crate::route_explanation::RouteExplanation;
    #[pymodule_export]
    use crate::route_stats::RouteStats;
    #[pymodule_export]
    use crate::sharding::bucket_id;
    #[pymodule_export]
    use crate::topology::Topology;
    #[pymodule_export]
    use crate::workers_view::WorkersView;
}
