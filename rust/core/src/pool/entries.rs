//! The pool's entries in admission order, indexed by uid key and by the uid object's address,
//! with the rotation over them.

use std::collections::hash_map::Entry as MapEntry;
use std::sync::atomic::{AtomicUsize, Ordering};

use rustc_hash::FxHashMap;

use super::health::{Policy, WorkerHealth};
use super::load::Load;

pub struct Entry<T> {
    pub key: u128,
    /// What the pool holds of the worker (its uid object, metadata and connection in the
    /// extension), reached through the entry by `Deref`.
    pub worker: T,
    pub load: Load,
    /// Its health, once the pool's health was configured (boxed: a pool without it pays one
    /// pointer per worker).
    pub health: Option<Box<WorkerHealth>>,
    /// Whether `uid`'s address is in [`Entries::by_address`]: from the first lookup with that
    /// very object on.
    pub indexed: bool,
}

impl<T: Uid> Entry<T> {
    /// The uid object's address: its identity while the entry holds it.
    pub fn uid_address(&self) -> usize {
        self.worker.address()
    }
}

impl<T> std::ops::Deref for Entry<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.worker
    }
}

/// What an entry holds of its worker: at least the uid object, whose address is its identity
/// while the entry holds it (the entry's reference keeps the address from being reused).
pub trait Uid {
    fn address(&self) -> usize;

    /// Takes over what the worker's entry it replaces (a refresh) must keep; nothing by default.
    fn keep(&mut self, _old: &mut Self) {}
}

impl<T> std::ops::DerefMut for Entry<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.worker
    }
}

/// Entries in admission order. A removal leaves a hole that iteration skips (none when it
/// removes the last entry); holes are compacted away once they outnumber the entries, so every
/// operation is O(1) amortised.
pub struct Entries<T> {
    pub slots: Vec<Option<Entry<T>>>,
    /// uid key → slot.
    pub index: FxHashMap<u128, usize>,
    /// Address of a pooled uid object → slot, for each one a lookup was made with. Callers
    /// mostly pass back, again and again, the very object the pool handed out (`uids()`, a
    /// balancer's choice): for those, a lookup by address spares reading `uid.int` and
    /// converting it, which cost more than the rest of a membership test. An object is indexed
    /// by its first lookup, not when it is admitted: admitting and evicting a worker no one
    /// looked up then touch one hash table, not two (`benches/RESULTS.md`, "Issue 12: a record
    /// that carries its key").
    /// An address is unambiguous because the entry holds a reference to its uid
    /// object, which therefore cannot be freed and its address reused while pooled.
    pub by_address: FxHashMap<usize, usize>,
    /// Addresses put in the `AddressFilter` (`filter.rs`) since it was last rebuilt.
    pub filtered: usize,
    /// The rotation: the slot where the next [`Entries::next_in_rotation`] starts looking.
    /// Shared by every call on the pool; atomic, because it advances under the read lock.
    pub rotation: AtomicUsize,
    /// The health policy, once `configure_health` was called: every entry has its health then.
    pub policy: Option<Policy>,
}

/// How a caller names a worker, read before the lock is taken (reading `uid.int` runs Python
/// code): its uid object's address, tried first, or its key.
#[derive(Clone, Copy)]
pub enum Who {
    Address(usize),
    Key(u128),
}

impl<T: Uid> Entries<T> {
    pub fn get(&self, key: u128) -> Option<&Entry<T>> {
        self.index
            .get(&key)
            .and_then(|&slot| self.slots[slot].as_ref())
    }

    /// The pooled entry whose uid is the object at `address`, if any.
    pub fn get_by_address(&self, address: usize) -> Option<&Entry<T>> {
        self.by_address
            .get(&address)
            .and_then(|&slot| self.slots[slot].as_ref())
    }

    pub fn find(&self, who: Who) -> Option<&Entry<T>> {
        match who {
            Who::Address(address) => self.get_by_address(address),
            Who::Key(key) => self.get(key),
        }
    }

    pub fn live(&self) -> impl Iterator<Item = &Entry<T>> {
        self.slots.iter().flatten()
    }

    /// The pooled entry at position `n` of the admission order: O(1) while no removal left a
    /// hole, O(slots) otherwise.
    pub fn nth_live(&self, n: usize) -> Option<&Entry<T>> {
        if self.slots.len() == self.index.len() {
            self.slots.get(n)?.as_ref()
        } else {
            self.live().nth(n)
        }
    }

