//! The sections of the server's own settings: `[server]`, `[auth]`, `[cluster]`, `[log]` and
//! `[journal]`, each with its defaults.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use viewtape_journal::JournalConfig;

use super::size::byte_size;

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
    /// The most guest instances alive at once. A runtime holds one only while it runs a batch
    /// (or checks a state), so this bounds the guests running at the same moment, not the
    /// runtimes: a batch past it waits for one, up to its `batch_timeout`, then is refused with
    /// `503`. Each reserves address space, not memory. `0`: no bound (instances allocated on
    /// demand).
    pub guest_instances: u32,
    /// The most runtimes this node runs: a new one past it is refused with `503`. An idle
    /// runtime holds its state's bytes and a task, no guest instance.
    pub max_runtimes: usize,
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
            guest_instances: crate::host::EngineConfig::default().pooled_instances,
            max_runtimes: 10_000,
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
    /// Most batches (of any of its runtimes) a node gathers into one stream message; 1: every
    /// batch its own message, which nodes of versions before gathering need while they are in
    /// the cluster.
    pub batches_per_message: usize,
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
            batches_per_message: 1024,
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
