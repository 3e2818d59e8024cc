//! Where a key is in a config file: every message about a file names its line and key.

use std::ops::Range;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// Every key of a file with where it and its value are, as dotted paths (`server.retry`,
/// `runtime[1].limits.fuel`).
#[derive(Debug, Default)]
pub(super) struct Spans {
    /// Path, the key's span, the value's span; parents before their children.
    keys: Vec<(String, Range<usize>, Range<usize>)>,
    /// The paths whose values are tables (`runtime[0]`, `runtime[0].source`).
    tables: Vec<String>,
    /// Byte offset of the start of every line.
    lines: Vec<usize>,
}

impl Spans {
    /// The keys of `text`; none when it is not TOML at all.
    pub(super) fn of(text: &str) -> Self {
        let mut spans = Self {
            keys: Vec::new(),
            tables: Vec::new(),
            lines: std::iter::once(0)
                .chain(text.match_indices('\n').map(|(i, _)| i + 1))
                .collect(),
        };
        if let Ok(table) = DeTable::parse(text) {
            spans.table("", table.get_ref());
        }
        spans
    }

    fn table(&mut self, prefix: &str, table: &DeTable<'_>) {
        for (key, value) in table {
            let path = match prefix {
                "" => key.get_ref().to_string(),
                _ => format!("{prefix}.{}", key.get_ref()),
            };
            self.keys.push((path.clone(), key.span(), value.span()));
            self.value(&path, value);
        }
    }

    fn value(&mut self, path: &str, value: &Spanned<DeValue<'_>>) {
        match value.get_ref() {
            DeValue::Table(table) => {
                self.tables.push(path.to_owned());
                self.table(path, table);
            }
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let path = format!("{path}[{i}]");
                    self.keys.push((path.clone(), item.span(), item.span()));
                    self.value(&path, item);
                }
            }
            _ => {}
        }
    }

    /// Every key's path, in the order of the file.
    #[cfg(test)]
    pub(super) fn paths(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|(path, _, _)| path.as_str())
    }

    /// Whether the file has the key `path`.
    pub(super) fn has(&self, path: &str) -> bool {
        self.keys.iter().any(|(p, _, _)| p == path)
    }

    /// Whether `path`'s value is a table.
    pub(super) fn is_table(&self, path: &str) -> bool {
        self.tables.iter().any(|table| table == path)
    }

    /// The line (from 1) holding byte `offset`.
    pub(super) fn line_at(&self, offset: usize) -> usize {
        self.lines.partition_point(|&start| start <= offset)
    }

    /// The innermost key whose name or value holds byte `offset`.
    pub(super) fn key_at(&self, offset: usize) -> Option<&str> {
        self.keys
            .iter()
            .rev()
            .find(|(_, key, value)| key.contains(&offset) || value.contains(&offset))
            .map(|(path, _, _)| path.as_str())
    }

    /// The line of `path`'s key (of its table header, for a table; of its nearest ancestor
    /// present in the file when it is not, e.g. a required key left out).
    pub(super) fn line_of(&self, path: &str) -> Option<usize> {
        let mut path = path;
        loop {
            if let Some((_, key, _)) = self.keys.iter().find(|(p, _, _)| p == path) {
                return Some(self.line_at(key.start));
            }
            path = &path[..path.rfind(['.', '['])?];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_lines() {
        let text = "[server]\nretry = \"2s\"\n\n[[runtime]]\nname = \"a\"\n[runtime.limits]\nfuel = 1\n[[runtime]]\nname = \"b\"\n";
        let spans = Spans::of(text);
        assert_eq!(spans.line_of("server.retry"), Some(2));
        assert_eq!(spans.line_of("runtime[0].limits.fuel"), Some(7));
        assert_eq!(spans.line_of("runtime[1].name"), Some(9));
        // Not in the file: its nearest ancestor that is.
        assert_eq!(
            spans.line_of("runtime[1].views"),
            spans.line_of("runtime[1]")
        );
        assert_eq!(spans.line_of("server.heartbeat"), Some(1));
        let fuel = text.find("fuel").unwrap();
        assert_eq!(spans.key_at(fuel), Some("runtime[0].limits.fuel"));
        assert_eq!(spans.line_at(fuel), 7);
    }
}
