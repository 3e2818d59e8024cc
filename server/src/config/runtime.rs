//! `[[runtime]]`: a guest to host, its limits, its pull source and the schemas of its views.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::size::byte_size;
use super::Problem;
use crate::host::{Limits, ModuleFingerprint};
use crate::log::Definition;
use crate::schema::{ConfiguredSchemas, ViewSchema};

/// The built-in guests, by the name a config uses after `builtin:`.
pub const BUILTIN_GUESTS: [(&str, &[u8]); 3] = [
    ("ticker", crate::host::guests::TICKER_WASM),
    ("logstats", crate::host::guests::LOGSTATS_WASM),
    ("json", crate::host::guests::JSON_WASM),
];

/// `[[runtime]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSection {
    /// The runtime's name (ingest URL, logs, metrics).
    pub name: String,
    /// `module =`: `builtin:<guest>`, or a path to a `.wasm` file (a WebAssembly guest) or a
    /// `.js` file (a JavaScript guest). `wasm =` is an alias.
    #[serde(rename = "module", alias = "wasm")]
    pub wasm: String,
    /// Views that exist from the start.
    #[serde(default)]
    pub views: Vec<String>,
    /// Bytes handed to the guest's `init`.
    #[serde(default)]
    pub config: String,
    /// JSON Schema files that type some of its views (`{ prices = "prices.schema.json" }`),
    /// over what the guest declares: every value published to such a view must fit.
    #[serde(default)]
    pub schemas: std::collections::BTreeMap<String, PathBuf>,
    /// Limits.
    #[serde(default)]
    pub limits: LimitsSection,
    /// An optional pull source.
    #[serde(default)]
    pub source: Option<SourceSection>,
}

/// The keys of `[runtime.limits]`.
const LIMIT_KEYS: [&str; 5] = ["memory", "fuel", "batch_timeout", "max_batch", "max_event"];

/// `[runtime.limits]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    /// Largest linear memory.
    #[serde(deserialize_with = "byte_size")]
    pub memory: usize,
    /// CPU per call into the guest, in fuel.
    pub fuel: u64,
    /// Wall-clock backstop per call.
    #[serde(with = "humantime_serde")]
    pub batch_timeout: Duration,
    /// Largest batch.
    #[serde(deserialize_with = "byte_size")]
    pub max_batch: usize,
    /// Largest event payload.
    #[serde(deserialize_with = "byte_size")]
    pub max_event: usize,
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self::from_limits(&Limits::default())
    }
}

impl LimitsSection {
    /// `limits` as a config writes them.
    pub fn from_limits(limits: &Limits) -> Self {
        Self {
            memory: limits.max_memory_bytes,
            fuel: limits.fuel,
            batch_timeout: limits.batch_timeout,
            max_batch: limits.max_batch_bytes,
            max_event: limits.max_event_bytes,
        }
    }

    /// The limits a JSON object gives (the `limits` of `PUT /admin/runtimes/{runtime}`): each
    /// key read as a config file's, an absent one at its default; then [checked](Self::check).
    /// Read key by key, so that a refusal names its key and says what it takes in our words.
    ///
    /// # Errors
    /// A [`Problem`] at `limits` when `value` is not an object (an array is not read by
    /// position), at `limits.KEY` for a key that is unknown, of the wrong type or impossible.
    pub fn from_json(value: serde_json::Value) -> Result<Self, Problem> {
        let serde_json::Value::Object(object) = value else {
            return Err(Problem::new(
                "limits",
                format!("expected an object of limits ({})", LIMIT_KEYS.join(", ")),
            ));
        };
        let mut limits = Self::default();
        for (key, value) in object {
            let read = match key.as_str() {
                "memory" => byte_size(value).map(|n| limits.memory = n),
                "fuel" => u64::deserialize(value).map(|n| limits.fuel = n),
                "batch_timeout" => {
                    humantime_serde::deserialize(value).map(|d| limits.batch_timeout = d)
                }
                "max_batch" => byte_size(value).map(|n| limits.max_batch = n),
                "max_event" => byte_size(value).map(|n| limits.max_event = n),
                _ => {
                    let key: String = key.chars().take(64).collect();
                    return Err(Problem::new(
                        format!("limits.{key}"),
                        format!("unknown limit (limits are {})", LIMIT_KEYS.join(", ")),
                    ));
                }
            };
            if read.is_err() {
                let expected = match key.as_str() {
                    "fuel" => "expected a whole number of fuel units",
                    "batch_timeout" => "expected a duration such as \"1s\" or \"250ms\"",
                    _ => "expected a byte size: a whole number of bytes, or a string such as \"512KiB\" or \"64MiB\"",
                };
                return Err(Problem::new(format!("limits.{key}"), expected));
            }
        }
        limits.check()?;
        Ok(limits)
    }

