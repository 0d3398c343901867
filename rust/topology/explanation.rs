//! `RouteExplanation`: why `Topology.route` answers what it answers for one key
//! (`Topology.explain`).
//!
//! The topology copies what it holds for the key under its read lock into a [`Found`] (plain
//! values and references taken with `clone_ref`, which runs no Python code); everything here
//! runs after the lock is released, so it may allocate Python objects freely.

use pyo3::prelude::*;

use super::bucket_range::BucketRange;
use super::instance::{repr_option, Instance};
use super::replicaset::Replicaset;
use crate::py::errors::quoted;
use shardline_core::topology::clears::LastClear;
use shardline_core::topology::ranges::Stamp;
use shardline_core::uuid;

/// What the topology held for one bucket of a tier, copied under the read lock.
pub struct Found {
    pub bucket: u32,
    /// The tier's map epoch.
    pub epoch: u64,
    /// How many ranges the tier's map holds.
    pub ranges: usize,
    /// The range holding the bucket: start, end, owning replicaset, stamp.
    pub range: Option<(u32, u32, u128, Stamp)>,
    /// The owning replicaset, if known, and the uuid of its current master, if it has one.
    pub replicaset: Option<(Py<Replicaset>, Option<u128>)>,
    /// The master's `Instance`, if the master is a known instance.
    pub master: Option<Py<Instance>>,
    /// What `route` answers for the bucket: read from the same table `route` reads.
    pub routed: Option<Py<Instance>>,
    pub last_clear: Option<LastClear>,
}

/// Why `Topology.route(tier, key)` answers what it answers, from one consistent view.
///
/// `bucket` is the key's bucket and `range` the range holding it (with what last set it: see
/// `BucketRange`), `replicaset_uuid` / `replicaset` its owner, `master_uuid` the owner's current
/// master and `master` that master's `Instance` (with `master_address` and `master_state`
/// copied from it), `epoch` the tier's map epoch. `routed` is what `route` returns for the key
/// on this view: the master whatever its state (route does not look at the state), or None.
///
/// `reason` is None when `routed` is an instance, else why not, one of: `"map-cleared"` (no
/// range covers the bucket, and none has come since the map was last cleared), `"no-range"`
/// (no range covers the bucket for another reason: never mapped, removed by a delete event or
/// absent from the last snapshot), `"replicaset-unknown"` (the range's owner is not a known
/// replicaset), `"master-unknown"` (the replicaset has no current master, or its master is not
/// a known instance). `detail` is one sentence for people, naming the range, the owner and the
/// master, or the cause and time of the clear. `cleared_by`, `cleared_at` (unix seconds) and
/// `cleared_epoch` describe the tier's last clear that removed ranges, whatever the outcome,
/// or are None if its map was never cleared. `str()` gives one line for a ticket.
#[pyclass(frozen, module = "shardline", name = "RouteExplanation", get_all)]
pub struct RouteExplanation {
    pub tier: String,
    /// The key's `repr`, not the key: the explanation keeps no caller object alive.
    pub key_repr: String,
    pub bucket: u32,
    pub range: Option<Py<BucketRange>>,
    pub replicaset_uuid: Option<String>,
    pub replicaset: Option<Py<Replicaset>>,
    pub master_uuid: Option<String>,
    pub master: Option<Py<Instance>>,
    pub master_address: Option<String>,
    pub master_state: Option<String>,
    pub epoch: u64,
    pub routed: Option<Py<Instance>>,
    pub reason: Option<&'static str>,
    pub detail: String,
    pub cleared_by: Option<String>,
    pub cleared_at: Option<f64>,
    pub cleared_epoch: Option<u64>,
}

/// Unix seconds as an ISO 8601 UTC time to the millisecond: "2026-12-03T07:55:01.123Z".
pub fn utc(seconds: f64) -> String {
    let millis = (seconds * 1000.0).round() as i64;
    let (days, in_day) = (millis.div_euclid(86_400_000), millis.rem_euclid(86_400_000));
    // Days since 1970-01-01 to a proleptic Gregorian date, in 400-year eras of 146,097 days.
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000
    )
}

/// "1 range", "3 ranges".
fn count_ranges(ranges: usize) -> String {
    match ranges {
        1 => "1 range".to_owned(),
        n => format!("{n} ranges"),
    }
}

/// An instance for people: its name and uuid, or its uuid.
fn instance_name(instance: &Instance) -> String {
    match &instance.name {
        Some(name) => format!("{} ({})", quoted(name), instance.uuid),
        None => instance.uuid.clone(),
    }
}

/// A replicaset for people: its name and uuid, or its uuid.
fn replicaset_name(uuid: &str, replicaset: Option<&Replicaset>) -> String {
    match replicaset.and_then(|known| known.name.as_deref()) {
        Some(name) => format!("{} ({uuid})", quoted(name)),
        None => uuid.to_owned(),
    }
}

