//! Why a tier's bucket map was last cleared, and when: what `Topology.explain` tells an operator
//! whose key found no range.
//!
//! A clear is recorded only where a map is cleared (the replicaset rules, an overlapping bucket
//! event, `Topology.clear`), never on a lookup path. A record holds no Python object, so making
//! one, or dropping the one it supersedes, under the write lock runs no Python code; its time is
//! read before the lock, like a range's stamp.

use crate::errors::quoted;
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

impl ClearCause {
    /// One phrase naming the cause, for people: "replicaset <uuid> deleted".
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
}
