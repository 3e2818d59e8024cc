//! Snapshot file throughput: encode and decode a body of 1,000,000 records with
//! 100-byte frames, reported in bytes of snapshot file per second.
//!
//! `serde_bytes_*` is the shape the server uses (frames as `bytes::Bytes`, keys as `String`).
//! `plain_vec_*` encodes frames as a plain `Vec<u8>` (an array of integers in MessagePack) on a
//! tenth of the records, to show why byte fields must use `Bytes` or `serde_bytes`.
//! `decode_borrowed` parses the same file into borrowed `&str`/`&[u8]` fields (no allocation).
//! Decoded bodies are dropped outside the timed section (`iter_with_large_drop`).

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use viewtape_snapshots::{decode, decode_borrowed, encode, verify, SnapshotMeta};

const RECORDS: usize = 1_000_000;
const FRAME_LEN: usize = 100;

#[derive(Serialize, Deserialize)]
struct Rec {
    offset: u64,
    key: String,
    frame: Bytes,
}

#[derive(Serialize, Deserialize)]
struct Body {
    epoch: String,
    records: Vec<Rec>,
}

/// The same records, borrowed from the file: parse cost without per-record allocation.
#[derive(Deserialize)]
#[allow(dead_code)]
struct BorrowedRec<'a> {
    offset: u64,
    key: &'a str,
    frame: &'a [u8],
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct BorrowedBody<'a> {
    epoch: &'a str,
    #[serde(borrow)]
    records: Vec<BorrowedRec<'a>>,
}

#[derive(Serialize, Deserialize)]
struct PlainRec {
    offset: u64,
    key: String,
    frame: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct PlainBody {
    epoch: String,
    records: Vec<PlainRec>,
}

fn frame(i: usize) -> Vec<u8> {
    (0..FRAME_LEN).map(|j| (i + j) as u8).collect()
}

fn body(n: usize) -> Body {
    Body {
        epoch: "3f9a2c1be07d4e55".into(),
        records: (0..n)
            .map(|i| Rec {
                offset: i as u64 + 1,
                key: format!("key-{}", i % 1000),
                frame: Bytes::from(frame(i)),
            })
            .collect(),
    }
}

fn plain_body(n: usize) -> PlainBody {
    PlainBody {
        epoch: "3f9a2c1be07d4e55".into(),
        records: (0..n)
            .map(|i| PlainRec {
                offset: i as u64 + 1,
                key: format!("key-{}", i % 1000),
                frame: frame(i),
            })
            .collect(),
    }
}

fn bench(c: &mut Criterion) {
    let meta = SnapshotMeta {
        exact: true,
        created_at_ms: 1,
        manual: false,
    };

    let body = body(RECORDS);
    let Ok(file) = encode(&body, &meta) else {
        panic!("encode failed");
    };
    let mut group = c.benchmark_group("snapshot_1m_x_100B");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8))
        .throughput(Throughput::Bytes(file.len() as u64));
    group.bench_function("encode_serde_bytes", |b| {
        b.iter_with_large_drop(|| encode(black_box(&body), &meta))
    });
    group.bench_function("verify_crc32c", |b| b.iter(|| verify(black_box(&file))));
    group.bench_function("decode_serde_bytes", |b| {
        b.iter_with_large_drop(|| decode::<Body>(black_box(&file)))
    });
    group.bench_function("decode_borrowed", |b| {
        b.iter_with_large_drop(|| decode_borrowed::<BorrowedBody>(black_box(&file)))
    });
    group.finish();
    drop(body);

    let plain = plain_body(RECORDS / 10);
    let Ok(plain_file) = encode(&plain, &meta) else {
        panic!("encode failed");
    };
    let mut group = c.benchmark_group("snapshot_100k_x_100B_plain_vec");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        // Same logical payload per record as above, so GB/s compare like for like.
        .throughput(Throughput::Bytes((file.len() / 10) as u64));
    group.bench_function("encode_plain_vec", |b| {
        b.iter_with_large_drop(|| encode(black_box(&plain), &meta))
    });
    group.bench_function("decode_plain_vec", |b| {
        b.iter_with_large_drop(|| decode::<PlainBody>(black_box(&plain_file)))
    });
    group.finish();
    eprintln!(
        "file size: {} bytes for {RECORDS} records; plain Vec<u8> file for {} records: {} bytes",
        file.len(),
        RECORDS / 10,
        plain_file.len()
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
