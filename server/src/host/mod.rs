//! The wasmtime host: runs ingestion runtimes compiled to WebAssembly against the
//! `viewtape-guest` ABI (`runtime-guest/ABI.md`).
//!
//! ## Why the types are split
//!
//! - [`GuestEngine`] — one per server: the wasmtime `Engine` (fuel, pooling allocator) and the
//!   `Linker` with the ABI's host functions.
//! - [`GuestModule`] — one per guest binary: compiled once, checked once (ABI version, exports),
//!   pre-linked into an `InstancePre` so instantiating is cheap. Cheap to clone.
//!   A JavaScript module is a `GuestModule` too: its source, and the embedded JS engine guest
//!   (compiled once per engine, and kept on disk between processes: `code_cache.rs`) as its
//!   code (`js.rs`).
//! - [`GuestInstance`] — one per running runtime: a `Store` and its instance, owned by exactly
//!   one task and never put behind a lock (`runtime::RuntimeHandle` talks to that task).
//!
//! ## Limits
//!
//! Every instance runs under [`Limits`]: linear memory (through a `ResourceLimiter`), CPU per
//! call (fuel, counted: the same call on the same state always passes or always fails), wall
//! time per call (a running guest yields to tokio every few million units of fuel, and a call
//! past its deadline is cancelled at its next yield), batch size (checked before the guest sees
//! the batch) and event payload and key size (checked on the guest's output; a gap reason is cut
//! to `batch::MAX_GAP_REASON` bytes). Each failure is a typed [`GuestError`] naming the cause.
//!
//! ## After a failure
//!
//! A trap, a timeout or running out of memory may leave the guest's heap mid-update, and a
//! `Store` keeps every instance it ever made until dropped. So after *any* failed call the
//! instance is dropped and a fresh one is made from the `InstancePre`, then restored from the
//! last good saved state (see `runtime`). A rejected batch is treated the same way, so a guest
//! never has to undo a half-applied batch.
//!
//! ## Output
//!
//! A guest replies once per batch with one buffer (see `ABI.md`); the host copies it out of
//! linear memory once into a `Bytes`, and every payload is a zero-copy slice of it.

mod batch;
mod code_cache;
mod config;
mod engine;
mod error;
mod fingerprint;
pub mod guests;
mod image;
mod instance;
mod js;
mod module;

pub use batch::{EventKind, GuestBatch, GuestEvent};
pub use code_cache::{cache_dir, user_cache_dir};
pub use config::{EngineConfig, Limits, DEFAULT_FUEL};
pub use engine::GuestEngine;
pub use error::{GuestError, LoadError};
pub use fingerprint::ModuleFingerprint;
pub use instance::GuestInstance;
pub use module::GuestModule;

/// Decodes a guest's batch output buffer (`ABI.md`) the way [`GuestInstance::on_batch`] does.
/// Exposed for the benchmarks that compare output designs; not needed to run guests.
///
/// # Errors
/// [`GuestError::Protocol`] for a malformed buffer, [`GuestError::EventTooLarge`] for a payload
/// and [`GuestError::KeyTooLarge`] for a key over `max_event_bytes`.
#[doc(hidden)]
pub fn decode_output(buf: bytes::Bytes, max_event_bytes: usize) -> Result<GuestBatch, GuestError> {
    batch::decode(buf, &mut batch::ViewNames::default(), max_event_bytes)
}

#[cfg(test)]
mod tests;
