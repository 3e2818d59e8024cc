//! The runtime task's own tests, through its handle.
//!
//! One file past 500 lines: the runtime task's cases, each independent, over shared fixtures.

use std::sync::Mutex;
use std::time::Duration;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use viewtape_journal::{Cursor, EventJournal, JournalConfig, ReplayError, ViewOffset};

use super::*;
use crate::host::{guests, EngineConfig, GuestBatch, GuestEngine, GuestError, GuestModule, Limits};
use crate::source::FileTailConfig;
use crate::source::{FileTail, SourceCheckpoint};

/// Appends every event to its journal (frame = `key=payload`) and remembers them.
struct TestSink {
    journal: Arc<EventJournal>,
    events: Mutex<Vec<(String, String, String)>>,
}

impl TestSink {
    fn new(journal: &Arc<EventJournal>) -> Arc<Self> {
        Arc::new(Self {
            journal: Arc::clone(journal),
            events: Mutex::default(),
        })
    }
}

impl BatchSink for TestSink {
    async fn commit(&self, _runtime: &str, batch: GuestBatch, _at_ms: u64) {
        for e in batch.events {
            let frame = Arc::new(Bytes::from(format!(
                "{}={}",
                e.key,
                String::from_utf8_lossy(&e.payload)
            )));
            self.journal
                .append_with(&e.view, &e.key, |_| Ok::<_, ()>(frame))
                .await
                .unwrap();
            let payload = String::from_utf8_lossy(&e.payload).into_owned();
            self.events
                .lock()
                .unwrap()
                .push((e.view.to_string(), e.key.to_string(), payload));
        }
    }

    fn misfit(&self, view: &str, schema: &ViewSchema) -> Option<Violation> {
        let events = self.events.lock().unwrap();
        let mut latest = std::collections::BTreeMap::new();
        for (v, key, payload) in events.iter().filter(|(v, ..)| v == view) {
            latest.insert(key.clone(), (v.clone(), payload.clone()));
        }
        latest
            .iter()
            .find_map(|(key, (v, payload))| schema.check(v, key, payload.as_bytes()).err())
    }
}

fn engine() -> GuestEngine {
    GuestEngine::new(EngineConfig {
        pooled_instances: 8,
        ..EngineConfig::default()
    })
    .unwrap()
}

async fn spawn(wasm: &[u8], limits: Limits) -> (RuntimeHandle, Arc<EventJournal>, Arc<TestSink>) {
    let module = GuestModule::new(&engine(), wasm).unwrap();
    let journal = Arc::new(EventJournal::new(JournalConfig::default()));
    let sink = TestSink::new(&journal);
    let config = RuntimeConfig {
        limits,
        ..RuntimeConfig::new("t", ["v", "state", "prices"])
    };
    let handle = RuntimeHandle::spawn(
        module,
        config,
        None,
        Arc::clone(&journal),
        Arc::clone(&sink),
        Arc::default(),
    )
    .await
    .unwrap();
    (handle, journal, sink)
}

#[tokio::test]
async fn ticker_batch_commits_and_gap_reaches_the_journal() {
    let (rt, journal, sink) = spawn(guests::TICKER_WASM, Limits::default()).await;
    let summary = rt
        .ingest(Bytes::from_static(b"{\"symbol\":\"A\",\"price\":1,\"seq\":1}\n{\"symbol\":\"B\",\"price\":2,\"seq\":2}\n"), None)
        .await
        .unwrap();
    assert_eq!(summary.receipt.events.get("prices"), Some(&2));
    let before = Cursor::new(journal.epoch().await, ViewOffset::new(1));
    assert_eq!(
        journal
            .replay_after("prices", Some(&before))
            .await
            .unwrap()
            .len(),
        1
    );

    rt.ingest(
        Bytes::from_static(b"{\"symbol\":\"A\",\"price\":3,\"seq\":9}\n"),
        None,
    )
    .await
    .unwrap();
    assert!(matches!(
        journal.replay_after("prices", Some(&before)).await,
        Err(ReplayError::Gap { .. })
    ));
    assert_eq!(rt.stats().gaps.load(Ordering::Relaxed), 1);
    assert_eq!(sink.events.lock().unwrap().len(), 3);
    assert_eq!(guests::saved_state(&rt.save().await.unwrap().state), b"9");
}

