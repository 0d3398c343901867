//! Build script: only PyO3's configuration flags, so the Rust core can tell a free-threaded
//! interpreter (`cfg(Py_GIL_DISABLED)`) from one with a GIL (see `rust/tally.rs`).

fn main() {
    pyo3_build_config::use_pyo3_cfgs();
}
