//! `WorkersView`: the live, read-only mapping a balancer reads of a `WorkerPool`.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyTuple, PyType};
use pyo3::{PyTraverseError, PyVisit};

use super::WorkerPool;

/// A live, read-only mapping uid → `(metadata, connection)` over a pool's visible workers (an
/// ejected worker is not in it; see `WorkerPool`), in admission order.
///
/// A view captured earlier reflects every later admission, refresh, eviction, ejection and
/// re-admission. It has no
/// way to write: item assignment and deletion raise `TypeError`. It is a
/// `collections.abc.Mapping` (registered): `get`, `keys`, `values` and `items` behave as a
/// mapping's. `keys()`, `values()` and `items()` are a `KeysView`, `ValuesView` and
/// `ItemsView` over this view, live for `len` and `in`; every iteration (of the view or of one
/// of them) is over one consistent snapshot of the pool taken when it starts, so a worker that
/// leaves, is refreshed or joins while it runs changes nothing it yields.
///
/// Implementation notes:
///     Each operation is the pool's own (`entry`, `uids`, `contains_visible`, `visible_len`,
///     the snapshots), called in Rust, so reading through the view costs what reading the pool
///     does; it holds a strong reference to the pool, so a view outlives nothing it reads.
///     The values and items views are the subclasses in `shardline/_workers_views.py`, whose
///     iteration reads `_values_snapshot` / `_items_snapshot` (a `collections.abc` view would
///     look each uid up again, and fail for one evicted since the uids were read).
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

/// The view class `module.name`, looked up once per process.
fn view_class<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    module: &str,
    name: &str,
) -> PyResult<&'py Bound<'py, PyType>> {
    cell.import(py, module, name)
}

static KEYS_VIEW: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static VALUES_VIEW: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static ITEMS_VIEW: PyOnceLock<Py<PyType>> = PyOnceLock::new();
/// Where the values and items views are defined (a module beside `errors`, importing only the
/// core).
const WORKERS_VIEWS: &str = "shardline._workers_views";

#[pymethods]
impl WorkersView {
    fn __getitem__<'py>(&self, uid: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
        self.pool.get().entry(uid)
    }

    fn __contains__(&self, uid: &Bound<'_, PyAny>) -> bool {
        self.pool.get().contains_visible(uid)
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.pool.get().uids(py)?.try_iter()?.into_any())
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.pool.get().visible_len(py)
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
        view_class(slf.py(), &KEYS_VIEW, "collections.abc", "KeysView")?.call1((slf,))
    }

    /// The `(metadata, connection)` pairs, as a `collections.abc.ValuesView` over this view
    /// whose every iteration is over one snapshot of the pool.
    fn values<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        view_class(slf.py(), &VALUES_VIEW, WORKERS_VIEWS, "WorkersValuesView")?.call1((slf,))
    }

    /// The `(uid, (metadata, connection))` items, as a `collections.abc.ItemsView` over this
    /// view whose every iteration is over one snapshot of the pool.
    fn items<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        view_class(slf.py(), &ITEMS_VIEW, WORKERS_VIEWS, "WorkersItemsView")?.call1((slf,))
    }

    /// The `(metadata, connection)` pairs of the pooled workers, in admission order, read in
    /// one step (what `values()` iterates).
    fn _values_snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.pool.get().values_snapshot(py)
    }

    /// The `(uid, (metadata, connection))` items of the pooled workers, in admission order,
    /// read in one step (what `items()` iterates).
    fn _items_snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.pool.get().items_snapshot(py)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!("WorkersView({} workers)", self.__len__(py))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.pool)
    }
}
