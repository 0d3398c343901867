//! The lock-free filter of pooled uid objects' addresses.

use std::sync::atomic::{AtomicU64, Ordering};

use super::entries::Entries;

/// A lock-free hint of which addresses are pooled uid objects, read before any lock is taken.
///
/// Trying the address index costs a lock of its own, and a caller's uid is often an equal but
/// distinct object (a record decoded from discovery): that one would then pay two locks, the
/// address lookup's and the key lookup's, where it paid one before the index existed
/// (`benches/RESULTS.md`, "Issue 12: route_many and pool operations").
/// The filter (one bit per hashed address, as a Bloom
/// filter with one hash) says "surely not pooled" for most such objects, so they go straight to
/// the key. It is only ever a hint: a bit set for an address no longer pooled costs the extra
/// lock, and a bit a reader misses while the filter is rebuilt costs the key lookup; neither
/// changes an answer.
pub struct AddressFilter {
    pub words: Box<[AtomicU64]>,
}

impl AddressFilter {
    /// 2**18 bits (32 KiB): few false hits up to some thousands of workers.
    pub const BITS: u32 = 18;
    /// Rebuilt once this many more addresses were put in it than are indexed, plus as many as
    /// are indexed, so churn does not fill it; rebuilding clears every word and visits every
    /// indexed address, so it comes at most once per that many writes: O(1) per write, whatever
    /// the pool's size (with a fixed margin alone, a pool of 100,000 workers rebuilt it every
    /// 32,768 writes, 3 addresses visited per write).
    pub const REBUILD_AFTER: usize = 1 << (Self::BITS - 3);

    pub fn new() -> Self {
        let words = (0..1usize << (Self::BITS - 6))
            .map(|_| AtomicU64::new(0))
            .collect();
        Self { words }
    }

    #[inline]
    pub fn bit(address: usize) -> (usize, u64) {
        // Objects are 16-byte aligned: the low bits carry nothing. Fibonacci hashing spreads
        // the rest over the table.
        let hash = ((address >> 4) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - Self::BITS);
        ((hash >> 6) as usize, 1 << (hash & 63))
    }

    /// How many addresses may have been put in since the last rebuild, for `indexed` ones.
    pub fn rebuild_after(indexed: usize) -> usize {
        2 * indexed + Self::REBUILD_AFTER
    }

    #[inline]
    pub fn may_contain(&self, address: usize) -> bool {
        let (word, bit) = Self::bit(address);
        self.words[word].load(Ordering::Relaxed) & bit != 0
    }

    /// Only under the pool's write lock, so writers never race each other: a plain load and
    /// store, no read-modify-write.
    #[inline]
    pub fn insert(&self, address: usize) {
        let (word, bit) = Self::bit(address);
        let word = &self.words[word];
        word.store(word.load(Ordering::Relaxed) | bit, Ordering::Relaxed);
    }

    /// Records that `address` (a uid object just indexed) may be pooled, under the write lock;
    /// rebuilds the filter from the indexed addresses when stale bits add up.
    pub fn note<T>(&self, entries: &mut Entries<T>, address: usize) {
        self.insert(address);
        entries.filtered += 1;
        if entries.filtered > Self::rebuild_after(entries.by_address.len()) {
            for word in &self.words {
                word.store(0, Ordering::Relaxed);
            }
            for &address in entries.by_address.keys() {
                self.insert(address);
            }
            entries.filtered = entries.by_address.len();
        }
    }
}

impl Default for AddressFilter {
    fn default() -> Self {
        Self::new()
    }
}
