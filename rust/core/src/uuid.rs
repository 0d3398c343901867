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

/// Where the 32 hex digits sit in the hyphenated `8-4-4-4-12` form.
const HYPHENATED_DIGITS: [usize; 32] = {
    let mut positions = [0; 32];
    let (mut digit, mut at) = (0, 0);
    while digit < 32 {
        if !matches!(at, 8 | 13 | 18 | 23) {
            positions[digit] = at;
            digit += 1;
        }
        at += 1;
    }
    positions
};

const BARE_DIGITS: [usize; 32] = {
    let mut positions = [0; 32];
    let mut digit = 0;
    while digit < 32 {
        positions[digit] = digit;
        digit += 1;
    }
    positions
};

/// Parses the canonical `8-4-4-4-12` hex form (either case) or 32 bare hex digits.
pub fn parse(text: &str) -> Option<u128> {
    parse_noting_form(text).map(|(value, _)| value)
}

/// [`parse`], also telling whether `text` is already in the form [`format()`] produces.
pub fn parse_noting_form(text: &str) -> Option<(u128, bool)> {
    let bytes = text.as_bytes();
    let positions = match bytes.len() {
        36 if [8, 13, 18, 23].iter().all(|&i| bytes[i] == b'-') => &HYPHENATED_DIGITS,
        32 => &BARE_DIGITS,
        _ => return None,
    };
    // Two u64 halves: shifting a u128 digit by digit costs several instructions per digit.
    let (mut high, mut low, mut invalid, mut all_lower) = (0u64, 0u64, 0u8, 0x20u8);
    for (i, &at) in positions.iter().enumerate() {
        let digit = HEX_VALUE[bytes[at] as usize];
        invalid |= digit;
        // '0'-'9' and 'a'-'f' have bit 0x20 set, 'A'-'F' do not.
        all_lower &= bytes[at];
        if i < 16 {
            high = (high << 4) | u64::from(digit);
        } else {
            low = (low << 4) | u64::from(digit);
        }
    }
    let value = (u128::from(high) << 64) | u128::from(low);
    let canonical = bytes.len() == 36 && all_lower != 0;
    (invalid & 0xf0 == 0).then_some((value, canonical))
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
    fn notes_whether_the_text_is_already_canonical() {
        let text = "31f6051e-13aa-43fb-beb2-ae17155ac810";
        assert_eq!(parse_noting_form(text).map(|(_, c)| c), Some(true));
        assert_eq!(
            parse_noting_form(&text.to_uppercase()).map(|(_, c)| c),
            Some(false)
        );
        assert_eq!(
            parse_noting_form(&text.replace('-', "")).map(|(_, c)| c),
            Some(false)
        );
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
