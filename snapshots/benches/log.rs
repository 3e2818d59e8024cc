//! The log's group commit: durable appends per second with many concurrent appenders sharing
//! each `fdatasync`, and the cost of one append when it is alone; each with and without the
//! end-of-log watermark. `cargo bench -p
//! viewtape-snapshots --bench log`.

use std::sync::mpsc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use viewtape_snapshots::log::{Durability, LogDir, LogWriter, WriterOptions};

/// `appenders` threads each append `per_appender` records of `size` bytes, each waiting for its
/// record to be durable before the next (as a producer waits for its `200`).
fn run(writer: &LogWriter, appenders: usize, per_appender: usize, size: usize) {
    std::thread::scope(|scope| {
        for _ in 0..appenders {
            scope.spawn(|| {
                for _ in 0..per_appender {
                    let (tx, rx) = mpsc::channel();
                    writer.append(
                        vec![7u8; size],
                        Box::new(move |result| {
                            let _ = tx.send(result.is_ok());
                        }),
                    );
                    assert!(rx.recv().unwrap_or(false), "append failed");
                }
            });
        }
    });
}

fn group_commit(c: &mut Criterion) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let log = LogDir::create(tmp.path()).expect("log");
    let mut group = c.benchmark_group("log");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    // With and without the end-of-log watermark (one `pwrite` per group, no sync of its own).
    for (name, durability, watermark) in [
        ("fsync", Durability::Fsync, true),
        ("fsync-nowatermark", Durability::Fsync, false),
        ("os", Durability::Os, true),
        ("os-nowatermark", Durability::Os, false),
    ] {
        let options = WriterOptions {
            durability,
            watermark,
            ..WriterOptions::default()
        };
        let next = log.scan().expect("scan").next();
        let writer = LogWriter::start(&log, next, options, Box::new(|_| {})).expect("writer");
        for (appenders, size) in [(1, 100), (64, 100), (64, 100_000)] {
            let per = if appenders == 1 { 50 } else { 20 };
            group.throughput(Throughput::Elements((appenders * per) as u64));
            group.bench_function(format!("{name}/{appenders}_appenders_x{size}B"), |b| {
                b.iter(|| run(&writer, appenders, per, size));
            });
        }
    }
    group.finish();
}

criterion_group!(benches, group_commit);
criterion_main!(benches);
