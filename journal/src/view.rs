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

/// What a runtime declares it publishes to: one view (`orders`), or every view whose name
/// starts with a prefix (`chat.*`, a *pattern*: the prefix, then `*`).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum ViewClaim {
    /// Exactly this view.
    Exact(ViewName),
    /// Every view whose name starts with this prefix (which may be empty: `*`).
    Pattern(String),
}

/// Why a text is not a [`ViewClaim`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a view is 1-128 bytes of A-Z, a-z, 0-9, '.', '_' or '-', or such a prefix then '*' (a pattern)")]
pub struct ViewClaimError;

impl ViewClaim {
    /// Reads `text`: a view name, or a prefix of one followed by `*`.
    ///
    /// # Errors
    /// [`ViewClaimError`] when `text` is neither.
    pub fn new(text: &str) -> Result<Self, ViewClaimError> {
        match text.strip_suffix('*') {
            Some("") => Ok(Self::Pattern(String::new())),
            Some(prefix) => ViewName::new(prefix)
                .map(|_| Self::Pattern(prefix.to_owned()))
                .map_err(|_| ViewClaimError),
            None => ViewName::new(text)
                .map(Self::Exact)
                .map_err(|_| ViewClaimError),
        }
    }

    /// Whether it takes the view `view`.
    pub fn takes(&self, view: &str) -> bool {
        match self {
            Self::Exact(name) => name.as_str() == view,
            Self::Pattern(prefix) => view.starts_with(prefix.as_str()),
        }
    }

    /// Whether some view is taken by both.
    pub fn overlaps(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Exact(a), b) => b.takes(a.as_str()),
            (a, Self::Exact(b)) => a.takes(b.as_str()),
            (Self::Pattern(a), Self::Pattern(b)) => {
                a.starts_with(b.as_str()) || b.starts_with(a.as_str())
            }
        }
    }

    /// Whether it is a pattern.
    pub fn is_pattern(&self) -> bool {
        matches!(self, Self::Pattern(_))
    }

    /// Whether some claim of `claims`, given as text (unreadable ones take nothing), takes
    /// `view`.
    pub fn any_takes<S: AsRef<str>>(claims: &[S], view: &str) -> bool {
        claims
            .iter()
            .any(|claim| match claim.as_ref().strip_suffix('*') {
                Some(prefix) => view.starts_with(prefix),
                None => claim.as_ref() == view,
            })
    }
}

impl fmt::Display for ViewClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(name) => f.write_str(name.as_str()),
            Self::Pattern(prefix) => write!(f, "{prefix}*"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_take_views_and_overlap() {
        let claim = |text: &str| ViewClaim::new(text).unwrap();
        assert!(claim("chat.*").takes("chat.room-7"));
        assert!(claim("chat.*").takes("chat."));
        assert!(!claim("chat.*").takes("chats"));
        assert!(claim("orders").takes("orders"));
        assert!(!claim("orders").takes("orders2"));
        assert!(claim("*").takes("anything"));
        assert!(claim("chat.*").overlaps(&claim("chat.room-1")));
        assert!(claim("chat.*").overlaps(&claim("chat.vip.*")));
        assert!(claim("chat.vip.*").overlaps(&claim("chat.*")));
        assert!(!claim("chat.*").overlaps(&claim("news.*")));
        assert!(!claim("chat.*").overlaps(&claim("chat")));
        assert!(claim("a").overlaps(&claim("a")));
        assert!(!claim("a").overlaps(&claim("b")));
        for bad in ["", "a b*", "a*b", "**", "a/*"] {
            assert_eq!(ViewClaim::new(bad), Err(ViewClaimError), "{bad:?}");
        }
        assert!(ViewClaim::any_takes(&["x", "chat.*"], "chat.1"));
        assert!(!ViewClaim::any_takes(&["x", "chat.*"], "chat"));
        assert_eq!(claim("chat.*").to_string(), "chat.*");
    }

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
