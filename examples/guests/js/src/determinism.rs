//! Time and chance, the same on every node and at every replay (the crate's "Determinism"):
//! what `Date.now()` and `new Date()` give, and `Math.random()`.

use std::cell::Cell;

use rquickjs::{Ctx, Function, Object};

thread_local! {
    /// `Math.random`'s state.
    static RANDOM: Cell<u64> = const { Cell::new(0) };
    /// What `Date.now()` gives, in microseconds: the running batch's ingest time, else 0.
    static NOW_US: Cell<f64> = const { Cell::new(0.0) };
}

/// The clock the QuickJS shim asks for: the running batch's ingest time, else the epoch (see
/// "Determinism"). Defined here, wasm-ld resolves the shim's import to it and the module
/// imports nothing but `viewtape`.
#[cfg(target_arch = "wasm32")]
#[no_mangle]
pub extern "C" fn __rquickjs_host_now_us() -> f64 {
    NOW_US.with(Cell::get)
}

/// A batch begins: the clock reads its ingest time, and `Math.random` starts the batch's
/// stream, from the runtime's count of batches and that time.
pub fn batch_begins(batches: u64, time_ms: u64) {
    seed_random(batches, time_ms);
    NOW_US.with(|now| now.set(time_ms as f64 * 1000.0));
}

/// The batch ended: the clock reads the epoch again.
pub fn batch_ends() {
    NOW_US.with(|now| now.set(0.0));
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

pub fn seed_random(batches: u64, time_ms: u64) {
    RANDOM.with(|s| s.set(mix(batches ^ 0x5654_4a53_5241_4e44) ^ mix(time_ms)));
}

/// Takes `WeakRef` and `FinalizationRegistry` away: they tell when the garbage collector ran,
/// which the log does not decide.
pub fn remove_gc_observers(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    let globals = ctx.globals();
    globals.remove("WeakRef")?;
    globals.remove("FinalizationRegistry")?;
    Ok(())
}

/// Replaces the clock-free `Math.random` with the seeded one.
pub fn install_random(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    let math: Object = ctx.globals().get("Math")?;
    math.set("random", Function::new(ctx.clone(), next_random)?)?;
    Ok(())
}
