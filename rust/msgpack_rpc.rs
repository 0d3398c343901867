//! MessagePack-RPC frames: reading a stream of messages (one call per socket read) and writing
//! the two messages of every call.
//!
//! The reader does in one call what the transport's Python did per message: find where each
//! message ends (however the socket split the bytes), refuse one over the frame limit, and
//! turn it into Python values. It reads the subset of MessagePack the protocol allows: maps
//! keyed by str or bytes only, UTF-8 strings, no extension types, at most 1024 containers
//! deep (msgpack-python's own bound). Nothing read is ever executed or unpickled.
//!
//! On the hot path it goes one step further: a well-formed dispatch request (for a worker) or
//! a successful answer (for a client) comes out as a tuple of its fields, already checked,
//! instead of a list for Python to take apart; anything else (the hello, a cancel, a ping, an
//! error answer, a malformed envelope) comes out as the plain decoded value, for the Python
//! side to judge as before.

use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyList, PyString, PyTuple, PyType};
use std::cell::RefCell;

/// msgpack-python refuses a 1025th container nested in the others; so does this reader.
const MAX_DEPTH: usize = 1024;
const DISPATCH: &[u8] = b"shardline.dispatch";

/// Why a stream cannot be read on.
enum Refusal {
    /// A message longer than the limit.
    TooLarge,
    /// Bytes this protocol does not read; the text says which.
    Malformed(String),
    /// Python failed to make a value (out of memory).
    Python(PyErr),
}

impl From<PyErr> for Refusal {
    fn from(error: PyErr) -> Self {
        Refusal::Python(error)
    }
}

/// Where the scan of the unfinished message stopped: `pos` is the start of the next item (its
/// header not read yet), `open` the items still due in each container not finished yet, `due`
/// their sum, `items` the items whose headers were read.
#[derive(Default)]
struct Scan {
    pos: usize,
    open: Vec<u64>,
    due: u64,
    items: u64,
}

/// What one message may hold: `bytes`, and `items` (each value, container and key counts
/// one) outside the payload or result bin it carries; `inner` the items of that payload or
/// result, read on its own.
#[derive(Clone, Copy)]
struct Limits {
    bytes: usize,
    items: u64,
    inner: u64,
}

impl Limits {
    fn bytes(bytes: usize) -> Self {
        Limits {
            bytes,
            items: u64::MAX,
            inner: u64::MAX,
        }
    }
}

fn be(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0, |n, &b| (n << 8) | u64::from(b))
}

/// What the header at `data[pos]` says: `(header bytes, body bytes, items it contains)`, or
/// None when the header is not all there yet.
fn header(data: &[u8], pos: usize) -> Result<Option<(usize, u64, u64)>, Refusal> {
    let b = data[pos];
    let sized = |width: usize| -> Option<u64> { data.get(pos + 1..pos + 1 + width).map(be) };
    Ok(Some(match b {
        0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (1, 0, 0),
        0xcc | 0xd0 => (1, 1, 0),
        0xcd | 0xd1 => (1, 2, 0),
        0xce | 0xd2 | 0xca => (1, 4, 0),
        0xcf | 0xd3 | 0xcb => (1, 8, 0),
        0xa0..=0xbf => (1, u64::from(b & 0x1f), 0),
        0xd9 | 0xc4 => match sized(1) {
            Some(n) => (2, n, 0),
            None => return Ok(None),
        },
        0xda | 0xc5 => match sized(2) {
            Some(n) => (3, n, 0),
            None => return Ok(None),
        },
        0xdb | 0xc6 => match sized(4) {
            Some(n) => (5, n, 0),
            None => return Ok(None),
        },
        0x90..=0x9f => (1, 0, u64::from(b & 0x0f)),
        0x80..=0x8f => (1, 0, 2 * u64::from(b & 0x0f)),
        0xdc => match sized(2) {
            Some(n) => (3, 0, n),
            None => return Ok(None),
        },
        0xdd => match sized(4) {
            Some(n) => (5, 0, n),
            None => return Ok(None),
        },
        0xde => match sized(2) {
            Some(n) => (3, 0, 2 * n),
            None => return Ok(None),
        },
        0xdf => match sized(4) {
            Some(n) => (5, 0, 2 * n),
            None => return Ok(None),
        },
        0xc1 => return Err(Refusal::Malformed("byte 0xc1 is not msgpack".into())),
        // 0xc7-0xc9 and 0xd4-0xd8: the extension types, the timestamp among them
        _ => {
            return Err(Refusal::Malformed(format!(
                "extension types are refused (byte {b:#04x})"
            )))
        }
    }))
}

