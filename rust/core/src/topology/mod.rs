//! One tier's bucket map and what it is made of, and the reader of a poll's JSON text: the
//! topology's parts that need no Python (the `Topology` class is `rust/topology/`).

pub mod bucket_map;
pub mod clears;
pub mod payload;
pub mod ranges;
