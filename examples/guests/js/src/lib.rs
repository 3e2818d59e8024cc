//! `js`: the JavaScript engine guest. QuickJS (through `rquickjs`), compiled to
//! `wasm32-unknown-unknown` and exported with the SDK like any guest, runs a user's JavaScript
//! module as a runtime (`DESIGN.md` §15). The server embeds it and gives it the user's source
//! with the runtime's config, framed as `ABI.md` ("JavaScript guests") says.
//!
//! ## The contract
//!
//! The user's module (ES module syntax, strict) exports:
//!
//! - `onBatch(state, input, ctx)` (required): `input` is the batch as a string; returns the new
//!   state (returning `undefined` keeps `state`, which it may have changed in place), or a
//!   promise of it (`async onBatch`). A throw or a rejection rejects the whole batch; the
//!   message names the error and where it was thrown (`guest.js:LINE:COLUMN`).
//! - `init(config)` (optional): `config` is the runtime's config string; returns the initial
//!   state (`{}` without an `init`).
//! - `schemas` (optional): `{ VIEW: JSON Schema, … }`, the runtime's declaration.
//! - `migrate(old)` (optional): called at a restore when the state was saved by another source
//!   (a deploy of an edited module); returns the state this source works with. Without it the
//!   old state is taken as it is. State another guest saved (a WebAssembly build of the
//!   runtime, whose format is its own) reaches `migrate` as the saved bytes, a string (a
//!   `Uint8Array` if they are not UTF-8); without a `migrate` such state is refused.
//!
//! `ctx.publish(view, key, value)` publishes a string or a `Uint8Array` as its bytes and any
//! other value as its JSON; `ctx.delete(view, key)`, `ctx.reportGap(reason)` and
//! `ctx.log(level, message)` (`'debug' | 'info' | 'warn' | 'error'`) do what the SDK's
//! `Context` does.
//!
//! ## State
//!
//! Saved as JSON: `{"source":"<FNV-1a 64 of the source, hex>","batches":N,"state":STATE}`
//! after the SDK's version header, at the end of every batch. The host runs every batch on an
//! instance made from the state the last one saved, so a batch sees exactly what that JSON
//! gives back — never a live object of an earlier batch, nor a module-level variable's value
//! from one (module code runs again for each batch). A state JSON would not give back as it
//! is — a `Set`, a `Map`, a `Date`, a class instance, a typed array, `NaN`, a `toJSON`, a
//! getter, a cycle, a `BigInt` — rejects the batch that made it, naming where (`state.rs`);
//! `undefined` members are dropped and `-0` is `0`, as JSON has them.
//!
//! ## Determinism
//!
//! - There is no clock. During a batch, `Date.now()` and `new Date()` are the batch's ingest
//!   time as the log holds it (the SDK's `Context::batch_time_ms`, the host's `batch_time`):
//!   the same on every node and at every replay. Outside a batch (`init`, `migrate`) they are
//!   the epoch.
//! - `Math.random()` is a SplitMix64 stream reseeded before every batch from the number of
//!   batches the runtime has run (carried in its state) and the batch's ingest time, so a
//!   replay draws the same numbers.
//! - Promise jobs (`await`, `.then`) run to the end before a call returns; a promise that
//!   none of them settles fails the batch. No timers, no I/O, no `import` of other modules.
//! - No `WeakRef` nor `FinalizationRegistry`: they tell when the garbage collector ran.
//!
//! Recursion deeper than about 950 calls throws a `RangeError` (see `MAX_STACK_BYTES`).
//!
//! ## Why a Rust guest around QuickJS
//!
//! The SDK already implements the ABI (buffers, replies, the panic hook, the declaration); the
//! engine only adds what JavaScript needs. `ctx.publish` writes straight into the SDK's
//! `Context` for the batch (moved into a thread-local while the JS runs), so an event costs
//! no copy beyond the one into the output buffer.
//!
//! ## Where an event's time goes
//!
//! Two builtins a runtime calls for every event have paths of their own in Rust, each taking
//! only what it handles exactly as the engine does and handing everything else, unchanged, to
//! the engine's own code: `ctx.publish` writes plain data as `JSON.stringify` would (`json`),
//! and `JSON.parse` reads strict JSON (`parse`), keeping alive the shapes of the objects it
//! makes (`shapes`) so that the next line's object finds them. The engine's `JSON.parse`
//! reads numbers with libc's `strtod`, which the guest defines with Rust's parser (`strtod`).
//!
//! ## Modules
//!
//! `context` (the `ctx` object), `determinism` (the clock, `Math.random`, no collector
//! observers), `json` (the writer `ctx.publish` and the state use) with `number`, `parse`
//! (`JSON.parse`) with `shapes`, `state` (the state's JSON and envelope, `loss.js`), `strtod`.

