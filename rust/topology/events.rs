//! Reading topology events and `_pico_bucket` rows out of Python objects, validated.
//!
//! Everything arriving from Python is checked here, before the topology's lock is taken, so a
//! malformed event raises `InvalidEvent` naming the field and leaves the topology untouched.
//! Checks that need the topology (a range beyond its tier's bucket count) live in `apply.rs`.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use shardline_core::topology::payload::served_by_target;
use shardline_core::uuid;

use crate::py::errors::{raise, repr, Error};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Replace,
    Delete,
}

/// A replicaset uuid with its canonical text, kept as a Python string so lookups can return it
/// without allocating.
#[derive(Debug)]
pub struct Owner {
    pub uuid: u128,
    pub name: Py<PyString>,
}

impl Owner {
    pub fn clone_ref(&self, py: Python<'_>) -> Self {
        Self {
            uuid: self.uuid,
            name: self.name.clone_ref(py),
        }
    }
}

impl PartialEq for Owner {
    fn eq(&self, other: &Self) -> bool {
        self.uuid == other.uuid
    }
}

pub struct InstanceChange {
    pub op: Op,
    pub uuid: u128,
    pub replicaset_uuid: Option<u128>,
    pub current_state: Option<String>,
    pub address: Option<String>,
    pub name: Option<String>,
}

pub struct ReplicasetChange {
    pub op: Op,
    pub uuid: u128,
    pub tier: Option<String>,
    pub current_master_uuid: Option<u128>,
    pub name: Option<String>,
}

pub struct BucketChange {
    pub op: Op,
    pub tier: String,
    pub start: u32,
    pub end: u32,
    pub owner: Owner,
}

/// Which of the three applies an event goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Instance,
    Replicaset,
    Bucket,
}

/// The kind an event's class declares in its `topology_event` attribute (the classes of
/// `shardline.topology.events` do), or None: the core dispatches on it rather than on
/// those classes, so it never imports the package that sits above it.
pub fn kind_of(event: &Bound<'_, PyAny>) -> PyResult<Option<Kind>> {
    let py = event.py();
    let Some(declared) = event
        .get_type()
        .getattr_opt(intern!(py, "topology_event"))?
    else {
        return Ok(None);
    };
    let Ok(declared) = declared.cast_into::<PyString>() else {
        return Ok(None);
    };
    Ok(match declared.to_str() {
        Ok("instance") => Some(Kind::Instance),
        Ok("replicaset") => Some(Kind::Replicaset),
        Ok("bucket") => Some(Kind::Bucket),
        _ => None,
    })
}

fn op(value: &Bound<'_, PyAny>) -> PyResult<Op> {
    match value.extract::<&str>() {
        Ok("replace") => Ok(Op::Replace),
        Ok("delete") => Ok(Op::Delete),
        _ => Err(raise(
            value.py(),
            Error::InvalidEvent(format!(
                "field 'op' must be 'replace' or 'delete', got {}",
                repr(value)
            )),
        )),
    }
}

fn str_of<'py>(field: &str, value: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyString>> {
    value.cast_into::<PyString>().map_err(|e| {
        let value = e.into_inner();
        raise(
            value.py(),
            Error::InvalidEvent(format!(
                "field '{field}' must be a str, got {}",
                repr(&value)
            )),
        )
    })
}

/// The text of a str field: a str holding a lone surrogate is not text (it cannot be encoded).
fn text_of<'a>(field: &str, value: &'a Bound<'_, PyString>) -> PyResult<&'a str> {
    value.to_str().map_err(|_| {
        raise(
            value.py(),
            Error::InvalidEvent(format!(
                "field '{field}' must be valid text, got {}",
                repr(value.as_any())
            )),
        )
    })
}

fn non_empty_str<'py>(field: &str, value: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyString>> {
    let s = str_of(field, value)?;
    if text_of(field, &s)?.is_empty() {
        return Err(raise(
            s.py(),
            Error::InvalidEvent(format!("field '{field}' must not be empty")),
        ));
    }
    Ok(s)
}

fn optional_text(field: &str, value: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    if value.is_none() {
        Ok(None)
    } else {
        Ok(Some(
            text_of(field, &str_of(field, value.clone())?)?.to_owned(),
        ))
    }
}