/// Scans `data` from `scan.pos` (inside a message that starts at `start`) for the message's
/// end: `Ok(Some(end))`, or `Ok(None)` with `scan` left where the bytes ran out, to be resumed
/// when more come. A message that cannot fit in `limits.bytes` bytes is refused as soon as that
/// is known (each item still due takes at least a byte), and one holding more than
/// `limits.items` items (each value, container and key counts one) at the header past them:
/// the scan costs a few operations per header, building the values many times more.
fn scan_message(
    data: &[u8],
    start: usize,
    limits: Limits,
    scan: &mut Scan,
) -> Result<Option<usize>, Refusal> {
    let bound = start.saturating_add(limits.bytes) as u64;
    loop {
        let pos = scan.pos;
        if pos >= data.len() {
            return Ok(None);
        }
        let Some((head, body, items)) = header(data, pos)? else {
            // a header cut short, which may not fit either
            if data.len() as u64 > bound {
                return Err(Refusal::TooLarge);
            }
            return Ok(None);
        };
        let end = pos as u64 + head as u64 + body;
        // the items this one holds and those due after it take a byte each at least (each open
        // container's count includes the one item in progress in it)
        let due_after = scan.due - scan.open.len() as u64;
        if end.saturating_add(items).saturating_add(due_after) > bound {
            return Err(Refusal::TooLarge);
        }
        if end > data.len() as u64 {
            return Ok(None);
        }
        scan.items += 1;
        if scan.items > limits.items {
            return Err(Refusal::Malformed(format!(
                "more than {} items in one message",
                limits.items
            )));
        }
        scan.pos = end as usize;
        if is_container(data[pos]) && scan.open.len() >= MAX_DEPTH {
            return Err(Refusal::Malformed(format!(
                "nested deeper than {MAX_DEPTH} containers"
            )));
        }
        if items > 0 {
            scan.open.push(items);
            scan.due += items;
            continue;
        }
        // one item done: it may finish the containers around it
        loop {
            match scan.open.last_mut() {
                None => return Ok(Some(scan.pos)),
                Some(due) => {
                    *due -= 1;
                    scan.due -= 1;
                    if *due > 0 {
                        break;
                    }
                    scan.open.pop();
                }
            }
        }
    }
}

fn is_container(b: u8) -> bool {
    matches!(b, 0x80..=0x9f | 0xdc..=0xdf)
}

/// Builds the Python value of the item at `data[*pos]`, which `scan_message` found whole.
fn build<'py>(py: Python<'py>, data: &[u8], pos: &mut usize) -> Result<Bound<'py, PyAny>, Refusal> {
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
                    return Err(Refusal::Malformed(format!(
                        "a map key is not a str nor bytes but {}",
                        key.get_type()
                            .name()
                            .map_or_else(|_| "?".into(), |n| n.to_string())
                    )));
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

fn text<'py>(py: Python<'py>, bytes: &[u8]) -> Result<Bound<'py, PyString>, Refusal> {
    // CPython checks the UTF-8 as it decodes it; Rust says what is wrong with a string it
    // refuses (the same strings: neither reads a surrogate, an overlong form or past U+10FFFF)
    PyString::from_bytes(py, bytes).map_err(|failure| match std::str::from_utf8(bytes) {
        Err(error) => Refusal::Malformed(format!("a string is not UTF-8: {error}")),
        Ok(_) => Refusal::Python(failure),
    })
}

/// The unsigned integer at `data[*pos]`, if that is one.
fn uint(data: &[u8], pos: &mut usize) -> Option<u64> {
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
fn raw<'a>(data: &'a [u8], pos: &mut usize, bin: bool) -> Option<&'a [u8]> {
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
fn timeout(data: &[u8], pos: &mut usize) -> Option<Option<f64>> {
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
fn deadline(data: &[u8], pos: &mut usize) -> Option<Option<f64>> {
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

/// `(msgid, handler, argument, timeout, deadline)` of `[0, msgid, "shardline.dispatch",
/// [handler, payload, timeout]]` (`deadline` None) or of `[..., [handler, payload, timeout,
/// deadline]]` with a msgid in 0..2^32, a UTF-8 handler, a bin payload holding one readable
/// value of at most `limits.inner` items (`argument`, that value), a readable timeout and a
/// deadline nil or a finite float64, if `data` starts with exactly that message, at most
/// `limits.bytes` bytes long; with the message's length.
fn dispatch<'py>(
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
        Err(Refusal::Python(error)) => Some(Err(error)),
        Err(Refusal::Malformed(_) | Refusal::TooLarge) => None,
    }
}

