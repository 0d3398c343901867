//! `coroutine_send`: one step of a coroutine, its return told apart without an exception.
//!
//! A worker runs a handler's coroutine up to its first wait inside `data_received`; most
//! handlers return there. Driven from Python (`coroutine.send(None)`), that return is a
//! `StopIteration` made, raised and caught on every call; `PyIter_Send` (the stable ABI's,
//! since 3.10) hands the returned value over as such.

use pyo3::ffi;
use pyo3::prelude::*;

/// `coroutine.send(value)`: `(True, returned)` once the coroutine returned, `(False,
/// yielded)` while it waits on what it yielded; an exception it raises propagates as it is.
#[pyfunction]
pub fn coroutine_send<'py>(
    py: Python<'py>,
    coroutine: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
) -> PyResult<(bool, Bound<'py, PyAny>)> {
    let mut out: *mut ffi::PyObject = std::ptr::null_mut();
    // SAFETY: both arguments are live references held for the call; `out` receives a new
    // reference (or NULL on error), owned below.
    let result = unsafe { ffi::PyIter_Send(coroutine.as_ptr(), value.as_ptr(), &raw mut out) };
    match result {
        ffi::PySendResult::PYGEN_ERROR => Err(PyErr::fetch(py)),
        // SAFETY: on return and on yield `out` is a new, non-NULL reference
        done => Ok((done == ffi::PySendResult::PYGEN_RETURN, unsafe {
            Bound::from_owned_ptr(py, out)
        })),
    }
}
