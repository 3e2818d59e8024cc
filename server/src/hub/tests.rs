//! The hub's tests.

use super::*;
use viewtape_journal::{JournalConfig, ViewOffset};

fn event(kind: EventKind, key: &str, payload: &str) -> GuestEvent {
    let payload = Bytes::copy_from_slice(payload.as_bytes());
    GuestEvent::new(Arc::from("prices"), key.to_owned(), kind, payload)
}

#[tokio::test]
async fn commit_appends_updates_state_and_wakes_once() {
    let hub = Hub::new(Arc::new(EventJournal::new(JournalConfig::default())));
    let view = hub.declare("prices");
    let mut ticks = view.ticks();
    let batch = GuestBatch {
        events: vec![
            event(EventKind::Update, "A", "1"),
            event(EventKind::Update, "B", "2"),
            event(EventKind::Delete, "A", ""),
        ],
        gaps: vec![],
    };
    hub.commit("demo", batch, crate::log::unix_ms_now()).await;
    assert!(ticks.has_changed().unwrap());
    assert_eq!(*ticks.borrow_and_update(), 1);
    let cut = view.cut(hub.journal(), &Narrow::All);
    assert_eq!(cut.cursor.offset(), ViewOffset::new(3));
    assert_eq!(cut.entries.len(), 1);
    assert_eq!(cut.entries[0].value_json().as_deref(), Some(&b"2"[..]));
    let narrowed = view.cut(hub.journal(), &Narrow::Keys(["A".to_owned()].into()));
    assert_eq!((narrowed.cursor, narrowed.entries.len()), (cut.cursor, 0));
}

#[tokio::test]
async fn a_key_set_again_in_a_run_ends_with_its_last_event() {
    let hub = Hub::new(Arc::new(EventJournal::new(JournalConfig::default())));
    let view = hub.declare("prices");
    let batch = GuestBatch::of_events(vec![
        event(EventKind::Update, "A", "1"),
        event(EventKind::Update, "A", "2"),
        event(EventKind::Delete, "B", ""),
        event(EventKind::Update, "B", "3"),
        event(EventKind::Update, "C", "4"),
        event(EventKind::Delete, "C", ""),
        event(EventKind::Update, "A", "5"),
    ]);
    hub.commit("demo", batch, crate::log::unix_ms_now()).await;
    let cut = view.cut(hub.journal(), &Narrow::All);
    assert_eq!(
        cut.cursor.offset(),
        ViewOffset::new(7),
        "every event is on the tape"
    );
    let mut state: Vec<(String, String)> = view
        .entries()
        .into_iter()
        .map(|(key, frame)| {
            let text = String::from_utf8(frame.bytes().to_vec()).unwrap();
            let id = text.lines().next().unwrap().rsplit('-').next().unwrap();
            (
                key.to_string(),
                format!("{id}={}", text.contains("\"value\":5")),
            )
        })
        .collect();
    state.sort();
    assert_eq!(
        state,
        [
            ("A".into(), "7=true".into()),
            ("B".into(), "4=false".into())
        ],
        "each key holds the frame of its last event; C's delete came last"
    );
}

#[tokio::test]
async fn a_long_batch_across_views_commits_in_order_run_by_run() {
    let hub = Hub::new(Arc::new(EventJournal::new(JournalConfig::default())));
    let on = |view: &str, i: usize| {
        let payload = Bytes::from(format!("{i}"));
        GuestEvent::new(
            Arc::from(view),
            format!("k{}", i % 10),
            EventKind::Update,
            payload,
        )
    };
    // Longer than a run, with another view's event in the middle.
    let n = PUBLISH_RUN * 2 + 7;
    let mut events: Vec<GuestEvent> = (0..n).map(|i| on("a", i)).collect();
    events.insert(PUBLISH_RUN + 3, on("b", 0));
    events.push(GuestEvent::new(
        Arc::from("a"),
        "k0".to_owned(),
        EventKind::Delete,
        Bytes::new(),
    ));
    hub.commit(
        "demo",
        GuestBatch::of_events(events),
        crate::log::unix_ms_now(),
    )
    .await;
    let journal = hub.journal();
    let epoch = journal.epoch().await;
    let a = journal.replay_after("a", None).await.unwrap();
    assert_eq!(a.len(), n + 1);
    for (i, record) in a.iter().enumerate() {
        assert_eq!(record.offset.get(), i as u64 + 1);
        let id = format!("id: {}\n", Cursor::new(epoch, record.offset));
        assert!(record.frame.starts_with(id.as_bytes()), "record {i}");
    }
    assert_eq!(journal.replay_after("b", None).await.unwrap().len(), 1);
    let view = hub.view("a").unwrap();
    let cut = view.cut(journal, &Narrow::All);
    assert_eq!(cut.cursor.offset().get(), n as u64 + 1);
    assert_eq!(cut.entries.len(), 9, "k0 was deleted last");
    let k9 = view
        .entries()
        .into_iter()
        .find(|(key, _)| key == "k9")
        .unwrap();
    let last_k9 = (0..n).filter(|i| i % 10 == 9).max().unwrap();
    assert_eq!(
        k9.1.value_json().as_deref(),
        Some(last_k9.to_string().as_bytes())
    );
    assert_eq!(hub.stats().published.load(Ordering::Relaxed), n as u64 + 2);
}

