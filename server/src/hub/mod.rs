//! The hub: every view's state and live notification, and the commit path
//! from runtimes into the journal.
//!
//! ## Views
//!
//! A [`View`] holds the view's *state* — per key, the frame of its latest
//! update — plus the ways to wake subscribers: a `watch` ticked after
//! journaled appends (subscribers then read the tape from their cursor), the
//! same for narrowed subscribers by key ([`wake`]), and a bounded `broadcast`
//! of cursorless frames (journal sealed or disabled). Subscribers are cursors
//! over the shared tape, never queues of copies.
//!
//! ## Lasting views and views a read holds
//!
//! A view is *lasting* once a runtime declares it, an event is published to it or a restore
//! gives it state: it is listed, kept in snapshots, and stays. A read of a name that a pattern of
//! a running runtime takes (`chat.*` takes `chat.room-7`) before anything was published there
//! finds no view: it makes one for as long as it reads ([`Hub::hold_on_demand`]), empty, so that
//! a stream waiting there receives the first events. Such a view is not listed nor kept in
//! snapshots, and is forgotten when its last [`ReadHold`] goes, unless a publish made it lasting
//! meanwhile: reads of names that never get an event leave nothing behind.
//!
//! ## Consistency
//!
//! An event is appended to the journal and applied to its view's state in
//! one critical section of the view's lock, so the state read under that
//! lock, with the head cursor read in the same section, is exactly "every
//! event up to that cursor". Lock order: view lock, then the journal's lock.
//! Subscribers are woken after the lock is released.
//!
//! | file | job |
//! |---|---|
//! | this one | [`Hub`] and [`View`]: the views, their state, the commit path into the journal |
//! | [`wake`] | narrowed subscribers woken by the keys a commit touches |
//! | [`frame`] | the SSE wire format: an event encoded once, as every subscriber receives it |
//! | [`narrow`] | reads and grants of some keys of a view |

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};
use viewtape_journal::{CompactString, Cursor, EventJournal, JournalConfig, JournalSnapshot};

use crate::host::{EventKind, GuestBatch, GuestEvent};
use crate::hub::frame::Frame;
use crate::hub::narrow::Narrow;
use crate::runtime::BatchSink;
use crate::schema::{ViewSchema, Violation};

pub mod frame;
pub mod narrow;
pub mod wake;

pub use wake::KeyWake;
use wake::KeyedWakers;

/// Cursorless frames a slow subscriber may fall behind by before it is reset.
const LIVE_BACKLOG: usize = 1024;
/// Most events of a batch published under one hold of their view's lock and the journal's:
/// long enough to take the locks and read the clock once for many events, short enough that
/// a reader waits microseconds, not a whole batch.
const PUBLISH_RUN: usize = 64;

/// One view: its state and its subscribers' wake-ups.
#[derive(Debug)]
pub struct View {
    name: String,
    state: Mutex<HashMap<CompactString, Frame>>,
    tick: watch::Sender<u64>,
    /// Narrowed subscribers, woken by the commits that touch their keys.
    keyed: Arc<KeyedWakers>,
    /// Cursorless frames (the journal is sealed or off), with their key.
    /// Made by its first receiver: most views never have one, and a channel holds
    /// [`LIVE_BACKLOG`] slots.
    live: OnceLock<broadcast::Sender<(CompactString, Bytes)>>,
    /// SSE subscribers open on it now.
    subscribers: AtomicU64,
    /// Reads under way ([`ReadHold`]s). A hold is taken only under the hub's map lock, so that
    /// [`Hub::forget_if_idle`], which checks under it for writing, never forgets a view a read
    /// holds.
    holds: AtomicU64,
    /// Why it was retired ([`Hub::retire`]); its streams end with that.
    retired: OnceLock<String>,
    /// Made by a read of a name a pattern takes ([`Hub::hold_on_demand`]) and not lasting yet:
    /// cleared, under the hub's map lock, by [`Hub::declare`] (a runtime's declaration, a
    /// publish, a restore), never set again.
    on_demand: AtomicBool,
    /// Taken out of the hub ([`Hub::forget_if_idle`]): a commit that holds it publishes to
    /// its successor instead.
    forgotten: AtomicBool,
}

/// A read's hold of a view ([`Hub::hold`], [`Hub::hold_on_demand`]): a view that only reads
/// made is not forgotten while one holds it, and is forgotten when the last one goes, unless it
/// became lasting meanwhile.
#[derive(Debug)]
pub struct ReadHold {
    hub: Arc<Hub>,
    view: Arc<View>,
}

impl ReadHold {
    /// The view held.
    pub fn view(&self) -> &Arc<View> {
        &self.view
    }
}

