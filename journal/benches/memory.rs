//! Memory held per retained record beyond its frame bytes:
//! `cargo bench -p viewtape-journal --bench memory`.
//!
//! A counting global allocator measures live heap bytes before and after
//! appending 1,000,000 records of 100-byte frames with short keys.

use std::alloc::System;
use std::sync::Arc;

use bytes::Bytes;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use viewtape_journal::{EventJournal, JournalConfig};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Heap bytes allocated and not freed since `region` began.
fn live_bytes(region: &Region<'_, System>) -> isize {
    let change = region.change();
    change.bytes_allocated as isize - change.bytes_deallocated as isize
}

const RECORDS: usize = 1_000_000;
const FRAME_LEN: usize = 100;

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let journal = EventJournal::new(JournalConfig {
        max_records_per_view: RECORDS,
        max_bytes_per_view: usize::MAX,
        ..JournalConfig::default()
    });
    let keys = ["ACME", "GLOBEX", "INITECH", "UMBRELLA", "HOOLI"];
    // Build the frames first so the measurement isolates what the journal
    // adds: the frame allocation (the `Arc<Bytes>` box and its bytes) is the
    // caller's, shared with every subscriber.
    let frames: Vec<Arc<Bytes>> = (0..RECORDS)
        .map(|_| Arc::new(Bytes::from(vec![b'x'; FRAME_LEN])))
        .collect();
    let arc_box = std::mem::size_of::<Bytes>() + 2 * std::mem::size_of::<usize>();
    let region = Region::new(ALLOCATOR);
    rt.block_on(async {
        for (i, frame) in frames.iter().enumerate() {
            journal
                .append_with("prices", keys[i % keys.len()], |_| {
                    Ok::<_, ()>(frame.clone())
                })
                .await
                .expect("append");
        }
    });
    let journal_bytes = live_bytes(&region);
    let per_record = journal_bytes as f64 / RECORDS as f64;
    println!("records: {RECORDS}, frame: {FRAME_LEN} B");
    println!("journal-owned heap per record (slot + key + deque slack): {per_record:.1} B");
    println!(
        "including the frame's Arc<Bytes> box ({arc_box} B, built by the caller): {:.1} B",
        per_record + arc_box as f64
    );
    drop(frames);
    assert_eq!(rt.block_on(journal.entry_counts())[0].1, RECORDS as u64);
}