    /// Checks what parses but cannot run: no fuel, or a `batch_timeout` that is not a whole
    /// number of milliseconds of at least one (a runtime's definition keeps milliseconds: a
    /// finer one would be cut, `"500us"` to nothing, and read back as what it was not).
    ///
    /// # Errors
    /// A [`Problem`] at `limits.fuel` or `limits.batch_timeout`, its message naming neither the
    /// runtime nor the file.
    pub fn check(&self) -> Result<(), Problem> {
        if self.fuel == 0 {
            return Err(Problem::new("limits.fuel", "fuel must be above zero"));
        }
        let timeout = self.batch_timeout;
        if timeout < Duration::from_millis(1) || !timeout.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(Problem::new(
                "limits.batch_timeout",
                format!(
                    "batch_timeout must be a whole number of milliseconds, at least 1ms (not {})",
                    humantime_serde::re::humantime::format_duration(timeout)
                ),
            ));
        }
        Ok(())
    }

    /// The host's limits.
    pub fn to_limits(&self) -> Limits {
        Limits {
            max_memory_bytes: self.memory,
            fuel: self.fuel,
            batch_timeout: self.batch_timeout,
            max_batch_bytes: self.max_batch,
            max_event_bytes: self.max_event,
        }
    }
}

/// `[runtime.source]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSection {
    /// Follow this file like `tail -F`.
    pub file: PathBuf,
}

impl RuntimeSection {
    /// The guest module's bytes.
    ///
    /// # Errors
    /// The module's file cannot be read.
    pub fn wasm_bytes(&self) -> std::io::Result<Vec<u8>> {
        match self.wasm.strip_prefix("builtin:") {
            Some(builtin) => Ok(BUILTIN_GUESTS
                .iter()
                .find(|(name, _)| *name == builtin)
                .map(|(_, bytes)| bytes.to_vec())
                .unwrap_or_default()),
            None => std::fs::read(&self.wasm),
        }
    }

    /// The bytes handed to the guest's `init` ([`crate::log::guest_config`]).
    pub fn guest_config(&self) -> Vec<u8> {
        crate::log::guest_config(&self.wasm, &self.views, &self.config)
    }

    /// The runtime as a [`Definition`], its module being `module` (the bytes of `wasm`); `i`
    /// is its index in the file, for the key a problem names.
    ///
    /// # Errors
    /// A schema file that cannot be read.
    pub fn definition(&self, i: usize, module: ModuleFingerprint) -> Result<Definition, Problem> {
        let mut schemas = std::collections::BTreeMap::new();
        for (view, path) in &self.schemas {
            let text = std::fs::read_to_string(path).map_err(|error| {
                Problem::new(
                    format!("runtime[{i}].schemas.{view}"),
                    format!("schema {}: {error}", path.display()),
                )
            })?;
            schemas.insert(view.clone(), text);
        }
        Ok(Definition {
            module_name: match self.wasm.starts_with("builtin:") {
                true => self.wasm.clone(),
                false => module.to_string(),
            },
            module,
            views: self.views.clone(),
            config: self.config.clone(),
            schemas,
            limits: (&self.limits.to_limits()).into(),
            declared: None,
        })
    }

