//! A tiny `--flag value` parser (the tool has a handful of numeric options), plus a few
//! switches ([`SWITCHES`]) that take no value.

use std::collections::BTreeMap;
use std::str::FromStr;

use anyhow::{anyhow, bail, Context as _};

/// Flags that take no value (`--pin` means `--pin=true`); `--pin=false` turns one off.
pub const SWITCHES: [&str; 4] = ["compare", "io-uring", "narrow", "pin"];

/// Parsed `--name value` / `--name=value` pairs; repeated names keep every value.
#[derive(Debug, Default)]
pub struct Args {
    values: BTreeMap<String, Vec<String>>,
    used: std::cell::RefCell<Vec<String>>,
}

impl Args {
    /// Parses `args` (without the program name and subcommand).
    ///
    /// # Errors
    /// On a positional argument or a flag without a value.
    pub fn parse(args: &[String]) -> anyhow::Result<Self> {
        let mut values: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut iter = args.iter();
        while let Some(arg) = iter.next() {
            let Some(flag) = arg.strip_prefix("--") else {
                bail!("unexpected argument {arg:?}");
            };
            let (name, value) = match flag.split_once('=') {
                Some((name, value)) => (name.to_owned(), value.to_owned()),
                None if SWITCHES.contains(&flag) => (flag.to_owned(), "true".to_owned()),
                None => {
                    let value = iter
                        .next()
                        .ok_or_else(|| anyhow!("--{flag} needs a value"))?;
                    (flag.to_owned(), value.clone())
                }
            };
            values.entry(name).or_default().push(value);
        }
        Ok(Self {
            values,
            used: Default::default(),
        })
    }

    /// The last value of `--name`, parsed, or `default`; must lie in `min..=max`.
    ///
    /// # Errors
    /// When the value does not parse or is out of bounds.
    pub fn num<T>(&self, name: &str, default: T, min: T, max: T) -> anyhow::Result<T>
    where
        T: FromStr + PartialOrd + std::fmt::Display + Copy,
        T::Err: std::error::Error + Send + Sync + 'static,
    {
        let value = match self.get(name) {
            Some(text) => text.parse().with_context(|| format!("--{name} {text:?}"))?,
            None => default,
        };
        if value < min || value > max {
            bail!("--{name} {value} is outside {min}..={max}");
        }
        Ok(value)
    }

    /// Whether switch `--name` is on (absent: off).
    ///
    /// # Errors
    /// When its value is neither `true` nor `false`.
    pub fn switch(&self, name: &str) -> anyhow::Result<bool> {
        match self.get(name) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(other) => bail!("--{name}={other:?}: expected true or false"),
        }
    }

    /// The last value of `--name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.used.borrow_mut().push(name.to_owned());
        self.values
            .get(name)
            .and_then(|v| v.last())
            .map(String::as_str)
    }

    /// Every value of `--name`.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.used.borrow_mut().push(name.to_owned());
        self.values
            .get(name)
            .map(|v| v.iter().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// Fails on a flag nobody asked for (a typo must not silently run the default).
    ///
    /// # Errors
    /// Naming the unknown flags.
    pub fn finish(&self) -> anyhow::Result<()> {
        let used = self.used.borrow();
        let unknown: Vec<&String> = self.values.keys().filter(|k| !used.contains(k)).collect();
        if !unknown.is_empty() {
            bail!("unknown option(s): {unknown:?}");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Args {
        Args::parse(&s.split_whitespace().map(str::to_owned).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn parses_and_bounds() {
        let a = args("--rate 50 --seconds=3 --server-arg x --server-arg y");
        assert_eq!(a.num("rate", 1u64, 1, 100).unwrap(), 50);
        assert_eq!(a.num("seconds", 1u64, 1, 10).unwrap(), 3);
        assert_eq!(a.num("subscribers", 7usize, 1, 10).unwrap(), 7);
        assert!(a.num("rate", 1u64, 1, 10).is_err());
        assert_eq!(a.all("server-arg"), vec!["x", "y"]);
        a.finish().unwrap();
        let b = args("--nope 1");
        assert!(b.finish().is_err());
        assert!(Args::parse(&["pos".to_owned()]).is_err());
        assert!(Args::parse(&["--rate".to_owned()]).is_err());
        let c = args("--compare --seconds 5 --pin=false");
        assert!(c.switch("compare").unwrap());
        assert!(!c.switch("pin").unwrap());
        assert_eq!(c.num("seconds", 1u64, 1, 10).unwrap(), 5);
        assert!(!c.switch("nothing").unwrap());
        assert!(args("--pin=maybe").switch("pin").is_err());
    }
}
