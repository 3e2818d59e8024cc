//! JavaScript guests: a module whose bytes are JavaScript source, run by the
//! JS engine guest the server embeds (`guests::JS_ENGINE_WASM`, built from
//! `examples/guests/js`).
//!
//! ## How a JavaScript module runs
//!
//! The engine is an ordinary guest of ABI v1: compiled once per [`GuestEngine`] (lazily, on the
//! first JavaScript module) and shared by every JavaScript runtime. What makes a runtime run
//! *this* source is its init input: the source and the runtime's config, framed as `ABI.md`
//! ("JavaScript guests") says ([`viewtape_guest::abi::js_init_input`]). Everything else — fuel,
//! memory, batches, saved state, the declaration — is the engine's, exactly as for any guest.
//!
//! ## Telling JavaScript from WebAssembly
//!
//! Bytes that start with `\0asm` are WebAssembly. Other bytes are JavaScript if they are text:
//! UTF-8 with no control characters but tab, line feed, vertical tab, form feed and carriage
//! return (what an editor writes). Anything else is neither, and refused as not WebAssembly.
//!
//! ## Checked at load
//!
//! A module that does not compile is refused when it is loaded (`check-config`, a deploy, the
//! server's start), not at its first batch: [`check_syntax`] runs the engine in its
//! compile-only mode, which runs none of the module's code.

use std::sync::Arc;

use viewtape_guest::abi;
use wasmtime::{InstancePre, Store};

use super::engine::{HostState, Limiter};
use super::{GuestEngine, LoadError, DEFAULT_FUEL};

/// Whether `bytes` (not WebAssembly) are text a JavaScript module could be.
pub(crate) fn is_source(bytes: &[u8]) -> bool {
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            !text.trim().is_empty()
                && !text
                    .chars()
                    .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\x0b' | '\x0c' | '\r'))
        }
        Err(_) => false,
    }
}

