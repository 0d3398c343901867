//! The JSON text `SELECT _pico_bucket(tier)` returns, read straight into the tier's ranges.
//!
//! The text is streamed through serde_json: each row is validated as soon as it has been read,
//! the first bad row stops the parse, and nothing of a row is kept but its range (start, end,
//! owner uuid), so a poll costs a small fraction of its size on top of the text, whatever the
//! text holds. [`BucketPayload`] is a poll decoded and validated once, that any number of
//! topologies can then apply without decoding it again.
//!
//! The rows are those of `events::bucket_row`, read with the same rules and messages: the fields
//! `bucket_id_start`, `bucket_id_end` (ints in `1..=u32::MAX`, not bool), `tier_name` (the
//! polled tier) and `current_replicaset_uuid` (a UUID string) are required; in a `state` whose
//! buckets are served by their target (`events::served_by_target`), a non-null
//! `target_replicaset_uuid` (a UUID string) is the range's owner instead; any other field is
//! skipped. The text must be strict JSON (RFC 8259, as UTF-8 when given as bytes): no NaN, no
//! lone surrogate escapes, no known field twice, and fewer than 128 levels of nesting (the outer array counts as one).

use std::borrow::Cow;
use std::fmt;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use rustc_hash::FxHashMap;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::bucket_map::{sort_snapshot, Range};
use crate::errors::{invalid_event, quoted};
use crate::events::{served_by_target, Owner};
use crate::uuid;

/// Bound on the JSON text of one tier's poll: 64 MiB is far beyond any real bucket map (a row is
/// about 200 bytes) and keeps a broken or hostile server from making the client read gigabytes.
pub const MAX_PAYLOAD: usize = 64 << 20;

/// Texts longer than this are parsed with the GIL released: long enough that other threads
/// (routing calls) would notice the wait, short enough that most polls skip the hand-over.
const DETACH_ABOVE: usize = 256 << 10;

/// A range as the text gives it; the owner's Python string is made once the parse succeeded.
type RawRange = Range<u128>;

/// One JSON value of a field, as far as an error message needs it.
enum Scalar<'de> {
    Int(i128),
    Float(f64),
    Bool(bool),
    Null,
    Str(Cow<'de, str>),
    List,
    Dict,
}

impl Scalar<'_> {
    /// Rendered the way Python's `repr` renders the value `json.loads` gives for it.
    fn render(&self) -> String {
        match self {
            Self::Int(value) => value.to_string(),
            Self::Float(value) => format!("{value:?}"),
            Self::Bool(true) => "True".to_owned(),
            Self::Bool(false) => "False".to_owned(),
            Self::Null => "None".to_owned(),
            Self::Str(text) => quoted(text),
            Self::List => "a list".to_owned(),
            Self::Dict => "a dict".to_owned(),
        }
    }

    /// The name of the Python type `json.loads` gives for the value.
    fn type_name(&self) -> &'static str {
        match self {
            Self::Int(_) => "int",
            Self::Float(_) => "float",
            Self::Bool(_) => "bool",
            Self::Null => "NoneType",
            Self::Str(_) => "str",
            Self::List => "list",
            Self::Dict => "dict",
        }
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Self::Value, E> {
        Ok(Scalar::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Self::Value, E> {
        Ok(Scalar::Int(value.into()))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Self::Value, E> {
        Ok(Scalar::Int(value.into()))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Self::Value, E> {
        Ok(Scalar::Float(value))
    }

    fn visit_borrowed_str<E>(self, value: &'de str) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Borrowed(value)))
    }

    fn visit_str<E>(self, value: &str) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Owned(value.to_owned())))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Scalar::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Skip.visit_seq(seq)?;
        Ok(Scalar::List)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Skip.visit_map(map)?;
        Ok(Scalar::Dict)
    }
}

