//! A tier's ranges of buckets, what set each one, and a snapshot's check that they are disjoint.

use crate::Error;

/// One inclusive range of buckets and the replicaset that owns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range<O> {
    pub start: u32,
    pub end: u32,
    pub owner: O,
}

/// What kind of apply set a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetBy {
    /// One bucket event.
    Event,
    /// A snapshot given as bucket events or `_pico_bucket` rows.
    Snapshot,
    /// A snapshot given as the JSON text of `_pico_bucket(tier)` (what a poll reads).
    Poll,
}

impl SetBy {
    pub fn name(self) -> &'static str {
        match self {
            SetBy::Event => "event",
            SetBy::Snapshot => "snapshot",
            SetBy::Poll => "poll",
        }
    }
}

/// One apply that may set ranges: its kind and its wall-clock time (unix seconds), read once
/// per apply by the caller.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Setting {
    pub at: f64,
    pub by: SetBy,
}

/// When a range was last set: the map's epoch right after the change that set it, and that
/// change's [`Setting`]. A range that a later snapshot repeats identically keeps its stamp.
///
/// 24 bytes per range (8 epoch, 8 time, 1 kind, padded), beside the range's own 48.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stamp {
    pub epoch: u64,
    pub at: f64,
    pub by: SetBy,
}

/// What an upsert did to the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upsert {
    /// The identical range was already there (a redelivery).
    Unchanged,
    /// The range did not touch any existing one and was added.
    Inserted,
    /// The range overlapped others, so the map was cleared and then holds only this range.
    ClearedThenInserted,
}

/// Sorts a snapshot of `tier` by start and checks that no two of its ranges intersect.
pub fn sort_snapshot<O>(tier: &str, ranges: &mut [Range<O>]) -> Result<(), Error> {
    ranges.sort_unstable_by_key(|range| range.start);
    match ranges.windows(2).find(|pair| pair[0].end >= pair[1].start) {
        Some(pair) => Err(Error::Overlap {
            tier: tier.to_owned(),
            first: (pair[0].start, pair[0].end),
            second: (pair[1].start, pair[1].end),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_overlap_is_reported() {
        let mut ranges = vec![
            Range {
                start: 11,
                end: 20,
                owner: 'b',
            },
            Range {
                start: 1,
                end: 11,
                owner: 'a',
            },
        ];
        assert_eq!(
            sort_snapshot("a", &mut ranges),
            Err(Error::Overlap {
                tier: "a".to_owned(),
                first: (1, 11),
                second: (11, 20)
            })
        );
    }
}
