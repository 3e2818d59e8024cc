//! A runtime's state between batches: its JSON, which every batch starts from (the host makes
//! an instance for each batch from the state saved after the last one), and the envelope the
//! engine saves it in (see "State").

use rquickjs::{CatchResultExt, Ctx, Function, Persistent, Value};
use viewtape_guest::{Error, Result};

use crate::{js_error, json};

/// Finds where a state holds what JSON does not give back as it is (`loss.js`).
pub struct LossFinder(Persistent<Function<'static>>);

impl LossFinder {
    /// Evaluates the finder in `ctx`, before any of the user's code runs.
    ///
    /// # Errors
    /// The engine's, if it cannot evaluate it.
    pub fn new(ctx: &Ctx<'_>) -> rquickjs::Result<Self> {
        let find: Function = ctx.eval(include_str!("loss.js"))?;
        Ok(Self(Persistent::save(ctx, find)))
    }

    /// Where `state` loses something in JSON, if the finder can tell.
    fn find<'js>(&self, ctx: &Ctx<'js>, state: Value<'js>) -> Option<String> {
        let find = self.0.clone().restore(ctx).ok()?;
        // A finder the user's code broke (an intrinsic replaced) says nothing.
        find.call::<_, Option<String>>((state,))
            .catch(ctx)
            .ok()
            .flatten()
    }
}

/// The state's JSON, or why the batch that made it is refused: it is not JSON (a cycle, a
/// `BigInt`), or it holds what JSON does not give back as it is (a `Set`, a `Date`, `NaN`, a
/// class instance, a `toJSON`), which the next batch would not see.
pub fn state_json<'js>(
    ctx: &Ctx<'js>,
    intrinsics: &json::Intrinsics,
    loss: &LossFinder,
    state: Value<'js>,
) -> Result<String> {
    let mut out = Vec::new();
    if json::write_state(ctx, intrinsics, &state, &mut out).is_ok() {
        return String::from_utf8(out).map_err(|_| Error::msg("the state's JSON is not UTF-8"));
    }
    if let Some(lost) = loss.find(ctx, state.clone()) {
        return Err(Error::msg(format!(
            "the state does not survive JSON, and the next batch starts from its JSON: {lost}; \
             keep plain objects and arrays of strings, finite numbers, booleans and null in it"
        )));
    }
    // Plain data the fast writer leaves to the engine (a lone surrogate, deep nesting).
    match json::stringify(ctx, state) {
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
pub fn envelope<'js>(
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
