//! Bucket ids of sharding keys.
//!
//! A key is one value or a tuple of values (the parts of a composite key). Each scheme turns the
//! parts into bytes, concatenates them and hashes the result:
//!
//! - `picodata`: each part MessagePack-encoded (a str as its raw UTF-8 without header, a float as
//!   its 8 big-endian bytes without the `0xcb` byte unless it is whole, when it is that integer),
//!   hashed with MurmurHash3 x86_32, seed 13.
//! - `vshard-mpcrc32`: vshard's `mpcrc32`: each part as Tarantool's `msgpackffi.encode` writes the
//!   Lua value it decodes to (a str as its raw bytes), hashed with CRC-32C.
//! - `vshard-strcrc32`: vshard's `strcrc32`: each part as Lua's `tostring()` renders it, hashed
//!   with CRC-32C.
//!
//! The bucket id is then `hash % bucket_count + 1`.

use std::borrow::Cow;
use std::cell::RefCell;
use std::os::raw::c_int;

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyDateAccess, PyDateTime, PyDelta, PyDeltaAccess, PyFloat, PyInt, PyList, PyString,
    PyTimeAccess, PyTuple, PyType, PyTzInfoAccess,
};

use crate::crc32c::crc32c;
use crate::int_arrays::BucketCount;
use crate::int_key_lanes;
use crate::key_encoding::{self as enc, DecimalDigits, KeyInt};
use crate::lua_tostring;
use crate::murmur3::{murmur3_x86_32, murmur3_x86_32_word};
use crate::str_key_lanes::StrBatch;

/// Seed of Picodata's MurmurHash3.
pub const PICODATA_SEED: u32 = 13;

/// How a `Decimal` key part is encoded before hashing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecimalFormat {
    /// As it arrives over pgwire in binary format: a positive exponent is expanded into trailing
    /// zero digits (`1E+3` → digits 1000, scale 0).
    Binary,
    /// As parsed from text: the exponent is kept (`1E+3` → digit 1, scale -3).
    Text,
}

impl DecimalFormat {
    /// Parses the Python-facing name (`"binary"` / `"text"`).
    pub fn parse(name: &str) -> PyResult<Self> {
        match name {
            "binary" => Ok(DecimalFormat::Binary),
            "text" => Ok(DecimalFormat::Text),
            _ => Err(PyValueError::new_err(format!(
                "unknown decimal_format {name:?}: expected \"binary\" or \"text\""
            ))),
        }
    }
}

/// A hashing scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Picodata,
    VshardStrCrc32,
    VshardMpCrc32,
}

impl Scheme {
    /// Parses the Python-facing name.
    pub fn parse(name: &str) -> PyResult<Self> {
        match name {
            "picodata" => Ok(Scheme::Picodata),
            "vshard-strcrc32" => Ok(Scheme::VshardStrCrc32),
            "vshard-mpcrc32" => Ok(Scheme::VshardMpCrc32),
            _ => Err(PyValueError::new_err(format!(
                "unknown scheme {name:?}: expected \"picodata\", \"vshard-strcrc32\" or \
                 \"vshard-mpcrc32\""
            ))),
        }
    }

    /// The Python-facing name.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Picodata => "picodata",
            Scheme::VshardStrCrc32 => "vshard-strcrc32",
            Scheme::VshardMpCrc32 => "vshard-mpcrc32",
        }
    }
}

/// Reusable scratch space for encoding keys; one per batch so a batch allocates once.
#[derive(Default)]
pub struct KeyHasher {
    buf: Vec<u8>,
}

