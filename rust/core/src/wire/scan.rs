//! Where a MessagePack message ends, however the socket split its bytes: a scan that resumes
//! where the bytes ran out, and refuses a message over the frame limit, deeper than
//! [`MAX_DEPTH`] containers, or of more items than allowed, before its bytes are all there.

use crate::Error;

/// msgpack-python refuses a 1025th container nested in the others; so does this reader.
pub const MAX_DEPTH: usize = 1024;

/// Where the scan of the unfinished message stopped: `pos` is the start of the next item (its
/// header not read yet), `open` the items still due in each container not finished yet, `due`
/// their sum, `items` the items whose headers were read.
#[derive(Default)]
pub struct Scan {
    pub pos: usize,
    pub open: Vec<u64>,
    pub due: u64,
    pub items: u64,
}

/// What one message may hold: `bytes`, and `items` (each value, container and key counts
/// one) outside the payload or result bin it carries; `inner` the items of that payload or
/// result, read on its own.
#[derive(Clone, Copy)]
pub struct Limits {
    pub bytes: usize,
    pub items: u64,
    pub inner: u64,
}

impl Limits {
    pub fn bytes(bytes: usize) -> Self {
        Limits {
            bytes,
            items: u64::MAX,
            inner: u64::MAX,
        }
    }
}

#[inline]
pub fn be(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0, |n, &b| (n << 8) | u64::from(b))
}

/// What the header at `data[pos]` says: `(header bytes, body bytes, items it contains)`, or
/// None when the header is not all there yet.
#[inline]
pub fn header(data: &[u8], pos: usize) -> Result<Option<(usize, u64, u64)>, Error> {
    let b = data[pos];
    let sized = |width: usize| -> Option<u64> { data.get(pos + 1..pos + 1 + width).map(be) };
    Ok(Some(match b {
        0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (1, 0, 0),
        0xcc | 0xd0 => (1, 1, 0),
        0xcd | 0xd1 => (1, 2, 0),
        0xce | 0xd2 | 0xca => (1, 4, 0),
        0xcf | 0xd3 | 0xcb => (1, 8, 0),
        0xa0..=0xbf => (1, u64::from(b & 0x1f), 0),
        0xd9 | 0xc4 => match sized(1) {
            Some(n) => (2, n, 0),
            None => return Ok(None),
        },
        0xda | 0xc5 => match sized(2) {
            Some(n) => (3, n, 0),
            None => return Ok(None),
        },
        0xdb | 0xc6 => match sized(4) {
            Some(n) => (5, n, 0),
            None => return Ok(None),
        },
        0x90..=0x9f => (1, 0, u64::from(b & 0x0f)),
        0x80..=0x8f => (1, 0, 2 * u64::from(b & 0x0f)),
        0xdc => match sized(2) {
            Some(n) => (3, 0, n),
            None => return Ok(None),
        },
        0xdd => match sized(4) {
            Some(n) => (5, 0, n),
            None => return Ok(None),
        },
        0xde => match sized(2) {
            Some(n) => (3, 0, 2 * n),
            None => return Ok(None),
        },
        0xdf => match sized(4) {
            Some(n) => (5, 0, 2 * n),
            None => return Ok(None),
        },
        0xc1 => return Err(Error::Malformed("byte 0xc1 is not msgpack".into())),
        // 0xc7-0xc9 and 0xd4-0xd8: the extension types, the timestamp among them
        _ => {
            return Err(Error::Malformed(format!(
                "extension types are refused (byte {b:#04x})"
            )))
        }
    }))
}

/// Scans `data` from `scan.pos` (inside a message that starts at `start`) for the message's
/// end: `Ok(Some(end))`, or `Ok(None)` with `scan` left where the bytes ran out, to be resumed
/// when more come. A message that cannot fit in `limits.bytes` bytes is refused as soon as that
/// is known (each item still due takes at least a byte), and one holding more than
/// `limits.items` items (each value, container and key counts one) at the header past them:
/// the scan costs a few operations per header, building the values many times more.
pub fn scan_message(
    data: &[u8],
    start: usize,
    limits: Limits,
    scan: &mut Scan,
) -> Result<Option<usize>, Error> {
    let bound = start.saturating_add(limits.bytes) as u64;
    loop {
        let pos = scan.pos;
        if pos >= data.len() {
            return Ok(None);
        }
        let Some((head, body, items)) = header(data, pos)? else {
            // a header cut short, which may not fit either
            if data.len() as u64 > bound {
                return Err(Error::FrameTooLarge);
            }
            return Ok(None);
        };
        let end = pos as u64 + head as u64 + body;
        // the items this one holds and those due after it take a byte each at least (each open
        // container's count includes the one item in progress in it)
        let due_after = scan.due - scan.open.len() as u64;
        if end.saturating_add(items).saturating_add(due_after) > bound {
            return Err(Error::FrameTooLarge);
        }
        if end > data.len() as u64 {
            return Ok(None);
        }
        scan.items += 1;
        if scan.items > limits.items {
            return Err(Error::Malformed(format!(
                "more than {} items in one message",
                limits.items
            )));
        }
        scan.pos = end as usize;
        if is_container(data[pos]) && scan.open.len() >= MAX_DEPTH {
            return Err(Error::Malformed(format!(
                "nested deeper than {MAX_DEPTH} containers"
            )));
        }
        if items > 0 {
            scan.open.push(items);
            scan.due += items;
            continue;
        }
        // one item done: it may finish the containers around it
        loop {
            match scan.open.last_mut() {
                None => return Ok(Some(scan.pos)),
                Some(due) => {
                    *due -= 1;
                    scan.due -= 1;
                    if *due > 0 {
                        break;
                    }
                    scan.open.pop();
                }
            }
        }
    }
}

