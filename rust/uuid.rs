//! UUIDs as 128-bit integers: parsed once at the boundary, compared and hashed as `u128`.

/// Parses the canonical `8-4-4-4-12` hex form (either case) or 32 bare hex digits.
pub fn parse(text: &str) -> Option<u128> {
    let bytes = text.as_bytes();
    let hex_digits: &mut dyn Iterator<Item = &u8> = match bytes.len() {
        36 => {
            if [8, 13, 18, 23].iter().any(|&i| bytes[i] != b'-') {
                return None;
            }
            &mut bytes.iter().filter(|&&b| b != b'-')
        }
        32 => &mut bytes.iter(),
        _ => return None,
    };
    let mut value: u128 = 0;
    let mut count = 0;
    for &b in hex_digits {
        let digit = (b as char).to_digit(16)?;
        value = (value << 4) | u128::from(digit);
        count += 1;
    }
    (count == 32).then_some(value)
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
