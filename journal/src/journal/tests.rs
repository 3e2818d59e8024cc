use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::clock::Clock;
use crate::config::JournalConfig;
use crate::cursor::Cursor;
use crate::error::ReplayError;
use crate::offset::ViewOffset;
use crate::ManualClock;

pub(super) fn frame(text: &str) -> Arc<Bytes> {
    Arc::new(Bytes::copy_from_slice(text.as_bytes()))
}

pub(super) fn journal_with(config: JournalConfig) -> (EventJournal, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    (EventJournal::with_clock(config, clock.clone()), clock)
}

#[tokio::test]
async fn a_record_appended_with_its_original_time_keeps_its_age() {
    let config = JournalConfig {
        max_age: Duration::from_secs(60),
        ..JournalConfig::default()
    };
    let (journal, clock) = journal_with(config);
    let now = clock.unix_ms();
    let append_at = |key: &str, at: u64| {
        journal
            .append_at("a", key, at, |c| Ok::<_, ()>(frame(&c.to_string())))
            .unwrap()
            .map(|(cursor, _)| cursor.offset().get())
    };
    assert_eq!(append_at("old", now - 90_000), Some(1));
    assert_eq!(
        journal.window("a").await.first.get(),
        2,
        "older than max_age: pruned"
    );
    assert_eq!(append_at("recent", now - 50_000), Some(2));
    assert_eq!(append_at("future", now + 5_000), Some(3));
    clock.advance(Duration::from_secs(15));
    let window = journal.window("a").await;
    assert_eq!(
        (window.first.get(), window.next.get()),
        (3, 4),
        "50 s + 15 s is past 60 s"
    );
}

pub(super) async fn append(journal: &EventJournal, view: &str, key: &str) -> Option<u64> {
    journal
        .append_with(view, key, |offset| {
            Ok::<_, ()>(frame(&format!("{view}:{offset}")))
        })
        .await
        .unwrap()
        .map(|(offset, _)| offset.get())
}

#[tokio::test]
async fn offsets_are_dense_per_view_and_frames_embed_them() {
    let (journal, _) = journal_with(JournalConfig::default());
    for expected in 1..=3 {
        assert_eq!(append(&journal, "a", "k").await, Some(expected));
    }
    assert_eq!(append(&journal, "b", "k").await, Some(1));
    let records = journal.replay_after("a", None).await.unwrap();
    let offsets: Vec<u64> = records.iter().map(|r| r.offset.get()).collect();
    assert_eq!(offsets, [1, 2, 3]);
    assert_eq!(&records[1].frame[..], b"a:2");
    assert_eq!(records[1].key, "k");
}

#[tokio::test]
async fn a_failing_builder_consumes_no_offset() {
    let (journal, _) = journal_with(JournalConfig::default());
    let failed = journal
        .append_with("a", "k", |_| Err::<Arc<Bytes>, _>("boom"))
        .await;
    assert_eq!(failed, Err("boom"));
    assert_eq!(append(&journal, "a", "k").await, Some(1));
    assert_eq!(journal.stats().appends, 1);
}

#[tokio::test]
async fn append_with_cursor_hands_the_builder_the_epoch() {
    let (journal, _) = journal_with(JournalConfig::default());
    let epoch = journal.epoch().await;
    let (cursor, built) = journal
        .append_with_cursor("a", "k", |cursor| Ok::<_, ()>(frame(&cursor.to_string())))
        .unwrap()
        .unwrap();
    assert_eq!(cursor, Cursor::new(epoch, ViewOffset::new(1)));
    assert_eq!(&built[..], format!("{epoch}-1").as_bytes());
}

#[tokio::test]
async fn replay_after_the_cursor_and_at_the_head() {
    let (journal, _) = journal_with(JournalConfig::default());
    for _ in 0..5 {
        append(&journal, "a", "k").await;
    }
    let epoch = journal.epoch().await;
    let after_two = journal
        .replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(2))))
        .await
        .unwrap();
    assert_eq!(
        after_two.iter().map(|r| r.offset.get()).collect::<Vec<_>>(),
        [3, 4, 5]
    );
    assert!(journal
        .replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(5))))
        .await
        .unwrap()
        .is_empty());
    assert!(
        journal
            .replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(0))))
            .await
            .unwrap()
            .len()
            == 5
    );
    assert_eq!(
        journal
            .replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(6))))
            .await,
        Err(ReplayError::Ahead {
            cursor: ViewOffset::new(6),
            next: ViewOffset::new(6)
        })
    );
    let other = JournalEpoch::random_other_than(epoch);
    assert_eq!(
        journal
            .replay_after("a", Some(&Cursor::new(other, ViewOffset::new(1))))
            .await,
        Err(ReplayError::StaleEpoch {
            cursor: other,
            current: epoch
        })
    );
    // An unknown view is an empty view.
    assert!(journal
        .replay_after("nobody", Some(&Cursor::new(epoch, ViewOffset::new(0))))
        .await
        .unwrap()
        .is_empty());
    assert!(matches!(
        journal
            .replay_after("nobody", Some(&Cursor::new(epoch, ViewOffset::new(1))))
            .await,
        Err(ReplayError::Ahead { .. })
    ));
    let stats = journal.stats();
    assert_eq!(stats.replays_served, 4);
    assert_eq!(stats.replays_refused_ahead, 2);
    assert_eq!(stats.replays_refused_stale_epoch, 1);
}

