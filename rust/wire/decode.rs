//! Python values of MessagePack messages: any message the scan found whole, and the hot path's
//! dispatch requests and answers straight to tuples of their checked fields.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyList, PyString};
use shardline_core::wire::encode::DISPATCH;
use shardline_core::wire::fields::{deadline, raw, timeout, uint};
use shardline_core::wire::scan::{be, header, scan_message, Limits, Scan};

use crate::py::errors::{raise, Error, Failure};

/// Builds the Python value of the item at `data[*pos]`, which `scan_message` found whole.
pub fn build<'py>(
    py: Python<'py>,
    data: &[u8],
    pos: &mut usize,
) -> Result<Bound<'py, PyAny>, Failure> {
    let at = *pos;
    let b = data[at];
    // the scan checked every length and the depth: only the contents remain to be judged
    let (head, body, items) = header(data, at).ok().flatten().expect("a scanned message");
    let start = at + head;
    let end = start + body as usize;
    *pos = end;
    let bytes = &data[start..end];
    let value = match b {
        0x00..=0x7f => int(py, u64::from(b)),
        0xe0..=0xff => int(py, i64::from(b as i8)),
        0xc0 => py.None().into_bound(py),
        0xc2 => PyBool::new(py, false).to_owned().into_any(),
        0xc3 => PyBool::new(py, true).to_owned().into_any(),
        0xcc..=0xcf => int(py, be(bytes)),
        0xd0 => int(py, i64::from(bytes[0] as i8)),
        0xd1 => int(py, i64::from(be(bytes) as u16 as i16)),
        0xd2 => int(py, i64::from(be(bytes) as u32 as i32)),
        0xd3 => int(py, be(bytes) as i64),
        0xca => PyFloat::new(py, f64::from(f32::from_bits(be(bytes) as u32))).into_any(),
        0xcb => PyFloat::new(py, f64::from_bits(be(bytes))).into_any(),
        0xa0..=0xbf | 0xd9..=0xdb => text(py, bytes)?.into_any(),
        0xc4..=0xc6 => PyBytes::new(py, bytes).into_any(),
        0x90..=0x9f | 0xdc | 0xdd => {
            let list = PyList::empty(py);
            for _ in 0..items {
                list.append(build(py, data, pos)?)?;
            }
            list.into_any()
        }
        _ => {
            let dict = PyDict::new(py);
            for _ in 0..items / 2 {
                let key_at = *pos;
                let key = build(py, data, pos)?;
                if !matches!(data[key_at], 0xa0..=0xbf | 0xd9..=0xdb | 0xc4..=0xc6) {
                    return Err(Failure::Refused(Error::Malformed(format!(
                        "a map key is not a str nor bytes but {}",
                        key.get_type()
                            .name()
                            .map_or_else(|_| "?".into(), |n| n.to_string())
                    ))));
                }
                let value = build(py, data, pos)?;
                dict.set_item(key, value)?;
            }
            dict.into_any()
        }
    };
    Ok(value)
}

/// A Python int (the conversion cannot fail).
fn int<'py>(
    py: Python<'py>,
    n: impl IntoPyObject<
        'py,
        Target = pyo3::types::PyInt,
        Output = Bound<'py, pyo3::types::PyInt>,
        Error = std::convert::Infallible,
    >,
) -> Bound<'py, PyAny> {
    let Ok(value) = n.into_pyobject(py);
    value.into_any()
}

fn text<'py>(py: Python<'py>, bytes: &[u8]) -> Result<Bound<'py, PyString>, Failure> {
    // CPython checks the UTF-8 as it decodes it; Rust says what is wrong with a string it
    // refuses (the same strings: neither reads a surrogate, an overlong form or past U+10FFFF)
    PyString::from_bytes(py, bytes).map_err(|failure| match std::str::from_utf8(bytes) {
        Err(error) => Failure::Refused(Error::Malformed(format!("a string is not UTF-8: {error}"))),
        Ok(_) => Failure::Raised(failure),
    })
}

