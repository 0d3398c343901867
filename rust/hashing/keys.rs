//! Python values read as key parts (`shardline_core::hashing::parts::Part`), and the
//! `UnhashableKey` that names a key no scheme can take.

use std::borrow::Cow;
use std::os::raw::c_int;

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyDateAccess, PyDateTime, PyDelta, PyDeltaAccess, PyFloat, PyInt, PyList, PyString,
    PyTimeAccess, PyTuple, PyType, PyTzInfoAccess,
};
use shardline_core::hashing::key_encoding::{self as enc, KeyInt};
use shardline_core::hashing::parts::{self, Decimal, Part};
use shardline_core::hashing::{DecimalFormat, Scheme};

use crate::py::errors::{raise, short_repr, Error, Failure};

fn reject<T>(reason: impl Into<Cow<'static, str>>) -> Result<T, Failure> {
    Err(Failure::Refused(Error::Unencodable(reason.into())))
}

static DECIMAL_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static UUID_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

const SUPPORTED: &str = "supported key types are str, int, bool, None, float, decimal.Decimal, \
                         timezone-aware datetime.datetime and uuid.UUID";

const SURROGATES: &str = "the str is not valid UTF-8 (it contains lone surrogates)";

/// The UTF-8 of `key` when it is exactly a `str` (the common key), to hash in place (CPython
/// caches it for ASCII); `UnhashableKey` for one holding surrogates.
#[inline]
pub fn exact_str<'a>(key: &'a Bound<'_, PyAny>) -> Option<PyResult<&'a [u8]>> {
    key.cast_exact::<PyString>().ok().map(|s| str_bytes(key, s))
}

pub fn str_bytes<'a>(key: &Bound<'_, PyAny>, s: &'a Bound<'_, PyString>) -> PyResult<&'a [u8]> {
    match s.to_str() {
        Ok(text) => Ok(text.as_bytes()),
        Err(_) => Err(unhashable(key, None, SURROGATES.into())),
    }
}

/// The UTF-8 of item `index` of `list` when it is exactly a str whose UTF-8 CPython can hand
/// out; None for any other item, which the caller then reads as usual (a str with lone
/// surrogates included, so it raises as `picodata` does).
///
/// # Safety
/// `index` is below the list's length, and the bytes are used only until Python code next runs
/// (or, in a free-threaded build, never: there the function returns None).
///
/// Implementation notes:
///     The item is read through the list's reference, not a new one of its own: under the
///     stable ABI every reference count change is a call into the interpreter, and a new
///     reference cost two per key (`benches/RESULTS.md`, "2. `route_many` of a list of str").
///     That is sound
///     while no Python code runs (asking for a str's UTF-8 allocates at most a cache, and a
///     failure is not used beyond returning None): nothing can remove the item from the list
///     meanwhile, and a str's UTF-8 lives as long as the str. In a free-threaded build another
///     thread could, so there the item is always read with a reference.
#[inline(always)]
pub unsafe fn list_str_utf8<'a>(list: &Bound<'_, PyList>, index: usize) -> Option<&'a [u8]> {
    #[cfg(not(Py_GIL_DISABLED))]
    {
        // SAFETY: the thread is attached and `list` is a list with more than `index` items, so
        // the call returns a borrowed reference to a live object, which stays alive as long as
        // the caller's contract says the bytes are used.
        unsafe {
            let item = ffi::PyList_GetItem(list.as_ptr(), index as ffi::Py_ssize_t);
            if ffi::PyUnicode_CheckExact(item) == 0 {
                return None;
            }
            let mut size: ffi::Py_ssize_t = 0;
            let data = ffi::PyUnicode_AsUTF8AndSize(item, &mut size);
            if data.is_null() {
                // lone surrogates: read again with a reference, which raises UnhashableKey
                drop(PyErr::take(list.py()));
                return None;
            }
            Some(std::slice::from_raw_parts(data.cast::<u8>(), size as usize))
        }
    }
    #[cfg(Py_GIL_DISABLED)]
    {
        let _ = (list, index);
        None
    }
}

