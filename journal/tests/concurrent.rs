//! Many tasks appending to one view at once get unique, dense offsets, and
//! each record's frame was built from the offset it took.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use viewtape_journal::{EventJournal, JournalConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_get_unique_dense_offsets() {
    const TASKS: u64 = 16;
    const PER_TASK: u64 = 2_000;
    let journal = Arc::new(EventJournal::new(JournalConfig {
        max_records_per_view: usize::MAX,
        max_bytes_per_view: usize::MAX,
        ..JournalConfig::default()
    }));
    let handles: Vec<_> = (0..TASKS)
        .map(|task| {
            let journal = Arc::clone(&journal);
            tokio::spawn(async move {
                let mut taken = Vec::with_capacity(PER_TASK as usize);
                for i in 0..PER_TASK {
                    let (offset, _) = journal
                        .append_with("shared", &format!("t{task}"), |offset| {
                            Ok::<_, ()>(Arc::new(Bytes::from(format!("{offset}:{task}:{i}"))))
                        })
                        .await
                        .unwrap()
                        .unwrap();
                    taken.push(offset.get());
                    if i % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                taken
            })
        })
        .collect();
    let mut all = BTreeSet::new();
    for handle in handles {
        for offset in handle.await.unwrap() {
            assert!(all.insert(offset), "offset {offset} issued twice");
        }
    }
    let expected: BTreeSet<u64> = (1..=TASKS * PER_TASK).collect();
    assert_eq!(all, expected, "offsets are dense");

    let records = journal.replay_after("shared", None).await.unwrap();
    assert_eq!(records.len() as u64, TASKS * PER_TASK);
    for (i, record) in records.iter().enumerate() {
        assert_eq!(
            record.offset.get(),
            i as u64 + 1,
            "replay is in offset order"
        );
        let text = std::str::from_utf8(&record.frame).unwrap();
        let (built_from, rest) = text.split_once(':').unwrap();
        assert_eq!(built_from.parse::<u64>().unwrap(), record.offset.get());
        assert_eq!(record.key, format!("t{}", rest.split(':').next().unwrap()));
    }
}

#[test]
fn threads_appending_to_many_views_keep_each_view_dense() {
    let journal = Arc::new(EventJournal::new(JournalConfig::default()));
    std::thread::scope(|s| {
        for t in 0..4 {
            let journal = &journal;
            s.spawn(move || {
                for i in 0..4_000 {
                    let view = format!("v{}", (i + t) % 8);
                    journal
                        .append_with_cursor(&view, "k", |c| {
                            Ok::<_, ()>(Arc::new(Bytes::from(c.to_string())))
                        })
                        .unwrap()
                        .unwrap();
                }
            });
        }
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let epoch = rt.block_on(journal.epoch());
    for view in 0..8 {
        let records = rt
            .block_on(journal.replay_after(&format!("v{view}"), None))
            .unwrap();
        assert_eq!(records.len(), 2_000);
        for (i, record) in records.iter().enumerate() {
            assert_eq!(record.offset.get(), i as u64 + 1);
            assert_eq!(
                &record.frame[..],
                format!("{epoch}-{}", record.offset).as_bytes()
            );
        }
    }
}
