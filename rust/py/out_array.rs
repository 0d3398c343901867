//! The `out=` array of `route_many`: a caller's integer array that receives one index per key.
//!
//! Filling an array the caller allocated once spares building a 100,000-element list of
//! references (and the caller reading it back); the caller gets small ints it can group by
//! with numpy. The array is checked whole before any key is hashed, and written only after
//! every key was, so a bad key or a bad array leaves it untouched.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;

use crate::py::errors::{raise, short_repr, Error};
use crate::py::int_arrays::{int_format, Kind};

/// A writable one-dimensional array of 32- or 64-bit integers (signed or not, either byte order).
pub struct OutArray {
    buffer: PyUntypedBuffer,
    wide: bool,
    signed: bool,
    swap: bool,
    len: usize,
    stride: isize,
}

impl OutArray {
    /// `value` as an `out=` array, or `InvalidArgument` naming it as `what`
    /// (`InvalidArgumentType` for an object with no buffer or items of another type).
    pub fn of(value: &Bound<'_, PyAny>, what: &str) -> PyResult<Self> {
        let py = value.py();
        let reject = |wrong_type: bool, why: &str| {
            let message = format!(
                "{what} must be a writable one-dimensional array of 32- or 64-bit integers \
                 (such as numpy.empty(len(keys), dtype=numpy.intp)), got {}: {why}",
                short_repr(value)
            );
            let error = if wrong_type {
                Error::InvalidArgumentType(message)
            } else {
                Error::InvalidArgument(message)
            };
            raise(py, error)
        };
        let buffer = PyUntypedBuffer::get(value).map_err(|_| reject(true, "no buffer"))?;
        if buffer.readonly() {
            return Err(reject(false, "it is read-only"));
        }
        if buffer.dimensions() != 1 || buffer.suboffsets().is_some() {
            return Err(reject(false, "it is not one-dimensional"));
        }
        let (wide, signed, swap) = match int_format(buffer.format(), buffer.item_size()) {
            Some((Kind::I32, swap)) => (false, true, swap),
            Some((Kind::U32, swap)) => (false, false, swap),
            Some((Kind::I64, swap)) => (true, true, swap),
            Some((Kind::U64, swap)) => (true, false, swap),
            _ => return Err(reject(true, "its items are not 32- or 64-bit integers")),
        };
        let (len, stride) = (buffer.shape()[0], buffer.strides()[0]);
        Ok(Self {
            buffer,
            wide,
            signed,
            swap,
            len,
            stride,
        })
    }

    /// The number of items.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The largest index an item can hold.
    pub fn max_index(&self) -> u64 {
        match (self.wide, self.signed) {
            (false, true) => i32::MAX as u64,
            (false, false) => u64::from(u32::MAX),
            (true, true) => i64::MAX as u64,
            (true, false) => u64::MAX,
        }
    }

    /// Writes `values` (exactly [`len`](Self::len) of them, each at most
    /// [`max_index`](Self::max_index)) in order.
    pub fn write(&self, values: &[u32]) {
        assert_eq!(values.len(), self.len, "one value per item");
        let base = self.buffer.buf_ptr().cast::<u8>();
        let stride = self.stride;
        // SAFETY: as for `IntArray::values`: item `i < shape[0]` of `item_size` bytes (4 when
        // not `wide`, 8 when `wide`, checked by `int_format`) is at `buf + i * strides[0]`, the
        // memory stays valid while `self.buffer` holds the export, and the exporter said it is
        // writable. Unaligned stores, as nothing obliges an exporter to align its items.
        unsafe {
            if self.wide {
                for (index, &value) in values.iter().enumerate() {
                    let item = u64::from(value);
                    let item = if self.swap { item.swap_bytes() } else { item };
                    let at = base.offset(index as isize * stride).cast::<u64>();
                    at.write_unaligned(item);
                }
            } else {
                for (index, &value) in values.iter().enumerate() {
                    let item = if self.swap { value.swap_bytes() } else { value };
                    let at = base.offset(index as isize * stride).cast::<u32>();
                    at.write_unaligned(item);
                }
            }
        }
    }
}
