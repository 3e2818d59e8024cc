//! Property test: the journal against a small model of the contract, over
//! random sequences of appends, seals, gaps (on every view, and reported
//! through a runtime's scope on some views), time steps, dumps, and exact
//! (graceful restart) and periodic (crash restore) hydrates.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use viewtape_journal::{
    Cursor, EventJournal, JournalConfig, JournalEpoch, JournalSnapshot, ManualClock, ReplayError,
    ViewOffset,
};

const VIEWS: [&str; 3] = ["a", "b", "c"];
const MAX_AGE_MS: u64 = 3_000;

#[derive(Debug, Clone)]
enum Op {
    Append {
        view: usize,
        len: usize,
    },
    Seal,
    Gap,
    /// A gap reported through the scope of a runtime publishing to the views
    /// whose bits are set in `views`.
    ReportGap {
        views: u8,
    },
    Advance {
        ms: u64,
    },
    Dump,
    /// Graceful restart: seal, dump, and an exact hydrate into a new journal.
    Restart,
    /// Crash restore: a periodic hydrate of the newest stored dump.
    RestorePeriodic,
    Replay {
        view: usize,
        pick: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..3usize, 1..16usize).prop_map(|(view, len)| Op::Append { view, len }),
        1 => Just(Op::Seal),
        1 => Just(Op::Gap),
        1 => (0..8u8).prop_map(|views| Op::ReportGap { views }),
        // Round steps land exactly on the age bound; 1 ms steps just past it.
        3 => prop_oneof![0..2_000u64, Just(1), Just(500), Just(1_000), Just(1_500)]
            .prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Dump),
        1 => Just(Op::Restart),
        1 => Just(Op::RestorePeriodic),
        6 => (0..3usize, 0..12usize).prop_map(|(view, pick)| Op::Replay { view, pick }),
    ]
}

#[derive(Debug, Clone, Default)]
struct ModelView {
    /// (offset, frame, appended at ms)
    records: VecDeque<(u64, Bytes, u64)>,
    first: u64,
    floor: u64,
}

impl ModelView {
    fn new(floor: u64) -> Self {
        Self {
            records: VecDeque::new(),
            first: 1,
            floor,
        }
    }
    fn next(&self) -> u64 {
        self.first + self.records.len() as u64
    }
    fn prune(&mut self, config: &JournalConfig, now_ms: u64) {
        let pop = |view: &mut ModelView| {
            view.records.pop_front();
            view.first += 1;
        };
        while self
            .records
            .front()
            .is_some_and(|r| now_ms - r.2 > MAX_AGE_MS)
        {
            pop(self);
        }
        while self.records.len() > config.max_records_per_view {
            pop(self);
        }
        while self.records.iter().map(|r| r.1.len()).sum::<usize>() > config.max_bytes_per_view {
            pop(self);
        }
    }
}

/// A gap takes one offset: an empty record that becomes the gap floor.
fn push_gap(view: &mut ModelView, now_ms: u64) {
    view.floor = view.next();
    view.records.push_back((view.next(), Bytes::new(), now_ms));
    view.prune(&config(), now_ms);
}

#[derive(Clone)]
struct Model {
    epoch: JournalEpoch,
    sealed: bool,
    views: HashMap<&'static str, ModelView>,
    now_ms: u64,
}

impl Model {
    /// A gap on the views `affected` selects that have issued an offset: the
    /// floor moves now, or at the next exact hydrate while sealed.
    fn gap(&mut self, affected: impl Fn(&str) -> bool) {
        let views = self
            .views
            .iter_mut()
            .filter(|(name, view)| view.next() > 1 && affected(name));
        for (_, view) in views {
            if self.sealed {
                view.floor = view.next();
            } else {
                push_gap(view, self.now_ms);
            }
        }
    }
}

fn config() -> JournalConfig {
    JournalConfig {
        enabled: true,
        max_age: Duration::from_millis(MAX_AGE_MS),
        max_records_per_view: 5,
        max_bytes_per_view: 40,
    }
}

