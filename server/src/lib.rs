//! The viewtape server: hosts WebAssembly ingestion runtimes and serves
//! their views over Server-Sent Events.
//!
//! ## Layers
//!
//! Modules form layers, top to bottom; each uses only the layers below it, never one above.
//!
//! | layer | modules |
//! |---|---|
//! | process | [`server`] (`viewtape serve`: serving, shutdown), [`check`] (`viewtape check-config`, and what `serve` checks first), [`startup`] (start-up in every mode: local log, log off, cluster), [`inspect`] (`viewtape snapshot …`, `viewtape log …`), [`run`] (`viewtape run`: a guest over recorded input), [`scaffold`] (`viewtape new`: a guest crate) |
//! | transport | [`listener`] — the accept loop; HTTP/1.1 carried to a router, lean or through hyper, and HTTP/2 over TLS; [`tls`] — the certificate, reloadable |
//! | HTTP | [`http`] — the one router: routes, layers, the API error; [`http::admin`] |
//! | operations | [`snapshot`] — snapshot body, cut, write, restore; [`recovery`] — a snapshot and the local log at start-up; [`history`] — the data directory's identity, foreign files, the end of the log; [`cluster`] — replicas applying a JetStream stream as their log; [`deploy`] — a new module into a running runtime; [`demo`] — the demo feed |
//! | streams | [`sse`] — one subscriber: replay or state, then live |
//! | observation | [`metrics`] — Prometheus metrics, reading the counters of the layers below |
//! | views | [`hub`] — views, their state, the commit path into the journal; [`registry`] — runtimes by name, the module store, the consistency cut |
//! | runtimes | [`runtime`] — the task owning one guest; [`log`] — log records, receipts, idempotent producers, commit order, the two backends (local segments, a cluster's stream); [`source`] — pull sources and their checkpoints |
//! | foundation | [`host`] — the wasmtime host; [`frame`] — the SSE wire format; [`auth`] — tokens and grants; [`narrow`] — reads and grants of some keys of a view; [`socket`] — a TCP connection written by its transport and the fan-out pass in turn, HTTP/1.1 chunks; [`config`] — settings; [`schema`] — typed views' schemas and the check of their values |
#![deny(missing_docs)]

pub mod auth;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod deploy;
pub mod host;
pub mod http;
pub mod hub;
pub mod listener;
pub mod log;
pub mod metrics;
#[cfg(test)]
mod proptests;
pub mod recovery;
pub mod runtime;
pub mod schema;
pub mod serve;
pub mod snapshot;
pub mod source;
pub mod sse;
