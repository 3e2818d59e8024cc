//! Narrowed reads: the keys of a view a stream or a state read carries.
//!
//! `?keys=A,B` (at most [`MAX_KEYS`] keys) or `?prefix=P` narrow `GET /views/{view}/events` and
//! `GET /views/{view}` to those keys. Cursors stay the view's cursors: a narrowed stream follows
//! the view's tape, sends only the events of its keys and passes over the others, so it resumes
//! exactly from any cursor of the view, and every reset rule holds as for a full stream.

use std::collections::BTreeSet;

/// Most keys one `?keys=` names.
pub const MAX_KEYS: usize = 100;

/// Which keys a read carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Narrow {
    /// Every key.
    #[default]
    All,
    /// Only these keys.
    Keys(BTreeSet<String>),
    /// Only the keys that start with this.
    Prefix(String),
}

/// A `?keys=`/`?prefix=` that cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NarrowError {
    /// Both were given.
    #[error("give ?keys= or ?prefix=, not both")]
    Both,
    /// An empty key list, or an empty key in it.
    #[error("?keys= names no key, or an empty one (keys are separated by commas)")]
    EmptyKey,
    /// Past [`MAX_KEYS`].
    #[error("?keys= names {0} keys; at most {MAX_KEYS}")]
    TooMany(usize),
    /// An empty prefix (which would narrow nothing: leave it out).
    #[error("?prefix= is empty; leave it out to read every key")]
    EmptyPrefix,
}

impl Narrow {
    /// From the query's `keys` (comma-separated) and `prefix`.
    ///
    /// # Errors
    /// [`NarrowError`]: both given, an empty key or prefix, too many keys.
    pub fn parse(keys: Option<&str>, prefix: Option<&str>) -> Result<Self, NarrowError> {
        match (keys, prefix) {
            (None, None) => Ok(Self::All),
            (Some(_), Some(_)) => Err(NarrowError::Both),
            (Some(list), None) => {
                let keys: BTreeSet<String> = list.split(',').map(str::to_owned).collect();
                if keys.contains("") {
                    return Err(NarrowError::EmptyKey);
                }
                if keys.len() > MAX_KEYS {
                    return Err(NarrowError::TooMany(keys.len()));
                }
                Ok(Self::Keys(keys))
            }
            (None, Some("")) => Err(NarrowError::EmptyPrefix),
            (None, Some(prefix)) => Ok(Self::Prefix(prefix.to_owned())),
        }
    }

    /// Whether the read carries `key`.
    pub fn keeps(&self, key: &str) -> bool {
        match self {
            Self::All => true,
            Self::Keys(keys) => keys.contains(key),
            Self::Prefix(prefix) => key.starts_with(prefix.as_str()),
        }
    }

    /// Whether it carries every key.
    pub fn is_all(&self) -> bool {
        matches!(self, Self::All)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_prefixes_narrow_and_bad_ones_are_refused() {
        let all = Narrow::parse(None, None).unwrap();
        assert!(all.is_all() && all.keeps("anything"));
        let keys = Narrow::parse(Some("ACME,BOLT"), None).unwrap();
        assert!(keys.keeps("ACME") && keys.keeps("BOLT"));
        assert!(!keys.keeps("ACM") && !keys.keeps("CRUX") && !keys.is_all());
        let prefix = Narrow::parse(None, Some("EU-")).unwrap();
        assert!(prefix.keeps("EU-1") && prefix.keeps("EU-") && !prefix.keeps("US-1"));
        assert_eq!(Narrow::parse(Some("A"), Some("B")), Err(NarrowError::Both));
        for empty in ["", "A,", ",A", "A,,B"] {
            assert_eq!(Narrow::parse(Some(empty), None), Err(NarrowError::EmptyKey));
        }
        assert_eq!(Narrow::parse(None, Some("")), Err(NarrowError::EmptyPrefix));
        let many: Vec<String> = (0..=MAX_KEYS).map(|i| format!("k{i}")).collect();
        assert_eq!(
            Narrow::parse(Some(&many.join(",")), None),
            Err(NarrowError::TooMany(MAX_KEYS + 1))
        );
        let most = many[..MAX_KEYS].join(",");
        assert!(Narrow::parse(Some(&most), None).is_ok());
    }
}
