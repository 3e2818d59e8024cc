//! Narrowed reads: the keys of a view a stream or a state read carries.
//!
//! `?keys=A,B` (at most [`MAX_KEYS`] keys) or `?prefix=P` narrow `GET /views/{view}/events` and
//! `GET /views/{view}` to those keys. Cursors stay the view's cursors: a narrowed stream follows
//! the view's tape, sends only the events of its keys and passes over the others, so it resumes
//! exactly from any cursor of the view, and every reset rule holds as for a full stream.
//!
//! A token's grant may be narrowed the same way (`prices?prefix=EU-`, see the `auth` module): the
//! text after its `?` is read by [`Narrow::from_query`], and [`Narrow::granted`] decides what a
//! read under such grants carries — its own narrowing when the grants cover it, else theirs.

use std::collections::BTreeSet;
use std::fmt;

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
    /// A narrowing written as text is not one `keys=A,B` or `prefix=P`.
    #[error("a narrowing is one keys=A,B or prefix=P, not {0:?}")]
    NotAQuery(String),
}

/// Why a read is not within its grants (see [`Narrow::granted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotGranted {
    /// It asks for keys no grant covers.
    Outside,
    /// It does not narrow itself, and its grants are narrowed in ways no one narrowing joins
    /// (two prefixes, say): it must narrow itself within them.
    Unjoinable,
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

    /// From a narrowing written as text: `keys=A,B` or `prefix=P`, what follows the `?` of a
    /// grant such as `prices?prefix=EU-`. The value is taken as written (not URL-decoded), so a
    /// key or prefix holding `&` cannot be granted this way: `&` is refused, not guessed at.
    ///
    /// # Errors
    /// [`NarrowError::NotAQuery`] for anything else; otherwise as [`Narrow::parse`].
    pub fn from_query(query: &str) -> Result<Self, NarrowError> {
        if query.contains('&') {
            return Err(NarrowError::NotAQuery(query.to_owned()));
        }
        match query.split_once('=') {
            Some(("keys", list)) => Self::parse(Some(list), None),
            Some(("prefix", prefix)) => Self::parse(None, Some(prefix)),
            _ => Err(NarrowError::NotAQuery(query.to_owned())),
        }
    }

    /// Whether every key `other` carries, this carries too: a prefix covers the prefixes that
    /// extend it and the keys that start with it; keys cover the keys among them; a key list
    /// never covers a prefix.
    pub fn covers(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::All, _) => true,
            (_, Self::All) | (Self::Keys(_), Self::Prefix(_)) => false,
            (Self::Prefix(mine), Self::Prefix(theirs)) => theirs.starts_with(mine.as_str()),
            (_, Self::Keys(keys)) => keys.iter().all(|key| self.keeps(key)),
        }
    }

    /// The one narrowing that carries exactly the keys of all of `narrows`, when there is one:
    /// every key if one carries every key; a prefix that the others' prefixes extend and whose
    /// keys start with it; else, without prefixes, all their keys. `None` for two prefixes
    /// neither of which extends the other, or a prefix and keys outside it (and for none).
    pub fn union<'a>(narrows: impl IntoIterator<Item = &'a Self>) -> Option<Self> {
        let mut prefixes: Vec<&str> = Vec::new();
        let mut keys = BTreeSet::new();
        for narrow in narrows {
            match narrow {
                Self::All => return Some(Self::All),
                Self::Keys(some) => keys.extend(some.iter().cloned()),
                Self::Prefix(prefix) => prefixes.push(prefix),
            }
        }
        prefixes.sort_unstable();
        prefixes.dedup();
        // A prefix that extends another adds no key.
        let shortest: Vec<&str> = prefixes
            .iter()
            .copied()
            .filter(|p| !prefixes.iter().any(|q| q != p && p.starts_with(q)))
            .collect();
        keys.retain(|key: &String| !shortest.iter().any(|p| key.starts_with(p)));
        match (shortest.as_slice(), keys.is_empty()) {
            ([], false) => Some(Self::Keys(keys)),
            ([prefix], true) => Some(Self::Prefix((*prefix).to_owned())),
            _ => None,
        }
    }

    /// What a read asking for `self` carries under `grants`, the narrowings of every grant
    /// that lets it read the view (at least one): itself, when they cover it — every key of a
    /// `?keys=` in one of them, a `?prefix=` extending one of theirs; without a narrowing of its
    /// own, theirs, joined into one ([`Narrow::union`]).
    ///
    /// # Errors
    /// [`NotGranted::Outside`]: it asks for a key (or a prefix) none covers (or `grants` is
    /// empty); [`NotGranted::Unjoinable`]: it asks for every key and the grants do not join.
    pub fn granted(self, grants: &[&Self]) -> Result<Self, NotGranted> {
        match &self {
            _ if grants.is_empty() => Err(NotGranted::Outside),
            Self::All => Self::union(grants.iter().copied()).ok_or(NotGranted::Unjoinable),
            Self::Keys(keys) if keys.iter().all(|k| grants.iter().any(|g| g.keeps(k))) => Ok(self),
            Self::Prefix(_) if grants.iter().any(|g| g.covers(&self)) => Ok(self),
            Self::Keys(_) | Self::Prefix(_) => Err(NotGranted::Outside),
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

/// As written in a query: `?keys=A,B`, `?prefix=P`; every key: `every key`.
impl fmt::Display for Narrow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("every key"),
            Self::Keys(keys) => {
                f.write_str("?keys=")?;
                for (i, key) in keys.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    f.write_str(key)?;
                }
                Ok(())
            }
            Self::Prefix(prefix) => write!(f, "?prefix={prefix}"),
        }
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

    fn keys(list: &[&str]) -> Narrow {
        Narrow::Keys(list.iter().map(|k| (*k).to_owned()).collect())
    }

    fn prefix(p: &str) -> Narrow {
        Narrow::Prefix(p.to_owned())
    }

    #[test]
    fn a_narrowing_written_as_text_is_read_like_the_query() {
        assert_eq!(Narrow::from_query("prefix=EU-"), Ok(prefix("EU-")));
        assert_eq!(Narrow::from_query("keys=A,B"), Ok(keys(&["A", "B"])));
        // The value as written: `=` in it is part of it.
        assert_eq!(Narrow::from_query("prefix=a=b"), Ok(prefix("a=b")));
        for bad in [
            "",
            "prefix",
            "keys",
            "foo=1",
            "prefix=EU-&keys=A",
            "Prefix=EU-",
        ] {
            assert!(
                matches!(Narrow::from_query(bad), Err(NarrowError::NotAQuery(_))),
                "{bad:?}"
            );
        }
        assert_eq!(Narrow::from_query("prefix="), Err(NarrowError::EmptyPrefix));
        assert_eq!(Narrow::from_query("keys=A,,B"), Err(NarrowError::EmptyKey));
        for narrow in [prefix("EU-"), keys(&["A", "B"])] {
            let text = narrow.to_string();
            assert_eq!(Narrow::from_query(&text[1..]), Ok(narrow), "{text}");
        }
    }

    #[test]
    fn covers_and_unions() {
        assert!(Narrow::All.covers(&Narrow::All) && Narrow::All.covers(&prefix("a")));
        assert!(!prefix("a").covers(&Narrow::All) && !keys(&["a"]).covers(&Narrow::All));
        assert!(prefix("EU-").covers(&prefix("EU-DE")) && prefix("EU-").covers(&prefix("EU-")));
        assert!(!prefix("EU-DE").covers(&prefix("EU-")) && !prefix("EU-").covers(&prefix("US")));
        assert!(prefix("EU-").covers(&keys(&["EU-1", "EU-2"])));
        assert!(!prefix("EU-").covers(&keys(&["EU-1", "US-1"])));
        assert!(
            keys(&["A", "B"]).covers(&keys(&["A"])) && !keys(&["A"]).covers(&keys(&["A", "B"]))
        );
        assert!(!keys(&["EU-1"]).covers(&prefix("EU-1")));

        assert_eq!(Narrow::union(std::iter::empty()), None);
        assert_eq!(
            Narrow::union([&prefix("a"), &Narrow::All]),
            Some(Narrow::All)
        );
        assert_eq!(
            Narrow::union([&keys(&["A"]), &keys(&["B"])]),
            Some(keys(&["A", "B"]))
        );
        assert_eq!(
            Narrow::union([&prefix("EU-DE"), &prefix("EU-"), &keys(&["EU-1"])]),
            Some(prefix("EU-"))
        );
        assert_eq!(Narrow::union([&prefix("EU-"), &prefix("US-")]), None);
        assert_eq!(Narrow::union([&prefix("EU-"), &keys(&["US-1"])]), None);
    }

    #[test]
    fn a_read_is_granted_within_its_grants_or_narrowed_by_them() {
        let eu = prefix("EU-");
        let acme = keys(&["ACME", "BOLT"]);
        // Without a narrowing of its own: the grant's.
        assert_eq!(Narrow::All.granted(&[&eu]), Ok(eu.clone()));
        assert_eq!(Narrow::All.granted(&[&eu, &Narrow::All]), Ok(Narrow::All));
        assert_eq!(
            Narrow::All.granted(&[&eu, &acme]),
            Err(NotGranted::Unjoinable)
        );
        assert_eq!(Narrow::All.granted(&[]), Err(NotGranted::Outside));
        // Its own, within them.
        assert_eq!(prefix("EU-DE").granted(&[&eu]), Ok(prefix("EU-DE")));
        assert_eq!(
            keys(&["EU-1", "ACME"]).granted(&[&eu, &acme]),
            Ok(keys(&["EU-1", "ACME"]))
        );
        assert_eq!(
            prefix("US-").granted(&[&eu, &acme]),
            Err(NotGranted::Outside)
        );
        assert_eq!(prefix("E").granted(&[&eu]), Err(NotGranted::Outside));
        assert_eq!(
            keys(&["EU-1", "US-1"]).granted(&[&eu]),
            Err(NotGranted::Outside)
        );
        assert_eq!(prefix("AC").granted(&[&acme]), Err(NotGranted::Outside));
        assert_eq!(prefix("US-").granted(&[&Narrow::All]), Ok(prefix("US-")));
    }
}
