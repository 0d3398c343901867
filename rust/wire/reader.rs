//! `MsgpackReader`: a stream's messages read as they complete, whatever the split of its reads.

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyType};
use shardline_core::wire::scan::{scan_message, Limits, Scan};

use super::decode::{answer, build, dispatch};
use crate::py::errors::{raise, raise_in_stream, Error, Failure};

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
    /// Messages read so far (whether it is the first decides the fast readers).
    read: u64,
    /// Bytes fed so far.
    fed: u64,
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
/// bin). `progress` is `(fed, read, unfinished)`: the bytes fed and the messages read so far,
/// and the bytes held of a message not finished yet.
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
    fn refusal(&self, py: Python<'_>, failure: Failure) -> PyErr {
        match failure {
            Failure::Refused(error) => raise_in_stream(
                py,
                error,
                self.malformed.bind(py),
                self.too_large.bind(py),
                self.limits.bytes,
            ),
            Failure::Raised(error) => error,
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
    ) -> Result<Pending, Failure> {
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
    ) -> Result<Option<usize>, Failure> {
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
            let Some(end) = scan_message(bytes, start, self.limits, &mut pending.scan)
                .map_err(Failure::Refused)?
            else {
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
        py: Python<'_>,
        max_frame_bytes: usize,
        fast: Option<&str>,
        malformed: Py<PyType>,
        too_large: Py<PyType>,
        max_items: Option<u64>,
        max_inner_items: Option<u64>,
    ) -> PyResult<Self> {
        if max_frame_bytes == 0 {
            return Err(raise(
                py,
                Error::Value("max_frame_bytes must be positive, got 0".into()),
            ));
        }
        if max_items == Some(0) || max_inner_items == Some(0) {
            return Err(raise(
                py,
                Error::Value("an item limit must be positive, got 0".into()),
            ));
        }
        let fast = match fast {
            None => Fast::None,
            Some("requests") => Fast::Requests,
            Some("answers") => Fast::Answers,
            Some(other) => {
                return Err(raise(
                    py,
                    Error::Value(format!(
                        "fast is None, 'requests' or 'answers', not {other:?}"
                    )),
                ))
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

    /// `(fed, read, unfinished)`: the bytes fed and the messages read so far, and the bytes
    /// held of a message not finished yet (0 when the last read ended between messages). A
    /// worker's timeouts compare them from one sweep to the next, so a read stamps nothing.
    #[getter]
    fn progress(&self) -> (u64, u64, usize) {
        let pending = self.pending.lock();
        (pending.fed, pending.read, pending.tail.len())
    }

    fn feed<'py>(&self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
        let pending = {
            let mut guard = self.pending.lock();
            if guard.refused {
                drop(guard);
                let again = Error::Malformed("the stream was refused already".into());
                return Err(self.refusal(py, again.into()));
            }
            if guard.busy {
                drop(guard);
                return Err(raise(py, Error::FedConcurrently));
            }
            let mut pending = std::mem::take(&mut *guard);
            guard.busy = true;
            pending.fed += data.len() as u64;
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
