//! The server's settings: defaults, and the TOML file given with `--config`.
//!
//! Every key, with its default, is in the README's config reference; a test holds the reference
//! to these definitions (every key documented, no key that does not exist, defaults as shown).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};
use viewtape_journal::{JournalConfig, ViewName};

use crate::host::Limits;
use crate::schema::{ConfiguredSchemas, ViewSchema};

mod spans;

/// The built-in guests, by the name a config uses after `builtin:`.
pub const BUILTIN_GUESTS: [(&str, &[u8]); 3] = [
    ("ticker", crate::host::guests::TICKER_WASM),
    ("logstats", crate::host::guests::LOGSTATS_WASM),
    ("json", crate::host::guests::JSON_WASM),
];

/// Why a config file was refused. Every message names the file and, when the file has the key at
/// all, its line and the key: `invalid config viewtape.toml, line 3, key server.retry: …`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
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
    path: PathBuf,
    spans: spans::Spans,
}

impl Source {
    /// The error for `problem`, with the file, the key and its line.
    pub fn error(&self, problem: Problem) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.clone(),
            line: self.spans.line_of(&problem.key),
            key: Some(problem.key),
            message: problem.message,
        }
    }
}

/// Everything `viewtape serve` runs with.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// HTTP and snapshot settings.
    pub server: ServerConfig,
    /// Journal retention.
    pub journal: JournalSection,
    /// The log.
    pub log: LogSection,
    /// Access control.
    pub auth: AuthSection,
    /// Replicas on a JetStream stream.
    pub cluster: ClusterSection,
    /// The runtimes to host. A file without any `[[runtime]]` runs the
    /// embedded demo runtime.
    #[serde(rename = "runtime")]
    pub runtimes: Vec<RuntimeSection>,
}

/// `[server]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Most concurrent SSE connections.
    pub max_connections: usize,
    /// Most concurrent connections of any kind; `None`: [`ServerConfig::max_connections`] plus
    /// 1,024 (see [`ServerConfig::http_connection_limit`]).
    pub max_http_connections: Option<usize>,
    /// Time a client has to send a whole request head.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Time a kept-alive connection may wait for its next request.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Time a client may accept no bytes of a response before it is dropped.
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
    /// At a stop, time in-flight requests get to finish (a second signal stops waiting).
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Idle time after which a stream gets a heartbeat comment.
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// Reconnection delay suggested to clients.
    #[serde(with = "humantime_serde")]
    pub retry: Duration,
    /// At a stop, every stream ends with a `retry:` hint somewhere in `[0, reconnect_spread)`,
    /// evenly spread, so that its clients come back over this window instead of all at once.
    #[serde(with = "humantime_serde")]
    pub reconnect_spread: Duration,
    /// Largest ingest body.
    #[serde(deserialize_with = "byte_size")]
    pub max_body: usize,
    /// Period of periodic snapshots; zero turns them off.
    #[serde(with = "humantime_serde")]
    pub snapshot_interval: Duration,
    /// Periodic snapshots kept.
    pub keep_snapshots: usize,
    /// Origins (`https://app.example`) allowed to call every route cross-origin, with
    /// credentials. Empty: no cross-origin access.
    pub cors_origins: Vec<String>,
    /// The certificate chain (PEM) of HTTPS; set with [`ServerConfig::tls_key`] or not at all.
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of HTTPS.
    pub tls_key: Option<PathBuf>,
}

impl ServerConfig {
    /// The cap on connections of any kind: `max_http_connections`, or `max_connections` plus
    /// 1,024 for everything that is not a stream.
    pub fn http_connection_limit(&self) -> usize {
        self.max_http_connections
            .unwrap_or(self.max_connections.saturating_add(1024))
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            max_http_connections: None,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(5),
            heartbeat: Duration::from_secs(15),
            retry: Duration::from_secs(2),
            reconnect_spread: Duration::from_secs(5),
            max_body: 1 << 20,
            snapshot_interval: Duration::from_secs(30),
            keep_snapshots: 5,
            cors_origins: Vec::new(),
            tls_cert: None,
            tls_key: None,
        }
    }
}

