//! Bucket ids of sharding keys, below the Python values: the schemes' byte layouts and hashes.
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
//! The bucket id is then `hash % bucket_count + 1`. Reading the parts out of Python values is
//! the extension's (`rust/hashing/`); everything after that is here.

pub mod crc32c;
pub mod divisor;
pub mod int_lanes;
pub mod key_encoding;
pub mod lanes;
pub mod lua_tostring;
pub mod murmur3;
pub mod parts;
pub mod str_lanes;

use crate::Error;

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
    #[inline]
    pub fn parse(name: &str) -> Result<Self, Error> {
        match name {
            "binary" => Ok(DecimalFormat::Binary),
            "text" => Ok(DecimalFormat::Text),
            _ => Err(Error::UnknownDecimalFormat(name.to_owned())),
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
    pub fn parse(name: &str) -> Result<Self, Error> {
        match name {
            "picodata" => Ok(Scheme::Picodata),
            "vshard-strcrc32" => Ok(Scheme::VshardStrCrc32),
            "vshard-mpcrc32" => Ok(Scheme::VshardMpCrc32),
            _ => Err(Error::UnknownScheme(name.to_owned())),
        }
    }

    /// The Python-facing name.
    #[inline]
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Picodata => "picodata",
            Scheme::VshardStrCrc32 => "vshard-strcrc32",
            Scheme::VshardMpCrc32 => "vshard-mpcrc32",
        }
    }
}

/// Bucket id in `1..=bucket_count` for a 32-bit hash.
#[inline]
pub fn bucket_of(hash: u32, bucket_count: u32) -> u32 {
    hash % bucket_count + 1
}

#[cfg(test)]
mod tests {
    use super::crc32c::crc32c;
    use super::key_encoding::{self as enc, KeyInt};
    use super::*;

    #[test]
    fn picodata_i64_matches_encoding() {
        // picodata bucket of int -1940095024 with 65536 buckets is 32770 (shared vectors).
        assert_eq!(
            bucket_of(
                int_lanes::picodata_hash_of(KeyInt::from_i64(-1_940_095_024)),
                65_536
            ),
            32_770
        );
        assert_eq!(
            bucket_of(int_lanes::picodata_hash_of(KeyInt::from_i64(242)), 16),
            8
        );
        assert_eq!(
            bucket_of(
                int_lanes::picodata_hash_of(KeyInt::NonNegative(2_842_472_588)),
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
