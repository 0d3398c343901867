//! Sets the interpreter's `cfg`s (`Py_GIL_DISABLED`, `Py_LIMITED_API`, `Py_3_*`) for this crate,
//! as PyO3's own build script does for PyO3 (see `rust/py/gil_lock.rs`, and
//! the `free-threaded` check in `rust/lib.rs`).

fn main() {
    pyo3_build_config::use_pyo3_cfgs();
}