mod context;
mod determinism;
mod json;
mod number;
mod parse;
mod shapes;
mod state;
mod strtod;

use rquickjs::{
    qjs, CatchResultExt, CaughtError, Ctx, Function, Module, Object, Persistent, TypedArray, Value,
};
use viewtape_guest::{abi, export_runtime, Context, Error, Result, Runtime, Schemas};

/// The longest property name, in bytes, that the engine's caches keep (the names `JSON.parse`
/// met, the keys `ctx.publish` quoted, the shapes `JSON.parse` holds). Longer names are
/// handled afresh each time, so odd names in a batch cannot take memory that outlives it.
const MAX_KEPT_NAME: usize = 64;

/// The name the user's module is compiled under: what error locations name.
pub const MODULE_NAME: &str = "guest.js";

/// QuickJS's own stack limit, on the shadow stack in linear memory (4 MiB, linked by the
/// build script with `-zstack-size`; QuickJS counts down from its top). A JavaScript call
/// also takes about 2.5 times as much of wasmtime's native stack (the host's
/// `max_wasm_stack`, 1 MiB), which only the host sees: past it the guest traps. At 256 KiB
/// the engine throws its `RangeError` first, one the user's code can catch, after about 950
/// levels of plain recursion, when some 650 KiB of the native stack are used.
const MAX_STACK_BYTES: usize = 256 << 10;

/// The init input, as `ABI.md` frames it.
#[derive(Debug, PartialEq, Eq)]
pub struct InitInput<'a> {
    /// Compile only: the host checks a module's syntax at load.
    pub check_only: bool,
    /// The user's source.
    pub source: &'a str,
    /// The runtime's config.
    pub config: &'a [u8],
}

impl<'a> InitInput<'a> {
    /// Reads the framing of `ABI.md`.
    ///
    /// # Errors
    /// Input that is not framed so, or a source that is not UTF-8.
    pub fn parse(input: &'a [u8]) -> Result<Self> {
        let rest = input
            .strip_prefix(abi::JS_INIT_MAGIC)
            .ok_or("the JS engine's init input does not start with its magic")?;
        let (&mode, rest) = rest.split_first().ok_or("cut short")?;
        let (len, rest) = rest
            .split_first_chunk::<4>()
            .ok_or("cut short in the source length")?;
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            return Err("cut short in the source".into());
        }
        let (source, config) = rest.split_at(len);
        let source = std::str::from_utf8(source)
            .map_err(|e| Error::msg(format!("the module is not UTF-8: {e}")))?;
        Ok(Self {
            check_only: mode == abi::JS_MODE_CHECK,
            source,
            config,
        })
    }
}

/// A user's module, running.
pub struct JsGuest {
    /// `None` for a syntax check (`ABI.md`): nothing runs.
    live: Option<Live>,
}

struct Live {
    // Field order is drop order: the persistent values before the context and the runtime.
    on_batch: Persistent<Function<'static>>,
    migrate: Option<Persistent<Function<'static>>>,
    ctx_object: Persistent<Object<'static>>,
    loss: state::LossFinder,
    intrinsics: json::Intrinsics,
    state: Persistent<Value<'static>>,
    /// `JSON.stringify(state)` as of the last batch (or init, or restore).
    state_json: String,
    source_id: String,
    batches: u64,
    schemas: Schemas,
    context: rquickjs::Context,
    _runtime: rquickjs::Runtime,
}

