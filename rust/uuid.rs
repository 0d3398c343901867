//! UUIDs as 128-bit integers: parsed once at the boundary, compared and hashed as `u128`.

/// Hex digit value of each byte, or `INVALID`: one table load per digit on the parse path.
const INVALID: u8 = 0xff;
const HEX_VALUE: [u8; 256] = {
    let mut table = [INVALID; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        table[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    table
};

/// Parses the canonical `8-4-4-4-12` hex form (either case) or 32 bare hex digits.
pub fn parse(text: &str) -> Option<u128> {
    let bytes = text.as_bytes();
    let groups: [&[u8]; 5] = match bytes.len() {
        36 if [8, 13, 18, 23].iter().all(|&i| bytes[i] == b'-') => [
            &bytes[0..8],
            &bytes[9..13],
            &bytes[14..18],
            &bytes[19..23],
            &bytes[24..36],
        ],
        32 => [bytes, &[], &[], &[], &[]],
        _ => return None,
    };
    let mut value: u128 = 0;
    let mut invalid = 0u8;
    for &b in groups.iter().flat_map(|group| group.iter()) {
        let digit = HEX_VALUE[b as usize];
        invalid |= digit & 0xf0;
        value = (value << 4) | u128::from(digit & 0x0f);
    }
    (invalid == 0).then_some(value)
}

/// Whether `text` (already parsed) is in the form [`format`] produces.
pub fn is_canonical(text: &str) -> bool {
    text.len() == 36 && !text.bytes().any(|b| b.is_ascii_uppercase())
}

/// The canonical lowercase hyphenated form.
pub fn format(value: u128) -> String {
    let hex = format!("{value:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_canonical_form() {
        let text = "31f6051e-13aa-43fb-beb2-ae17155ac810";
        assert_eq!(format(parse(text).unwrap()), text);
    }

    #[test]
    fn accepts_upper_case_and_bare_hex() {
        let canonical = parse("31f6051e-13aa-43fb-beb2-ae17155ac810");
        assert_eq!(parse("31F6051E-13AA-43FB-BEB2-AE17155AC810"), canonical);
        assert_eq!(parse("31f6051e13aa43fbbeb2ae17155ac810"), canonical);
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "not-a-uuid",
            "31f6051e-13aa-43fb-beb2-ae17155ac81g",
            "31f6051e+13aa-43fb-beb2-ae17155ac810",
            "31f6051e-13aa-43fb-beb2-ae17155ac8100",
            "--------------------------------",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