/// `(msgid, value)` of `[1, msgid, nil, result bin]` with a non-negative msgid and a result
/// holding one readable value of at most `limits.inner` items (`value`, that value), if `data`
/// starts with exactly that message, at most `limits.bytes` bytes long; with the message's
/// length.
fn answer<'py>(
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fast {
    None,
    Requests,
    Answers,
}

/// The state between two reads: the unfinished message's bytes and how far they are scanned.
#[derive(Default)]
struct Pending {
    tail: Vec<u8>,
    scan: Scan,
    /// Messages read so far (only whether it is the first matters).
    read: u64,
    /// Taken by a read in progress; a second thread reading at once is refused.
    busy: bool,
    /// A refusal ends the stream: it has lost its framing.
    refused: bool,
    /// The handler named by the last dispatch request read.
    last_handler: Option<Py<PyString>>,
}

/// Reads the MessagePack-RPC messages of a byte stream, whatever the split of its reads.
///
/// `MsgpackReader(max_frame_bytes, fast, malformed, too_large, max_items=None,
/// max_inner_items=None)`: `fast` is `None`, `"requests"` or `"answers"`; `malformed` the
/// exception class raised (with a message) for bytes the protocol does not read (a message of
/// more than `max_items` items among them, a payload or result bin counting one), `too_large`
/// the one raised (with `max_frame_bytes`) for a message over `max_frame_bytes`. After either,
/// every later `feed` raises it again. A fast message whose payload or result holds more than
/// `max_inner_items` items is handed over as the plain message instead (its payload still a
/// bin). `unfinished` is the count of bytes held of a message not finished yet.
///
/// `feed(data)` returns the messages `data` completes, in order: each the decoded value (lists,
/// dicts, str, bytes, int, float, bool, None), except, after the first message, a dispatch
/// request (with `fast="requests"`) as `(msgid, handler, payload, timeout, deadline)` and a
/// successful answer (with `fast="answers"`) as `(msgid, result)`, with `timeout` None or
/// seconds ≥ 0 and `deadline` None (none sent) or a finite float.
///
/// Implementation notes: a message completed within one read is decoded from that read's
/// bytes; only an unfinished one is copied, and its scan resumes where it stopped (the open
/// containers' item counts), so a message cut into many reads costs what one read would.
/// The lock guards only the swap of the pending state: Python objects are built with no lock
/// held.
#[pyclass(frozen, subclass, module = "shardline._core", name = "MsgpackReader")]
pub struct MsgpackReader {
    limits: Limits,
    fast: Fast,
    malformed: Py<PyType>,
    too_large: Py<PyType>,
    pending: Mutex<Pending>,
}

impl MsgpackReader {
    fn refusal(&self, py: Python<'_>, refusal: Refusal) -> PyErr {
        match refusal {
            Refusal::TooLarge => {
                PyErr::from_type(self.too_large.bind(py).clone(), (self.limits.bytes,))
            }
            Refusal::Malformed(what) => PyErr::from_type(
                self.malformed.bind(py).clone(),
                format!("unreadable msgpack: {what}"),
            ),
            Refusal::Python(error) => error,
        }
    }

