//! Packing Python values into MessagePack-RPC frames, byte for byte as msgpack-python would,
//! for the values made only of the plain types; anything else is left to msgpack-python.

use std::cell::RefCell;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyList, PyString, PyTuple};
use shardline_core::wire::encode::{
    params_header, put_int, put_len, put_raw, put_seconds, put_uint, too_long, DISPATCH,
};

use crate::py::errors::OrRaise;

/// `[0, msgid, "shardline.dispatch", [handler, payload, timeout, deadline]]` packed, the bytes
/// msgpack-python's packer writes for it (`payload` as bin, `timeout` and `deadline` as
/// float64 or nil); without a deadline, the three params `[handler, payload, timeout]`.
#[pyfunction]
#[pyo3(signature = (msgid, handler, payload, timeout, deadline=None))]
pub fn msgpack_request<'py>(
    py: Python<'py>,
    msgid: u64,
    handler: &str,
    payload: &[u8],
    timeout: Option<f64>,
    deadline: Option<f64>,
) -> PyResult<Bound<'py, PyBytes>> {
    too_long("the handler's name", handler.len()).or_raise(py)?;
    too_long("the payload", payload.len()).or_raise(py)?;
    let mut out = Vec::with_capacity(48 + handler.len() + payload.len());
    out.extend_from_slice(&[0x94, 0x00]);
    put_uint(&mut out, msgid);
    put_raw(&mut out, DISPATCH, false);
    out.push(params_header(deadline));
    put_raw(&mut out, handler.as_bytes(), false);
    put_raw(&mut out, payload, true);
    put_seconds(&mut out, timeout);
    if deadline.is_some() {
        put_seconds(&mut out, deadline);
    }
    Ok(PyBytes::new(py, &out))
}

/// The most a frame's scratch buffer keeps between two frames.
const SCRATCH_KEPT: usize = 64 * 1024;

thread_local! {
    /// Where a frame with a packed value inside is written, reused from frame to frame.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The frame `head`, then `value` packed (by [`pack_plain`]) as a bin, then `tail`: written in
/// one buffer reused by each thread, so that a frame costs one allocation, its bytes object's;
/// None when `value` is not one [`pack_plain`] packs or its packing is over 32 bits long.
fn frame_with_value<'py>(
    py: Python<'py>,
    head: impl FnOnce(&mut Vec<u8>),
    value: &Bound<'py, PyAny>,
    tail: impl FnOnce(&mut Vec<u8>),
) -> Option<Bound<'py, PyBytes>> {
    let write = |out: &mut Vec<u8>| -> Option<Bound<'py, PyBytes>> {
        out.clear();
        head(out);
        // room for the bin's header, the longest form; the head moves up to it once the
        // value's length is known
        let head_len = out.len();
        out.extend_from_slice(&[0; 5]);
        if !pack_plain(value, out, 0) {
            return None;
        }
        let len = out.len() - head_len - 5;
        let header: &[u8] = match len {
            0..=0xff => &[0xc4, len as u8],
            0x100..=0xffff => &[0xc5, (len >> 8) as u8, len as u8],
            _ if len <= u32::MAX as usize => &(0xc6_u64 << 32 | len as u64).to_be_bytes()[3..],
            _ => return None,
        };
        let start = 5 - header.len();
        out.copy_within(..head_len, start);
        out[start + head_len..head_len + 5].copy_from_slice(header);
        tail(out);
        Some(PyBytes::new(py, &out[start..]))
    };
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut out) => {
            let frame = write(&mut out);
            if out.capacity() > SCRATCH_KEPT {
                *out = Vec::new();
            }
            frame
        }
        // re-entered: pack_plain runs no Python code, but allocating the frame's bytes object
        // can start a collection whose finalizer sends a frame; that one gets a buffer of its own
        Err(_) => write(&mut Vec::new()),
    })
}

/// [`msgpack_request`] with `value` packed as the payload (in the same call, byte for byte as
/// msgpack-python packs it) and `timeout` the seconds left (a negative count sent as 0, as
/// `max(timeout, 0.0)` makes it); None when the call is not that simple: `value` is not one
/// [`pack_plain`] packs, `handler` is not UTF-8 (a surrogate code point), `timeout` is
/// neither None nor a float or int of exactly those types (nor an int a float holds), or a
/// length is over 32 bits. The caller then takes the general path, which sends the call or
/// says why not. `deadline` is sent as [`msgpack_request`] sends it.
#[pyfunction]
#[pyo3(signature = (msgid, handler, value, timeout, deadline=None))]
pub fn msgpack_call<'py>(
    py: Python<'py>,
    msgid: u64,
    handler: &Bound<'py, PyString>,
    value: &Bound<'py, PyAny>,
    timeout: &Bound<'py, PyAny>,
    deadline: Option<f64>,
) -> Option<Bound<'py, PyBytes>> {
    let seconds = if timeout.is_none() {
        None
    } else if let Ok(float) = timeout.cast_exact::<PyFloat>() {
        Some(float.value())
    } else if let Ok(int) = timeout.cast_exact::<pyo3::types::PyInt>() {
        Some(int.extract::<f64>().ok()?)
    } else {
        return None;
    };
    let handler = handler.to_str().ok()?;
    if handler.len() > u32::MAX as usize {
        return None;
    }
    let head = |out: &mut Vec<u8>| {
        out.extend_from_slice(&[0x94, 0x00]);
        put_uint(out, msgid);
        put_raw(out, DISPATCH, false);
        out.push(params_header(deadline));
        put_raw(out, handler.as_bytes(), false);
    };
    let tail = |out: &mut Vec<u8>| {
        // Python's max(seconds, 0.0): -0.0 and NaN stay as they are
        put_seconds(out, seconds.map(|s| if s < 0.0 { 0.0 } else { s }));
        if deadline.is_some() {
            put_seconds(out, deadline);
        }
    };
    frame_with_value(py, head, value, tail)
}

