//! Property test of the snapshots' central promise: no sequence of appends, periodic snapshots,
//! graceful stops (seal + exact snapshot), crashes (everything dropped, no snapshot), restarts
//! (through [`restore_at_start`], the server's own start-up rule) and live restores ever gives
//! one cursor `(epoch, view, offset)` two different frames.
//!
//! Every frame carries a unique number, so two records with the same cursor and different
//! frames are two different events. After every step the retained tape of every view is read
//! and checked against every frame ever seen under the same cursor.
//!
//! A deterministic test runs a naive start-up rule (adopt any exact snapshot, without consuming
//! it) through the same checker, to show the checker catches the exact-then-crash bug.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use viewtape_journal::{EventJournal, JournalConfig, JournalEpoch};
use viewtape_snapshots::SnapshotDir;

use crate::host::{EventKind, GuestBatch, GuestEvent};
use crate::hub::Hub;
use crate::recovery::restore_at_start;
use crate::runtime::BatchSink;
use crate::snapshot::{SnapshotBody, Snapshots};

const VIEWS: [&str; 2] = ["prices", "trades"];

#[derive(Clone, Debug)]
enum Op {
    /// `n` events into one view.
    Append { view: usize, n: usize },
    /// A periodic snapshot (no seal).
    Periodic,
    /// Graceful stop: seal + exact snapshot, then a restart.
    Graceful,
    /// kill -9: drop everything, then a restart.
    Crash,
    /// A guest reported lost input.
    Gap,
    /// `POST /admin/restore` of the newest valid snapshot: always a fresh epoch.
    LiveRestore,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..VIEWS.len(), 1..6usize).prop_map(|(view, n)| Op::Append { view, n }),
        2 => Just(Op::Periodic),
        2 => Just(Op::Graceful),
        2 => Just(Op::Crash),
        1 => Just(Op::Gap),
        1 => Just(Op::LiveRestore),
    ]
}

/// How a new life starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StartRule {
    /// The server's: [`restore_at_start`].
    Server,
    /// Adopt the newest exact snapshot's epoch without consuming it (the bug the one-life rule
    /// prevents).
    Naive,
}

struct World {
    dir: tempfile::TempDir,
    rule: StartRule,
    hub: Arc<Hub>,
    /// Every frame ever seen, by cursor.
    seen: HashMap<(JournalEpoch, String, viewtape_journal::ViewOffset), Bytes>,
    next_event: u64,
}

impl World {
    async fn new(rule: StartRule) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let hub = Self::start(dir.path(), rule).await?;
        Ok(Self {
            dir,
            rule,
            hub,
            seen: HashMap::new(),
            next_event: 0,
        })
    }

    fn dir(path: &std::path::Path) -> Result<Arc<SnapshotDir>, String> {
        SnapshotDir::open(path.join("snapshots"))
            .map(Arc::new)
            .map_err(|e| e.to_string())
    }

    /// The server's snapshot actions over this life's hub (no runtimes).
    fn snapshots(&self) -> Result<Snapshots, String> {
        let dir = Self::dir(self.dir.path())?;
        Ok(Snapshots::new(
            Arc::clone(&self.hub),
            dir,
            Arc::default(),
            Arc::default(),
        ))
    }

    /// A new life: a fresh journal and hub, restored by `rule`.
    async fn start(path: &std::path::Path, rule: StartRule) -> Result<Arc<Hub>, String> {
        let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(
            JournalConfig::default(),
        ))));
        let snapshots = Self::dir(path)?;
        match rule {
            StartRule::Server => {
                restore_at_start(&hub, &snapshots)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            StartRule::Naive => {
                let newest = snapshots
                    .load_newest_valid::<SnapshotBody>()
                    .map_err(|e| e.to_string())?;
                if let Some(loaded) = newest.loaded {
                    let exact = loaded.info.header().is_exact();
                    hub.restore(loaded.body.journal, exact, loaded.body.views)
                        .await;
                }
            }
        }
        for view in VIEWS {
            hub.declare(view);
        }
        Ok(hub)
    }

    async fn apply(&mut self, op: &Op) -> Result<(), String> {
        let snapshots = self.snapshots()?;
        match op {
            Op::Append { view, n } => {
                let events = (0..*n)
                    .map(|i| {
                        self.next_event += 1;
                        GuestEvent::new(
                            Arc::from(VIEWS[*view]),
                            format!("k{}", i % 3),
                            EventKind::Update,
                            Bytes::from(format!("{{\"n\":{}}}", self.next_event)),
                        )
                    })
                    .collect();
                self.hub
                    .commit(
                        "t",
                        GuestBatch {
                            events,
                            gaps: vec![],
                        },
                        crate::log::unix_ms_now(),
                    )
                    .await;
            }
            Op::Periodic => {
                snapshots.write().await.map_err(|e| e.to_string())?;
            }
            Op::Graceful => {
                snapshots.write_exact().await.map_err(|e| e.to_string())?;
                self.hub = Self::start(self.dir.path(), self.rule).await?;
            }
            Op::Crash => {
                self.hub = Self::start(self.dir.path(), self.rule).await?;
            }
            Op::Gap => self.hub.journal().mark_gap().await,
            Op::LiveRestore => {
                let listed = snapshots.list().await.map_err(|e| e.to_string())?;
                if let Some(newest) = listed.iter().find(|entry| entry.is_valid()) {
                    snapshots
                        .restore_live(&newest.file_name)
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        self.check().await
    }

    /// Every retained record agrees with every frame seen before under its cursor.
    async fn check(&mut self) -> Result<(), String> {
        let journal = self.hub.journal();
        let epoch = journal.epoch().await;
        for view in VIEWS {
            let records = journal
                .replay_after(view, None)
                .await
                .map_err(|e| format!("replay of {view}: {e}"))?;
            for record in records {
                let frame = Bytes::clone(&record.frame);
                let key = (epoch, view.to_owned(), record.offset);
                if let Some(before) = self.seen.get(&key) {
                    if *before != frame {
                        return Err(format!(
                            "cursor {epoch}-{} of {view} means two things: {:?} and {:?}",
                            record.offset, before, frame
                        ));
                    }
                } else {
                    self.seen.insert(key, frame);
                }
            }
        }
        Ok(())
    }
}

fn run(rule: StartRule, ops: &[Op]) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut world = World::new(rule).await?;
        for (i, op) in ops.iter().enumerate() {
            world
                .apply(op)
                .await
                .map_err(|e| format!("step {i} ({op:?}): {e}"))?;
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn no_cursor_ever_means_two_frames(ops in proptest::collection::vec(op(), 1..40)) {
        if let Err(error) = run(StartRule::Server, &ops) {
            return Err(TestCaseError::fail(error));
        }
    }
}

#[test]
fn the_checker_catches_an_exact_snapshot_adopted_twice() {
    let exact_then_crash = [
        Op::Append { view: 0, n: 3 },
        Op::Graceful,
        Op::Append { view: 0, n: 2 },
        Op::Crash,
        Op::Append { view: 0, n: 2 },
    ];
    let naive = run(StartRule::Naive, &exact_then_crash);
    assert!(
        naive
            .as_ref()
            .is_err_and(|e| e.contains("means two things")),
        "{naive:?}"
    );
    run(StartRule::Server, &exact_then_crash).unwrap();
}
