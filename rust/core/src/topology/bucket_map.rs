//! One tier's map of bucket ranges to their owner, with the seed's clear-on-suspicion rules.
//!
//! Ranges are inclusive, non-overlapping and kept sorted by `start` in a `Vec`: for disjoint
//! intervals a sorted vector is an interval tree with the best constant factors, and it is what
//! the rules (overlap checks, redelivery, snapshots) work on. Lookups go through a dense
//! bucket → range table built from it on the first lookup after a change: one load instead of a
//! chain of dependent loads in a bisection. `docs/architecture.md` has the measurements.
//!
//! Each range also carries a [`Stamp`] (when and by what it was last set), kept in a vector
//! parallel to the ranges rather than inside them: lookups never read it, and `Range` stays the
//! size the lookup path was measured with. The map's last clear (its cause, time and epoch)
//! is kept beside them too, boxed, for the same reason.

use std::sync::OnceLock;

use super::clears::{Clear, ClearCause, ClearHistory, LastClear};
use super::ranges::{Range, Setting, Stamp, Upsert};

/// Largest bucket id the dense table covers (4 MiB of table); beyond it lookups bisect.
const DENSE_LIMIT: u32 = 1 << 20;

#[derive(Debug)]
pub struct BucketMap<O> {
    ranges: Vec<Range<O>>,
    /// `stamps[i]` is the stamp of `ranges[i]`; read only by [`range`](Self::range).
    stamps: Vec<Stamp>,
    epoch: u64,
    /// `slots[bucket]` is 1 + the index of the range holding `bucket`, 0 for none; `None` when
    /// the map reaches past `DENSE_LIMIT`. Reset on every change, rebuilt by the next lookup.
    dense: OnceLock<Option<Box<[u32]>>>,
    /// The last clear that removed ranges; read only by [`last_clear`](Self::last_clear).
    last_clear: Option<Box<LastClear>>,
    /// Clears by cause and time spent empty; read only by [`history`](Self::history). Boxed,
    /// like the last clear, so that the map's fields the lookups read keep their layout.
    history: Box<ClearHistory>,
}

impl<O> Default for BucketMap<O> {
    fn default() -> Self {
        Self {
            ranges: Vec::new(),
            stamps: Vec::new(),
            epoch: 0,
            dense: OnceLock::new(),
            last_clear: None,
            history: Box::default(),
        }
    }
}

fn dense_table<O>(ranges: &[Range<O>]) -> Option<Box<[u32]>> {
    let last = ranges.last().map_or(0, |range| range.end);
    if last > DENSE_LIMIT {
        return None;
    }
    let mut slots = vec![0u32; last as usize + 1];
    for (index, range) in ranges.iter().enumerate() {
        slots[range.start as usize..=range.end as usize].fill(index as u32 + 1);
    }
    Some(slots.into_boxed_slice())
}

impl<O: PartialEq> BucketMap<O> {
    /// Bumped on every change of the map's contents, never otherwise.
    #[inline]
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    #[inline]
    pub fn ranges(&self) -> &[Range<O>] {
        &self.ranges
    }

    /// The owner of `bucket`, if a range covers it.
    #[inline]
    pub fn lookup(&self, bucket: u32) -> Option<&O> {
        let slot = self.slot(bucket) as usize;
        (slot != 0).then(|| &self.ranges[slot - 1].owner)
    }

    /// The range covering `bucket`, with its stamp. Not on the lookup path: the stamps are read
    /// only here.
    pub fn range(&self, bucket: u32) -> Option<(&Range<O>, &Stamp)> {
        let index = (self.slot(bucket) as usize).checked_sub(1)?;
        Some((&self.ranges[index], &self.stamps[index]))
    }

    /// 1 + the index in [`ranges`](Self::ranges) of the range covering `bucket`, or 0 for none:
    /// a ready index into a table with one leading "none" entry (see `Topology`'s masters).
    #[inline]
    pub fn slot(&self, bucket: u32) -> u32 {
        match self.dense.get_or_init(|| dense_table(&self.ranges)) {
            Some(slots) => slots.get(bucket as usize).copied().unwrap_or(0),
            None => {
                let index = self.ranges.partition_point(|range| range.end < bucket);
                match self.ranges.get(index) {
                    Some(range) if range.start <= bucket => index as u32 + 1,
                    _ => 0,
                }
            }
        }
    }

    /// The last clear that removed ranges from this map, if any. Not on the lookup path.
    pub fn last_clear(&self) -> Option<&LastClear> {
        self.last_clear.as_deref()
    }