pub fn int_part(value: &Bound<'_, PyAny>) -> Result<KeyInt, Failure> {
    let mut overflow: c_int = 0;
    // SAFETY: `value` is a live object and the thread is attached to the interpreter. The call
    // accepts any object (calling `__index__` for non-ints) and reports failure as -1 plus a set
    // error, which is taken below; unlike `extract::<i64>()` it raises nothing on overflow.
    let v = unsafe { ffi::PyLong_AsLongLongAndOverflow(value.as_ptr(), &mut overflow) };
    if overflow == 0 {
        if v == -1 {
            if let Some(err) = PyErr::take(value.py()) {
                return Err(Failure::Raised(err));
            }
        }
        return Ok(KeyInt::from_i64(v));
    }
    if overflow > 0 {
        if let Ok(v) = value.extract::<u64>() {
            return Ok(KeyInt::NonNegative(v));
        }
    }
    reject("int out of the MessagePack range [-2**63, 2**64)")
}

/// Reads a key part out of `value`, checking the cheap exact types first.
pub fn classify<'a>(value: &'a Bound<'_, PyAny>, fmt: DecimalFormat) -> Result<Part<'a>, Failure> {
    let py = value.py();
    if value.is_instance_of::<PyString>() {
        // SAFETY: the type (or a subtype) was just checked.
        let s = unsafe { value.cast_unchecked::<PyString>() };
        return match s.to_str() {
            Ok(text) => Ok(Part::Str(text.as_bytes())),
            Err(_) => reject(SURROGATES),
        };
    }
    if value.is_exact_instance_of::<PyBool>() {
        return Ok(Part::Bool(value.is_truthy()?));
    }
    if value.is_instance_of::<PyInt>() {
        return int_part(value).map(Part::Int);
    }
    if value.is_none() {
        return Ok(Part::None);
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        return Ok(Part::Float(f.value()));
    }
    if value.is_instance_of::<PyTuple>() || value.is_instance_of::<PyList>() {
        return reject("a key part must be a single value, not a nested sequence");
    }
    if let Ok(dt) = value.cast::<PyDateTime>() {
        return datetime_part(dt);
    }
    let decimal_type = DECIMAL_TYPE.import(py, "decimal", "Decimal")?;
    if value.is_instance(decimal_type)? {
        return decimal_part(value, fmt).map(Part::Decimal);
    }
    let uuid_type = UUID_TYPE.import(py, "uuid", "UUID")?;
    if value.is_instance(uuid_type)? {
        let int: u128 = value.getattr(intern!(py, "int"))?.extract()?;
        return Ok(Part::Uuid(int.to_be_bytes()));
    }
    // Other integers by Python's own protocol (`operator.index`), e.g. numpy integer scalars.
    if value.get_type().hasattr(intern!(py, "__index__"))? {
        return match value.call_method0(intern!(py, "__index__")) {
            Ok(int) => int_part(&int).map(Part::Int),
            Err(err) => reject(format!("its __index__ failed: {err}")),
        };
    }
    reject(SUPPORTED)
}

fn datetime_part<'a>(dt: &Bound<'_, PyDateTime>) -> Result<Part<'a>, Failure> {
    let naive =
        "a naive datetime has no defined instant; attach a tzinfo (e.g. datetime.timezone.utc)";
    if dt.get_tzinfo().is_none() {
        return reject(naive);
    }
    let offset = dt.call_method0(intern!(dt.py(), "utcoffset"))?;
    if offset.is_none() {
        return reject(naive);
    }
    let offset = offset.cast::<PyDelta>().map_err(PyErr::from)?;
    const MICROS: i64 = 1_000_000;
    let offset_us = (i64::from(offset.get_days()) * 86_400 + i64::from(offset.get_seconds()))
        * MICROS
        + i64::from(offset.get_microseconds());
    let days = enc::days_from_civil(dt.get_year(), dt.get_month(), dt.get_day());
    let local_s = days * 86_400
        + i64::from(dt.get_hour()) * 3_600
        + i64::from(dt.get_minute()) * 60
        + i64::from(dt.get_second());
    // Years 1..=9999 keep this far inside i64.
    let utc_us = local_s * MICROS + i64::from(dt.get_microsecond()) - offset_us;
    Ok(Part::DateTime {
        seconds: utc_us.div_euclid(MICROS),
        nanos: (utc_us.rem_euclid(MICROS) * 1_000) as u32,
    })
}

