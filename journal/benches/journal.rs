//! Journal benchmarks: `cargo bench -p viewtape-journal`.
//!
//! Figures and the machine are recorded in BENCHMARKS.md.

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use viewtape_journal::{Cursor, EventJournal, JournalConfig, ViewOffset};

const FRAME_LEN: usize = 100;

fn frame() -> Arc<Bytes> {
    Arc::new(Bytes::from(vec![b'x'; FRAME_LEN]))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime")
}

fn filled(records: usize) -> EventJournal {
    let journal = EventJournal::new(JournalConfig {
        max_records_per_view: records,
        max_bytes_per_view: usize::MAX,
        ..JournalConfig::default()
    });
    let frame = frame();
    runtime().block_on(async {
        for _ in 0..records {
            journal
                .append_with("prices", "ACME", |_| Ok::<_, ()>(frame.clone()))
                .await
                .expect("append");
        }
    });
    journal
}

fn append(c: &mut Criterion) {
    let mut group = c.benchmark_group("append");
    group.throughput(Throughput::Elements(1));
    let rt = runtime();
    let frame = frame();

    // The bound the issue compares against: a bare locked deque push,
    // recycling memory at the same retention bound.
    let bare: Mutex<VecDeque<Arc<Bytes>>> = Mutex::new(VecDeque::with_capacity(100_001));
    group.bench_function("bare_mutex_vecdeque_push", |b| {
        b.iter(|| {
            let mut deque = bare.lock().expect("lock");
            deque.push_back(frame.clone());
            if deque.len() > 100_000 {
                deque.pop_front();
            }
        })
    });

    // Steady state: the view is at its 100,000-record bound, so each append
    // also prunes one record, as in production.
    let journal = filled(100_000);
    group.bench_function("append_with_one_view", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let appended = journal
                        .append_with("prices", "ACME", |_| Ok::<_, ()>(frame.clone()))
                        .await;
                    black_box(appended.ok());
                }
                start.elapsed()
            })
        })
    });

    // 64 views, two threads appending to their own 32 views each.
    let journal = Arc::new(filled(0));
    let views: Vec<String> = (0..64).map(|i| format!("view-{i}")).collect();
    group.bench_function("append_with_64_views_2_threads", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            std::thread::scope(|s| {
                for half in views.chunks(32) {
                    let journal = &journal;
                    let frame = &frame;
                    s.spawn(move || {
                        for i in 0..iters / 2 {
                            let view = &half[i as usize % half.len()];
                            let appended = journal
                                .append_with_cursor(view, "ACME", |_| Ok::<_, ()>(frame.clone()));
                            black_box(appended.ok());
                        }
                    });
                }
            });
            start.elapsed()
        })
    });
    group.finish();
}

fn replay(c: &mut Criterion) {
    let rt = runtime();
    let journal = filled(100_000);
    let epoch = rt.block_on(journal.epoch());
    let cursor = Cursor::new(epoch, ViewOffset::new(45_000));
    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(10_000));
    // A subscriber's page: 10,000 frames from the middle of the view.
    group.bench_function("frames_after_10k_of_100k", |b| {
        b.iter(|| {
            let frames = journal
                .frames_after("prices", &cursor, 10_000)
                .expect("replay");
            assert_eq!(frames.len(), 10_000);
            black_box(frames)
        })
    });
    group.finish();

    // replay_after returns everything after the cursor: put the cursor
    // 10,000 records before the head of a 100,000-record view.
    let cursor = Cursor::new(epoch, ViewOffset::new(90_000));
    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(10_000));
    group.bench_function("replay_after_last_10k_of_100k", |b| {
        b.iter(|| {
            let records = rt
                .block_on(journal.replay_after("prices", Some(&cursor)))
                .expect("replay");
            assert_eq!(records.len(), 10_000);
            black_box(records)
        })
    });
    group.finish();
}

fn snapshot(c: &mut Criterion) {
    let rt = runtime();
    let journal = filled(1_000_000);
    let mut group = c.benchmark_group("snapshot");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Elements(1_000_000));
    group.bench_function("dump_1m", |b| {
        b.iter(|| black_box(rt.block_on(journal.dump())))
    });
    let dump = rt.block_on(journal.dump());
    let target = filled(1_000_000);
    group.bench_function("hydrate_exact_1m", |b| {
        b.iter_batched(
            || dump.clone(),
            |dump| rt.block_on(target.hydrate(dump, true)),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, append, replay, snapshot);
criterion_main!(benches);
