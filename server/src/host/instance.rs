//! One running guest: a `Store` and its instance.

use std::sync::Arc;

use bytes::Bytes;
use viewtape_guest::abi;
use wasmtime::{Store, Trap, TypedFunc, WasmParams};

use super::batch::{decode, ViewNames};
use super::engine::{HostState, Limiter};
use super::image::InitImage;
use super::{GuestBatch, GuestError, GuestModule, Limits};

/// Fuel between two yields of a running guest to tokio: about a millisecond of guest code (see
/// [`super::DEFAULT_FUEL`]). A yield is where other tasks of its thread get to run and where
/// [`Limits::batch_timeout`] can stop the call.
const YIELD_FUEL: u64 = 5_000_000;

/// A running guest. Owned by one task; every method takes `&mut self`.
///
/// After any method returns an error the instance must be dropped (see the module docs of
/// `host`); the methods do not stop you from calling them again, but the guest's state is
/// unspecified.
pub struct GuestInstance {
    store: Store<HostState>,
    input: TypedFunc<i32, i32>,
    restore: TypedFunc<i32, i32>,
    on_batch: TypedFunc<i32, i32>,
    save: TypedFunc<(), i32>,
    /// The guest's input buffer: its address and capacity (0 until first asked for).
    input_buf: (usize, usize),
    views: ViewNames,
    limits: Limits,
    /// What `init` replied: the guest's declaration (`ABI.md`), if it made one.
    declaration: Option<Bytes>,
    /// Its calls are held to [`Limits::fuel`] ([`GuestInstance::meter`]).
    metered: bool,
    /// Its place among the instances alive at once, given back when it is dropped.
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl std::fmt::Debug for GuestInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestInstance")
            .field("runtime", &self.store.data().runtime)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl GuestInstance {
    /// Instantiates `module` for the runtime named `runtime`, calls `init(config)`, then
    /// `restore(state)` if a state is given.
    ///
    /// It waits up to [`Limits::batch_timeout`] for a place among the instances the engine
    /// keeps alive at once.
    ///
    /// # Errors
    /// [`GuestError::InstancesUsedUp`] if no place came free in time, [`GuestError::Instantiate`]
    /// if no instance can be made; whatever `init` or `restore` failed with otherwise.
    pub async fn new(
        module: &GuestModule,
        runtime: &str,
        limits: &Limits,
        config: &[u8],
        state: Option<&[u8]>,
    ) -> Result<Self, GuestError> {
        let engine = module.engine();
        let permit = engine.instance_permit(limits.batch_timeout).await?;
        let mut limits = limits.clone();
        limits.max_memory_bytes = limits
            .max_memory_bytes
            .min(engine.config().max_memory_bytes);
        let mut store = Store::new(
            engine.engine(),
            HostState {
                runtime: Arc::from(runtime),
                limiter: Limiter {
                    max_memory_bytes: limits.max_memory_bytes,
                    memory_exceeded: false,
                },
                memory: None,
                reply: None,
                batch_time_ms: 0,
                error: None,
                log: Default::default(),
            },
        );
        store.limiter(|s| &mut s.limiter);
        store
            .set_fuel(limits.fuel)
            .map_err(|e| GuestError::Instantiate(e.into_boxed_dyn_error()))?;
        store
            .fuel_async_yield_interval(Some(YIELD_FUEL))
            .map_err(|e| GuestError::Instantiate(e.into_boxed_dyn_error()))?;
        let instance = module
            .pre()?
            .instantiate_async(&mut store)
            .await
            .map_err(|e| {
                if store.data().limiter.memory_exceeded {
                    GuestError::MemoryExceeded {
                        limit: limits.max_memory_bytes,
                    }
                } else if e.is::<wasmtime::PoolConcurrencyLimitError>() {
                    GuestError::InstancesUsedUp {
                        limit: engine.config().pooled_instances,
                    }
                } else {
                    GuestError::Instantiate(e.into_boxed_dyn_error())
                }
            })?;
        let memory = instance
            .get_memory(&mut store, abi::EXPORT_MEMORY)
            .ok_or_else(|| GuestError::Protocol("no memory export".into()))?;
        store.data_mut().memory = Some(memory);
        let func = |store: &mut Store<HostState>, name: &str| {
            instance
                .get_typed_func::<i32, i32>(store, name)
                .map_err(|e| GuestError::Protocol(format!("export `{name}`: {e}")))
        };
        let input = func(&mut store, abi::EXPORT_INPUT)?;
        let init = func(&mut store, abi::EXPORT_INIT)?;
        let restore = func(&mut store, abi::EXPORT_RESTORE)?;
        let on_batch = func(&mut store, abi::EXPORT_ON_BATCH)?;
        let save = instance
            .get_typed_func::<(), i32>(&mut store, abi::EXPORT_SAVE)
            .map_err(|e| GuestError::Protocol(format!("export `{}`: {e}", abi::EXPORT_SAVE)))?;
        // A JavaScript guest's `init` is most of its instance's cost: its image is kept.
        let imaged = module.is_javascript();
        let image = imaged
            .then(|| engine.image(module.fingerprint(), config))
            .flatten();
        let mut this = Self {
            store,
            input,
            restore,
            on_batch,
            save,
            input_buf: (0, 0),
            views: ViewNames::default(),
            limits,
            declaration: None,
            metered: true,
            _permit: permit,
        };
        match image {
            Some(image) => {
                image.apply(&mut this.store, memory)?;
                this.input_buf = image.input_buf;
                this.declaration = image.declaration.clone();
            }
            None => {
                let fresh = imaged.then(|| memory.data(&this.store).to_vec());
                let len = this.write_input(&module.init_input(config)).await?;
                this.call(init, len)
                    .await
                    .map_err(|e| refused("config", e))?;
                this.declaration = this.store.data_mut().reply.take();
                if let Some(fresh) = fresh {
                    engine.keep_image(Arc::new(InitImage::capture(
                        (module.fingerprint().clone(), Bytes::copy_from_slice(config)),
                        &this.store,
                        memory,
                        &fresh,
                        this.input_buf,
                        this.declaration.clone(),
                    )));
                }
            }
        }
        if let Some(state) = state {
            let len = this.write_input(state).await?;
            let f = this.restore.clone();
            this.call(f, len)
                .await
                .map_err(|e| refused("saved state", e))?;
        }
        Ok(this)
    }

    /// A copy of its linear memory.
    #[cfg(test)]
    pub(crate) fn memory_bytes(&self) -> Vec<u8> {
        self.store
            .data()
            .memory
            .map(|memory| memory.data(&self.store).to_vec())
            .unwrap_or_default()
    }

    /// The runtime's name.
    pub fn runtime(&self) -> &str {
        &self.store.data().runtime
    }

    /// The declaration its `init` replied with (`ABI.md`, "The declaration"), if any.
    pub fn declaration(&self) -> Option<&[u8]> {
        self.declaration.as_deref()
    }

    /// The limits it runs under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Runs one batch, ingested at `at_ms` (Unix ms, as the log holds it: what the guest's
    /// `batch_time` import answers during the call), and returns what the guest emitted.
    ///
    /// # Errors
    /// [`GuestError::BatchTooLarge`] before the guest is called; otherwise any failure of the
    /// guest, each naming its cause.
    pub async fn on_batch(&mut self, input: &[u8], at_ms: u64) -> Result<GuestBatch, GuestError> {
        if input.len() > self.limits.max_batch_bytes {
            return Err(GuestError::BatchTooLarge {
                size: input.len(),
                limit: self.limits.max_batch_bytes,
            });
        }
        let len = self.write_input(input).await?;
        let f = self.on_batch.clone();
        self.store.data_mut().batch_time_ms = i64::try_from(at_ms).unwrap_or(i64::MAX);
        let called = self.call(f, len).await;
        self.store.data_mut().batch_time_ms = 0;
        called?;
        let reply = self.take_reply()?;
        decode(reply, &mut self.views, self.limits.max_event_bytes)
    }

    /// Asks the guest for its state.
    ///
    /// # Errors
    /// Any failure of the guest.
    pub async fn save(&mut self) -> Result<Bytes, GuestError> {
        let f = self.save.clone();
        self.call(f, ()).await?;
        self.take_reply()
    }

    fn take_reply(&mut self) -> Result<Bytes, GuestError> {
        self.store
            .data_mut()
            .reply
            .take()
            .ok_or_else(|| GuestError::Protocol("guest returned success without a reply".into()))
    }

    /// Writes `bytes` into the guest's input buffer (growing it if needed); returns the length
    /// to pass to the export.
    async fn write_input(&mut self, bytes: &[u8]) -> Result<i32, GuestError> {
        let len = i32::try_from(bytes.len()).map_err(|_| GuestError::BatchTooLarge {
            size: bytes.len(),
            limit: i32::MAX as usize,
        })?;
        if bytes.len() > self.input_buf.1 || self.input_buf.1 == 0 {
            let f = self.input.clone();
            let ptr = self.call_raw(f, len.max(1)).await?;
            if ptr == 0 {
                return Err(self.memory_error("guest could not allocate its input buffer"));
            }
            self.input_buf = (ptr as u32 as usize, bytes.len().max(1));
        }
        let memory = self
            .store
            .data()
            .memory
            .ok_or_else(|| GuestError::Protocol("memory not bound".into()))?;
        memory
            .write(&mut self.store, self.input_buf.0, bytes)
            .map_err(|_| GuestError::Protocol("guest input buffer is out of bounds".into()))?;
        Ok(len)
    }

    fn memory_error(&self, fallback: &str) -> GuestError {
        if self.store.data().limiter.memory_exceeded {
            GuestError::MemoryExceeded {
                limit: self.limits.max_memory_bytes,
            }
        } else {
            GuestError::Protocol(fallback.into())
        }
    }

    /// Whether its calls are held to [`Limits::fuel`] (they are, unless a batch whose verdict
    /// was given already runs again: a replay follows the verdict the live run gave, whatever
    /// fuel this instance's history makes it cost now).
    pub fn meter(&mut self, metered: bool) {
        self.metered = metered;
    }

    /// Fuel left of the last call's budget ([`Limits::fuel`]).
    pub fn fuel_left(&self) -> u64 {
        self.store.get_fuel().unwrap_or(0)
    }

    /// Calls an export that returns a status.
    async fn call<P: WasmParams + Sync>(
        &mut self,
        f: TypedFunc<P, i32>,
        params: P,
    ) -> Result<(), GuestError> {
        match self.call_raw(f, params).await? {
            abi::STATUS_OK => Ok(()),
            // A guest that handles a refused `memory.grow` (QuickJS throws `out of memory`)
            // failed for its memory all the same, not for its input.
            abi::STATUS_ERROR if self.store.data().limiter.memory_exceeded => {
                Err(GuestError::MemoryExceeded {
                    limit: self.limits.max_memory_bytes,
                })
            }
            abi::STATUS_ERROR => Err(GuestError::GuestRejected {
                message: self
                    .store
                    .data_mut()
                    .error
                    .take()
                    .unwrap_or_else(|| "(the guest gave no message)".into()),
            }),
            other => Err(GuestError::Protocol(format!("unknown status {other}"))),
        }
    }

    /// Calls an export under the time limit.
    async fn call_raw<P: WasmParams + Sync>(
        &mut self,
        f: TypedFunc<P, i32>,
        params: P,
    ) -> Result<i32, GuestError> {
        let limit = self.limits.batch_timeout;
        let data = self.store.data_mut();
        data.error = None;
        data.reply = None;
        data.limiter.memory_exceeded = false;
        let fuel = match self.metered {
            true => self.limits.fuel,
            false => u64::MAX,
        };
        self.store
            .set_fuel(fuel)
            .map_err(|e| GuestError::Instantiate(e.into_boxed_dyn_error()))?;
        let called = tokio::time::timeout(limit, f.call_async(&mut self.store, params)).await;
        let dropped = self.store.data_mut().log.end_call();
        if dropped > 0 {
            let runtime = &*self.store.data().runtime;
            tracing::warn!(
                runtime,
                dropped,
                "guest log lines dropped: over the bound of a call or of a minute"
            );
        }
        match called {
            Err(_elapsed) => Err(GuestError::Timeout { limit }),
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(classify(err, &mut self.store, &self.limits)),
        }
    }
}

/// An `init` or `restore` refusal, told apart from a refused batch.
fn refused(what: &'static str, error: GuestError) -> GuestError {
    match error {
        GuestError::GuestRejected { message } => GuestError::Refused { what, message },
        other => other,
    }
}

/// Names the cause of a failed call.
fn classify(err: wasmtime::Error, store: &mut Store<HostState>, limits: &Limits) -> GuestError {
    let data = store.data_mut();
    if data.limiter.memory_exceeded {
        return GuestError::MemoryExceeded {
            limit: limits.max_memory_bytes,
        };
    }
    match err.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => GuestError::FuelExhausted { fuel: limits.fuel },
        Some(trap) => GuestError::Trap {
            trap: trap.to_string(),
            message: data.error.take(),
        },
        None if err.is::<wasmtime::OutOfMemory>() => {
            GuestError::Instantiate(err.into_boxed_dyn_error())
        }
        None => GuestError::Trap {
            trap: format!("{err:#}"),
            message: data.error.take(),
        },
    }
}
