//! One SSE subscriber: replay after its cursor, or the view's state, then
//! live — as one stream of coalesced chunks.
//!
//! ## Phases
//!
//! A subscriber starts in one of three ways: with a valid cursor it follows
//! the tape right after it; without one it first receives the view's state
//! (`event: state` entries, then `event: synced` carrying the state's cursor)
//! or, with `?from=tape`, the whole retained tape; with a cursor the journal
//! refuses it receives `event: reset` and then the state. Following means
//! reading frames after its cursor from the shared tape whenever the view
//! ticks (a narrowed subscriber: whenever a commit touches one of its keys). A subscriber that falls out of the window, or whose epoch is
//! replaced by a restore, is reset the same way: never a silent skip.
//!
//! ## Coalescing, and what a stalled client costs
//!
//! Small frames are copied together into one chunk of at most [`MAX_CHUNK_BYTES`]
//! (and [`MAX_FRAMES_PER_CHUNK`] frames): one write per wake-up instead of one
//! per event. A frame of [`SHARED_FRAME_BYTES`] or more is never copied: it goes
//! out as its own chunk, sharing the bytes the tape and the view's state hold.
//! A subscriber holds at most one chunk while its client is not reading, so
//! whatever the size of the state or the frames, a client that stops reading
//! costs at most [`MAX_CHUNK_BYTES`] beyond the frames it shares, until the
//! transport's write timeout drops it.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use tokio::sync::{broadcast, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use viewtape_journal::{CompactString, Cursor, FramesWhere, ReplayError};

use crate::config::ServerConfig;
use crate::frame::{self, ResetReason};
use crate::hub::{Hub, KeyWake, StateCut, View};
use crate::metrics::Metrics;
use crate::narrow::Narrow;

/// Frames per chunk, and state entries per chunk during a state transfer.
/// Tests use a tiny chunk so that disconnects land inside state transfers.
pub const MAX_FRAMES_PER_CHUNK: usize = if cfg!(test) { 3 } else { 512 };
/// Most bytes copied into one chunk.
pub const MAX_CHUNK_BYTES: usize = 16 * 1024;
/// Frames at least this large are written from their shared bytes, never copied.
pub const SHARED_FRAME_BYTES: usize = 4 * 1024;

/// How the stream begins.
#[derive(Debug)]
pub enum Start {
    /// A cursor the client sent; checked against the journal.
    Cursor(Cursor),
    /// A `Last-Event-ID`/`?cursor=` text that is not a cursor.
    Malformed,
    /// No cursor: the state, then live.
    State,
    /// No cursor, `?from=tape`: the whole retained tape, then live.
    Tape,
}

enum Phase {
    /// Sending state entries; `synced` with the cut's cursor comes last.
    State {
        cut: StateCut,
        sent: usize,
    },
    /// Following the tape after this cursor.
    Follow(Cursor),
    Done,
}

/// Opens subscribers: what every stream shares — the hub, the connection limit and the
/// stream settings.
#[derive(Debug)]
pub struct Streams {
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
    heartbeat: Duration,
    retry: Duration,
    reconnect_spread: Duration,
    /// Streams ended by the stop so far: the index of the next one's hint in the spread.
    stopped: AtomicU64,
    permits: Arc<Semaphore>,
    max_connections: usize,
}

/// Why a stream could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The view does not exist.
    #[error("no such view")]
    NoSuchView,
    /// Every SSE connection permit is taken.
    #[error("too many SSE connections (limit {limit})")]
    Full {
        /// `[server] max_connections`.
        limit: usize,
    },
}