impl<'de> DeserializeSeed<'de> for ScalarVisitor {
    type Value = Scalar<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// Reads past one value of any shape. Unlike `serde::de::IgnoredAny` it goes through
/// `deserialize_any`, so serde_json's nesting limit applies to skipped values too.
struct Skip;

impl<'de> Visitor<'de> for Skip {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key_seed(Skip)?.is_some() {
            map.next_value_seed(Skip)?;
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Start,
    End,
    Tier,
    Owner,
    State,
    Target,
    Other,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Self::Start => "bucket_id_start",
            Self::End => "bucket_id_end",
            Self::Tier => "tier_name",
            Self::Owner => "current_replicaset_uuid",
            Self::State => "state",
            Self::Target => "target_replicaset_uuid",
            Self::Other => "",
        }
    }
}

struct FieldVisitor;

impl Visitor<'_> for FieldVisitor {
    type Value = Field;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E>(self, name: &str) -> Result<Field, E> {
        Ok(match name {
            "bucket_id_start" => Field::Start,
            "bucket_id_end" => Field::End,
            "tier_name" => Field::Tier,
            "current_replicaset_uuid" => Field::Owner,
            "state" => Field::State,
            "target_replicaset_uuid" => Field::Target,
            _ => Field::Other,
        })
    }
}

impl<'de> DeserializeSeed<'de> for FieldVisitor {
    type Value = Field;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Field, D::Error> {
        deserializer.deserialize_str(self)
    }
}

/// A bucket bound: an int in `1..=u32::MAX` (bool is refused: it is an int by accident).
fn bucket_bound(field: Field, value: &Scalar<'_>) -> Result<u32, String> {
    match value {
        Scalar::Int(bound) if *bound >= 1 && *bound <= i128::from(u32::MAX) => Ok(*bound as u32),
        _ => Err(format!(
            "field '{}' must be a bucket id (an int >= 1), got {}",
            field.name(),
            value.render()
        )),
    }
}

/// One row of the text, read field by field and then checked in the order `bucket_row` checks.
struct Row<'a> {
    tier: &'a str,
}

impl Row<'_> {
    fn check<'de>(&self, fields: [Option<Scalar<'de>>; 6]) -> Result<RawRange, String> {
        let [start, end, tier, owner, state, target] = fields;
        let required = |field: Field, value: Option<Scalar<'de>>| {
            value.ok_or_else(|| format!("bucket row has no field '{}'", field.name()))
        };
        let start = bucket_bound(Field::Start, &required(Field::Start, start)?)?;
        let end = bucket_bound(Field::End, &required(Field::End, end)?)?;
        if start > end {
            return Err(format!(
                "bucket range start {start} is greater than end {end}"
            ));
        }
        match required(Field::Tier, tier)? {
            Scalar::Str(name) if name.is_empty() => {
                return Err("field 'tier_name' must not be empty".to_owned())
            }
            Scalar::Str(name) if name != self.tier => {
                return Err(format!(
                    "snapshot of tier {} holds a range of tier {}",
                    quoted(self.tier),
                    quoted(&name)
                ))
            }
            Scalar::Str(_) => {}
            other => {
                return Err(format!(
                    "field 'tier_name' must be a str, got {}",
                    other.render()
                ))
            }
        }
        let owner = required(Field::Owner, owner)?;
        let uuid = match &owner {
            Scalar::Str(text) => uuid::parse(text),
            _ => None,
        };
        let mut owner = uuid.ok_or_else(|| {
            format!(
                "field 'current_replicaset_uuid' must be a UUID string, got {}",
                owner.render()
            )
        })?;
        let moved = matches!(&state, Some(Scalar::Str(state)) if served_by_target(state));
        match target {
            Some(Scalar::Null) | None => {}
            Some(target) if moved => {
                let uuid = match &target {
                    Scalar::Str(text) => uuid::parse(text),
                    _ => None,
                };
                owner = uuid.ok_or_else(|| {
                    format!(
                        "field 'target_replicaset_uuid' must be a UUID string, got {}",
                        target.render()
                    )
                })?;
            }
            Some(_) => {}
        }
        Ok(Range { start, end, owner })
    }
}

