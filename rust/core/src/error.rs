//! The core's refusals: one variant per condition, one message each (its `Display`).
//!
//! Each variant belongs to one class of shardline's Python exception hierarchy
//! (`shardline/errors.py`), named in its documentation; the extension module converts an
//! [`Error`] to that exception in exactly one place (`rust/py/errors.rs`). Conditions that only
//! the Python side can describe (a value's `repr`, a field read from an object) carry their
//! message ready-made; those the core detects itself carry the values, and their message is
//! written here.

use std::borrow::Cow;
use std::fmt;

use crate::text::quoted;

#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// `InvalidEvent`: a malformed event, row or poll; the message names the field and value.
    InvalidEvent(String),
    /// `InvalidEvent`: a bucket bound that is not an int in `1..=2**32 - 1`; `got` is the value
    /// as Python's `repr` writes it.
    NotABucketBound { field: &'static str, got: String },
    /// `InvalidEvent`: a range whose start is past its end.
    ReversedRange { start: u32, end: u32 },
    /// `InvalidEvent`: two ranges of one snapshot intersect.
    Overlap {
        tier: String,
        first: (u32, u32),
        second: (u32, u32),
    },
    /// `InvalidEvent`: a snapshot of `tier` holds a range of another tier.
    OtherTier { tier: String, found: String },
    /// `InvalidEvent`: a range ends past its tier's bucket count.
    BeyondBucketCount { tier: String, end: u32, count: u32 },
    /// `UnknownTier`: a tier never registered (or, for hashing, with no bucket count).
    UnknownTier(String),
    /// `TierWithoutBuckets`: routing, or a bucket range, in a tier of bucket_count 0.
    TierWithoutBuckets(String),
    /// `UnhashableKey`: why a scheme cannot encode a key part, before the key is named.
    Unencodable(Cow<'static, str>),
    /// `UnhashableKey`: a key (`part`: the part of a tuple) of type `type_name`, shown as
    /// `repr`, that the scheme cannot encode, and why.
    UnhashableKey {
        part: Option<usize>,
        type_name: String,
        repr: String,
        reason: Cow<'static, str>,
    },
    /// `InvalidArgument`: a bucket id or count out of range, an array of a shape not read.
    InvalidArgument(String),
    /// `InvalidArgumentType`: an argument of the wrong type (both an `InvalidArgument` and a
    /// `TypeError`).
    InvalidArgumentType(String),
    /// `ValueError`: a hashing scheme not known by that name.
    UnknownScheme(String),
    /// `ValueError`: a decimal format not known by that name.
    UnknownDecimalFormat(String),
    /// `ValueError`: an argument outside what the function takes; the message says which.
    Value(String),
    /// `TypeError`: an argument of a type the function does not take; the message says which.
    Type(String),
    /// `RuntimeError`: a stream reader fed by a second thread while a first one reads.
    FedConcurrently,
    /// The stream's own `too_large` class: a message longer than the frame limit.
    FrameTooLarge,
    /// The stream's own `malformed` class (`ValueError` for one value): bytes the protocol does
    /// not read; the text says which.
    Malformed(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidEvent(message)
            | Error::UnknownTier(message)
            | Error::TierWithoutBuckets(message)
            | Error::InvalidArgument(message)
            | Error::InvalidArgumentType(message)
            | Error::Value(message)
            | Error::Type(message)
            | Error::Malformed(message) => f.write_str(message),
            Error::NotABucketBound { field, got } => {
                write!(
                    f,
                    "field '{field}' must be a bucket id (an int >= 1), got {got}"
                )
            }
            Error::ReversedRange { start, end } => {
                write!(f, "bucket range start {start} is greater than end {end}")
            }
            Error::Overlap {
                tier,
                first,
                second,
            } => write!(
                f,
                "snapshot of tier {} has overlapping ranges {first:?} and {second:?}",
                quoted(tier)
            ),
            Error::OtherTier { tier, found } => write!(
                f,
                "snapshot of tier {} holds a range of tier {}",
                quoted(tier),
                quoted(found)
            ),
            Error::BeyondBucketCount { tier, end, count } => write!(
                f,
                "bucket range end {end} exceeds the bucket_count {count} of tier {}",
                quoted(tier)
            ),
            Error::Unencodable(reason) => f.write_str(reason),
            Error::UnhashableKey {
                part,
                type_name,
                repr,
                reason,
            } => {
                let what = match part {
                    Some(index) => format!("key part {index}"),
                    None => "key".to_owned(),
                };
                write!(
                    f,
                    "cannot hash {what} of type '{type_name}' ({repr}): {reason}"
                )
            }
            Error::UnknownScheme(name) => write!(
                f,
                "unknown scheme {name:?}: expected \"picodata\", \"vshard-strcrc32\" or \
                 \"vshard-mpcrc32\""
            ),
            Error::UnknownDecimalFormat(name) => write!(
                f,
                "unknown decimal_format {name:?}: expected \"binary\" or \"text\""
            ),
            Error::FedConcurrently => f.write_str("a MsgpackReader is fed by one thread at a time"),
            Error::FrameTooLarge => f.write_str("a message longer than the frame limit"),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn each_condition_reads_as_one_message() {
        let cases = [
            (
                Error::Overlap {
                    tier: "a".into(),
                    first: (1, 10),
                    second: (5, 12),
                },
                "snapshot of tier 'a' has overlapping ranges (1, 10) and (5, 12)",
            ),
            (
                Error::BeyondBucketCount {
                    tier: "a".into(),
                    end: 3001,
                    count: 3000,
                },
                "bucket range end 3001 exceeds the bucket_count 3000 of tier 'a'",
            ),
            (
                Error::UnhashableKey {
                    part: Some(1),
                    type_name: "list".into(),
                    repr: "[]".into(),
                    reason: "no".into(),
                },
                "cannot hash key part 1 of type 'list' ([]): no",
            ),
            (
                Error::NotABucketBound {
                    field: "start",
                    got: "True".into(),
                },
                "field 'start' must be a bucket id (an int >= 1), got True",
            ),
        ];
        for (error, message) in cases {
            assert_eq!(error.to_string(), message);
        }
    }
}
