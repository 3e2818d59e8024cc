//! Runtime benchmarks. `cargo bench -p viewtape-server --bench runtimes`.
//!
//! - `ticker_end_to_end`: 100-byte NDJSON ticks, batches of 1,000, through `RuntimeHandle`
//!   (queue, guest parse + publish, save, decode, journal append with an SSE frame); and the
//!   guest alone (`GuestInstance::on_batch`) on the durable benchmark's 45-byte ticks.
//! - `publish_path`: the same path with a guest that does almost no parsing (`misbehave`'s
//!   `publish` command), to isolate the cost per published event.
//! - `instantiate`: `GuestInstance::new` from the `InstancePre` (Store, instance, `init` call),
//!   pooling vs on-demand.
//! - `validation`: what checking a typed view's values costs per event — the ticker's declared
//!   schema against its published ticks (parse to a JSON value, then validate), beside the
//!   parse alone.
//! - `output_design`: one host call per event vs one buffer per batch, 1,000 events of 90 bytes,
//!   with hand-written WAT guests so only the boundary and the copying differ.
//! - `ticker_guest`: the JS ticker beside the Rust ticker on the same batches (batch + save).
//! - `js_runtime`: a JavaScript runtime's start (instantiate, evaluate the source, restore the
//!   state the JS ticker saved after a batch) and a deploy of a new JS build (check its source,
//!   then start it from that state through its `migrate`); and, printed, the resident memory
//!   one more JS instance takes.

use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use viewtape_journal::{EventJournal, JournalConfig};
use viewtape_server::{
    decode_output, guests, EngineConfig, GuestBatch, GuestEngine, GuestInstance, GuestModule,
    Limits,
};
use viewtape_server::{BatchSink, RuntimeConfig, RuntimeHandle};
use viewtape_server::{ViewSchema, ViewSchemas, Violation};

const BATCH: usize = 1000;

/// Appends each event to its journal with an SSE frame built from its offset.
struct JournalSink {
    journal: Arc<EventJournal>,
}

impl BatchSink for JournalSink {
    async fn commit(&self, _runtime: &str, batch: GuestBatch, _at_ms: u64) {
        let journal = &self.journal;
        let epoch = journal.epoch().await.to_string();
        for e in batch.events {
            let _ = journal
                .append_with(&e.view, &e.key, |offset| {
                    let mut f = BytesMut::with_capacity(e.payload.len() + 64);
                    f.put_slice(b"id: ");
                    f.put_slice(epoch.as_bytes());
                    let _ = write!(f, "-{offset}");
                    f.put_slice(b"\nevent: update\ndata: ");
                    f.put_slice(&e.payload);
                    f.put_slice(b"\n\n");
                    Ok::<_, ()>(Arc::new(f.freeze()))
                })
                .await;
        }
    }

    /// Keeps no state: the benchmarks deploy nothing.
    fn misfit(&self, _view: &str, _schema: &ViewSchema) -> Option<Violation> {
        None
    }
}

/// 1,000 ticks of ~100 bytes each, seq continuing from `first_seq`.
fn ticks(first_seq: u64) -> Bytes {
    let mut out = String::with_capacity(BATCH * 101);
    for i in 0..BATCH as u64 {
        let seq = first_seq + i;
        let line = format!(
            "{{\"symbol\":\"SYM{:04}\",\"price\":{}.{:04},\"seq\":{seq},\"venue\":\"XNAS\",\"note\":\"",
            seq % 100,
            100 + seq % 900,
            seq % 10_000
        );
        out.push_str(&line);
        out.push_str(&"x".repeat(99usize.saturating_sub(line.len() + 2)));
        out.push_str("\"}\n");
    }
    Bytes::from(out)
}

