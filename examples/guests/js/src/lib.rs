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
//!   state (returning `undefined` keeps `state`, which it may have changed in place). A throw
//!   rejects the whole batch; the message names the error and where it was thrown
//!   (`guest.js:LINE:COLUMN`).
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
//! after the SDK's version header. `JSON.stringify(state)` runs at the end of every batch, so
//! a state that is not JSON (a cycle, a `BigInt`) rejects the batch that made it.
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
//! - No timers, no I/O, no `import` of other modules.
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
//! and `JSON.parse` reads strict JSON (`parse`). The engine's `JSON.parse` reads numbers with
//! libc's `strtod`, which the guest defines with Rust's parser.

mod json;
mod parse;
mod shapes;

use std::cell::{Cell, RefCell};

use rquickjs::{
    qjs, CatchResultExt, CaughtError, Ctx, Function, Module, Object, Persistent, TypedArray, Value,
};
use viewtape_guest::{abi, export_runtime, Context, Error, Level, Result, Runtime, Schemas};

/// The name the user's module is compiled under: what error locations name.
pub const MODULE_NAME: &str = "guest.js";

/// QuickJS's own stack limit, on the shadow stack in linear memory (4 MiB, linked by the
/// build script with `-zstack-size`; QuickJS counts down from its top). A JavaScript call
/// also takes about 2.5 times as much of wasmtime's native stack (the host's
/// `max_wasm_stack`, 1 MiB), which only the host sees: past it the guest traps. At 256 KiB
/// the engine throws its `RangeError` first, one the user's code can catch, after about 950
/// levels of plain recursion, when some 650 KiB of the native stack are used.
const MAX_STACK_BYTES: usize = 256 << 10;

thread_local! {
    /// The SDK's context of the running batch, moved here while JS runs so `ctx.*` can reach it.
    static CURRENT: RefCell<Context> = RefCell::new(Context::default());
    /// `Math.random`'s state.
    static RANDOM: Cell<u64> = const { Cell::new(0) };
    /// What `Date.now()` gives, in microseconds: the running batch's ingest time, else 0.
    static NOW_US: Cell<f64> = const { Cell::new(0.0) };
    /// Where `ctx.publish` writes a value's JSON before it is published.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// The property names `ctx.publish` quoted lately (see `json::Keys`), released when the
    /// running module is dropped.
    static KEYS: RefCell<json::Keys> = RefCell::new(json::Keys::default());
    /// What tells plain data for `ctx.publish`, taken from the realm before the user's code ran.
    static INTRINSICS: Cell<Option<json::Intrinsics>> = const { Cell::new(None) };
}

/// The clock the QuickJS shim asks for: the running batch's ingest time, else the epoch (see
/// "Determinism"). Defined here, wasm-ld resolves the shim's import to it and the module
/// imports nothing but `viewtape`.
#[cfg(target_arch = "wasm32")]
#[no_mangle]
pub extern "C" fn __rquickjs_host_now_us() -> f64 {
    NOW_US.with(Cell::get)
}

/// The length of the decimal number at the start of the bytes `at` reads
/// (`[+-]digits[.digits][(e|E)[+-]digits]`, one of the first two runs of digits may be empty;
/// an exponent without digits is not part of it), `0` if there is none. `at` is read up to the
/// first byte that cannot continue the number.
#[cfg(any(target_arch = "wasm32", test))]
fn decimal_len(at: impl Fn(usize) -> u8) -> usize {
    let digits = |from: usize| (from..).find(|&i| !at(i).is_ascii_digit()).unwrap_or(from);
    let mut i = usize::from(matches!(at(0), b'+' | b'-'));
    let int_end = digits(i);
    let mut any = int_end > i;
    i = int_end;
    if at(i) == b'.' {
        let frac_end = digits(i + 1);
        any |= frac_end > i + 1;
        i = frac_end;
    }
    if !any {
        return 0;
    }
    if matches!(at(i), b'e' | b'E') {
        let sign = usize::from(matches!(at(i + 1), b'+' | b'-'));
        let exp_end = digits(i + 1 + sign);
        if exp_end > i + 1 + sign {
            i = exp_end;
        }
    }
    i
}

