//! # Writing a viewtape ingestion runtime
//!
//! A **runtime** turns raw input (lines of a file, the body of an HTTP POST) into keyed events
//! in named **views**, which viewtape keeps on a replayable tape and streams to web clients over
//! SSE. A runtime is an ordinary Rust library compiled to `wasm32-unknown-unknown`; the server
//! runs it in a sandbox that bounds its memory and its time per batch.
//!
//! You write a type that implements [`Runtime`] and export it with [`export_runtime!`]. The
//! SDK owns the ABI (`ABI.md`): your code has no `unsafe`, no pointers, no allocator tricks.
//!
//! ## The lifecycle
//!
//! 1. [`Runtime::init`] builds the runtime from its config bytes (from the server's config).
//! 2. [`Runtime::restore`] reloads saved state, when the server has some (after a restart, a
//!    snapshot restore, or a crash of the guest).
//! 3. [`Runtime::on_batch`] is called once per batch of input. Publish, delete and report gaps
//!    through the [`Context`]. Return `Err` to reject the whole batch: nothing of it is
//!    published, and the runtime is rolled back to its state after the last good batch.
//! 4. [`Runtime::save`] serializes the state. The server calls it after every successful batch
//!    and stores it in snapshots.
//!
//! A panic is a failed batch too; its message reaches the server's log. Running out of memory
//! or time fails the batch with the cause named.
//!
//! ## A complete guest
//!
//! `Cargo.toml`:
//!
//! ```toml
//! [package]
//! name = "counter"
//! edition = "2021"
//!
//! [lib]
//! crate-type = ["cdylib", "rlib"]   # cdylib for wasm, rlib for native unit tests
//!
//! [dependencies]
//! # Not on crates.io: a path to the `runtime-guest` directory of a viewtape checkout.
//! viewtape-guest = { path = "../viewtape/runtime-guest" }
//! ```
//!
//! `viewtape new NAME` writes such a crate for you — a runtime, its tests, a README — that
//! builds and passes its tests as generated.
//!
//! `src/lib.rs` — counts words per line and publishes the running totals in view `words`:
//!
//! ```
//! use std::collections::BTreeMap;
//! use viewtape_guest::{export_runtime, Context, Error, Level, Result, Runtime};
//!
//! #[derive(Default)]
//! pub struct Counter {
//!     counts: BTreeMap<String, u64>,
//! }
//!
//! impl Runtime for Counter {
//!     fn init(_config: &[u8]) -> Result<Self> {
//!         Ok(Counter::default())
//!     }
//!
//!     fn on_batch(&mut self, input: &[u8], ctx: &mut Context) -> Result<()> {
//!         let text = std::str::from_utf8(input).map_err(|e| Error::msg(format!("not UTF-8: {e}")))?;
//!         for (n, line) in text.lines().enumerate() {
//!             if line.trim() == "!reset" {
//!                 for word in std::mem::take(&mut self.counts).into_keys() {
//!                     ctx.delete("words", &word);
//!                 }
//!                 continue;
//!             }
//!             if line.contains('\0') {
//!                 // Rejects the whole batch: nothing of it is published.
//!                 return Err(Error::msg(format!("line {}: NUL byte", n + 1)));
//!             }
//!             for word in line.split_whitespace() {
//!                 let count = self.counts.entry(word.to_owned()).or_default();
//!                 *count += 1;
//!                 ctx.publish("words", word, count.to_string().as_bytes());
//!             }
//!         }
//!         ctx.log(Level::Debug, "batch done");
//!         Ok(())
//!     }
//!
//!     fn save(&self) -> Vec<u8> {
//!         let mut out = String::new();
//!         for (word, n) in &self.counts {
//!             out.push_str(&format!("{word} {n}\n"));
//!         }
//!         out.into_bytes()
//!     }
//!
//!     fn restore(&mut self, state: &[u8]) -> Result<()> {
//!         let text = std::str::from_utf8(state).map_err(Error::msg)?;
//!         self.counts.clear();
//!         for line in text.lines() {
//!             let (word, n) = line.split_once(' ').ok_or("bad state line")?;
//!             self.counts.insert(word.to_owned(), n.parse().map_err(Error::msg)?);
//!         }
//!         Ok(())
//!     }
//! }
//!
//! export_runtime!(Counter);
//!
//! // Unit tests run natively with the harness, no wasm needed:
//! use viewtape_guest::{testing::Harness, Output};
//! let mut h = Harness::<Counter>::new(b"")?;
//! let out = h.batch(b"a b a")?;
//! assert_eq!(out.len(), 3);
//! assert!(h.batch(b"c\n\0").is_err());          // rejected: nothing published,
//! assert_eq!(h.runtime().counts.get("c"), None); // and the state rolled back
//! # Ok::<(), Error>(())
//! ```
//!
//! Build it with `cargo build --target wasm32-unknown-unknown --release` (once:
//! `rustup target add wasm32-unknown-unknown`) and point the server at
//! `target/wasm32-unknown-unknown/release/counter.wasm`.
//!
//! ## Rules of the sandbox
//!
//! - No WASI: no files, clock, randomness or network. Put what you need (timestamps) in the
//!   input.
//! - View names are 1–128 bytes of `[A-Za-z0-9._-]`; keys are any UTF-8.
//! - Memory (64 MiB by default), CPU per batch, batch size and event payload size are bounded
//!   by the server (`[runtime.limits]` in its config).
//! - Events are committed in the order you emit them; gaps before the batch's events.
//! - Publish only to the views your runtime declares (`views = [...]` in its `[[runtime]]`
//!   config): the server rejects a batch that publishes anywhere else. A gap you report affects
//!   those views only. `testing::Harness::declare_views` checks the same in unit tests.
//! - Payloads should be JSON: clients receive `{"key": …, "value": <your payload>}`. A payload
//!   that is not valid JSON is delivered as a JSON string of its (lossy UTF-8) text.
//! - `ctx.log` lines go to the server's log under the runtime's name, at their level:
//!   `RUST_LOG=info` (the default) shows info and above, `RUST_LOG=debug` everything. In unit
//!   tests, `testing::Harness::logs` returns them.
//!
//! ## Deploying a new build, and evolving its state
//!
//! `viewtape deploy RUNTIME FILE.wasm` (with the server's admin token in `VIEWTAPE_ADMIN_TOKEN`)
//! swaps a new build into a running runtime between two batches: the new build's
//! [`Runtime::restore`] gets the state the running build saved, and if it refuses, the running
//! build keeps going and the deploy fails with the reason. No client notices a deploy that
//! succeeds: no gap, no reset.
//!
//! The host stores saved state with the format's version, [`Runtime::STATE_VERSION`] (0 unless
//! you say otherwise). When you change what [`Runtime::save`] writes, raise it and turn the
//! older formats into the new one in [`Runtime::migrate`]:
//!
//! ```
//! use viewtape_guest::{Context, Error, Result, Runtime};
//!
//! /// Version 1 keeps the count as 8 little-endian bytes; version 0 kept it as text.
//! struct Counter(u64);
//!
//! impl Runtime for Counter {
//!     const STATE_VERSION: u32 = 1;
//!
//!     fn init(_: &[u8]) -> Result<Self> { Ok(Self(0)) }
//!     fn on_batch(&mut self, _: &[u8], _: &mut Context) -> Result<()> { self.0 += 1; Ok(()) }
//!     fn save(&self) -> Vec<u8> { self.0.to_le_bytes().to_vec() }
//!     fn restore(&mut self, state: &[u8]) -> Result<()> {
//!         let bytes = state.try_into().map_err(|_| Error::msg("expected 8 bytes"))?;
//!         self.0 = u64::from_le_bytes(bytes);
//!         Ok(())
//!     }
//!     fn migrate(from: u32, state: &[u8]) -> Result<Vec<u8>> {
//!         match from {
//!             0 => {
//!                 let text = std::str::from_utf8(state).map_err(Error::msg)?;
//!                 let n: u64 = text.parse().map_err(Error::msg)?;
//!                 Ok(n.to_le_bytes().to_vec())
//!             }
//!             other => Err(Error::msg(format!("unknown state version {other}"))),
//!         }
//!     }
//! }
//! ```
//!
//! [`testing::Harness::restore`] takes stored state the same way, so a test can hand the new
//! build what the old one saved ([`testing::Harness::save`]) and check the migration.
//!
//! ## Typed views
//!
//! [`Runtime::schemas`] declares the JSON Schema of each view's values; with this crate's
//! `schema` feature, [`Schemas::view`] derives it from the Rust type you publish
//! (`#[derive(JsonSchema)]` with `#[schemars(crate = "viewtape_guest::schemars")]`). The server
//! checks every value published to a typed view and refuses a batch with one that does not fit,
//! whole, naming the view, the key and the JSON pointer that fails. A build whose schema of a
//! view changes is deployed only if every value the view holds fits the new schema: the values
//! are what the guest published, and [`Runtime::migrate`] converts the guest's own state, not
//! them. [`testing::Harness::schemas`] shows what a guest declares.
//!
//! ## Determinism
//!
//! The server may run a batch again — to rebuild its state after a restart, or on another node
//! of a cluster — and requires the same output every time: **your output must be a function of
//! your state and your input only.** Every logged batch carries a digest of what it produced; a
//! replay that produces something else breaks the history, and the server starts a fresh one
//! (every client gets a `reset`). The host makes most of that automatic:
//!
//! - There is no clock, no randomness and no I/O to import. Take timestamps and ids from the
//!   input; seed any pseudo-random generator from your state.
//! - CPU is counted, not timed: every call gets a budget of *fuel* (`[runtime.limits] fuel`,
//!   500 million by default, about one unit per WebAssembly instruction). A batch that runs
//!   out fails the same way every time, with an error naming the setting. A wall-clock limit
//!   (`batch_timeout`, 1 s) remains as a backstop; hitting it is treated as a fault of the
//!   server, and the batch can be sent again.
//! - Floating point is deterministic: NaNs get one canonical bit pattern whatever the
//!   machine, and relaxed SIMD behaves the same everywhere.
//! - Memory limits are deterministic too: the same batch on the same state allocates the same.
//!
//! What the host cannot check, you keep: iterate `HashMap`s only where order does not reach
//! your output (or use `BTreeMap`, whose order is fixed), and do not depend on addresses.
//!
//! See `examples/guests/ticker` and `examples/guests/logstats` in the viewtape repository for
//! real runtimes.
#![deny(missing_docs)]

