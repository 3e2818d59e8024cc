//! Host tests with the real compiled guests (`guests.rs`) and small WAT modules.
//!
//! One file past 500 lines: the host's cases, each independent, over one engine they share.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::*;

pub(super) fn engine() -> &'static GuestEngine {
    static ENGINE: OnceLock<GuestEngine> = OnceLock::new();
    ENGINE.get_or_init(|| GuestEngine::new(EngineConfig::default()).unwrap())
}

fn misbehave() -> &'static GuestModule {
    static M: OnceLock<GuestModule> = OnceLock::new();
    M.get_or_init(|| GuestModule::new(engine(), guests::MISBEHAVE_WASM).unwrap())
}

fn ticker() -> &'static GuestModule {
    static M: OnceLock<GuestModule> = OnceLock::new();
    M.get_or_init(|| GuestModule::new(engine(), guests::TICKER_WASM).unwrap())
}

async fn instance(module: &GuestModule, limits: Limits) -> GuestInstance {
    GuestInstance::new(module, "test", &limits, b"", None)
        .await
        .unwrap()
}

fn updates(batch: &GuestBatch) -> Vec<(String, String, String)> {
    batch
        .events
        .iter()
        .map(|e| {
            let payload = String::from_utf8(e.payload.to_vec()).unwrap();
            (e.view.to_string(), e.key.to_string(), payload)
        })
        .collect()
}

#[tokio::test]
async fn ticker_publishes_normalized_ticks() {
    let mut g = instance(ticker(), Limits::default()).await;
    let batch = g
        .on_batch(b"{\"symbol\":\"ACME\",\"seq\":1,\"price\":12.50}\n{\"symbol\":\"XYZ\",\"price\":3,\"seq\":2}\n", 0).await
        .unwrap();
    assert_eq!(
        updates(&batch),
        vec![
            (
                "prices".into(),
                "ACME".into(),
                r#"{"symbol":"ACME","price":12.5,"seq":1}"#.into()
            ),
            (
                "prices".into(),
                "XYZ".into(),
                r#"{"symbol":"XYZ","price":3.0,"seq":2}"#.into()
            ),
        ]
    );
    assert!(batch.gaps.is_empty());
}

#[tokio::test]
async fn ticker_malformed_line_names_the_line() {
    let mut g = instance(ticker(), Limits::default()).await;
    let err = g
        .on_batch(b"{\"symbol\":\"A\",\"price\":1,\"seq\":1}\n{oops\n", 0)
        .await
        .unwrap_err();
    match err {
        GuestError::GuestRejected { message } => {
            assert!(message.starts_with("line 2, column"), "{message}")
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn ticker_seq_jump_reports_gap() {
    let mut g = instance(ticker(), Limits::default()).await;
    g.on_batch(b"{\"symbol\":\"A\",\"price\":1,\"seq\":1}", 0)
        .await
        .unwrap();
    let batch = g
        .on_batch(b"{\"symbol\":\"A\",\"price\":1,\"seq\":4}", 0)
        .await
        .unwrap();
    assert_eq!(batch.gaps.len(), 1);
    assert!(
        batch.gaps[0].contains("2 tick(s) missing"),
        "{:?}",
        batch.gaps
    );
    assert_eq!(batch.events.len(), 1);
}

#[tokio::test]
async fn publish_delete_and_gap_in_order() {
    let mut g = instance(misbehave(), Limits::default()).await;
    let batch = g
        .on_batch(
            b"publish v1 k1 hello\ndelete v1 k0\ngap feed restarted\npublish v2 k2 world",
            0,
        )
        .await
        .unwrap();
    assert_eq!(batch.gaps, vec!["feed restarted".to_string()]);
    let kinds: Vec<_> = batch
        .events
        .iter()
        .map(|e| (&*e.view, e.key.as_str(), e.kind))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("v1", "k1", EventKind::Update),
            ("v1", "k0", EventKind::Delete),
            ("v2", "k2", EventKind::Update),
        ]
    );
    assert_eq!(&batch.events[0].payload[..], b"hello");
    assert!(batch.events[1].payload.is_empty());
}

#[tokio::test]
async fn rejected_batch_returns_the_guest_message_and_nothing_else() {
    let mut g = instance(misbehave(), Limits::default()).await;
    let err = g
        .on_batch(b"publish v k x\nfail bad input on line 2", 0)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, GuestError::GuestRejected { message } if message == "bad input on line 2"),
        "{err}"
    );
    assert!(err.is_input_error());
}