/// FNV-1a, 64 bits: names a source in the saved state, so a restore knows another source saved
/// it. Not a security boundary (the host fingerprints modules with SHA-256).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `file:line:column` of where `stack` says the user's code was, if it does: the first frame in
/// the user's module (a frame in a builtin, `JSON.parse` say, is skipped).
fn location(stack: &str) -> Option<String> {
    stack.lines().find_map(|frame| {
        let at = frame.find(MODULE_NAME)?;
        let rest = &frame[at..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '_' | '-')))
            .unwrap_or(rest.len());
        Some(rest[..end].to_owned())
    })
}

/// A caught JS error as the user reads it: `Name: message (at guest.js:L:C)`.
fn describe<'js>(ctx: &Ctx<'js>, caught: CaughtError<'js>) -> String {
    match caught {
        CaughtError::Exception(e) => {
            let name: Option<String> = e.get("name").ok();
            let message = e.message().unwrap_or_default();
            let mut text = match name {
                Some(name) if !name.is_empty() => format!("{name}: {message}"),
                _ => message,
            };
            if let Some(at) = e.stack().as_deref().and_then(location) {
                text.push_str(&format!(" (at {at})"));
            }
            text
        }
        CaughtError::Value(v) => {
            let shown = ctx
                .json_stringify(v)
                .ok()
                .flatten()
                .and_then(|s| s.to_string().ok())
                .unwrap_or_else(|| "a value".into());
            format!("uncaught {shown}")
        }
        CaughtError::Error(e) => e.to_string(),
    }
}

pub(crate) fn js_error(ctx: &Ctx<'_>, error: rquickjs::Error) -> Error {
    let caught = Err::<(), _>(error).catch(ctx);
    match caught {
        Ok(()) => Error::msg("unknown JavaScript error"),
        Err(caught) => Error::msg(describe(ctx, caught)),
    }
}

/// Puts `parse::parse_fast` in front of `JSON.parse`, as the builtin is defined (writable,
/// configurable, not enumerable, named `parse`, length 2).
fn install_json_parse(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    let json: Object = ctx.globals().get("JSON")?;
    let original: Function = json.get("parse")?;
    let mut data = [original.as_raw()];
    // SAFETY: `data` holds one live value, which the engine duplicates into the function.
    let function = unsafe {
        qjs::JS_NewCFunctionData(
            ctx.as_raw().as_ptr(),
            Some(parse::parse_fast),
            2,
            0,
            1,
            data.as_mut_ptr(),
        )
    };
    // SAFETY: the engine's new value (owned), or the exception marker it is checked for.
    if unsafe { qjs::JS_IsException(function) } {
        return Err(rquickjs::Error::Exception);
    }
    // SAFETY: `function` is a new value owned here, handed over to the `Value`.
    let function = unsafe { Value::from_raw(ctx.clone(), function) };
    let function = function.into_object().ok_or(rquickjs::Error::Unknown)?;
    function.prop(
        "name",
        rquickjs::object::Property::from("parse").configurable(),
    )?;
    json.prop(
        "parse",
        rquickjs::object::Property::from(function)
            .writable()
            .configurable(),
    )?;
    Ok(())
}

/// The `schemas` export as the SDK's declaration.
fn schemas<'js>(ctx: &Ctx<'js>, namespace: &Object<'js>) -> rquickjs::Result<Schemas> {
    let mut schemas = Schemas::new();
    let declared: Value = namespace.get("schemas")?;
    let Some(declared) = declared.as_object() else {
        return Ok(schemas);
    };
    for entry in declared.props::<String, Value>() {
        let (view, schema) = entry?;
        let json = json::stringify(ctx, schema)?.unwrap_or_else(|| "true".into());
        schemas = schemas.view_json(&view, json);
    }
    Ok(schemas)
}

fn optional_function<'js>(
    namespace: &Object<'js>,
    name: &str,
) -> rquickjs::Result<Option<Function<'js>>> {
    let value: Value = namespace.get(name)?;
    Ok(value.into_function())
}

impl Drop for Live {
    fn drop(&mut self) {
        // The property names `ctx.publish` and `JSON.parse` hold, and the shapes `JSON.parse`
        // holds, go before the context that owns them.
        self.context.with(|ctx| {
            let raw = ctx.as_raw().as_ptr();
            // SAFETY: the context is live; each lets go of this context's atoms only.
            unsafe { context::release(raw) };
            // SAFETY: as above.
            unsafe { parse::release(raw) };
        });
    }
}

