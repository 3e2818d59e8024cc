//! The viewtape server: hosts WebAssembly ingestion runtimes and serves
//! their views over Server-Sent Events.
//!
//! ## Layers
//!
//! Modules form layers, top to bottom; each names only modules of its own layer or of a layer
//! below it, never one above.
//!
//! | layer | modules |
//! |---|---|
//! | process | [`serve`] (`viewtape serve`: start-up in every mode, listening, graceful stop), [`cli`] (the other subcommands: `check-config`, `snapshot …`, `log …`, `run`, `new`, and the admin client's `deploy`, `runtime …` and `module put`) |
//! | transport | [`listener`] — the accept loop; HTTP/1.1 carried to a router, lean or through hyper, and HTTP/2 over TLS with a reloadable certificate |
//! | HTTP | [`http`] — the one router: routes, layers, the API error; [`http::admin`] |
//! | operations | [`catalog`] — runtimes as data: created, replaced and deleted by records of the log; [`deploy`] — a new module into a running runtime; [`snapshot`] — snapshot body, cut, write, restore; [`recovery`] — a snapshot and the local log at start-up, the data directory's identity; [`cluster`] — replicas applying a JetStream stream as their log |
//! | streams | [`sse`] — one subscriber: replay or state, then live; the socket its transport and the fan-out pass share |
//! | observation | [`metrics`] — Prometheus metrics, reading the counters of the layers below |
//! | settings | [`config`] — settings; [`auth`] — tokens and grants of views and their keys |
//! | views | [`hub`] — views, their state, the commit path into the journal, the SSE wire format, narrowed reads of some keys |
//! | runtimes | [`runtime`] — the task owning one guest, and the registry of runtimes by name with the consistency cut; [`log`] — log records, receipts, idempotent producers, commit order, the backend a mode owns (off, local segments, a cluster's stream); [`source`] — pull sources and their checkpoints |
//! | foundation | [`host`] — the wasmtime host; [`schema`] — typed views' schemas and the check of their values |
//!
//! The table is checked (`tests/layers.rs`): a module names only modules of its own layer or
//! of a layer below, and no folder's files name each other in a circle.
#![deny(missing_docs)]

mod auth;
mod catalog;
mod cli;
mod cluster;
mod config;
mod deploy;
mod host;
mod http;
mod hub;
mod listener;
mod log;
mod metrics;
#[cfg(test)]
mod proptests;
mod recovery;
mod runtime;
mod schema;
mod serve;
mod snapshot;
mod source;
mod sse;

// What the `viewtape` binary, the benchmarks and other users outside the crate call; everything
// else stays inside.

// The command line.
pub use cli::admin::{AdminAnswer, AdminClient};
pub use cli::check::{check_file, declarations};
pub use cli::deploy::{deploy_module, DeployOptions};
pub use cli::inspect::{dump_log, inspect_file, inspect_log, verify_dir};
pub use cli::run::{run, RunOptions};
pub use cli::runtime::{admin_command, AdminCommand, RuntimeDefinition};
pub use cli::scaffold::{new_guest, new_script_guest, NpmSdk, ScaffoldError, Script, Sdk};
pub use serve::{serve, ServeOptions};

// Settings and the environment the server reads.
pub use auth::{Auth, SECRET_ENV};
pub use config::{AuthSection, Config, ServerConfig};
pub use http::admin::TOKEN_ENV as ADMIN_TOKEN_ENV;

// The host, a runtime, the views and the router, for benchmarks that drive them in-process.
pub use host::{
    cache_dir, decode_output, guests, user_cache_dir, EngineConfig, EventKind, GuestBatch,
    GuestEngine, GuestEvent, GuestInstance, GuestModule, Limits, DEFAULT_FUEL,
};
pub use http::{app, AppState};
pub use hub::narrow::Narrow;
pub use hub::Hub;
pub use log::{unix_ms_now, LogMetrics};
pub use runtime::{BatchSink, RuntimeConfig, RuntimeHandle};
pub use schema::{ViewSchema, ViewSchemas, Violation};
pub use snapshot::SnapshotBody;
