//! The `ctx` object `onBatch` is handed: `publish`, `delete`, `reportGap` and `log`, which
//! write into the SDK's `Context` of the running batch.

use std::cell::{Cell, RefCell};

use rquickjs::{qjs, Ctx, Function, Object, TypedArray, Value};
use viewtape_guest::{Context, Level};

use crate::json;

thread_local! {
    /// The SDK's context of the running batch, moved here while JS runs so `ctx.*` can reach it.
    static CURRENT: RefCell<Context> = RefCell::new(Context::default());
    /// Where `ctx.publish` writes a value's JSON before it is published.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// The property names `ctx.publish` quoted lately (see `json::Keys`), released when the
    /// running module is dropped.
    static KEYS: RefCell<json::Keys> = RefCell::new(json::Keys::default());
    /// What tells plain data for `ctx.publish`, taken from the realm before the user's code ran.
    static INTRINSICS: Cell<Option<json::Intrinsics>> = const { Cell::new(None) };
}

/// Runs `f` with `batch` as the context `ctx.*` writes into.
pub fn with_batch<R>(batch: &mut Context, f: impl FnOnce() -> R) -> R {
    CURRENT.with_borrow_mut(|current| std::mem::swap(current, batch));
    let result = f();
    CURRENT.with_borrow_mut(|current| std::mem::swap(current, batch));
    result
}

/// Lets go of the property names `ctx.publish` holds, if they are `ctx`'s.
///
/// # Safety
/// `ctx` is a live context.
pub unsafe fn release(ctx: *mut qjs::JSContext) {
    // SAFETY: the caller's `ctx` is live.
    KEYS.with_borrow_mut(|keys| unsafe { keys.release(ctx) });
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
pub fn ctx_object<'js>(
    ctx: &Ctx<'js>,
    intrinsics: json::Intrinsics,
) -> rquickjs::Result<Object<'js>> {
    INTRINSICS.set(Some(intrinsics));
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
                let json = json::stringify(&ctx, value)?.ok_or_else(|| {
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