/// 1,000 ticks as the durable benchmark sends them, seq continuing from `first_seq`.
fn short_ticks(first_seq: u64) -> Bytes {
    let mut out = String::with_capacity(BATCH * 48);
    for seq in first_seq..first_seq + BATCH as u64 {
        let price = (seq % 10_000) as f64 / 4.0 + 1.0;
        let _ = writeln!(out, "{{\"symbol\":\"P3\",\"price\":{price},\"seq\":{seq}}}");
    }
    Bytes::from(out)
}

/// Runs `run` on `iters` fresh batches from `make` (ticks continuing from `seq`), timing only
/// `run`.
fn timed(
    iters: u64,
    seq: &mut u64,
    make: fn(u64) -> Bytes,
    mut run: impl FnMut(Bytes),
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let input = make(*seq);
        *seq += BATCH as u64;
        let start = Instant::now();
        run(input);
        total += start.elapsed();
    }
    total
}

/// A guest instance for the benchmarks: default limits, no state.
fn bench_instance(rt: &tokio::runtime::Runtime, module: &GuestModule) -> GuestInstance {
    rt.block_on(GuestInstance::new(
        module,
        "bench",
        &Limits::default(),
        b"",
        None,
    ))
    .expect("instance")
}

fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn ticker_end_to_end(c: &mut Criterion) {
    let rt = tokio_rt();
    let engine = GuestEngine::new(EngineConfig::default()).expect("engine");
    let module = GuestModule::new(&engine, guests::TICKER_WASM).expect("ticker");
    let journal = Arc::new(EventJournal::new(JournalConfig::default()));
    let handle = rt
        .block_on(RuntimeHandle::spawn(
            module.clone(),
            RuntimeConfig::new("ticker", ["prices"]),
            None,
            Arc::clone(&journal),
            Arc::new(JournalSink { journal }),
            Arc::default(),
        ))
        .expect("spawn");
    let sample = ticks(1);
    eprintln!("ticker line: {} bytes", sample.len() / BATCH);
    let mut seq = 1;
    let mut g = c.benchmark_group("ticker_end_to_end");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("batch_1000x100B", |b| {
        b.iter_custom(|iters| {
            timed(iters, &mut seq, ticks, |input| {
                let summary = rt.block_on(handle.ingest(input, None)).expect("ingest");
                debug_assert_eq!(summary.receipt.events.get("prices"), Some(&(BATCH as u64)));
            })
        })
    });
    // The guest alone on the durable bench's ticks (`{"symbol":"P3","price":…,"seq":…}`, ~45
    // bytes, already normalized): parse, check `seq`, write the payload, hand the buffer over.
    let mut instance = bench_instance(&rt, &module);
    let mut seq = 1;
    g.bench_function("guest_only_1000x45B", |b| {
        b.iter_custom(|iters| {
            timed(iters, &mut seq, short_ticks, |input| {
                let batch = rt.block_on(instance.on_batch(&input, 0)).expect("batch");
                debug_assert_eq!(batch.events.len(), BATCH);
            })
        })
    });
    g.finish();
}

fn publish_path(c: &mut Criterion) {
    let rt = tokio_rt();
    let engine = GuestEngine::new(EngineConfig::default()).expect("engine");
    let module = GuestModule::new(&engine, guests::MISBEHAVE_WASM).expect("misbehave");
    let mut input = String::new();
    for i in 0..BATCH {
        input.push_str(&format!(
            "publish prices SYM{:04} {}\n",
            i % 100,
            "p".repeat(90)
        ));
    }
    let input = Bytes::from(input);
    let mut g = c.benchmark_group("publish_path");
    g.throughput(Throughput::Elements(BATCH as u64));

    let mut instance = bench_instance(&rt, &module);
    g.bench_function("guest_and_decode", |b| {
        b.iter(|| rt.block_on(instance.on_batch(&input, 0)).expect("batch"))
    });

    let journal = Arc::new(EventJournal::new(JournalConfig::default()));
    let handle = rt
        .block_on(RuntimeHandle::spawn(
            module,
            RuntimeConfig::new("bench", ["prices"]),
            None,
            Arc::clone(&journal),
            Arc::new(JournalSink { journal }),
            Arc::default(),
        ))
        .expect("spawn");
    g.bench_function("end_to_end_into_journal", |b| {
        b.iter(|| {
            rt.block_on(handle.ingest(input.clone(), None))
                .expect("ingest")
        })
    });
    g.finish();
}