#[tokio::test]
async fn failed_batch_commits_nothing_and_the_runtime_recovers_its_state() {
    let (rt, _journal, sink) = spawn(guests::MISBEHAVE_WASM, Limits::default()).await;
    assert_eq!(rt.stats().last_failure(), None);
    rt.ingest(Bytes::from_static(b"count\ncount"), None)
        .await
        .unwrap();
    // The SDK's 8-byte version header, then the count as text.
    assert_eq!(rt.stats().state_bytes.load(Ordering::Relaxed), 9);
    let err = rt
        .ingest(
            Bytes::from_static(b"count\npublish v k x\npanic boom"),
            None,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            IngestError::Guest {
                source: GuestError::Trap { .. },
                ..
            }
        ),
        "{err}"
    );
    let trap = rt.stats().last_failure().unwrap();
    assert_eq!(trap.kind, FailureKind::Failed);
    // The stats carry what the sender was told: the server's words, not the trap's text.
    let IngestError::Guest { source, .. } = &err else {
        unreachable!("matched above")
    };
    assert_eq!(trap.message, source.public_message(), "{trap:?}");
    let err = rt
        .ingest(Bytes::from_static(b"count\nfail nope"), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            IngestError::Guest {
                source: GuestError::GuestRejected { .. },
                ..
            }
        ),
        "{err}"
    );
    let rejection = rt.stats().last_failure().unwrap();
    assert_eq!(rejection.kind, FailureKind::Rejected);
    assert!(rejection.message.ends_with("nope"), "{rejection:?}");
    assert!(rejection.at_ms >= trap.at_ms);
    rt.ingest(Bytes::from_static(b"count"), None).await.unwrap();
    let events = sink.events.lock().unwrap().clone();
    let counts: Vec<_> = events.iter().map(|(_, _, p)| p.as_str()).collect();
    assert_eq!(
        counts,
        vec!["1", "2", "3"],
        "all-or-nothing, state rolled back"
    );
    assert_eq!(
        rt.stats().last_failure(),
        Some(rejection),
        "kept after a success"
    );
    assert_eq!(rt.stats().failures.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn infinite_loop_does_not_stop_the_runtime() {
    // Out of fuel: a verdict on the batch, the same every time.
    let (rt, _journal, _sink) = spawn(guests::MISBEHAVE_WASM, Limits::default()).await;
    let err = rt
        .ingest(Bytes::from_static(b"loop"), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            IngestError::Guest {
                source: GuestError::FuelExhausted { .. },
                ..
            }
        ),
        "{err}"
    );
    rt.ingest(Bytes::from_static(b"count"), None).await.unwrap();

    // Past the wall-clock backstop: a fault, not the batch's.
    let limits = Limits {
        fuel: u64::MAX,
        batch_timeout: Duration::from_millis(100),
        ..Limits::default()
    };
    let (rt, _journal, _sink) = spawn(guests::MISBEHAVE_WASM, limits).await;
    let err = rt
        .ingest(Bytes::from_static(b"loop"), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            IngestError::Unavailable {
                source: GuestError::Timeout { .. },
                ..
            }
        ),
        "{err}"
    );
    rt.ingest(Bytes::from_static(b"count"), None).await.unwrap();
}

