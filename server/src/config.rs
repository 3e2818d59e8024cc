//! The server's settings: defaults, and the TOML file given with `--config`.
//!
//! ```toml
//! [server]
//! max_connections = 10000     # SSE connections; past it, 503
//! max_http_connections = 11024  # every connection (default: max_connections + 1024); past it, 503
//! header_timeout = "10s"      # time to send a whole request head
//! idle_timeout = "60s"        # a kept-alive connection's wait for its next request
//! write_timeout = "30s"       # a client that accepts no bytes this long is dropped
//! drain_timeout = "5s"        # at a stop, time in-flight requests with bodies get to finish
//! heartbeat = "15s"           # comment lines on idle streams
//! retry = "2s"                # the `retry:` hint sent to clients
//! reconnect_spread = "5s"     # at a stop, streams end with `retry:` hints spread over this
//! max_body = "1MiB"           # ingest body limit; past it, 413
//! snapshot_interval = "30s"   # periodic snapshots; "0s" turns them off
//! keep_snapshots = 5          # periodic snapshots kept (plus the newest exact one)
//! cors_origins = []           # origins allowed cross-origin, with credentials
//! tls_cert = "cert.pem"       # HTTPS (HTTP/2 by ALPN, and HTTP/1.1) with this certificate chain
//! tls_key = "key.pem"         # and this private key (PEM); both reloaded on SIGHUP
//!
//! [journal]
//! enabled = true
//! max_age = "1h"
//! max_records_per_view = 100000
//! max_bytes_per_view = "64MiB"
//!
//! [log]                       # what a 200 from ingest promises
//! enabled = true              # false: no log; a crash takes a fresh epoch
//! fsync = "always"            # "always": on the device before the 200; "os": handed to the OS
//! segment_bytes = "64MiB"     # a new segment file past this size
//!
//! [auth]                      # off unless VIEWTAPE_JWT_SECRET (HS256) or public_keys is set
//! public_keys = "key.pem"     # a PEM public key: ES256, RS256 or EdDSA tokens
//! audience = "viewtape"       # the `aud` tokens must carry (not checked when unset)
//! public_views = ["prices"]   # readable without a token (a trailing * matches a prefix)
//! allow_query_token = false   # accept ?access_token= (URLs end up in logs: off by default)
//!
//! [cluster]                   # replicas: the input log is a JetStream stream (or --nats URL)
//! nats_url = "nats://127.0.0.1:4222"
//! stream = "viewtape"         # created if missing: file storage, subjects "<stream>.in.>"
//! replicas = 1                # the stream's replicas on the NATS cluster
//! max_age = "0s"              # the stream drops older messages ("0s": never)
//! bucket = "viewtape-snapshots"  # the object store bucket shared snapshots go to
//! ahead_wait = "2s"           # a cursor ahead of this node waits this long before `ahead`
//! apply_timeout = "5s"        # an ingest waits this long for this node to apply its batch
//!
//! [[runtime]]
//! name = "demo"
//! wasm = "builtin:ticker"     # or a path to a .wasm file
//! views = ["prices"]          # the views it publishes to, which exist from the start; a batch
//!                             # publishing anywhere else is rejected, a gap touches only these
//! config = ""                 # bytes handed to the guest's `init`
//! [runtime.limits]
//! memory = "64MiB"
//! fuel = 500000000            # CPU per call, counted (~1 per instruction): deterministic
//! batch_timeout = "1s"        # wall-clock backstop; hitting it is a fault
//! max_batch = "4MiB"
//! max_event = "1MiB"
//! [runtime.source]            # optional pull source besides HTTP ingest
//! file = "/var/log/app.log"
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use viewtape_journal::{JournalConfig, ViewName};

use crate::host::Limits;

/// The built-in guests, by the name a config uses after `builtin:`.
pub const BUILTIN_GUESTS: [(&str, &[u8]); 2] = [
    ("ticker", crate::host::guests::TICKER_WASM),
    ("logstats", crate::host::guests::LOGSTATS_WASM),
];

/// Why a config file was refused.
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
    /// The file is not valid TOML for this schema; the message names the line.
    #[error("invalid config {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// The file parses but says something impossible.
    #[error("invalid config {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// Everything `viewtape serve` runs with.
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSection {
    /// A PEM public key verifying ES256, RS256 or EdDSA tokens.
    pub public_keys: Option<PathBuf>,
    /// The `aud` tokens must carry.
    pub audience: Option<String>,
    /// Views anyone may read.
    pub public_views: Vec<String>,
    /// Whether `?access_token=` is accepted.
    pub allow_query_token: bool,
}

/// `[cluster]`: nodes that share one input log, a JetStream stream. Off without `nats_url`.
#[derive(Debug, Clone, Deserialize)]
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
        }
    }
}