/// The ticker's schema, as its `init` declares it, over the payloads it publishes for `ticks`.
fn validation(c: &mut Criterion) {
    let rt = tokio_rt();
    let engine = GuestEngine::new(EngineConfig::default()).expect("engine");
    let module = GuestModule::new(&engine, guests::TICKER_WASM).expect("ticker");
    let (schemas, payloads) = rt.block_on(async {
        let mut instance = GuestInstance::new(&module, "bench", &Limits::default(), b"", None)
            .await
            .expect("instance");
        let schemas = ViewSchemas::declared(instance.declaration(), &Default::default(), None)
            .expect("the ticker's declaration");
        let batch = instance.on_batch(&ticks(1), 0).await.expect("batch");
        let payloads: Vec<Bytes> = batch.events.into_iter().map(|e| e.payload).collect();
        (schemas, payloads)
    });
    let schema = schemas.get("prices").expect("prices is typed");
    eprintln!("ticker payload: {} bytes", payloads[0].len());
    let mut g = c.benchmark_group("validation");
    g.throughput(Throughput::Elements(payloads.len() as u64));
    g.bench_function("ticker_check_1000", |b| {
        b.iter(|| {
            for payload in &payloads {
                schema.check("prices", "k", payload).expect("fits");
            }
        })
    });
    g.bench_function("ticker_parse_only_1000", |b| {
        b.iter(|| {
            for payload in &payloads {
                black_box(serde_json::from_slice::<serde_json::Value>(payload).expect("JSON"));
            }
        })
    });
    g.finish();
}

fn instantiate(c: &mut Criterion) {
    let rt = tokio_rt();
    let mut g = c.benchmark_group("instantiate");
    for (name, slots) in [("pooling", 64), ("on_demand", 0)] {
        let engine = GuestEngine::new(EngineConfig {
            pooled_instances: slots,
            ..EngineConfig::default()
        })
        .expect("engine");
        let module = GuestModule::new(&engine, guests::TICKER_WASM).expect("ticker");
        let limits = Limits::default();
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let i = GuestInstance::new(&module, "bench", &limits, b"", None)
                            .await
                            .expect("instance");
                        drop(black_box(i));
                    }
                    start.elapsed()
                })
            })
        });
    }
    g.finish();
}