impl Drop for ReadHold {
    fn drop(&mut self) {
        self.view.holds.fetch_sub(1, Ordering::AcqRel);
        self.hub.forget_if_idle(&self.view);
    }
}

/// A view's state as of one cursor.
#[derive(Debug, Clone)]
pub struct StateCut {
    /// Every event up to and including this cursor is in `frames`; none after.
    pub cursor: Cursor,
    /// The latest update frame of each key.
    pub entries: Vec<Frame>,
}

impl View {
    fn new(name: &str, tape: &JournalConfig) -> Self {
        Self {
            name: name.to_owned(),
            state: Mutex::new(HashMap::new()),
            tick: watch::Sender::new(0),
            keyed: Arc::new(KeyedWakers::new(
                tape.max_records_per_view,
                tape.max_bytes_per_view,
            )),
            live: OnceLock::new(),
            subscribers: AtomicU64::new(0),
            holds: AtomicU64::new(0),
            retired: OnceLock::new(),
            on_demand: AtomicBool::new(false),
            forgotten: AtomicBool::new(false),
        }
    }

    /// Why it was retired, once it is: its streams end with a last `retired` event.
    pub fn retired(&self) -> Option<&str> {
        self.retired.get().map(String::as_str)
    }

    /// Whether it lasts: declared by a runtime, published to or restored, rather than only
    /// held by reads of a name a pattern takes (see the module docs). Only lasting views are
    /// listed and kept in snapshots.
    pub fn lasting(&self) -> bool {
        !self.on_demand.load(Ordering::Acquire)
    }

    /// SSE subscribers open on it now.
    pub fn subscribers(&self) -> u64 {
        self.subscribers.load(Ordering::Relaxed)
    }

    /// A subscriber opened (`true`) or went away (`false`).
    pub(crate) fn count_subscriber(&self, opened: bool) {
        match opened {
            true => self.subscribers.fetch_add(1, Ordering::Relaxed),
            false => self.subscribers.fetch_sub(1, Ordering::Relaxed),
        };
    }

    /// The view's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Wakes on every journaled append (and on restores).
    pub fn ticks(&self) -> watch::Receiver<u64> {
        self.tick.subscribe()
    }

    /// Wakes on every journaled append that touches a key `narrow` takes (and on restores),
    /// for a narrowed subscriber; until dropped.
    pub fn key_wake(&self, narrow: &Narrow) -> KeyWake {
        self.keyed.register(narrow)
    }

    /// Wakes every subscriber, so each re-checks its cursor.
    fn wake_all(&self) {
        self.tick.send_modify(|tick| *tick += 1);
        self.keyed.wake_all();
    }

    /// Cursorless frames published after the journal was sealed (or while it
    /// is disabled).
    pub fn live(&self) -> broadcast::Receiver<(CompactString, Bytes)> {
        self.live
            .get_or_init(|| broadcast::Sender::new(LIVE_BACKLOG))
            .subscribe()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<CompactString, Frame>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The state of the keys `narrow` takes and the cursor it reflects, read atomically.
    pub fn cut(&self, journal: &EventJournal, narrow: &Narrow) -> StateCut {
        let state = self.lock();
        let window = journal.window_now(&self.name);
        StateCut {
            cursor: Cursor::new(window.epoch, window.next.prev()),
            entries: state
                .iter()
                .filter(|(key, _)| narrow.keeps(key))
                .map(|(_, frame)| frame.clone())
                .collect(),
        }
    }

    /// Every key with its latest update frame.
    pub fn entries(&self) -> Vec<(CompactString, Frame)> {
        self.lock()
            .iter()
            .map(|(key, frame)| (key.clone(), frame.clone()))
            .collect()
    }

    /// Number of keys.
    pub fn keys(&self) -> usize {
        self.lock().len()
    }
}

/// Counters the hub keeps for metrics.
#[derive(Debug, Default)]
pub struct HubStats {
    /// Events published (journaled or cursorless).
    pub published: AtomicU64,
    /// Events published without a cursor (journal sealed or disabled).
    pub cursorless: AtomicU64,
}

/// Every view, the journal, and the commit path.
#[derive(Debug)]
pub struct Hub {
    journal: Arc<EventJournal>,
    views: RwLock<BTreeMap<String, Arc<View>>>,
    stats: HubStats,
}

/// One view's state in a snapshot: each key's latest update frame.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ViewStateDump {
    /// The view.
    pub view: String,
    /// `(key, frame)` pairs.
    pub entries: Vec<(CompactString, Frame)>,
}

impl Hub {
    /// A hub over `journal` with no views yet.
    pub fn new(journal: Arc<EventJournal>) -> Self {
        Self {
            journal,
            views: RwLock::new(BTreeMap::new()),
            stats: HubStats::default(),
        }
    }

