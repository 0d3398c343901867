//! Text for messages and reprs, written the way Python writes it, so that what Rust reports
//! reads like what Python would.

/// `text` quoted the way Python's `repr` quotes a str.
pub fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod tests {
    use super::quoted;

    #[test]
    fn quotes_like_python_repr() {
        assert_eq!(quoted("a"), "'a'");
        assert_eq!(quoted(r"it's a\b"), r"'it\'s a\\b'");
    }
}
