//! `WorkersView`: the live, read-only mapping a balancer reads of a `WorkerPool`.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};
use pyo3::{PyTraverseError, PyVisit};

use crate::pool::WorkerPool;

/// A live, read-only mapping uid → `(metadata, connection)` over a pool, in admission order.
///
/// A view captured earlier reflects every later admission, refresh and eviction. It has no
/// way to write: item assignment and deletion raise `TypeError`. It is a
/// `collections.abc.Mapping` (registered): `get`, `keys`, `values` and `items` behave as a
/// mapping's, iteration is over a snapshot of the uids taken when it starts, and a uid that
/// leaves while an iteration of `items()` or `values()` is under way raises `KeyError` there.
///
/// Implementation notes:
///     Each operation is the pool's own (`entry`, `uids`, `__contains__`, `__len__`), called
///     in Rust, so reading through the view costs what reading the pool does; it holds a
///     strong reference to the pool, so a view outlives nothing it reads.
#[pyclass(frozen, mapping, module = "shardline", name = "WorkersView")]
pub struct WorkersView {
    pool: Py<WorkerPool>,
}

impl WorkersView {
    pub(crate) fn of(pool: &Bound<'_, WorkerPool>) -> Self {
        Self {
            pool: pool.clone().unbind(),
        }
    }
}

/// `collections.abc.<name>`, looked up once per process.
fn abc_view<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
) -> PyResult<&'py Bound<'py, PyType>> {
    cell.import(py, "collections.abc", name)
}

static KEYS_VIEW: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static VALUES_VIEW: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static ITEMS_VIEW: PyOnceLock<Py<PyType>> = PyOnceLock::new();

#[pymethods]
impl WorkersView {
    fn __getitem__<'py>(&self, uid: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
        self.pool.get().entry(uid)
    }

    fn __contains__(&self, uid: &Bound<'_, PyAny>) -> bool {
        self.pool.get().__contains__(uid)
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.pool.get().uids(py)?.try_iter()?.into_any())
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.pool.get().__len__(py)
    }

    /// `(metadata, connection)` of the worker `uid`, or `default` when it is not pooled.
    #[pyo3(signature = (uid, default = None, /))]
    fn get<'py>(
        &self,
        uid: &Bound<'py, PyAny>,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match self.pool.get().entry(uid) {
            Ok(pair) => Ok(pair.into_any()),
            Err(_) => Ok(default.unwrap_or_else(|| uid.py().None().into_bound(uid.py()))),
        }
    }

    /// The uids, as a `collections.abc.KeysView` over this view.
    fn keys<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        abc_view(slf.py(), &KEYS_VIEW, "KeysView")?.call1((slf,))
    }

    /// The `(metadata, connection)` pairs, as a `collections.abc.ValuesView` over this view.
    fn values<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        abc_view(slf.py(), &VALUES_VIEW, "ValuesView")?.call1((slf,))
    }

    /// The `(uid, (metadata, connection))` items, as a `collections.abc.ItemsView`.
    fn items<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        abc_view(slf.py(), &ITEMS_VIEW, "ItemsView")?.call1((slf,))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!("WorkersView({} workers)", self.__len__(py))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.pool)
    }
}