/// `[auth]`: who may read and write (the rules are in the `auth` module).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSection {
    /// A PEM public key verifying ES256, RS256 or EdDSA tokens.
    pub public_keys: Option<PathBuf>,
    /// The `aud` tokens must carry.
    pub audience: Option<String>,
    /// Views anyone may read: names, prefixes with a trailing `*`, each maybe narrowed to some
    /// keys (`"prices?prefix=EU-"`; the rules are in the `auth` module).
    pub public_views: Vec<String>,
    /// Whether `?access_token=` is accepted.
    pub allow_query_token: bool,
}

/// `[cluster]`: nodes that share one input log, a JetStream stream. Off without `nats_url`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    /// The NATS server(s), comma-separated; `None`: a single node with its own log.
    pub nats_url: Option<String>,
    /// The stream's name.
    pub stream: String,
    /// The stream's replicas, when this node creates it.
    pub replicas: usize,
    /// Age past which the stream drops messages, when this node creates it; zero: never.
    #[serde(with = "humantime_serde")]
    pub max_age: Duration,
    /// The object store bucket of shared snapshots.
    pub bucket: String,
    /// How long a cursor ahead of this node waits for it before it is answered `ahead`.
    #[serde(with = "humantime_serde")]
    pub ahead_wait: Duration,
    /// How long an ingest waits for this node to apply its published batch.
    #[serde(with = "humantime_serde")]
    pub apply_timeout: Duration,
    /// The NATS servers sync every write before they acknowledge it (`sync_interval: always`
    /// in their `jetstream` block). A single-replica stream on servers that sync periodically
    /// (NATS's default) can lose recently acknowledged batches at a power loss; receipts then
    /// say `"durability": "stream_os"`.
    pub stream_synced: bool,
}

impl Default for ClusterSection {
    fn default() -> Self {
        Self {
            nats_url: None,
            stream: "viewtape".into(),
            replicas: 1,
            max_age: Duration::ZERO,
            bucket: "viewtape-snapshots".into(),
            ahead_wait: Duration::from_secs(2),
            apply_timeout: Duration::from_secs(5),
            stream_synced: false,
        }
    }
}

/// `[log]`: the log every accepted batch is written to before it is acknowledged.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// Whether batches are logged (and replayed at a restart).
    pub enabled: bool,
    /// When a batch counts as durable.
    pub fsync: FsyncMode,
    /// Size past which a new segment file starts.
    #[serde(deserialize_with = "byte_size")]
    pub segment_bytes: usize,
    /// Keep the end-of-log watermark (a missing newest segment or tail is noticed); `false` only
    /// to measure what it costs.
    pub watermark: bool,
}

/// `[log] fsync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FsyncMode {
    /// Synced to the device before the `200`: survives power loss.
    Always,
    /// Handed to the operating system before the `200`: survives a crash of the process; after
    /// a crash of the machine the server takes a fresh epoch.
    Os,
}

impl Default for LogSection {
    fn default() -> Self {
        Self {
            enabled: true,
            fsync: FsyncMode::Always,
            segment_bytes: 64 << 20,
            watermark: true,
        }
    }
}

/// `[journal]`: the journal's retention.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct JournalSection {
    /// Whether offsets are issued.
    pub enabled: bool,
    /// Age bound.
    #[serde(with = "humantime_serde")]
    pub max_age: Duration,
    /// Record bound per view.
    pub max_records_per_view: usize,
    /// Byte bound per view.
    #[serde(deserialize_with = "byte_size")]
    pub max_bytes_per_view: usize,
}

impl Default for JournalSection {
    fn default() -> Self {
        let journal = JournalConfig::default();
        Self {
            enabled: journal.enabled,
            max_age: journal.max_age,
            max_records_per_view: journal.max_records_per_view,
            max_bytes_per_view: journal.max_bytes_per_view,
        }
    }
}

impl JournalSection {
    /// The journal's own config.
    pub fn to_journal_config(&self) -> JournalConfig {
        JournalConfig {
            enabled: self.enabled,
            max_age: self.max_age,
            max_records_per_view: self.max_records_per_view,
            max_bytes_per_view: self.max_bytes_per_view,
        }
    }
}

/// `[[runtime]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSection {
    /// The runtime's name (ingest URL, logs, metrics).
    pub name: String,
    /// `builtin:<guest>` or a path to a `.wasm` file.
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
        let limits = Limits::default();
        Self {
            memory: limits.max_memory_bytes,
            fuel: limits.fuel,
            batch_timeout: limits.batch_timeout,
            max_batch: limits.max_batch_bytes,
            max_event: limits.max_event_bytes,
        }
    }
}