impl KeyHasher {
    /// The Picodata hash (MurmurHash3 x86_32, seed 13) of `key`: one value or a tuple of values.
    pub fn picodata(
        &mut self,
        key: &Bound<'_, PyAny>,
        decimal_format: DecimalFormat,
    ) -> PyResult<u32> {
        // Fast paths: an exact str is hashed in place, an exact int in range from the stack.
        if let Some(text) = exact_str(key) {
            return Ok(murmur3_x86_32(text?, PICODATA_SEED));
        }
        if key.is_exact_instance_of::<PyInt>() {
            return match int_part(key) {
                Ok(v) => {
                    let (word, len) = v.msgpack().as_word();
                    Ok(murmur3_x86_32_word(word, len, PICODATA_SEED))
                }
                Err(Reject::Raised(err)) => Err(err),
                Err(Reject::Unhashable(reason)) => Err(unhashable(key, None, reason)),
            };
        }
        self.encode_key(key, Scheme::Picodata, decimal_format)?;
        Ok(murmur3_x86_32(&self.buf, PICODATA_SEED))
    }

    /// `f` of the Picodata hash of each key of the iterable `keys`, in order; the first key that
    /// cannot be hashed raises as `picodata` does.
    ///
    /// Implementation notes:
    ///     A list is read by index; its length is read again after any key that is not an
    ///     exact str, as its iterator would, since hashing a key of another type may run Python
    ///     code that changes the list. An exact str is hashed from its UTF-8 in place (CPython
    ///     keeps an ASCII str's UTF-8 in the object itself, and caches it for others), read
    ///     through the list's own reference (see [`list_str_utf8`]) and hashed with the other
    ///     strs of a batch of up to 64 (`str_key_lanes`), the batch hashed before any other key
    ///     is read; an exact int with the branchless encoding of `int_key_lanes`; anything else
    ///     goes through `picodata`.
    pub fn picodata_each(
        &mut self,
        keys: &Bound<'_, PyAny>,
        mut f: impl FnMut(u32),
    ) -> PyResult<()> {
        // Exactly a list: a subclass may iterate differently from its items.
        if let Ok(list) = keys.cast_exact::<PyList>() {
            let mut len = list.len();
            let mut index = 0;
            let mut strs = StrBatch::default();
            while index < len {
                // SAFETY: `index < len`, the list's length since Python code last ran, and the
                // batch is hashed (flushed) before any Python code runs again (below).
                if let Some(bytes) = unsafe { list_str_utf8(list, index) } {
                    strs.push(bytes, &mut f);
                } else {
                    strs.flush(&mut f);
                    f(self.picodata_one(&list.get_item(index)?)?);
                    len = list.len();
                }
                index += 1;
            }
            strs.flush(&mut f);
            return Ok(());
        }
        for key in keys.try_iter()? {
            f(self.picodata_one(&key?)?);
        }
        Ok(())
    }

    /// `picodata` of one key of a batch: the same fast paths, with the branchless int encoding
    /// (keys of mixed widths in a row defeat the branches of the scalar one).
    #[inline(always)]
    fn picodata_one(&mut self, key: &Bound<'_, PyAny>) -> PyResult<u32> {
        if let Some(text) = exact_str(key) {
            return Ok(murmur3_x86_32(text?, PICODATA_SEED));
        }
        if key.is_exact_instance_of::<PyInt>() {
            return match int_part(key) {
                Ok(v) => Ok(int_key_lanes::picodata_hash_of(v)),
                Err(Reject::Raised(err)) => Err(err),
                Err(Reject::Unhashable(reason)) => Err(unhashable(key, None, reason)),
            };
        }
        self.picodata(key, DecimalFormat::Binary)
    }

    /// vshard's `mpcrc32` hash of `key`.
    pub fn vshard_mpcrc32(
        &mut self,
        key: &Bound<'_, PyAny>,
        decimal_format: DecimalFormat,
    ) -> PyResult<u32> {
        if let Some(text) = exact_str(key) {
            return Ok(crc32c(text?));
        }
        self.encode_key(key, Scheme::VshardMpCrc32, decimal_format)?;
        Ok(crc32c(&self.buf))
    }

