//! The worker pool's bookkeeping below the Python objects (the `WorkerPool` class is
//! `rust/pool/`): entries in admission order and their indices, the filter of pooled
//! addresses, each worker's load and health, the pool's clock and its random draws.

pub mod clock;
pub mod draws;
pub mod entries;
pub mod filter;
pub mod health;
pub mod load;
