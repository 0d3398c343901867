//! The uid-keyed worker pool: uid → (metadata, connection), in admission order.

use parking_lot::RwLock;
use pyo3::exceptions::PyKeyError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use pyo3::{PyTraverseError, PyVisit};
use rustc_hash::FxHashMap;

struct Entry {
    key: u128,
    /// The worker's uid object, handed back as the mapping's key.
    uid: Py<PyAny>,
    metadata: Py<PyAny>,
    connection: Py<PyAny>,
}

/// Entries in admission order. A removal leaves a hole that iteration skips; holes are
/// compacted away once they outnumber the entries, so every operation is O(1) amortised.
#[derive(Default)]
struct Entries {
    slots: Vec<Option<Entry>>,
    index: FxHashMap<u128, usize>,
}

impl Entries {
    fn get(&self, key: u128) -> Option<&Entry> {
        self.index
            .get(&key)
            .and_then(|&slot| self.slots[slot].as_ref())
    }

    fn live(&self) -> impl Iterator<Item = &Entry> {
        self.slots.iter().flatten()
    }

    /// Admits a new entry at the end, or replaces an existing one in its place.
    fn put(&mut self, entry: Entry) {
        match self.index.get(&entry.key) {
            Some(&slot) => self.slots[slot] = Some(entry),
            None => {
                self.index.insert(entry.key, self.slots.len());
                self.slots.push(Some(entry));
            }
        }
    }

    /// Replaces an existing entry in its place; returns false when the key is not pooled.
    fn refresh(&mut self, entry: Entry) -> bool {
        match self.index.get(&entry.key) {
            Some(&slot) => {
                self.slots[slot] = Some(entry);
                true
            }
            None => false,
        }
    }

    fn remove(&mut self, key: u128) {
        if let Some(slot) = self.index.remove(&key) {
            self.slots[slot] = None;
            if self.slots.len() > 2 * self.index.len() + 8 {
                self.compact();
            }
        }
    }

    fn compact(&mut self) {
        self.slots.retain(Option::is_some);
        self.index.clear();
        for (slot, entry) in self.slots.iter().flatten().enumerate() {
            self.index.insert(entry.key, slot);
        }
    }
}

/// The pool of workers a proxy dispatches to, keyed by each worker's uid.
///
/// Each entry is the worker's current metadata and the connection to reach it; both are
/// arbitrary objects. Identity is the uid (`metadata.uid`, a `uuid.UUID`): the pool never
/// compares or hashes metadata. Writes are last-writer-wins, and a displaced connection is not
/// closed (the layer that made it owns it).
///
/// Implementation notes:
///     Keyed by the uid's 128-bit integer, read from `uid.int`, so no operation hashes a
///     `uuid.UUID` in Python. Entries keep admission order in a vector with holes, so a refresh
///     keeps its position and a removal is O(1) amortised.
#[pyclass(frozen, subclass, module = "shardline", name = "WorkerPool")]
pub struct WorkerPool {
    entries: RwLock<Entries>,
}

fn key_of(uid: &Bound<'_, PyAny>) -> PyResult<u128> {
    uid.getattr(intern!(uid.py(), "int"))?.extract()
}

fn entry_of(metadata: &Bound<'_, PyAny>, connection: &Bound<'_, PyAny>) -> PyResult<Entry> {
    let uid = metadata.getattr(intern!(metadata.py(), "uid"))?;
    Ok(Entry {
        key: key_of(&uid)?,
        uid: uid.unbind(),
        metadata: metadata.clone().unbind(),
        connection: connection.clone().unbind(),
    })
}

#[pymethods]
impl WorkerPool {
    #[new]
    fn new() -> Self {
        Self {
            entries: RwLock::new(Entries::default()),
        }
    }

    /// Admits the worker `metadata.uid`, or replaces its entry (keeping its position).
    fn add_worker(
        &self,
        metadata: &Bound<'_, PyAny>,
        connection: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let entry = entry_of(metadata, connection)?;
        self.entries.write().put(entry);
        Ok(())
    }

    /// Refreshes the entry of `metadata.uid` if it is pooled; otherwise changes nothing (a
    /// refresh never admits). Returns whether the worker was pooled.
    fn update_worker(
        &self,
        metadata: &Bound<'_, PyAny>,
        connection: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let entry = entry_of(metadata, connection)?;
        Ok(self.entries.write().refresh(entry))
    }

    /// Evicts the worker `metadata.uid`; a no-op when it is not pooled.
    fn remove_worker(&self, metadata: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = key_of(&metadata.getattr(intern!(metadata.py(), "uid"))?)?;
        self.entries.write().remove(key);
        Ok(())
    }

    /// `(metadata, connection)` of the worker `uid`; raises `KeyError` when it is not pooled.
    fn entry<'py>(&self, uid: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
        let py = uid.py();
        let key = key_of(uid).map_err(|_| PyKeyError::new_err(uid.clone().unbind()))?;
        let entries = self.entries.read();
        let entry = entries
            .get(key)
            .ok_or_else(|| PyKeyError::new_err(uid.clone().unbind()))?;
        PyTuple::new(py, [entry.metadata.bind(py), entry.connection.bind(py)])
    }

    /// The pooled uids, in admission order (a snapshot).
    fn uids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let entries = self.entries.read();
        PyList::new(py, entries.live().map(|entry| entry.uid.bind(py)))
    }

    fn __contains__(&self, uid: &Bound<'_, PyAny>) -> bool {
        key_of(uid).is_ok_and(|key| self.entries.read().get(key).is_some())
    }

    fn __len__(&self) -> usize {
        self.entries.read().index.len()
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // The collector runs with every other thread stopped; a writer holding the lock now
        // would be mid-operation, and its objects are also reachable from its own frame.
        if let Some(entries) = self.entries.try_read() {
            for entry in entries.live() {
                visit.call(&entry.uid)?;
                visit.call(&entry.metadata)?;
                visit.call(&entry.connection)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        *self.entries.write() = Entries::default();
    }
}

#[cfg(test)]
mod tests {
    use super::Entries;

    #[test]
    fn compaction_keeps_order_and_index() {
        let mut entries = Entries::default();
        pyo3::Python::initialize();
        pyo3::Python::attach(|py| {
            for key in 0..100u128 {
                entries.put(super::Entry {
                    key,
                    uid: py.None(),
                    metadata: py.None(),
                    connection: py.None(),
                });
            }
            for key in (0..100u128).filter(|k| k % 3 != 0) {
                entries.remove(key);
            }
            let keys: Vec<u128> = entries.live().map(|entry| entry.key).collect();
            assert_eq!(keys, (0..100).filter(|k| k % 3 == 0).collect::<Vec<_>>());
            assert!(entries.slots.len() <= 2 * entries.index.len() + 8);
            assert!(keys
                .iter()
                .all(|&key| entries.get(key).map(|e| e.key) == Some(key)));
        });
    }
}