    /// vshard's `strcrc32` hash of `key`.
    pub fn vshard_strcrc32(&mut self, key: &Bound<'_, PyAny>) -> PyResult<u32> {
        if let Some(text) = exact_str(key) {
            return Ok(crc32c(text?));
        }
        self.encode_key(key, Scheme::VshardStrCrc32, DecimalFormat::Binary)?;
        Ok(crc32c(&self.buf))
    }

    /// The hash of `key` under `scheme` (before `% bucket_count + 1`).
    pub fn hash(
        &mut self,
        key: &Bound<'_, PyAny>,
        scheme: Scheme,
        decimal_format: DecimalFormat,
    ) -> PyResult<u32> {
        match scheme {
            Scheme::Picodata => self.picodata(key, decimal_format),
            Scheme::VshardMpCrc32 => self.vshard_mpcrc32(key, decimal_format),
            Scheme::VshardStrCrc32 => self.vshard_strcrc32(key),
        }
    }

    /// Encodes the whole key (one value or a tuple of parts) into `self.buf`.
    fn encode_key(
        &mut self,
        key: &Bound<'_, PyAny>,
        scheme: Scheme,
        fmt: DecimalFormat,
    ) -> PyResult<()> {
        self.buf.clear();
        if let Ok(parts) = key.cast::<PyTuple>() {
            if parts.is_empty() {
                return Err(unhashable(
                    key,
                    None,
                    "an empty tuple is not a sharding key".into(),
                ));
            }
            for (index, part) in parts.iter_borrowed().enumerate() {
                encode_part(&mut self.buf, &part, Some(index), scheme, fmt)?;
            }
            return Ok(());
        }
        if key.is_instance_of::<PyList>() {
            return Err(unhashable(
                key,
                None,
                "a list is not a composite key; pass the parts as a tuple".into(),
            ));
        }
        if key.is_none() && scheme != Scheme::Picodata {
            // vshard.router.bucket_id_*(nil) raises a usage error.
            return Err(unhashable(
                key,
                None,
                format!("the {} scheme rejects a nil key", scheme.name()).into(),
            ));
        }
        encode_part(&mut self.buf, key, None, scheme, fmt)
    }
}

// ---------------------------------------------------------------------------------------------
// Python values → key parts

/// A key part, read out of its Python value.
enum Part<'a> {
    Str(&'a [u8]),
    Int(KeyInt),
    Bool(bool),
    None,
    Float(f64),
    Decimal(Decimal),
    DateTime { seconds: i64, nanos: u32 },
    Uuid([u8; 16]),
}

/// A finite `decimal.Decimal`: sign, 1..=28 digits and exponent, as `as_tuple()` gives them.
struct Decimal {
    negative: bool,
    digits: [u8; enc::DECIMAL_MAX_DIGITS],
    len: usize,
    exponent: i64,
}

/// Why a part cannot be hashed: a message for `UnhashableKey`, or an error raised by Python code
/// that ran while reading the value (propagated unchanged).
enum Reject {
    Unhashable(Cow<'static, str>),
    Raised(PyErr),
}

impl From<PyErr> for Reject {
    fn from(err: PyErr) -> Self {
        Reject::Raised(err)
    }
}

fn reject<T>(reason: impl Into<Cow<'static, str>>) -> Result<T, Reject> {
    Err(Reject::Unhashable(reason.into()))
}

static DECIMAL_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static UUID_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

const SUPPORTED: &str = "supported key types are str, int, bool, None, float, decimal.Decimal, \
                         timezone-aware datetime.datetime and uuid.UUID";

const SURROGATES: &str = "the str is not valid UTF-8 (it contains lone surrogates)";

/// The UTF-8 bytes of a str (cached by CPython for ASCII), or `UnhashableKey` for surrogates.
#[inline]
/// The UTF-8 of `key` when it is exactly a `str` (the common key), to hash in place.
fn exact_str<'a>(key: &'a Bound<'_, PyAny>) -> Option<PyResult<&'a [u8]>> {
    key.cast_exact::<PyString>().ok().map(|s| str_bytes(key, s))
}

fn str_bytes<'a>(key: &Bound<'_, PyAny>, s: &'a Bound<'_, PyString>) -> PyResult<&'a [u8]> {
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
///     reference cost two per key (about a tenth of `route_many` of str keys). That is sound
///     while no Python code runs (asking for a str's UTF-8 allocates at most a cache, and a
///     failure is not used beyond returning None): nothing can remove the item from the list
///     meanwhile, and a str's UTF-8 lives as long as the str. In a free-threaded build another
///     thread could, so there the item is always read with a reference.
#[inline(always)]
unsafe fn list_str_utf8<'a>(list: &Bound<'_, PyList>, index: usize) -> Option<&'a [u8]> {
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