pub mod abi;
mod context;
mod export;
mod schemas;
mod state;
pub mod testing;

pub use context::{Context, Level, Output};
#[cfg(feature = "schema")]
pub use schemars;
pub use schemas::Schemas;

/// The glue the [`export_runtime!`] macro expands to. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::export::{init, input, on_batch, restore, save};
}

/// An ingestion runtime. See the [crate docs](crate) for a complete example.
pub trait Runtime: Sized + 'static {
    /// Builds the runtime from its config bytes (whatever the server's config gives it; empty
    /// when there is none).
    ///
    /// # Errors
    /// A config the runtime cannot use; the server refuses to start the runtime.
    fn init(config: &[u8]) -> Result<Self>;

    /// Processes one batch of input, emitting events through `ctx`.
    ///
    /// # Errors
    /// Any error rejects the whole batch: nothing emitted during it is published and the
    /// runtime is rolled back to its state after the last good batch. Name what was wrong
    /// and where (e.g. the line number): the message reaches the client that sent the batch.
    fn on_batch(&mut self, input: &[u8], ctx: &mut Context) -> Result<()>;

    /// Serializes the runtime's state; [`Runtime::restore`] must accept the result. The host
    /// stores it with [`Runtime::STATE_VERSION`].
    fn save(&self) -> Vec<u8>;

    /// Replaces the runtime's state with one produced by [`Runtime::save`] of this
    /// [`Runtime::STATE_VERSION`] (older versions come through [`Runtime::migrate`] first).
    ///
    /// # Errors
    /// State the runtime cannot read.
    fn restore(&mut self, state: &[u8]) -> Result<()>;

    /// The JSON Schemas of the values this runtime publishes, per view (none by default: every
    /// view untyped). The host asks once, right after [`Runtime::init`], validates every value
    /// published to a typed view against its schema, and rejects a batch with a value that does
    /// not fit, whole; it serves each schema at `GET /views/{view}/schema`.
    ///
    /// ```
    /// # use viewtape_guest::{Context, Result, Runtime, Schemas};
    /// # struct Prices;
    /// impl Runtime for Prices {
    ///     fn schemas(&self) -> Schemas {
    ///         // With the `schema` feature: Schemas::new().view::<Price>("prices")
    ///         Schemas::new().view_json("prices", r#"{"type":"object","required":["price"]}"#)
    ///     }
    ///     // …
    /// #   fn init(_: &[u8]) -> Result<Self> { Ok(Prices) }
    /// #   fn on_batch(&mut self, _: &[u8], _: &mut Context) -> Result<()> { Ok(()) }
    /// #   fn save(&self) -> Vec<u8> { Vec::new() }
    /// #   fn restore(&mut self, _: &[u8]) -> Result<()> { Ok(()) }
    /// }
    /// ```
    fn schemas(&self) -> Schemas {
        Schemas::new()
    }

    /// The version of the format [`Runtime::save`] writes. Raise it when the format changes,
    /// and teach [`Runtime::migrate`] the older ones: a new build deployed with `viewtape
    /// deploy` then takes over the state the running build saved.
    const STATE_VERSION: u32 = 0;

    /// Turns state saved with version `from` (0: before versions existed) into this
    /// [`Runtime::STATE_VERSION`]'s format, for [`Runtime::restore`].
    ///
    /// # Errors
    /// A version the runtime cannot read. The default refuses every other version: a deploy of
    /// a build with another version is then refused, and the running build keeps going.
    fn migrate(from: u32, state: &[u8]) -> Result<Vec<u8>> {
        let _ = state;
        Err(Error::msg(format!(
            "no migration from state version {from}: implement Runtime::migrate"
        )))
    }
}

/// The result type of [`Runtime`] methods.
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// An error a runtime reports: a message for the server's log and the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    message: String,
}

impl Error {
    /// An error with `message`.
    pub fn msg(message: impl core::fmt::Display) -> Self {
        Self {
            message: message.to_string(),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<String> for Error {
    fn from(message: String) -> Self {
        Self { message }
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Self {
        Self::msg(message)
    }
}
