//! shardline's core without Python: what the extension module (`rust/lib.rs`) builds on and
//! what `cargo test -p shardline-core` checks without an interpreter. Nothing here links to
//! PyO3; refusals are [`Error`]s, which the extension turns into Python exceptions in one place
//! (`rust/py/errors.rs`).

pub mod error;
pub mod hashing;
pub mod pool;
pub mod tally;
pub mod text;
pub mod topology;
pub mod uuid;
pub mod wire;

pub use error::Error;