/// Compiles `source` in the engine without running it.
///
/// # Errors
/// [`LoadError::JsSyntax`] naming the line and column of the first error;
/// [`LoadError::JsEngine`] if the engine itself failed (out of fuel or memory on a huge source).
pub(crate) fn check_syntax(
    engine: &GuestEngine,
    pre: &Arc<InstancePre<HostState>>,
    source: &[u8],
) -> Result<(), LoadError> {
    let engine_error = |what: String| LoadError::JsEngine(what);
    let mut store = Store::new(
        engine.engine(),
        HostState {
            runtime: Arc::from("(syntax check)"),
            limiter: Limiter {
                max_memory_bytes: engine.config().max_memory_bytes,
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
        .set_fuel(DEFAULT_FUEL)
        .map_err(|e| engine_error(e.to_string()))?;
    let instance = pre
        .instantiate(&mut store)
        .map_err(|e| engine_error(e.to_string()))?;
    let memory = instance
        .get_memory(&mut store, abi::EXPORT_MEMORY)
        .ok_or_else(|| engine_error("no memory export".into()))?;
    store.data_mut().memory = Some(memory);
    let input = instance
        .get_typed_func::<i32, i32>(&mut store, abi::EXPORT_INPUT)
        .map_err(|e| engine_error(e.to_string()))?;
    let init = instance
        .get_typed_func::<i32, i32>(&mut store, abi::EXPORT_INIT)
        .map_err(|e| engine_error(e.to_string()))?;
    let framed = abi::js_init_input(abi::JS_MODE_CHECK, source, b"");
    let len = i32::try_from(framed.len())
        .map_err(|_| engine_error("the source is larger than 2 GiB".into()))?;
    let ptr = input
        .call(&mut store, len)
        .map_err(|e| engine_error(e.to_string()))?;
    if ptr == 0 {
        return Err(engine_error(
            "the engine could not allocate the source".into(),
        ));
    }
    memory
        .write(&mut store, ptr as u32 as usize, &framed)
        .map_err(|e| engine_error(e.to_string()))?;
    match init.call(&mut store, len) {
        Ok(abi::STATUS_OK) => Ok(()),
        Ok(_) => Err(LoadError::JsSyntax {
            message: store
                .data_mut()
                .error
                .take()
                .unwrap_or_else(|| "(the engine gave no message)".into()),
        }),
        Err(e) => Err(engine_error(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::engine;
    use super::super::{EventKind, GuestError, GuestInstance, GuestModule, Limits, LoadError};

    const PRICES: &str = r#"
export function init(config) {
  return { last: 0, config };
}
export function onBatch(state, input, ctx) {
  for (const line of input.split('\n')) {
    if (!line) continue;
    const t = JSON.parse(line);
    if (t.seq <= state.last) continue;
    if (t.seq > state.last + 1) ctx.reportGap(`missed ${state.last + 1}..${t.seq - 1}`);
    if (t.price === null) { ctx.delete('prices', t.symbol); state.last = t.seq; continue; }
    if (t.price < 0) throw new Error(`negative price at seq ${t.seq}`);
    ctx.publish('prices', t.symbol, { symbol: t.symbol, price: t.price, seq: t.seq });
    state.last = t.seq;
  }
  ctx.log('debug', 'batch done');
  return state;
}
export const schemas = { prices: { type: 'object', required: ['symbol', 'price'] } };
"#;

    fn module(source: &str) -> GuestModule {
        GuestModule::new(engine(), source.as_bytes()).expect("the module loads")
    }

    async fn instance(source: &str) -> GuestInstance {
        GuestInstance::new(&module(source), "js", &Limits::default(), b"cfg", None)
            .await
            .expect("the instance starts")
    }

    fn text(bytes: &[u8]) -> &str {
        std::str::from_utf8(bytes).expect("UTF-8")
    }

    #[tokio::test]
    async fn a_js_guest_publishes_deletes_and_reports_a_gap() {
        let js = module(PRICES);
        assert!(js.is_javascript());
        assert_eq!(
            js.fingerprint(),
            &super::super::ModuleFingerprint::of(PRICES.as_bytes())
        );
        let mut g = GuestInstance::new(&js, "js", &Limits::default(), b"cfg", None)
            .await
            .unwrap();
        assert_eq!(
            g.declaration().map(text),
            Some(r#"{"schemas":{"prices":{"type":"object","required":["symbol","price"]}}}"#)
        );
        let batch = g
            .on_batch(
                b"{\"symbol\":\"ACME\",\"price\":12.5,\"seq\":1}\n{\"symbol\":\"ACME\",\"price\":null,\"seq\":3}\n",
                0,
            )
            .await
            .unwrap();
        assert_eq!(batch.gaps, vec!["missed 2..2".to_string()]);
        let events: Vec<_> = batch
            .events
            .iter()
            .map(|e| (&*e.view, e.key.as_str(), e.kind, text(&e.payload)))
            .collect();
        assert_eq!(
            events,
            vec![
                (
                    "prices",
                    "ACME",
                    EventKind::Update,
                    r#"{"symbol":"ACME","price":12.5,"seq":1}"#
                ),
                ("prices", "ACME", EventKind::Delete, ""),
            ]
        );
        let saved = g.save().await.unwrap();
        let saved = text(super::super::guests::saved_state(&saved));
        assert!(
            saved.ends_with(r#""batches":1,"state":{"last":3,"config":"cfg"}}"#),
            "{saved}"
        );
    }

    #[tokio::test]
    async fn strings_and_bytes_are_published_as_they_are() {
        let mut g = instance(
            "export function onBatch(s, input, ctx) { ctx.publish('v', 'a', input); \
             ctx.publish('v', 'b', new Uint8Array([104, 105])); ctx.publish('v', 'c', [1, 'x']); }",
        )
        .await;
        let batch = g.on_batch(b"raw text", 0).await.unwrap();
        let payloads: Vec<_> = batch.events.iter().map(|e| text(&e.payload)).collect();
        assert_eq!(payloads, ["raw text", "hi", r#"[1,"x"]"#]);
    }

    #[tokio::test]
    async fn a_throw_rejects_the_batch_naming_where_and_the_state_rolls_back() {
        let js = module(PRICES);
        let mut g = GuestInstance::new(&js, "js", &Limits::default(), b"", None)
            .await
            .unwrap();
        g.on_batch(b"{\"symbol\":\"A\",\"price\":1,\"seq\":1}", 0)
            .await
            .unwrap();
        let saved = g.save().await.unwrap();
        let err = g
            .on_batch(b"{\"symbol\":\"A\",\"price\":2,\"seq\":2}\n{\"symbol\":\"A\",\"price\":-1,\"seq\":3}", 0).await
            .unwrap_err();
        let GuestError::GuestRejected { message } = &err else {
            panic!("unexpected {err:?}");
        };
        assert_eq!(
            message,
            "Error: negative price at seq 3 (at guest.js:12:63)"
        );
        assert!(err.is_input_error());

        // The host drops the instance and restores the last good state: seq 2 is new again.
        let mut g = GuestInstance::new(&js, "js", &Limits::default(), b"", Some(&saved))
            .await
            .unwrap();
        let batch = g
            .on_batch(b"{\"symbol\":\"A\",\"price\":2,\"seq\":2}", 0)
            .await
            .unwrap();
        assert_eq!(batch.events.len(), 1);
        assert!(batch.gaps.is_empty());
    }

    #[tokio::test]
    async fn a_builtin_throw_names_the_users_line_not_the_engines() {
        let mut g = instance(PRICES).await;
        let err = g.on_batch(b"{oops", 0).await.unwrap_err();
        let message = err.to_string();
        assert!(message.contains("SyntaxError"), "{message}");
        assert!(message.ends_with("(at guest.js:8:26)"), "{message}");
    }

    #[tokio::test]
    async fn an_endless_loop_runs_out_of_fuel_and_the_next_batch_works() {
        let js = module(
            "export function onBatch(s, input, ctx) { if (input === 'spin') while (true) {} \
             ctx.publish('v', 'k', input); }",
        );
        let limits = Limits {
            fuel: 50_000_000,
            ..Limits::default()
        };
        let mut g = GuestInstance::new(&js, "js", &limits, b"", None)
            .await
            .unwrap();
        let err = g.on_batch(b"spin", 0).await.unwrap_err();
        assert!(matches!(err, GuestError::FuelExhausted { .. }), "{err}");
        let mut g = GuestInstance::new(&js, "js", &limits, b"", None)
            .await
            .unwrap();
        let batch = g.on_batch(b"fine", 0).await.unwrap();
        assert_eq!(text(&batch.events[0].payload), "fine");
    }

    #[tokio::test]
    async fn deep_recursion_is_a_range_error_the_guest_can_catch() {
        let js = module(
            "function depth(n) { return n === 0 ? 0 : 1 + depth(n - 1); } \
             export function onBatch(s, input, ctx) { const n = Number(input); \
             if (n < 0) return depth(-n); \
             try { ctx.publish('v', 'k', String(depth(n))); } \
             catch (e) { ctx.publish('v', 'k', `${e.name}: ${e.message}`); } }",
        );
        let mut g = GuestInstance::new(&js, "js", &Limits::default(), b"", None)
            .await
            .unwrap();
        let batch = g.on_batch(b"800", 0).await.unwrap();
        assert_eq!(text(&batch.events[0].payload), "800");
        let batch = g.on_batch(b"100000", 0).await.unwrap();
        assert_eq!(
            text(&batch.events[0].payload),
            "RangeError: Maximum call stack size exceeded"
        );
        // Uncaught, it rejects the batch as any throw does, naming itself (not a trap).
        let err = g.on_batch(b"-100000", 0).await.unwrap_err();
        assert!(
            matches!(&err, GuestError::GuestRejected { message } if message.starts_with("RangeError")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_memory_bomb_fails_the_batch_within_the_limit() {
        let js = module(
            "export function onBatch(s, input, ctx) { const a = []; \
             while (true) a.push(new Uint8Array(1 << 20)); }",
        );
        let limits = Limits {
            max_memory_bytes: 16 << 20,
            ..Limits::default()
        };
        let mut g = GuestInstance::new(&js, "js", &limits, b"", None)
            .await
            .unwrap();
        let err = g.on_batch(b"go", 0).await.unwrap_err();
        assert!(
            matches!(err, GuestError::MemoryExceeded { limit } if limit == 16 << 20),
            "{err}"
        );
        assert!(!err.is_input_error());
    }

    #[tokio::test]
    async fn date_and_random_are_the_same_on_every_instance() {
        let source = "export function onBatch(s, input, ctx) { \
             ctx.publish('v', 'k', [Date.now(), new Date().toISOString(), Math.random(), Math.random()]); }";
        let js = module(source);
        let mut outputs = Vec::new();
        for _ in 0..2 {
            let mut g = GuestInstance::new(&js, "js", &Limits::default(), b"", None)
                .await
                .unwrap();
            let first = g.on_batch(b"x", 0).await.unwrap();
            let second = g.on_batch(b"x", 0).await.unwrap();
            outputs.push((
                text(&first.events[0].payload).to_owned(),
                text(&second.events[0].payload).to_owned(),
            ));
        }
        assert_eq!(outputs[0], outputs[1]);
        let (first, second) = &outputs[0];
        assert!(
            first.starts_with(r#"[0,"1970-01-01T00:00:00.000Z",0."#),
            "{first}"
        );
        assert_ne!(first, second, "each batch draws other numbers");
    }

    #[tokio::test]
    async fn migrate_sees_state_another_source_saved() {
        let old = module(
            "export function init() { return { n: 1 }; } export function onBatch(s) { return s; }",
        );
        let mut g = GuestInstance::new(&old, "js", &Limits::default(), b"", None)
            .await
            .unwrap();
        let saved = g.save().await.unwrap();
        let new = module(
            "export function migrate(old) { return { count: old.n + 1 }; } \
             export function onBatch(s, input, ctx) { ctx.publish('v', 'k', s); return s; }",
        );
        let mut g = GuestInstance::new(&new, "js", &Limits::default(), b"", Some(&saved))
            .await
            .unwrap();
        let batch = g.on_batch(b"", 0).await.unwrap();
        assert_eq!(text(&batch.events[0].payload), r#"{"count":2}"#);
    }

    #[test]
    fn a_syntax_error_is_a_load_error_naming_line_and_column() {
        let err = GuestModule::new(
            engine(),
            b"export function onBatch(s) {\n  return s +;\n}\n",
        )
        .unwrap_err();
        assert!(matches!(err, LoadError::JsSyntax { .. }), "{err}");
        assert!(err.to_string().contains("guest.js:2:"), "{err}");
        assert_eq!(err.public_message(), err.to_string());
    }

    #[tokio::test]
    async fn a_module_without_on_batch_is_refused_at_init() {
        let js = module("export const x = 1;");
        let err = GuestInstance::new(&js, "js", &Limits::default(), b"", None)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("exports no function `onBatch"),
            "{err}"
        );
    }

    #[test]
    fn text_is_javascript_and_other_bytes_are_not() {
        assert!(super::is_source(b"export function onBatch() {}\r\n"));
        assert!(!super::is_source(b""));
        assert!(!super::is_source(b"  \n"));
        assert!(!super::is_source(b"\x7fELF\x02\x01\x01"));
        assert!(!super::is_source(b"\xff\xfe"));
    }
}
