//! Key parts and the bytes each scheme hashes for them.
//!
//! A part that a scheme has no encoding for is refused with [`Error::Unencodable`], saying
//! why; the extension names the key around it (`Error::UnhashableKey`).

use std::borrow::Cow;

use super::key_encoding::{self as enc, DecimalDigits, KeyInt};
use super::lua_tostring;
use super::Scheme;
use crate::Error;

/// A key part, as the extension read it out of its Python value.
pub enum Part<'a> {
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
pub struct Decimal {
    pub negative: bool,
    pub digits: [u8; enc::DECIMAL_MAX_DIGITS],
    pub len: usize,
    pub exponent: i64,
}

fn unencodable<T>(reason: impl Into<Cow<'static, str>>) -> Result<T, Error> {
    Err(Error::Unencodable(reason.into()))
}

/// Appends the bytes `scheme` hashes for `part`.
pub fn encode(out: &mut Vec<u8>, part: &Part<'_>, scheme: Scheme) -> Result<(), Error> {
    match scheme {
        Scheme::Picodata => picodata_part(out, part),
        Scheme::VshardMpCrc32 => mpcrc32_part(out, part),
        Scheme::VshardStrCrc32 => strcrc32_part(out, part),
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

fn picodata_part(out: &mut Vec<u8>, part: &Part<'_>) -> Result<(), Error> {
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
fn mpcrc32_part(out: &mut Vec<u8>, part: &Part<'_>) -> Result<(), Error> {
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
                        return unencodable(
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
            return unencodable(
                "vshard's mpcrc32 cannot encode a datetime (msgpackffi has no encoder for it)",
            )
        }
    }
    Ok(())
}

/// Lua's `tostring()` of the value the part decodes to on a vshard router.
fn strcrc32_part(out: &mut Vec<u8>, part: &Part<'_>) -> Result<(), Error> {
    match part {
        Part::Str(bytes) => out.extend_from_slice(bytes),
        Part::Int(v) => lua_tostring::integer(out, *v),
        Part::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Part::Float(f) if f.is_finite() => lua_tostring::number(out, *f),
        Part::Float(_) => {
            return unencodable("tostring() of a non-finite number differs between LuaJIT builds")
        }
        Part::Uuid(bytes) => uuid_text(out, bytes),
        Part::None => return unencodable("tostring(box.NULL) is a pointer string, not a key"),
        Part::Decimal(_) => {
            return unencodable("the strcrc32 scheme does not hash Decimal; use vshard-mpcrc32")
        }
        Part::DateTime { .. } => return unencodable("the strcrc32 scheme does not hash datetime"),
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
    fn a_part_without_an_encoding_is_refused_with_the_reason() {
        let mut out = Vec::new();
        let refused = encode(&mut out, &Part::None, Scheme::VshardStrCrc32);
        assert!(matches!(refused, Err(Error::Unencodable(reason)) if reason.contains("box.NULL")));
        assert_eq!(
            encode(&mut out, &Part::Int(KeyInt::from_i64(1)), Scheme::Picodata),
            Ok(())
        );
        assert_eq!(out, [1]);
    }
}