#[tokio::test]
async fn save_restore_round_trip() {
    let mut g = instance(misbehave(), Limits::default()).await;
    g.on_batch(b"count\ncount", 0).await.unwrap();
    let state = g.save().await.unwrap();
    assert_eq!(guests::saved_state(&state), b"2");
    let mut fresh = GuestInstance::new(misbehave(), "test", &Limits::default(), b"", Some(&state))
        .await
        .unwrap();
    let batch = fresh.on_batch(b"count", 0).await.unwrap();
    assert_eq!(&batch.events[0].payload[..], b"3");
}

#[tokio::test]
async fn init_failure_is_reported() {
    let err = GuestInstance::new(misbehave(), "test", &Limits::default(), b"fail", None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, GuestError::Refused { what: "config", message } if message == "config says fail"),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "the guest refused its config: config says fail"
    );
}

#[tokio::test]
async fn panic_is_a_trap_with_its_message() {
    let mut g = instance(misbehave(), Limits::default()).await;
    let err = g.on_batch(b"panic kaboom", 0).await.unwrap_err();
    match &err {
        GuestError::Trap {
            message: Some(m), ..
        } => assert!(m.contains("kaboom"), "{m}"),
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        err.to_string().starts_with("guest panicked: kaboom"),
        "the panic message first: {err}"
    );
    // What a client is told holds neither the message nor the location nor the trap's text:
    // the log has them (the SDK documents a panic's message as the log's).
    assert_eq!(
        err.public_message(),
        "the guest panicked (its message is in the server log)"
    );
}

/// Each kind of guest failure is told in the server's words: a trap without a panic hides the
/// engine's text, the limits name the setting, a returned error is the guest's own.
#[tokio::test]
async fn every_guest_failure_is_told_in_our_words() {
    for (line, told) in [
        (
            &b"fail no such symbol"[..],
            "guest rejected the batch: no such symbol",
        ),
        (b"loop", "CPU budget"),
        (b"oom", "memory limit"),
    ] {
        let mut g = instance(misbehave(), Limits::default()).await;
        let err = g.on_batch(line, 0).await.unwrap_err();
        let public = err.public_message();
        assert!(public.contains(told), "{public}");
        assert!(!public.contains("wasm"), "{public}");
    }
    let trap = GuestError::Trap {
        trap: "wasm trap: out of bounds memory access".into(),
        message: None,
    };
    assert_eq!(
        trap.public_message(),
        "the guest trapped (the server log says where)"
    );
    let abi = GuestError::Protocol("export `x`: wasmtime detail".into());
    assert!(!abi.public_message().contains("wasmtime"));
}

#[tokio::test]
async fn infinite_loop_uses_up_its_fuel_well_before_the_deadline() {
    let mut g = instance(misbehave(), Limits::default()).await;
    let started = Instant::now();
    let err = g.on_batch(b"loop", 0).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(err, GuestError::FuelExhausted { fuel } if fuel == DEFAULT_FUEL),
        "{err}"
    );
    assert!(err.to_string().contains("[runtime.limits] fuel"), "{err}");
    assert!(took < Limits::default().batch_timeout, "{took:?}");
}