#[tokio::test]
async fn frames_after_pages_through_the_tape() {
    let (journal, _) = journal_with(JournalConfig::default());
    for _ in 0..5 {
        append(&journal, "a", "k").await;
    }
    let epoch = journal.epoch().await;
    let page = journal
        .frames_after("a", &Cursor::new(epoch, ViewOffset::new(1)), 2)
        .unwrap();
    assert_eq!(
        page.iter().map(|f| &f[..]).collect::<Vec<_>>(),
        [b"a:2", b"a:3"]
    );
    assert!(journal
        .frames_after("a", &Cursor::new(epoch, ViewOffset::new(5)), 2)
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn frames_after_where_takes_some_keys_and_says_how_far_it_looked() {
    let (journal, _) = journal_with(JournalConfig::default());
    for key in ["x", "y", "x", "y", "y"] {
        append(&journal, "a", key).await;
    }
    let epoch = journal.epoch().await;
    let page = |after: u64, limit: usize| {
        let found = journal
            .frames_after_where(
                "a",
                &Cursor::new(epoch, ViewOffset::new(after)),
                limit,
                |k| k == "x",
            )
            .unwrap();
        let frames: Vec<(u64, Vec<u8>)> = found
            .frames
            .iter()
            .map(|(offset, frame)| (offset.get(), frame.to_vec()))
            .collect();
        (frames, found.through.map(ViewOffset::get))
    };
    assert_eq!(
        page(0, 10),
        (vec![(1, b"a:1".to_vec()), (3, b"a:3".to_vec())], Some(5))
    );
    assert_eq!(page(1, 2), (vec![(3, b"a:3".to_vec())], Some(3)));
    assert_eq!(page(3, 10), (vec![], Some(5)));
    assert_eq!(page(5, 10), (vec![], None));
    assert!(matches!(
        journal.frames_after_where("a", &Cursor::new(epoch, ViewOffset::new(9)), 1, |_| true),
        Err(ReplayError::Ahead { .. })
    ));
}

#[tokio::test]
async fn count_and_byte_bounds_prune_oldest_first() {
    let (journal, _) = journal_with(JournalConfig {
        max_records_per_view: 3,
        max_bytes_per_view: 12,
        ..JournalConfig::default()
    });
    for _ in 0..4 {
        append(&journal, "a", "k").await; // frames "a:1".."a:4": 3 bytes each
    }
    let window = journal.window("a").await;
    assert_eq!((window.first.get(), window.next.get()), (2, 5));
    assert_eq!(journal.stats().pruned_count, 1);
    let epoch = window.epoch;
    assert_eq!(
        journal
            .replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(0))))
            .await,
        Err(ReplayError::Expired {
            cursor: ViewOffset::new(0),
            first: ViewOffset::new(2)
        })
    );
    assert_eq!(
        journal
            .replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(1))))
            .await
            .unwrap()
            .len(),
        3
    );

    journal
        .append_with("a", "k", |_| Ok::<_, ()>(frame("0123456789")))
        .await
        .unwrap();
    // Four records again: the count bound drops "a:2" first; then
    // 3 + 3 + 10 > 12 makes the byte bound drop "a:3" and "a:4".
    assert_eq!(journal.entry_counts().await, [("a".to_owned(), 1)]);
    assert_eq!(journal.retained_bytes().await, [("a".to_owned(), 10)]);
    let stats = journal.stats();
    assert_eq!((stats.pruned_count, stats.pruned_bytes), (2, 2));
}

#[tokio::test]
async fn age_bound_holds_for_a_quiet_view() {
    let (journal, clock) = journal_with(JournalConfig {
        max_age: Duration::from_millis(1500),
        ..JournalConfig::default()
    });
    append(&journal, "a", "k").await;
    clock.advance(Duration::from_millis(1000));
    append(&journal, "a", "k").await;
    clock.advance(Duration::from_millis(500));
    assert_eq!(
        journal.window("a").await.first.get(),
        1,
        "exactly max_age old is kept"
    );
    clock.advance(Duration::from_millis(1));
    let window = journal.window("a").await;
    assert_eq!((window.first.get(), window.next.get()), (2, 3));
    clock.advance(Duration::from_millis(1000));
    let window = journal.window("a").await;
    assert_eq!((window.first.get(), window.next.get()), (3, 3));
    assert_eq!(journal.stats().pruned_age, 2);
    let epoch = window.epoch;
    assert!(journal
        .replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(2))))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        journal
            .replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(1))))
            .await,
        Err(ReplayError::Expired {
            cursor: ViewOffset::new(1),
            first: ViewOffset::new(3)
        })
    );
}

#[tokio::test]
async fn seal_stops_offsets_without_calling_the_builder() {
    let (journal, _) = journal_with(JournalConfig::default());
    append(&journal, "a", "k").await;
    journal.seal();
    journal.seal();
    let mut called = false;
    let result = journal
        .append_with("a", "k", |_| {
            called = true;
            Ok::<_, ()>(frame("x"))
        })
        .await;
    assert_eq!(result, Ok(None));
    assert!(!called);
    assert!(journal.window("a").await.sealed);
    assert_eq!(journal.replay_after("a", None).await.unwrap().len(), 1);
    assert_eq!(journal.stats().cursorless_after_seal, 1);
}

#[tokio::test]
async fn disabled_journal_keeps_nothing_and_refuses_replays() {
    let (journal, _) = journal_with(JournalConfig {
        enabled: false,
        ..JournalConfig::default()
    });
    assert!(!journal.is_enabled());
    assert_eq!(append(&journal, "a", "k").await, None);
    assert_eq!(
        journal.replay_after("a", None).await,
        Err(ReplayError::Disabled)
    );
    assert_eq!(journal.stats().cursorless_disabled, 1);
    assert!(journal.dump().await.epoch.is_none());
}
