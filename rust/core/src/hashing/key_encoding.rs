//! MessagePack encodings of sharding-key values, as Tarantool/Picodata lay them out before hashing.
//!
//! Pure byte layout, no Python: integers in their most compact form (as Python's `msgpack` and
//! Tarantool's encoders pick it), `float64` with and without its `0xcb` format byte, and the
//! Tarantool extension types MP_DECIMAL (1), MP_UUID (2) and MP_DATETIME (4) in the smallest ext
//! container.

/// MessagePack extension type codes used by Tarantool.
pub const EXT_DECIMAL: u8 = 1;
pub const EXT_UUID: u8 = 2;
pub const EXT_DATETIME: u8 = 4;

/// MP_DECIMAL limits of the Picodata scheme: significant digits and |scale|.
pub const DECIMAL_MAX_DIGITS: usize = 28;
pub const DECIMAL_MAX_SCALE: i64 = 28;

/// An encoded integer: at most 9 bytes, kept on the stack.
#[derive(Clone, Copy)]
pub struct SmallBytes {
    bytes: [u8; 16],
    len: u8,
}

impl SmallBytes {
    #[inline(always)]
    fn new(head: u8, tail: &[u8]) -> Self {
        let mut word = u128::from(head);
        for (i, &byte) in tail.iter().enumerate() {
            word |= u128::from(byte) << (8 * (i + 1));
        }
        SmallBytes {
            bytes: word.to_le_bytes(),
            len: 1 + tail.len() as u8,
        }
    }

    #[inline(always)]
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The bytes as one little-endian integer, for hashing in registers: reading them back from
    /// memory as 4-byte words right after they were written costs a store-forwarding stall
    /// (`benches/RESULTS.md`, "Where a `route_many` key goes").
    #[inline(always)]
    pub fn as_word(&self) -> (u128, usize) {
        (u128::from_le_bytes(self.bytes), usize::from(self.len))
    }
}

/// The most compact MessagePack encoding of a signed 64-bit integer: non-negative values use the
/// positive fixint / uint8..uint64 forms, negative ones negative fixint / int8..int64.
#[inline]
pub fn int_i64(v: i64) -> SmallBytes {
    if v >= 0 {
        return int_u64(v as u64);
    }
    if v >= -32 {
        SmallBytes::new(v as u8, &[])
    } else if v >= i64::from(i8::MIN) {
        SmallBytes::new(0xd0, &(v as i8).to_be_bytes())
    } else if v >= i64::from(i16::MIN) {
        SmallBytes::new(0xd1, &(v as i16).to_be_bytes())
    } else if v >= i64::from(i32::MIN) {
        SmallBytes::new(0xd2, &(v as i32).to_be_bytes())
    } else {
        SmallBytes::new(0xd3, &v.to_be_bytes())
    }
}

/// The most compact MessagePack encoding of an unsigned 64-bit integer.
#[inline]
pub fn int_u64(v: u64) -> SmallBytes {
    if v < 0x80 {
        SmallBytes::new(v as u8, &[])
    } else if v <= u64::from(u8::MAX) {
        SmallBytes::new(0xcc, &[v as u8])
    } else if v <= u64::from(u16::MAX) {
        SmallBytes::new(0xcd, &(v as u16).to_be_bytes())
    } else if v <= u64::from(u32::MAX) {
        SmallBytes::new(0xce, &(v as u32).to_be_bytes())
    } else {
        SmallBytes::new(0xcf, &v.to_be_bytes())
    }
}

/// An integer in the MessagePack range `[-2**63, 2**64)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyInt {
    /// A negative value.
    Negative(i64),
    /// A value >= 0.
    NonNegative(u64),
}

impl KeyInt {
    #[inline]
    pub fn from_i64(v: i64) -> Self {
        if v < 0 {
            KeyInt::Negative(v)
        } else {
            KeyInt::NonNegative(v as u64)
        }
    }

    #[inline]
    pub fn msgpack(self) -> SmallBytes {
        match self {
            KeyInt::Negative(v) => int_i64(v),
            KeyInt::NonNegative(v) => int_u64(v),
        }
    }