/// `[log]`: the log every accepted batch is written to before it is acknowledged.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// Whether batches are logged (and replayed at a restart).
    pub enabled: bool,
    /// When a batch counts as durable.
    pub fsync: FsyncMode,
    /// Size past which a new segment file starts.
    #[serde(deserialize_with = "byte_size")]
    pub segment_bytes: usize,
}

/// `[log] fsync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
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
        }
    }
}

/// `[journal]`: the journal's retention.
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
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
    /// Limits.
    #[serde(default)]
    pub limits: LimitsSection,
    /// An optional pull source.
    #[serde(default)]
    pub source: Option<SourceSection>,
}

/// `[runtime.limits]`.
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
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
                limits: LimitsSection::default(),
                source: None,
            }],
        }
    }
}

impl Config {
    /// Reads and validates a config file.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file, and the line for syntax errors.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let config: Self = toml::from_str(&text).map_err(|error| ConfigError::Parse {
            path: path.to_owned(),
            message: error.to_string().trim_end().to_owned(),
        })?;
        config.validate().map_err(|message| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        })?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), String> {
        let mut names = std::collections::HashSet::new();
        for runtime in &self.runtimes {
            ViewName::new(&runtime.name).map_err(|_| {
                format!(
                    "runtime name {:?}: use 1-128 of A-Z a-z 0-9 . _ -",
                    runtime.name
                )
            })?;
            if !names.insert(&runtime.name) {
                return Err(format!("runtime {:?} is configured twice", runtime.name));
            }
            if runtime.views.is_empty() {
                return Err(format!(
                    "runtime {:?}: declare the views it publishes to (views = [\"…\"])",
                    runtime.name
                ));
            }
            for view in &runtime.views {
                ViewName::new(view).map_err(|_| {
                    format!(
                        "runtime {:?}: view name {view:?}: use 1-128 of A-Z a-z 0-9 . _ -",
                        runtime.name
                    )
                })?;
            }
            if let Some(builtin) = runtime.wasm.strip_prefix("builtin:") {
                if !BUILTIN_GUESTS.iter().any(|(name, _)| *name == builtin) {
                    return Err(format!(
                        "runtime {:?}: no built-in guest {builtin:?} (built-in: ticker, logstats)",
                        runtime.name
                    ));
                }
            }
            if runtime.limits.fuel == 0 {
                return Err(format!(
                    "runtime {:?}: [runtime.limits] fuel must be above zero",
                    runtime.name
                ));
            }
            if runtime.limits.batch_timeout.is_zero() {
                return Err(format!(
                    "runtime {:?}: batch_timeout must be above zero",
                    runtime.name
                ));
            }
        }
        if self.server.max_connections == 0 {
            return Err("server.max_connections must be above zero".to_owned());
        }
        if self.server.http_connection_limit() < self.server.max_connections {
            return Err(format!(
                "server.max_http_connections ({}) must be at least server.max_connections ({}): \
                 every SSE stream is a connection",
                self.server.http_connection_limit(),
                self.server.max_connections
            ));
        }
        for (key, value) in [
            ("header_timeout", self.server.header_timeout),
            ("idle_timeout", self.server.idle_timeout),
            ("write_timeout", self.server.write_timeout),
        ] {
            if value.is_zero() {
                return Err(format!("server.{key} must be above zero"));
            }
        }
        let stream_name = |name: &str| {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !stream_name(&self.cluster.stream) || !stream_name(&self.cluster.bucket) {
            return Err(
                "cluster.stream and cluster.bucket: letters, digits, '-' and '_' only".into(),
            );
        }
        if self.cluster.replicas == 0 || self.cluster.replicas > 5 {
            return Err("cluster.replicas must be 1 to 5".into());
        }
        if self.server.tls_cert.is_some() != self.server.tls_key.is_some() {
            return Err(
                "server.tls_cert and server.tls_key go together: set both for HTTPS, or neither"
                    .into(),
            );
        }
        for origin in &self.server.cors_origins {
            if !is_origin(origin) {
                return Err(format!(
                    "server.cors_origins: {origin:?} is not an origin; write scheme://host[:port], \
                     as a browser sends it (no path, no trailing slash, no \"*\")"
                ));
            }
        }
        Ok(())
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
    fn syntax_errors_name_the_line() {
        let error =
            load("[journal]\nmax_age = \"1h\"\nmax_records_per_view = \"many\"\n").unwrap_err();
        let message = error.to_string();
        assert!(message.contains("line 3"), "{message}");
        let error = load("[server]\nnope = 1\n").unwrap_err().to_string();
        assert!(
            error.contains("line 2") && error.contains("nope"),
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
