//! Single fields of the hot path's messages (a msgid, a str or bin, a timeout, a deadline),
//! read straight from the bytes; None for anything the fast readers leave to the general path.

use super::scan::be;

/// The unsigned integer at `data[*pos]`, if that is one.
#[inline]
pub fn uint(data: &[u8], pos: &mut usize) -> Option<u64> {
    let b = *data.get(*pos)?;
    let width = match b {
        0x00..=0x7f => {
            *pos += 1;
            return Some(u64::from(b));
        }
        0xcc => 1,
        0xcd => 2,
        0xce => 4,
        0xcf => 8,
        _ => return None,
    };
    let value = be(data.get(*pos + 1..*pos + 1 + width)?);
    *pos += 1 + width;
    Some(value)
}

/// The str or bin at `data[*pos]` (`bin` says which), if that is one.
#[inline]
pub fn raw<'a>(data: &'a [u8], pos: &mut usize, bin: bool) -> Option<&'a [u8]> {
    let b = *data.get(*pos)?;
    let (head, len) = match (b, bin) {
        (0xa0..=0xbf, false) => (1, usize::from(b & 0x1f)),
        (0xd9, false) | (0xc4, true) => (2, be(data.get(*pos + 1..*pos + 2)?) as usize),
        (0xda, false) | (0xc5, true) => (3, be(data.get(*pos + 1..*pos + 3)?) as usize),
        (0xdb, false) | (0xc6, true) => (5, be(data.get(*pos + 1..*pos + 5)?) as usize),
        _ => return None,
    };
    let start = *pos + head;
    let bytes = data.get(start..start + len)?;
    *pos = start + len;
    Some(bytes)
}

/// A request's timeout as the worker reads it (nil or +inf: none; negative: 0), if it is a
/// number; NaN and anything else are left to the Python side to refuse.
#[inline]
pub fn timeout(data: &[u8], pos: &mut usize) -> Option<Option<f64>> {
    let b = *data.get(*pos)?;
    let seconds = match b {
        0xc0 => {
            *pos += 1;
            return Some(None);
        }
        0xcb => f64::from_bits(be(data.get(*pos + 1..*pos + 9)?)),
        0xca => f64::from(f32::from_bits(be(data.get(*pos + 1..*pos + 5)?) as u32)),
        0x00..=0x7f | 0xcc..=0xcf => {
            return uint(data, pos).map(|n| Some(n as f64));
        }
        0xe0..=0xff | 0xd0..=0xd3 => {
            // a negative count of seconds, or a positive one written signed
            let mut at = *pos;
            let negative =
                matches!(b, 0xe0..=0xff) || data.get(at + 1).is_some_and(|first| first & 0x80 != 0);
            if !negative {
                return None;
            }
            at += match b {
                0xe0..=0xff => 1,
                0xd0 => 2,
                0xd1 => 3,
                0xd2 => 5,
                _ => 9,
            };
            *pos = at;
            return Some(Some(0.0));
        }
        _ => return None,
    };
    *pos += if b == 0xcb { 9 } else { 5 };
    if seconds.is_nan() {
        return None;
    }
    if seconds == f64::INFINITY {
        return Some(None);
    }
    // Python's max(seconds, 0.0): -0.0 stays as it is
    Some(Some(if seconds < 0.0 { 0.0 } else { seconds }))
}

/// A request's deadline (nil: none), if it is nil, a finite float or an int (as the nearest
/// float); anything else is left to the Python side to refuse.
#[inline]
pub fn deadline(data: &[u8], pos: &mut usize) -> Option<Option<f64>> {
    let b = *data.get(*pos)?;
    let (seconds, len) = match b {
        0xc0 => {
            *pos += 1;
            return Some(None);
        }
        0xcb => (f64::from_bits(be(data.get(*pos + 1..*pos + 9)?)), 9),
        0xca => (
            f64::from(f32::from_bits(be(data.get(*pos + 1..*pos + 5)?) as u32)),
            5,
        ),
        0x00..=0x7f | 0xcc..=0xcf => return uint(data, pos).map(|n| Some(n as f64)),
        0xe0..=0xff => (f64::from(b as i8), 1),
        0xd0..=0xd3 => {
            let width = 1 << (b - 0xd0);
            let bits = be(data.get(*pos + 1..*pos + 1 + width)?);
            // sign-extended from its width
            let shift = 64 - 8 * width as u32;
            (((bits << shift) as i64 >> shift) as f64, 1 + width)
        }
        _ => return None,
    };
    if !seconds.is_finite() {
        return None;
    }
    *pos += len;
    Some(Some(seconds))
}
