//! Writing MessagePack as msgpack-python's packer writes it: ints in their smallest form,
//! str and bin headers, float64 or nil seconds, and the RPC envelope's fixed parts.

use crate::Error;

/// The method name of every call.
pub const DISPATCH: &[u8] = b"shardline.dispatch";

/// `n` in the smallest unsigned form, as msgpack-python writes a non-negative int.
#[inline]
pub fn put_uint(out: &mut Vec<u8>, n: u64) {
    match n {
        0..=0x7f => out.push(n as u8),
        0x80..=0xff => out.extend_from_slice(&[0xcc, n as u8]),
        0x100..=0xffff => {
            out.push(0xcd);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(0xce);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        _ => {
            out.push(0xcf);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

/// `bytes` as a str (`bin` false) or a bin, behind the smallest header holding its length.
#[inline]
pub fn put_raw(out: &mut Vec<u8>, bytes: &[u8], bin: bool) {
    let len = bytes.len();
    match (len, bin) {
        (0..=31, false) => out.push(0xa0 | len as u8),
        (0..=0xff, _) => out.extend_from_slice(&[if bin { 0xc4 } else { 0xd9 }, len as u8]),
        (0x100..=0xffff, _) => {
            out.push(if bin { 0xc5 } else { 0xda });
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(if bin { 0xc6 } else { 0xdb });
            out.extend_from_slice(&(len as u32).to_be_bytes());
        }
    }
    out.extend_from_slice(bytes);
}

/// Refuses a str or bin of `len` bytes that msgpack cannot carry (over 32 bits of length).
pub fn too_long(what: &str, len: usize) -> Result<(), Error> {
    if len > u32::MAX as usize {
        return Err(Error::Value(format!(
            "{what} is {len} bytes, more than msgpack carries"
        )));
    }
    Ok(())
}

/// The params' array header: four params with a deadline, the three of the first version
/// without one (which a worker of that version reads).
#[inline]
pub fn params_header(deadline: Option<f64>) -> u8 {
    if deadline.is_some() {
        0x94
    } else {
        0x93
    }
}

/// A float64, or nil.
#[inline]
pub fn put_seconds(out: &mut Vec<u8>, seconds: Option<f64>) {
    match seconds {
        None => out.push(0xc0),
        Some(seconds) => {
            out.push(0xcb);
            out.extend_from_slice(&seconds.to_bits().to_be_bytes());
        }
    }
}

/// `n` (negative) in the smallest signed form.
#[inline]
pub fn put_int(out: &mut Vec<u8>, n: i64) {
    // msgpack-python's choice for a negative int: the smallest signed form that holds it
    match n {
        -32..=-1 => out.push(n as u8),
        -128..=-33 => out.extend_from_slice(&[0xd0, n as u8]),
        -32_768..=-129 => {
            out.push(0xd1);
            out.extend_from_slice(&(n as i16).to_be_bytes());
        }
        -2_147_483_648..=-32_769 => {
            out.push(0xd2);
            out.extend_from_slice(&(n as i32).to_be_bytes());
        }
        _ => {
            out.push(0xd3);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

/// A container's header for `len` items: the fix form (`fix`) up to `fix_max`, else the 16-
/// or 32-bit one (`sixteen`, `sixteen + 1`).
#[inline]
pub fn put_len(out: &mut Vec<u8>, len: usize, fix: u8, fix_max: usize, sixteen: u8) {
    if len <= fix_max {
        out.push(fix | len as u8);
    } else if len <= 0xffff {
        out.push(sixteen);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(sixteen + 1);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}
