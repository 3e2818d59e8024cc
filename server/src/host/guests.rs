//! The guests built by `server/build.rs` from `examples/guests`, embedded in the binary.

/// `ticker`: NDJSON price ticks → view `prices`. The server's embedded demo runtime.
pub const TICKER_WASM: &[u8] = include_bytes!(env!("VIEWTAPE_GUEST_TICKER"));

/// `logstats`: log lines → per-service counts by level in view `log-levels`.
pub const LOGSTATS_WASM: &[u8] = include_bytes!(env!("VIEWTAPE_GUEST_LOGSTATS"));

/// `misbehave`: the host's test fixture (commands that publish, fail, trap, loop, exhaust
/// memory). Not for production use.
pub const MISBEHAVE_WASM: &[u8] = include_bytes!(env!("VIEWTAPE_GUEST_MISBEHAVE"));