    /// The schemas `schemas =` names, read and compiled; `i` is the runtime's index in the
    /// file, for the key a problem names.
    ///
    /// # Errors
    /// A file that cannot be read, is not JSON, or is not a schema the validator compiles.
    pub fn load_schemas(&self, i: usize) -> Result<ConfiguredSchemas, Problem> {
        let mut out = std::collections::BTreeMap::new();
        for (view, path) in &self.schemas {
            let problem = |message: String| {
                Problem::new(
                    format!("runtime[{i}].schemas.{view}"),
                    format!("schema {}: {message}", path.display()),
                )
            };
            let text = std::fs::read(path).map_err(|error| problem(error.to_string()))?;
            let document = serde_json::from_slice(&text)
                .map_err(|error| problem(format!("not JSON: {error}")))?;
            let schema =
                ViewSchema::new(view, document).map_err(|error| problem(error.to_string()))?;
            out.insert(view.clone(), std::sync::Arc::new(schema));
        }
        Ok(std::sync::Arc::new(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(value: serde_json::Value) -> (String, String) {
        let problem = LimitsSection::from_json(value).expect_err("refused");
        (problem.key, problem.message)
    }

    #[test]
    fn json_limits_are_read_by_key_and_refused_in_our_words() {
        let read = LimitsSection::from_json(serde_json::json!({
            "memory": "32MiB", "fuel": 7, "batch_timeout": "250ms", "max_event": 1024
        }))
        .expect("read");
        assert_eq!(read.memory, 32 << 20);
        assert_eq!(read.fuel, 7);
        assert_eq!(read.batch_timeout, Duration::from_millis(250));
        assert_eq!(read.max_event, 1024);
        assert_eq!(read.max_batch, LimitsSection::default().max_batch);
        // Not read by position: `[1]` would be one byte of memory.
        for not_an_object in [
            serde_json::json!([1]),
            serde_json::json!(5),
            serde_json::json!("x"),
        ] {
            let (key, message) = problem(not_an_object);
            assert_eq!(key, "limits");
            assert!(
                message.starts_with("expected an object of limits"),
                "{message}"
            );
        }
        for (value, key) in [
            (serde_json::json!({"memory": [1]}), "limits.memory"),
            (serde_json::json!({"memory": "lots"}), "limits.memory"),
            (serde_json::json!({"max_batch": -1}), "limits.max_batch"),
            (serde_json::json!({"fuel": "many"}), "limits.fuel"),
            (serde_json::json!({"fuel": 0}), "limits.fuel"),
            (
                serde_json::json!({"batch_timeout": 5}),
                "limits.batch_timeout",
            ),
            (
                serde_json::json!({"batch_timeout": "500us"}),
                "limits.batch_timeout",
            ),
            (
                serde_json::json!({"batch_timeout": "1500us"}),
                "limits.batch_timeout",
            ),
            (
                serde_json::json!({"batch_timeout": "0s"}),
                "limits.batch_timeout",
            ),
            (serde_json::json!({"wat": 1}), "limits.wat"),
        ] {
            let (got, message) = problem(value.clone());
            assert_eq!(got, key, "{value}");
            for serde in ["invalid type", "expected struct", "untagged", "sequence"] {
                assert!(!message.contains(serde), "{value}: {message}");
            }
        }
    }

    #[test]
    fn limits_as_shown_are_read_back_the_same() {
        let shown = [
            Limits::default(),
            Limits {
                max_memory_bytes: 1,
                fuel: 1,
                batch_timeout: Duration::from_millis(1),
                max_batch_bytes: 3 << 20,
                max_event_bytes: 12_345,
            },
            Limits {
                batch_timeout: Duration::from_millis(90_061_001),
                ..Limits::default()
            },
        ];
        for limits in shown {
            let json = serde_json::to_value(LimitsSection::from_limits(&limits)).expect("JSON");
            let read = LimitsSection::from_json(json.clone()).expect("read back");
            assert_eq!(read.to_limits(), limits, "{json}");
        }
    }
}