#[inline]
pub fn is_container(b: u8) -> bool {
    matches!(b, 0x80..=0x9f | 0xdc..=0xdf)
}

#[cfg(test)]
mod tests {
    use super::{scan_message, Limits, Scan, MAX_DEPTH};
    use crate::Error;

    /// The end of the message at the start of `data`, scanned in reads of `step` bytes (the scan
    /// resumed after each, as the reader does), or the refusal.
    fn scan_in_steps(data: &[u8], limit: usize, step: usize) -> Result<Option<usize>, Error> {
        let mut scan = Scan::default();
        let mut seen = 0;
        loop {
            seen = (seen + step).min(data.len());
            if let Some(end) = scan_message(&data[..seen], 0, Limits::bytes(limit), &mut scan)? {
                return Ok(Some(end));
            }
            if seen == data.len() {
                return Ok(None);
            }
        }
    }

    fn end(data: &[u8], limit: usize, step: usize) -> Option<usize> {
        match scan_in_steps(data, limit, step) {
            Ok(end) => end,
            Err(Error::FrameTooLarge) => panic!("refused as too large"),
            Err(other) => panic!("refused: {other}"),
        }
    }

    // [1, [2, {"k": [nil, "ab"]}], bin 300 bytes], then a nil that is the next message
    fn nested() -> Vec<u8> {
        let mut data = vec![
            0x93, 0x01, 0x92, 0x02, 0x81, 0xa1, b'k', 0x92, 0xc0, 0xa2, b'a', b'b',
        ];
        data.extend_from_slice(&[0xc5, 0x01, 0x2c]);
        data.extend_from_slice(&[7; 300]);
        data.push(0xc0);
        data
    }

    #[test]
    fn a_message_ends_at_the_same_byte_however_the_reads_split_it() {
        let data = nested();
        let whole = data.len() - 1;
        for step in [1, 2, 3, 5, 13, 64, 1000] {
            assert_eq!(
                end(&data, whole, step),
                Some(whole),
                "reads of {step} bytes"
            );
        }
        assert_eq!(
            end(&data[..whole - 1], whole, 1),
            None,
            "one byte short: unfinished"
        );
    }

    #[test]
    fn a_message_one_byte_over_the_limit_is_refused_in_reads_of_any_size() {
        let data = nested();
        let whole = data.len() - 1;
        for step in [1, 7, 1000] {
            assert!(matches!(
                scan_in_steps(&data, whole - 1, step),
                Err(Error::FrameTooLarge)
            ));
        }
    }

    #[test]
    fn headers_announcing_more_than_fits_are_refused_before_their_bytes_come() {
        // an array of 2^32 - 1 items, a bin of 4 GiB, 256 items inside a pair
        for header in [
            &[0xdd, 0xff, 0xff, 0xff, 0xff][..],
            &[0xc6, 0xff, 0xff, 0xff, 0xff],
            &[0x92, 0xdc, 0x01, 0x00],
        ] {
            let mut scan = Scan::default();
            assert!(matches!(
                scan_message(header, 0, Limits::bytes(257), &mut scan),
                Err(Error::FrameTooLarge)
            ));
        }
        // 256 items inside a pair fit in 261 bytes
        let mut scan = Scan::default();
        assert!(matches!(
            scan_message(&[0x92, 0xdc, 0x01, 0x00], 0, Limits::bytes(261), &mut scan),
            Ok(None)
        ));
    }

    #[test]
    fn containers_nest_at_most_max_depth_deep_empty_ones_included() {
        for innermost in [0x90, 0x80] {
            let mut deepest = vec![0x91; MAX_DEPTH - 1];
            deepest.push(innermost);
            assert_eq!(end(&deepest, deepest.len(), 1), Some(deepest.len()));
            deepest.insert(0, 0x91);
            let mut scan = Scan::default();
            assert!(matches!(
                scan_message(&deepest, 0, Limits::bytes(deepest.len()), &mut scan),
                Err(Error::Malformed(what)) if what.contains("deeper")
            ));
        }
    }

    #[test]
    fn extension_types_and_0xc1_are_refused_at_their_header() {
        for byte in [0xc1, 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8] {
            let mut scan = Scan::default();
            assert!(matches!(
                scan_message(&[0x91, byte], 0, Limits::bytes(100), &mut scan),
                Err(Error::Malformed(_))
            ));
        }
    }

    #[test]
    fn a_message_of_more_items_than_the_limit_is_refused_in_reads_of_any_size() {
        // [1, [2, {"k": [nil, "ab"]}], bin]: 10 items, each key and container counted
        let data = nested();
        let whole = data.len() - 1;
        for step in [1, 4, 1000] {
            let mut scan = Scan::default();
            let mut seen = 0;
            let mut exact = None;
            while exact.is_none() && seen < whole {
                seen = (seen + step).min(whole);
                let limits = Limits {
                    items: 10,
                    ..Limits::bytes(whole)
                };
                exact = scan_message(&data[..seen], 0, limits, &mut scan)
                    .ok()
                    .flatten();
            }
            assert_eq!(exact, Some(whole), "10 items, reads of {step} bytes");
            let mut scan = Scan::default();
            let limits = Limits {
                items: 9,
                ..Limits::bytes(whole)
            };
            assert!(matches!(
                scan_message(&data[..whole], 0, limits, &mut scan),
                Err(Error::Malformed(what)) if what.contains("more than 9 items")
            ));
        }
    }
}