/// libc's `strtod`, for QuickJS's `JSON.parse`, its only caller, which hands it a number it
/// has checked against JSON's grammar. Rust's parser rounds correctly, as the libc one linked
/// otherwise (musl's) does, so each number reads as the same double; it is several times
/// faster. Decimal numbers only (no `inf`, `nan` or hexadecimal, which JSON does not have):
/// anything else reads as no number, 0 with `end` at `s`.
///
/// # Safety
/// `s` is a NUL-terminated string; `end` is null or writable.
#[cfg(target_arch = "wasm32")]
#[no_mangle]
pub unsafe extern "C" fn strtod(
    s: *const std::ffi::c_char,
    end: *mut *mut std::ffi::c_char,
) -> f64 {
    // SAFETY: the caller gives a NUL-terminated string, and the scan stops at its NUL at the
    // latest (NUL continues no number).
    let len = decimal_len(|i| unsafe { *s.cast::<u8>().add(i) });
    // SAFETY: the first `len` bytes were read above.
    let text = unsafe { std::slice::from_raw_parts(s.cast::<u8>(), len) };
    let value = std::str::from_utf8(text)
        .ok()
        .and_then(|text| text.parse::<f64>().ok());
    let (value, len) = match value {
        Some(value) => (value, len),
        None => (0.0, 0),
    };
    if !end.is_null() {
        // SAFETY: `end` is writable (the caller's contract); `s + len` is within the string.
        unsafe { *end = s.add(len).cast_mut() };
    }
    value
}

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

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn next_random() -> f64 {
    RANDOM.with(|s| {
        let x = s.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        s.set(x);
        // 53 random bits, as a double in [0, 1).
        (mix(x) >> 11) as f64 / (1u64 << 53) as f64
    })
}

fn seed_random(batches: u64, time_ms: u64) {
    RANDOM.with(|s| s.set(mix(batches ^ 0x5654_4a53_5241_4e44) ^ mix(time_ms)));
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

fn js_error(ctx: &Ctx<'_>, error: rquickjs::Error) -> Error {
    let caught = Err::<(), _>(error).catch(ctx);
    match caught {
        Ok(()) => Error::msg("unknown JavaScript error"),
        Err(caught) => Error::msg(describe(ctx, caught)),
    }
}

fn stringify<'js>(ctx: &Ctx<'js>, value: Value<'js>) -> rquickjs::Result<Option<String>> {
    ctx.json_stringify(value)?
        .map(|s| s.to_string())
        .transpose()
}

/// A JavaScript string as UTF-8, borrowed from the engine (no copy for an ASCII string).
///
/// # Errors
/// A string with a lone surrogate, which has no UTF-8.
fn utf8(string: rquickjs::String<'_>) -> rquickjs::Result<rquickjs::CString<'_>> {
    let c = string.to_cstring()?;
    // SAFETY: `as_ptr` points at the `len` bytes the engine made, which live as long as `c`.
    let bytes = unsafe { std::slice::from_raw_parts(c.as_ptr().cast::<u8>(), c.len()) };
    std::str::from_utf8(bytes)?;
    Ok(c)
}

/// A JavaScript string's UTF-8, borrowed from the engine (the string's own bytes if it is
/// ASCII), released when dropped.
struct Text {
    ctx: *mut qjs::JSContext,
    ptr: *const std::ffi::c_char,
    len: usize,
}

impl Text {
    /// `None` for a value that is not a string, a string with a lone surrogate, or a failure
    /// of the engine (whose exception it drops: the general path meets it again).
    ///
    /// # Safety
    /// `value` is a live value of `ctx`, which outlives the `Text`.
    unsafe fn new(ctx: *mut qjs::JSContext, value: qjs::JSValue) -> Option<Self> {
        if !qjs::JS_IsString(value) {
            return None;
        }
        let mut len = 0;
        let ptr = qjs::JS_ToCStringLen2(ctx, &mut len, value, false);
        if ptr.is_null() {
            let exception = qjs::JS_GetException(ctx);
            qjs::JS_FreeValue(ctx, exception);
            return None;
        }
        let text = Self {
            ctx,
            ptr,
            len: usize::try_from(len).ok()?,
        };
        let bytes = text.bytes();
        json::is_utf8(bytes).then_some(text)
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the engine made `len` bytes at `ptr`, which live until `JS_FreeCString`.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }

    fn as_str(&self) -> &str {
        // SAFETY: `new` made sure the bytes are UTF-8.
        unsafe { std::str::from_utf8_unchecked(self.bytes()) }
    }
}

impl Drop for Text {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `JS_ToCStringLen2` on this context and is freed once.
        unsafe { qjs::JS_FreeCString(self.ctx, self.ptr) };
    }
}

