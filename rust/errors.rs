//! Raising the Python exception hierarchy from Rust.
//!
//! The classes live in `shardline/errors.py` because they need multiple inheritance
//! (`InvalidEvent` is both a `ShardlineError` and a `ValueError`), which PyO3's
//! `create_exception!` cannot express. Rust imports each class once and caches it.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

static INVALID_EVENT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static UNKNOWN_TIER: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static TIER_WITHOUT_BUCKETS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static UNHASHABLE_KEY: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INVALID_ARGUMENT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INVALID_ARGUMENT_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn raise(py: Python<'_>, cell: &'static PyOnceLock<Py<PyType>>, name: &str, msg: String) -> PyErr {
    match cell.import(py, "shardline.errors", name) {
        Ok(class) => PyErr::from_type(class.clone(), msg),
        Err(import_error) => import_error,
    }
}

/// A malformed event or row; `msg` names the field and the value.
pub fn invalid_event(py: Python<'_>, msg: String) -> PyErr {
    raise(py, &INVALID_EVENT, "InvalidEvent", msg)
}

/// A tier that was never registered (or, for hashing, has no bucket count).
pub fn unknown_tier(py: Python<'_>, msg: String) -> PyErr {
    raise(py, &UNKNOWN_TIER, "UnknownTier", msg)
}

/// Routing, or a bucket range, in a tier configured with bucket_count 0.
pub fn tier_without_buckets(py: Python<'_>, msg: String) -> PyErr {
    raise(py, &TIER_WITHOUT_BUCKETS, "TierWithoutBuckets", msg)
}

/// A key value the hashing scheme cannot encode.
pub fn unhashable_key(py: Python<'_>, msg: String) -> PyErr {
    raise(py, &UNHASHABLE_KEY, "UnhashableKey", msg)
}

/// A bucket id or count out of range, or an array of a shape that is not read; `msg` names the
/// value (and its position in a sequence).
pub fn invalid_argument(py: Python<'_>, msg: String) -> PyErr {
    raise(py, &INVALID_ARGUMENT, "InvalidArgument", msg)
}

/// An argument of the wrong type (a bucket id that is not an int, an array of other items than
/// integers): `InvalidArgumentType`, both an `InvalidArgument` and a `TypeError`.
pub fn invalid_argument_type(py: Python<'_>, msg: String) -> PyErr {
    raise(py, &INVALID_ARGUMENT_TYPE, "InvalidArgumentType", msg)
}

/// `value`'s Python repr, for messages; never fails.
pub fn repr(value: &Bound<'_, PyAny>) -> String {
    value
        .repr()
        .map_or_else(|_| "<unrepresentable>".to_owned(), |r| r.to_string())
}

/// `value`'s repr for a message, cut to 80 characters (a caller's object may be huge, or its
/// `__repr__` may fail).
pub fn short_repr(value: &Bound<'_, PyAny>) -> String {
    let repr = repr(value);
    if repr.chars().count() > 80 {
        repr.chars().take(77).collect::<String>() + "..."
    } else {
        repr
    }
}

/// `text` quoted the way Python's `repr` quotes a str, so messages read like Python.
pub fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}