    /// The map's clears by cause and time spent empty. Not on the lookup path.
    pub fn history(&self) -> &ClearHistory {
        &self.history
    }

    /// Records `clear` as the change just made (after [`changed`](Self::changed)).
    fn cleared(&mut self, clear: Clear) {
        self.history.clears[clear.cause.index()] += 1;
        self.last_clear = Some(Box::new(LastClear {
            cause: clear.cause,
            at: clear.at,
            epoch: self.epoch,
            filling: true,
        }));
    }

    /// A change that may have left a hole the last clear did not (a removal, a snapshot).
    fn holed(&mut self) {
        if let Some(last) = &mut self.last_clear {
            last.filling = false;
        }
    }

    /// [`slot`](Self::slot) of each bucket, in place: the table is fetched once for the batch
    /// (`route_many`), not once per bucket.
    pub fn slots_in_place(&self, buckets: &mut [u32]) {
        match self.dense.get_or_init(|| dense_table(&self.ranges)) {
            Some(slots) => {
                for bucket in buckets {
                    *bucket = slots.get(*bucket as usize).copied().unwrap_or(0);
                }
            }
            None => {
                for bucket in buckets {
                    *bucket = self.slot(*bucket);
                }
            }
        }
    }

    /// The stamp of a range set by the change being made now (before [`changed`](Self::changed)).
    fn stamp(&self, setting: Setting) -> Stamp {
        Stamp {
            epoch: self.epoch + 1,
            at: setting.at,
            by: setting.by,
        }
    }

    /// Records a change of the contents made at `at` (unix seconds, read before the lock).
    fn changed(&mut self, at: f64) {
        self.epoch += 1;
        self.dense = OnceLock::new();
        self.history.changed(at, self.ranges.is_empty());
    }

    /// Forgets every range (the map can no longer be trusted), moving them to `displaced`, and
    /// records `clear` as the last clear; an empty map stays as it is, its last clear too.
    /// O(ranges in this map).
    pub fn clear(&mut self, clear: &Clear, displaced: &mut Vec<Range<O>>) {
        if !self.ranges.is_empty() {
            displaced.append(&mut self.ranges);
            self.stamps.clear();
            self.changed(clear.at);
            self.cleared(clear.clone());
        }
    }

    /// Indices of the ranges that intersect `[start, end]`.
    fn overlapping(&self, start: u32, end: u32) -> std::ops::Range<usize> {
        let first = self.ranges.partition_point(|range| range.end < start);
        let past = first + self.ranges[first..].partition_point(|range| range.start <= end);
        first..past
    }

    /// Applies one bucket event: an overlap with anything but an identical range clears the map
    /// first (recorded as the last clear, at `setting`'s time), then `[start, end] → owner` is
    /// inserted, stamped with `setting`. Bounds are the caller's to validate. The ranges the map lets go of (and the given one, if it was already
    /// there: a redelivery keeps its stamp) are moved to `displaced`.
    pub fn upsert(
        &mut self,
        start: u32,
        end: u32,
        owner: O,
        setting: Setting,
        displaced: &mut Vec<Range<O>>,
    ) -> Upsert {
        let hits = self.overlapping(start, end);
        if hits.len() == 1 {
            let existing = &self.ranges[hits.start];
            if existing.start == start && existing.end == end && existing.owner == owner {
                displaced.push(Range { start, end, owner });
                return Upsert::Unchanged;
            }
        }
        let stamp = self.stamp(setting);
        if hits.is_empty() {
            self.ranges.insert(hits.start, Range { start, end, owner });
            self.stamps.insert(hits.start, stamp);
            self.changed(setting.at);
            return Upsert::Inserted;
        }
        let first = &self.ranges[hits.start];
        let cause = ClearCause::BucketOverlap {
            delete: false,
            event: (start, end),
            overlapped: (first.start, first.end),
        };
        displaced.append(&mut self.ranges);
        self.ranges.push(Range { start, end, owner });
        self.stamps.clear();
        self.stamps.push(stamp);
        self.changed(setting.at);
        self.cleared(Clear {
            cause,
            at: setting.at,
        });
        Upsert::ClearedThenInserted
    }