/// `ctx.publish` as the engine calls it: the common case (a view and key that are strings, a
/// value that is a string or plain data) straight from the engine's arguments, without
/// rquickjs's conversions; anything else through the general function, `data[0]`, which
/// also throws what a wrong call throws. The common case runs no JavaScript, so the general
/// function sees the call as it was made.
///
/// # Safety
/// Called by the engine: `argv` holds `argc` live values and `data` the one value the function
/// was made with.
unsafe extern "C" fn publish_fast(
    ctx: *mut qjs::JSContext,
    this: qjs::JSValue,
    argc: std::ffi::c_int,
    argv: *mut qjs::JSValue,
    _magic: std::ffi::c_int,
    data: *mut qjs::JSValue,
) -> qjs::JSValue {
    if argc >= 3 && publish_common(ctx, *argv, *argv.add(1), *argv.add(2)) {
        return qjs::JS_UNDEFINED;
    }
    qjs::JS_Call(ctx, *data, this, argc, argv)
}

/// Publishes `value` if it is a string or plain data and `view` and `key` are strings.
///
/// # Safety
/// The values are live values of `ctx`.
unsafe fn publish_common(
    ctx: *mut qjs::JSContext,
    view: qjs::JSValue,
    key: qjs::JSValue,
    value: qjs::JSValue,
) -> bool {
    let (Some(view), Some(key)) = (Text::new(ctx, view), Text::new(ctx, key)) else {
        return false;
    };
    let (view, key) = (view.as_str(), key.as_str());
    if qjs::JS_IsString(value) {
        let Some(value) = Text::new(ctx, value) else {
            return false;
        };
        CURRENT.with_borrow_mut(|c| c.publish(view, key, value.bytes()));
        return true;
    }
    let Some(intrinsics) = INTRINSICS.get() else {
        return false;
    };
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        let written = KEYS.with_borrow_mut(|keys| {
            // SAFETY: `value` is live for the call; the keys are atoms of this context (the
            // only one a guest runs user code in).
            unsafe { json::write_raw(ctx, &intrinsics, keys, value, buf) }.is_ok()
        });
        if written {
            CURRENT.with_borrow_mut(|c| c.publish(view, key, buf));
        }
        written
    })
}

