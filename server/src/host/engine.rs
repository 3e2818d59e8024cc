//! The shared wasmtime engine and its linker with the ABI's host functions.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use viewtape_guest::abi;
use wasmtime::{
    Caller, Config, Engine, InstanceAllocationStrategy, InstancePre, Linker, Memory, OptLevel,
    PoolingAllocationConfig, ResourceLimiter,
};

use super::image::{Images, InitImage};
use super::{EngineConfig, GuestError, LoadError, ModuleFingerprint};

/// Longest guest error or log message kept, in bytes.
const MAX_MESSAGE_BYTES: usize = 4096;

/// Most guest log lines one call into the guest (a batch) writes to the server's log.
const LOG_LINES_PER_CALL: u32 = 100;

/// Most bytes of guest log lines one call writes to the server's log.
const LOG_BYTES_PER_CALL: usize = 16 * 1024;

/// Most guest log lines an instance writes to the server's log in a minute.
const LOG_LINES_PER_MINUTE: u32 = 600;

/// Pool slots kept beside [`EngineConfig::pooled_instances`] for the short-lived instances that
/// check a JavaScript module's syntax at load, which take a slot without waiting for one.
const CHECK_SLOTS: u32 = 4;

/// The engine every guest of the server runs on. Cheap to clone.
#[derive(Clone)]
pub struct GuestEngine {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    linker: Linker<HostState>,
    config: EngineConfig,
    pooled: bool,
    /// One permit per instance that may be alive at once ([`EngineConfig::pooled_instances`]);
    /// `None`: no bound.
    running: Option<Arc<Semaphore>>,
    /// The JS engine guest (`guests::JS_ENGINE_WASM`), compiled on first use (or loaded from
    /// the code cache): a server without JavaScript runtimes never pays its compile (about two
    /// seconds), one with many pays it once. The lock is held while compiling, so concurrent loads wait for the one compile.
    js_engine: Mutex<Option<Arc<InstancePre<HostState>>>>,
    /// The WebAssembly modules compiled last, by fingerprint: a module that is checked, kept
    /// and then run (an upload, a definition, a deploy, a cluster's record of either) is
    /// compiled once, not at each step.
    recent: Mutex<VecDeque<(ModuleFingerprint, Arc<InstancePre<HostState>>)>>,
    /// What `init` left in instances lately, by module and config (see `image.rs`).
    images: Mutex<Images>,
}

/// How many compiled modules [`GuestEngine`] keeps for the next load of the same bytes.
const RECENT_MODULES: usize = 16;

impl std::fmt::Debug for GuestEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestEngine")
            .field("config", &self.inner.config)
            .field("pooled", &self.inner.pooled)
            .finish_non_exhaustive()
    }
}

impl GuestEngine {
    /// Creates the engine. If the pooling allocator cannot reserve its address space, falls
    /// back to on-demand allocation (logged).
    ///
    /// # Errors
    /// [`LoadError::Engine`] if wasmtime refuses the configuration.
    pub fn new(config: EngineConfig) -> Result<Self, LoadError> {
        let (engine, pooled) = match config.pooled_instances {
            0 => (build(&config, false)?, false),
            _ => match build(&config, true) {
                Ok(engine) => (engine, true),
                Err(err) => {
                    tracing::warn!(error = %err, "pooling allocator unavailable; allocating instances on demand");
                    (build(&config, false)?, false)
                }
            },
        };
        let linker = linker(&engine).map_err(|e| LoadError::Engine(e.into_boxed_dyn_error()))?;
        let running = (config.pooled_instances > 0)
            .then(|| Arc::new(Semaphore::new(config.pooled_instances as usize)));
        Ok(Self {
            inner: Arc::new(Inner {
                engine,
                linker,
                config,
                pooled,
                running,
                js_engine: Mutex::new(None),
                recent: Mutex::new(VecDeque::new()),
                images: Mutex::new(Images::default()),
            }),
        })
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The settings it was made with.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Whether instances come from the pooling allocator.
    pub fn is_pooled(&self) -> bool {
        self.inner.pooled
    }

    /// A permit to keep one instance alive, waiting up to `wait` for one to be free; `None`
    /// when instances are not bounded.
    ///
    /// # Errors
    /// [`GuestError::InstancesUsedUp`]: every permit stayed taken for `wait`.
    pub(crate) async fn instance_permit(
        &self,
        wait: Duration,
    ) -> Result<Option<OwnedSemaphorePermit>, GuestError> {
        let Some(running) = &self.inner.running else {
            return Ok(None);
        };
        match tokio::time::timeout(wait, Arc::clone(running).acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Some(permit)),
            Ok(Err(_)) | Err(_) => Err(GuestError::InstancesUsedUp {
                limit: self.inner.config.pooled_instances,
            }),
        }
    }