    /// Applies a bucket delete event: the identical range is removed; a partial overlap means the
    /// map no longer matches the cluster, so it is cleared (recorded as the last clear, at time
    /// `at`); no overlap changes nothing. The ranges removed are moved to `displaced`.
    pub fn remove(
        &mut self,
        start: u32,
        end: u32,
        owner: &O,
        at: f64,
        displaced: &mut Vec<Range<O>>,
    ) {
        let hits = self.overlapping(start, end);
        if hits.is_empty() {
            return;
        }
        let existing = &self.ranges[hits.start];
        if hits.len() == 1
            && existing.start == start
            && existing.end == end
            && existing.owner == *owner
        {
            displaced.push(self.ranges.remove(hits.start));
            self.stamps.remove(hits.start);
            self.changed(at);
            self.holed();
        } else {
            let clear = Clear {
                cause: ClearCause::BucketOverlap {
                    delete: true,
                    event: (start, end),
                    overlapped: (existing.start, existing.end),
                },
                at,
            };
            self.clear(&clear, displaced);
        }
    }

    /// Makes the map exactly `snapshot` (sorted and disjoint: see
    /// [`sort_snapshot`](super::ranges::sort_snapshot)).
    /// Returns whether anything changed; an identical snapshot leaves the epoch alone. A range
    /// the map already held identically (same bounds, same owner) keeps its stamp; the others
    /// are stamped with `setting`. The ranges replaced (or the snapshot itself, if identical)
    /// are moved to `displaced`. O(old ranges + new ranges).
    pub fn replace_all(
        &mut self,
        mut snapshot: Vec<Range<O>>,
        setting: Setting,
        displaced: &mut Vec<Range<O>>,
    ) -> bool {
        if self.ranges == snapshot {
            displaced.append(&mut snapshot);
            return false;
        }
        // Both are sorted by start and disjoint: one walk pairs each new range with the old
        // range of the same start, if any.
        let fresh = self.stamp(setting);
        let mut old = 0;
        let stamps = snapshot
            .iter()
            .map(|range| {
                while self
                    .ranges
                    .get(old)
                    .is_some_and(|kept| kept.start < range.start)
                {
                    old += 1;
                }
                match self.ranges.get(old) {
                    Some(kept) if kept == range => self.stamps[old],
                    _ => fresh,
                }
            })
            .collect();
        self.stamps = stamps;
        displaced.append(&mut std::mem::replace(&mut self.ranges, snapshot));
        self.changed(setting.at);
        self.holed();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::ranges::SetBy;

    const EVENT: Setting = Setting {
        at: 10.0,
        by: SetBy::Event,
    };
    const POLL: Setting = Setting {
        at: 20.0,
        by: SetBy::Poll,
    };
    const CLEARED: Clear = Clear {
        cause: ClearCause::TopologyCleared,
        at: 40.0,
    };

    fn ranges(ranges: &[(u32, u32, char)]) -> Vec<Range<char>> {
        ranges
            .iter()
            .map(|&(start, end, owner)| Range { start, end, owner })
            .collect()
    }

    /// Each range's stamp as (start, epoch, kind), read through `range`.
    fn stamps(map: &BucketMap<char>) -> Vec<(u32, u64, SetBy)> {
        map.ranges()
            .iter()
            .map(|r| {
                let (found, stamp) = map.range(r.start).unwrap();
                assert_eq!(found, r);
                (r.start, stamp.epoch, stamp.by)
            })
            .collect()
    }

    fn map(ranges: &[(u32, u32, char)]) -> BucketMap<char> {
        let mut map = BucketMap::default();
        for &(start, end, owner) in ranges {
            map.upsert(start, end, owner, EVENT, &mut Vec::new());
        }
        map
    }

    fn contents(map: &BucketMap<char>) -> Vec<(u32, u32, char)> {
        map.ranges()
            .iter()
            .map(|r| (r.start, r.end, r.owner))
            .collect()
    }

    #[test]
    fn lookup_finds_covering_range_only() {
        let map = map(&[(1, 10, 'a'), (21, 30, 'b')]);
        assert_eq!(map.lookup(1), Some(&'a'));
        assert_eq!(map.lookup(10), Some(&'a'));
        assert_eq!(map.lookup(15), None);
        assert_eq!(map.lookup(21), Some(&'b'));
        assert_eq!(map.lookup(31), None);
        assert_eq!(map.lookup(0), None);
    }

    #[test]
    fn lookup_bisects_past_the_dense_limit() {
        let mut map = map(&[(1, 10, 'a')]);
        map.upsert(DENSE_LIMIT, DENSE_LIMIT + 5, 'b', EVENT, &mut Vec::new());
        assert_eq!(map.lookup(5), Some(&'a'));
        assert_eq!(map.lookup(11), None);
        assert_eq!(map.lookup(DENSE_LIMIT + 5), Some(&'b'));
        assert_eq!(map.lookup(DENSE_LIMIT + 6), None);
    }

    #[test]
    fn lookup_follows_changes_after_the_table_was_built() {
        let mut map = map(&[(1, 10, 'a')]);
        assert_eq!(map.lookup(5), Some(&'a'));
        map.upsert(11, 20, 'b', EVENT, &mut Vec::new());
        assert_eq!(map.lookup(15), Some(&'b'));
        map.upsert(5, 12, 'c', EVENT, &mut Vec::new());
        assert_eq!(map.lookup(15), None);
        assert_eq!(map.lookup(5), Some(&'c'));
        map.clear(&CLEARED, &mut Vec::new());
        assert_eq!(map.lookup(5), None);
    }

    #[test]
    fn redelivery_is_a_no_op() {
        let mut map = map(&[(1, 10, 'a')]);
        let epoch = map.epoch();
        assert_eq!(
            map.upsert(1, 10, 'a', EVENT, &mut Vec::new()),
            Upsert::Unchanged
        );
        assert_eq!(map.epoch(), epoch);
    }

    #[test]
    fn same_bounds_other_owner_clears() {
        let mut map = map(&[(1, 10, 'a'), (11, 20, 'b')]);
        assert_eq!(
            map.upsert(1, 10, 'c', EVENT, &mut Vec::new()),
            Upsert::ClearedThenInserted
        );
        assert_eq!(contents(&map), vec![(1, 10, 'c')]);
    }

    #[test]
    fn overlap_clears_then_inserts() {
        let mut map = map(&[(1, 1000, 'a'), (1001, 2000, 'b'), (2001, 3000, 'c')]);
        assert_eq!(
            map.upsert(1, 750, 'a', EVENT, &mut Vec::new()),
            Upsert::ClearedThenInserted
        );
        assert_eq!(
            map.upsert(751, 1500, 'b', EVENT, &mut Vec::new()),
            Upsert::Inserted
        );
        assert_eq!(
            map.upsert(1501, 3000, 'c', EVENT, &mut Vec::new()),
            Upsert::Inserted
        );
        assert_eq!(
            contents(&map),
            vec![(1, 750, 'a'), (751, 1500, 'b'), (1501, 3000, 'c')]
        );
    }

    #[test]
    fn insert_keeps_order() {
        let map = map(&[(21, 30, 'c'), (1, 10, 'a'), (11, 20, 'b')]);
        assert_eq!(
            contents(&map),
            vec![(1, 10, 'a'), (11, 20, 'b'), (21, 30, 'c')]
        );
    }

    #[test]
    fn remove_identical_partial_and_disjoint() {
        let mut m = map(&[(1, 10, 'a'), (11, 20, 'b')]);
        m.remove(30, 40, &'a', 30.0, &mut Vec::new());
        assert_eq!(contents(&m).len(), 2);
        m.remove(1, 10, &'a', 30.0, &mut Vec::new());
        assert_eq!(contents(&m), vec![(11, 20, 'b')]);
        m.remove(15, 25, &'b', 30.0, &mut Vec::new());
        assert!(contents(&m).is_empty());
    }

    #[test]
    fn epoch_moves_only_on_change() {
        let mut map: BucketMap<char> = BucketMap::default();
        map.clear(&CLEARED, &mut Vec::new());
        assert_eq!(map.epoch(), 0);
        map.upsert(1, 5, 'a', EVENT, &mut Vec::new());
        assert_eq!(map.epoch(), 1);
        assert!(!map.replace_all(
            vec![Range {
                start: 1,
                end: 5,
                owner: 'a'
            }],
            POLL,
            &mut Vec::new()
        ));
        assert_eq!(map.epoch(), 1);
        map.clear(&CLEARED, &mut Vec::new());
        assert_eq!(map.epoch(), 2);
    }

    #[test]
    fn what_the_map_lets_go_of_is_handed_back() {
        let mut m = map(&[(1, 10, 'a'), (11, 20, 'b')]);
        let mut displaced = Vec::new();
        m.upsert(1, 10, 'a', EVENT, &mut displaced);
        assert_eq!(displaced.len(), 1, "the redelivered owner");
        m.remove(11, 20, &'b', 30.0, &mut displaced);
        m.upsert(5, 12, 'c', EVENT, &mut displaced);
        let snapshot = vec![Range {
            start: 1,
            end: 3,
            owner: 'd',
        }];
        m.replace_all(snapshot.clone(), EVENT, &mut displaced);
        m.replace_all(snapshot, EVENT, &mut displaced);
        m.clear(&CLEARED, &mut displaced);
        let owners: String = displaced.iter().map(|r| r.owner).collect();
        assert_eq!(owners, "abacdd");
    }

    #[test]
    fn a_stamp_is_24_bytes() {
        assert_eq!(std::mem::size_of::<Stamp>(), 24);
    }

    #[test]
    fn events_stamp_what_they_set_and_nothing_else() {
        let mut m = map(&[(1, 10, 'a'), (11, 20, 'b')]);
        assert_eq!(
            stamps(&m),
            vec![(1, 1, SetBy::Event), (11, 2, SetBy::Event)]
        );
        m.upsert(11, 20, 'b', POLL, &mut Vec::new());
        assert_eq!(
            stamps(&m)[1],
            (11, 2, SetBy::Event),
            "a redelivery is not a set"
        );
        m.upsert(21, 30, 'c', EVENT, &mut Vec::new());
        m.remove(1, 10, &'a', 30.0, &mut Vec::new());
        assert_eq!(
            stamps(&m),
            vec![(11, 2, SetBy::Event), (21, 3, SetBy::Event)]
        );
        m.upsert(15, 25, 'd', EVENT, &mut Vec::new());
        assert_eq!(stamps(&m), vec![(15, 5, SetBy::Event)]);
        assert!(m.range(11).is_none());
        m.clear(&CLEARED, &mut Vec::new());
        assert!(m.range(15).is_none());
    }

    #[test]
    fn a_snapshot_keeps_the_stamps_of_the_ranges_it_repeats() {
        let mut m = map(&[(1, 10, 'a'), (11, 20, 'b'), (21, 30, 'c')]);
        let snapshot = ranges(&[(1, 10, 'a'), (11, 15, 'b'), (16, 20, 'b'), (21, 30, 'd')]);
        assert!(m.replace_all(snapshot.clone(), POLL, &mut Vec::new()));
        let fresh = (4, SetBy::Poll);
        assert_eq!(
            stamps(&m),
            vec![
                (1, 1, SetBy::Event),
                (11, fresh.0, fresh.1),
                (16, fresh.0, fresh.1),
                (21, fresh.0, fresh.1)
            ]
        );
        assert_eq!(m.range(5).unwrap().1.at, 10.0);
        assert_eq!(m.range(25).unwrap().1.at, 20.0);
        let before = stamps(&m);
        assert!(!m.replace_all(snapshot, EVENT, &mut Vec::new()));
        assert_eq!(stamps(&m), before, "an identical snapshot changes nothing");
        assert!(m.replace_all(ranges(&[(16, 20, 'b')]), EVENT, &mut Vec::new()));
        assert_eq!(stamps(&m), vec![(16, 4, SetBy::Poll)]);
    }

    /// The last clear as (cause, time, epoch, filling).
    fn last(map: &BucketMap<char>) -> Option<(ClearCause, f64, u64, bool)> {
        map.last_clear()
            .map(|last| (last.cause.clone(), last.at, last.epoch, last.filling))
    }

    #[test]
    fn each_clear_records_its_cause_time_and_epoch() {
        let mut m = map(&[(1, 10, 'a'), (11, 20, 'b')]);
        assert_eq!(last(&m), None, "inserting clears nothing");
        m.clear(&CLEARED, &mut Vec::new());
        assert_eq!(last(&m), Some((ClearCause::TopologyCleared, 40.0, 3, true)));
        let before = last(&m);
        m.clear(&CLEARED, &mut Vec::new());
        assert_eq!(last(&m), before, "clearing an empty map records nothing");
        m.upsert(1, 10, 'a', EVENT, &mut Vec::new());
        assert!(last(&m).unwrap().3, "an insert leaves the map filling");
        m.upsert(5, 12, 'c', POLL, &mut Vec::new());
        let overlap = ClearCause::BucketOverlap {
            delete: false,
            event: (5, 12),
            overlapped: (1, 10),
        };
        assert_eq!(last(&m), Some((overlap, 20.0, 5, true)));
        m.remove(5, 12, &'c', 30.0, &mut Vec::new());
        assert!(
            !last(&m).unwrap().3,
            "a removal may leave a hole of its own"
        );
        m.upsert(1, 10, 'a', EVENT, &mut Vec::new());
        m.remove(3, 4, &'a', 30.0, &mut Vec::new());
        let partial = ClearCause::BucketOverlap {
            delete: true,
            event: (3, 4),
            overlapped: (1, 10),
        };
        assert_eq!(last(&m), Some((partial, 30.0, 8, true)));
        assert!(m.replace_all(ranges(&[(1, 2, 'a')]), POLL, &mut Vec::new()));
        assert!(!last(&m).unwrap().3, "a snapshot is the cluster's own word");
    }
}
