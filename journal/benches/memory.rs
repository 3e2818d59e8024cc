//! Memory held per retained record beyond its frame bytes:
//! `cargo bench -p viewtape-journal --bench memory`.
//!
//! A counting global allocator measures live heap bytes before and after
//! appending 1,000,000 records of 100-byte frames with short keys.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use viewtape_journal::{EventJournal, JournalConfig};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call forwards to the system allocator with the caller's
// arguments unchanged; the counter is only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; `ptr` came from `alloc` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

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
    let before = LIVE.load(Ordering::Relaxed);
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
    let journal_bytes = LIVE.load(Ordering::Relaxed) - before;
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