impl Streams {
    /// Streams over `hub` with `config`'s limit, heartbeat and retry hint; every stream ends
    /// when `shutdown` turns `true`.
    pub fn new(
        hub: Arc<Hub>,
        metrics: Arc<Metrics>,
        config: &ServerConfig,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            hub,
            metrics,
            shutdown,
            heartbeat: config.heartbeat,
            retry: config.retry,
            reconnect_spread: config.reconnect_spread,
            stopped: AtomicU64::new(0),
            permits: Arc::new(Semaphore::new(config.max_connections)),
            max_connections: config.max_connections,
        }
    }

    /// A subscriber of `view`, starting as `start` says, reading the keys `narrow` takes.
    ///
    /// The stream ends at `expires_at` (Unix seconds: the reader's token's `exp`) with a last
    /// `event: reauth` and no `id`; the client reconnects with a fresh token and its cursor.
    ///
    /// # Errors
    /// [`OpenError::NoSuchView`], or [`OpenError::Full`] past `max_connections`.
    pub fn open(
        self: &Arc<Self>,
        view: &str,
        start: Start,
        narrow: Narrow,
        expires_at: Option<u64>,
    ) -> Result<Subscriber, OpenError> {
        let view = self.hub.view(view).ok_or(OpenError::NoSuchView)?;
        let permit = Arc::clone(&self.permits).try_acquire_owned().map_err(|_| {
            self.metrics.connections_refused.inc();
            OpenError::Full {
                limit: self.max_connections,
            }
        })?;
        tracing::debug!(view = view.name(), ?start, ?narrow, "subscribed");
        let mut subscriber = Subscriber::new(Arc::clone(self), view, start, narrow, permit);
        subscriber.expiry = expires_at.map(|exp| {
            let left = exp.saturating_sub(crate::log::unix_ms_now() / 1000);
            // Far-future `exp` (up to 2^64 - 1) must not overflow the clock: a century is forever.
            Box::pin(tokio::time::sleep(Duration::from_secs(
                left.min(100 * 365 * 86_400),
            )))
        });
        Ok(subscriber)
    }
}

impl Streams {
    /// The `retry:` hint that ends the `n`-th stream stopped: the `n`-th point of the golden-ratio
    /// sequence over `[0, reconnect_spread)`, so that any number of streams ended together come
    /// back evenly spread over the window, however many there are.
    fn stop_hint(&self) -> Bytes {
        let n = self.stopped.fetch_add(1, Ordering::Relaxed);
        Bytes::from(format!(
            "retry: {}\n\n",
            spread_point(n, self.reconnect_spread).as_millis()
        ))
    }
}

/// The `n`-th point of the golden-ratio (Weyl) sequence, scaled to `[0, window)`: each prefix of
/// it is close to evenly spread over the window.
fn spread_point(n: u64, window: Duration) -> Duration {
    const GOLDEN: f64 = 0.618_033_988_749_894_9;
    let fraction = (n as f64 * GOLDEN).fract();
    window.mul_f64(fraction)
}

/// Everything one subscriber holds. Dropped when the client goes away.
pub struct Subscriber {
    streams: Arc<Streams>,
    view: Arc<View>,
    wake: Wake,
    invalidations: watch::Receiver<u64>,
    live: broadcast::Receiver<(CompactString, Bytes)>,
    shutdown: watch::Receiver<bool>,
    /// The keys it reads: it passes over the tape's other events.
    narrow: Narrow,
    phase: Phase,
    /// Bytes to send before anything else (retry hint, reset).
    pending: BytesMut,
    /// A large frame to send, shared, right after the chunk being sent.
    shared: Option<Bytes>,
    /// When the reader's token expires: the stream ends with `event: reauth`.
    expiry: Option<Pin<Box<Sleep>>>,
    /// Due when nothing was sent for a heartbeat's time; armed once, moved on lazily (a busy
    /// stream touches no timer per chunk).
    heartbeat: Pin<Box<Sleep>>,
    /// When the last chunk was sent.
    sent_at: tokio::time::Instant,
    /// `?until=head`: the view's window at open; the stream ends once it has delivered
    /// everything before its `next`.
    until: Option<viewtape_journal::ReplayWindow>,
    _permit: OwnedSemaphorePermit,
}