fn non_empty_text(field: &str, value: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(text_of(field, &non_empty_str(field, value.clone())?)?.to_owned())
}

fn not_a_uuid(field: &str, value: &Bound<'_, PyAny>) -> PyErr {
    raise(
        value.py(),
        Error::InvalidEvent(format!(
            "field '{field}' must be a UUID string, got {}",
            repr(value)
        )),
    )
}

fn uuid_of(field: &str, value: &Bound<'_, PyAny>) -> PyResult<u128> {
    value
        .cast::<PyString>()
        .ok()
        .and_then(|s| s.to_str().ok())
        .and_then(uuid::parse)
        .ok_or_else(|| not_a_uuid(field, value))
}

fn optional_uuid(field: &str, value: &Bound<'_, PyAny>) -> PyResult<Option<u128>> {
    if value.is_none() {
        Ok(None)
    } else {
        uuid_of(field, value).map(Some)
    }
}

/// A replicaset uuid field as an [`Owner`]: reuses the caller's string when it is already
/// canonical, which is what Picodata sends. `likely` is the owner the caller expects (the one
/// already mapped at this position): a string equal to its canonical text needs no parsing.
fn owner_of(field: &str, value: &Bound<'_, PyAny>, likely: Option<&Owner>) -> PyResult<Owner> {
    if let (Some(likely), Ok(given)) = (likely, value.cast::<PyString>()) {
        let py = value.py();
        if given.to_str().ok() == likely.name.bind(py).to_str().ok() {
            return Ok(likely.clone_ref(py));
        }
    }
    let parsed = value
        .cast::<PyString>()
        .ok()
        .and_then(|given| Some((given, uuid::parse_noting_form(given.to_str().ok()?)?)));
    let Some((given, (uuid, canonical))) = parsed else {
        return Err(not_a_uuid(field, value));
    };
    let name = if canonical {
        given.clone().unbind()
    } else {
        PyString::new(value.py(), &uuid::format(uuid)).unbind()
    };
    Ok(Owner { uuid, name })
}

/// A bucket bound: an int in `1..=u32::MAX` (bool is refused: it is an int by accident).
fn bucket_bound(field: &'static str, value: &Bound<'_, PyAny>) -> PyResult<u32> {
    let bound = if value.is_instance_of::<pyo3::types::PyBool>() {
        None
    } else {
        value.extract::<i64>().ok()
    };
    match bound {
        Some(b) if b >= 1 && b <= i64::from(u32::MAX) => Ok(b as u32),
        _ => Err(raise(
            value.py(),
            Error::NotABucketBound {
                field,
                got: repr(value),
            },
        )),
    }
}

fn check_order(py: Python<'_>, start: u32, end: u32) -> PyResult<()> {
    if start > end {
        return Err(raise(py, Error::ReversedRange { start, end }));
    }
    Ok(())
}

/// `event.<name>`, with a missing attribute reported as a malformed event.
fn field<'py>(
    event: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    event.getattr(name).map_err(|_| {
        raise(
            event.py(),
            Error::InvalidEvent(format!("event {} has no field '{name}'", repr(event))),
        )
    })
}

pub fn instance_change(event: &Bound<'_, PyAny>) -> PyResult<InstanceChange> {
    let py = event.py();
    Ok(InstanceChange {
        op: op(&field(event, intern!(py, "op"))?)?,
        uuid: uuid_of(
            "instance_uuid",
            &field(event, intern!(py, "instance_uuid"))?,
        )?,
        replicaset_uuid: optional_uuid(
            "replicaset_uuid",
            &field(event, intern!(py, "replicaset_uuid"))?,
        )?,
        current_state: optional_text(
            "current_state",
            &field(event, intern!(py, "current_state"))?,
        )?,
        address: optional_text("address", &field(event, intern!(py, "address"))?)?,
        name: optional_text("name", &field(event, intern!(py, "name"))?)?,
    })
}

pub fn replicaset_change(event: &Bound<'_, PyAny>) -> PyResult<ReplicasetChange> {
    let py = event.py();
    let tier = field(event, intern!(py, "tier"))?;
    Ok(ReplicasetChange {
        op: op(&field(event, intern!(py, "op"))?)?,
        uuid: uuid_of(
            "replicaset_uuid",
            &field(event, intern!(py, "replicaset_uuid"))?,
        )?,
        tier: if tier.is_none() {
            None
        } else {
            Some(non_empty_text("tier", &tier)?)
        },
        current_master_uuid: optional_uuid(
            "current_master_uuid",
            &field(event, intern!(py, "current_master_uuid"))?,
        )?,
        name: optional_text("name", &field(event, intern!(py, "name"))?)?,
    })
}