impl Live {
    fn new(input: &InitInput<'_>) -> Result<Self> {
        let runtime = rquickjs::Runtime::new().map_err(Error::msg)?;
        runtime.set_max_stack_size(MAX_STACK_BYTES);
        let context = rquickjs::Context::full(&runtime).map_err(Error::msg)?;
        let config = String::from_utf8_lossy(input.config).into_owned();
        determinism::seed_random(0, 0);
        let live = context.with(|ctx| -> Result<Live> {
            let fail = |e| js_error(&ctx, e);
            let intrinsics = json::Intrinsics::new(&ctx).map_err(fail)?;
            let loss = state::LossFinder::new(&ctx).map_err(fail)?;
            determinism::install_random(&ctx).map_err(fail)?;
            determinism::remove_gc_observers(&ctx).map_err(fail)?;
            install_json_parse(&ctx).map_err(fail)?;
            let module = Module::declare(ctx.clone(), MODULE_NAME, input.source).map_err(fail)?;
            let (module, promise) = module.eval().map_err(fail)?;
            promise.finish::<()>().map_err(fail)?;
            let namespace = module.namespace().map_err(fail)?;
            let on_batch = optional_function(&namespace, "onBatch")
                .map_err(fail)?
                .ok_or("the module exports no function `onBatch(state, input, ctx)`")?;
            let migrate = optional_function(&namespace, "migrate").map_err(fail)?;
            let state = match optional_function(&namespace, "init").map_err(fail)? {
                Some(init) => settled(&ctx, init.call((config,)).map_err(fail)?)?,
                None => Object::new(ctx.clone()).map_err(fail)?.into_value(),
            };
            let state_json = state::state_json(&ctx, &intrinsics, &loss, state.clone())?;
            let schemas = schemas(&ctx, &namespace).map_err(fail)?;
            let ctx_object = context::ctx_object(&ctx, intrinsics).map_err(fail)?;
            Ok(Live {
                on_batch: Persistent::save(&ctx, on_batch),
                migrate: migrate.map(|f| Persistent::save(&ctx, f)),
                ctx_object: Persistent::save(&ctx, ctx_object),
                loss,
                intrinsics,
                state: Persistent::save(&ctx, state),
                state_json,
                source_id: format!("{:016x}", fnv1a(input.source.as_bytes())),
                batches: 0,
                schemas,
                context: context.clone(),
                _runtime: runtime.clone(),
            })
        })?;
        Ok(live)
    }
}

/// `migrate(old)`, its throw told as the refusal of the state.
fn call_migrate<'js>(
    js: &Ctx<'js>,
    migrate: &Persistent<Function<'static>>,
    old: Value<'js>,
) -> Result<Value<'js>> {
    let migrate = migrate.clone().restore(js).map_err(|e| js_error(js, e))?;
    let returned = migrate
        .call((old,))
        .map_err(|e| Error::msg(format!("migrate: {}", js_error(js, e))))?;
    settled(js, returned).map_err(|e| Error::msg(format!("migrate: {e}")))
}

/// What `returned` comes to once the jobs the call queued (promise reactions: `await`,
/// `.then`) have run, all of them, before the call ends: the value a promise settles to, or
/// its rejection as the call's error. A promise that no job settles fails the call.
fn settled<'js>(js: &Ctx<'js>, returned: Value<'js>) -> Result<Value<'js>> {
    while js.execute_pending_job() {}
    let Some(promise) = returned.as_promise() else {
        return Ok(returned);
    };
    match promise.result::<Value>() {
        Some(result) => result.map_err(|e| js_error(js, e)),
        None => Err(Error::msg(
            "the promise returned never settled: it awaits what nothing in the batch resolves \
             (a guest has no timers and no I/O)",
        )),
    }
}

