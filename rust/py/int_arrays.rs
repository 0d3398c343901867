//! Integers read out of Python arguments: one bucket id or bucket count, and bucket ids or int
//! keys in bulk, from any iterable or straight from an integer array's memory.
//!
//! One rule for every form: a bucket id is an int from 0 to 2**32 - 1 and a bucket count one from
//! 1 to 2**32 - 1 (objects with `__index__`, such as numpy integer scalars, count as ints; a bool
//! does not). Anything else raises `InvalidArgument` naming the value, and its position in a
//! sequence or an array: never an `OverflowError`, never a silent substitute.
//!
//! An object exposing the buffer protocol (a numpy array, `array.array`, `bytes`, ...) must be
//! one-dimensional. If its items are integers (1, 2, 4 or 8 bytes, signed or not, native or
//! explicit byte order) they are read from its memory, following its stride, so a slice such
//! as `a[::2]` or `a[::-1]` reads the elements it shows. Other items (floats, bools, Python
//! objects) are read as a sequence, one element at a time, as the array's own type converts them
//! (a `memoryview` of such items is rejected: it cannot convert most of them).

use std::ffi::CStr;
use std::fmt::Display;
use std::ops::Range;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyMemoryView};

use shardline_core::hashing::key_encoding::KeyInt;

use crate::py::errors::{quoted, raise, short_repr, Error};

/// Bucket ids and counts are `u32`s in the maps and in hashing (`hash % count + 1` of a 32-bit
/// hash).
const MAX: u32 = u32::MAX;

/// A `bucket_id` argument (`owner`, `find_bucket_master`): an int from 0 to 2**32 - 1.
pub struct BucketId(pub u32);

impl<'a, 'py> FromPyObject<'a, 'py> for BucketId {
    type Error = PyErr;

    fn extract(value: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        int_in_range(
            &value,
            0,
            Name {
                what: "bucket_id",
                index: None,
            },
        )
        .map(BucketId)
    }
}

/// A `bucket_count` argument: an int from 1 to 2**32 - 1.
pub struct BucketCount(pub u32);

impl<'a, 'py> FromPyObject<'a, 'py> for BucketCount {
    type Error = PyErr;

    fn extract(value: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        int_in_range(
            &value,
            1,
            Name {
                what: "bucket_count",
                index: None,
            },
        )
        .map(BucketCount)
    }
}

/// Bucket ids in bulk (`owners`): a sequence of ints or an integer array, each as for
/// [`BucketId`]; the first bad one raises `InvalidArgument` with its position.
pub fn bucket_ids(values: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    const WHAT: &str = "bucket_ids";
    let element = |index| Name {
        what: WHAT,
        index: Some(index),
    };
    if let Some(array) = IntArray::of(values, WHAT)? {
        // One branchless pass, which the compiler vectorises: out-of-range ids only clear a flag.
        let mut all_in_range = true;
        let ids = array.map(|value| {
            let id = bucket_id_of(value);
            all_in_range &= id.is_some();
            id.unwrap_or(0)
        });
        if all_in_range {
            return Ok(ids);
        }
        // Read again to name the first bad id. Another thread may have written the array since:
        // the answer is then whatever this second reading holds.
        let values_now = array.map(|value| value);
        return values_now
            .iter()
            .enumerate()
            .map(|(index, &value)| {
                bucket_id_of(value).ok_or_else(|| {
                    let number = match value {
                        KeyInt::NonNegative(v) => v.to_string(),
                        KeyInt::Negative(v) => v.to_string(),
                    };
                    out_of_range(values.py(), element(index), 0, number, false)
                })
            })
            .collect();
    }
    values
        .try_iter()?
        .enumerate()
        .map(|(index, item)| int_in_range(&item?, 0, element(index)))
        .collect()
}

fn bucket_id_of(value: KeyInt) -> Option<u32> {
    match value {
        KeyInt::NonNegative(v) => u32::try_from(v).ok(),
        KeyInt::Negative(_) => None,
    }
}

/// How a message names the argument: `bucket_id`, or `bucket_ids[3]` for an element.
#[derive(Clone, Copy)]
struct Name {
    what: &'static str,
    index: Option<usize>,
}

impl Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.index {
            Some(index) => write!(f, "{}[{index}]", self.what),
            None => f.write_str(self.what),
        }
    }
}