fn int_part(value: &Bound<'_, PyAny>) -> Result<KeyInt, Reject> {
    let mut overflow: c_int = 0;
    // SAFETY: `value` is a live object and the thread is attached to the interpreter. The call
    // accepts any object (calling `__index__` for non-ints) and reports failure as -1 plus a set
    // error, which is taken below; unlike `extract::<i64>()` it raises nothing on overflow.
    let v = unsafe { ffi::PyLong_AsLongLongAndOverflow(value.as_ptr(), &mut overflow) };
    if overflow == 0 {
        if v == -1 {
            if let Some(err) = PyErr::take(value.py()) {
                return Err(Reject::Raised(err));
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
fn classify<'a>(value: &'a Bound<'_, PyAny>, fmt: DecimalFormat) -> Result<Part<'a>, Reject> {
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

fn datetime_part<'a>(dt: &Bound<'_, PyDateTime>) -> Result<Part<'a>, Reject> {
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

fn decimal_part(value: &Bound<'_, PyAny>, fmt: DecimalFormat) -> Result<Decimal, Reject> {
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

// ---------------------------------------------------------------------------------------------
// Key parts → bytes, per scheme

fn encode_part(
    out: &mut Vec<u8>,
    value: &Bound<'_, PyAny>,
    index: Option<usize>,
    scheme: Scheme,
    fmt: DecimalFormat,
) -> PyResult<()> {
    let result = classify(value, fmt).and_then(|part| match scheme {
        Scheme::Picodata => picodata_part(out, &part),
        Scheme::VshardMpCrc32 => mpcrc32_part(out, &part),
        Scheme::VshardStrCrc32 => strcrc32_part(out, &part),
    });
    match result {
        Ok(()) => Ok(()),
        Err(Reject::Raised(err)) => Err(err),
        Err(Reject::Unhashable(reason)) => Err(unhashable(value, index, reason)),
    }
}

fn decimal_ext(out: &mut Vec<u8>, d: &Decimal) {
    enc::decimal(
        out,
        &DecimalDigits {
            negative: d.negative,
            digits: &d.digits[..d.len],
            scale: (-d.exponent) as i8,
        },
    );
}

fn picodata_part(out: &mut Vec<u8>, part: &Part<'_>) -> Result<(), Reject> {
    match part {
        Part::Str(bytes) => out.extend_from_slice(bytes),
        Part::Int(v) => out.extend_from_slice(v.msgpack().as_slice()),
        Part::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Part::None => out.push(0xc0),
        Part::Float(f) => match KeyInt::from_whole_f64(*f) {
            Some(v) => out.extend_from_slice(v.msgpack().as_slice()),
            None => out.extend_from_slice(&f.to_be_bytes()),
        },
        Part::Decimal(d) => decimal_ext(out, d),
        Part::DateTime { seconds, nanos } => enc::datetime(out, *seconds, *nanos),
        Part::Uuid(bytes) => enc::uuid(out, bytes),
    }
    Ok(())
}

/// Tarantool's `msgpackffi.encode` of the Lua value the part decodes to on a vshard router.
fn mpcrc32_part(out: &mut Vec<u8>, part: &Part<'_>) -> Result<(), Reject> {
    match part {
        Part::Str(bytes) => out.extend_from_slice(bytes),
        Part::Int(v) => out.extend_from_slice(v.msgpack().as_slice()),
        Part::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        // Inside a composite key nil decodes to box.NULL, which encodes as nil.
        Part::None => out.push(0xc0),
        Part::Float(f) => {
            // A double decodes to a Lua number; msgpackffi writes an integral one with
            // -1e63 < n < 1e64 as an integer, anything else as a double (0xcb + 8 bytes).
            let f = *f;
            if f.fract() == 0.0 && f > -1e63 && f < 1e64 {
                match KeyInt::from_whole_f64(f) {
                    Some(v) => out.extend_from_slice(v.msgpack().as_slice()),
                    // LuaJIT's conversion of such a value to a 64-bit integer is undefined.
                    None => {
                        return reject(
                            "a whole float outside [-2**63, 2**64) has no defined msgpackffi \
                             encoding in vshard",
                        )
                    }
                }
            } else {
                out.push(0xcb);
                out.extend_from_slice(&f.to_be_bytes());
            }
        }
        Part::Decimal(d) => decimal_ext(out, d),
        Part::Uuid(bytes) => enc::uuid(out, bytes),
        Part::DateTime { .. } => {
            return reject(
                "vshard's mpcrc32 cannot encode a datetime (msgpackffi has no encoder for it)",
            )
        }
    }
    Ok(())
}

/// Lua's `tostring()` of the value the part decodes to on a vshard router.
fn strcrc32_part(out: &mut Vec<u8>, part: &Part<'_>) -> Result<(), Reject> {
    match part {
        Part::Str(bytes) => out.extend_from_slice(bytes),
        Part::Int(v) => lua_tostring::integer(out, *v),
        Part::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Part::Float(f) if f.is_finite() => lua_tostring::number(out, *f),
        Part::Float(_) => {
            return reject("tostring() of a non-finite number differs between LuaJIT builds")
        }
        Part::Uuid(bytes) => uuid_text(out, bytes),
        Part::None => return reject("tostring(box.NULL) is a pointer string, not a key"),
        Part::Decimal(_) => {
            return reject("the strcrc32 scheme does not hash Decimal; use vshard-mpcrc32")
        }
        Part::DateTime { .. } => return reject("the strcrc32 scheme does not hash datetime"),
    }
    Ok(())
}

/// Canonical lowercase `8-4-4-4-12` form, as Tarantool's uuid `__tostring` prints it.
fn uuid_text(out: &mut Vec<u8>, bytes: &[u8; 16]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push(b'-');
        }
        out.push(HEX[usize::from(byte >> 4)]);
        out.push(HEX[usize::from(byte & 0x0f)]);
    }
}

// ---------------------------------------------------------------------------------------------
// Errors

/// `UnhashableKey` naming the part (if in a tuple), its type and its repr.
fn unhashable(value: &Bound<'_, PyAny>, index: Option<usize>, reason: Cow<'static, str>) -> PyErr {
    let type_name = value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned());
    let repr = crate::errors::short_repr(value);
    let what = match index {
        Some(i) => format!("key part {i}"),
        None => "key".to_owned(),
    };
    crate::errors::unhashable_key(
        value.py(),
        format!("cannot hash {what} of type '{type_name}' ({repr}): {reason}"),
    )
}

// ---------------------------------------------------------------------------------------------
// Python API

/// Bucket id in `1..=bucket_count` for a 32-bit hash.
pub fn bucket_of(hash: u32, bucket_count: u32) -> u32 {
    hash % bucket_count + 1
}

thread_local! {
    /// Scratch hasher for single `bucket_id` calls, so they do not allocate.
    static SCRATCH: RefCell<KeyHasher> = RefCell::new(KeyHasher::default());
}

/// Runs `f` with this thread's scratch hasher (or a fresh one if it is in use, e.g. re-entered
/// from Python code run while encoding).
pub fn with_scratch<R>(f: impl FnOnce(&mut KeyHasher) -> R) -> R {
    let mut f = Some(f);
    let result = SCRATCH.try_with(|cell| {
        let mut hasher = cell.try_borrow_mut().ok()?;
        let result = (f.take().expect("called once"))(&mut hasher);
        if hasher.buf.capacity() > 4096 {
            hasher.buf = Vec::new();
        }
        Some(result)
    });
    match result {
        Ok(Some(result)) => result,
        _ => (f.take().expect("not called yet"))(&mut KeyHasher::default()),
    }
}

/// The bucket (1..=bucket_count) that owns `key` under `scheme`.
///
/// `key` is one value or a tuple of values (a composite key's parts, hashed in order): a str,
/// an int in [-2**63, 2**64), a bool, None, a float, a `decimal.Decimal`, a timezone-aware
/// `datetime.datetime` or a `uuid.UUID`, as far as the scheme encodes it (the vshard schemes
/// refuse None and a datetime, `vshard-strcrc32` a `Decimal` too); any other value raises
/// `UnhashableKey` naming it (and its part). `scheme` is `"picodata"` (the default: MessagePack parts, MurmurHash3),
/// `"vshard-mpcrc32"` or `"vshard-strcrc32"` (Tarantool vshard's). `decimal_format` says how a
/// `Decimal` arrived: `"binary"` (the default, as pgwire's binary format gives it: a positive
/// exponent expanded into digits) or `"text"` (as parsed from text: the exponent kept).
/// `bucket_count` is an int from 1 to 2**32 - 1 (not a bool); any other value raises
/// `InvalidArgument`. An unknown `scheme` or `decimal_format` raises `ValueError`.
#[pyfunction]
#[pyo3(signature = (key, bucket_count, *, scheme = "picodata", decimal_format = "binary"))]
pub fn bucket_id(
    key: &Bound<'_, PyAny>,
    bucket_count: BucketCount,
    scheme: &str,
    decimal_format: &str,
) -> PyResult<u32> {
    let scheme = Scheme::parse(scheme)?;
    let decimal_format = DecimalFormat::parse(decimal_format)?;
    let hash = with_scratch(|hasher| hasher.hash(key, scheme, decimal_format))?;
    Ok(bucket_of(hash, bucket_count.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_text_is_canonical() {
        let mut out = Vec::new();
        let bytes = 0xcc35_e834_74fa_9412_00d9_3534_4387_ee7b_u128.to_be_bytes();
        uuid_text(&mut out, &bytes);
        assert_eq!(out, b"cc35e834-74fa-9412-00d9-35344387ee7b");
    }

    #[test]
    fn picodata_i64_matches_encoding() {
        // picodata bucket of int -1940095024 with 65536 buckets is 32770 (shared vectors).
        assert_eq!(
            bucket_of(
                int_key_lanes::picodata_hash_of(KeyInt::from_i64(-1_940_095_024)),
                65_536
            ),
            32_770
        );
        assert_eq!(
            bucket_of(int_key_lanes::picodata_hash_of(KeyInt::from_i64(242)), 16),
            8
        );
        assert_eq!(
            bucket_of(
                int_key_lanes::picodata_hash_of(KeyInt::NonNegative(2_842_472_588)),
                16
            ),
            10
        );
        // vshard: int 1 → 1614 (mpcrc32) and 477 (strcrc32) of 3000.
        assert_eq!(bucket_of(crc32c(enc::int_i64(1).as_slice()), 3000), 1614);
        let mut text = Vec::new();
        lua_tostring::integer(&mut text, KeyInt::from_i64(1));
        assert_eq!(bucket_of(crc32c(&text), 3000), 477);
    }
}