    /// The journal.
    pub fn journal(&self) -> &Arc<EventJournal> {
        &self.journal
    }

    /// Counters.
    pub fn stats(&self) -> &HubStats {
        &self.stats
    }

    /// The view named `name`, if it exists: lasting, or made for reads that hold it now.
    pub fn view(&self, name: &str) -> Option<Arc<View>> {
        self.read_views().get(name).cloned()
    }

    /// All views, sorted by name, those only reads hold included ([`View::lasting`] tells).
    pub fn views(&self) -> Vec<Arc<View>> {
        self.read_views().values().cloned().collect()
    }

    /// The view named `name`, created if new, lasting from now on (one that only reads held
    /// becomes lasting). Names are validated by the host before events reach the hub.
    pub fn declare(&self, name: &str) -> Arc<View> {
        let lasting = |view: &Arc<View>| {
            // Under the map lock: a view [`Hub::forget_if_idle`] has not taken out stays in.
            view.on_demand.store(false, Ordering::Release);
            Arc::clone(view)
        };
        if let Some(view) = self.read_views().get(name).map(lasting) {
            return view;
        }
        let mut views = self.views.write().unwrap_or_else(PoisonError::into_inner);
        lasting(
            views
                .entry(name.to_owned())
                .or_insert_with(|| Arc::new(View::new(name, self.journal.config()))),
        )
    }

    /// The view named `name`, if it exists (lasting, or held by other reads), held for a read
    /// until the hold is dropped.
    pub fn hold(self: &Arc<Self>, name: &str) -> Option<ReadHold> {
        let held = self.read_views().get(name).map(|view| self.held(view));
        held
    }

    /// The view named `name` held for a read, when a pattern of a running runtime takes it:
    /// made now, empty and not lasting, if nothing was published there yet. It is forgotten
    /// again when its last hold goes, unless it became lasting meanwhile (see the module docs).
    pub fn hold_on_demand(self: &Arc<Self>, name: &str) -> ReadHold {
        if let Some(held) = self.hold(name) {
            return held;
        }
        let mut views = self.views.write().unwrap_or_else(PoisonError::into_inner);
        let view = views.entry(name.to_owned()).or_insert_with(|| {
            let view = View::new(name, self.journal.config());
            view.on_demand.store(true, Ordering::Release);
            Arc::new(view)
        });
        self.held(view)
    }

    /// A hold of `view`; call it under the map lock.
    fn held(self: &Arc<Self>, view: &Arc<View>) -> ReadHold {
        view.holds.fetch_add(1, Ordering::AcqRel);
        ReadHold {
            hub: Arc::clone(self),
            view: Arc::clone(view),
        }
    }