/// One host call per event vs one buffer per batch, measured with raw wasmtime and WAT guests
/// whose memory already holds the data, so only the boundary, the copies and the decode differ.
fn output_design(c: &mut Criterion) {
    use wasmtime::{Caller, Engine, Linker, Module, Store};

    struct Staged {
        memory: Option<wasmtime::Memory>,
        events: Vec<(Arc<str>, String, Bytes)>,
        view: Arc<str>,
        reply: Option<Bytes>,
    }
    let engine = Engine::default();
    let per_event_wat = format!(
        r#"(module
            (import "viewtape" "publish" (func $p (param i32 i32 i32 i32 i32 i32)))
            (memory (export "memory") 2)
            (func (export "run") (local $i i32)
              (loop $l
                (call $p (i32.const 0) (i32.const 6) (i32.const 8) (i32.const 7) (i32.const 16) (i32.const 90))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br_if $l (i32.lt_u (local.get $i) (i32.const {BATCH})))))
            (data (i32.const 0) "prices\00\00SYM0042\00"))"#
    );
    let mut linker = Linker::<Staged>::new(&engine);
    linker
        .func_wrap(
            "viewtape",
            "publish",
            |mut caller: Caller<'_, Staged>,
             vp: i32,
             vl: i32,
             kp: i32,
             kl: i32,
             pp: i32,
             pl: i32| {
                // The `Memory` is cached in the store data, as the real host does.
                let Some(mem) = caller.data().memory else {
                    return;
                };
                let (data, st) = mem.data_and_store_mut(&mut caller);
                let view = &data[vp as usize..(vp + vl) as usize];
                let view = if st.view.as_bytes() == view {
                    Arc::clone(&st.view)
                } else {
                    Arc::from(String::from_utf8_lossy(view).as_ref())
                };
                let key =
                    String::from_utf8_lossy(&data[kp as usize..(kp + kl) as usize]).into_owned();
                let payload = Bytes::copy_from_slice(&data[pp as usize..(pp + pl) as usize]);
                st.events.push((view, key, payload));
            },
        )
        .expect("publish");
    linker
        .func_wrap(
            "viewtape",
            "reply",
            |mut caller: Caller<'_, Staged>, p: i32, l: i32| {
                let Some(mem) = caller.data().memory else {
                    return;
                };
                let (data, st) = mem.data_and_store_mut(&mut caller);
                st.reply = Some(Bytes::copy_from_slice(&data[p as usize..(p + l) as usize]));
            },
        )
        .expect("reply");
    // The batch buffer, laid out as ABI.md says.
    let mut buf = Vec::new();
    for _ in 0..BATCH {
        buf.extend_from_slice(&[viewtape_guest::abi::TAG_UPDATE]);
        for field in [&b"prices"[..], b"SYM0042", &[b'p'; 90]] {
            buf.extend_from_slice(&(field.len() as u32).to_le_bytes());
            buf.extend_from_slice(field);
        }
    }
    let per_batch_wat = format!(
        r#"(module
            (import "viewtape" "reply" (func $r (param i32 i32)))
            (memory (export "memory") 4)
            (func (export "run") (call $r (i32.const 0) (i32.const {}))))"#,
        buf.len()
    );
    let staged = || Staged {
        memory: None,
        events: Vec::with_capacity(BATCH),
        view: Arc::from("prices"),
        reply: None,
    };
    let mut g = c.benchmark_group("output_design");
    g.throughput(Throughput::Elements(BATCH as u64));

    let module =
        Module::new(&engine, wat::parse_str(&per_event_wat).expect("wat")).expect("module");
    let mut store = Store::new(&engine, staged());
    let instance = linker.instantiate(&mut store, &module).expect("instance");
    store.data_mut().memory = instance.get_memory(&mut store, "memory");
    let run = instance
        .get_typed_func::<(), ()>(&mut store, "run")
        .expect("run");
    run.call(&mut store, ()).expect("run");
    assert_eq!(
        store.data().events.len(),
        BATCH,
        "the per-event path must really stage"
    );
    g.bench_function("host_call_per_event", |b| {
        b.iter(|| {
            store.data_mut().events.clear();
            run.call(&mut store, ()).expect("run");
            black_box(store.data().events.len())
        })
    });

    let module =
        Module::new(&engine, wat::parse_str(&per_batch_wat).expect("wat")).expect("module");
    let mut store = Store::new(&engine, staged());
    let instance = linker.instantiate(&mut store, &module).expect("instance");
    let memory = instance.get_memory(&mut store, "memory").expect("memory");
    store.data_mut().memory = Some(memory);
    memory.write(&mut store, 0, &buf).expect("write");
    let run = instance
        .get_typed_func::<(), ()>(&mut store, "run")
        .expect("run");
    let sample = Bytes::from(buf.clone());
    assert_eq!(
        decode_output(sample.clone(), 1 << 20)
            .expect("decode")
            .events
            .len(),
        BATCH
    );
    g.bench_function("decode_only", |b| {
        b.iter(|| {
            black_box(
                decode_output(sample.clone(), 1 << 20)
                    .expect("decode")
                    .events
                    .len(),
            )
        })
    });
    g.bench_function("one_buffer_per_batch", |b| {
        b.iter(|| {
            run.call(&mut store, ()).expect("run");
            let reply = store.data_mut().reply.take().expect("reply");
            black_box(decode_output(reply, 1 << 20).expect("decode").events.len())
        })
    });
    g.finish();
}

