//! Why a config file is refused, and where: the file, the line and the key.

use std::path::PathBuf;

use super::spans;

/// Why a config file was refused. Every message names the file and, when the file has the key at
/// all, its line and the key: `invalid config viewtape.toml, line 3, key server.retry: …`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read. The message names the file; why is its `source()`, which
    /// `viewtape` prints after it.
    #[error("cannot read config {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is refused: not TOML, a key unknown or of the wrong type, a value impossible, or
    /// a file it names (module, certificate, key) that does not load.
    #[error("invalid config {}{}: {message}", path.display(), Located(*line, key.as_deref()))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The line of the key (from 1).
        line: Option<usize>,
        /// The key, as a dotted path: `server.retry`, `runtime[0].limits.fuel`.
        key: Option<String>,
        /// What is wrong.
        message: String,
    },
}

/// `, line N, key K` as far as they are known.
struct Located<'a>(Option<usize>, Option<&'a str>);

impl std::fmt::Display for Located<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(line) = self.0 {
            write!(f, ", line {line}")?;
        }
        if let Some(key) = self.1 {
            write!(f, ", key {key}")?;
        }
        Ok(())
    }
}

/// What is wrong with a config, and at which key (a dotted path as [`ConfigError::Invalid`]
/// names it); the file's line is found from the key.
#[derive(Debug)]
pub struct Problem {
    /// The key.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

impl Problem {
    /// `message` about `key`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// A config file's text, for naming the lines of its keys.
#[derive(Debug)]
pub struct Source {
    pub(super) path: PathBuf,
    pub(super) spans: spans::Spans,
}

impl Source {
    /// The error for `problem`, with the file, the key and its line.
    pub fn error(&self, problem: Problem) -> ConfigError {
        // A key the file gives by its alias is named as written: `[[runtime]] wasm =`.
        let key = match problem.key.strip_suffix(".module") {
            Some(table)
                if !self.spans.has(&problem.key) && self.spans.has(&format!("{table}.wasm")) =>
            {
                format!("{table}.wasm")
            }
            _ => problem.key,
        };
        ConfigError::Invalid {
            path: self.path.clone(),
            line: self.spans.line_of(&key),
            key: Some(key),
            message: problem.message,
        }
    }
}