/// `(msgid, handler, argument, timeout, deadline)` of `[0, msgid, "shardline.dispatch",
/// [handler, payload, timeout]]` (`deadline` None) or of `[..., [handler, payload, timeout,
/// deadline]]` with a msgid in 0..2^32, a UTF-8 handler, a bin payload holding one readable
/// value of at most `limits.inner` items (`argument`, that value), a readable timeout and a
/// deadline nil or a finite float64, if `data` starts with exactly that message, at most
/// `limits.bytes` bytes long; with the message's length.
pub fn dispatch<'py>(
    py: Python<'py>,
    data: &[u8],
    limits: Limits,
    last_handler: &mut Option<Py<PyString>>,
) -> Option<(PyResult<Bound<'py, PyAny>>, usize)> {
    if data.get(..2)? != [0x94, 0x00] {
        return None;
    }
    let mut pos = 2;
    let msgid = uint(data, &mut pos)?;
    if msgid > u64::from(u32::MAX) {
        return None;
    }
    if raw(data, &mut pos, false)? != DISPATCH {
        return None;
    }
    let params = *data.get(pos)?;
    if params != 0x93 && params != 0x94 {
        return None;
    }
    pos += 1;
    let handler = raw(data, &mut pos, false)?;
    let payload = raw(data, &mut pos, true)?;
    let seconds = timeout(data, &mut pos)?;
    let until = if params == 0x94 {
        deadline(data, &mut pos)?
    } else {
        None
    };
    if pos > limits.bytes {
        return None;
    }
    // A client sends the same few names over and over: the last one's str is handed over
    // again (no new str, no hashing it for the handlers' lookup). CPython checks the UTF-8
    // of a new one as it decodes it.
    let handler = match last_handler {
        Some(last)
            if last
                .bind(py)
                .to_str()
                .is_ok_and(|text| text.as_bytes() == handler) =>
        {
            last.bind(py).clone()
        }
        _ => {
            let new = PyString::from_bytes(py, handler).ok()?;
            *last_handler = Some(new.clone().unbind());
            new
        }
    };
    let tuple = inner_value(py, payload, limits.inner)?.and_then(|argument| {
        (msgid, handler, argument, seconds, until)
            .into_pyobject(py)
            .map(Bound::into_any)
    });
    Some((tuple, pos))
}

/// The value packed in a payload or result bin; None when it is not one value this protocol
/// reads (the message is then handed over whole, for the Python side to answer as it would
/// any unreadable payload), `Some(Err)` when Python failed to make it.
fn inner_value<'py>(
    py: Python<'py>,
    bytes: &[u8],
    max_items: u64,
) -> Option<PyResult<Bound<'py, PyAny>>> {
    match value_of(py, bytes, max_items) {
        Ok(value) => Some(Ok(value)),
        Err(Failure::Raised(error)) => Some(Err(error)),
        Err(Failure::Refused(_)) => None,
    }
}

/// `(msgid, value)` of `[1, msgid, nil, result bin]` with a non-negative msgid and a result
/// holding one readable value of at most `limits.inner` items (`value`, that value), if `data`
/// starts with exactly that message, at most `limits.bytes` bytes long; with the message's
/// length.
pub fn answer<'py>(
    py: Python<'py>,
    data: &[u8],
    limits: Limits,
) -> Option<(PyResult<Bound<'py, PyAny>>, usize)> {
    if data.get(..2)? != [0x94, 0x01] {
        return None;
    }
    let mut pos = 2;
    let msgid = uint(data, &mut pos)?;
    if *data.get(pos)? != 0xc0 {
        return None;
    }
    pos += 1;
    let result = raw(data, &mut pos, true)?;
    if pos > limits.bytes {
        return None;
    }
    let tuple = inner_value(py, result, limits.inner)?
        .and_then(|value| (msgid, value).into_pyobject(py).map(Bound::into_any));
    Some((tuple, pos))
}

/// The one msgpack value `data` holds, read as `MsgpackReader` reads a message (no size
/// limit beyond `data`'s; at most `max_items` items, when given); `ValueError` naming what is
/// wrong otherwise.
#[pyfunction]
#[pyo3(signature = (data, max_items=None))]
pub fn msgpack_unpack<'py>(
    py: Python<'py>,
    data: &[u8],
    max_items: Option<u64>,
) -> PyResult<Bound<'py, PyAny>> {
    value_of(py, data, max_items.unwrap_or(u64::MAX)).map_err(|failure| match failure {
        // the limit is the data's own length: a value over it is cut short
        Failure::Refused(Error::FrameTooLarge) => {
            raise(py, Error::Malformed("the value is cut short".into()))
        }
        other => other.raise(py),
    })
}

/// The one msgpack value `data` holds (see [`msgpack_unpack`]).
pub fn value_of<'py>(
    py: Python<'py>,
    data: &[u8],
    max_items: u64,
) -> Result<Bound<'py, PyAny>, Failure> {
    let limits = Limits {
        items: max_items,
        ..Limits::bytes(data.len())
    };
    let mut scan = Scan::default();
    match scan_message(data, 0, limits, &mut scan).map_err(Failure::Refused)? {
        Some(end) if end == data.len() => build(py, data, &mut 0),
        Some(_) => Err(Error::Malformed("extra bytes after the value".into()).into()),
        None => Err(Error::Malformed("the value is cut short".into()).into()),
    }
}
