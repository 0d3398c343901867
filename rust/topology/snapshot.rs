//! Whole-map snapshots: bucket events, `_pico_bucket` rows or a poll's text made into a tier's
//! new map, validated whole before the map is replaced in one critical section.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use shardline_core::topology::bucket_map::BucketMap;
use shardline_core::topology::ranges::{sort_snapshot, Range, SetBy, Setting};

use super::events::{self, Op, Owner};
use super::payload::{self, BucketPayload};
use super::state::{now, Displaced, Payload};
use super::Topology;
use crate::py::errors::{raise, repr, Error, OrRaise};

/// The tier name given to `apply_bucket_snapshot`, validated like an event's field.
pub(super) fn snapshot_tier<'a>(tier: &'a Bound<'_, PyString>) -> PyResult<&'a str> {
    let py = tier.py();
    match tier.to_str() {
        Ok("") => Err(raise(
            py,
            Error::InvalidEvent("field 'tier' must not be empty".to_owned()),
        )),
        Ok(text) => Ok(text),
        Err(_) => Err(raise(
            py,
            Error::InvalidEvent(format!(
                "field 'tier' must be valid text, got {}",
                repr(tier.as_any())
            )),
        )),
    }
}

/// One tier's ranges as `(start, end, owner)`, copied out of the state to be built after the
/// lock is released.
pub(super) type RangeCopy = Vec<(u32, u32, Py<PyString>)>;

pub(super) fn copy_ranges(py: Python<'_>, map: &BucketMap<Owner>) -> RangeCopy {
    map.ranges()
        .iter()
        .map(|range| (range.start, range.end, range.owner.name.clone_ref(py)))
        .collect()
}

pub(super) fn other_tier(py: Python<'_>, tier: &str, item_tier: &str) -> PyErr {
    let error = Error::OtherTier {
        tier: tier.to_owned(),
        found: item_tier.to_owned(),
    };
    raise(py, error)
}

impl Topology {
    /// Reads one snapshot item: a `_pico_bucket` row (dict) or a `BucketEvent`-like object.
    pub(super) fn snapshot_range(
        item: &Bound<'_, PyAny>,
        tier: &str,
        likely: Option<&Owner>,
    ) -> PyResult<Range<Owner>> {
        let py = item.py();
        let range = if item.is_instance_of::<PyDict>() {
            let row = events::bucket_row(item, likely)?;
            let item_tier = row.tier.to_str()?;
            if item_tier != tier {
                return Err(other_tier(py, tier, item_tier));
            }
            Range {
                start: row.start,
                end: row.end,
                owner: row.owner,
            }
        } else {
            let change = events::bucket_change(item, likely)?;
            if change.op != Op::Replace {
                return Err(raise(py, Error::InvalidEvent(format!(
                        "a bucket snapshot holds only 'replace' events, got op 'delete' for [{}, {}]",
                        change.start, change.end
                    ))));
            }
            if change.tier != tier {
                return Err(other_tier(py, tier, &change.tier));
            }
            Range {
                start: change.start,
                end: change.end,
                owner: change.owner,
            }
        };
        Ok(range)
    }

    /// A poll's ranges, validated whole, sorted and checked for overlaps.
    pub(super) fn snapshot_ranges(
        &self,
        tier: &str,
        items: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Range<Owner>>> {
        let py = items.py();
        // A poll usually repeats the map it replaces, range for range: the owners already mapped
        // let most rows skip parsing their uuid. Copied out, so no lock is held while rows are read.
        let mapped: Vec<Owner> =
            self.state
                .read()
                .known_tier(tier)
                .map_or_else(Vec::new, |known| {
                    known
                        .map
                        .ranges()
                        .iter()
                        .map(|range| range.owner.clone_ref(py))
                        .collect()
                });
        let mut ranges = items
            .try_iter()?
            .enumerate()
            .map(|(i, item)| Self::snapshot_range(&item?, tier, mapped.get(i)))
            .collect::<PyResult<Vec<_>>>()?;
        sort_snapshot(tier, &mut ranges).or_raise(py)?;
        if let Some(last) = ranges.last() {
            self.check_range_fits(py, tier, last.end)?;
        }
        Ok(ranges)
    }

    /// Replaces the tier's map, remembering the payload text it came from (if any) with the
    /// epoch it produced, in the same critical section. Ranges it sets are stamped as set by
    /// a poll if it came from a payload, else by a snapshot.
    pub(super) fn replace_tier(
        &self,
        py: Python<'_>,
        tier: &str,
        ranges: Vec<Range<Owner>>,
        payload: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        let index = self.registered_tier(py, tier);
        let setting = Setting {
            at: now(),
            by: if payload.is_some() {
                SetBy::Poll
            } else {
                SetBy::Snapshot
            },
        };
        let payload = payload.map(|text| text.clone().unbind());
        let mut displaced = Displaced::default();
        let mut state = self.state.write();
        let changed = state.edit_map(index, &mut displaced, |map, out| {
            map.replace_all(ranges, setting, out)
        });
        if let Some(text) = payload {
            let known = &mut state.tiers[index];
            let epoch = known.map.epoch();
            if let Some(old) = known.last_payload.replace(Payload { text, epoch }) {
                displaced.objects.push(old.text);
            }
        }
        changed
    }

    /// `apply_bucket_snapshot` of the JSON text `_pico_bucket(tier)` returns, or of a
    /// `BucketPayload` (that text, already read).
    pub(super) fn apply_bucket_payload(
        &self,
        tier: &str,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let py = payload.py();
        let parsed = payload.cast::<BucketPayload>().ok().map(Bound::get);
        let text = match parsed {
            Some(parsed) => {
                let parsed_tier = parsed.tier_name(py)?;
                if parsed_tier != tier {
                    return Err(other_tier(py, tier, &parsed_tier));
                }
                parsed.text(py).clone()
            }
            None => payload.clone(),
        };
        let last = self.state.read().known_tier(tier).and_then(|known| {
            known
                .last_payload
                .as_ref()
                .filter(|last| last.epoch == known.map.epoch())
                .map(|last| last.text.clone_ref(py))
        });
        if let Some(last) = last {
            if last.bind(py).eq(&text)? {
                return Ok(false);
            }
        }
        let ranges = match parsed {
            Some(parsed) => parsed.ranges(py),
            None => payload::parse(tier, &text, None)?,
        };
        if let Some(last) = ranges.last() {
            self.check_range_fits(py, tier, last.end)?;
        }
        Ok(self.replace_tier(py, tier, ranges, Some(&text)))
    }
}