    /// Reads the messages of `data` (after the pending tail, if any) into `out`; returns what
    /// is left pending. The unfinished message's bytes are kept in the tail's own buffer, so
    /// a message arriving in many small reads is copied about once, not once per read.
    fn read<'py>(
        &self,
        py: Python<'py>,
        mut pending: Pending,
        data: &[u8],
        out: &Bound<'py, PyList>,
    ) -> Result<Pending, Refusal> {
        let mut tail = std::mem::take(&mut pending.tail);
        let unread = if tail.is_empty() {
            self.messages(py, &mut pending, data, out)?
                .map(|start| data[start..].to_vec())
        } else {
            tail.extend_from_slice(data);
            self.messages(py, &mut pending, &tail, out)?.map(|start| {
                tail.drain(..start);
                tail
            })
        };
        pending.tail = unread.unwrap_or_default();
        Ok(pending)
    }

    /// Reads the messages `bytes` completes (the first one's scan resumed from `pending`) into
    /// `out`; returns where the unfinished one starts, if `bytes` ends inside one, with its
    /// scan in `pending`, relative to that start.
    fn messages<'py>(
        &self,
        py: Python<'py>,
        pending: &mut Pending,
        bytes: &[u8],
        out: &Bound<'py, PyList>,
    ) -> Result<Option<usize>, Refusal> {
        let mut start = 0;
        loop {
            if start >= bytes.len() {
                pending.scan = Scan::default();
                return Ok(None);
            }
            // The hot path's messages are read at once, without the scan: the fast readers
            // check every byte of them the scan would (and the limit), and go no further than
            // the bytes there are (an unfinished message is left to the scan).
            let fast = if pending.read == 0 {
                None
            } else {
                match self.fast {
                    Fast::None => None,
                    Fast::Requests => {
                        dispatch(py, &bytes[start..], self.limits, &mut pending.last_handler)
                    }
                    Fast::Answers => answer(py, &bytes[start..], self.limits),
                }
            };
            if let Some((tuple, len)) = fast {
                out.append(tuple?)?;
                pending.read += 1;
                pending.scan = Scan::default();
                start += len;
                continue;
            }
            if pending.scan.pos < start {
                pending.scan.pos = start;
            }
            let Some(end) = scan_message(bytes, start, self.limits, &mut pending.scan)? else {
                pending.scan.pos -= start;
                return Ok(Some(start));
            };
            out.append(build(py, &bytes[start..end], &mut 0)?)?;
            pending.read += 1;
            pending.scan = Scan::default();
            start = end;
        }
    }
}

#[pymethods]
impl MsgpackReader {
    #[new]
    #[pyo3(signature = (
        max_frame_bytes, fast, malformed, too_large, max_items=None, max_inner_items=None
    ))]
    fn new(
        max_frame_bytes: usize,
        fast: Option<&str>,
        malformed: Py<PyType>,
        too_large: Py<PyType>,
        max_items: Option<u64>,
        max_inner_items: Option<u64>,
    ) -> PyResult<Self> {
        if max_frame_bytes == 0 {
            return Err(PyValueError::new_err(
                "max_frame_bytes must be positive, got 0",
            ));
        }
        if max_items == Some(0) || max_inner_items == Some(0) {
            return Err(PyValueError::new_err(
                "an item limit must be positive, got 0",
            ));
        }
        let fast = match fast {
            None => Fast::None,
            Some("requests") => Fast::Requests,
            Some("answers") => Fast::Answers,
            Some(other) => {
                return Err(PyValueError::new_err(format!(
                    "fast is None, 'requests' or 'answers', not {other:?}"
                )))
            }
        };
        Ok(Self {
            limits: Limits {
                bytes: max_frame_bytes,
                items: max_items.unwrap_or(u64::MAX),
                inner: max_inner_items.unwrap_or(u64::MAX),
            },
            fast,
            malformed,
            too_large,
            pending: Mutex::new(Pending::default()),
        })
    }

    /// The bytes held of a message not finished yet (0 when the last read ended between
    /// messages).
    #[getter]
    fn unfinished(&self) -> usize {
        self.pending.lock().tail.len()
    }

    fn feed<'py>(&self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
        let pending = {
            let mut guard = self.pending.lock();
            if guard.refused {
                drop(guard);
                return Err(self.refusal(
                    py,
                    Refusal::Malformed("the stream was refused already".into()),
                ));
            }
            if guard.busy {
                return Err(PyRuntimeError::new_err(
                    "a MsgpackReader is fed by one thread at a time",
                ));
            }
            let pending = std::mem::take(&mut *guard);
            guard.busy = true;
            pending
        };
        let out = PyList::empty(py);
        let read = self.read(py, pending, data, &out);
        let mut guard = self.pending.lock();
        match read {
            Ok(left) => {
                *guard = left;
                Ok(out)
            }
            Err(refusal) => {
                guard.refused = true;
                drop(guard);
                Err(self.refusal(py, refusal))
            }
        }
    }
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
    value_of(py, data, max_items.unwrap_or(u64::MAX)).map_err(|refusal| match refusal {
        Refusal::Malformed(what) => PyValueError::new_err(what),
        Refusal::Python(error) => error,
        Refusal::TooLarge => PyValueError::new_err("the value is cut short"),
    })
}

