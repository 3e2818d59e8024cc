//! Parked subscribers and their view's passes: after a commit, a few tasks write the new frames
//! straight to the socket of every subscriber waiting at the head of the tape, instead of
//! waking a task per subscriber to read the tape, copy the frames and write them.
//!
//! ## Who may park
//!
//! A subscriber of every key, served by the lean HTTP/1.1 transport over plain TCP (it holds
//! the socket, [`SharedTcp`]), with nothing of its own left to send, that found nothing after its
//! cursor: it parks with that cursor, unless the tape moved on meanwhile. Its task then sleeps
//! on everything but the view's tick: a heartbeat, the token's expiry, a restore, the stop, a
//! cursorless frame, the pass waking it, and the client going away.
//!
//! ## The pass
//!
//! A view has one pass per worker thread, and parked subscribers join them in turn, so that the
//! writes after a commit run on every core at once. Woken by the view's tick, a pass reads the
//! frames after each cursor it finds among its parked subscribers (nearly always one: the head
//! before the commit) once, frames them as one HTTP/1.1 chunk once, and writes that chunk to
//! each socket without waiting. A subscriber whose
//! socket took it all stays parked at the new cursor. Any other outcome wakes its task, which
//! then does what it always does, with the stream's write timeout:
//!
//! - the socket took part of the chunk: the task writes the rest first;
//! - the socket took nothing, or failed: the task writes, waits or ends as its own write says;
//! - more than one chunk is due, a large frame that is sent shared, or a cursor the journal
//!   refuses: the task reads the tape itself (and is reset where it must be).
//!
//! The task always unparks before it writes anything itself, and the pass writes only to
//! subscribers still parked, under the same lock: the two never write to one socket at once, and
//! the stream's bytes stay in order.

use std::collections::HashMap;
use std::io::IoSlice;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::{Bytes, BytesMut};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::Instrument;
use viewtape_journal::Cursor;

use super::{Phase, Subscriber, MAX_CHUNK_BYTES, MAX_FRAMES_PER_CHUNK, SHARED_FRAME_BYTES};
use crate::hub::{Hub, View};
use crate::metrics::Metrics;
use crate::sse::socket::{chunk_head, write_all, SharedTcp};

/// The parked subscribers of one view and the task that writes to them.
#[derive(Debug)]
pub(super) struct Pass {
    view: Arc<View>,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    registry: Mutex<Registry>,
}

#[derive(Debug, Default)]
struct Registry {
    next: u64,
    parked: HashMap<u64, Arc<Parked>>,
    /// Whether the pass's task runs; it ends once no one is parked.
    running: bool,
}

/// One parked subscriber, shared by its task and the pass.
#[derive(Debug)]
pub(super) struct Parked {
    /// The pass it joined, and its key there.
    pass: Arc<Pass>,
    id: u64,
    socket: SharedTcp,
    slot: Mutex<Slot>,
    /// Wakes the subscriber's task.
    woken: Notify,
}

/// Where a parked subscriber stands.
#[derive(Debug)]
pub(super) struct Slot {
    /// Everything up to here is written (or in `rest`).
    pub(super) cursor: Cursor,
    /// When the pass last wrote to it.
    pub(super) sent_at: Instant,
    /// The end of a chunk the socket did not take whole: written first by the task.
    pub(super) rest: Option<Bytes>,
    /// The task was woken (or left): the pass no longer writes to it.
    woken: bool,
}

/// A subscriber's place among the parked: held by its task, given back by [`Pass::leave`].
/// One pointer, as every subscriber holds one while it waits.
#[derive(Debug)]
pub(super) struct Place(Arc<Parked>);

impl Place {
    /// Resolves when the pass wakes the subscriber.
    pub(super) async fn woken(&self) {
        self.0.woken.notified().await;
    }
}

/// What the pass does for subscribers parked at one cursor.
enum Due {
    /// Nothing after the cursor yet.
    Nothing,
    /// One chunk, framed: written to each socket.
    Chunk {
        bytes: Bytes,
        through: Cursor,
        frames: u64,
    },
    /// Their tasks take over.
    Wake,
}

