//! Snapshots in the server. `cargo bench -p viewtape-server --bench snapshot`.
//!
//! One view, 1,000,000 retained records of ~100-byte SSE frames (1,000 keys), published through
//! the hub's commit path like a runtime would:
//!
//! - `cut_1m`: what runs inside the consistency cut — `journal.dump()` plus
//!   `hub.dump_states()` (target ≤ 50 ms). The dump's drop happens after the cut is released
//!   in the server, so it is excluded here too.
//! - `encode_1m`: the `SnapshotBody` to file bytes (header, CRC-32C, MessagePack); throughput
//!   in file bytes (target ≥ 1 GB/s).
//! - `decode_hydrate_1m`: file bytes back to a `SnapshotBody` (checksums, decode) and
//!   `Hub::restore` into a fresh hub, exact (target ≥ 0.8 GB/s).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use viewtape_journal::{EventJournal, JournalConfig};
use viewtape_server::BatchSink;
use viewtape_server::Hub;
use viewtape_server::SnapshotBody;
use viewtape_server::{EventKind, GuestBatch, GuestEvent};
use viewtape_snapshots::SnapshotMeta;

const RECORDS: usize = 1_000_000;
const KEYS: usize = 1_000;
const BATCH: usize = 1_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn config() -> JournalConfig {
    JournalConfig {
        max_records_per_view: RECORDS,
        max_bytes_per_view: usize::MAX,
        max_age: Duration::from_secs(24 * 3600),
        ..JournalConfig::default()
    }
}

/// A hub whose journal retains `RECORDS` frames of about 100 bytes.
fn filled(rt: &tokio::runtime::Runtime) -> Hub {
    let hub = Hub::new(Arc::new(EventJournal::new(config())));
    let view: Arc<str> = Arc::from("prices");
    rt.block_on(async {
        for batch in 0..RECORDS / BATCH {
            let events = (0..BATCH)
                .map(|i| {
                    let n = batch * BATCH + i;
                    GuestEvent::new(
                        Arc::clone(&view),
                        format!("K{:04}", n % KEYS),
                        EventKind::Update,
                        Bytes::from(format!("{{\"p\":{:>10},\"q\":{:>6}}}", n, n % 977)),
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
    });
    hub
}

fn snapshot(c: &mut Criterion) {
    let rt = runtime();
    let hub = filled(&rt);
    let counts = hub.journal().entry_counts_now();
    let bytes: u64 = hub.journal().retained_bytes_now().iter().map(|v| v.1).sum();
    let records: u64 = counts.iter().map(|v| v.1).sum();
    assert_eq!(records, RECORDS as u64);
    eprintln!(
        "retained: {records} records, {bytes} frame bytes ({:.1} B/frame)",
        bytes as f64 / records as f64
    );

    let mut group = c.benchmark_group("snapshot");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));

    group.throughput(Throughput::Elements(RECORDS as u64));
    group.bench_function("cut_1m", |b| {
        b.iter_with_large_drop(|| {
            rt.block_on(async {
                let journal = hub.journal().dump().await;
                let views = hub.dump_states();
                black_box((journal, views))
            })
        })
    });

    let body = SnapshotBody {
        journal: rt.block_on(hub.journal().dump()),
        views: hub.dump_states(),
        runtimes: vec![],
        log_position: None,
        stream: None,
        passed_over: Default::default(),
        deleted: Default::default(),
    };
    let meta = SnapshotMeta::exact_now();
    let encoded = viewtape_snapshots::encode(&body, &meta).expect("encode");
    eprintln!("snapshot file: {} bytes", encoded.len());
    group.throughput(Throughput::Bytes(encoded.len() as u64));
    group.bench_function("encode_1m", |b| {
        b.iter_with_large_drop(|| {
            viewtape_snapshots::encode_with_capacity(&body, &meta, encoded.len()).expect("encode")
        })
    });
    drop(body);

    group.bench_function("decode_hydrate_1m", |b| {
        b.iter_with_large_drop(|| {
            let (_, body) = viewtape_snapshots::decode::<SnapshotBody>(&encoded).expect("decode");
            let restored = Hub::new(Arc::new(EventJournal::new(config())));
            rt.block_on(restored.restore(body.journal, true, body.views));
            restored
        })
    });
    group.finish();
}

criterion_group!(benches, snapshot);
criterion_main!(benches);
