//! Byte sizes in a config: an integer, or a string such as `"64MiB"`.

use serde::{Deserialize, Deserializer};

/// A byte size: an integer, or a string such as `"64MiB"`, `"512 KiB"`, `"1MB"`.
pub(super) fn byte_size<'de, D: Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Number(usize),
        Text(String),
    }
    match Size::deserialize(deserializer)? {
        Size::Number(n) => Ok(n),
        Size::Text(text) => parse_byte_size(&text).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{text:?} is not a byte size (use e.g. 1048576, \"512KiB\", \"64MiB\", \"1GB\")"
            ))
        }),
    }
}

fn parse_byte_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: usize = number.parse().ok()?;
    let multiplier: usize = match unit.trim() {
        "" | "B" => 1,
        "KB" | "kB" => 1_000,
        "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "GiB" => 1 << 30,
        _ => return None,
    };
    number.checked_mul(multiplier)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_byte_size("64MiB"), Some(64 << 20));
        assert_eq!(parse_byte_size("1 KB"), Some(1000));
        assert_eq!(parse_byte_size("12"), Some(12));
        assert_eq!(parse_byte_size("1.5MiB"), None);
        assert_eq!(parse_byte_size("99999999999999999999GiB"), None);
    }
}