/// The last event of a stream whose token expired (no `id`: the client's cursor stays where it
/// was).
const REAUTH: &[u8] = b"event: reauth\ndata: {\"reason\":\"the token expired; reconnect with a fresh one and your cursor\"}\n\n";

impl Subscriber {
    fn new(
        streams: Arc<Streams>,
        view: Arc<View>,
        start: Start,
        narrow: Narrow,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        let (hub, metrics) = (&streams.hub, &streams.metrics);
        // Registered before the tape is first read: nothing committed after that read is missed.
        let wake = match narrow.is_all() {
            true => {
                let mut ticks = view.ticks();
                ticks.borrow_and_update();
                Wake::View(ticks)
            }
            false => Wake::Keys(view.key_wake(&narrow)),
        };
        let mut invalidations = hub.journal().invalidations();
        invalidations.borrow_and_update();
        let live = view.live();
        let mut pending =
            BytesMut::from(format!("retry: {}\n\n", streams.retry.as_millis()).as_bytes());
        let journal = hub.journal();
        let phase = match start {
            Start::Cursor(cursor) => match journal.frames_after(view.name(), &cursor, 0) {
                Ok(_) | Err(ReplayError::Disabled) => {
                    metrics.resumes.inc();
                    Phase::Follow(cursor)
                }
                Err(error) => reset_to_state(
                    hub,
                    &view,
                    &narrow,
                    metrics,
                    ResetReason::Replay(&error),
                    &mut pending,
                ),
            },
            Start::Malformed => reset_to_state(
                hub,
                &view,
                &narrow,
                metrics,
                ResetReason::Malformed,
                &mut pending,
            ),
            Start::State => {
                metrics.state_starts.inc();
                Phase::State {
                    cut: view.cut(journal, &narrow),
                    sent: 0,
                }
            }
            Start::Tape => {
                // Following from just before the first retained record
                // replays the whole tape — or, when it holds a gap, the
                // tape since the newest gap.
                let window = journal.window_now(view.name());
                let mut cursor = Cursor::new(window.epoch, window.first - 1);
                if let Err(ReplayError::Gap { resume_from, .. }) =
                    journal.frames_after(view.name(), &cursor, 0)
                {
                    cursor = Cursor::new(window.epoch, resume_from);
                }
                Phase::Follow(cursor)
            }
        };
        metrics.connections.inc();
        view.count_subscriber(true);
        let shutdown = streams.shutdown.clone();
        let heartbeat = Box::pin(tokio::time::sleep(streams.heartbeat));
        Self {
            streams,
            view,
            wake,
            invalidations,
            live,
            shutdown,
            narrow,
            phase,
            pending,
            shared: None,
            expiry: None,
            heartbeat,
            sent_at: tokio::time::Instant::now(),
            until: None,
            _permit: permit,
        }
    }

    /// Ends the stream once it has delivered everything up to the view's head as it is now
    /// (`?until=head`): right after `synced` for a state transfer, after the last retained
    /// event for a cursor or the tape. A reset to another epoch ends it after that state.
    #[must_use]
    pub fn until_head(mut self) -> Self {
        self.until = Some(self.streams.hub.journal().window_now(self.view.name()));
        self
    }

    /// Whether a `?until=head` stream following after `cursor` has delivered everything.
    fn reached_head(&self, cursor: &Cursor) -> bool {
        self.until.as_ref().is_some_and(|head| {
            cursor.epoch() != head.epoch || cursor.offset().saturating_add(1) >= head.next
        })
    }