fn decimal_part(value: &Bound<'_, PyAny>, fmt: DecimalFormat) -> Result<Decimal, Failure> {
    let py = value.py();
    let tuple = value.call_method0(intern!(py, "as_tuple"))?;
    let tuple = tuple.cast::<PyTuple>().map_err(PyErr::from)?;
    let exponent = tuple.get_item(2)?;
    if !exponent.is_instance_of::<PyInt>() {
        return reject("a non-finite Decimal (NaN or Infinity) cannot be hashed");
    }
    let too_big = "a Decimal beyond MP_DECIMAL's limits (at most 28 significant digits and \
                   |scale| <= 28) cannot be hashed";
    let Ok(exponent) = exponent.extract::<i64>() else {
        return reject(too_big);
    };
    let negative = tuple.get_item(0)?.extract::<u8>()? != 0;
    let digit_items = tuple.get_item(1)?;
    let digit_items = digit_items.cast::<PyTuple>().map_err(PyErr::from)?;
    let mut dec = Decimal {
        negative,
        digits: [0; enc::DECIMAL_MAX_DIGITS],
        len: digit_items.len(),
        exponent,
    };
    if dec.len == 0 || dec.len > enc::DECIMAL_MAX_DIGITS {
        return reject(too_big);
    }
    for (slot, digit) in dec.digits.iter_mut().zip(digit_items.iter_borrowed()) {
        *slot = digit.extract::<u8>()?;
    }
    // Expand a positive exponent into trailing zeros for the binary format.
    if fmt == DecimalFormat::Binary && dec.exponent > 0 {
        if dec.len == 1 && dec.digits[0] == 0 {
            dec.exponent = 0;
        } else {
            let total = dec.len as i64 + dec.exponent;
            if total > enc::DECIMAL_MAX_DIGITS as i64 {
                return reject(too_big);
            }
            // Digits past `len` are already zero.
            dec.len = total as usize;
            dec.exponent = 0;
        }
    }
    if dec.exponent.unsigned_abs() > enc::DECIMAL_MAX_SCALE as u64 {
        return reject(too_big);
    }
    Ok(dec)
}

/// Appends the bytes `scheme` hashes for the key part `value` (part `index` of a tuple).
pub fn encode_part(
    out: &mut Vec<u8>,
    value: &Bound<'_, PyAny>,
    index: Option<usize>,
    scheme: Scheme,
    fmt: DecimalFormat,
) -> PyResult<()> {
    let result = classify(value, fmt)
        .and_then(|part| parts::encode(out, &part, scheme).map_err(Failure::Refused));
    result.map_err(|failure| named(value, index, failure))
}

/// `UnhashableKey` naming the key (or its part `index` in a tuple), its type and its repr.
pub fn unhashable(
    value: &Bound<'_, PyAny>,
    index: Option<usize>,
    reason: Cow<'static, str>,
) -> PyErr {
    let type_name = value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned());
    let error = Error::UnhashableKey {
        part: index,
        type_name,
        repr: short_repr(value),
        reason,
    };
    raise(value.py(), error)
}

/// The exception for `failure` while reading `value`: a refusal names the key, an exception
/// raised by Python code passes through.
pub fn named(value: &Bound<'_, PyAny>, index: Option<usize>, failure: Failure) -> PyErr {
    match failure {
        Failure::Refused(Error::Unencodable(reason)) => unhashable(value, index, reason),
        other => other.raise(value.py()),
    }
}