#[tokio::test]
async fn restore_from_a_snapshot() {
    let module = GuestModule::new(&engine(), guests::MISBEHAVE_WASM).unwrap();
    let journal = Arc::new(EventJournal::new(JournalConfig::default()));
    let sink = TestSink::new(&journal);
    let snapshot = RuntimeSnapshot {
        state: Bytes::from_static(b"41"),
        ..RuntimeSnapshot::default()
    };
    let rt = RuntimeHandle::spawn(
        module,
        RuntimeConfig::new("t", ["v", "state"]),
        Some(snapshot),
        journal,
        Arc::clone(&sink),
        Arc::default(),
    )
    .await
    .unwrap();
    rt.ingest(Bytes::from_static(b"count"), None).await.unwrap();
    assert_eq!(sink.events.lock().unwrap()[0].2, "42");
}

#[tokio::test]
async fn restore_inside_a_pause_replaces_the_guest_only_when_committed() {
    let (rt, _journal, sink) = spawn(guests::MISBEHAVE_WASM, Limits::default()).await;
    rt.ingest(Bytes::from_static(b"count"), None).await.unwrap();
    let snapshot = RuntimeSnapshot {
        state: Bytes::from_static(b"41"),
        ..RuntimeSnapshot::default()
    };
    // Staged but not committed: dropped with the guard.
    let (saved, guard) = rt.pause().await.unwrap();
    assert_eq!(guests::saved_state(&saved.state), b"1");
    guard.stage_restore(snapshot.clone()).await.unwrap();
    drop(guard);
    rt.ingest(Bytes::from_static(b"count"), None).await.unwrap();
    // Committed: the next batch runs on the restored state.
    let (_, guard) = rt.pause().await.unwrap();
    assert!(!guard.commit_restore().await.unwrap(), "nothing staged");
    guard.stage_restore(snapshot).await.unwrap();
    assert!(guard.commit_restore().await.unwrap());
    drop(guard);
    assert_eq!(&rt.save().await.unwrap().state[..], b"41");
    rt.ingest(Bytes::from_static(b"count"), None).await.unwrap();
    let counts: Vec<_> = sink
        .events
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.2.clone())
        .collect();
    assert_eq!(counts, vec!["1", "2", "42"]);
}

#[tokio::test]
async fn file_tail_feeds_the_runtime_and_truncation_marks_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ticks.ndjson");
    std::fs::write(&path, "{\"symbol\":\"A\",\"price\":1,\"seq\":1}\n\n\n").unwrap();
    let (rt, journal, sink) = spawn(guests::TICKER_WASM, Limits::default()).await;
    let config = FileTailConfig {
        poll_interval: Duration::from_millis(5),
        ..FileTailConfig::new(&path)
    };
    let task = tokio::spawn({
        let rt = rt.clone();
        async move { rt.follow(FileTail::new(config, None)).await }
    });
    let wait = |n: usize| {
        let sink = Arc::clone(&sink);
        async move {
            for _ in 0..1000 {
                if sink.events.lock().unwrap().len() >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("timed out waiting for {n} events");
        }
    };
    wait(1).await;
    let before = Cursor::new(journal.epoch().await, ViewOffset::new(1));
    std::fs::write(&path, "{\"symbol\":\"B\",\"price\":2,\"seq\":2}\n").unwrap();
    wait(2).await;
    assert!(matches!(
        journal.replay_after("prices", Some(&before)).await,
        Err(ReplayError::Gap { .. })
    ));
    let snap = rt.save().await.unwrap();
    assert!(matches!(snap.checkpoint, Some(SourceCheckpoint::FileTail(cp)) if cp.offset > 0));
    task.abort();
}

/// The misbehaving guest as runtime `t` (views `v`, `state`) on a log committed through
/// `committed`.
async fn misbehave_on_log(
    committed: LogPosition,
) -> (
    GuestModule,
    Arc<TestSink>,
    Arc<crate::log::Log>,
    RuntimeHandle,
) {
    let module = GuestModule::new(&engine(), guests::MISBEHAVE_WASM).unwrap();
    let journal = Arc::new(EventJournal::new(JournalConfig::default()));
    let sink = TestSink::new(&journal);
    let segments = crate::log::Segments::new(viewtape_snapshots::log::Durability::Fsync);
    let log = Arc::new(crate::log::Log::new(
        crate::log::Backend::Segments(segments),
        committed,
    ));
    let handle = RuntimeHandle::spawn(
        module.clone(),
        RuntimeConfig::new("t", ["v", "state"]),
        None,
        journal,
        Arc::clone(&sink),
        Arc::clone(&log),
    )
    .await
    .unwrap();
    (module, sink, log, handle)
}

