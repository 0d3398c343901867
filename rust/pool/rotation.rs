//! `PoolRotationSelect`: the built-in round-robin's `select`, over the pool's rotation in Rust.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::WorkerPool;

/// The base of `RoundRobinLoadBalancer`: its `select`, which on a `WorkerPool` (or a subclass,
/// such as `LoadBalancerContext`) is the pool's shared rotation, `next_in_rotation(tried)`.
///
/// On any other context it calls the subclass's `_select_elsewhere(task, context, tried)`,
/// which keeps a rotation of its own for that context. It declares `pool_rotation = True`
/// (the class that defines `select` declares it, see `shardline.balancers.protocol`).
///
/// Implementation notes:
///     A decision is one call from Python into Rust, with no Python frame in between: a
///     Python `select` that called `next_in_rotation` cost two calls
///     (`benches/RESULTS.md`, "Issue 12 goals, session of 2026-12-03 10:05"). The
///     class holds no state and adds nothing to an object's layout, so a subclass keeps its
///     state in its `__dict__` and pickles and copies as a plain Python object does.
#[pyclass(frozen, subclass, module = "shardline", name = "PoolRotationSelect")]
pub struct PoolRotationSelect;

#[pymethods]
impl PoolRotationSelect {
    /// Takes any arguments, as `object.__new__` does when a subclass defines `__init__`: a
    /// subclass's constructor arguments are its own.
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        Self
    }

    /// `select` is the pool's rotation on this project's pool.
    #[classattr]
    fn pool_rotation() -> bool {
        true
    }

    /// The next untried pooled worker of the rotation; None when every pooled worker is in
    /// `tried` (see `shardline.balancers.protocol`).
    #[pyo3(signature = (task, *, context, tried))]
    fn select<'py>(
        slf: &Bound<'py, Self>,
        task: &Bound<'py, PyAny>,
        context: &Bound<'py, PyAny>,
        tried: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Py<PyAny>>> {
        let py = slf.py();
        if let Ok(pool) = context.cast::<WorkerPool>() {
            return pool.get().next_in_rotation(py, Some(tried));
        }
        let uid = slf.call_method1(intern!(py, "_select_elsewhere"), (task, context, tried))?;
        Ok((!uid.is_none()).then(|| uid.unbind()))
    }
}