#[tokio::test]
async fn the_same_batch_always_uses_the_same_fuel() {
    // Deterministic CPU accounting: fresh instances spend exactly the same fuel on the same
    // batch, and a budget passes or fails the same way every time.
    let batch = b"count\npublish v k 1\ncount";
    let mut used = Vec::new();
    for _ in 0..3 {
        let mut g = instance(misbehave(), Limits::default()).await;
        g.on_batch(batch, 0).await.unwrap();
        used.push(DEFAULT_FUEL - g.fuel_left());
    }
    assert!(used.iter().all(|u| *u == used[0] && *u > 0), "{used:?}");
    for (fuel, passes) in [(used[0], true), (used[0] / 4, false)] {
        for _ in 0..3 {
            let limits = Limits {
                fuel,
                ..Limits::default()
            };
            let mut g = instance(misbehave(), limits).await;
            let outcome = g.on_batch(batch, 0).await;
            assert_eq!(outcome.is_ok(), passes, "fuel {fuel}: {outcome:?}");
        }
    }
}

#[tokio::test]
async fn the_wall_clock_backstop_still_stops_a_guest_with_a_huge_budget() {
    let limits = Limits {
        fuel: u64::MAX,
        batch_timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let mut g = instance(misbehave(), limits).await;
    let started = Instant::now();
    let err = g.on_batch(b"loop", 0).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, GuestError::Timeout { .. }), "{err}");
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(450),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_running_guest_yields_to_the_other_tasks_of_its_thread() {
    // `tokio::test` runs on one thread: the counting task below gets to run while the guest
    // loops only when the guest yields.
    let limits = Limits {
        fuel: u64::MAX,
        batch_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let mut g = instance(misbehave(), limits).await;
    let ticks = Arc::new(AtomicU64::new(0));
    let counter = tokio::spawn({
        let ticks = Arc::clone(&ticks);
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    tokio::task::yield_now().await;
    let err = g.on_batch(b"loop", 0).await.unwrap_err();
    counter.abort();
    assert!(matches!(err, GuestError::Timeout { .. }), "{err}");
    let ticks = ticks.load(Ordering::Relaxed);
    assert!(
        ticks >= 10,
        "the other task ran {ticks} times in 300 ms of guest"
    );
}

#[tokio::test]
async fn memory_bomb_is_stopped() {
    let limits = Limits {
        max_memory_bytes: 16 << 20,
        ..Limits::default()
    };
    let mut g = instance(misbehave(), limits).await;
    let err = g.on_batch(b"oom", 0).await.unwrap_err();
    assert!(
        matches!(err, GuestError::MemoryExceeded { limit } if limit == 16 << 20),
        "{err}"
    );
    assert!(
        err.to_string().contains("16 MiB ([runtime.limits] memory)"),
        "{err}"
    );
}

#[tokio::test]
async fn oversized_event_is_refused() {
    let limits = Limits {
        max_event_bytes: 1000,
        ..Limits::default()
    };
    let mut g = instance(misbehave(), limits).await;
    g.on_batch(b"big v 1000", 0).await.unwrap();
    let err = g.on_batch(b"big v 1001", 0).await.unwrap_err();
    assert!(
        matches!(&err, GuestError::EventTooLarge { view, size: 1001, limit: 1000, .. } if view == "v"),
        "{err}"
    );
}

#[tokio::test]
async fn oversized_batch_is_refused_before_the_guest() {
    let limits = Limits {
        max_batch_bytes: 10,
        ..Limits::default()
    };
    let mut g = instance(misbehave(), limits).await;
    let err = g.on_batch(b"publish v k 12345", 0).await.unwrap_err();
    assert!(
        matches!(
            err,
            GuestError::BatchTooLarge {
                size: 17,
                limit: 10
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn invalid_view_name_is_named_as_such() {
    let mut g = instance(misbehave(), Limits::default()).await;
    let err = g.on_batch(b"publish bad/view k x", 0).await.unwrap_err();
    assert!(
        matches!(&err, GuestError::InvalidView { view } if view == "bad/view"),
        "{err}"
    );
    assert!(err.to_string().contains("not a view name"), "{err}");
}

#[tokio::test]
async fn input_buffer_grows() {
    let mut g = instance(misbehave(), Limits::default()).await;
    g.on_batch(b"count", 0).await.unwrap();
    let big = format!("publish v k {}", "y".repeat(100_000));
    let batch = g.on_batch(big.as_bytes(), 0).await.unwrap();
    assert_eq!(batch.events[0].payload.len(), 100_000);
}

/// A file that is not WebAssembly at all (or a component) used to be refused with wasmtime's
/// parser message and a dump of the bytes it found: it gets one line of ours, naming what to give.
/// Text is JavaScript (`js.rs`): NDJSON given by mistake is refused as JavaScript that does not
/// compile, naming where.
#[test]
fn not_wasm_and_components_are_refused_in_our_words() {
    let err = GuestModule::new(engine(), b"{\"symbol\":\"ACME\"}\n").unwrap_err();
    assert!(
        matches!(&err, LoadError::JsSyntax { message } if message.ends_with("(at guest.js:1:10)")),
        "{err}"
    );
    for text in [&b""[..], b"\0as", b"\x7fELF\x02\x01\x01"] {
        let err = GuestModule::new(engine(), text).unwrap_err();
        assert!(matches!(err, LoadError::NotWasm), "{err}");
        let message = err.to_string();
        assert!(
            message.starts_with("not a WebAssembly module") && !message.contains("expected"),
            "{message}"
        );
    }
    // The preamble of a component: the magic, version 0x0d, layer 1.
    let err = GuestModule::new(engine(), b"\0asm\x0d\0\x01\0").unwrap_err();
    assert!(matches!(err, LoadError::NotModule), "{err}");
}

#[test]
fn compile_failure_is_refused() {
    let err = GuestModule::new(engine(), b"\0asm\x01\0\0\0 not really").unwrap_err();
    assert!(matches!(err, LoadError::Compile(_)), "{err}");
    // The cause is part of the message, not only of the error chain.
    let message = err.to_string();
    assert!(
        message.len() > "guest module failed to compile: ".len(),
        "{message}"
    );
}

const GOOD_EXPORTS: &str = r#"
    (memory (export "memory") 1)
    (func (export "viewtape_input") (param i32) (result i32) i32.const 1024)
    (func (export "viewtape_init") (param i32) (result i32) i32.const 0)
    (func (export "viewtape_restore") (param i32) (result i32) i32.const 0)
    (func (export "viewtape_save") (result i32) i32.const 0)
"#;

fn wat_module(body: &str) -> Result<GuestModule, LoadError> {
    let wasm = wat::parse_str(format!("(module {body})")).unwrap();
    GuestModule::new(engine(), &wasm)
}

#[test]
fn missing_marker_is_not_a_guest() {
    let err = wat_module(GOOD_EXPORTS).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::MissingExport {
                name: "viewtape_abi_v1"
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("not a viewtape guest"));
}

#[test]
fn missing_export_is_named() {
    let err = wat_module(&format!(
        r#"(func (export "viewtape_abi_v1")) {GOOD_EXPORTS}"#
    ))
    .unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::MissingExport {
                name: "viewtape_on_batch"
            }
        ),
        "{err}"
    );
}

#[test]
fn wrong_abi_version_is_refused() {
    let err = wat_module(&format!(
        r#"(func (export "viewtape_abi_v2")) {GOOD_EXPORTS}"#
    ))
    .unwrap_err();
    assert!(
        matches!(&err, LoadError::AbiVersion { found, expected: 1 } if found == "2"),
        "{err}"
    );
    assert!(err.to_string().contains("ABI version 2"), "{err}");
}

#[test]
fn wrong_export_type_is_refused() {
    let err = wat_module(&format!(
        r#"(func (export "viewtape_abi_v1")) (func (export "viewtape_on_batch") (result i32) i32.const 0) {GOOD_EXPORTS}"#
    ))
    .unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::ExportType {
                name: "viewtape_on_batch",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn wasi_imports_are_refused() {
    let err = wat_module(&format!(
        r#"(import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))
           (func (export "viewtape_abi_v1"))
           (func (export "viewtape_on_batch") (param i32) (result i32) i32.const 0) {GOOD_EXPORTS}"#
    ))
    .unwrap_err();
    assert!(matches!(err, LoadError::Link(_)), "{err}");
}

#[tokio::test]
async fn hand_written_guest_with_bad_reply_pointer_is_a_trap_not_a_crash() {
    let module = wat_module(
        r#"(import "viewtape" "reply" (func $reply (param i32 i32)))
           (memory (export "memory") 1)
           (func (export "viewtape_abi_v1"))
           (func (export "viewtape_input") (param i32) (result i32) i32.const 1024)
           (func (export "viewtape_init") (param i32) (result i32) i32.const 0)
           (func (export "viewtape_restore") (param i32) (result i32) i32.const 0)
           (func (export "viewtape_save") (result i32) i32.const 0)
           (func (export "viewtape_on_batch") (param i32) (result i32)
              i32.const 65000 i32.const 100000 call $reply i32.const 0)"#,
    )
    .unwrap();
    let mut g = instance(&module, Limits::default()).await;
    let err = g.on_batch(b"x", 0).await.unwrap_err();
    assert!(
        matches!(&err, GuestError::Trap { trap, .. } if trap.contains("out of bounds")),
        "{err}"
    );
}

#[tokio::test]
async fn memory_limit_below_the_initial_memory_refuses_instantiation() {
    let limits = Limits {
        max_memory_bytes: 64 << 10,
        ..Limits::default()
    };
    let err = GuestInstance::new(misbehave(), "test", &limits, b"", None)
        .await
        .unwrap_err();
    assert!(matches!(err, GuestError::MemoryExceeded { .. }), "{err}");
}

/// An instance past the bound waits for a place, up to its batch timeout, then names the
/// bound.
#[tokio::test(start_paused = true)]
async fn past_the_instance_bound_an_instance_waits_then_names_it() {
    let engine = GuestEngine::new(EngineConfig {
        pooled_instances: 1,
        ..EngineConfig::default()
    })
    .unwrap();
    let module = GuestModule::new(&engine, guests::MISBEHAVE_WASM).unwrap();
    let limits = Limits {
        batch_timeout: Duration::from_millis(100),
        ..Limits::default()
    };
    let first = GuestInstance::new(&module, "a", &limits, b"", None)
        .await
        .unwrap();
    let err = GuestInstance::new(&module, "b", &limits, b"", None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, GuestError::InstancesUsedUp { limit: 1 }),
        "{err}"
    );
    // A waiting one gets the place the first gives back.
    let second = tokio::spawn({
        let module = module.clone();
        async move { GuestInstance::new(&module, "b", &limits, b"", None).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(first);
    second.await.unwrap().unwrap();
}

fn logstats() -> &'static GuestModule {
    static M: OnceLock<GuestModule> = OnceLock::new();
    M.get_or_init(|| GuestModule::new(engine(), guests::LOGSTATS_WASM).unwrap())
}

fn json_guest() -> &'static GuestModule {
    static M: OnceLock<GuestModule> = OnceLock::new();
    M.get_or_init(|| GuestModule::new(engine(), guests::JSON_WASM).unwrap())
}

/// A line for the `json` guest, and whether it is one the guest must publish: an object of
/// members (a view, a key, a value, `delete`, an unknown one) each well formed or not, in
/// any order, with bytes replaced, inserted or removed (then whether it publishes is open).
fn json_guest_lines() -> impl Strategy<Value = (Vec<u8>, bool)> {
    let member = |name: &'static str, values: Vec<(&'static [u8], bool)>| {
        prop::option::of(prop::sample::select(values)).prop_map(move |value| {
            value.map(|(value, good)| ([b"\"", name.as_bytes(), b"\":", value].concat(), good))
        })
    };
    let members = (
        member(
            "view",
            vec![
                (b"\"v\"", true),
                (b"\"o.eu-1\"", true),
                (b"\"bad view\"", false),
                (b"\"\"", false),
                (b"1", false),
            ],
        ),
        member(
            "key",
            vec![
                (b"\"k\"", true),
                (b"\"\\u00e9 \\\"q\\\"\"", true),
                (b"\"\"", false),
                (b"2", false),
            ],
        ),
        member(
            "value",
            vec![
                (b"1.5", true),
                (b"{\"a\": [1, null]}", true),
                (b"\"x\\ny\"", true),
                (b"null", true),
                (b"\"\xff\"", false),
                (b"1e999", false),
                (b"[", false),
                (b"tru", false),
            ],
        ),
        member("delete", vec![(b"false", true), (b"1", false)]),
        member("extra", vec![(b"1", false)]),
    );
    let edits = prop::collection::vec((0usize..80, any::<u8>(), 0u8..3), 0..3);
    (
        members,
        Just(()).prop_perturb(|(), mut rng| rng.random::<u64>()),
        edits,
    )
        .prop_map(|((view, key, value, delete, extra), order, edits)| {
            let mut present: Vec<(Vec<u8>, bool)> =
                [view.clone(), key.clone(), value.clone(), delete, extra]
                    .into_iter()
                    .flatten()
                    .collect();
            let turn = (order as usize) % present.len().max(1);
            present.rotate_left(turn);
            let good = view.is_some()
                && key.is_some()
                && value.is_some()
                && present.iter().all(|(_, good)| *good)
                && edits.is_empty();
            let mut line = b"{".to_vec();
            line.extend(
                present
                    .iter()
                    .map(|(text, _)| text.clone())
                    .collect::<Vec<_>>()
                    .join(&b","[..]),
            );
            line.push(b'}');
            for (at, byte, how) in edits {
                let at = at.min(line.len());
                match how {
                    0 if at < line.len() => line[at] = byte,
                    1 => line.insert(at, byte),
                    2 if at < line.len() => drop(line.remove(at)),
                    _ => {}
                }
            }
            (line, good)
        })
}

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// The `json` guest's line parser, run by the host on any line: the batch is published or
    /// refused — never a trap — and it agrees with `serde_json` read natively: what is not JSON
    /// at all is refused, a well-formed line is published, and what is published is the line's
    /// view, key and value.
    #[test]
    fn the_json_guest_publishes_or_refuses_any_line((line, good) in json_guest_lines()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let result = runtime.block_on(async {
            let mut g = instance(json_guest(), Limits::default()).await;
            g.on_batch(&line, 0).await
        });
        let shown = String::from_utf8_lossy(&line).into_owned();
        match &result {
            Ok(_) | Err(GuestError::GuestRejected { .. } | GuestError::InvalidView { .. }) => {}
            Err(other) => prop_assert!(false, "{shown}: {other}"),
        }
        if serde_json::from_slice::<serde::de::IgnoredAny>(&line).is_err() {
            prop_assert!(result.is_err(), "not JSON, yet published: {shown}");
        }
        if good {
            prop_assert!(result.is_ok(), "well formed, yet refused: {shown}: {:?}", result.err());
        }
        if let (Ok(batch), Ok(native)) = (&result, serde_json::from_slice::<serde_json::Value>(&line)) {
            prop_assert_eq!(batch.events.len(), 1, "{}", shown);
            let event = &batch.events[0];
            prop_assert_eq!(&*event.view, native["view"].as_str().unwrap_or_default());
            prop_assert_eq!(event.key.as_str(), native["key"].as_str().unwrap_or_default());
            let payload: serde_json::Value = serde_json::from_slice(&event.payload).unwrap();
            prop_assert_eq!(&payload, &native["value"]);
        }
    }

    /// Every built-in guest that parses ingest bodies, on any bytes — lines of JSON-ish and
    /// log-ish text with bytes out of place, or noise: the batch is published or refused,
    /// never a trap.
    #[test]
    fn builtin_guests_publish_or_refuse_any_bytes(
        guest in 0usize..3,
        input in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..200),
            prop::collection::vec(
                prop::sample::select(
                    b"{}[]\":,0123456789.-eE \t\r\n\\usymbolpriceseqviewkeyvalueERRORWARNINFOservice=\xff\xc3\xa9\x00".to_vec(),
                ),
                0..200,
            ),
        ],
    ) {
        let module = [ticker(), logstats(), json_guest()][guest];
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let result = runtime.block_on(async {
            let mut g = instance(module, Limits::default()).await;
            g.on_batch(&input, 0).await
        });
        match result {
            Ok(_) | Err(GuestError::GuestRejected { .. } | GuestError::InvalidView { .. }) => {}
            Err(other) => prop_assert!(false, "guest {}: {}: {}", guest, String::from_utf8_lossy(&input), other),
        }
    }
}

#[tokio::test]
async fn batch_time_is_the_batchs_ingest_time_and_zero_outside_a_batch() {
    // `viewtape_on_batch` succeeds only when `batch_time` is 1700000000123; `viewtape_save`
    // only when it is 0.
    let module = wat_module(
        r#"(import "viewtape" "reply" (func $reply (param i32 i32)))
           (import "viewtape" "batch_time" (func $batch_time (result i64)))
           (memory (export "memory") 1)
           (func (export "viewtape_abi_v1"))
           (func (export "viewtape_input") (param i32) (result i32) i32.const 1024)
           (func (export "viewtape_init") (param i32) (result i32) i32.const 0)
           (func (export "viewtape_restore") (param i32) (result i32) i32.const 0)
           (func (export "viewtape_save") (result i32)
              i32.const 0 i32.const 0 call $reply
              i32.const 0 i32.const -1 call $batch_time i64.eqz select)
           (func (export "viewtape_on_batch") (param i32) (result i32)
              i32.const 0 i32.const 0 call $reply
              i32.const 0 i32.const -1
              call $batch_time i64.const 1700000000123 i64.eq select)"#,
    )
    .unwrap();
    let mut g = instance(&module, Limits::default()).await;
    g.on_batch(b"x", 1_700_000_000_123).await.unwrap();
    g.save().await.unwrap();
    assert!(g.on_batch(b"x", 1_700_000_000_124).await.is_err());
}

/// An instance that starts from the init image its module and config left is the instance
/// `init` makes, byte for byte, and stays so batch after batch.
#[tokio::test]
async fn an_instance_from_an_init_image_is_the_one_init_makes() {
    let engine = GuestEngine::new(EngineConfig {
        pooled_instances: 4,
        ..EngineConfig::default()
    })
    .unwrap();
    let source: &[u8] = b"let calls = 0;\n\
        export function init(config) { return { config, lengths: [] }; }\n\
        export function onBatch(state, input, ctx) {\n\
          calls += 1; state.lengths.push(input.length);\n\
          ctx.publish('v', 'k', { calls, state });\n\
        }\n";
    let module = GuestModule::new(&engine, source).unwrap();
    let limits = Limits::default();
    assert!(engine.image(module.fingerprint(), b"one").is_none());
    let mut by_init = GuestInstance::new(&module, "a", &limits, b"one", None)
        .await
        .unwrap();
    assert!(engine.image(module.fingerprint(), b"one").is_some());
    let mut by_image = GuestInstance::new(&module, "a", &limits, b"one", None)
        .await
        .unwrap();
    assert!(by_init.memory_bytes() == by_image.memory_bytes());
    for input in [&b"first"[..], b"", b"a third batch"] {
        let a = by_init.on_batch(input, 7).await.unwrap();
        let b = by_image.on_batch(input, 7).await.unwrap();
        assert_eq!(a.events[0].payload, b.events[0].payload);
        assert_eq!(
            by_init.save().await.unwrap(),
            by_image.save().await.unwrap()
        );
        assert!(by_init.memory_bytes() == by_image.memory_bytes());
    }
    // Another config is another image: the instance is what its own init makes.
    let mut other = GuestInstance::new(&module, "a", &limits, b"two", None)
        .await
        .unwrap();
    let batch = other.on_batch(b"x", 7).await.unwrap();
    assert!(
        String::from_utf8_lossy(&batch.events[0].payload).contains("\"config\":\"two\""),
        "{:?}",
        batch.events[0].payload
    );
}