/// The demo ticker as a Rust guest (`guests::TICKER_WASM`) and in JavaScript
/// (`examples/js/ticker.js`, on the embedded QuickJS engine): 1,000 ticks a batch through the
/// host, as a runtime commits them (the batch, its output decoded, then `save`), no journal.
fn ticker_guest(c: &mut Criterion) {
    let rt = tokio_rt();
    let engine = GuestEngine::new(EngineConfig::default()).expect("engine");
    let js = js_ticker();
    eprintln!("JS engine module: {} bytes", guests::JS_ENGINE_WASM.len());
    let mut g = c.benchmark_group("ticker_guest");
    g.throughput(Throughput::Elements(BATCH as u64));
    for (name, bytes) in [("rust", guests::TICKER_WASM.to_vec()), ("js", js)] {
        let module = GuestModule::new(&engine, &bytes).expect("module");
        let mut instance = bench_instance(&rt, &module);
        let mut seq = 1;
        g.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let input = ticks(seq);
                    seq += BATCH as u64;
                    input
                },
                |input| {
                    rt.block_on(async {
                        let batch = instance.on_batch(&input, 0).await.expect("batch");
                        assert_eq!(batch.events.len(), BATCH);
                        instance.save().await.expect("save")
                    })
                },
                criterion::BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

/// The JS ticker's source.
fn js_ticker() -> Vec<u8> {
    std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/js/ticker.js"
    ))
    .expect("examples/js/ticker.js")
}

/// Resident memory of this process, in bytes.
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|pages| pages.parse().ok())
        .expect("resident pages");
    pages * 4096
}

fn js_runtime(c: &mut Criterion) {
    let rt = tokio_rt();
    // The compiled JS engine comes from the code cache, as in a server that ran JS before.
    let engine = GuestEngine::new(EngineConfig {
        cache_dir: viewtape_server::cache_dir(viewtape_server::user_cache_dir),
        ..EngineConfig::default()
    })
    .expect("engine");
    let source = js_ticker();
    let module = GuestModule::new(&engine, &source).expect("the JS ticker");
    let limits = Limits::default();
    let mut first = bench_instance(&rt, &module);
    let saved = rt.block_on(async {
        first.on_batch(&ticks(1), 0).await.expect("batch");
        first.save().await.expect("save")
    });
    drop(first);
    // A JS runtime started from the state the ticker saved.
    let restore = |module: &GuestModule| {
        rt.block_on(GuestInstance::new(
            module,
            "bench",
            &limits,
            b"",
            Some(&saved),
        ))
        .expect("restore")
    };
    let mut g = c.benchmark_group("js_runtime");
    g.bench_function("start", |b| b.iter(|| restore(&module)));
    let mut build = 0u64;
    g.bench_function("deploy", |b| {
        b.iter(|| {
            // Another build each time: a new source, checked and started from the state.
            build += 1;
            let mut next = source.clone();
            next.extend_from_slice(
                format!("\nexport function migrate(old) {{ return old; }}\n// build {build}\n")
                    .as_bytes(),
            );
            let module = GuestModule::new(&engine, &next).expect("the new build");
            restore(&module)
        })
    });
    g.finish();

    const INSTANCES: u64 = 32;
    let before = resident_bytes();
    let instances: Vec<GuestInstance> = (0..INSTANCES).map(|_| restore(&module)).collect();
    let per_instance = resident_bytes().saturating_sub(before) / INSTANCES;
    eprintln!(
        "js_runtime/memory: {per_instance} bytes resident per JS ticker instance ({INSTANCES} instances, restored after one batch)"
    );
    drop(black_box(instances));
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = ticker_end_to_end, publish_path, validation, instantiate, output_design, ticker_guest, js_runtime
}
criterion_main!(benches);