    /// The integer a float stands for when it is finite, whole and inside `[-2**63, 2**64)`.
    #[inline]
    pub fn from_whole_f64(v: f64) -> Option<Self> {
        // 2**64 and -2**63 are exact in f64; NaN fails every comparison.
        if v.fract() == 0.0
            && (-9_223_372_036_854_775_808.0..18_446_744_073_709_551_616.0).contains(&v)
        {
            Some(if v < 0.0 {
                KeyInt::Negative(v as i64)
            } else {
                KeyInt::NonNegative(v as u64)
            })
        } else {
            None
        }
    }
}

/// Appends an extension header for `len` data bytes of type `ext_type`, choosing fixext 1/2/4/8/16
/// when the length allows, else ext8/ext16/ext32.
pub fn ext_header(out: &mut Vec<u8>, ext_type: u8, len: usize) {
    match len {
        1 => out.extend_from_slice(&[0xd4, ext_type]),
        2 => out.extend_from_slice(&[0xd5, ext_type]),
        4 => out.extend_from_slice(&[0xd6, ext_type]),
        8 => out.extend_from_slice(&[0xd7, ext_type]),
        16 => out.extend_from_slice(&[0xd8, ext_type]),
        _ if len <= 0xff => out.extend_from_slice(&[0xc7, len as u8, ext_type]),
        _ if len <= 0xffff => {
            out.push(0xc8);
            out.extend_from_slice(&(len as u16).to_be_bytes());
            out.push(ext_type);
        }
        _ => {
            out.push(0xc9);
            out.extend_from_slice(&(len as u32).to_be_bytes());
            out.push(ext_type);
        }
    }
}

/// A decimal ready for MP_DECIMAL: sign, 1..=28 significant digits (each 0..=9, most significant
/// first) and scale (value = ±digits × 10^-scale), with |scale| <= 28.
pub struct DecimalDigits<'a> {
    pub negative: bool,
    pub digits: &'a [u8],
    pub scale: i8,
}

/// Appends MP_DECIMAL (ext type 1): the scale as a MessagePack int, then the digits as packed BCD
/// ending in a sign nibble (0xC positive, 0xD negative), with a leading zero nibble when the digit
/// count is even so the nibbles fill whole bytes.
pub fn decimal(out: &mut Vec<u8>, d: &DecimalDigits<'_>) {
    debug_assert!(!d.digits.is_empty() && d.digits.len() <= DECIMAL_MAX_DIGITS);
    let n = d.digits.len();
    let bcd_len = n / 2 + 1;
    // |scale| <= 28, so the scale is always a one-byte (positive or negative) fixint.
    ext_header(out, EXT_DECIMAL, 1 + bcd_len);
    out.push(d.scale as u8);
    let sign = if d.negative { 0x0d } else { 0x0c };
    // Nibble stream: [0 if n is even] digits... sign.
    let mut nibbles = d.digits.iter().copied().chain(std::iter::once(sign));
    if n % 2 == 0 {
        // Leading zero nibble, then the first digit.
        out.push(nibbles.next().unwrap_or(0));
    }
    while let (Some(hi), Some(lo)) = (nibbles.next(), nibbles.next()) {
        out.push(hi << 4 | lo);
    }
}

/// Appends MP_UUID (ext type 2): the 16 bytes in RFC 4122 (big-endian) order, as fixext16.
pub fn uuid(out: &mut Vec<u8>, bytes: &[u8; 16]) {
    ext_header(out, EXT_UUID, 16);
    out.extend_from_slice(bytes);
}

/// Appends MP_DATETIME (ext type 4) for a UTC instant: int64 LE seconds since the Unix epoch, and,
/// when `nanos != 0`, int32 LE nanoseconds plus zero int16 tz offset and zero int16 tz index.
pub fn datetime(out: &mut Vec<u8>, seconds: i64, nanos: u32) {
    if nanos == 0 {
        ext_header(out, EXT_DATETIME, 8);
        out.extend_from_slice(&seconds.to_le_bytes());
    } else {
        ext_header(out, EXT_DATETIME, 16);
        out.extend_from_slice(&seconds.to_le_bytes());
        out.extend_from_slice(&(nanos as i32).to_le_bytes());
        out.extend_from_slice(&[0, 0, 0, 0]);
    }
}