/// `value` as an int in `min..=MAX`, or `InvalidArgument` naming it as `name`
/// (`InvalidArgumentType` when it is not an int).
fn int_in_range(value: &Bound<'_, PyAny>, min: u32, name: Name) -> PyResult<u32> {
    let py = value.py();
    let reject = |wrong_type: bool, cause: Option<PyErr>| {
        let error = out_of_range(py, name, min, short_repr(value), wrong_type);
        error.set_cause(py, cause);
        error
    };
    // A bool is an int to Python, but never a bucket id or count.
    if value.is_instance_of::<PyBool>() {
        return Err(reject(true, None));
    }
    match value.extract::<i64>() {
        Ok(v) => u32::try_from(v)
            .ok()
            .filter(|&v| v >= min)
            .ok_or_else(|| reject(false, None)),
        // Not an int (no `__index__`).
        Err(err) if err.is_instance_of::<PyTypeError>(py) => Err(reject(true, Some(err))),
        // An int beyond i64: out of the domain.
        Err(err) if err.is_instance_of::<PyOverflowError>(py) => Err(reject(false, Some(err))),
        // Raised by the value's own `__index__`: the caller's error, passed on unchanged.
        Err(err) => Err(err),
    }
}

fn out_of_range(
    py: Python<'_>,
    name: Name,
    min: u32,
    got: impl Display,
    wrong_type: bool,
) -> PyErr {
    let message = format!("{name} must be an int from {min} to {MAX}, got {got}");
    let error = if wrong_type {
        Error::InvalidArgumentType(message)
    } else {
        Error::InvalidArgument(message)
    };
    raise(py, error)
}

/// A one-dimensional array of integers, read from its memory.
pub struct IntArray {
    buffer: PyUntypedBuffer,
    kind: Kind,
    /// The items are in the other byte order than this machine's.
    swap: bool,
    len: usize,
    stride: isize,
}

/// The item type of an integer array.
#[derive(Clone, Copy)]
pub enum Kind {
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
}

/// `$body` with `$values` bound to `$array`'s elements in `$range` ([`IntArray::values`]),
/// monomorphised for its item type and byte order.
macro_rules! with_values {
    ($array:expr, $range:expr, |$values:ident| $body:expr) => {
        with_values!(@kinds $array, $range, $values, $body,
            [I8 i8, U8 u8, I16 i16, U16 u16, I32 i32, U32 u32, I64 i64, U64 u64])
    };
    (@kinds $array:expr, $range:expr, $values:ident, $body:expr, [$($kind:ident $t:ty),*]) => {
        match $array.kind {
            $(Kind::$kind => if $array.swap {
                let $values = $array.values::<$t, true>($range);
                $body
            } else {
                let $values = $array.values::<$t, false>($range);
                $body
            },)*
        }
    };
}

/// `$body` with `$bits` bound to `$array`'s elements in `$range` as 64-bit two's-complement bits
/// ([`IntArray::bits`]) and `$signed` to whether the item type is signed.
macro_rules! with_bits {
    ($array:expr, $range:expr, |$bits:ident, $signed:ident| $body:expr) => {
        with_bits!(@kinds $array, $range, $bits, $signed, $body,
            [I8 i8 => true, U8 u8 => false, I16 i16 => true, U16 u16 => false,
             I32 i32 => true, U32 u32 => false, I64 i64 => true, U64 u64 => false])
    };
    (@kinds $array:expr, $range:expr, $bits:ident, $signed:ident, $body:expr,
     [$($kind:ident $t:ty => $is_signed:literal),*]) => {
        match $array.kind {
            $(Kind::$kind => {
                let $signed = $is_signed;
                if $array.swap {
                    let $bits = $array.bits::<$t, true>($range);
                    $body
                } else {
                    let $bits = $array.bits::<$t, false>($range);
                    $body
                }
            },)*
        }
    };
}