/// `ctx.publish`: [`publish_fast`] around `general`.
fn publish_function<'js>(ctx: &Ctx<'js>, general: Function<'js>) -> rquickjs::Result<Value<'js>> {
    let mut data = [general.as_raw()];
    // SAFETY: `data` holds one live value, which the engine duplicates into the function.
    let function = unsafe {
        qjs::JS_NewCFunctionData(
            ctx.as_raw().as_ptr(),
            Some(publish_fast),
            3,
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
    Ok(unsafe { Value::from_raw(ctx.clone(), function) })
}

/// The `ctx` object handed to `onBatch`.
fn ctx_object<'js>(ctx: &Ctx<'js>, intrinsics: json::Intrinsics) -> rquickjs::Result<Object<'js>> {
    let object = Object::new(ctx.clone())?;
    let general = Function::new(
        ctx.clone(),
        move |ctx: Ctx<'js>,
              view: rquickjs::String<'js>,
              key: rquickjs::String<'js>,
              value: Value<'js>|
              -> rquickjs::Result<()> {
            let view = utf8(view)?;
            let key = utf8(key)?;
            let (view, key) = (view.as_str(), key.as_str());
            if let Some(s) = value.as_string() {
                let s = utf8(s.clone())?;
                CURRENT.with_borrow_mut(|c| c.publish(view, key, s.as_str().as_bytes()));
                return Ok(());
            }
            // Plain data is written here; anything else by `JSON.stringify`, below (the
            // fast path runs no JavaScript before it refuses a value, so the fallback
            // sees the value as it was).
            let written = SCRATCH.with_borrow_mut(|buf| {
                buf.clear();
                let written = KEYS.with_borrow_mut(|keys| {
                    json::write(&ctx, &intrinsics, keys, &value, buf).is_ok()
                });
                if written {
                    CURRENT.with_borrow_mut(|c| c.publish(view, key, buf));
                }
                written
            });
            if written {
                return Ok(());
            }
            if let Ok(bytes) = TypedArray::<u8>::from_value(value.clone()) {
                // SAFETY: the slice is copied into the output buffer at once, with no
                // JavaScript run while it lives.
                let bytes = unsafe { bytes.as_bytes() }.unwrap_or_default();
                CURRENT.with_borrow_mut(|c| c.publish(view, key, bytes));
            } else {
                let json = stringify(&ctx, value)?.ok_or_else(|| {
                    rquickjs::Exception::throw_type(
                        &ctx,
                        "ctx.publish: the value has no JSON (undefined or a function)",
                    )
                })?;
                CURRENT.with_borrow_mut(|c| c.publish(view, key, json.as_bytes()));
            }
            Ok(())
        },
    )?;
    object.set("publish", publish_function(ctx, general)?)?;
    object.set(
        "delete",
        Function::new(ctx.clone(), |view: String, key: String| {
            CURRENT.with_borrow_mut(|c| c.delete(&view, &key));
        })?,
    )?;
    object.set(
        "reportGap",
        Function::new(ctx.clone(), |reason: String| {
            CURRENT.with_borrow_mut(|c| c.report_gap(&reason));
        })?,
    )?;
    object.set(
        "log",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, level: String, message: String| -> rquickjs::Result<()> {
                let level = match level.as_str() {
                    "error" => Level::Error,
                    "warn" => Level::Warn,
                    "info" => Level::Info,
                    "debug" => Level::Debug,
                    other => {
                        return Err(rquickjs::Exception::throw_type(
                            &ctx,
                            &format!(
                            "ctx.log: level {other:?} is none of 'debug', 'info', 'warn', 'error'"
                        ),
                        ))
                    }
                };
                CURRENT.with_borrow_mut(|c| c.log(level, &message));
                Ok(())
            },
        )?,
    )?;
    Ok(object)
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

