//! The one place where the core's refusals ([`Error`]) become Python exceptions.
//!
//! The classes live in `shardline/errors.py` because they need multiple inheritance
//! (`InvalidEvent` is both a `ShardlineError` and a `ValueError`), which PyO3's
//! `create_exception!` cannot express. Rust imports each class once and caches it.

use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
pub use shardline_core::text::quoted;
pub use shardline_core::Error;

static INVALID_EVENT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static UNKNOWN_TIER: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static TIER_WITHOUT_BUCKETS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static UNHASHABLE_KEY: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INVALID_ARGUMENT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INVALID_ARGUMENT_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn of_class(
    py: Python<'_>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
    message: String,
) -> PyErr {
    match cell.import(py, "shardline.errors", name) {
        Ok(class) => PyErr::from_type(class.clone(), message),
        Err(import_error) => import_error,
    }
}

/// The exception of `error`'s class (see [`Error`]'s variants), with its message.
///
/// A wire refusal raised here (not by a reader with classes of its own, see [`raise_in_stream`])
/// is a `ValueError`.
///
/// Implementation notes:
///     Cold and never inlined: every caller is an error path, which then stays out of the
///     hot code around it.
#[cold]
#[inline(never)]
pub fn raise(py: Python<'_>, error: Error) -> PyErr {
    let message = error.to_string();
    match error {
        Error::InvalidEvent(_)
        | Error::NotABucketBound { .. }
        | Error::ReversedRange { .. }
        | Error::Overlap { .. }
        | Error::OtherTier { .. }
        | Error::BeyondBucketCount { .. } => of_class(py, &INVALID_EVENT, "InvalidEvent", message),
        Error::UnknownTier(_) => of_class(py, &UNKNOWN_TIER, "UnknownTier", message),
        Error::TierWithoutBuckets(_) => {
            of_class(py, &TIER_WITHOUT_BUCKETS, "TierWithoutBuckets", message)
        }
        Error::Unencodable(_) | Error::UnhashableKey { .. } => {
            of_class(py, &UNHASHABLE_KEY, "UnhashableKey", message)
        }
        Error::InvalidArgument(_) => of_class(py, &INVALID_ARGUMENT, "InvalidArgument", message),
        Error::InvalidArgumentType(_) => {
            of_class(py, &INVALID_ARGUMENT_TYPE, "InvalidArgumentType", message)
        }
        Error::UnknownScheme(_)
        | Error::UnknownDecimalFormat(_)
        | Error::Value(_)
        | Error::FrameTooLarge
        | Error::Malformed(_) => PyValueError::new_err(message),
        Error::Type(_) => PyTypeError::new_err(message),
        Error::FedConcurrently => PyRuntimeError::new_err(message),
    }
}

/// A wire refusal that ends a stream, as the stream's reader raises it: `too_large` with the
/// frame limit `limit` for [`Error::FrameTooLarge`], `malformed` with "unreadable msgpack: ..."
/// for [`Error::Malformed`]; any other error as [`raise`] makes it.
pub fn raise_in_stream(
    py: Python<'_>,
    error: Error,
    malformed: &Bound<'_, PyType>,
    too_large: &Bound<'_, PyType>,
    limit: usize,
) -> PyErr {
    match error {
        Error::FrameTooLarge => PyErr::from_type(too_large.clone(), (limit,)),
        Error::Malformed(what) => {
            PyErr::from_type(malformed.clone(), format!("unreadable msgpack: {what}"))
        }
        other => raise(py, other),
    }
}

/// `KeyError(key)`: a mapping has no item `key` (the caller's own object, as a dict raises it).
pub fn missing_key(key: Py<PyAny>) -> PyErr {
    PyKeyError::new_err(key)
}

/// `Result<T, Error>` raised as [`raise`] makes it.
pub trait OrRaise<T> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> OrRaise<T> for Result<T, Error> {
    #[inline]
    fn or_raise(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|error| raise(py, error))
    }
}

/// Why reading a Python value or a stream stopped: a refusal of the core's, or an exception
/// that Python code raised on the way (a value's own `__index__`, an allocation), which passes
/// through unchanged.
pub enum Failure {
    Refused(Error),
    Raised(PyErr),
}

impl From<PyErr> for Failure {
    fn from(error: PyErr) -> Self {
        Failure::Raised(error)
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure::Refused(error)
    }
}

impl Failure {
    /// The exception to raise: a refusal as [`raise`] makes it, a raised one as it was.
    pub fn raise(self, py: Python<'_>) -> PyErr {
        match self {
            Failure::Refused(error) => raise(py, error),
            Failure::Raised(error) => error,
        }
    }
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