impl<'de> Visitor<'de> for Row<'_> {
    type Value = RawRange;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a bucket row")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawRange, A::Error> {
        let mut fields: [Option<Scalar<'de>>; 6] = [None, None, None, None, None, None];
        while let Some(field) = map.next_key_seed(FieldVisitor)? {
            let slot = match field {
                Field::Start => &mut fields[0],
                Field::End => &mut fields[1],
                Field::Tier => &mut fields[2],
                Field::Owner => &mut fields[3],
                Field::State => &mut fields[4],
                Field::Target => &mut fields[5],
                Field::Other => {
                    map.next_value_seed(Skip)?;
                    continue;
                }
            };
            // state and target were once skipped like any unknown field, so a repeated one is
            // not refused: the last one counts
            if slot.is_some() && !matches!(field, Field::State | Field::Target) {
                return Err(de::Error::custom(format!(
                    "bucket row has field '{}' twice",
                    field.name()
                )));
            }
            *slot = Some(map.next_value_seed(ScalarVisitor)?);
        }
        self.check(fields).map_err(de::Error::custom)
    }

    // Anything but an object: the row is refused as soon as its first token is seen.

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<RawRange, E> {
        Err(not_a_row(&Scalar::Bool(value)))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<RawRange, E> {
        Err(not_a_row(&Scalar::Int(value.into())))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<RawRange, E> {
        Err(not_a_row(&Scalar::Int(value.into())))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<RawRange, E> {
        Err(not_a_row(&Scalar::Float(value)))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<RawRange, E> {
        Err(not_a_row(&Scalar::Str(Cow::Borrowed(value))))
    }

    fn visit_unit<E: de::Error>(self) -> Result<RawRange, E> {
        Err(not_a_row(&Scalar::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<RawRange, A::Error> {
        Err(not_a_row(&Scalar::List))
    }
}

impl<'de> DeserializeSeed<'de> for Row<'_> {
    type Value = RawRange;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<RawRange, D::Error> {
        deserializer.deserialize_any(self)
    }
}

fn not_a_row<E: de::Error>(value: &Scalar<'_>) -> E {
    E::custom(format!(
        "a bucket row must be a dict, got {}",
        value.render()
    ))
}

/// The whole text: an array of rows, each pushed to `ranges` once validated.
struct Rows<'a> {
    tier: &'a str,
    ranges: &'a mut Vec<RawRange>,
}

impl Rows<'_> {
    fn not_an_array<E: de::Error>(&self, value: &Scalar<'_>) -> E {
        E::custom(format!(
            "bucket payload of tier {} must be a JSON array, got {}",
            quoted(self.tier),
            value.type_name()
        ))
    }
}

impl<'de> Visitor<'de> for Rows<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array of bucket rows")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(range) = seq.next_element_seed(Row { tier: self.tier })? {
            self.ranges.push(range);
        }
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<(), E> {
        Err(self.not_an_array(&Scalar::Bool(value)))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<(), E> {
        Err(self.not_an_array(&Scalar::Int(value.into())))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<(), E> {
        Err(self.not_an_array(&Scalar::Int(value.into())))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<(), E> {
        Err(self.not_an_array(&Scalar::Float(value)))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(self.not_an_array(&Scalar::Str(Cow::Borrowed(""))))
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(self.not_an_array(&Scalar::Null))
    }

    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(self.not_an_array(&Scalar::Dict))
    }
}

/// Reads `text` into the tier's ranges, sorted by start and checked for overlaps; `bucket_count`,
/// if given, bounds them too. The error is the message of the `InvalidEvent` to raise.
fn read_ranges(
    tier: &str,
    text: &[u8],
    bucket_count: Option<u32>,
) -> Result<Vec<RawRange>, String> {
    let mut ranges = Vec::new();
    let mut deserializer = serde_json::Deserializer::from_slice(text);
    deserializer
        .deserialize_any(Rows {
            tier,
            ranges: &mut ranges,
        })
        .and_then(|()| deserializer.end())
        .map_err(|error| {
            if error.is_data() {
                error.to_string()
            } else {
                format!(
                    "bucket payload of tier {} is not valid JSON: {error}",
                    quoted(tier)
                )
            }
        })?;
    sort_snapshot(&mut ranges).map_err(|overlap| overlap.message(&quoted(tier)))?;
    if let (Some(count), Some(last)) = (bucket_count, ranges.last()) {
        if last.end > count {
            return Err(format!(
                "bucket range end {} exceeds the bucket_count {count} of tier {}",
                last.end,
                quoted(tier)
            ));
        }
    }
    Ok(ranges)
}

fn check_size(py: Python<'_>, tier: &str, size: usize) -> PyResult<()> {
    if size > MAX_PAYLOAD {
        return Err(invalid_event(
            py,
            format!(
                "bucket payload of tier {} has length {size}, over the limit of {MAX_PAYLOAD}",
                quoted(tier)
            ),
        ));
    }
    Ok(())
}

/// The ranges of the poll `payload` (str or bytes) of `tier`, validated whole (see the module
/// documentation), sorted by start; `bucket_count`, if given, bounds them. Raises `InvalidEvent`.
pub fn parse(
    tier: &str,
    payload: &Bound<'_, PyAny>,
    bucket_count: Option<u32>,
) -> PyResult<Vec<Range<Owner>>> {
    let py = payload.py();
    let invalid = |message: String| invalid_event(py, message);
    let text: &[u8] = if let Ok(text) = payload.cast::<PyString>() {
        // The limit counts characters, as Python's len() does.
        check_size(py, tier, text.len()?)?;
        // A str holding a lone surrogate has no UTF-8 form: it cannot be JSON either.
        text.to_str()
            .map_err(|_| {
                invalid(format!(
                    "bucket payload of tier {} is not valid JSON: it holds a lone surrogate",
                    quoted(tier)
                ))
            })?
            .as_bytes()
    } else if let Ok(bytes) = payload.cast::<PyBytes>() {
        // json.loads accepts UTF-8 bytes that start with a byte order mark
        let bytes = bytes.as_bytes();
        check_size(py, tier, bytes.len())?;
        bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes)
    } else {
        return Err(invalid(format!(
            "bucket payload of tier {} must be str or bytes, got {}",
            quoted(tier),
            payload.get_type().name()?
        )));
    };
    let raw = if text.len() > DETACH_ABOVE {
        py.detach(|| read_ranges(tier, text, bucket_count))
    } else {
        read_ranges(tier, text, bucket_count)
    }
    .map_err(invalid)?;
    Ok(with_names(py, raw))
}

/// The ranges with their owners' canonical texts, one Python string per replicaset.
fn with_names(py: Python<'_>, raw: Vec<RawRange>) -> Vec<Range<Owner>> {
    let mut names: FxHashMap<u128, Py<PyString>> = FxHashMap::default();
    raw.into_iter()
        .map(|range| {
            let name = names
                .entry(range.owner)
                .or_insert_with(|| PyString::new(py, &uuid::format(range.owner)).unbind());
            Range {
                start: range.start,
                end: range.end,
                owner: Owner {
                    uuid: range.owner,
                    name: name.clone_ref(py),
                },
            }
        })
        .collect()
}

/// One tier's poll text, decoded and validated once, ready to apply.
///
/// `BucketPayload(tier, text, bucket_count=None)` reads `text`, the JSON text (str or bytes)
/// `SELECT _pico_bucket(tier)` returns, and raises `InvalidEvent` where
/// `Topology.apply_bucket_snapshot(tier, text)` would: a text that is not strict JSON, not an
/// array, longer than 64 MiB, nested 128 levels deep or more, or whose rows are malformed, name
/// another tier, overlap, or (with `bucket_count`) reach past the tier's bucket count.
/// `Topology.apply_bucket_snapshot(tier, payload)` then applies it without reading the text
/// again, and recognises it as unchanged when its text is the one last applied to the tier.
#[pyclass(frozen, module = "shardline.topology.sources", name = "BucketPayload")]
pub struct BucketPayload {
    tier: Py<PyString>,
    text: Py<PyAny>,
    ranges: Box<[Range<Owner>]>,
}

impl BucketPayload {
    pub fn tier_name(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.tier.bind(py).to_str()?.to_owned())
    }

    pub fn text<'py>(&self, py: Python<'py>) -> &Bound<'py, PyAny> {
        self.text.bind(py)
    }

    /// A copy of the ranges, for a topology to own.
    pub fn ranges(&self, py: Python<'_>) -> Vec<Range<Owner>> {
        self.ranges
            .iter()
            .map(|range| Range {
                start: range.start,
                end: range.end,
                owner: range.owner.clone_ref(py),
            })
            .collect()
    }
}