/// Replaces the clock-free `Math.random` with the seeded one.
fn install_random(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    let math: Object = ctx.globals().get("Math")?;
    math.set("random", Function::new(ctx.clone(), next_random)?)?;
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
        let json = stringify(ctx, schema)?.unwrap_or_else(|| "true".into());
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
            KEYS.with_borrow_mut(|keys| unsafe { keys.release(raw) });
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
        seed_random(0, 0);
        let live = context.with(|ctx| -> Result<Live> {
            let fail = |e| js_error(&ctx, e);
            let intrinsics = json::Intrinsics::new(&ctx).map_err(fail)?;
            INTRINSICS.set(Some(intrinsics));
            install_random(&ctx).map_err(fail)?;
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
                Some(init) => init.call::<_, Value>((config,)).map_err(fail)?,
                None => Object::new(ctx.clone()).map_err(fail)?.into_value(),
            };
            let state_json = state_json(&ctx, state.clone())?;
            let schemas = schemas(&ctx, &namespace).map_err(fail)?;
            let ctx_object = ctx_object(&ctx, intrinsics).map_err(fail)?;
            Ok(Live {
                on_batch: Persistent::save(&ctx, on_batch),
                migrate: migrate.map(|f| Persistent::save(&ctx, f)),
                ctx_object: Persistent::save(&ctx, ctx_object),
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

/// `JSON.stringify(state)`, or why the state is not JSON.
fn state_json<'js>(ctx: &Ctx<'js>, state: Value<'js>) -> Result<String> {
    match stringify(ctx, state) {
        Ok(Some(json)) => Ok(json),
        Ok(None) => Err(Error::msg(
            "the state is not JSON (undefined or a function): return a JSON value",
        )),
        Err(e) => Err(Error::msg(format!(
            "the state is not JSON: {}",
            js_error(ctx, e)
        ))),
    }
}

/// The parts of state this engine saved (`{"source","batches","state"}`, see "State"): `None`
/// for bytes another guest saved.
fn envelope<'js>(
    js: &Ctx<'js>,
    saved: &[u8],
) -> rquickjs::Result<Option<(String, u64, Value<'js>)>> {
    let Ok(text) = std::str::from_utf8(saved) else {
        return Ok(None);
    };
    let Ok(parsed) = js.json_parse(text) else {
        // Not JSON: the exception it left is not the user's.
        drop(js.catch());
        return Ok(None);
    };
    let Some(saved) = parsed.into_object() else {
        return Ok(None);
    };
    let source: Value = saved.get("source")?;
    let batches: Value = saved.get("batches")?;
    let state: Value = saved.get("state")?;
    match (source.as_string(), batches.as_number()) {
        (Some(source), Some(batches)) if !state.is_undefined() => {
            Ok(Some((source.to_string()?, batches as u64, state)))
        }
        _ => Ok(None),
    }
}

/// `migrate(old)`, its throw told as the refusal of the state.
fn call_migrate<'js>(
    js: &Ctx<'js>,
    migrate: &Persistent<Function<'static>>,
    old: Value<'js>,
) -> Result<Value<'js>> {
    let migrate = migrate.clone().restore(js).map_err(|e| js_error(js, e))?;
    migrate
        .call((old,))
        .map_err(|e| Error::msg(format!("migrate: {}", js_error(js, e))))
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
        let time_ms = ctx.batch_time_ms();
        seed_random(live.batches, time_ms);
        NOW_US.with(|now| now.set(time_ms as f64 * 1000.0));
        CURRENT.with_borrow_mut(|current| std::mem::swap(current, ctx));
        let result = live
            .context
            .with(|js| -> Result<(Persistent<Value<'static>>, String)> {
                let fail = |e| js_error(&js, e);
                let on_batch = live.on_batch.clone().restore(&js).map_err(fail)?;
                let state = live.state.clone().restore(&js).map_err(fail)?;
                let object = live.ctx_object.clone().restore(&js).map_err(fail)?;
                let returned: Value = on_batch
                    .call((state.clone(), input, object))
                    .map_err(fail)?;
                let next = if returned.is_undefined() {
                    state
                } else {
                    returned
                };
                let json = state_json(&js, next.clone())?;
                Ok((Persistent::save(&js, next), json))
            });
        CURRENT.with_borrow_mut(|current| std::mem::swap(current, ctx));
        NOW_US.with(|now| now.set(0.0));
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
            let (state, batches) = match envelope(&js, saved).map_err(fail)? {
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
            let json = state_json(&js, state.clone())?;
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
mod tests {
    use super::{decimal_len, JsGuest};
    use viewtape_guest::testing::Harness;
    use viewtape_guest::{abi, Output};

    fn guest(source: &str) -> Harness<JsGuest> {
        Harness::new(&abi::js_init_input(
            abi::JS_MODE_RUN,
            source.as_bytes(),
            b"",
        ))
        .expect("the module loads")
    }

    /// Each value published under `i` and, as a string, `JSON.stringify` of it under `json i`.
    const VALUES: &str = r#"
const values = () => [
  { symbol: 'ACME', price: 12.5, seq: 7 }, [1, 'two', null, [3], { a: undefined }], 'raw text',
  0.1 + 0.2, -0, 1e21, true, null, { toJSON() { return 'mine'; } }, new Date(0),
  { get g() { return 'got'; } }, { nested: { deeper: [1.25, 'é', '\n'] } }, new Number(4),
  Object.assign(Object.create(null), { bare: 1 }), { '\ud800': 'lone' },
];
export function onBatch(state, input, ctx) {
  values().forEach((v, i) => {
    ctx.publish('v', String(i), v);
    if (typeof v !== 'string') ctx.publish('v', `json ${i}`, JSON.stringify(v));
  });
  ctx.publish('v', 'bytes', new Uint8Array([104, 105]));
}
"#;

    #[test]
    fn publish_writes_what_json_stringify_writes() {
        let mut h = guest(VALUES);
        for _ in 0..2 {
            let out = h.batch(b"").expect("batch");
            let payload = |key: &str| {
                out.iter()
                    .find_map(|o| match o {
                        Output::Update {
                            key: k, payload, ..
                        } if k == key => Some(payload.clone()),
                        _ => None,
                    })
                    .unwrap_or_else(|| panic!("no {key}"))
            };
            for i in 0..15 {
                let json = format!("json {i}");
                if out
                    .iter()
                    .any(|o| matches!(o, Output::Update { key, .. } if *key == json))
                {
                    assert_eq!(
                        String::from_utf8(payload(&i.to_string())),
                        String::from_utf8(payload(&json)),
                        "value {i}"
                    );
                }
            }
            assert_eq!(payload("2"), b"raw text");
            assert_eq!(payload("bytes"), b"hi");
        }
    }

    #[test]
    fn json_parse_looks_and_fails_as_the_builtin() {
        let mut h = guest(
            r#"
export function onBatch(state, input, ctx) {
  const d = Object.getOwnPropertyDescriptor(JSON, 'parse');
  ctx.publish('v', 'shape', [JSON.parse.name, JSON.parse.length, d.writable, d.enumerable,
    d.configurable, typeof JSON.parse]);
  ctx.publish('v', 'revived', JSON.parse('{"a":1,"b":[2]}', (k, v) => typeof v === 'number' ? v * 10 : v));
  ctx.publish('v', 'coerced', JSON.parse({ toString() { return '[7]'; } }));
  ctx.publish('v', 'parsed', JSON.parse(input));
  try { JSON.parse('{"a":'); } catch (e) {
    ctx.publish('v', 'error', `${e.name}: ${e.message}`);
    ctx.publish('v', 'stack', e.stack);
  }
  ctx.publish('v', 'ignored', JSON.parse('[1]', 'not a function'));
}
"#,
        );
        let out = h
            .batch(r#"{"x":[1.5,"\u00e9"],"y":null}"#.as_bytes())
            .expect("batch");
        let payload = |key: &str| {
            out.iter()
                .find_map(|o| match o {
                    Output::Update {
                        key: k, payload, ..
                    } if k == key => String::from_utf8(payload.clone()).ok(),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("no {key}"))
        };
        assert_eq!(
            payload("shape"),
            r#"["parse",2,true,false,true,"function"]"#
        );
        assert_eq!(payload("revived"), r#"{"a":10,"b":[20]}"#);
        assert_eq!(payload("coerced"), "[7]");
        assert_eq!(payload("parsed"), r#"{"x":[1.5,"é"],"y":null}"#);
        assert!(
            payload("error").starts_with("SyntaxError: "),
            "{}",
            payload("error")
        );
    }

    #[test]
    fn publish_refuses_what_it_refused_before() {
        for (call, expected) in [
            ("ctx.publish('v', 'k', undefined)", "the value has no JSON"),
            ("ctx.publish('v', 'k', () => 1)", "the value has no JSON"),
            ("ctx.publish('v', 'k', 10n)", "BigInt"),
            ("ctx.publish('v', 1, {})", "String"),
            ("ctx.publish(null, 'k', {})", "String"),
            ("ctx.publish('v', 'k')", "3 where expected"),
            ("ctx.publish('v', '\\ud800', 'x')", "utf"),
            (
                "const o = {}; o.o = o; ctx.publish('v', 'k', o)",
                "circular",
            ),
        ] {
            let mut h = guest(&format!(
                "export function onBatch(state, input, ctx) {{ {call}; }}"
            ));
            let error = h.batch(b"").expect_err(call).to_string();
            assert!(
                error.to_lowercase().contains(&expected.to_lowercase()),
                "{call}: {error}"
            );
        }
    }

    fn len(text: &str) -> usize {
        decimal_len(|i| text.as_bytes().get(i).copied().unwrap_or(0))
    }

    #[test]
    fn decimal_len_takes_what_strtod_takes() {
        for (text, expected) in [
            ("135.23,", 6),
            ("-7}", 2),
            ("+1", 2),
            ("0", 1),
            ("1e5", 3),
            ("1E+05x", 5),
            ("2.5e-3]", 6),
            ("1e", 1),
            ("1e+", 1),
            ("1.", 2),
            (".5", 2),
            (".", 0),
            ("-", 0),
            ("-.e1", 0),
            ("", 0),
            ("x1", 0),
            ("inf", 0),
        ] {
            assert_eq!(len(text), expected, "{text:?}");
        }
    }
}
