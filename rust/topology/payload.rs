//! `BucketPayload`: a poll's JSON text (what `SELECT _pico_bucket(tier)` returns), read once
//! into the tier's ranges by the core's streaming reader (`shardline_core::topology::payload`,
//! where the rules and messages are), ready for any number of topologies to apply.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use rustc_hash::FxHashMap;
use shardline_core::topology::payload::{check_size, read_ranges, RawRange};
use shardline_core::topology::ranges::Range;
use shardline_core::uuid;

use super::events::Owner;
use crate::py::errors::{quoted, raise, Error, OrRaise};

/// Texts longer than this are parsed with the GIL released: long enough that other threads
/// (routing calls) would notice the wait, short enough that most polls skip the hand-over.
const DETACH_ABOVE: usize = 256 << 10;

/// The ranges of the poll `payload` (str or bytes) of `tier`, validated whole (see the module
/// documentation), sorted by start; `bucket_count`, if given, bounds them. Raises `InvalidEvent`.
pub fn parse(
    tier: &str,
    payload: &Bound<'_, PyAny>,
    bucket_count: Option<u32>,
) -> PyResult<Vec<Range<Owner>>> {
    let py = payload.py();
    let invalid = |message: String| raise(py, Error::InvalidEvent(message));
    let text: &[u8] = if let Ok(text) = payload.cast::<PyString>() {
        // The limit counts characters, as Python's len() does.
        check_size(tier, text.len()?).or_raise(py)?;
        // A str holding a lone surrogate has no UTF-8 form: it cannot be JSON either.
        text.to_str()
            .map_err(|_| {
                invalid(format!(
                    "bucket payload of tier {} is not valid JSON: it holds a lone surrogate",
                    quoted(tier)
                ))
            })?
            .as_bytes()
    } else if let Ok(bytes) = payload.cast::<PyBytes>() {
        // json.loads accepts UTF-8 bytes that start with a byte order mark
        let bytes = bytes.as_bytes();
        check_size(tier, bytes.len()).or_raise(py)?;
        bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes)
    } else {
        return Err(invalid(format!(
            "bucket payload of tier {} must be str or bytes, got {}",
            quoted(tier),
            payload.get_type().name()?
        )));
    };
    let raw = if text.len() > DETACH_ABOVE {
        py.detach(|| read_ranges(tier, text, bucket_count))
    } else {
        read_ranges(tier, text, bucket_count)
    }
    .or_raise(py)?;
    Ok(with_names(py, raw))
}

/// The ranges with their owners' canonical texts, one Python string per replicaset.
fn with_names(py: Python<'_>, raw: Vec<RawRange>) -> Vec<Range<Owner>> {
    let mut names: FxHashMap<u128, Py<PyString>> = FxHashMap::default();
    raw.into_iter()
        .map(|range| {
            let name = names
                .entry(range.owner)
                .or_insert_with(|| PyString::new(py, &uuid::format(range.owner)).unbind());
            Range {
                start: range.start,
                end: range.end,
                owner: Owner {
                    uuid: range.owner,
                    name: name.clone_ref(py),
                },
            }
        })
        .collect()
}

/// One tier's poll text, decoded and validated once, ready to apply.
///
/// `BucketPayload(tier, text, bucket_count=None)` reads `text`, the JSON text (str or bytes)
/// `SELECT _pico_bucket(tier)` returns, and raises `InvalidEvent` where
/// `Topology.apply_bucket_snapshot(tier, text)` would: a text that is not strict JSON, not an
/// array, longer than 64 MiB, nested 128 levels deep or more, or whose rows are malformed, name
/// another tier, overlap, or (with `bucket_count`) reach past the tier's bucket count.
/// `Topology.apply_bucket_snapshot(tier, payload)` then applies it without reading the text
/// again, and recognises it as unchanged when its text is the one last applied to the tier.
#[pyclass(frozen, module = "shardline.topology.sources", name = "BucketPayload")]
pub struct BucketPayload {
    tier: Py<PyString>,
    text: Py<PyAny>,
    ranges: Box<[Range<Owner>]>,
}

impl BucketPayload {
    pub fn tier_name(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.tier.bind(py).to_str()?.to_owned())
    }

    pub fn text<'py>(&self, py: Python<'py>) -> &Bound<'py, PyAny> {
        self.text.bind(py)
    }

    /// A copy of the ranges, for a topology to own.
    pub fn ranges(&self, py: Python<'_>) -> Vec<Range<Owner>> {
        self.ranges
            .iter()
            .map(|range| Range {
                start: range.start,
                end: range.end,
                owner: range.owner.clone_ref(py),
            })
            .collect()
    }
}

#[pymethods]
impl BucketPayload {
    #[new]
    #[pyo3(signature = (tier, text, bucket_count = None))]
    fn new(
        tier: &Bound<'_, PyString>,
        text: &Bound<'_, PyAny>,
        bucket_count: Option<u32>,
    ) -> PyResult<Self> {
        let py = tier.py();
        let name = tier.to_str().map_err(|_| {
            raise(
                py,
                Error::InvalidEvent(format!(
                    "field 'tier' must be valid unicode, got {}",
                    tier.repr()
                        .map_or_else(|_| "?".to_owned(), |r| r.to_string())
                )),
            )
        })?;
        if name.is_empty() {
            return Err(raise(
                py,
                Error::InvalidEvent("field 'tier' must not be empty".to_owned()),
            ));
        }
        let ranges = parse(name, text, bucket_count)?;
        Ok(Self {
            tier: tier.clone().unbind(),
            text: text.clone().unbind(),
            ranges: ranges.into_boxed_slice(),
        })
    }

    /// The tier the text was read for.
    #[getter]
    fn tier(&self, py: Python<'_>) -> Py<PyString> {
        self.tier.clone_ref(py)
    }

    /// The text, as given.
    #[getter(text)]
    fn text_of(&self, py: Python<'_>) -> Py<PyAny> {
        self.text.clone_ref(py)
    }

    /// The number of ranges.
    fn __len__(&self) -> usize {
        self.ranges.len()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "<BucketPayload of tier {}: {} ranges>",
            self.tier.bind(py),
            self.ranges.len()
        )
    }
}
