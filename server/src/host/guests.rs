//! The guests from `examples/guests`, prebuilt for `wasm32-unknown-unknown` and checked in under
//! `server/guests/`, embedded in the binary. Checked in rather than built here so that building
//! the server needs no wasm target; `scripts/build-guests` rebuilds them, reproducibly, and the
//! test `guests_current` in `tests/` fails while they differ from what the sources build.

/// `ticker`: NDJSON price ticks → view `prices`. The server's embedded demo runtime.
pub const TICKER_WASM: &[u8] = include_bytes!("../../guests/ticker.wasm");

/// `logstats`: log lines → per-service counts by level in view `log-levels`.
pub const LOGSTATS_WASM: &[u8] = include_bytes!("../../guests/logstats.wasm");

/// `json`: NDJSON `{"view","key","value"}` lines published as they are (`builtin:json`).
pub const JSON_WASM: &[u8] = include_bytes!("../../guests/json.wasm");

/// `misbehave`: the host's test fixture (commands that publish, fail, trap, loop, exhaust
/// memory). Not for production use.
pub const MISBEHAVE_WASM: &[u8] = include_bytes!("../../guests/misbehave.wasm");

/// `js`: the JavaScript engine (QuickJS). Not a runtime by itself: the host runs a JavaScript
/// module's source on it (`host/js.rs`).
pub const JS_ENGINE_WASM: &[u8] = include_bytes!("../../guests/js.wasm");

/// The example guests' state as they `save` it: the SDK stores it after an 8-byte version
/// header (`\xffVTS` and `STATE_VERSION`, 0 for them).
#[cfg(test)]
pub fn saved_state(stored: &[u8]) -> &[u8] {
    stored
        .strip_prefix(b"\xffVTS\0\0\0\0")
        .expect("state with the SDK's version-0 header")
}
