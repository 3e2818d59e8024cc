//! The ABI glue behind [`export_runtime!`](crate::export_runtime): the guest exports and the
//! host imports of `ABI.md`. Guest authors never call this module.

use std::cell::RefCell;

use crate::{Context, Error, Level, Runtime};

thread_local! {
    /// The input buffer the host writes into (`viewtape_input`). Its length is the high-water
    /// mark of the batches seen, so it is zeroed only when it grows.
    static INPUT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// The output buffer, reused from batch to batch so it is allocated once.
    static OUTPUT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

#[cfg(target_arch = "wasm32")]
mod sys {
    #[link(wasm_import_module = "viewtape")]
    extern "C" {
        pub fn reply(ptr: *const u8, len: usize);
        pub fn error(ptr: *const u8, len: usize);
        pub fn log(level: i32, ptr: *const u8, len: usize);
        pub fn batch_time() -> i64;
    }
}

/// Hands `bytes` to the host as the output of the current call.
fn host_reply(bytes: &[u8]) {
    #[cfg(target_arch = "wasm32")]
    // SAFETY: `bytes` is a live slice of our linear memory for the duration of the call; the
    // host only reads `len` bytes from `ptr` and copies them before returning.
    unsafe {
        sys::reply(bytes.as_ptr(), bytes.len())
    };
    #[cfg(not(target_arch = "wasm32"))]
    let _ = bytes;
}

/// Sets the error message of the current call.
pub(crate) fn host_error(msg: &str) {
    #[cfg(target_arch = "wasm32")]
    // SAFETY: as in `host_reply`: a live slice the host copies before returning.
    unsafe {
        sys::error(msg.as_ptr(), msg.len())
    };
    #[cfg(not(target_arch = "wasm32"))]
    let _ = msg;
}

/// Logs through the host.
pub(crate) fn host_log(level: Level, msg: &str) {
    #[cfg(target_arch = "wasm32")]
    // SAFETY: as in `host_reply`: a live slice the host copies before returning.
    unsafe {
        sys::log(level as i32, msg.as_ptr(), msg.len())
    };
    #[cfg(not(target_arch = "wasm32"))]
    let _ = (level, msg);
}

thread_local! {
    /// The ingest time natively (in wasm the host's): what `testing::Harness::at` set.
    pub(crate) static NATIVE_BATCH_TIME: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The current batch's ingest time from the host (Unix milliseconds).
pub(crate) fn host_batch_time() -> u64 {
    #[cfg(target_arch = "wasm32")]
    // SAFETY: the import takes nothing and returns a number.
    return u64::try_from(unsafe { sys::batch_time() }).unwrap_or(0);
    #[cfg(not(target_arch = "wasm32"))]
    NATIVE_BATCH_TIME.with(std::cell::Cell::get)
}

fn fail(err: Error) -> i32 {
    host_error(err.message());
    crate::abi::STATUS_ERROR
}

fn with_input<T>(len: i32, f: impl FnOnce(&[u8]) -> T) -> Result<T, Error> {
    let len = usize::try_from(len).map_err(|_| Error::msg("negative input length"))?;
    INPUT.with_borrow(|input| match input.get(..len) {
        Some(bytes) => Ok(f(bytes)),
        None => Err(Error::msg("input length beyond the input buffer")),
    })
}

/// `viewtape_input(len) -> ptr`.
#[doc(hidden)]
pub fn input(len: i32) -> i32 {
    let Ok(len) = usize::try_from(len) else {
        return 0;
    };
    INPUT.with_borrow_mut(|buf| {
        if buf.len() < len {
            if buf.try_reserve(len - buf.len()).is_err() {
                return 0;
            }
            buf.resize(len, 0);
        }
        // Pointers are 32-bit on the only target this is exported on.
        buf.as_mut_ptr() as usize as i32
    })
}

/// `viewtape_init(len) -> status`.
#[doc(hidden)]
pub fn init<R: Runtime>(slot: &RefCell<Option<R>>, len: i32) -> i32 {
    install_panic_hook();
    match with_input(len, R::init).and_then(|r| r) {
        Ok(runtime) => {
            if let Some(declaration) = runtime.schemas().declaration() {
                host_reply(&declaration);
            }
            *slot.borrow_mut() = Some(runtime);
            crate::abi::STATUS_OK
        }
        Err(err) => fail(err),
    }
}

fn with_runtime<R: Runtime>(
    slot: &RefCell<Option<R>>,
    f: impl FnOnce(&mut R) -> Result<(), Error>,
) -> i32 {
    let mut slot = slot.borrow_mut();
    let Some(runtime) = slot.as_mut() else {
        return fail(Error::msg("runtime called before viewtape_init"));
    };
    match f(runtime) {
        Ok(()) => crate::abi::STATUS_OK,
        Err(err) => fail(err),
    }
}

/// `viewtape_restore(len) -> status`.
#[doc(hidden)]
pub fn restore<R: Runtime>(slot: &RefCell<Option<R>>, len: i32) -> i32 {
    with_runtime(slot, |rt| {
        with_input(len, |state| crate::state::restore(rt, state))?
    })
}

/// `viewtape_on_batch(len) -> status`.
#[doc(hidden)]
pub fn on_batch<R: Runtime>(slot: &RefCell<Option<R>>, len: i32) -> i32 {
    with_runtime(slot, |rt| {
        let mut buf = OUTPUT.take();
        buf.clear();
        let mut ctx = Context::with_buffer(buf);
        let result = with_input(len, |input| rt.on_batch(input, &mut ctx))?;
        let buf = ctx.into_buffer();
        if result.is_ok() {
            host_reply(&buf);
        }
        OUTPUT.set(buf);
        result
    })
}

/// `viewtape_save() -> status`.
#[doc(hidden)]
pub fn save<R: Runtime>(slot: &RefCell<Option<R>>) -> i32 {
    with_runtime(slot, |rt| {
        host_reply(&crate::state::save(rt));
        Ok(())
    })
}

/// Reports a panic's message to the host before the abort turns it into a bare trap.
fn install_panic_hook() {
    #[cfg(target_arch = "wasm32")]
    std::panic::set_hook(Box::new(|info| host_error(&info.to_string())));
}

/// Exports a [`Runtime`] as a viewtape guest. Use it once, at the top level of the guest crate:
///
/// ```
/// # use viewtape_guest::{Context, Result, Runtime};
/// # struct Echo;
/// # impl Runtime for Echo {
/// #     fn init(_: &[u8]) -> Result<Self> { Ok(Echo) }
/// #     fn on_batch(&mut self, _: &[u8], _: &mut Context) -> Result<()> { Ok(()) }
/// #     fn save(&self) -> Vec<u8> { Vec::new() }
/// #     fn restore(&mut self, _: &[u8]) -> Result<()> { Ok(()) }
/// # }
/// viewtape_guest::export_runtime!(Echo);
/// ```
///
/// On `wasm32` it generates the exports of `ABI.md`; on other targets it expands to nothing,
/// so the crate still builds and unit-tests natively.
#[macro_export]
macro_rules! export_runtime {
    ($runtime:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            ::std::thread_local! {
                static RUNTIME: ::core::cell::RefCell<::core::option::Option<$runtime>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }
            #[no_mangle]
            pub extern "C" fn viewtape_abi_v1() {}
            #[no_mangle]
            pub extern "C" fn viewtape_input(len: i32) -> i32 {
                $crate::__private::input(len)
            }
            #[no_mangle]
            pub extern "C" fn viewtape_init(len: i32) -> i32 {
                RUNTIME.with(|rt| $crate::__private::init::<$runtime>(rt, len))
            }
            #[no_mangle]
            pub extern "C" fn viewtape_restore(len: i32) -> i32 {
                RUNTIME.with(|rt| $crate::__private::restore::<$runtime>(rt, len))
            }
            #[no_mangle]
            pub extern "C" fn viewtape_on_batch(len: i32) -> i32 {
                RUNTIME.with(|rt| $crate::__private::on_batch::<$runtime>(rt, len))
            }
            #[no_mangle]
            pub extern "C" fn viewtape_save() -> i32 {
                RUNTIME.with(|rt| $crate::__private::save::<$runtime>(rt))
            }
        };
    };
}
