//! MessagePack-RPC frames: reading a stream of messages (one call per socket read) and writing
//! the two messages of every call.
//!
//! The reader does in one call what the transport's Python did per message: find where each
//! message ends (however the socket split the bytes), refuse one over the frame limit, and
//! turn it into Python values. It reads the subset of MessagePack the protocol allows: maps
//! keyed by str or bytes only, UTF-8 strings, no extension types, at most 1024 containers
//! deep (msgpack-python's own bound). Nothing read is ever executed or unpickled.
//!
//! On the hot path it goes one step further: a well-formed dispatch request (for a worker) or
//! a successful answer (for a client) comes out as a tuple of its fields, already checked,
//! instead of a list for Python to take apart; anything else (the hello, a cancel, a ping, an
//! error answer, a malformed envelope) comes out as the plain decoded value, for the Python
//! side to judge as before.
//!
//! The byte-level parts (the scan, the hot path's fields, the writers) are the core's
//! (`shardline_core::wire`); here are the Python values: [`decode`] builds them, [`reader`]
//! holds a stream's state between reads, [`encode`] packs Python values, and [`coroutine`]
//! steps a handler's coroutine without an exception for its return.

pub mod coroutine;
pub mod decode;
pub mod encode;
pub mod reader;