#[pymethods]
impl BucketPayload {
    #[new]
    #[pyo3(signature = (tier, text, bucket_count = None))]
    fn new(
        tier: &Bound<'_, PyString>,
        text: &Bound<'_, PyAny>,
        bucket_count: Option<u32>,
    ) -> PyResult<Self> {
        let py = tier.py();
        let name = tier.to_str().map_err(|_| {
            invalid_event(
                py,
                format!(
                    "field 'tier' must be valid unicode, got {}",
                    tier.repr()
                        .map_or_else(|_| "?".to_owned(), |r| r.to_string())
                ),
            )
        })?;
        if name.is_empty() {
            return Err(invalid_event(
                py,
                "field 'tier' must not be empty".to_owned(),
            ));
        }
        let ranges = parse(name, text, bucket_count)?;
        Ok(Self {
            tier: tier.clone().unbind(),
            text: text.clone().unbind(),
            ranges: ranges.into_boxed_slice(),
        })
    }

    /// The tier the text was read for.
    #[getter]
    fn tier(&self, py: Python<'_>) -> Py<PyString> {
        self.tier.clone_ref(py)
    }

    /// The text, as given.
    #[getter(text)]
    fn text_of(&self, py: Python<'_>) -> Py<PyAny> {
        self.text.clone_ref(py)
    }