#[tokio::test]
async fn sealed_journal_publishes_cursorless_frames_live() {
    let hub = Hub::new(Arc::new(EventJournal::new(JournalConfig::default())));
    let view = hub.declare("prices");
    let mut live = view.live();
    hub.journal().seal();
    let batch = GuestBatch {
        events: vec![event(EventKind::Update, "A", "1")],
        gaps: vec![],
    };
    hub.commit("demo", batch, crate::log::unix_ms_now()).await;
    let (key, frame) = live.recv().await.unwrap();
    assert_eq!(key, "A");
    assert!(frame.starts_with(b"event: update\n"), "no id after seal");
    assert_eq!(view.keys(), 1);
    assert_eq!(hub.stats().cursorless.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_view_reads_made_is_forgotten_with_its_last_hold_and_a_commit_survives_the_race() {
    let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(
        JournalConfig::default(),
    ))));
    let first = hub.hold_on_demand("prices");
    let second = hub.hold_on_demand("prices");
    let made = Arc::clone(first.view());
    assert!(Arc::ptr_eq(&made, second.view()), "one view for both reads");
    assert!(!made.lasting());
    assert!(hub.dump_states().is_empty(), "not kept in snapshots");
    drop(first);
    assert!(hub.view("prices").is_some(), "another read holds it");
    drop(second);
    assert!(hub.view("prices").is_none(), "no read holds it: forgotten");

    // A commit that holds the forgotten view publishes to its successor.
    let batch = GuestBatch::of_events(vec![event(EventKind::Update, "A", "1")]);
    assert!(
        !hub.publish_run(&made, &batch.events, 1),
        "nothing goes to a forgotten view"
    );
    hub.commit("demo", batch, crate::log::unix_ms_now()).await;
    let view = hub.view("prices").expect("made again by the commit");
    assert_eq!(view.keys(), 1);
    assert_eq!(made.keys(), 0);

    // A view a read holds when the first event comes is the one the event goes to, and lasts.
    let held = hub.hold_on_demand("orders");
    let batch = GuestBatch::of_events(vec![GuestEvent::new(
        Arc::from("orders"),
        "A".to_owned(),
        EventKind::Update,
        Bytes::from_static(b"1"),
    )]);
    hub.commit("demo", batch, crate::log::unix_ms_now()).await;
    assert_eq!(held.view().keys(), 1, "the reader's view got the event");
    assert!(held.view().lasting());
    drop(held);
    assert!(hub.view("orders").is_some(), "published to: it stays");

    // Declared by a runtime while a read held it: it stays too, and is kept in snapshots.
    let held = hub.hold_on_demand("quotes");
    hub.declare("quotes");
    drop(held);
    assert!(hub.view("quotes").is_some());
    let dumped: Vec<String> = hub.dump_states().into_iter().map(|d| d.view).collect();
    assert_eq!(dumped, ["orders", "prices", "quotes"]);
}

#[tokio::test]
async fn a_retired_view_is_gone_and_its_old_cursors_reset() {
    let journal = Arc::new(EventJournal::new(JournalConfig::default()));
    let hub = Hub::new(Arc::clone(&journal));
    let view = hub.declare("prices");
    let mut ticks = view.ticks();
    let batch = GuestBatch::of_events(vec![event(EventKind::Update, "A", "1")]);
    hub.commit("demo", batch, crate::log::unix_ms_now()).await;
    let cursor = view.cut(&journal, &Narrow::All).cursor;
    ticks.borrow_and_update();

    hub.retire("prices", "its runtime was deleted", 0);
    assert_eq!(view.retired(), Some("its runtime was deleted"));
    assert!(ticks.has_changed().unwrap(), "its subscribers are woken");
    assert!(hub.view("prices").is_none());
    // Made again: offsets go on after the last one, and the old cursor is refused.
    let batch = GuestBatch::of_events(vec![event(EventKind::Update, "B", "2")]);
    hub.commit("demo", batch, crate::log::unix_ms_now()).await;
    let again = hub.view("prices").unwrap();
    assert_eq!(again.keys(), 1, "the old state is gone");
    assert!(again.retired().is_none());
    assert!(again.cut(&journal, &Narrow::All).cursor.offset() > cursor.offset());
    assert!(journal.replay_after("prices", Some(&cursor)).await.is_err());
}
