//! Limits per runtime and engine-wide settings, with safe defaults.

use std::path::PathBuf;
use std::time::Duration;

/// What one runtime may use. `Limits { batch_timeout, ..Default::default() }` works.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest linear memory, in bytes. Default 64 MiB. Capped by
    /// [`EngineConfig::max_memory_bytes`].
    pub max_memory_bytes: usize,
    /// CPU one call into the guest (a batch, a save, init) may use, in wasmtime fuel (about
    /// one unit per WebAssembly instruction). Counted, not timed: the same call on the same
    /// state always passes or always fails, which a replay relies on. Default 500 million.
    pub fuel: u64,
    /// Wall time one call may take: a backstop for what fuel does not count (host calls, a
    /// starved machine), checked each time a running guest yields. Hitting it is a fault of the
    /// server, not a verdict on the batch. Default 1 s.
    pub batch_timeout: Duration,
    /// Largest batch of input, in bytes; bigger batches are refused before the guest sees
    /// them. Default 4 MiB.
    pub max_batch_bytes: usize,
    /// Largest event payload, and largest event key, in bytes. Default 1 MiB.
    pub max_event_bytes: usize,
}

/// [`Limits::fuel`] by default: about a third of a second of guest code on this project's
/// machines, well inside the default wall-clock backstop.
pub const DEFAULT_FUEL: u64 = 500_000_000;

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_memory_bytes: 64 << 20,
            fuel: DEFAULT_FUEL,
            batch_timeout: Duration::from_secs(1),
            max_batch_bytes: 4 << 20,
            max_event_bytes: 1 << 20,
        }
    }
}

/// Engine-wide settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Instance slots of the pooling allocator, i.e. the most guest instances alive at once
    /// (a runtime holds one, two for an instant while it is re-instantiated). `0` uses on-demand
    /// allocation instead. Default 64. Each slot reserves virtual address space (about 4 GiB
    /// with the default guard regions), no physical memory.
    pub pooled_instances: u32,
    /// Largest linear memory any runtime may be given (the pool's slot size). Default 64 MiB.
    pub max_memory_bytes: usize,
    /// Where compiled code is kept between processes (`code_cache.rs`); `None` compiles it in
    /// every process. Default `None`.
    pub cache_dir: Option<PathBuf>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            pooled_instances: 64,
            max_memory_bytes: 64 << 20,
            cache_dir: None,
        }
    }
}
