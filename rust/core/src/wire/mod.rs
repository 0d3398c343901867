//! MessagePack-RPC below the Python values: scanning a stream for message ends, reading the
//! hot path's fields, and writing what msgpack-python writes (the reader and the packers are
//! the extension's, `rust/wire/`).

pub mod encode;
pub mod fields;
pub mod scan;