    /// The response body.
    pub fn into_stream(self) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
        futures_util::stream::unfold(self, |mut subscriber| async move {
            let chunk = subscriber.next_chunk().await?;
            subscriber.sent_at = tokio::time::Instant::now();
            Some((Ok(chunk), subscriber))
        })
    }

    /// The next bytes to write, or `None` to end the stream.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if *self.shutdown.borrow() && !matches!(self.phase, Phase::Done) {
                // The server stops: the stream ends now, whatever it was sending, with a hint
                // that spreads its client's reconnect over the window.
                self.phase = Phase::Done;
                self.shared = None;
                return Some(self.streams.stop_hint());
            }
            if let Some(frame) = self.shared.take() {
                return Some(frame);
            }
            if self
                .expiry
                .as_ref()
                .is_some_and(|expiry| expiry.deadline() <= tokio::time::Instant::now())
                && !matches!(self.phase, Phase::Done)
            {
                self.phase = Phase::Done;
                return Some(Bytes::from_static(REAUTH));
            }
            match &mut self.phase {
                Phase::Done => return None,
                Phase::State { cut, sent } => {
                    let mut out = std::mem::take(&mut self.pending);
                    let end = cut.entries.len().min(*sent + MAX_FRAMES_PER_CHUNK);
                    while *sent < end {
                        let [head, data] = cut.entries[*sent].state_parts();
                        if data.len() >= SHARED_FRAME_BYTES {
                            out.extend_from_slice(&head);
                            self.shared = Some(data);
                            *sent += 1;
                            break;
                        }
                        if !out.is_empty() && out.len() + head.len() + data.len() > MAX_CHUNK_BYTES
                        {
                            break;
                        }
                        out.extend_from_slice(&head);
                        out.extend_from_slice(&data);
                        *sent += 1;
                    }
                    if *sent == cut.entries.len() && self.shared.is_none() {
                        out.extend_from_slice(&frame::synced(cut.cursor, cut.entries.len()));
                        self.phase = Phase::Follow(cut.cursor);
                    }
                    return Some(out.freeze());
                }
                Phase::Follow(cursor) => {
                    let cursor = *cursor;
                    if self.reached_head(&cursor) {
                        self.phase = Phase::Done;
                        if !self.pending.is_empty() {
                            return Some(std::mem::take(&mut self.pending).freeze());
                        }
                        continue;
                    }
                    let narrow = &self.narrow;
                    match self.streams.hub.journal().frames_after_where(
                        self.view.name(),
                        &cursor,
                        MAX_FRAMES_PER_CHUNK,
                        |key| narrow.keeps(key),
                    ) {
                        Ok(found) if !found.frames.is_empty() => {
                            let mut out = std::mem::take(&mut self.pending);
                            let mut taken = 0;
                            // Past the last frame taken; past every record looked at when all
                            // were taken (a narrowed stream passes over the others).
                            let mut through = cursor.offset();
                            for (offset, frame) in &found.frames {
                                if frame.len() >= SHARED_FRAME_BYTES {
                                    if out.is_empty() {
                                        self.shared = Some(Bytes::clone(frame));
                                        taken += 1;
                                        through = *offset;
                                    }
                                    break;
                                }
                                if !out.is_empty() && out.len() + frame.len() > MAX_CHUNK_BYTES {
                                    break;
                                }
                                out.extend_from_slice(frame);
                                taken += 1;
                                through = *offset;
                            }
                            if taken == found.frames.len() {
                                through = found.through.unwrap_or(through);
                            }
                            self.streams.metrics.delivered.inc_by(taken as u64);
                            self.phase = Phase::Follow(Cursor::new(cursor.epoch(), through));
                            return match self.shared.take() {
                                Some(frame) if out.is_empty() => Some(frame),
                                shared => {
                                    self.shared = shared;
                                    Some(out.freeze())
                                }
                            };
                        }
                        // Records, none of them for this stream's keys: passed over.
                        Ok(FramesWhere {
                            through: Some(through),
                            ..
                        }) => self.phase = Phase::Follow(Cursor::new(cursor.epoch(), through)),
                        Ok(_) => {
                            if !self.pending.is_empty() {
                                return Some(std::mem::take(&mut self.pending).freeze());
                            }
                            if let Some(chunk) = self.wait().await {
                                return Some(chunk);
                            }
                        }
                        Err(ReplayError::Disabled) => {
                            // No tape: live frames come only through the
                            // cursorless feed.
                            if !self.pending.is_empty() {
                                return Some(std::mem::take(&mut self.pending).freeze());
                            }
                            if let Some(chunk) = self.wait().await {
                                return Some(chunk);
                            }
                        }
                        Err(error) => self.reset(ResetReason::Replay(&error)),
                    }
                }
            }
        }
    }

    /// Switches to a state transfer after telling the client why.
    fn reset(&mut self, reason: ResetReason<'_>) {
        self.phase = reset_to_state(
            &self.streams.hub,
            &self.view,
            &self.narrow,
            &self.streams.metrics,
            reason,
            &mut self.pending,
        );
    }

    /// Waits for the tape to move, a cursorless frame, a heartbeat or
    /// shutdown. Returns a chunk to send, or `None` to re-check the tape.
    async fn wait(&mut self) -> Option<Bytes> {
        // A closed channel means the hub or the server is going away.
        let closed = tokio::select! {
            closed = self.wake.changed() => closed,
            changed = self.invalidations.changed() => changed.is_err(),
            changed = self.shutdown.changed() => changed.is_err(),
            received = self.live.recv() => match received {
                Ok((key, frame)) if self.narrow.keeps(&key) => {
                    self.streams.metrics.delivered.inc();
                    return Some(frame);
                }
                Ok(_) => false,
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    self.reset(ResetReason::Lagged);
                    false
                }
                Err(broadcast::error::RecvError::Closed) => true,
            },
            () = self.heartbeat.as_mut() => {
                let now = tokio::time::Instant::now();
                let due = self.sent_at + self.streams.heartbeat;
                if due > now {
                    self.heartbeat.as_mut().reset(due);
                    false
                } else {
                    self.heartbeat.as_mut().reset(now + self.streams.heartbeat);
                    return Some(Bytes::from_static(b": heartbeat\n\n"));
                }
            }
            () = fired(&mut self.expiry) => false,
        };
        if closed {
            self.phase = Phase::Done;
        }
        None
    }
}