/// Days from 1970-01-01 to the proleptic Gregorian date `year-month-day` (negative before it).
pub fn days_from_civil(year: i32, month: u8, day: u8) -> i64 {
    let (m, d) = (i64::from(month), i64::from(day));
    let y = i64::from(year) - i64::from(m <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // [0, 399]
    let mp = (m + 9) % 12; // March = 0
    let doy = (153 * mp + 2) / 5 + d - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn compact_ints() {
        let cases: [(i64, &str); 14] = [
            (0, "00"),
            (127, "7f"),
            (128, "cc80"),
            (255, "ccff"),
            (256, "cd0100"),
            (65_536, "ce00010000"),
            (4_294_967_296, "cf0000000100000000"),
            (-1, "ff"),
            (-32, "e0"),
            (-33, "d0df"),
            (-128, "d080"),
            (-129, "d1ff7f"),
            (-32_769, "d2ffff7fff"),
            (i64::MIN, "d38000000000000000"),
        ];
        for (v, want) in cases {
            assert_eq!(hex(int_i64(v).as_slice()), want, "{v}");
        }
        assert_eq!(hex(int_u64(u64::MAX).as_slice()), "cfffffffffffffffff");
    }

    #[test]
    fn whole_floats() {
        assert_eq!(KeyInt::from_whole_f64(1.0), Some(KeyInt::NonNegative(1)));
        assert_eq!(KeyInt::from_whole_f64(-0.0), Some(KeyInt::NonNegative(0)));
        assert_eq!(
            KeyInt::from_whole_f64(-9.223_372_036_854_776e18),
            Some(KeyInt::Negative(i64::MIN))
        );
        assert_eq!(KeyInt::from_whole_f64(1.844_674_407_370_955_2e19), None); // 2**64
        assert_eq!(KeyInt::from_whole_f64(0.5), None);
        assert_eq!(KeyInt::from_whole_f64(f64::NAN), None);
        assert_eq!(KeyInt::from_whole_f64(f64::INFINITY), None);
    }

    #[test]
    fn decimals() {
        let mut out = Vec::new();
        decimal(
            &mut out,
            &DecimalDigits {
                negative: false,
                digits: &[1],
                scale: 0,
            },
        );
        assert_eq!(hex(&out), "d501001c");
        out.clear();
        decimal(
            &mut out,
            &DecimalDigits {
                negative: false,
                digits: &[1, 1, 0],
                scale: 2,
            },
        );
        assert_eq!(hex(&out), "c7030102110c");
        out.clear();
        decimal(
            &mut out,
            &DecimalDigits {
                negative: true,
                digits: &[1, 2],
                scale: -3,
            },
        );
        assert_eq!(hex(&out), "c70301fd012d");
        out.clear();
        decimal(
            &mut out,
            &DecimalDigits {
                negative: false,
                digits: &[9; 28],
                scale: 28,
            },
        );
        assert_eq!(out.len(), 2 + 16);
        assert_eq!(&out[..3], &[0xd8, 0x01, 28]);
        assert_eq!(out[3], 0x09);
        assert_eq!(out[17], 0x9c);
    }

    #[test]
    fn datetimes_and_uuids() {
        let mut out = Vec::new();
        datetime(&mut out, 1, 0);
        assert_eq!(hex(&out), "d7040100000000000000");
        out.clear();
        datetime(&mut out, -1, 5);
        assert_eq!(hex(&out), "d804ffffffffffffffff0500000000000000");
        out.clear();
        uuid(&mut out, &[0xab; 16]);
        assert_eq!(out.len(), 18);
        assert_eq!(&out[..2], &[0xd8, 0x02]);
    }

    #[test]
    fn civil_days() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(1, 1, 1), -719_162);
        assert_eq!(days_from_civil(9999, 12, 31), 2_932_896);
    }
}
