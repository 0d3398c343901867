//! Bucket ids of Python sharding keys: `bucket_id` and the hasher `Topology` routes with.
//!
//! The schemes, their byte layouts and hashes are the core's (`shardline_core::hashing`, whose
//! documentation describes each scheme); here Python values are read as key parts
//! ([`keys`]) and the fast paths for exact str and int keys skip the parts altogether.

mod keys;

use std::cell::RefCell;

use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList, PyTuple};
use shardline_core::hashing::crc32c::crc32c;
use shardline_core::hashing::int_lanes;
use shardline_core::hashing::murmur3::{murmur3_x86_32, murmur3_x86_32_word};
use shardline_core::hashing::str_lanes::StrBatch;
pub use shardline_core::hashing::{bucket_of, DecimalFormat, Scheme, PICODATA_SEED};

use crate::py::errors::OrRaise;
use crate::py::int_arrays::BucketCount;
use keys::{encode_part, exact_str, int_part, list_str_utf8, named, unhashable};

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
                Err(failure) => Err(named(key, None, failure)),
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
    ///     strs of a batch of up to 64 (`str_lanes`), the batch hashed before any other key
    ///     is read; an exact int with the branchless encoding of `int_lanes`; anything else
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
                Ok(v) => Ok(int_lanes::picodata_hash_of(v)),
                Err(failure) => Err(named(key, None, failure)),
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
    let py = key.py();
    let scheme = Scheme::parse(scheme).or_raise(py)?;
    let decimal_format = DecimalFormat::parse(decimal_format).or_raise(py)?;
    let hash = with_scratch(|hasher| hasher.hash(key, scheme, decimal_format))?;
    Ok(bucket_of(hash, bucket_count.0))
}
