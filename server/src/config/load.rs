//! Reading a config file: its syntax, keys and types, each refusal with the line and the key.

use std::path::Path;

use super::{spans, Config, ConfigError, Source};

impl Config {
    /// Reads and validates a config file: its syntax, keys, types and values. Relative paths in
    /// it are made relative to the file's directory (the `paths` module). What it names
    /// (modules, certificates, keys) is checked by the `check` module, above this one.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file, the line and the key.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_source(path).map(|(config, _)| config)
    }

    /// Like [`Config::load`], and the file's [`Source`] for naming the lines of later problems.
    ///
    /// # Errors
    /// See [`Config::load`].
    pub fn load_source(path: &Path) -> Result<(Self, Source), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let source = Source {
            path: path.to_owned(),
            spans: spans::Spans::of(&text),
        };
        let mut config: Self = toml::from_str(&text).map_err(|error| {
            let at = error.span().map(|span| span.start);
            let line = at.map(|at| source.spans.line_at(at));
            let message = error.message().trim_end().to_owned();
            let mut key = at.and_then(|at| source.spans.key_at(at)).map(str::to_owned);
            // A required key left out: the error is at its table; name the key itself.
            if let Some(missing) = key.as_deref().and_then(|t| missing_key(&source.spans, t)) {
                key = Some(missing);
            }
            let message = match (&key, line) {
                // Not TOML: no key to name, so show the line.
                (None, Some(line)) => match text.lines().nth(line - 1) {
                    Some(shown) => format!("{message}: `{}`", shown.trim()),
                    None => message,
                },
                _ => message,
            };
            ConfigError::Invalid {
                path: path.to_owned(),
                line,
                key,
                message,
            }
        })?;
        config.resolve_paths(path.parent().unwrap_or(Path::new("")));
        config.validate().map_err(|problem| source.error(problem))?;
        Ok((config, source))
    }
}

/// The keys a table of a config must have (the sections' fields without a default), by the
/// table's path with its indices left out.
const REQUIRED: [(&str, &[&str]); 2] = [
    ("runtime[]", &["name", "module"]),
    ("runtime[].source", &["file"]),
];

/// The first key the table at `path` (`runtime[0]`) must have and the file leaves out, as a
/// path (`runtime[0].module`); `None` when it has them all, or is no table that has any. A key
/// given by one of its aliases ([`ALIASES`]) is there.
fn missing_key(spans: &spans::Spans, path: &str) -> Option<String> {
    let mut shape = String::with_capacity(path.len());
    let mut in_index = false;
    for c in path.chars() {
        match c {
            '[' => in_index = true,
            ']' => in_index = false,
            _ if in_index => continue,
            _ => {}
        }
        shape.push(c);
    }
    let (_, required) = REQUIRED.iter().find(|(table, _)| *table == shape)?;
    if !spans.is_table(path) {
        return None;
    }
    required
        .iter()
        .find(|key| {
            let alias = ALIASES
                .iter()
                .find(|(name, _)| name == *key)
                .map(|(_, a)| a);
            !spans.has(&format!("{path}.{key}"))
                && !alias.is_some_and(|alias| spans.has(&format!("{path}.{alias}")))
        })
        .map(|key| format!("{path}.{key}"))
}

/// Keys a file may also give by another name: `[[runtime]] wasm =` is `module =`.
const ALIASES: [(&str, &str); 1] = [("module", "wasm")];

#[cfg(test)]
pub(super) mod tests {
    use std::time::Duration;

    use super::*;

    /// `text`, written to a file and loaded.
    pub(in crate::config) fn load(text: &str) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("viewtape.toml");
        std::fs::write(&path, text).unwrap();
        Config::load(&path)
    }

    #[test]
    fn parses_a_full_file() {
        let config = load(
            r#"
            [server]
            max_body = "2MiB"
            heartbeat = "5s"
            [journal]
            max_age = "10m"
            max_bytes_per_view = 1000
            [[runtime]]
            name = "demo"
            wasm = "builtin:ticker"
            views = ["prices"]
            [runtime.limits]
            memory = "32MiB"
            "#,
        )
        .unwrap();
        assert_eq!(config.server.max_body, 2 << 20);
        assert_eq!(config.server.heartbeat, Duration::from_secs(5));
        assert_eq!(config.journal.max_age, Duration::from_secs(600));
        assert_eq!(config.journal.max_bytes_per_view, 1000);
        assert_eq!(
            config.runtimes[0].limits.to_limits().max_memory_bytes,
            32 << 20
        );
    }

    #[test]
    fn a_runtime_names_its_module_with_module_or_its_alias_wasm() {
        for key in ["module", "wasm"] {
            let config = load(&format!(
                "[[runtime]]\nname = \"a\"\n{key} = \"builtin:ticker\"\nviews = [\"prices\"]\n"
            ))
            .unwrap();
            assert_eq!(config.runtimes[0].wasm, "builtin:ticker", "{key}");
        }
        let error = load("[[runtime]]\nname = \"a\"\nmodule = \"a.js\"\nwasm = \"b.js\"\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("duplicate field"), "{error}");
    }

    #[test]
    fn syntax_errors_name_the_line_and_the_key() {
        let error =
            load("[journal]\nmax_age = \"1h\"\nmax_records_per_view = \"many\"\n").unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("line 3, key journal.max_records_per_view: invalid type"),
            "{message}"
        );
        let error = load("[server]\nnope = 1\n").unwrap_err().to_string();
        assert!(
            error.contains("line 2, key server.nope: unknown field"),
            "{error}"
        );
        let error = load("\n[[runtime]]\nname = \"a\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("line 2, key runtime[0].module: missing field"),
            "{error}"
        );
        let error = load("[[runtime]]\nwasm = \"builtin:ticker\"\n[[runtime]]\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("line 1, key runtime[0].name: missing field"),
            "{error}"
        );
        let error =
            load("[[runtime]]\nname = \"a\"\nwasm = \"builtin:ticker\"\n[runtime.source]\n")
                .unwrap_err()
                .to_string();
        assert!(
            error.contains("line 4, key runtime[0].source.file: missing field"),
            "{error}"
        );
        // Not a table at all: the item is named, not a key of it.
        let error = load("runtime = [1]\n").unwrap_err().to_string();
        assert!(error.contains("key runtime[0]: invalid type"), "{error}");
        let error = load("[server\n").unwrap_err().to_string();
        assert!(
            error.contains("line 1: ") && error.contains("`[server`"),
            "{error}"
        );
    }
}
