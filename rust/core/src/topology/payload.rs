//! The JSON text `SELECT _pico_bucket(tier)` returns, read straight into the tier's ranges.
//!
//! The text is streamed through serde_json: each row is validated as soon as it has been read,
//! the first bad row stops the parse, and nothing of a row is kept but its range (start, end,
//! owner uuid), so a poll costs a small fraction of its size on top of the text, whatever the
//! text holds. The extension's `BucketPayload` is a poll decoded and validated once, that any
//! number of topologies can then apply without decoding it again.
//!
//! The rows are those of the extension's `events::bucket_row`, read with the same rules and
//! messages: the fields `bucket_id_start`, `bucket_id_end` (ints in `1..=u32::MAX`, not bool),
//! `tier_name` (the polled tier) and `current_replicaset_uuid` (a UUID string) are required; in a
//! `state` whose buckets are served by their target ([`served_by_target`]), a non-null
//! `target_replicaset_uuid` (a UUID string) is the range's owner instead; any other field is
//! skipped. The text must be strict JSON (RFC 8259, as UTF-8 when given as bytes): no NaN, no lone
//! surrogate escapes, no known field twice, and fewer than 128 levels of nesting (the outer array
//! counts as one).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::ranges::{sort_snapshot, Range};
use crate::text::quoted;
use crate::uuid;
use crate::Error;

/// Bound on the JSON text of one tier's poll: 64 MiB is far beyond any real bucket map (a row is
/// about 200 bytes) and keeps a broken or hostile server from making the client read gigabytes.
pub const MAX_PAYLOAD: usize = 64 << 20;

/// A range as the text gives it; the owner's Python string is made once the parse succeeded.
pub type RawRange = Range<u128>;

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
fn bucket_bound(field: Field, value: &Scalar<'_>) -> Result<u32, Error> {
    match value {
        Scalar::Int(bound) if *bound >= 1 && *bound <= i128::from(u32::MAX) => Ok(*bound as u32),
        _ => Err(Error::NotABucketBound {
            field: field.name(),
            got: value.render(),
        }),
    }
}

/// One row of the text, read field by field and then checked in the order `bucket_row` checks.
struct Row<'a> {
    tier: &'a str,
}

impl Row<'_> {
    fn check<'de>(&self, fields: [Option<Scalar<'de>>; 6]) -> Result<RawRange, Error> {
        let [start, end, tier, owner, state, target] = fields;
        let required = |field: Field, value: Option<Scalar<'de>>| {
            value.ok_or_else(|| {
                Error::InvalidEvent(format!("bucket row has no field '{}'", field.name()))
            })
        };
        let start = bucket_bound(Field::Start, &required(Field::Start, start)?)?;
        let end = bucket_bound(Field::End, &required(Field::End, end)?)?;
        if start > end {
            return Err(Error::ReversedRange { start, end });
        }
        match required(Field::Tier, tier)? {
            Scalar::Str(name) if name.is_empty() => {
                return Err(Error::InvalidEvent(
                    "field 'tier_name' must not be empty".to_owned(),
                ))
            }
            Scalar::Str(name) if name != self.tier => {
                return Err(Error::OtherTier {
                    tier: self.tier.to_owned(),
                    found: name.into_owned(),
                })
            }
            Scalar::Str(_) => {}
            other => {
                return Err(Error::InvalidEvent(format!(
                    "field 'tier_name' must be a str, got {}",
                    other.render()
                )))
            }
        }
        let owner = required(Field::Owner, owner)?;
        let uuid = match &owner {
            Scalar::Str(text) => uuid::parse(text),
            _ => None,
        };
        let mut owner = uuid.ok_or_else(|| {
            Error::InvalidEvent(format!(
                "field 'current_replicaset_uuid' must be a UUID string, got {}",
                owner.render()
            ))
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
                    Error::InvalidEvent(format!(
                        "field 'target_replicaset_uuid' must be a UUID string, got {}",
                        target.render()
                    ))
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
/// if given, bounds them too. Every refusal is an `InvalidEvent`.
pub fn read_ranges(
    tier: &str,
    text: &[u8],
    bucket_count: Option<u32>,
) -> Result<Vec<RawRange>, Error> {
    let mut ranges = Vec::new();
    let mut deserializer = serde_json::Deserializer::from_slice(text);
    deserializer
        .deserialize_any(Rows {
            tier,
            ranges: &mut ranges,
        })
        .and_then(|()| deserializer.end())
        .map_err(|error| {
            Error::InvalidEvent(if error.is_data() {
                error.to_string()
            } else {
                format!(
                    "bucket payload of tier {} is not valid JSON: {error}",
                    quoted(tier)
                )
            })
        })?;
    sort_snapshot(tier, &mut ranges)?;
    if let (Some(count), Some(last)) = (bucket_count, ranges.last()) {
        if last.end > count {
            return Err(Error::BeyondBucketCount {
                tier: tier.to_owned(),
                end: last.end,
                count,
            });
        }
    }
    Ok(ranges)
}

/// Refuses a text of `size` (characters of a str, bytes of bytes) over [`MAX_PAYLOAD`].
pub fn check_size(tier: &str, size: usize) -> Result<(), Error> {
    if size > MAX_PAYLOAD {
        return Err(Error::InvalidEvent(format!(
            "bucket payload of tier {} has length {size}, over the limit of {MAX_PAYLOAD}",
            quoted(tier)
        )));
    }
    Ok(())
}

/// The bucket states whose buckets are served by `target_replicaset_uuid`: the data is whole
/// there and the next state is `active` there (`copied`: Picodata's topology-notifications ADR;
/// `sent`: the `_pico_bucket` table of Picodata 26.2, `src/catalog/pico_bucket.rs`, where the
/// old owner may no longer start a read nor a write). In every other state (`active`,
/// `copying` / `sending`: reads still served by the old owner, writes wait for the transfer;
/// `aborting-copy`: ownership returns to it; a state not known yet) requests follow
/// `current_replicaset_uuid`. A null or absent target is the current owner.
pub fn served_by_target(state: &str) -> bool {
    matches!(state, "copied" | "sent")
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
            .map_err(|error| error.to_string())
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
