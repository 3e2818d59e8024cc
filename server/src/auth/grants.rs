//! What a token grants: exact names and prefixes of views or runtimes, maybe narrowed to some
//! keys.

use crate::hub::narrow::Narrow;

/// Names a grant covers: exact names, or prefixes written with a trailing `*`; each maybe
/// narrowed to some keys of what it names by a query after a `?` — `prices?prefix=EU-`,
/// `prices?keys=ACME,BOLT`, `orders.*?prefix=EU-` — read by [`Narrow::from_query`] with the
/// rules of `?keys=`/`?prefix=` on a read (at most 100 keys; the value as written, not
/// URL-decoded, without `&`). An entry whose narrowing does not read grants nothing (it fails
/// closed, and is logged).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants(Vec<Grant>);

/// One entry of [`Grants`].
#[derive(Clone, Debug, PartialEq, Eq)]
struct Grant {
    /// An exact name, or a prefix with a trailing `*`.
    pattern: String,
    /// The keys of what it names that it grants.
    narrow: Narrow,
}

impl Grant {
    fn names(&self, name: &str) -> bool {
        match self.pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => self.pattern == name,
        }
    }
}

impl Grants {
    /// Grants of these entries; see [`Grants`].
    pub fn new(entries: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self(
            entries
                .into_iter()
                .filter_map(|entry| {
                    let entry: String = entry.into();
                    let Some((pattern, query)) = entry.split_once('?') else {
                        return Some(Grant {
                            pattern: entry,
                            narrow: Narrow::All,
                        });
                    };
                    match Narrow::from_query(query) {
                        Ok(narrow) => Some(Grant {
                            pattern: pattern.to_owned(),
                            narrow,
                        }),
                        Err(error) => {
                            tracing::warn!(grant = %entry, %error, "a grant entry that narrows in a way this server does not read grants nothing");
                            None
                        }
                    }
                })
                .collect(),
        )
    }

    /// Whether all of `name` is granted: an entry names it without a narrowing (the one
    /// question for `ingest`, which cannot be narrowed).
    pub fn allows(&self, name: &str) -> bool {
        self.narrowings(name).any(Narrow::is_all)
    }

    /// The narrowing of every entry that names `name` ([`Narrow::All`] for one without): none
    /// when it is not granted at all.
    pub fn narrowings<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Narrow> + 'a {
        self.0
            .iter()
            .filter(move |grant| grant.names(name))
            .map(|grant| &grant.narrow)
    }
}

/// What a valid token grants, and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// Views it may read.
    pub views: Grants,
    /// Runtimes it may push to.
    pub ingest: Grants,
    /// Its `exp`, Unix seconds.
    pub expires_at: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_match_exact_names_and_prefixes() {
        let grants = Grants::new(["prices", "orders.*"]);
        assert!(grants.allows("prices") && grants.allows("orders.eu") && grants.allows("orders."));
        assert!(!grants.allows("prices2") && !grants.allows("order") && !grants.allows(""));
        assert!(Grants::new(["*"]).allows("anything"));
    }

    #[test]
    fn grants_may_be_narrowed_to_some_keys() {
        let grants = Grants::new([
            "prices?prefix=EU-",
            "prices?keys=ACME,BOLT",
            "orders.*?prefix=DE",
            "quotes",
        ]);
        let of = |name| grants.narrowings(name).cloned().collect::<Vec<_>>();
        assert_eq!(
            of("prices"),
            [
                Narrow::Prefix("EU-".into()),
                Narrow::Keys(["ACME".to_owned(), "BOLT".to_owned()].into())
            ]
        );
        assert_eq!(of("orders.eu"), [Narrow::Prefix("DE".into())]);
        assert_eq!(of("quotes"), [Narrow::All]);
        assert!(of("prices2").is_empty() && of("orders").is_empty());
        // Narrowed entries name the view, but do not grant all of it.
        assert!(!grants.allows("prices") && !grants.allows("orders.eu"));
        assert!(grants.allows("quotes"));

        // An entry whose narrowing does not read grants nothing: not the view, not a view of
        // that literal name.
        for bad in [
            "prices?",
            "prices?prefix=",
            "prices?keys=",
            "prices?keys=A,,B",
            "prices?prefix=EU-&keys=A",
            "prices?region=EU",
            "prices?prefix",
        ] {
            let grants = Grants::new([bad]);
            assert!(grants.narrowings("prices").next().is_none(), "{bad}");
            assert!(grants.narrowings(bad).next().is_none(), "{bad}");
        }
        let many: Vec<String> = (0..=crate::hub::narrow::MAX_KEYS)
            .map(|i| format!("k{i}"))
            .collect();
        let too_many = format!("prices?keys={}", many.join(","));
        assert!(Grants::new([too_many])
            .narrowings("prices")
            .next()
            .is_none());
        // The value as written: a `?` or `=` after the first belongs to it.
        assert_eq!(
            Grants::new(["prices?prefix=a?b=c"])
                .narrowings("prices")
                .collect::<Vec<_>>(),
            [&Narrow::Prefix("a?b=c".into())]
        );
    }
}