impl RouteExplanation {
    /// Builds the explanation of `found`, with no lock held.
    pub fn new(py: Python<'_>, tier: &str, key_repr: String, found: Found) -> PyResult<Self> {
        let Found {
            bucket,
            epoch,
            ranges,
            range,
            replicaset,
            master,
            routed,
            last_clear,
        } = found;
        let replicaset_uuid = range.map(|(_, _, owner, _)| uuid::format(owner));
        let master_uuid = replicaset
            .as_ref()
            .and_then(|(_, master)| master.map(uuid::format));
        let master_instance = master.as_ref().map(|master| master.get());
        let cleared = last_clear.as_ref().map(|last| {
            format!(
                "the map was cleared at {} (epoch {}) because {}",
                utc(last.at),
                last.epoch,
                last.cause.describe()
            )
        });
        let (reason, detail) = match (&range, &replicaset, master_instance) {
            (None, _, _) => {
                let holds = format!("no range of tier {} covers bucket {bucket}", quoted(tier));
                match (&last_clear, &cleared) {
                    (Some(last), Some(cleared)) if last.filling => (
                        Some("map-cleared"),
                        format!(
                            "{holds}: {cleared}, and no range holding it has come since ({} now)",
                            count_ranges(ranges)
                        ),
                    ),
                    (_, Some(cleared)) => (
                        Some("no-range"),
                        format!("{holds} ({} at epoch {epoch}; {cleared}, and the map was refilled since)", count_ranges(ranges)),
                    ),
                    (_, None) => (
                        Some("no-range"),
                        format!("{holds} ({} at epoch {epoch}; never cleared)", count_ranges(ranges)),
                    ),
                }
            }
            (Some((start, end, owner, stamp)), known, instance) => {
                let owner = uuid::format(*owner);
                let held = format!(
                    "bucket {bucket} is in [{start}, {end}] (set by {} at {}, epoch {}) of replicaset {}",
                    stamp.by.name(),
                    utc(stamp.at),
                    stamp.epoch,
                    replicaset_name(&owner, known.as_ref().map(|(known, _)| known.get()))
                );
                match (known, &master_uuid, instance) {
                    (None, _, _) => (
                        Some("replicaset-unknown"),
                        format!("{held}, which is not a known replicaset"),
                    ),
                    (Some(_), None, _) => (
                        Some("master-unknown"),
                        format!("{held}, which has no current master"),
                    ),
                    (Some(_), Some(master_uuid), None) => (
                        Some("master-unknown"),
                        format!("{held}, whose master {master_uuid} is not a known instance"),
                    ),
                    (Some(_), Some(_), Some(instance)) => {
                        let state = match instance.current_state.as_deref() {
                            Some("Online") => String::new(),
                            Some(state) => format!(
                                ", in state {} (not Online: route still returns it)",
                                quoted(state)
                            ),
                            None => ", in an unknown state (route still returns it)".to_owned(),
                        };
                        let address = instance
                            .address
                            .as_deref()
                            .map_or_else(|| "no known address".to_owned(), quoted);
                        (
                            None,
                            format!(
                                "{held}, whose master {} is at {address}{state}",
                                instance_name(instance)
                            ),
                        )
                    }
                }
            }
        };
        let range = range
            .map(|(start, end, owner, stamp)| {
                Py::new(py, BucketRange::of(start, end, owner, &stamp))
            })
            .transpose()?;
        Ok(Self {
            tier: tier.to_owned(),
            key_repr,
            bucket,
            range,
            replicaset_uuid,
            master_address: master_instance.and_then(|instance| instance.address.clone()),
            master_state: master_instance.and_then(|instance| instance.current_state.clone()),
            replicaset: replicaset.map(|(known, _)| known),
            master_uuid,
            master,
            epoch,
            routed,
            reason,
            detail,
            cleared_by: last_clear.as_ref().map(|last| last.cause.describe()),
            cleared_at: last_clear.as_ref().map(|last| last.at),
            cleared_epoch: last_clear.as_ref().map(|last| last.epoch),
        })
    }
}

#[pymethods]
impl RouteExplanation {
    /// One line for people: the tier, the key, the outcome and `detail`.
    fn __str__(&self) -> String {
        let outcome = match self.reason {
            None => "routed".to_owned(),
            Some(reason) => format!("no route ({reason})"),
        };
        format!(
            "tier {}, key {}: {outcome}: {} [tier epoch {}]",
            quoted(&self.tier),
            self.key_repr,
            self.detail,
            self.epoch
        )
    }

    fn __repr__(&self) -> String {
        let range = self.range.as_ref().map_or_else(
            || "None".to_owned(),
            |range| format!("[{}, {}]", range.get().start, range.get().end),
        );
        format!(
            "RouteExplanation(tier={}, key={}, bucket={}, range={range}, replicaset_uuid={}, master_uuid={}, master_state={}, epoch={}, reason={}, detail={})",
            quoted(&self.tier),
            self.key_repr,
            self.bucket,
            repr_option(&self.replicaset_uuid),
            repr_option(&self.master_uuid),
            repr_option(&self.master_state),
            self.epoch,
            self.reason.map_or_else(|| "None".to_owned(), quoted),
            quoted(&self.detail),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn utc_reads_like_iso_8601() {
        assert_eq!(utc(0.0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(951_782_400.25), "2000-02-29T00:00:00.250Z");
        assert_eq!(utc(1_796_284_501.123_4), "2026-12-03T07:55:01.123Z");
        assert_eq!(utc(-1.0), "1969-12-31T23:59:59.000Z");
    }
}
