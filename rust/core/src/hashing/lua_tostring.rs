//! How Tarantool's Lua `tostring()` renders a number that arrived in MessagePack, which is what
//! vshard's `strcrc32` scheme hashes.
//!
//! Tarantool decodes a MessagePack integer into a Lua number (a double) when it lies within
//! ±(1e14 - 1) (`DBL_INT_MAX` in src/lua/utils.c; it is the largest integer that `%.14g` prints
//! exactly), and otherwise into a 64-bit FFI cdata: `uint64_t` for MP_UINT (every non-negative
//! value, as encoders pick the unsigned form for them) and `int64_t` for MP_INT. LuaJIT prints the
//! cdata as `<digits>ULL` / `<digits>LL` and numbers with `%.14g`. A MessagePack float or double
//! becomes a Lua number too.

use std::fmt::Write as _;

use super::key_encoding::KeyInt;

/// Largest magnitude an integer may have and still be decoded as a plain Lua number.
const DBL_INT_MAX: u64 = 99_999_999_999_999;

/// Appends `tostring(v)` for an integer `v` decoded by Tarantool from its compact MessagePack form.
pub fn integer(out: &mut Vec<u8>, v: KeyInt) {
    let mut buf = itoa_buf();
    match v {
        KeyInt::NonNegative(u) => {
            out.extend_from_slice(write_u64(&mut buf, u));
            if u > DBL_INT_MAX {
                out.extend_from_slice(b"ULL");
            }
        }
        KeyInt::Negative(i) => {
            out.push(b'-');
            out.extend_from_slice(write_u64(&mut buf, i.unsigned_abs()));
            if i.unsigned_abs() > DBL_INT_MAX {
                out.extend_from_slice(b"LL");
            }
        }
    }
}

fn itoa_buf() -> [u8; 20] {
    [0u8; 20]
}

fn write_u64(buf: &mut [u8; 20], mut v: u64) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
}

/// A fixed-capacity `fmt::Write` sink on the stack.
struct StackStr {
    buf: [u8; 40],
    len: usize,
}

impl std::fmt::Write for StackStr {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        if end > self.buf.len() {
            return Err(std::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Appends `tostring(v)` for a finite Lua number: C's `%.14g` (14 significant digits, trailing
/// zeros removed, exponent form when the decimal exponent is < -4 or >= 14).
pub fn number(out: &mut Vec<u8>, v: f64) {
    debug_assert!(v.is_finite());
    if v == 0.0 {
        out.extend_from_slice(if v.is_sign_negative() { b"-0" } else { b"0" });
        return;
    }
    // `{:.13e}` rounds correctly (ties to even on the exact binary value, as glibc does) to 14
    // significant digits: "d.ddddddddddddde<exp>".
    let mut s = StackStr {
        buf: [0; 40],
        len: 0,
    };
    write!(s, "{:.13e}", v.abs()).expect("a formatted f64 fits in 40 bytes");
    let text = &s.buf[..s.len];
    let e_at = text
        .iter()
        .position(|&c| c == b'e')
        .expect("exponent marker");
    let exponent: i32 = std::str::from_utf8(&text[e_at + 1..])
        .ok()
        .and_then(|e| e.parse().ok())
        .expect("decimal exponent");
    let mut digits = [0u8; 14];
    digits[0] = text[0];
    digits[1..].copy_from_slice(&text[2..15]);
    let mut sig = 14;
    while sig > 1 && digits[sig - 1] == b'0' {
        sig -= 1;
    }
    let digits = &digits[..sig];

    if v.is_sign_negative() {
        out.push(b'-');
    }
    if (-4..14).contains(&exponent) {
        if exponent >= 0 {
            let int_len = exponent as usize + 1;
            if sig <= int_len {
                out.extend_from_slice(digits);
                out.resize(out.len() + (int_len - sig), b'0');
            } else {
                out.extend_from_slice(&digits[..int_len]);
                out.push(b'.');
                out.extend_from_slice(&digits[int_len..]);
            }
        } else {
            out.extend_from_slice(b"0.");
            out.resize(out.len() + (-exponent - 1) as usize, b'0');
            out.extend_from_slice(digits);
        }
    } else {
        out.push(digits[0]);
        if sig > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.push(if exponent < 0 { b'-' } else { b'+' });
        let mut buf = itoa_buf();
        let mag = write_u64(&mut buf, u64::from(exponent.unsigned_abs()));
        if mag.len() < 2 {
            out.push(b'0');
        }
        out.extend_from_slice(mag);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(v: f64) -> String {
        let mut out = Vec::new();
        number(&mut out, v);
        String::from_utf8(out).unwrap()
    }

    fn int(v: KeyInt) -> String {
        let mut out = Vec::new();
        integer(&mut out, v);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn numbers_like_percent_14g() {
        // Expected strings are C's printf("%.14g", v).
        let cases: [(f64, &str); 16] = [
            (1.0, "1"),
            (-0.0, "-0"),
            (1.5, "1.5"),
            (0.1, "0.1"),
            (1.0 / 3.0, "0.33333333333333"),
            (123_456.789, "123456.789"),
            (1e14, "1e+14"),
            (99_999_999_999_999.0, "99999999999999"),
            (1e-4, "0.0001"),
            (1.5e-5, "1.5e-05"),
            (-2.5e100, "-2.5e+100"),
            (5e-324, "4.9406564584125e-324"),
            (f64::MAX, "1.7976931348623e+308"),
            (999_999_999_999_995.0, "1e+15"),
            (0.000_123_456_789_012_345_6, "0.00012345678901235"),
            (-428_912_915.815_966_6, "-428912915.81597"),
        ];
        for (v, want) in cases {
            assert_eq!(num(v), want, "{v:e}");
        }
    }

    #[test]
    fn integers_like_tarantool() {
        assert_eq!(int(KeyInt::NonNegative(1)), "1");
        assert_eq!(int(KeyInt::NonNegative(0)), "0");
        assert_eq!(
            int(KeyInt::NonNegative(99_999_999_999_999)),
            "99999999999999"
        );
        assert_eq!(
            int(KeyInt::NonNegative(100_000_000_000_000)),
            "100000000000000ULL"
        );
        assert_eq!(
            int(KeyInt::NonNegative(u64::MAX)),
            "18446744073709551615ULL"
        );
        assert_eq!(int(KeyInt::Negative(-1)), "-1");
        assert_eq!(
            int(KeyInt::Negative(-99_999_999_999_999)),
            "-99999999999999"
        );
        assert_eq!(
            int(KeyInt::Negative(-100_000_000_000_000)),
            "-100000000000000LL"
        );
        assert_eq!(int(KeyInt::Negative(i64::MIN)), "-9223372036854775808LL");
    }
}