impl IntArray {
    /// `values` read as an integer array, if it is one; None for an object to iterate instead
    /// (no buffer, or items that are not integers). `InvalidArgument`, naming the argument as
    /// `what`, for a buffer that is not one-dimensional.
    pub fn of(values: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<Self>> {
        // SAFETY: `values` is a live object and the thread is attached; the check only reads its
        // type's slots. It spares a list the exception a failed `PyObject_GetBuffer` creates.
        if unsafe { ffi::PyObject_CheckBuffer(values.as_ptr()) } == 0 {
            return Ok(None);
        }
        // A type may offer the protocol and still refuse a given array (numpy does for
        // datetime64): such an object is iterated like any other.
        let Ok(buffer) = PyUntypedBuffer::get(values) else {
            return Ok(None);
        };
        if buffer.dimensions() != 1 {
            return Err(raise(
                values.py(),
                Error::InvalidArgument(format!(
                    "{what} must be one-dimensional, got an array of shape {}",
                    python_shape(buffer.shape())
                )),
            ));
        }
        if buffer.suboffsets().is_some() {
            return Ok(None);
        }
        let Some((kind, swap)) = int_format(buffer.format(), buffer.item_size()) else {
            // A memoryview of other items cannot be iterated in general (it raises
            // NotImplementedError for '>d' or a struct): its items are never read.
            if values.is_instance_of::<PyMemoryView>() {
                return Err(raise(
                    values.py(),
                    Error::InvalidArgumentType(format!(
                        "{what} must be a memoryview of integers, got one of format {}",
                        quoted(&buffer.format().to_string_lossy())
                    )),
                ));
            }
            return Ok(None);
        };
        let (len, stride) = (buffer.shape()[0], buffer.strides()[0]);
        Ok(Some(Self {
            buffer,
            kind,
            swap,
            len,
            stride,
        }))
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `f` of each element, in order, read and applied in one loop: for a cheap `f` (a range
    /// check), which the compiler then vectorises.
    pub fn map<R>(&self, f: impl FnMut(KeyInt) -> R) -> Vec<R> {
        with_values!(self, 0..self.len, |values| values.map(f).collect())
    }

    /// `f` of each chunk of elements, in order, as their 64-bit two's-complement bits (sign- or
    /// zero-extended), with whether the item type is signed: for a loop over a chunk that the
    /// compiler vectorises (`int_lanes`), which a `KeyInt` per element would keep it from.
    pub fn for_each_chunk_of_bits(&self, mut f: impl FnMut(&[u64], bool)) {
        const CHUNK: usize = 256;
        let mut chunk = [0u64; CHUNK];
        for start in (0..self.len).step_by(CHUNK) {
            let range = start..self.len.min(start + CHUNK);
            let read = &mut chunk[..range.len()];
            let signed = with_bits!(self, range, |bits, signed| {
                for (slot, value) in read.iter_mut().zip(bits) {
                    *slot = value;
                }
                signed
            });
            f(read, signed);
        }
    }

    /// The elements, for one item type and byte order: the common case (native int64) stays a
    /// plain strided load, and the length is exact, so collecting them allocates once.
    #[inline(always)]
    fn values<T: RawInt, const SWAP: bool>(
        &self,
        range: Range<usize>,
    ) -> impl ExactSizeIterator<Item = KeyInt> + '_ {
        self.raw::<T, SWAP>(range).map(RawInt::key)
    }

    /// The elements' 64-bit two's-complement bits, for one item type and byte order.
    #[inline(always)]
    fn bits<T: RawInt, const SWAP: bool>(
        &self,
        range: Range<usize>,
    ) -> impl ExactSizeIterator<Item = u64> + '_ {
        self.raw::<T, SWAP>(range).map(RawInt::bits)
    }

    /// The elements as stored, in this machine's byte order.
    #[inline(always)]
    fn raw<T: RawInt, const SWAP: bool>(
        &self,
        range: Range<usize>,
    ) -> impl ExactSizeIterator<Item = T> + '_ {
        let base = self.buffer.buf_ptr().cast::<u8>().cast_const();
        let stride = self.stride;
        range.map(move |index| {
            // SAFETY: the exporter guarantees that `buf + i * strides[0]`, for `i < shape[0]`,
            // is an item of `itemsize == size_of::<T>()` bytes (checked in `int_format`), and the
            // memory stays valid while `self.buffer` holds the export. The load is unaligned
            // because nothing obliges an exporter to align its items.
            let raw = unsafe {
                base.offset(index as isize * stride)
                    .cast::<T>()
                    .read_unaligned()
            };
            if SWAP {
                raw.swap()
            } else {
                raw
            }
        })
    }
}

/// A shape as Python prints it: `(3, 3)`, `(4,)`.
fn python_shape(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    match dims.as_slice() {
        [one] => format!("({one},)"),
        _ => format!("({})", dims.join(", ")),
    }
}

