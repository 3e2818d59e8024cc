//! View state: a new subscriber receives the state of 100,000 keys (time to
//! the `synced` marker), and the memory the state holds per key.
//! `cargo bench -p viewtape-server --bench state`.

use std::alloc::System;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures_util::StreamExt;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tokio::sync::watch;
use tower::ServiceExt;
use viewtape_journal::{EventJournal, JournalConfig};
use viewtape_server::BatchSink;
use viewtape_server::Hub;
use viewtape_server::ServerConfig;
use viewtape_server::{app, AppState};
use viewtape_server::{EventKind, GuestBatch, GuestEvent};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Heap bytes allocated and not freed since `region` began.
fn live_bytes(region: &Region<'_, System>) -> isize {
    let change = region.change();
    change.bytes_allocated as isize - change.bytes_deallocated as isize
}

const KEYS: usize = 100_000;

fn payload(i: usize) -> Bytes {
    Bytes::from(format!(
        "{{\"symbol\":\"SYM{i:06}\",\"price\":{}.25,\"seq\":{i}}}",
        i % 1000
    ))
}

async fn filled(journal: JournalConfig) -> Arc<Hub> {
    let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(journal))));
    hub.declare("prices");
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(1000) {
        let events = chunk
            .iter()
            .map(|&i| {
                GuestEvent::new(
                    Arc::from("prices"),
                    format!("SYM{i:06}"),
                    EventKind::Update,
                    payload(i),
                )
            })
            .collect();
        hub.commit(
            "bench",
            GuestBatch {
                events,
                gaps: vec![],
            },
            viewtape_server::unix_ms_now(),
        )
        .await;
    }
    hub
}

fn state_transfer(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let hub = rt.block_on(filled(JournalConfig::default()));
    let (_shutdown_tx, shutdown) = watch::channel(false);
    let config = ServerConfig {
        max_connections: 1000,
        ..ServerConfig::default()
    };
    let router = app(
        AppState::new(
            hub,
            Arc::default(),
            &viewtape_server::LogMetrics::default(),
            None,
            config,
            shutdown,
        ),
        None,
    );
    let mut group = c.benchmark_group("state");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Elements(KEYS as u64));
    group.bench_function("new_subscriber_100k_keys_to_synced", |b| {
        b.iter(|| {
            rt.block_on(async {
                let request = Request::get("/views/prices/events")
                    .body(Body::empty())
                    .expect("request");
                let response = router.clone().oneshot(request).await.expect("response");
                let mut body = response.into_body().into_data_stream();
                let mut bytes = 0usize;
                while let Some(chunk) = body.next().await {
                    let chunk = chunk.expect("chunk");
                    bytes += chunk.len();
                    if chunk.windows(13).any(|w| w == b"event: synced") {
                        return bytes;
                    }
                }
                panic!("stream ended before synced");
            })
        })
    });
    group.finish();
}

fn memory_per_key() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    // A journal that retains nothing: what remains is the state alone.
    let region = Region::new(ALLOCATOR);
    let hub = rt.block_on(filled(JournalConfig {
        max_records_per_view: 0,
        ..JournalConfig::default()
    }));
    let total = live_bytes(&region) as f64 / KEYS as f64;
    let frame = hub
        .view("prices")
        .expect("view")
        .cut(hub.journal(), &viewtape_server::Narrow::All)
        .entries[0]
        .bytes()
        .len();
    println!(
        "state memory per key: {total:.1} B in all, of which the shared update frame is {frame} B \
         (payload ~{} B); map entry and key: {:.1} B",
        payload(0).len(),
        total - frame as f64
    );
}

fn benches(c: &mut Criterion) {
    memory_per_key();
    state_transfer(c);
}

criterion_group!(group, benches);
criterion_main!(group);