impl LimitsSection {
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

impl Default for Config {
    /// The embedded default: runtime `demo` running the ticker guest into
    /// the view `prices`.
    fn default() -> Self {
        Self {
            server: ServerConfig::default(),
            journal: JournalSection::default(),
            log: LogSection::default(),
            auth: AuthSection::default(),
            cluster: ClusterSection::default(),
            runtimes: vec![RuntimeSection {
                name: "demo".to_owned(),
                wasm: "builtin:ticker".to_owned(),
                views: vec!["prices".to_owned()],
                config: String::new(),
                schemas: Default::default(),
                limits: LimitsSection::default(),
                source: None,
            }],
        }
    }
}

impl Config {
    /// Reads and validates a config file: its syntax, keys, types and values. What it names
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
        let config: Self = toml::from_str(&text).map_err(|error| {
            let at = error.span().map(|span| span.start);
            let line = at.map(|at| source.spans.line_at(at));
            let message = error.message().trim_end().to_owned();
            let mut key = at.and_then(|at| source.spans.key_at(at)).map(str::to_owned);
            // A required key left out: the error is at its table; name the key itself.
            if let (Some(table), Some(missing)) = (&key, missing_field(&message)) {
                key = Some(format!("{table}.{missing}"));
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
        config.validate().map_err(|problem| source.error(problem))?;
        Ok((config, source))
    }

    fn validate(&self) -> Result<(), Problem> {
        let mut names = std::collections::HashSet::new();
        for (i, runtime) in self.runtimes.iter().enumerate() {
            let key = |name: &str| format!("runtime[{i}].{name}");
            ViewName::new(&runtime.name).map_err(|_| {
                Problem::new(
                    key("name"),
                    format!(
                        "runtime name {:?}: use 1-128 of A-Z a-z 0-9 . _ -",
                        runtime.name
                    ),
                )
            })?;
            if !names.insert(&runtime.name) {
                return Err(Problem::new(
                    key("name"),
                    format!("runtime {:?} is configured twice", runtime.name),
                ));
            }
            if runtime.views.is_empty() {
                return Err(Problem::new(
                    key("views"),
                    format!(
                        "runtime {:?}: declare the views it publishes to (views = [\"…\"])",
                        runtime.name
                    ),
                ));
            }
            for view in &runtime.views {
                ViewName::new(view).map_err(|_| {
                    Problem::new(
                        key("views"),
                        format!(
                            "runtime {:?}: view name {view:?}: use 1-128 of A-Z a-z 0-9 . _ -",
                            runtime.name
                        ),
                    )
                })?;
            }
            if let Some(view) = runtime.schemas.keys().find(|v| !runtime.views.contains(v)) {
                return Err(Problem::new(
                    format!("runtime[{i}].schemas.{view}"),
                    format!(
                        "runtime {:?}: a schema for view {view:?}, which it does not declare \
                         (views = {:?})",
                        runtime.name, runtime.views
                    ),
                ));
            }
            if let Some(builtin) = runtime.wasm.strip_prefix("builtin:") {
                if !BUILTIN_GUESTS.iter().any(|(name, _)| *name == builtin) {
                    return Err(Problem::new(
                        key("wasm"),
                        format!(
                            "runtime {:?}: no built-in guest {builtin:?} (built-in: {})",
                            runtime.name,
                            BUILTIN_GUESTS.map(|(name, _)| name).join(", ")
                        ),
                    ));
                }
            }
            if runtime.limits.fuel == 0 {
                return Err(Problem::new(
                    key("limits.fuel"),
                    format!("runtime {:?}: fuel must be above zero", runtime.name),
                ));
            }
            if runtime.limits.batch_timeout.is_zero() {
                return Err(Problem::new(
                    key("limits.batch_timeout"),
                    format!(
                        "runtime {:?}: batch_timeout must be above zero",
                        runtime.name
                    ),
                ));
            }
        }
        for entry in &self.auth.public_views {
            if let Some((_, query)) = entry.split_once('?') {
                crate::narrow::Narrow::from_query(query).map_err(|error| {
                    Problem::new(
                        "auth.public_views",
                        format!("{entry:?} narrows in a way this server does not read: {error}"),
                    )
                })?;
            }
        }
        if self.server.max_connections == 0 {
            return Err(Problem::new("server.max_connections", "must be above zero"));
        }
        if self.server.http_connection_limit() < self.server.max_connections {
            return Err(Problem::new(
                "server.max_http_connections",
                format!(
                    "{} must be at least server.max_connections ({}): every SSE stream is a connection",
                    self.server.http_connection_limit(),
                    self.server.max_connections
                ),
            ));
        }
        for (key, value) in [
            ("header_timeout", self.server.header_timeout),
            ("idle_timeout", self.server.idle_timeout),
            ("write_timeout", self.server.write_timeout),
        ] {
            if value.is_zero() {
                return Err(Problem::new(format!("server.{key}"), "must be above zero"));
            }
        }
        let stream_name = |name: &str| {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        for (key, value) in [
            ("cluster.stream", &self.cluster.stream),
            ("cluster.bucket", &self.cluster.bucket),
        ] {
            if !stream_name(value) {
                return Err(Problem::new(
                    key,
                    format!("{value:?}: letters, digits, '-' and '_' only"),
                ));
            }
        }
        if self.cluster.replicas == 0 || self.cluster.replicas > 5 {
            return Err(Problem::new("cluster.replicas", "must be 1 to 5"));
        }
        if self.server.tls_cert.is_some() != self.server.tls_key.is_some() {
            let key = match self.server.tls_cert {
                Some(_) => "server.tls_cert",
                None => "server.tls_key",
            };
            return Err(Problem::new(
                key,
                "server.tls_cert and server.tls_key go together: set both for HTTPS, or neither",
            ));
        }
        for origin in &self.server.cors_origins {
            if !is_origin(origin) {
                return Err(Problem::new(
                    "server.cors_origins",
                    format!(
                        "{origin:?} is not an origin; write scheme://host[:port], as a browser \
                         sends it (no path, no trailing slash, no \"*\")"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks a config that did not come from a file (the embedded default, or one changed by
    /// command-line flags) as [`Config::load`] checks a file.
    ///
    /// # Errors
    /// What is wrong, and where.
    pub fn check_values(&self) -> Result<(), Problem> {
        self.validate()
    }
}

impl RuntimeSection {
    /// The guest module's bytes.
    ///
    /// # Errors
    /// The `.wasm` file cannot be read.
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

    /// The bytes handed to the guest's `init`: `config`, but for a `builtin:json` runtime of one
    /// view without one, `{"view": VIEW}`, so that lines may leave out the view.
    pub fn guest_config(&self) -> Vec<u8> {
        match (self.wasm.as_str(), self.views.as_slice()) {
            ("builtin:json", [view]) if self.config.is_empty() => {
                serde_json::json!({ "view": view }).to_string().into_bytes()
            }
            _ => self.config.clone().into_bytes(),
        }
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

/// The key serde's "missing field `key`" names.
fn missing_field(message: &str) -> Option<&str> {
    message.strip_prefix("missing field `")?.split('`').next()
}

/// A byte size: an integer, or a string such as `"64MiB"`, `"512 KiB"`, `"1MB"`.
fn byte_size<'de, D: Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Number(usize),
        Text(String),
    }
    match Size::deserialize(deserializer)? {
        Size::Number(n) => Ok(n),
        Size::Text(text) => parse_byte_size(&text).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{text:?} is not a byte size (use e.g. 1048576, \"512KiB\", \"64MiB\", \"1GB\")"
            ))
        }),
    }
}

fn parse_byte_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: usize = number.parse().ok()?;
    let multiplier: usize = match unit.trim() {
        "" | "B" => 1,
        "KB" | "kB" => 1_000,
        "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "GiB" => 1 << 30,
        _ => return None,
    };
    number.checked_mul(multiplier)
}

/// Whether `text` is an origin as browsers send it in `Origin`: `http(s)://host[:port]`.
fn is_origin(text: &str) -> bool {
    let Some((scheme, host)) = text.split_once("://") else {
        return false;
    };
    matches!(scheme, "http" | "https")
        && !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn load(text: &str) -> Result<Config, ConfigError> {
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
            error.contains("line 2, key runtime[0].wasm: missing field"),
            "{error}"
        );
        let error = load("[server\n").unwrap_err().to_string();
        assert!(
            error.contains("line 1: ") && error.contains("`[server`"),
            "{error}"
        );
    }

    #[test]
    fn impossible_settings_are_refused() {
        for (text, needle) in [
            (
                "[[runtime]]\nname = \"a b\"\nwasm = \"builtin:ticker\"\n",
                "runtime name",
            ),
            (
                "[[runtime]]\nname = \"a\"\nwasm = \"builtin:nope\"\nviews = [\"v\"]\n",
                "no built-in guest",
            ),
            (
                "[[runtime]]\nname = \"a\"\nwasm = \"builtin:ticker\"\n",
                "declare the views",
            ),
            ("[server]\nmax_body = \"12 parsecs\"\n", "not a byte size"),
            ("[server]\ncors_origins = [\"*\"]\n", "not an origin"),
            ("[server]\ntls_cert = \"c.pem\"\n", "go together"),
            (
                "[server]\ncors_origins = [\"https://a.example/\"]\n",
                "not an origin",
            ),
            (
                "[server]\ncors_origins = [\"a.example\"]\n",
                "not an origin",
            ),
        ] {
            let error = load(text).unwrap_err().to_string();
            assert!(error.contains(needle), "{text:?}: {error}");
            assert!(
                error.contains(", line ") && error.contains(", key "),
                "{text:?}: {error}"
            );
        }
    }

    /// The README's config reference: the TOML block after its marker.
    fn readme_reference() -> String {
        let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"));
        let after = readme
            .split_once("<!-- config-reference")
            .expect("the README has a config reference")
            .1;
        let block = after.split_once("```toml\n").unwrap().1;
        block.split_once("```").unwrap().0.to_owned()
    }

    /// Every leaf key of a serialized config, with array indices left out, and its value.
    fn leaves(
        value: &serde_json::Value,
        prefix: &str,
        out: &mut BTreeMap<String, serde_json::Value>,
    ) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    let path = match prefix {
                        "" => key.clone(),
                        _ => format!("{prefix}.{key}"),
                    };
                    leaves(value, &path, out);
                }
            }
            // Tables in an array (`[[runtime]]`): their keys, under the array's name.
            serde_json::Value::Array(items)
                if items.iter().all(|item| item.is_object()) && !items.is_empty() =>
            {
                for item in items {
                    leaves(item, prefix, out);
                }
            }
            _ => {
                out.insert(prefix.to_owned(), value.clone());
            }
        }
    }

    #[test]
    fn the_readme_reference_is_every_key_with_its_default() {
        let text = readme_reference();
        let documented: Config = toml::from_str(&text).expect("the reference is a valid config");
        let mut shown = BTreeMap::new();
        leaves(&serde_json::to_value(&documented).unwrap(), "", &mut shown);

        // Every key there is: the defaults, with a runtime that has every optional part.
        let mut every = Config::default();
        every.runtimes[0].source = Some(SourceSection {
            file: PathBuf::from("/var/log/app.log"),
        });
        every.runtimes[0]
            .schemas
            .insert("prices".into(), PathBuf::from("prices.schema.json"));
        let mut defaults = BTreeMap::new();
        leaves(&serde_json::to_value(&every).unwrap(), "", &mut defaults);
        // The keys written in the block (parsing filled in the rest with defaults), without
        // array indices; unknown ones were refused by parsing already.
        let written: std::collections::BTreeSet<String> = spans::Spans::of(&text)
            .paths()
            .map(|path| path.replace("[0]", ""))
            .collect();
        let missing: Vec<_> = defaults.keys().filter(|k| !written.contains(*k)).collect();
        assert!(
            missing.is_empty(),
            "keys the README reference leaves out: {missing:?}"
        );
        // Shown values are the defaults, but for keys without one (shown as an example).
        for (key, default) in &defaults {
            if default.is_null()
                || ["runtime.source.file", "runtime.schemas.prices"].contains(&key.as_str())
            {
                continue;
            }
            assert_eq!(
                &shown[key], default,
                "the README shows another default for {key}"
            );
        }
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_byte_size("64MiB"), Some(64 << 20));
        assert_eq!(parse_byte_size("1 KB"), Some(1000));
        assert_eq!(parse_byte_size("12"), Some(12));
        assert_eq!(parse_byte_size("1.5MiB"), None);
        assert_eq!(parse_byte_size("99999999999999999999GiB"), None);
    }
}