    fn read_views(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<View>>> {
        self.views.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets `view` when only reads made it ([`Hub::hold_on_demand`]) and none holds it now.
    /// A cursor of it names the point before its first event, which stays true when it is made
    /// again.
    fn forget_if_idle(&self, view: &Arc<View>) {
        if view.lasting() || view.holds.load(Ordering::Acquire) > 0 {
            return;
        }
        let mut views = self.views.write().unwrap_or_else(PoisonError::into_inner);
        let idle = !view.lasting()
            && view.holds.load(Ordering::Acquire) == 0
            && views
                .get(&view.name)
                .is_some_and(|held| Arc::ptr_eq(held, view));
        if idle {
            debug_assert!(
                view.lock().is_empty(),
                "a view only reads held has no state"
            );
            view.forgotten.store(true, Ordering::Release);
            views.remove(&view.name);
        }
    }

    /// Publishes a run of events of `view`: journal appends and state updates under one hold
    /// of the view's lock and then the journal's (the order [`View::cut`] takes them in), so a
    /// cut sees all of the run or none of it. Does not wake anyone.
    ///
    /// Returns `false`, having done nothing, when the view was forgotten meanwhile.
    fn publish_run(&self, view: &View, events: &[GuestEvent], at_ms: u64) -> bool {
        let mut live = Vec::new();
        let mut state = view.lock();
        if view.forgotten.load(Ordering::Acquire) {
            return false;
        }
        let mut appender = self.journal.appender(&view.name, at_ms);
        for (i, event) in events.iter().enumerate() {
            let key = event.key.as_str();
            // A key that the run's next event sets again is left out of the state: nothing reads
            // the state between the two (the run holds its lock), and the next one replaces it.
            let superseded = events.get(i + 1).is_some_and(|next| next.key == event.key);
            let mut journaled = None;
            let appended = appender.append(key, |cursor| {
                let frame = frame::event(Some(cursor), event);
                let bytes = Arc::clone(frame.shared());
                journaled = Some(frame);
                Ok::<_, Infallible>(bytes)
            });
            let frame = match (appended, journaled) {
                (Ok(Some(_)), Some(frame)) => frame,
                _ => {
                    let frame = frame::event(None, event);
                    live.push((CompactString::new(key), frame.bytes().clone()));
                    frame
                }
            };
            match event.kind {
                _ if superseded => {}
                EventKind::Update => {
                    state.insert(CompactString::new(key), frame);
                }
                EventKind::Delete => {
                    state.remove(key);
                }
            }
        }
        drop(appender);
        drop(state);
        let stats = &self.stats;
        stats
            .published
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        stats
            .cursorless
            .fetch_add(live.len() as u64, Ordering::Relaxed);
        for live in live {
            // No receiver is fine: nobody is listening live.
            if let Some(sender) = view.live.get() {
                let _ = sender.send(live);
            }
        }
        true
    }

    /// Retires the view `name`: it is no longer listed or read, its streams end with a last
    /// `retired` event saying `reason`, and a gap on its tape makes every cursor issued so far
    /// reset, so that a view made again under this name never serves an old cursor for another
    /// event (its offsets go on after the last one, and after `lost` more a life of the server
    /// issued that this one does not hold: see
    /// [`JournalScope::report_loss`](viewtape_journal::JournalScope::report_loss)).
    pub fn retire(&self, name: &str, reason: &str, lost: u64) {
        let removed = self
            .views
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
        // Marked before the gap: a stream that meets the gap finds the view retired.
        if let Some(view) = &removed {
            let _ = view.retired.set(reason.to_owned());
        }
        self.journal.scope([name]).report_loss(lost);
        if let Some(view) = removed {
            view.wake_all();
            tracing::info!(view = name, reason, "view retired");
        }
    }

    /// Wakes every subscriber of every view, so each re-checks its cursor.
    pub fn wake_all(&self) {
        for view in self.views() {
            view.wake_all();
        }
    }

    /// Every lasting view's state, for a snapshot. Take it inside the consistency
    /// cut, with the journal's dump.
    pub fn dump_states(&self) -> Vec<ViewStateDump> {
        self.views()
            .iter()
            .filter(|view| view.lasting())
            .map(|view| ViewStateDump {
                view: view.name.clone(),
                entries: view.entries(),
            })
            .collect()
    }

    /// Replaces the journal and every view's state (a restore), then wakes
    /// every subscriber so each re-checks its cursor.
    ///
    /// The states are replaced before the journal: a state read in between
    /// pairs the new state with a cursor of the old epoch, which then fails
    /// closed (a reset), whereas the other order could pair the new epoch's
    /// cursor with the old state, silently, during a live restore.
    pub async fn restore(&self, journal: JournalSnapshot, exact: bool, states: Vec<ViewStateDump>) {
        for dump in states {
            let view = self.declare(&dump.view);
            *view.lock() = dump.entries.into_iter().collect();
        }
        self.journal.hydrate(journal, exact).await;
        self.wake_all();
    }
}

impl BatchSink for Hub {
    async fn commit(&self, _runtime: &str, batch: GuestBatch, at_ms: u64) {
        let mut touched: Vec<Arc<View>> = Vec::new();
        let mut events = &batch.events[..];
        while let Some(first) = events.first() {
            let view = match touched.iter().find(|v| v.name == *first.view) {
                Some(view) => Arc::clone(view),
                None => {
                    let view = self.declare(&first.view);
                    touched.push(Arc::clone(&view));
                    view
                }
            };
            let run = events
                .iter()
                .take(PUBLISH_RUN)
                .take_while(|event| event.view == first.view)
                .count();
            let (now, later) = events.split_at(run);
            if !self.publish_run(&view, now, at_ms) {
                // Forgotten meanwhile ([`Hub::forget_if_idle`]): published to its successor.
                touched.retain(|touched| !Arc::ptr_eq(touched, &view));
                continue;
            }
            events = later;
        }
        // One wake-up per view per batch, after every lock is released; narrowed subscribers
        // only for their keys.
        for view in touched {
            view.tick.send_modify(|tick| *tick += 1);
            view.keyed.wake(
                batch
                    .events
                    .iter()
                    .filter(|event| *event.view == *view.name)
                    .map(|event| (event.key.as_str(), event.key.len() + event.payload.len())),
            );
        }
    }

    fn misfit(&self, view: &str, schema: &ViewSchema) -> Option<Violation> {
        let view = self.view(view)?;
        let state = view.lock();
        state.iter().find_map(|(key, frame)| {
            let value = frame.value_json()?;
            schema.check(view.name(), key, &value).err()
        })
    }
}

#[cfg(test)]
mod tests;
