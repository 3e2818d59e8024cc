//! The viewtape server: hosts WebAssembly ingestion runtimes and serves
//! their views over Server-Sent Events.
//!
//! - [`server`] — `viewtape serve`: start-up, snapshots, shutdown.
//! - [`http`] — the routes and the API error type.
//! - [`listener`] — the accept loop: SSE straight on the socket, the rest through axum.
//! - `sse` — one subscriber's stream: replay or state, then live.
//! - [`hub`] — views, their state, and the commit path into the journal.
//! - `frame` — the SSE wire format of events, resets and state transfers.
//! - [`runtime`] — the task that owns one guest instance.
//! - [`host`] — the wasmtime host: engine, modules, instances, limits.
//! - [`source`] — pull sources (file tail).
//! - [`config`] — settings and the `--config` file.
//! - [`metrics`] — Prometheus counters.
//! - [`demo`] — the embedded demo feed.
//! - [`inspect`] — `viewtape snapshot inspect|verify`.
//! - [`admin`] — operator routes: snapshot now, list, live restore.
#![deny(missing_docs)]

pub mod admin;
pub mod config;
pub mod demo;
pub(crate) mod frame;
pub mod host;
pub mod http;
pub mod hub;
pub mod inspect;
pub mod listener;
pub mod metrics;
pub mod runtime;
pub mod server;
#[cfg(test)]
mod snapshot_props;
pub mod source;
pub(crate) mod sse;