/// A replayed record waits for its turn after running its guest; when the replay breaks off
/// before it, the turn is abandoned, and the runtime is left as it was: no commit, the guest's
/// state before the record, and the record applies again later.
#[tokio::test]
async fn a_replayed_record_whose_turn_is_abandoned_is_undone() {
    use crate::host::{EventKind, GuestEvent};
    use crate::log::{BatchEntry, Digest, Outcome};
    use command::Record;

    let (module, sink, log, handle) = misbehave_on_log(LogPosition::new(0)).await;
    let event = |view: &str, key: &str, payload: &'static [u8]| {
        GuestEvent::new(
            Arc::from(view),
            key.to_owned(),
            EventKind::Update,
            Bytes::from_static(payload),
        )
    };
    let produced =
        GuestBatch::of_events(vec![event("v", "k", b"1"), event("state", "count", b"1")]);
    let entry = BatchEntry {
        runtime: "t".into(),
        module: module.fingerprint().clone(),
        guest_config: handle.guest_config_crc(),
        at_ms: crate::log::unix_ms_now(),
        input: Bytes::from_static(b"publish v k 1\ncount\n"),
        producer: None,
        checkpoint: None,
        source_gap: None,
        outcome: Outcome::Committed(Digest::of(&produced)),
    };
    let before = handle.save().await.unwrap();

    // At position 2 it runs the guest, then waits for position 1, which never commits.
    let applied = handle
        .hand_over(Record::Batch(entry.clone()), LogPosition::new(2))
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    log.abandon_turns(true);
    let outcome = tokio::time::timeout(Duration::from_secs(5), applied)
        .await
        .expect("an abandoned turn ends the wait");
    assert!(
        matches!(outcome, Err(ApplyError::Abandoned { .. })),
        "{outcome:?}"
    );
    log.abandon_turns(false);
    assert_eq!(handle.save().await.unwrap().state, before.state);
    assert!(sink.events.lock().unwrap().is_empty());
    assert_eq!(log.committed(), LogPosition::new(0));

    // The same record, in its turn, applies from the state before it: the same digest.
    handle
        .apply(Record::Batch(entry), LogPosition::new(1))
        .await
        .unwrap();
    assert_eq!(log.committed(), LogPosition::new(1));
    assert_eq!(sink.events.lock().unwrap().len(), 2);
}