/// The item type and whether its bytes need swapping, for a `struct`-module format naming one
/// integer of `size` bytes; None for any other format.
pub fn int_format(format: &CStr, size: usize) -> Option<(Kind, bool)> {
    let (order, code) = match format.to_bytes() {
        [code] => (b'@', *code),
        [order, code] => (*order, *code),
        _ => return None,
    };
    let swap = match order {
        b'@' | b'=' => false,
        b'<' => cfg!(target_endian = "big"),
        b'>' | b'!' => cfg!(target_endian = "little"),
        _ => return None,
    };
    // Native formats ('@') take the C sizes of this machine, which `size` is; the others have
    // fixed sizes, which `size` must match.
    let standard = match code {
        b'b' | b'B' => 1,
        b'h' | b'H' => 2,
        b'i' | b'I' | b'l' | b'L' => 4,
        b'q' | b'Q' => 8,
        b'n' | b'N' if order == b'@' => size,
        _ => return None,
    };
    if order != b'@' && size != standard {
        return None;
    }
    let signed = code.is_ascii_lowercase();
    let kind = match (size, signed) {
        (1, true) => Kind::I8,
        (1, false) => Kind::U8,
        (2, true) => Kind::I16,
        (2, false) => Kind::U16,
        (4, true) => Kind::I32,
        (4, false) => Kind::U32,
        (8, true) => Kind::I64,
        (8, false) => Kind::U64,
        _ => return None,
    };
    Some((kind, swap))
}

/// A fixed-width integer as stored in an array.
trait RawInt: Copy + 'static {
    fn swap(self) -> Self;
    fn key(self) -> KeyInt;
    /// Sign-extended for a signed type, zero-extended for an unsigned one.
    fn bits(self) -> u64;
}

macro_rules! raw_int {
    ($($t:ty => $key:expr),* $(,)?) => {$(
        impl RawInt for $t {
            #[inline(always)]
            fn swap(self) -> Self {
                self.swap_bytes()
            }
            #[inline(always)]
            fn key(self) -> KeyInt {
                $key(self)
            }
            #[inline(always)]
            fn bits(self) -> u64 {
                self as i128 as u64
            }
        }
    )*};
}

raw_int! {
    i8 => |v: i8| KeyInt::from_i64(i64::from(v)),
    i16 => |v: i16| KeyInt::from_i64(i64::from(v)),
    i32 => |v: i32| KeyInt::from_i64(i64::from(v)),
    i64 => KeyInt::from_i64,
    u8 => |v: u8| KeyInt::NonNegative(u64::from(v)),
    u16 => |v: u16| KeyInt::NonNegative(u64::from(v)),
    u32 => |v: u32| KeyInt::NonNegative(u64::from(v)),
    u64 => KeyInt::NonNegative,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format(text: &str, size: usize) -> Option<(u8, bool, bool)> {
        let text = std::ffi::CString::new(text).unwrap();
        int_format(&text, size).map(|(kind, swap)| {
            let (width, signed) = match kind {
                Kind::I8 => (1, true),
                Kind::U8 => (1, false),
                Kind::I16 => (2, true),
                Kind::U16 => (2, false),
                Kind::I32 => (4, true),
                Kind::U32 => (4, false),
                Kind::I64 => (8, true),
                Kind::U64 => (8, false),
            };
            (width, signed, swap)
        })
    }

    #[test]
    fn integer_formats_are_read_with_their_byte_order() {
        let foreign = cfg!(target_endian = "little");
        assert_eq!(format("l", 8), Some((8, true, false)));
        assert_eq!(format("@L", 8), Some((8, false, false)));
        assert_eq!(format("=q", 8), Some((8, true, false)));
        assert_eq!(format(">q", 8), Some((8, true, foreign)));
        assert_eq!(format("!I", 4), Some((4, false, foreign)));
        assert_eq!(format("<h", 2), Some((2, true, !foreign)));
        assert_eq!(format("B", 1), Some((1, false, false)));
        assert_eq!(format("n", 8), Some((8, true, false)));
    }

    #[test]
    fn other_formats_are_not_integer_arrays() {
        for (text, size) in [
            ("d", 8),
            ("f", 4),
            ("?", 1),
            ("O", 8),
            ("3s", 3),
            ("T{l:a:}", 8),
            (">l", 8), // a standard-size 'l' is 4 bytes
            ("=n", 8), // 'n' has no standard size
            ("c", 1),
        ] {
            assert_eq!(format(text, size), None, "{text}");
        }
    }
}
