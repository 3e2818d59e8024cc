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
//! ## Parked at the head
//!
//! A subscriber of every key whose socket the lean transport shares with it (HTTP/1.1 over plain
//! TCP) parks once it has caught up: it no longer wakes at each commit, and the view's passes
//! (one per worker thread, each with its share of the parked) write the commit's frames, framed
//! once, to every parked socket. Anything else — a socket that does not take the whole chunk,
//! more than a chunk due, a heartbeat, a restore, the stop — hands it back to its own task,
//! which goes on as below (see `direct`).
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
//!
//! | file | job |
//! |---|---|
//! | this one | [`Streams`]: subscribers opened within the limit, stop hints; [`Subscriber`] |
//! | `subscriber` | a subscriber's start (cursor, state or tape), `?until=head`, resets, its end |
//! | `chunk` | the next chunk: the state's entries, then the tape's frames, copied or shared |
//! | `wake` | waiting: the tape moves, a cursorless frame, a heartbeat, the token expires, a stop |
//! | `direct` | parked at the head: the view's pass writes each commit's frames to the socket |
//! | [`socket`] | a TCP connection written by its transport and the fan-out pass in turn; HTTP/1.1 chunks |
//! | `tests` | a client that applies the stream ends equal to the view's state; chunk sizes |

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::{broadcast, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use viewtape_journal::{CompactString, Cursor};

use crate::config::ServerConfig;
use crate::hub::narrow::Narrow;
use crate::hub::{Hub, ReadHold, StateCut, View};
use crate::metrics::Metrics;
use crate::sse::socket::SharedTcp;

mod chunk;
mod direct;
pub mod socket;
mod subscriber;
#[cfg(test)]
mod tests;
mod wake;

use direct::{Pass, Place};
use wake::Wake;

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
    /// Time a client may accept no bytes of a chunk before its stream ends.
    write_timeout: Duration,
    /// Each view's passes, once a subscriber has parked: one per worker thread, each writing
    /// to its share of the parked subscribers, so that a commit reaches them on every core.
    passes: std::sync::Mutex<HashMap<String, Arc<[Arc<Pass>]>>>,
    /// Parks so far: the next one's pass, round the view's passes.
    parks: AtomicUsize,
    /// Streams ended by the stop so far: the index of the next one's hint in the spread.
    stopped: AtomicU64,
    permits: Arc<Semaphore>,
    max_connections: usize,
}

/// Why a stream could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
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
            write_timeout: config.write_timeout,
            passes: std::sync::Mutex::default(),
            parks: AtomicUsize::new(0),
            stopped: AtomicU64::new(0),
            permits: Arc::new(Semaphore::new(config.max_connections)),
            max_connections: config.max_connections,
        }
    }

    /// A subscriber of the view `view` holds, starting as `start` says, reading the keys `narrow`
    /// takes; it holds the view until it ends.
    ///
    /// The stream ends at `expires_at` (Unix seconds: the reader's token's `exp`) with a last
    /// `event: reauth` and no `id`; the client reconnects with a fresh token and its cursor.
    ///
    /// # Errors
    /// [`OpenError::Full`] past `max_connections`.
    pub fn open(
        self: &Arc<Self>,
        view: ReadHold,
        start: Start,
        narrow: Narrow,
        expires_at: Option<u64>,
    ) -> Result<Subscriber, OpenError> {
        let permit = Arc::clone(&self.permits).try_acquire_owned().map_err(|_| {
            self.metrics.connections_refused.inc();
            OpenError::Full {
                limit: self.max_connections,
            }
        })?;
        tracing::debug!(view = view.view().name(), ?start, ?narrow, "subscribed");
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
    /// The pass of `view` the next subscriber to park joins.
    fn pass(&self, view: &Arc<View>) -> Arc<Pass> {
        let mut passes = self
            .passes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let shares = match passes.get(view.name()) {
            Some(shares) => shares,
            None => {
                let workers = tokio::runtime::Handle::try_current()
                    .map_or(1, |runtime| runtime.metrics().num_workers());
                let shares = (0..workers.max(1))
                    .map(|_| {
                        Arc::new(Pass::new(
                            Arc::clone(view),
                            Arc::clone(&self.hub),
                            Arc::clone(&self.metrics),
                        ))
                    })
                    .collect();
                passes.entry(view.name().to_owned()).or_insert(shares)
            }
        };
        let next = self.parks.fetch_add(1, Ordering::Relaxed);
        Arc::clone(&shares[next % shares.len()])
    }

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
    /// Boxed: few streams have one, and every stream's future carries the field.
    until: Option<Box<viewtape_journal::ReplayWindow>>,
    /// The socket of a stream the lean transport serves over plain TCP: the view's pass may
    /// write to it while the subscriber is parked.
    direct: Option<SharedTcp>,
    /// Its place among the view's parked subscribers, while parked.
    place: Option<Place>,
    /// Holds `view` while the stream lasts: a view only reads made is not forgotten under it.
    _hold: ReadHold,
    _permit: OwnedSemaphorePermit,
}
