//! The Python glue every part of the extension shares: raising the core's refusals as Python
//! exceptions, reading integer arguments and arrays, writing `out=` arrays, and the GIL-backed
//! lock.

pub mod errors;
pub mod gil_lock;
pub mod int_arrays;
pub mod out_array;
