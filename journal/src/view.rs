//! View names, validated once at the edge.

use std::fmt;

/// A view name: 1–128 bytes of `[A-Za-z0-9._-]`.
///
/// The journal accepts any `&str`; servers validate names from the outside
/// world once, with this type, and pass the inner string on.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ViewName(String);

/// Why a text is not a [`ViewName`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a view name is 1-128 bytes of A-Z, a-z, 0-9, '.', '_' or '-'")]
pub struct ViewNameError;

impl ViewName {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`ViewNameError`] when `name` is empty, longer than 128 bytes, or has
    /// a byte outside `[A-Za-z0-9._-]`.
    pub fn new(name: &str) -> Result<Self, ViewNameError> {
        let valid = (1..=128).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if valid {
            Ok(Self(name.to_owned()))
        } else {
            Err(ViewNameError)
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ViewName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_names() {
        assert!(ViewName::new("prices").is_ok());
        assert!(ViewName::new("a.b_c-D9").is_ok());
        assert!(ViewName::new(&"x".repeat(128)).is_ok());
        for bad in ["", "a b", "a/b", "é", "a\n"] {
            assert_eq!(ViewName::new(bad), Err(ViewNameError), "{bad:?}");
        }
        assert!(ViewName::new(&"x".repeat(129)).is_err());
    }
}