impl Pass {
    pub(super) fn new(view: Arc<View>, hub: Arc<Hub>, metrics: Arc<Metrics>) -> Self {
        Self {
            view,
            hub,
            metrics,
            registry: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Parks a subscriber that found nothing after `cursor`, writing to `socket`; `None` when
    /// the tape has moved on since (it reads again).
    pub(super) fn park(
        self: &Arc<Self>,
        cursor: Cursor,
        socket: &SharedTcp,
        sent_at: Instant,
    ) -> Option<Place> {
        let mut registry = self.lock();
        // Subscribed before the head is looked at: a commit after that look ticks it.
        let ticks = (!registry.running).then(|| self.view.ticks());
        let window = self.hub.journal().window_now(self.view.name());
        if window.epoch != cursor.epoch() || window.next != cursor.offset().saturating_add(1) {
            return None;
        }
        let id = registry.next;
        registry.next += 1;
        let parked = Arc::new(Parked {
            pass: Arc::clone(self),
            id,
            socket: socket.clone(),
            slot: Mutex::new(Slot {
                cursor,
                sent_at,
                rest: None,
                woken: false,
            }),
            woken: Notify::new(),
        });
        registry.parked.insert(id, Arc::clone(&parked));
        if let Some(ticks) = ticks {
            registry.running = true;
            let span = tracing::debug_span!("fanout_pass", view = self.view.name());
            tokio::spawn(Arc::clone(self).run(ticks).instrument(span));
        }
        Some(Place(parked))
    }

    /// Takes a subscriber out: the pass writes nothing more to it. Returns where it stands.
    pub(super) fn leave(Place(parked): Place) -> Slot {
        parked.pass.lock().parked.remove(&parked.id);
        let mut slot = lock_slot(&parked);
        slot.woken = true;
        Slot {
            cursor: slot.cursor,
            sent_at: slot.sent_at,
            rest: slot.rest.take(),
            woken: true,
        }
    }

    /// Writes each commit's frames to the parked subscribers, until none is left.
    async fn run(self: Arc<Self>, mut ticks: watch::Receiver<u64>) {
        tracing::debug!("started");
        // The pass holds the view, and with it the tick's sender: the tick cannot close.
        while ticks.changed().await.is_ok() {
            let parked: Vec<Arc<Parked>> = {
                let mut registry = self.lock();
                if registry.parked.is_empty() {
                    registry.running = false;
                    tracing::debug!("no one parked; ended");
                    return;
                }
                registry.parked.values().cloned().collect()
            };
            self.write(&parked);
        }
        let mut registry = self.lock();
        registry.running = false;
        for parked in registry.parked.values() {
            wake(&mut lock_slot(parked), parked);
        }
    }

    /// One pass: what is due after each parked subscriber's cursor, written to its socket.
    fn write(&self, parked: &[Arc<Parked>]) {
        let mut due: Vec<(Cursor, Due)> = Vec::new();
        let now = Instant::now();
        let mut delivered = 0;
        // Written whole, partial, full, behind.
        let mut outcomes = [0u64; 4];
        for one in parked {
            let mut slot = lock_slot(one);
            if slot.woken {
                continue;
            }
            let cursor = slot.cursor;
            let index = match due.iter().position(|(at, _)| *at == cursor) {
                Some(index) => index,
                None => {
                    due.push((cursor, self.due_after(cursor)));
                    due.len() - 1
                }
            };
            match &due[index].1 {
                Due::Nothing => {}
                Due::Wake => {
                    outcomes[3] += 1;
                    wake(&mut slot, one);
                }
                Due::Chunk {
                    bytes,
                    through,
                    frames,
                } => match one.socket.try_write(bytes) {
                    Ok(written) => {
                        delivered += frames;
                        slot.cursor = *through;
                        slot.sent_at = now;
                        if written < bytes.len() {
                            outcomes[1] += 1;
                            slot.rest = Some(bytes.slice(written..));
                            wake(&mut slot, one);
                        } else {
                            outcomes[0] += 1;
                        }
                    }
                    // Full, or failing: its task waits for the socket, or ends, as it would.
                    Err(_) => {
                        outcomes[2] += 1;
                        wake(&mut slot, one);
                    }
                },
            }
        }
        self.metrics.delivered.inc_by(delivered);
        let pass = &self.metrics.pass;
        for (counter, n) in [&pass.written, &pass.partial, &pass.full, &pass.behind]
            .into_iter()
            .zip(outcomes)
        {
            counter.inc_by(n);
        }
    }

    /// What subscribers parked at `cursor` are due: the frames after it as one chunk, when they
    /// fit in one and none is sent shared.
    fn due_after(&self, cursor: Cursor) -> Due {
        let frames =
            match self
                .hub
                .journal()
                .frames_after(self.view.name(), &cursor, MAX_FRAMES_PER_CHUNK)
            {
                Ok(frames) => frames,
                Err(_) => return Due::Wake,
            };
        if frames.is_empty() {
            return Due::Nothing;
        }
        let len: usize = frames.iter().map(|frame| frame.len()).sum();
        if frames.len() == MAX_FRAMES_PER_CHUNK
            || len > MAX_CHUNK_BYTES
            || frames.iter().any(|frame| frame.len() >= SHARED_FRAME_BYTES)
        {
            return Due::Wake;
        }
        let head = chunk_head(len);
        let mut bytes = BytesMut::with_capacity(head.as_ref().len() + len + 2);
        bytes.extend_from_slice(head.as_ref());
        for frame in &frames {
            bytes.extend_from_slice(frame);
        }
        bytes.extend_from_slice(b"\r\n");
        Due::Chunk {
            bytes: bytes.freeze(),
            through: Cursor::new(
                cursor.epoch(),
                cursor.offset().saturating_add(frames.len() as u64),
            ),
            frames: frames.len() as u64,
        }
    }
}

fn lock_slot(parked: &Parked) -> MutexGuard<'_, Slot> {
    parked.slot.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Hands a parked subscriber back to its task.
fn wake(slot: &mut Slot, parked: &Parked) {
    slot.woken = true;
    parked.woken.notify_one();
}

impl Subscriber {
    /// Parks at `cursor`, where it found nothing to send, when it may (see the module docs);
    /// `false` when the tape moved on meanwhile and it should read again.
    pub(super) fn park(&mut self, cursor: Cursor) -> bool {
        let Some(socket) = &self.direct else {
            return true;
        };
        if !self.narrow.is_all()
            || self.until.is_some()
            || !self.pending.is_empty()
            || self.shared.is_some()
        {
            return true;
        }
        let pass = self.streams.pass(&self.view);
        self.place = pass.park(cursor, socket, self.sent_at);
        self.place.is_some()
    }

    /// Takes the subscriber out of its pass, if parked: it follows on from where the pass left
    /// it, after writing the rest of a chunk its socket did not take whole. A client that takes
    /// none of it within the write timeout ends the stream.
    pub(super) async fn unpark(&mut self) {
        let Some(place) = self.place.take() else {
            return;
        };
        let slot = Pass::leave(place);
        self.phase = Phase::Follow(slot.cursor);
        self.sent_at = slot.sent_at;
        let (Some(rest), Some(socket)) = (slot.rest, &self.direct) else {
            return;
        };
        let mut socket = socket.clone();
        let timeout = self.streams.write_timeout;
        // Boxed, with all it holds: rare, and an inline write would grow every subscriber's
        // future, idle ones too.
        let written = Box::pin(async move {
            let written = write_all(&mut socket, &mut [IoSlice::new(&rest)], timeout).await;
            if written.is_err() {
                // Half a chunk is out: nothing more may follow it on this connection.
                socket.shut_writes();
            }
            written
        });
        if let Err(error) = written.await {
            tracing::debug!(%error, "writing the rest of a chunk failed; the stream ends");
            self.phase = Phase::Done;
        }
    }
}