    pub(crate) fn linker(&self) -> &Linker<HostState> {
        &self.inner.linker
    }

    /// Compiles the JS engine guest into the code cache now, in the background, unless the
    /// cache holds it already (loading it is cheap, and left to its first use): the first
    /// JavaScript runtime defined later does not wait seconds for the compile.
    pub fn compile_js_engine_ahead(&self) {
        let Some(dir) = self.inner.config.cache_dir.as_deref() else {
            return;
        };
        if super::code_cache::is_kept(&self.inner.engine, super::guests::JS_ENGINE_WASM, dir) {
            return;
        }
        let engine = self.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(error) = engine.js_engine() {
                tracing::error!(%error, "the JavaScript engine does not load: JavaScript runtimes cannot run");
            }
        });
    }

    /// The JS engine guest, compiled and pre-linked for this engine (once; see `js.rs`).
    ///
    /// # Errors
    /// [`LoadError::Compile`] / [`LoadError::Link`] if the embedded module does not load: a
    /// broken build of the server, not of the user's module.
    pub(crate) fn js_engine(&self) -> Result<Arc<InstancePre<HostState>>, LoadError> {
        let mut slot = self
            .inner
            .js_engine
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(pre) = &*slot {
            return Ok(pre.clone());
        }
        let module = super::code_cache::load_or_compile(
            &self.inner.engine,
            super::guests::JS_ENGINE_WASM,
            self.inner.config.cache_dir.as_deref(),
        )?;
        let pre = Arc::new(
            self.inner
                .linker
                .instantiate_pre(&module)
                .map_err(|e| LoadError::Link(e.into_boxed_dyn_error()))?,
        );
        *slot = Some(pre.clone());
        Ok(pre)
    }

    /// The init image of module `fingerprint` with `config`, if one is kept.
    pub(crate) fn image(
        &self,
        fingerprint: &ModuleFingerprint,
        config: &[u8],
    ) -> Option<Arc<InitImage>> {
        self.inner
            .images
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(fingerprint, config)
    }

    /// Keeps `image` for the next instances of its module with its config.
    pub(crate) fn keep_image(&self, image: Arc<InitImage>) {
        self.inner
            .images
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keep(image);
    }

    /// The module with `fingerprint` if it was compiled lately.
    pub(crate) fn recent(
        &self,
        fingerprint: &ModuleFingerprint,
    ) -> Option<Arc<InstancePre<HostState>>> {
        let recent = self
            .inner
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        recent
            .iter()
            .find(|(kept, _)| kept == fingerprint)
            .map(|(_, pre)| Arc::clone(pre))
    }

    /// Keeps `pre`, compiled from the module `fingerprint` names, for its next load.
    pub(crate) fn remember(
        &self,
        fingerprint: ModuleFingerprint,
        pre: Arc<InstancePre<HostState>>,
    ) {
        let mut recent = self
            .inner
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if recent.iter().any(|(kept, _)| *kept == fingerprint) {
            return;
        }
        if recent.len() == RECENT_MODULES {
            recent.pop_front();
        }
        recent.push_back((fingerprint, pre));
    }
}

