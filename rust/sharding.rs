//! Bucket ids of sharding keys (placeholder: being written).

use pyo3::prelude::*;

/// How a `Decimal` key part is encoded before hashing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecimalFormat {
    Binary,
    Text,
}

/// Reusable scratch space for encoding keys; one per batch so a batch allocates once.
#[derive(Default)]
pub struct KeyHasher {
    buf: Vec<u8>,
}

impl KeyHasher {
    pub fn picodata_i64(&mut self, value: i64) -> u32 {
        value as u32
    }

    /// The Picodata hash (MurmurHash3 x86_32, seed 13) of `key`: one value or a tuple of values.
    pub fn picodata(
        &mut self,
        key: &Bound<'_, PyAny>,
        decimal_format: DecimalFormat,
    ) -> PyResult<u32> {
        let _ = (key, decimal_format, &mut self.buf);
        Err(crate::errors::unhashable_key(
            key.py(),
            "not yet".to_owned(),
        ))
    }
}

/// Bucket id in `1..=bucket_count` for a 32-bit hash.
pub fn bucket_of(hash: u32, bucket_count: u32) -> u32 {
    hash % bucket_count + 1
}

#[pyfunction]
#[pyo3(signature = (key, bucket_count, *, scheme = "picodata", decimal_format = "binary"))]
pub fn bucket_id(
    key: &Bound<'_, PyAny>,
    bucket_count: u32,
    scheme: &str,
    decimal_format: &str,
) -> PyResult<u32> {
    let _ = (scheme, decimal_format);
    let hash = KeyHasher::default().picodata(key, DecimalFormat::Binary)?;
    Ok(bucket_of(hash, bucket_count))
}