    /// The number of ranges.
    fn __len__(&self) -> usize {
        self.ranges.len()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "<BucketPayload of tier {}: {} ranges>",
            self.tier.bind(py),
            self.ranges.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: &str = "31f6051e-13aa-43fb-beb2-ae17155ac810";

    fn row(start: &str, end: &str) -> String {
        format!(
            r#"{{"bucket_id_start": {start}, "bucket_id_end": {end}, "tier_name": "t", "state": "active", "current_replicaset_uuid": "{OWNER}"}}"#
        )
    }

    fn read(text: &str) -> Result<Vec<(u32, u32)>, String> {
        read_ranges("t", text.as_bytes(), Some(3000))
            .map(|ranges| ranges.iter().map(|r| (r.start, r.end)).collect())
    }

    #[test]
    fn reads_rows_sorted_by_start() {
        let text = format!("[{}, {}]", row("11", "20"), row("1", "10"));
        assert_eq!(read(&text), Ok(vec![(1, 10), (11, 20)]));
        assert_eq!(read(" [ ] "), Ok(vec![]));
    }

    #[test]
    fn refuses_what_bucket_row_refuses() {
        for (text, message) in [
            (format!("[{}]", row("true", "1")), "got True"),
            (format!("[{}]", row("1.0", "1")), "got 1.0"),
            (format!("[{}]", row("0", "1")), "got 0"),
            (format!("[{}]", row("1", "4294967296")), "got 4294967296"),
            (
                format!("[{}]", row("2", "1")),
                "start 2 is greater than end 1",
            ),
            (
                format!("[{}]", row("1", "3001")),
                "exceeds the bucket_count 3000",
            ),
            ("[{}]".to_owned(), "has no field 'bucket_id_start'"),
            ("[5]".to_owned(), "must be a dict, got 5"),
            ("{}".to_owned(), "must be a JSON array, got dict"),
            (r#"[{"bucket_id_start": 1"#.to_owned(), "not valid JSON"),
            ("[] x".to_owned(), "not valid JSON"),
        ] {
            let error = read(&text).unwrap_err();
            assert!(error.contains(message), "{text}: {error}");
        }
    }

    #[test]
    fn refuses_a_known_field_twice() {
        let text = format!(
            "[{}]",
            row("1", "1").replace('}', r#", "bucket_id_end": 2}"#)
        );
        assert!(read(&text).unwrap_err().contains("'bucket_id_end' twice"));
    }

    #[test]
    fn bounds_nesting_in_skipped_fields() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let text = format!(
            "[{}]",
            row("1", "1").replace('}', &format!(r#", "x": {deep}}}"#))
        );
        assert!(read(&text).unwrap_err().contains("recursion limit"));
    }
}
