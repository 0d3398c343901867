//! A worker record that carries its pool key: the base of `shardline.WorkerMetadata`.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// The uid a record was made with and its 128-bit integer, read once when the record is made
/// so that admitting, refreshing and evicting it read neither `metadata.uid` nor `uid.int`.
///
/// `WorkerMetadata` (a frozen dataclass) derives from it. Making the base never fails: the uid
/// is its first argument, by position or as `uid`, and when there is none, or its `int` is not
/// a 128-bit integer, nothing is kept and the pool reads the record's attributes as it does
/// for a record of any other type. The dataclass's own `__init__` then checks and sets the
/// fields as for any dataclass.
///
/// Implementation notes:
///     Reading `metadata.uid` and `uid.int` and converting the int (through a shift in Python
///     under the stable ABI) were two thirds of the pool's own cost of an admit and an evict
///     (`benches/RESULTS.md`, "Issue 12: a record that carries its key"). `__new__` names
///     `WorkerMetadata`'s fields so that PyO3 matches the keywords in place: with only a
///     catch-all, it copies every keyword into a new dict (the same section); a field it does
///     not name still lands in `**kwargs` and costs only that. The record is frozen, so the kept
///     uid stays the one its `uid` field holds (only `object.__setattr__` could part them).
#[pyclass(frozen, subclass, module = "shardline", name = "KeyedRecord")]
pub struct KeyedRecord {
    kept: Option<(Py<PyAny>, u128)>,
}

impl KeyedRecord {
    /// The uid object and key kept when the record was made, if any.
    pub(crate) fn kept(&self) -> Option<&(Py<PyAny>, u128)> {
        self.kept.as_ref()
    }
}

#[pymethods]
impl KeyedRecord {
    #[new]
    #[pyo3(signature = (
        uid=None, address=None, pid=None, version=None, tags=None, extra=None, published=None,
        *args, **kwargs
    ))]
    #[allow(clippy::too_many_arguments, unused_variables)]
    fn new(
        uid: Option<&Bound<'_, PyAny>>,
        address: Option<&Bound<'_, PyAny>>,
        pid: Option<&Bound<'_, PyAny>>,
        version: Option<&Bound<'_, PyAny>>,
        tags: Option<&Bound<'_, PyAny>>,
        extra: Option<&Bound<'_, PyAny>>,
        published: Option<&Bound<'_, PyAny>>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> Self {
        let kept = uid.and_then(|uid| {
            let key = uid
                .getattr(intern!(uid.py(), "int"))
                .ok()?
                .extract::<u128>()
                .ok()?;
            Some((uid.clone().unbind(), key))
        });
        Self { kept }
    }
}