impl Runtime for JsGuest {
    fn init(input: &[u8]) -> Result<Self> {
        let input = InitInput::parse(input)?;
        if input.check_only {
            let runtime = rquickjs::Runtime::new().map_err(Error::msg)?;
            runtime.set_max_stack_size(MAX_STACK_BYTES);
            let context = rquickjs::Context::full(&runtime).map_err(Error::msg)?;
            context.with(|ctx| {
                Module::declare(ctx.clone(), MODULE_NAME, input.source)
                    .map(drop)
                    .map_err(|e| js_error(&ctx, e))
            })?;
            return Ok(Self { live: None });
        }
        Ok(Self {
            live: Some(Live::new(&input)?),
        })
    }

    fn on_batch(&mut self, input: &[u8], ctx: &mut Context) -> Result<()> {
        let live = self.live.as_mut().ok_or("a syntax check runs no batch")?;
        let input = std::str::from_utf8(input)
            .map_err(|e| Error::msg(format!("the batch is not UTF-8: {e}")))?;
        determinism::batch_begins(live.batches, ctx.batch_time_ms());
        let (context, on_batch, state, object) =
            (&live.context, &live.on_batch, &live.state, &live.ctx_object);
        let (intrinsics, loss) = (&live.intrinsics, &live.loss);
        let result = context::with_batch(ctx, || {
            context.with(|js| -> Result<(Persistent<Value<'static>>, String)> {
                let fail = |e| js_error(&js, e);
                let on_batch = on_batch.clone().restore(&js).map_err(fail)?;
                let state = state.clone().restore(&js).map_err(fail)?;
                let object = object.clone().restore(&js).map_err(fail)?;
                let returned = on_batch
                    .call((state.clone(), input, object))
                    .map_err(fail)?;
                let returned = settled(&js, returned)?;
                let next = if returned.is_undefined() {
                    state
                } else {
                    returned
                };
                let json = state::state_json(&js, intrinsics, loss, next.clone())?;
                Ok((Persistent::save(&js, next), json))
            })
        });
        determinism::batch_ends();
        let (state, json) = result?;
        live.batches += 1;
        live.state = state;
        live.state_json = json;
        Ok(())
    }

    fn save(&self) -> Vec<u8> {
        let Some(live) = &self.live else {
            return b"null".to_vec();
        };
        format!(
            "{{\"source\":\"{}\",\"batches\":{},\"state\":{}}}",
            live.source_id, live.batches, live.state_json
        )
        .into_bytes()
    }

    fn restore(&mut self, saved: &[u8]) -> Result<()> {
        let live = self
            .live
            .as_mut()
            .ok_or("a syntax check restores nothing")?;
        let (state, json, batches) = live.context.with(|js| -> Result<_> {
            let fail = |e| js_error(&js, e);
            let (state, batches) = match state::envelope(&js, saved).map_err(fail)? {
                Some((source, batches, state)) if source == live.source_id => (state, batches),
                Some((_, batches, state)) => match &live.migrate {
                    Some(migrate) => (call_migrate(&js, migrate, state)?, batches),
                    None => (state, batches),
                },
                None => {
                    // Another guest saved it (a WebAssembly build of this runtime, say): only
                    // `migrate` can read it.
                    let migrate = live.migrate.as_ref().ok_or(
                        "the state was saved by another guest, not a JavaScript module: \
                         export migrate(old) to take it over (old is that state as a string, \
                         or a Uint8Array if it is not UTF-8)",
                    )?;
                    let old = match std::str::from_utf8(saved) {
                        Ok(text) => rquickjs::String::from_str(js.clone(), text)
                            .map_err(fail)?
                            .into_value(),
                        Err(_) => TypedArray::<u8>::new(js.clone(), saved.to_vec())
                            .map_err(fail)?
                            .into_value(),
                    };
                    (call_migrate(&js, migrate, old)?, 0)
                }
            };
            let json = state::state_json(&js, &live.intrinsics, &live.loss, state.clone())?;
            Ok((Persistent::save(&js, state), json, batches))
        })?;
        live.state = state;
        live.state_json = json;
        live.batches = batches;
        Ok(())
    }

    fn schemas(&self) -> Schemas {
        self.live
            .as_ref()
            .map(|live| live.schemas.clone())
            .unwrap_or_default()
    }
}

export_runtime!(JsGuest);

#[cfg(test)]
mod tests;