/// What wakes a subscriber to read the tape again.
enum Wake {
    /// Every commit to the view.
    View(watch::Receiver<u64>),
    /// Commits that touch the keys it reads.
    Keys(KeyWake),
}

impl Wake {
    /// Resolves at the next wake-up; `true` when the view is gone.
    async fn changed(&mut self) -> bool {
        match self {
            Self::View(ticks) => ticks.changed().await.is_err(),
            Self::Keys(keys) => {
                keys.changed().await;
                false
            }
        }
    }
}

/// Waits until `timer` fires; forever without one.
async fn fired(timer: &mut Option<Pin<Box<Sleep>>>) {
    match timer {
        Some(timer) => timer.as_mut().await,
        None => std::future::pending().await,
    }
}

/// Queues `event: reset` (reason and window) and returns the state-transfer
/// phase that follows it.
fn reset_to_state(
    hub: &Hub,
    view: &View,
    narrow: &Narrow,
    metrics: &Metrics,
    reason: ResetReason<'_>,
    pending: &mut BytesMut,
) -> Phase {
    let journal = hub.journal();
    let window = journal.window_now(view.name());
    pending.extend_from_slice(&frame::reset(reason, &window));
    metrics.count_reset(reason.as_str());
    Phase::State {
        cut: view.cut(journal, narrow),
        sent: 0,
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.streams.metrics.connections.dec();
        self.view.count_subscriber(false);
    }
}

#[cfg(test)]
mod tests {
    //! A client that applies what it receives — across random publishes,
    //! deletes, disconnects (also in the middle of a state transfer), resets
    //! by restore and gaps — always ends equal to the view's state at the
    //! same cursor.

    use std::collections::BTreeMap;