/// Batches a cluster node gathered into one record are judged alone, in order, at one
/// position: a refused one costs the others nothing, a producer's second copy is a duplicate
/// answered with the first's receipt, and each verdict goes to its own place.
#[tokio::test]
async fn gathered_batches_are_judged_alone_at_one_position() {
    use crate::log::producer::{ProducerEpoch, ProducerSeq, ProducerStamp};
    use crate::log::{BatchEntry, Outcome};
    use command::Record;
    use verdict::Verdict;

    let (module, sink, log, handle) = misbehave_on_log(LogPosition::new(6)).await;
    let batch = |input: &'static [u8], seq: Option<u64>| BatchEntry {
        runtime: "t".into(),
        module: module.fingerprint().clone(),
        guest_config: handle.guest_config_crc(),
        at_ms: crate::log::unix_ms_now(),
        input: Bytes::from_static(input),
        producer: seq.map(|seq| ProducerStamp {
            id: "p".into(),
            epoch: ProducerEpoch::new(1),
            seq: ProducerSeq::new(seq),
            claim: false,
        }),
        checkpoint: None,
        source_gap: None,
        outcome: Outcome::Pending,
    };
    let group = vec![
        batch(b"count", Some(0)),
        batch(b"count\nfail nope", None),
        batch(b"count", Some(1)),
        batch(b"count", Some(1)),
        batch(b"count", Some(3)),
    ];
    let batches = (0u32..).zip(group).collect();
    let shared = false;
    handle
        .apply(Record::Batches { batches, shared }, LogPosition::new(7))
        .await
        .unwrap();
    assert_eq!(log.committed(), LogPosition::new(7));

    let mut verdicts = handle.verdicts.lock().unwrap();
    let mut verdict = |index| match verdicts.take((LogPosition::new(7), index)) {
        Some(Verdict::Batch(outcome)) => outcome,
        other => panic!("no batch verdict at index {index}: {other:?}"),
    };
    let first = verdict(0).unwrap();
    assert!(!first.duplicate);
    assert_eq!(first.receipt.position, Some(LogPosition::new(7)));
    assert!(matches!(verdict(1), Err(IngestError::Guest { .. })));
    let second = verdict(2).unwrap();
    assert!(!second.duplicate);
    let again = verdict(3).unwrap();
    assert!(again.duplicate);
    assert_eq!(again.receipt, second.receipt);
    assert!(matches!(
        verdict(4),
        Err(IngestError::OutOfOrder { expected, .. }) if expected == ProducerSeq::new(2)
    ));
    assert!(verdicts.take((LogPosition::new(7), 5)).is_none());
    drop(verdicts);
    // The refused batch left the guest's state as it was: two counts committed, in order.
    let counts: Vec<_> = sink
        .events
        .lock()
        .unwrap()
        .iter()
        .map(|(_, _, count)| count.clone())
        .collect();
    assert_eq!(counts, ["1", "2"]);
}

/// A runtime's part of a record shared with other runtimes is judged at the record's position
/// and its verdicts go to the indices the record gave them, but the position is not marked
/// applied: the caller does that once every runtime has applied its part.
#[tokio::test]
async fn a_shared_part_leaves_the_position_to_the_caller() {
    use crate::log::{BatchEntry, Outcome};
    use command::Record;
    use verdict::Verdict;

    let (module, sink, log, handle) = misbehave_on_log(LogPosition::new(4)).await;
    let batch = |input: &'static [u8]| BatchEntry {
        runtime: "t".into(),
        module: module.fingerprint().clone(),
        guest_config: handle.guest_config_crc(),
        at_ms: crate::log::unix_ms_now(),
        input: Bytes::from_static(input),
        producer: None,
        checkpoint: None,
        source_gap: None,
        outcome: Outcome::Pending,
    };
    // Indices 0 and 2 are other runtimes' batches.
    let batches = vec![(1, batch(b"count")), (3, batch(b"count"))];
    let shared = true;
    handle
        .apply(Record::Batches { batches, shared }, LogPosition::new(5))
        .await
        .unwrap();
    assert_eq!(
        log.committed(),
        LogPosition::new(4),
        "the caller marks the position applied"
    );
    {
        let mut verdicts = handle.verdicts.lock().unwrap();
        for index in [1, 3] {
            match verdicts.take((LogPosition::new(5), index)) {
                Some(Verdict::Batch(Ok(accepted))) => {
                    assert_eq!(accepted.receipt.position, Some(LogPosition::new(5)));
                }
                other => panic!("no accepted batch at index {index}: {other:?}"),
            }
        }
        assert!(verdicts.take((LogPosition::new(5), 0)).is_none());
        assert!(verdicts.take((LogPosition::new(5), 2)).is_none());
    }
    assert_eq!(sink.events.lock().unwrap().len(), 2);
    // The turn the caller holds commits the position.
    drop(log.turn(Some(LogPosition::new(5)), 1).await);
    assert_eq!(log.committed(), LogPosition::new(5));
}