fn build(config: &EngineConfig, pooled: bool) -> Result<Engine, LoadError> {
    let mut c = Config::new();
    c.cranelift_opt_level(OptLevel::Speed)
        // Determinism: a replay of the same input on the same state must produce the same
        // output. Fuel makes the CPU limit a count, not a time; NaNs get one bit pattern
        // whatever the hardware; relaxed SIMD behaves the same on every machine. Fuel is also
        // what makes a running guest yield (see `instance.rs`): one count instrumented into the
        // guest's code, not two (epoch interruption would add its own check to every loop).
        .consume_fuel(true)
        .cranelift_nan_canonicalization(true)
        .relaxed_simd_deterministic(true)
        .wasm_memory64(false)
        // Room for about 1,500 levels of JavaScript calls, whose engine stops at about 950
        // with a `RangeError` (see the JS guest's `MAX_STACK_BYTES`); within the 2 MiB stack
        // each guest call runs on.
        .max_wasm_stack(1 << 20);
    if pooled {
        let slots = config.pooled_instances + CHECK_SLOTS;
        let mut pool = PoolingAllocationConfig::default();
        pool.total_core_instances(slots)
            .total_memories(slots)
            .total_tables(slots)
            .total_stacks(slots)
            .total_component_instances(0)
            .max_memory_size(config.max_memory_bytes)
            .max_unused_warm_slots(slots.min(8))
            .table_elements(20_000);
        c.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    Engine::new(&c).map_err(|e| LoadError::Engine(e.into_boxed_dyn_error()))
}

/// The data of every guest `Store`.
pub(crate) struct HostState {
    pub(crate) runtime: Arc<str>,
    pub(crate) limiter: Limiter,
    /// Cached after instantiation so host calls do not look it up by name.
    pub(crate) memory: Option<Memory>,
    /// What the guest handed over with `reply` during the current call.
    pub(crate) reply: Option<Bytes>,
    /// What the guest reported with `error` during the current call.
    pub(crate) error: Option<String>,
    /// The current batch's ingest time, as the log holds it (Unix ms); `0` outside a batch.
    pub(crate) batch_time_ms: i64,
    /// What the guest may still write to the server's log.
    pub(crate) log: GuestLog,
}

/// The bounds on what a guest writes to the server's log ([`LOG_LINES_PER_CALL`],
/// [`LOG_BYTES_PER_CALL`], [`LOG_LINES_PER_MINUTE`]): lines over them are dropped, counted, and
/// the count said once after the call. What the guest publishes never depends on it.
#[derive(Debug, Default)]
pub(crate) struct GuestLog {
    lines: u32,
    bytes: usize,
    dropped: u64,
    /// The start of the current minute, and the lines written in it.
    minute: Option<(std::time::Instant, u32)>,
}

impl GuestLog {
    /// Whether a line of `len` bytes may be written now; counts it either way.
    fn admit(&mut self, len: usize) -> bool {
        let now = std::time::Instant::now();
        let (start, written) = self.minute.get_or_insert((now, 0));
        if now.duration_since(*start) >= std::time::Duration::from_secs(60) {
            (*start, *written) = (now, 0);
        }
        let admitted = self.lines < LOG_LINES_PER_CALL
            && self.bytes + len <= LOG_BYTES_PER_CALL
            && *written < LOG_LINES_PER_MINUTE;
        if admitted {
            self.lines += 1;
            self.bytes += len;
            *written += 1;
        } else {
            self.dropped += 1;
        }
        admitted
    }

    /// Ends a call's budget; how many lines it dropped.
    pub(crate) fn end_call(&mut self) -> u64 {
        (self.lines, self.bytes) = (0, 0);
        std::mem::take(&mut self.dropped)
    }
}

/// The memory limiter; remembers that it refused growth, so the failure that follows (a Rust
/// guest aborts when allocation fails) is reported as [`super::GuestError::MemoryExceeded`].
pub(crate) struct Limiter {
    pub(crate) max_memory_bytes: usize,
    pub(crate) memory_exceeded: bool,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_memory_bytes {
            self.memory_exceeded = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 20_000)
    }

    fn instances(&self) -> usize {
        1
    }

    fn tables(&self) -> usize {
        4
    }

    fn memories(&self) -> usize {
        1
    }
}

/// Copies `len` bytes at `ptr` out of the guest's memory.
fn guest_bytes<'a>(
    caller: &'a Caller<'_, HostState>,
    ptr: i32,
    len: i32,
) -> wasmtime::Result<&'a [u8]> {
    let memory = caller
        .data()
        .memory
        .ok_or_else(|| wasmtime::Error::msg("host call before the memory was bound"))?;
    let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
    memory
        .data(caller)
        .get(ptr..ptr.saturating_add(len))
        .ok_or_else(|| wasmtime::Error::msg(format!("guest pointer {ptr}+{len} is out of bounds")))
}