/// `[1, msgid, nil, result]` packed, `result` as bin (or nil), as msgpack-python writes it.
#[pyfunction]
pub fn msgpack_result<'py>(
    py: Python<'py>,
    msgid: u64,
    result: Option<&[u8]>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut out = Vec::with_capacity(16 + result.map_or(0, <[u8]>::len));
    out.extend_from_slice(&[0x94, 0x01]);
    put_uint(&mut out, msgid);
    out.push(0xc0);
    match result {
        None => out.push(0xc0),
        Some(bytes) => {
            too_long("the result", bytes.len()).or_raise(py)?;
            put_raw(&mut out, bytes, true);
        }
    }
    Ok(PyBytes::new(py, &out))
}

/// How deep [`pack_plain`] nests containers before it leaves the value to msgpack-python
/// (whose own bound is 511): results this deep are rare, and the fallback judges them.
const PLAIN_DEPTH: usize = 64;

/// Packs `value` as msgpack-python's `Packer(use_bin_type=True, datetime=False)` does, when
/// it is made only of None, bool, int, float, str, bytes, list, tuple and dict, each of exactly
/// that type, at most [`PLAIN_DEPTH`] containers deep; false (with `out` to be thrown away)
/// for anything else, which is left to msgpack-python: another type (a subclass included), an
/// int outside 64 bits, a str UTF-8 cannot carry, a length over 32 bits.
pub fn pack_plain(value: &Bound<'_, PyAny>, out: &mut Vec<u8>, depth: usize) -> bool {
    if value.is_none() {
        out.push(0xc0);
    } else if let Ok(text) = value.cast_exact::<PyString>() {
        let Ok(text) = text.to_str() else {
            return false;
        };
        if text.len() > u32::MAX as usize {
            return false;
        }
        put_raw(out, text.as_bytes(), false);
    } else if let Ok(flag) = value.cast_exact::<PyBool>() {
        out.push(if flag.is_true() { 0xc3 } else { 0xc2 });
    } else if let Ok(int) = value.cast_exact::<pyo3::types::PyInt>() {
        if let Ok(n) = int.extract::<u64>() {
            put_uint(out, n);
        } else if let Ok(n) = int.extract::<i64>() {
            put_int(out, n);
        } else {
            return false;
        }
    } else if let Ok(float) = value.cast_exact::<PyFloat>() {
        out.push(0xcb);
        out.extend_from_slice(&float.value().to_bits().to_be_bytes());
    } else if let Ok(bytes) = value.cast_exact::<PyBytes>() {
        let bytes = bytes.as_bytes();
        if bytes.len() > u32::MAX as usize {
            return false;
        }
        put_raw(out, bytes, true);
    } else if depth >= PLAIN_DEPTH {
        return false;
    } else if let Ok(list) = value.cast_exact::<PyList>() {
        put_len(out, list.len(), 0x90, 15, 0xdc);
        for item in list.iter() {
            if !pack_plain(&item, out, depth + 1) {
                return false;
            }
        }
    } else if let Ok(tuple) = value.cast_exact::<PyTuple>() {
        put_len(out, tuple.len(), 0x90, 15, 0xdc);
        for item in tuple.iter() {
            if !pack_plain(&item, out, depth + 1) {
                return false;
            }
        }
    } else if let Ok(dict) = value.cast_exact::<PyDict>() {
        put_len(out, dict.len(), 0x80, 15, 0xde);
        for (key, item) in dict.iter() {
            if !(pack_plain(&key, out, depth + 1) && pack_plain(&item, out, depth + 1)) {
                return false;
            }
        }
    } else {
        return false;
    }
    true
}

/// `value` packed as msgpack-python packs it, when it is one [`pack_plain`] packs; None for
/// any other value (the caller then packs it with msgpack-python).
#[pyfunction]
pub fn msgpack_plain<'py>(
    py: Python<'py>,
    value: &Bound<'py, PyAny>,
) -> Option<Bound<'py, PyBytes>> {
    let mut body = Vec::with_capacity(64);
    pack_plain(value, &mut body, 0).then(|| PyBytes::new(py, &body))
}

/// `[1, msgid, nil, result]` packed, `result` being `value` packed on its own (as a bin),
/// as msgpack-python writes both; None when `value` is not one [`pack_plain`] packs (the
/// caller then packs it with msgpack-python, which carries it or says why not).
#[pyfunction]
pub fn msgpack_answer<'py>(
    py: Python<'py>,
    msgid: u64,
    value: &Bound<'py, PyAny>,
) -> Option<Bound<'py, PyBytes>> {
    let head = |out: &mut Vec<u8>| {
        out.extend_from_slice(&[0x94, 0x01]);
        put_uint(out, msgid);
        out.push(0xc0);
    };
    frame_with_value(py, head, value, |_| {})
}
