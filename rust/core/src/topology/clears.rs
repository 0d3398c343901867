//! Why a tier's bucket map was last cleared, and when: what `Topology.explain` tells an operator
//! whose key found no range.
//!
//! A clear is recorded only where a map is cleared (the replicaset rules, an overlapping bucket
//! event, `Topology.clear`), never on a lookup path. A record holds no Python object, so making
//! one, or dropping the one it supersedes, under the write lock runs no Python code; its time is
//! read before the lock, like a range's stamp.

use crate::text::quoted;
use crate::uuid;

/// What made a tier's map untrustworthy.
#[derive(Clone, Debug, PartialEq)]
pub enum ClearCause {
    /// A replicaset of the tier was deleted.
    ReplicasetDeleted { replicaset: u128 },
    /// A replicaset not known before joined the tier: it may take buckets from any other.
    ReplicasetJoined { replicaset: u128, tier: Box<str> },
    /// A known replicaset moved between tiers: both tiers' maps are cleared.
    ReplicasetMoved {
        replicaset: u128,
        from: Box<str>,
        to: Box<str>,
    },
    /// A bucket event (a replace, or a delete) overlapped a range other than an identical one.
    BucketOverlap {
        delete: bool,
        event: (u32, u32),
        overlapped: (u32, u32),
    },
    /// `Topology.clear()` forgot the whole view.
    TopologyCleared,
}

/// The causes' names as metrics label them, in the order of [`ClearCause::index`].
pub const CAUSE_NAMES: [&str; 5] = [
    "replicaset-deleted",
    "replicaset-joined",
    "replicaset-moved",
    "bucket-overlap",
    "topology-cleared",
];

impl ClearCause {
    /// The cause's index in [`CAUSE_NAMES`] (and in [`ClearHistory::clears`]).
    pub fn index(&self) -> usize {
        match self {
            ClearCause::ReplicasetDeleted { .. } => 0,
            ClearCause::ReplicasetJoined { .. } => 1,
            ClearCause::ReplicasetMoved { .. } => 2,
            ClearCause::BucketOverlap { .. } => 3,
            ClearCause::TopologyCleared => 4,
        }
    }

    /// One phrase naming the cause, for people: `replicaset <uuid> deleted`.
    pub fn describe(&self) -> String {
        match self {
            ClearCause::ReplicasetDeleted { replicaset } => {
                format!("replicaset {} deleted", uuid::format(*replicaset))
            }
            ClearCause::ReplicasetJoined { replicaset, tier } => format!(
                "replicaset {} joined tier {}",
                uuid::format(*replicaset),
                quoted(tier)
            ),
            ClearCause::ReplicasetMoved {
                replicaset,
                from,
                to,
            } => format!(
                "replicaset {} moved from tier {} to tier {}",
                uuid::format(*replicaset),
                quoted(from),
                quoted(to)
            ),
            ClearCause::BucketOverlap {
                delete,
                event,
                overlapped,
            } => format!(
                "bucket {} event [{}, {}] overlapped [{}, {}]",
                if *delete { "delete" } else { "replace" },
                event.0,
                event.1,
                overlapped.0,
                overlapped.1
            ),
            ClearCause::TopologyCleared => "Topology.clear()".to_owned(),
        }
    }
}

/// A clear about to be made: its cause and wall-clock time (unix seconds, read before the lock).
#[derive(Clone, Debug, PartialEq)]
pub struct Clear {
    pub cause: ClearCause,
    pub at: f64,
}

/// The last clear of a map, as the map keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct LastClear {
    pub cause: ClearCause,
    pub at: f64,
    /// The map's epoch right after the change that cleared it.
    pub epoch: u64,
    /// True while every change since the clear only added ranges: a bucket no range covers
    /// then has been uncovered since the clear. A removed range or a snapshot that changed the
    /// map makes it false (the hole may be theirs).
    pub filling: bool,
}

/// What a map counts over its whole life, for metrics: its clears by cause, and the time it
/// spent empty after having held ranges. Kept beside the last clear and moved only by changes
/// of the map (never by a lookup), with times read before the write lock.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClearHistory {
    /// Clears that removed ranges, by [`ClearCause::index`].
    pub clears: [u64; 5],
    /// Seconds spent empty in the periods that ended (a range arrived since).
    pub empty_seconds: f64,
    /// When the map was last left empty by a change, while it still is; `None` while it holds
    /// ranges, and before it ever held any.
    pub empty_since: Option<f64>,
}

impl ClearHistory {
    /// Records a change of the map made at `at` that left it `empty`.
    pub fn changed(&mut self, at: f64, empty: bool) {
        match (empty, self.empty_since) {
            (true, None) => self.empty_since = Some(at),
            // A wall clock set back while the map was empty counts that period as 0 s.
            (false, Some(since)) => {
                self.empty_seconds += (at - since).max(0.0);
                self.empty_since = None;
            }
            _ => {}
        }
    }

    /// Seconds spent empty up to `now`, the current period included.
    pub fn empty_seconds_until(&self, now: f64) -> f64 {
        self.empty_seconds + self.empty_since.map_or(0.0, |since| (now - since).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_reads_as_a_phrase() {
        let rs = uuid::parse("00000000-0000-0000-0000-00000000000a").unwrap();
        let cases = [
            (
                ClearCause::ReplicasetDeleted { replicaset: rs },
                "replicaset 00000000-0000-0000-0000-00000000000a deleted",
            ),
            (
                ClearCause::ReplicasetJoined {
                    replicaset: rs,
                    tier: "a".into(),
                },
                "replicaset 00000000-0000-0000-0000-00000000000a joined tier 'a'",
            ),
            (
                ClearCause::ReplicasetMoved {
                    replicaset: rs,
                    from: "a".into(),
                    to: "b".into(),
                },
                "replicaset 00000000-0000-0000-0000-00000000000a moved from tier 'a' to tier 'b'",
            ),
            (
                ClearCause::BucketOverlap {
                    delete: true,
                    event: (5, 12),
                    overlapped: (1, 10),
                },
                "bucket delete event [5, 12] overlapped [1, 10]",
            ),
            (ClearCause::TopologyCleared, "Topology.clear()"),
        ];
        for (cause, text) in cases {
            assert_eq!(cause.describe(), text);
        }
    }

    #[test]
    fn empty_time_counts_closed_periods_and_the_current_one() {
        let mut history = ClearHistory::default();
        assert_eq!(history.empty_seconds_until(100.0), 0.0);
        history.changed(10.0, false);
        history.changed(20.0, true);
        history.changed(25.0, true);
        assert_eq!(history.empty_seconds_until(26.0), 6.0);
        history.changed(30.0, false);
        assert_eq!(history.empty_seconds_until(100.0), 10.0);
        history.changed(40.0, true);
        history.changed(35.0, false);
        assert_eq!(history.empty_seconds_until(100.0), 10.0);
        assert_eq!(history.empty_since, None);
    }

    #[test]
    fn each_cause_has_its_own_index() {
        let rs = 1u128;
        let causes = [
            ClearCause::ReplicasetDeleted { replicaset: rs },
            ClearCause::ReplicasetJoined {
                replicaset: rs,
                tier: "a".into(),
            },
            ClearCause::ReplicasetMoved {
                replicaset: rs,
                from: "a".into(),
                to: "b".into(),
            },
            ClearCause::BucketOverlap {
                delete: false,
                event: (1, 2),
                overlapped: (1, 3),
            },
            ClearCause::TopologyCleared,
        ];
        let indices: Vec<usize> = causes.iter().map(ClearCause::index).collect();
        assert_eq!(indices, vec![0, 1, 2, 3, 4]);
    }
}