/// The one msgpack value `data` holds (see [`msgpack_unpack`]).
fn value_of<'py>(
    py: Python<'py>,
    data: &[u8],
    max_items: u64,
) -> Result<Bound<'py, PyAny>, Refusal> {
    let limits = Limits {
        items: max_items,
        ..Limits::bytes(data.len())
    };
    let mut scan = Scan::default();
    match scan_message(data, 0, limits, &mut scan)? {
        Some(end) if end == data.len() => build(py, data, &mut 0),
        Some(_) => Err(Refusal::Malformed("extra bytes after the value".into())),
        None => Err(Refusal::Malformed("the value is cut short".into())),
    }
}

fn put_uint(out: &mut Vec<u8>, n: u64) {
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

fn put_raw(out: &mut Vec<u8>, bytes: &[u8], bin: bool) {
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

fn too_long(what: &str, len: usize) -> PyResult<()> {
    if len > u32::MAX as usize {
        return Err(PyValueError::new_err(format!(
            "{what} is {len} bytes, more than msgpack carries"
        )));
    }
    Ok(())
}

/// The params' array header: four params with a deadline, the three of the first version
/// without one (which a worker of that version reads).
fn params_header(deadline: Option<f64>) -> u8 {
    if deadline.is_some() {
        0x94
    } else {
        0x93
    }
}

/// A float64, or nil.
fn put_seconds(out: &mut Vec<u8>, seconds: Option<f64>) {
    match seconds {
        None => out.push(0xc0),
        Some(seconds) => {
            out.push(0xcb);
            out.extend_from_slice(&seconds.to_bits().to_be_bytes());
        }
    }
}

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
    too_long("the handler's name", handler.len())?;
    too_long("the payload", payload.len())?;
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
            too_long("the result", bytes.len())?;
            put_raw(&mut out, bytes, true);
        }
    }
    Ok(PyBytes::new(py, &out))
}

/// How deep [`pack_plain`] nests containers before it leaves the value to msgpack-python
/// (whose own bound is 511): results this deep are rare, and the fallback judges them.
const PLAIN_DEPTH: usize = 64;