    use futures_util::StreamExt;
    use proptest::prelude::*;
    use viewtape_journal::{EventJournal, JournalConfig};

    use super::*;
    use crate::host::{EventKind, GuestBatch, GuestEvent};
    use crate::runtime::BatchSink;

    #[test]
    fn stop_hints_spread_any_number_of_streams_evenly_over_the_window() {
        let window = Duration::from_secs(5);
        for streams in [10usize, 100, 1_000, 10_000] {
            let buckets = 10;
            let mut counts = vec![0usize; buckets];
            for n in 0..streams as u64 {
                let hint = spread_point(n, window);
                assert!(hint < window, "{hint:?}");
                counts[(hint.as_secs_f64() / window.as_secs_f64() * buckets as f64) as usize] += 1;
            }
            let even = streams / buckets;
            for count in counts {
                assert!(
                    count.abs_diff(even) <= 1 + even / 10,
                    "{streams} streams: {count} in a bucket, {even} even"
                );
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Publish(Vec<(u8, Option<u8>)>),
        Read(usize),
        Disconnect,
        Gap,
        Restore,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => prop::collection::vec((0..12u8, prop::option::weighted(0.8, 0..100u8)), 1..6).prop_map(Op::Publish),
            4 => (1..6usize).prop_map(Op::Read),
            2 => Just(Op::Disconnect),
            1 => Just(Op::Gap),
            1 => Just(Op::Restore),
        ]
    }

    /// The state a client builds, like the demo page does.
    #[derive(Default)]
    struct Client {
        state: BTreeMap<String, String>,
        incoming: Option<BTreeMap<String, String>>,
        last_id: String,
        resets: usize,
    }

    impl Client {
        fn apply(&mut self, chunk: &[u8]) {
            let text = std::str::from_utf8(chunk).unwrap();
            for block in text.split("\n\n").filter(|b| !b.is_empty()) {
                let (mut id, mut event, mut data) = (None, "message", String::new());
                for line in block.lines() {
                    if line == "id" {
                        id = Some(String::new());
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        event = v;
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                if let Some(id) = id {
                    self.last_id = id;
                }
                let json: serde_json::Value = match data.as_str() {
                    "" => serde_json::Value::Null,
                    d => serde_json::from_str(d).unwrap(),
                };
                let key = json["key"].as_str().map(str::to_owned);
                match event {
                    "update" => {
                        self.state.insert(key.unwrap(), json["value"].to_string());
                    }
                    "delete" => {
                        self.state.remove(&key.unwrap());
                    }
                    "reset" => {
                        self.resets += 1;
                        self.incoming = Some(BTreeMap::new());
                    }
                    "state" => {
                        self.incoming
                            .get_or_insert_with(BTreeMap::new)
                            .insert(key.unwrap(), json["value"].to_string());
                    }
                    "synced" => self.state = self.incoming.take().unwrap_or_default(),
                    _ => {}
                }
            }
        }
    }

    fn connect(
        hub: &Arc<Hub>,
        client: &Client,
        narrow: &Narrow,
        shutdown: &watch::Receiver<bool>,
    ) -> futures_util::stream::BoxStream<'static, Result<Bytes, std::convert::Infallible>> {
        let start = match client.last_id.as_str() {
            "" => Start::State,
            id => id.parse().map_or(Start::Malformed, Start::Cursor),
        };
        let config = ServerConfig {
            heartbeat: Duration::from_secs(3600),
            retry: Duration::from_secs(1),
            ..ServerConfig::default()
        };
        let streams = Arc::new(Streams::new(
            Arc::clone(hub),
            Arc::new(Metrics::new(
                Arc::clone(hub),
                Arc::default(),
                &crate::log::LogMetrics::default(),
            )),
            &config,
            shutdown.clone(),
        ));
        streams
            .open("v", start, narrow.clone(), None)
            .unwrap()
            .into_stream()
            .boxed()
    }

    /// Reads every chunk that is ready without waiting for new events.
    async fn read_ready(
        stream: &mut futures_util::stream::BoxStream<
            'static,
            Result<Bytes, std::convert::Infallible>,
        >,
        client: &mut Client,
        max: usize,
    ) {
        for _ in 0..max {
            match tokio::time::timeout(Duration::from_millis(20), stream.next()).await {
                Ok(Some(Ok(chunk))) => client.apply(&chunk),
                _ => break,
            }
        }
    }

    /// A narrowed subscriber is woken only by its keys, yet never falls off a tape that rolls
    /// over under the other keys' records: it gets its key's next update, not a reset.
    #[tokio::test]
    async fn a_narrowed_subscriber_sleeps_through_other_keys_and_the_tape_rolling_over() {
        let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(JournalConfig {
            max_records_per_view: 40,
            ..JournalConfig::default()
        }))));
        hub.declare("v");
        let commit = |keys: Vec<String>| {
            let hub = Arc::clone(&hub);
            async move {
                let events = keys
                    .into_iter()
                    .map(|key| GuestEvent {
                        view: Arc::from("v"),
                        key,
                        kind: EventKind::Update,
                        payload: Bytes::from_static(b"1"),
                    })
                    .collect();
                let now = crate::log::unix_ms_now();
                hub.commit("test", GuestBatch::of_events(events), now).await;
            }
        };
        commit(vec!["A".into()]).await;
        let (_shutdown_tx, shutdown) = watch::channel(false);
        let mut client = Client::default();
        let narrow = Narrow::Keys(["A".to_owned()].into());
        let mut stream = connect(&hub, &client, &narrow, &shutdown);
        read_ready(&mut stream, &mut client, 10).await;
        assert_eq!(client.state.len(), 1);
        // 400 records of other keys, ten tapes' worth, one at a time: nothing for it to send
        // (polled after each, as its task would be run when woken).
        for i in 0..400 {
            commit(vec![format!("B{i}")]).await;
            let idle = tokio::time::timeout(Duration::from_millis(1), stream.next()).await;
            assert!(idle.is_err(), "woken with something to send: {idle:?}");
        }
        commit(vec!["A".into(), "C".into()]).await;
        read_ready(&mut stream, &mut client, 10).await;
        assert_eq!(client.resets, 0, "reset although it never fell behind");
        let window = hub.journal().window_now("v");
        assert_eq!(
            client.last_id,
            Cursor::new(window.epoch, window.next - 2).to_string()
        );
    }

    #[tokio::test]
    async fn large_frames_go_out_shared_and_small_ones_coalesce_within_the_cap() {
        let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(
            JournalConfig::default(),
        ))));
        hub.declare("v");
        let publish = |key: &str, size: usize| GuestEvent {
            view: Arc::from("v"),
            key: key.to_owned(),
            kind: EventKind::Update,
            payload: Bytes::from(format!("\"{}\"", "x".repeat(size))),
        };
        let events = vec![publish("a", 10), publish("big", 20_000), publish("c", 10)];
        hub.commit(
            "test",
            GuestBatch::of_events(events),
            crate::log::unix_ms_now(),
        )
        .await;
        let (_shutdown_tx, shutdown) = watch::channel(false);
        let mut stream = connect(&hub, &Client::default(), &Narrow::All, &shutdown);
        let big_state = hub.view("v").unwrap().entries();
        let big_state = &big_state.iter().find(|(k, _)| k == "big").unwrap().1;
        let mut chunks = Vec::new();
        while !chunks
            .iter()
            .any(|c: &Bytes| c.windows(13).any(|w| w == b"event: synced"))
        {
            chunks.push(stream.next().await.unwrap().unwrap());
        }
        // The big entry's data lines are the view state's own bytes, not a copy.
        let [_, data] = big_state.state_parts();
        assert!(chunks
            .iter()
            .any(|c| c.as_ptr() == data.as_ptr() && c.len() == data.len()));
        assert!(chunks
            .iter()
            .all(|c| c.len() <= MAX_CHUNK_BYTES || c.as_ptr() == data.as_ptr()));

        // Following: a big frame is the tape's frame itself; small ones stay within the cap.
        let mut events = vec![publish("big", 30_000)];
        events.extend((0..400).map(|i| publish(&format!("s{i}"), 100)));
        hub.commit(
            "test",
            GuestBatch::of_events(events),
            crate::log::unix_ms_now(),
        )
        .await;
        let window = hub.journal().window_now("v");
        let tape = hub
            .journal()
            .frames_after("v", &Cursor::new(window.epoch, 3), 1)
            .unwrap();
        let mut live = Vec::new();
        let mut text = 0;
        while text < 400 {
            let chunk = stream.next().await.unwrap().unwrap();
            text += chunk.windows(13).filter(|w| *w == b"event: update").count();
            live.push(chunk);
        }
        assert_eq!(
            live[0].as_ptr(),
            tape[0].as_ptr(),
            "the big frame is shared"
        );
        assert!(live[1..].iter().all(|c| c.len() <= MAX_CHUNK_BYTES));
        assert!(
            live.len() > 2,
            "400 small frames of ~130 B do not fit one chunk"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Full or narrowed (keys, a prefix), through disconnections, gaps and restores.
        #[test]
        fn a_client_that_applies_the_stream_matches_the_state(
            ops in prop::collection::vec(op(), 1..40),
            narrow in prop_oneof![
                Just(Narrow::All),
                Just(Narrow::Keys(["k0".to_owned(), "k7".to_owned()].into())),
                Just(Narrow::Prefix("k1".to_owned())),
            ],
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            rt.block_on(async {
                let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(JournalConfig::default()))));
                hub.declare("v");
                let (_shutdown_tx, shutdown) = watch::channel(false);
                let mut client = Client::default();
                let mut stream = connect(&hub, &client, &narrow, &shutdown);
                for op in ops {
                    match op {
                        Op::Publish(events) => {
                            let events = events.into_iter().map(|(key, value)| GuestEvent {
                                view: Arc::from("v"),
                                key: format!("k{key}"),
                                kind: if value.is_some() { EventKind::Update } else { EventKind::Delete },
                                payload: value.map(|v| Bytes::from(format!("{{\"v\":{v}}}"))).unwrap_or_default(),
                            }).collect();
                            hub.commit("test", GuestBatch::of_events(events), crate::log::unix_ms_now())
            .await;
                        }
                        Op::Read(chunks) => read_ready(&mut stream, &mut client, chunks).await,
                        Op::Disconnect => {
                            client.incoming = None;
                            stream = connect(&hub, &client, &narrow, &shutdown);
                        }
                        Op::Gap => hub.journal().mark_gap().await,
                        Op::Restore => {
                            let dump = hub.journal().dump().await;
                            hub.restore(dump, false, hub.dump_states()).await;
                        }
                    }
                }
                read_ready(&mut stream, &mut client, 10_000).await;
                let cut = hub.view("v").unwrap().cut(hub.journal(), &narrow);
                if narrow.is_all() {
                    prop_assert_eq!(&client.last_id, &cut.cursor.to_string(), "the client reached the head");
                }
                let mut member = BytesMut::from(&b"{"[..]);
                for (i, frame) in cut.entries.iter().enumerate() {
                    if i > 0 {
                        member.extend_from_slice(b",");
                    }
                    frame.put_json_member(&mut member);
                }
                member.extend_from_slice(b"}");
                let object: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&member).unwrap();
                let expected: BTreeMap<String, String> =
                    object.into_iter().map(|(key, value)| (key, value.to_string())).collect();
                prop_assert_eq!(client.state, expected);
                Ok(())
            })?;
        }
    }
}
