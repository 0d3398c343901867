//! The Python glue every part of the extension shares: raising the core's refusals as Python
//! exceptions, reading integer arguments and arrays, writing `out=` arrays, the GIL-backed lock
//! and the hot-path counters.

pub mod errors;
pub mod gil_lock;
pub mod int_arrays;
pub mod out_array;
pub mod tally;