/// A `BucketEvent`-like object (attributes `tier`, `start`, `end`, `current_replicaset_uuid`, `op`).
pub fn bucket_change(event: &Bound<'_, PyAny>, likely: Option<&Owner>) -> PyResult<BucketChange> {
    let py = event.py();
    let start = bucket_bound("start", &field(event, intern!(py, "start"))?)?;
    let end = bucket_bound("end", &field(event, intern!(py, "end"))?)?;
    check_order(py, start, end)?;
    Ok(BucketChange {
        op: op(&field(event, intern!(py, "op"))?)?,
        tier: non_empty_text("tier", &field(event, intern!(py, "tier"))?)?,
        start,
        end,
        owner: owner_of(
            "current_replicaset_uuid",
            &field(event, intern!(py, "current_replicaset_uuid"))?,
            likely,
        )?,
    })
}

fn row_field<'py>(
    row: &Bound<'py, PyDict>,
    field: &Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    row.get_item(field)?.ok_or_else(|| {
        raise(
            row.py(),
            Error::InvalidEvent(format!(
                "bucket row has no field '{field}': {}",
                repr(row.as_any())
            )),
        )
    })
}

/// One element of the JSON array `_pico_bucket(tier)` returns, as far as routing needs it:
/// `owner` is the replicaset requests go to (see `served_by_target`).
pub struct BucketRow<'py> {
    pub tier: Bound<'py, PyString>,
    pub start: u32,
    pub end: u32,
    pub owner: Owner,
}

fn as_row<'a, 'py>(row: &'a Bound<'py, PyAny>) -> PyResult<&'a Bound<'py, PyDict>> {
    row.cast::<PyDict>().map_err(|_| {
        raise(
            row.py(),
            Error::InvalidEvent(format!("a bucket row must be a dict, got {}", repr(row))),
        )
    })
}

pub fn bucket_row<'py>(
    row: &Bound<'py, PyAny>,
    likely: Option<&Owner>,
) -> PyResult<BucketRow<'py>> {
    let py = row.py();
    let row = as_row(row)?;
    let start = bucket_bound(
        "bucket_id_start",
        &row_field(row, intern!(py, "bucket_id_start"))?,
    )?;
    let end = bucket_bound(
        "bucket_id_end",
        &row_field(row, intern!(py, "bucket_id_end"))?,
    )?;
    check_order(py, start, end)?;
    let tier = non_empty_str("tier_name", row_field(row, intern!(py, "tier_name"))?)?;
    let current = owner_of(
        "current_replicaset_uuid",
        &row_field(row, intern!(py, "current_replicaset_uuid"))?,
        likely,
    )?;
    let moved = row
        .get_item(intern!(py, "state"))?
        .and_then(|state| {
            state
                .cast::<PyString>()
                .ok()
                .map(|s| s.to_cow().ok().is_some_and(|s| served_by_target(&s)))
        })
        .unwrap_or(false);
    let target = if moved {
        row.get_item(intern!(py, "target_replicaset_uuid"))?
            .filter(|target| !target.is_none())
    } else {
        None
    };
    let owner = match target {
        Some(target) => owner_of("target_replicaset_uuid", &target, likely)?,
        None => current,
    };
    Ok(BucketRow {
        tier,
        start,
        end,
        owner,
    })
}

/// Validates one `_pico_bucket` row and returns `(tier, start, end, owner, state)`, the owner
/// the replicaset requests go to (`current_replicaset_uuid`, or `target_replicaset_uuid` in a
/// state [`served_by_target`]) in canonical form; `BucketEvent.from_row` builds on it.
#[pyfunction]
pub fn parse_bucket_row<'py>(row: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
    let parsed = bucket_row(row, None)?;
    let py = row.py();
    let state = str_of("state", row_field(as_row(row)?, intern!(py, "state"))?)?;
    (
        parsed.tier,
        parsed.start,
        parsed.end,
        parsed.owner.name.bind(py),
        state,
    )
        .into_pyobject(py)
}