fn check_replay(
    model: &mut Model,
    view: &'static str,
    cursor: Option<Cursor>,
    got: Result<Vec<viewtape_journal::JournalRecord>, ReplayError>,
) -> Result<(), TestCaseError> {
    let config = config();
    let now = model.now_ms;
    let entry = model.views.entry(view).or_insert_with(|| ModelView::new(0));
    entry.prune(&config, now);
    let expected: Result<Vec<(u64, Bytes)>, &str> = match cursor {
        None => Ok(entry.records.iter().map(|r| (r.0, r.1.clone())).collect()),
        Some(c) if c.epoch() != model.epoch => Err("stale_epoch"),
        Some(c) if c.offset().get() >= entry.next() => Err("ahead"),
        Some(c) if c.offset().get() + 1 < entry.first => Err("expired"),
        Some(c) if c.offset().get() < entry.floor => Err("gap"),
        Some(c) => Ok(entry
            .records
            .iter()
            .filter(|r| r.0 > c.offset().get())
            .map(|r| (r.0, r.1.clone()))
            .collect()),
    };
    match (expected, got) {
        (Ok(expected), Ok(got)) => {
            let got: Vec<(u64, Bytes)> = got
                .into_iter()
                .map(|r| (r.offset.get(), (*r.frame).clone()))
                .collect();
            prop_assert_eq!(got, expected);
        }
        (Err(reason), Err(error)) => prop_assert_eq!(error.reason(), reason, "{:?}", error),
        (expected, got) => prop_assert!(false, "expected {:?}, got {:?}", expected, got),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn journal_follows_the_contract(ops in prop::collection::vec(op(), 1..120)) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let mut journal = Arc::new(EventJournal::with_clock(config(), clock.clone()));
        let mut model = Model {
            epoch: rt.block_on(journal.epoch()),
            sealed: false,
            views: HashMap::new(),
            now_ms: 0,
        };
        // Every (epoch, view, offset) ever issued, and the frame it carried:
        // no offset may ever be issued again for a different frame.
        let mut issued: BTreeMap<(u64, &str, u64), Bytes> = BTreeMap::new();
        let mut dumps: Vec<(JournalSnapshot, Model)> = Vec::new();
        let mut serial = 0u64;
        let mut old_epochs = vec![];

        for op in ops {
            match op {
                Op::Append { view, len } => {
                    let view = VIEWS[view];
                    serial += 1;
                    let body = format!("{serial:0>len$}");
                    let built = rt.block_on(journal.append_with(view, "k", |offset| {
                        Ok::<_, ()>(Arc::new(Bytes::from(format!("{offset}/{body}"))))
                    })).unwrap();
                    let now = model.now_ms;
                    let entry = model.views.entry(view).or_insert_with(|| ModelView::new(0));
                    if model.sealed {
                        prop_assert!(built.is_none());
                    } else {
                        let (offset, frame) = built.expect("unsealed append issues an offset");
                        let offset = offset.get();
                        prop_assert_eq!(offset, entry.next(), "offsets are dense");
                        let prefix = format!("{offset}/");
                        prop_assert!(frame.starts_with(prefix.as_bytes()));
                        let key = (model.epoch.to_bits(), view, offset);
                        if let Some(previous) = issued.insert(key, (*frame).clone()) {
                            prop_assert_eq!(previous, (*frame).clone(), "offset reused for another frame");
                        }
                        entry.records.push_back((offset, (*frame).clone(), now));
                        entry.prune(&config(), now);
                    }
                }
                Op::Seal => {
                    journal.seal();
                    model.sealed = true;
                }
                Op::Gap => {
                    rt.block_on(journal.mark_gap());
                    model.gap(|_| true);
                }
                Op::ReportGap { views } => {
                    let covered = |name: &str| {
                        VIEWS.iter().position(|v| *v == name).is_some_and(|i| views & (1 << i) != 0)
                    };
                    journal.scope(VIEWS.into_iter().filter(|v| covered(v))).report_gap();
                    model.gap(covered);
                }
                Op::Advance { ms } => {
                    clock.advance(Duration::from_millis(ms));
                    model.now_ms += ms;
                }
                Op::Dump => {
                    let dump = rt.block_on(journal.dump());
                    prop_assert_eq!(dump.epoch, Some(model.epoch));
                    let snapshot_model = Model {
                        epoch: model.epoch,
                        sealed: false,
                        views: model.views.clone(),
                        now_ms: model.now_ms,
                    };
                    dumps.push((dump, snapshot_model));
                }
                Op::Restart => {
                    journal.seal();
                    let dump = rt.block_on(journal.dump());
                    let next = EventJournal::with_clock(config(), clock.clone());
                    rt.block_on(next.hydrate(dump, true));
                    journal = Arc::new(next);
                    model.sealed = false;
                    for view in model.views.values_mut() {
                        if view.floor == view.next() && view.next() > 1 {
                            push_gap(view, model.now_ms);
                        }
                    }
                    prop_assert_eq!(rt.block_on(journal.epoch()), model.epoch);
                }
                Op::RestorePeriodic => {
                    let Some((dump, snapshot_model)) = dumps.last().cloned() else { continue };
                    rt.block_on(journal.hydrate(dump, false));
                    let epoch = rt.block_on(journal.epoch());
                    prop_assert_ne!(epoch, model.epoch);
                    prop_assert_ne!(epoch, snapshot_model.epoch);
                    old_epochs.push(model.epoch);
                    model.epoch = epoch;
                    model.sealed = false;
                    model.views = snapshot_model
                        .views
                        .iter()
                        .map(|(name, view)| {
                            let next = view.next();
                            (*name, ModelView { records: VecDeque::new(), first: next, floor: 0 })
                        })
                        .collect();
                }
                Op::Replay { view, pick } => {
                    let name = VIEWS[view];
                    let window = rt.block_on(journal.window(name));
                    prop_assert_eq!(window.epoch, model.epoch);
                    prop_assert_eq!(window.sealed, model.sealed);
                    let (first, next) = (window.first.get(), window.next.get());
                    let candidates = [
                        None,
                        Some(0),
                        Some(first.saturating_sub(2)),
                        Some(first.saturating_sub(1)),
                        Some(first),
                        Some(next.saturating_sub(1)),
                        Some(next),
                        Some(next + 1),
                        Some((first + next) / 2),
                        Some(u64::MAX),
                    ];
                    let cursor = match pick {
                        10 => old_epochs.last().map(|e| Cursor::new(*e, ViewOffset::new(next.saturating_sub(1)))),
                        11 => Some(Cursor::new(JournalEpoch::random(), ViewOffset::FIRST)),
                        i => candidates[i].map(|o| Cursor::new(model.epoch, ViewOffset::new(o))),
                    };
                    let got = rt.block_on(journal.replay_after(name, cursor.as_ref()));
                    check_replay(&mut model, name, cursor, got)?;
                    let model_view = &model.views[name];
                    prop_assert_eq!((first, next), (model_view.first, model_view.next()));
                }
            }
        }
    }
}