/// A guest's text as the server keeps it: at most [`MAX_MESSAGE_BYTES`], every control
/// character escaped (`\n`, `\u{1b}`), so that no guest text forges or breaks a log line.
fn message(bytes: &[u8]) -> String {
    let bytes = &bytes[..bytes.len().min(MAX_MESSAGE_BYTES)];
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c.is_control() {
            true => out.extend(c.escape_debug()),
            false => out.push(c),
        }
    }
    out
}

fn linker(engine: &Engine) -> wasmtime::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    linker.func_wrap(
        abi::IMPORT_MODULE,
        abi::IMPORT_REPLY,
        |mut caller: Caller<'_, HostState>, ptr: i32, len: i32| -> wasmtime::Result<()> {
            let reply = Bytes::copy_from_slice(guest_bytes(&caller, ptr, len)?);
            caller.data_mut().reply = Some(reply);
            Ok(())
        },
    )?;
    linker.func_wrap(
        abi::IMPORT_MODULE,
        abi::IMPORT_ERROR,
        |mut caller: Caller<'_, HostState>, ptr: i32, len: i32| -> wasmtime::Result<()> {
            let msg = message(guest_bytes(&caller, ptr, len)?);
            caller.data_mut().error = Some(msg);
            Ok(())
        },
    )?;
    linker.func_wrap(
        abi::IMPORT_MODULE,
        abi::IMPORT_LOG,
        |mut caller: Caller<'_, HostState>,
         level: i32,
         ptr: i32,
         len: i32|
         -> wasmtime::Result<()> {
            let msg = message(guest_bytes(&caller, ptr, len)?);
            if !caller.data_mut().log.admit(msg.len()) {
                return Ok(());
            }
            let runtime = &*caller.data().runtime;
            match level {
                1 => tracing::error!(runtime, guest = %msg),
                2 => tracing::warn!(runtime, guest = %msg),
                3 => tracing::info!(runtime, guest = %msg),
                4 => tracing::debug!(runtime, guest = %msg),
                _ => tracing::trace!(runtime, guest = %msg),
            }
            Ok(())
        },
    )?;
    linker.func_wrap(
        abi::IMPORT_MODULE,
        abi::IMPORT_BATCH_TIME,
        |caller: Caller<'_, HostState>| -> i64 { caller.data().batch_time_ms },
    )?;
    Ok(linker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_text_keeps_no_control_character() {
        let forged = "ok\n2026-01-01T00:00:00Z  INFO viewtape_server: admin\u{1b}[31m\r\tend";
        let kept = message(forged.as_bytes());
        assert!(!kept.chars().any(char::is_control), "{kept:?}");
        assert_eq!(
            kept,
            "ok\\n2026-01-01T00:00:00Z  INFO viewtape_server: admin\\u{1b}[31m\\r\\tend"
        );
        assert_eq!(message("résumé ✓".as_bytes()), "résumé ✓");
        assert_eq!(message(&[b'a'; 10_000]).len(), MAX_MESSAGE_BYTES);
    }

    #[test]
    fn guest_log_lines_are_bounded_per_call_and_counted() {
        let mut log = GuestLog::default();
        let admitted = (0..1_000).filter(|_| log.admit(10)).count();
        assert_eq!(admitted, LOG_LINES_PER_CALL as usize);
        assert_eq!(log.end_call(), 900);
        // The next call has its own budget, in bytes too.
        assert!(log.admit(LOG_BYTES_PER_CALL));
        assert!(!log.admit(1));
        assert_eq!(log.end_call(), 1);
        // And the minute's bound holds across calls.
        let mut written = LOG_LINES_PER_CALL as usize + 1;
        for _ in 0..20 {
            written += (0..LOG_LINES_PER_CALL).filter(|_| log.admit(1)).count();
            log.end_call();
        }
        assert_eq!(written, LOG_LINES_PER_MINUTE as usize);
    }
}