    /// The next pooled entry of the rotation that `skip` does not exclude, moving the rotation
    /// past it; None when every pooled entry is excluded (or none is pooled). Looks at each
    /// slot at most once per attempt, starting where the rotation stands.
    pub fn next_in_rotation(&self, skip: impl Fn(&Entry<T>) -> bool) -> Option<&Entry<T>> {
        let slots = self.slots.len();
        loop {
            let cursor = self.rotation.load(Ordering::Relaxed);
            let start = if cursor < slots { cursor } else { 0 };
            let (slot, entry) =
                (start..slots)
                    .chain(0..start)
                    .find_map(|slot| match &self.slots[slot] {
                        Some(entry) if !skip(entry) => Some((slot, entry)),
                        _ => None,
                    })?;
            // a concurrent caller moved the rotation meanwhile: look again from its place, so
            // two callers are never handed the same turn
            if self
                .rotation
                .compare_exchange(cursor, slot + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return Some(entry);
            }
        }
    }

    /// The pooled entries in the order `next_in_rotation` would pick them, one after another
    /// with nothing skipped, from where the rotation stands; the rotation does not move.
    pub fn rotation_order(&self) -> impl Iterator<Item = &Entry<T>> {
        let slots = self.slots.len();
        let cursor = self.rotation.load(Ordering::Relaxed);
        let start = if cursor < slots { cursor } else { 0 };
        (start..slots)
            .chain(0..start)
            .filter_map(|slot| self.slots[slot].as_ref())
    }

    /// Admits a new entry at the end, or replaces an existing one in its place; returns the
    /// entry it displaced, for the caller to drop once the lock is released.
    pub fn put(&mut self, entry: Entry<T>) -> Option<Entry<T>> {
        // one probe of the key index, whether the key is new or not
        match self.index.entry(entry.key) {
            MapEntry::Occupied(pooled) => {
                let slot = *pooled.get();
                self.replace(slot, entry)
            }
            MapEntry::Vacant(vacant) => {
                vacant.insert(self.slots.len());
                let mut entry = entry;
                if self.policy.is_some() {
                    // idle: its first dispatch marks its progress
                    entry.health = Some(Box::new(WorkerHealth::new(0)));
                }
                self.slots.push(Some(entry));
                None
            }
        }
    }

    /// Replaces an existing entry in its place and returns the displaced one; hands `entry`
    /// back as the error when the key is not pooled. Either way the caller drops the result
    /// once the lock is released.
    pub fn refresh(&mut self, entry: Entry<T>) -> Result<Option<Entry<T>>, Entry<T>> {
        match self.index.get(&entry.key) {
            Some(&slot) => Ok(self.replace(slot, entry)),
            None => Err(entry),
        }
    }

    /// Puts `entry` in `slot` (which holds an entry of the same key), carrying its load and
    /// health over.
    pub fn replace(&mut self, slot: usize, mut entry: Entry<T>) -> Option<Entry<T>> {
        if let Some(old) = &mut self.slots[slot] {
            entry.load = old.load.carry();
            entry.health = old.health.take();
            entry.worker.keep(&mut old.worker);
            if old.indexed {
                self.by_address.remove(&old.uid_address());
            }
        }
        self.slots[slot].replace(entry)
    }

    /// Indexes the pooled uid object at `address` by it, if it is the uid of the entry `key`
    /// names and not indexed yet; returns whether it was indexed now.
    pub fn index_address(&mut self, key: u128, address: usize) -> bool {
        let Some(&slot) = self.index.get(&key) else {
            return false;
        };
        match &mut self.slots[slot] {
            Some(entry) if !entry.indexed && entry.uid_address() == address => {
                entry.indexed = true;
                self.by_address.insert(address, slot);
                true
            }
            _ => false,
        }
    }

    /// Evicts the worker `who` names; returns its entry, for the caller to drop once the lock
    /// is released.
    pub fn remove(&mut self, who: Who) -> Option<Entry<T>> {
        // Each index is probed once: the one that names the worker gives up its slot, the
        // other is told the key or address the entry holds. Both always point at live slots.
        let removed = match who {
            Who::Address(address) => {
                let removed = self.slots[self.by_address.remove(&address)?].take()?;
                self.index.remove(&removed.key);
                removed
            }
            Who::Key(key) => {
                let removed = self.slots[self.index.remove(&key)?].take()?;
                if removed.indexed {
                    self.by_address.remove(&removed.uid_address());
                }
                removed
            }
        };
        // A worker admitted and soon evicted again is usually the last one: leave no hole.
        let slots = self.slots.len();
        while let Some(None) = self.slots.last() {
            self.slots.pop();
        }
        // A rotation that stood in the slots just dropped starts over: were it left where it
        // stood, which worker admitted later comes next would depend on how many holes
        // compaction had taken away since.
        let rotation = self.rotation.get_mut();
        if self.slots.len() < slots && *rotation >= self.slots.len() {
            *rotation = 0;
        }
        if self.slots.len() > 2 * self.index.len() + 8 {
            self.compact();
        }
        Some(removed)
    }

