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