fn put_int(out: &mut Vec<u8>, n: i64) {
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

fn put_len(out: &mut Vec<u8>, len: usize, fix: u8, fix_max: usize, sixteen: u8) {
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

/// Packs `value` as msgpack-python's `Packer(use_bin_type=True, datetime=False)` does, when
/// it is made only of None, bool, int, float, str, bytes, list, tuple and dict, each of exactly
/// that type, at most [`PLAIN_DEPTH`] containers deep; false (with `out` to be thrown away)
/// for anything else, which is left to msgpack-python: another type (a subclass included), an
/// int outside 64 bits, a str UTF-8 cannot carry, a length over 32 bits.
fn pack_plain(value: &Bound<'_, PyAny>, out: &mut Vec<u8>, depth: usize) -> bool {
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

#[cfg(test)]
mod tests {
    use super::{scan_message, Limits, Refusal, Scan, MAX_DEPTH};

    /// The end of the message at the start of `data`, scanned in reads of `step` bytes (the scan
    /// resumed after each, as the reader does), or the refusal.
    fn scan_in_steps(data: &[u8], limit: usize, step: usize) -> Result<Option<usize>, Refusal> {
        let mut scan = Scan::default();
        let mut seen = 0;
        loop {
            seen = (seen + step).min(data.len());
            if let Some(end) = scan_message(&data[..seen], 0, Limits::bytes(limit), &mut scan)? {
                return Ok(Some(end));
            }
            if seen == data.len() {
                return Ok(None);
            }
        }
    }

    fn end(data: &[u8], limit: usize, step: usize) -> Option<usize> {
        match scan_in_steps(data, limit, step) {
            Ok(end) => end,
            Err(Refusal::TooLarge) => panic!("refused as too large"),
            Err(Refusal::Malformed(what)) => panic!("refused: {what}"),
            Err(Refusal::Python(_)) => panic!("a Python error"),
        }
    }

    // [1, [2, {"k": [nil, "ab"]}], bin 300 bytes], then a nil that is the next message
    fn nested() -> Vec<u8> {
        let mut data = vec![
            0x93, 0x01, 0x92, 0x02, 0x81, 0xa1, b'k', 0x92, 0xc0, 0xa2, b'a', b'b',
        ];
        data.extend_from_slice(&[0xc5, 0x01, 0x2c]);
        data.extend_from_slice(&[7; 300]);
        data.push(0xc0);
        data
    }

    #[test]
    fn a_message_ends_at_the_same_byte_however_the_reads_split_it() {
        let data = nested();
        let whole = data.len() - 1;
        for step in [1, 2, 3, 5, 13, 64, 1000] {
            assert_eq!(
                end(&data, whole, step),
                Some(whole),
                "reads of {step} bytes"
            );
        }
        assert_eq!(
            end(&data[..whole - 1], whole, 1),
            None,
            "one byte short: unfinished"
        );
    }

    #[test]
    fn a_message_one_byte_over_the_limit_is_refused_in_reads_of_any_size() {
        let data = nested();
        let whole = data.len() - 1;
        for step in [1, 7, 1000] {
            assert!(matches!(
                scan_in_steps(&data, whole - 1, step),
                Err(Refusal::TooLarge)
            ));
        }
    }

    #[test]
    fn headers_announcing_more_than_fits_are_refused_before_their_bytes_come() {
        // an array of 2^32 - 1 items, a bin of 4 GiB, 256 items inside a pair
        for header in [
            &[0xdd, 0xff, 0xff, 0xff, 0xff][..],
            &[0xc6, 0xff, 0xff, 0xff, 0xff],
            &[0x92, 0xdc, 0x01, 0x00],
        ] {
            let mut scan = Scan::default();
            assert!(matches!(
                scan_message(header, 0, Limits::bytes(257), &mut scan),
                Err(Refusal::TooLarge)
            ));
        }
        // 256 items inside a pair fit in 261 bytes
        let mut scan = Scan::default();
        assert!(matches!(
            scan_message(&[0x92, 0xdc, 0x01, 0x00], 0, Limits::bytes(261), &mut scan),
            Ok(None)
        ));
    }

    #[test]
    fn containers_nest_at_most_max_depth_deep_empty_ones_included() {
        for innermost in [0x90, 0x80] {
            let mut deepest = vec![0x91; MAX_DEPTH - 1];
            deepest.push(innermost);
            assert_eq!(end(&deepest, deepest.len(), 1), Some(deepest.len()));
            deepest.insert(0, 0x91);
            let mut scan = Scan::default();
            assert!(matches!(
                scan_message(&deepest, 0, Limits::bytes(deepest.len()), &mut scan),
                Err(Refusal::Malformed(what)) if what.contains("deeper")
            ));
        }
    }

    #[test]
    fn extension_types_and_0xc1_are_refused_at_their_header() {
        for byte in [0xc1, 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8] {
            let mut scan = Scan::default();
            assert!(matches!(
                scan_message(&[0x91, byte], 0, Limits::bytes(100), &mut scan),
                Err(Refusal::Malformed(_))
            ));
        }
    }

    #[test]
    fn a_message_of_more_items_than_the_limit_is_refused_in_reads_of_any_size() {
        // [1, [2, {"k": [nil, "ab"]}], bin]: 10 items, each key and container counted
        let data = nested();
        let whole = data.len() - 1;
        for step in [1, 4, 1000] {
            let mut scan = Scan::default();
            let mut seen = 0;
            let mut exact = None;
            while exact.is_none() && seen < whole {
                seen = (seen + step).min(whole);
                let limits = Limits {
                    items: 10,
                    ..Limits::bytes(whole)
                };
                exact = scan_message(&data[..seen], 0, limits, &mut scan)
                    .ok()
                    .flatten();
            }
            assert_eq!(exact, Some(whole), "10 items, reads of {step} bytes");
            let mut scan = Scan::default();
            let limits = Limits {
                items: 9,
                ..Limits::bytes(whole)
            };
            assert!(matches!(
                scan_message(&data[..whole], 0, limits, &mut scan),
                Err(Refusal::Malformed(what)) if what.contains("more than 9 items")
            ));
        }
    }
}