    /// Drops the holes, never an entry: compaction runs under the lock. The rotation keeps its
    /// place: it moves down by the holes before it.
    pub fn compact(&mut self) {
        let cursor = *self.rotation.get_mut();
        let before = self.slots.iter().take(cursor).flatten().count();
        *self.rotation.get_mut() = before;
        self.slots.retain(Option::is_some);
        self.index.clear();
        self.by_address.clear();
        for (slot, entry) in self.slots.iter().flatten().enumerate() {
            self.index.insert(entry.key, slot);
            if entry.indexed {
                self.by_address.insert(entry.uid_address(), slot);
            }
        }
    }
}

impl<T> Default for Entries<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            index: FxHashMap::default(),
            by_address: FxHashMap::default(),
            filtered: 0,
            rotation: AtomicUsize::new(0),
            policy: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Entries, Entry, Uid, Who};
    use crate::pool::filter::AddressFilter;
    use crate::pool::load::Load;

    /// A uid object, as far as the entries see one: its address (16-byte aligned, as objects are).
    struct Worker(usize);

    impl Worker {
        fn of(key: u128) -> Self {
            Worker(0x7f00_0000_0000 + 16 * key as usize)
        }
    }

    impl Uid for Worker {
        fn address(&self) -> usize {
            self.0
        }
    }
    #[test]
    fn the_address_filter_holds_every_indexed_address_across_rebuilds() {
        let filter = AddressFilter::new();
        let mut entries = Entries::default();
        {
            let admit = |entries: &mut Entries<Worker>, key: u128| {
                let address = Worker::of(key).0;
                entries.put(Entry {
                    key,
                    worker: Worker(address),
                    load: Load::default(),
                    health: None,
                    indexed: false,
                });
                // as its first lookup does
                assert!(entries.index_address(key, address));
                filter.note(entries, address);
            };
            // A pool that stays, then churn past several rebuilds: admit one, evict the one
            // before.
            let stays = 1000u128;
            for key in 0..stays {
                admit(&mut entries, key);
            }
            let churn = 3 * AddressFilter::rebuild_after(stays as usize + 1) as u128;
            for key in stays..stays + churn {
                admit(&mut entries, key);
                assert!(entries.filtered <= AddressFilter::rebuild_after(entries.index.len()));
                if key > stays {
                    entries.remove(Who::Key(key - 1));
                }
                if key % 4096 == 0 {
                    assert!(entries
                        .live()
                        .all(|entry| filter.may_contain(entry.uid_address())));
                }
            }
            assert!(entries
                .live()
                .all(|entry| filter.may_contain(entry.uid_address())));
        }
    }

    #[test]
    fn compaction_keeps_order_and_index() {
        let mut entries = Entries::default();
        {
            for key in 0..100u128 {
                entries.put(Entry {
                    key,
                    // distinct objects, as uids are: the second index is by address
                    worker: Worker::of(key),
                    load: Load::default(),
                    health: None,
                    indexed: false,
                });
                // looked up with every other one: only those are indexed by address
                if key % 2 == 0 {
                    let address = entries.get(key).unwrap().uid_address();
                    assert!(entries.index_address(key, address));
                    assert!(!entries.index_address(key, address));
                }
            }
            for key in (0..100u128).filter(|k| k % 3 != 0) {
                entries.remove(Who::Key(key));
            }
            let keys: Vec<u128> = entries.live().map(|entry| entry.key).collect();
            assert_eq!(keys, (0..100).filter(|k| k % 3 == 0).collect::<Vec<_>>());
            assert!(entries.slots.len() <= 2 * entries.index.len() + 8);
            assert!(keys
                .iter()
                .all(|&key| entries.get(key).map(|e| e.key) == Some(key)));
            for entry in entries.live() {
                let found = entries.get_by_address(entry.uid_address());
                let expected = (entry.key % 2 == 0).then_some(entry.key);
                assert_eq!(found.map(|e| e.key), expected);
                assert_eq!(entry.indexed, entry.key % 2 == 0);
            }
            assert_eq!(
                entries.by_address.len(),
                entries.live().filter(|entry| entry.indexed).count()
            );
        }
    }
}
