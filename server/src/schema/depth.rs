//! The one depth bound of every JSON value a view takes, typed or not.
//!
//! A value nested deeper than [`MAX_DEPTH`] arrays and objects is refused when it is published:
//! most JSON parsers — the clients' among them — refuse or overflow on such a value, so a view
//! that took it would serve what its readers cannot read. A typed view's check reads a value
//! only once it is known to be within the bound, with `serde_json`'s own recursion limit (which
//! stops one level short of it) lifted.

/// The most arrays and objects a view's JSON value may open inside one another: `[[1]]` is
/// nested 2 deep, a scalar 0.
pub const MAX_DEPTH: usize = 128;

/// Whether `text`, read as JSON, opens more than [`MAX_DEPTH`] arrays and objects inside one
/// another. Brackets inside strings do not count. The text need not be valid JSON: whoever asks
/// decides that (text that is not JSON is not a JSON value, whatever its brackets).
pub fn too_deep(text: &[u8]) -> bool {
    // Each level takes a byte: a shorter text cannot be too deep.
    if text.len() <= MAX_DEPTH {
        return false;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &byte in text {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn the_bound_counts_arrays_and_objects_not_brackets_in_strings() {
        assert!(!too_deep(nested(MAX_DEPTH).as_bytes()));
        assert!(too_deep(nested(MAX_DEPTH + 1).as_bytes()));
        assert!(too_deep(nested(200_000).as_bytes()));
        let objects = format!(
            "{}1{}",
            "{\"a\":".repeat(MAX_DEPTH + 1),
            "}".repeat(MAX_DEPTH + 1)
        );
        assert!(too_deep(objects.as_bytes()));
        // Wide is not deep: siblings close before the next opens.
        let wide = format!("[{}]", vec!["[[1]]"; 1_000].join(","));
        assert!(!too_deep(wide.as_bytes()));
        // Brackets in strings, escaped quotes among them, are text.
        let text = format!("\"\\\"{}\"", "[".repeat(1_000));
        assert!(!too_deep(text.as_bytes()));
    }

    #[test]
    fn serde_json_reads_every_value_within_the_bound() {
        for depth in [MAX_DEPTH - 1, MAX_DEPTH] {
            let text = nested(depth);
            let mut reader = serde_json::Deserializer::from_str(&text);
            reader.disable_recursion_limit();
            let value: serde_json::Value = serde::Deserialize::deserialize(&mut reader).unwrap();
            assert!(value.is_array());
        }
    }
}
