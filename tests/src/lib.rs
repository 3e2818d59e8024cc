//! End-to-end test support for viewtape: the real binary, spoken to over loopback HTTP/SSE.
//!
//! - [`server`]: spawn `viewtape serve` on a free port with a temp data dir; graceful stop,
//!   kill -9, restart on the same data dir.
//! - [`http`]: a minimal HTTP/1.1 client with a timeout on every read.
//! - [`sse`]: a WHATWG-conformant, incremental SSE parser.
//! - [`stream`]: an SSE subscription ([`EventStream`]) built from the two.
//! - [`expect`]: assertions over the wire format (updates, resets, the tape).
//! - [`cluster`]: nodes of a cluster on one NATS server, fed and compared.
//! - [`logfiles`]: a server's log segments on disk, for tests that damage them; the checks of a
//!   start that fails closed.
//! - [`nats`]: a real `nats-server` with JetStream, for clusters of nodes; kill and restart.
//! - [`nemesis`]: DESIGN §19's harness: a NATS cluster, nodes behind link proxies, seeded
//!   faults, producers and readers, and the checker of what they were told.
//! - [`token`]: HS256 tokens for the server's `[auth]`.
//! - [`feed`]: NDJSON ticks for the embedded `ticker` guest, and cursor helpers.
//!
//! Shared by the end-to-end tests in `tests/tests/` and by the `viewtape-bench` load tool.
//! Everything here talks to 127.0.0.0/8 or ::1 only ([`http::ensure_loopback`]).

pub mod cluster;
pub mod expect;
pub mod feed;
pub mod http;
pub mod logfiles;
pub mod nats;
pub mod nemesis;
pub mod server;
pub mod sse;
pub mod stream;
pub mod token;

pub use feed::{cursor_offset, parse_cursor, Feed};
pub use http::Response;
pub use nats::NatsServer;
pub use server::Server;
pub use sse::{SseEvent, SseEventRef, SseParser};
pub use stream::{EventBody, EventStream};
