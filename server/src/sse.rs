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
//! ticks. A subscriber that falls out of the window, or whose epoch is
//! replaced by a restore, is reset the same way: never a silent skip.
//!
//! ## Coalescing
//!
//! Each chunk handed to the socket holds up to [`MAX_FRAMES_PER_CHUNK`]
//! frames: one write syscall per wake-up instead of one per event.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use tokio::sync::{broadcast, watch, OwnedSemaphorePermit};
use viewtape_journal::{Cursor, ReplayError};

use crate::frame::{self, ResetReason};
use crate::hub::{Hub, StateCut, View};
use crate::metrics::Metrics;

/// Frames per chunk, and state entries per chunk during a state transfer.
pub(crate) const MAX_FRAMES_PER_CHUNK: usize = 512;

/// How the stream begins.
#[derive(Debug)]
pub(crate) enum Start {
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

/// Everything one subscriber holds. Dropped when the client goes away.
pub(crate) struct Subscriber {
    hub: Arc<Hub>,
    view: Arc<View>,
    metrics: Arc<Metrics>,
    ticks: watch::Receiver<u64>,
    live: broadcast::Receiver<Bytes>,
    shutdown: watch::Receiver<bool>,
    heartbeat: Duration,
    phase: Phase,
    /// Bytes to send before anything else (retry hint, reset).
    pending: BytesMut,
    _permit: OwnedSemaphorePermit,
}

impl Subscriber {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        hub: Arc<Hub>,
        view: Arc<View>,
        metrics: Arc<Metrics>,
        start: Start,
        shutdown: watch::Receiver<bool>,
        heartbeat: Duration,
        retry: Duration,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        let mut ticks = view.ticks();
        ticks.borrow_and_update();
        let live = view.live();
        let mut pending = BytesMut::from(format!("retry: {}\n\n", retry.as_millis()).as_bytes());
        let journal = hub.journal();
        let phase = match start {
            Start::Cursor(cursor) => match journal.frames_after(view.name(), &cursor, 0) {
                Ok(_) | Err(ReplayError::Disabled) => {
                    metrics.resumes.fetch_add(1, Ordering::Relaxed);
                    Phase::Follow(cursor)
                }
                Err(error) => reset_to_state(
                    &hub,
                    &view,
                    &metrics,
                    ResetReason::Replay(&error),
                    &mut pending,
                ),
            },
            Start::Malformed => {
                reset_to_state(&hub, &view, &metrics, ResetReason::Malformed, &mut pending)
            }
            Start::State => {
                metrics.state_starts.fetch_add(1, Ordering::Relaxed);
                Phase::State {
                    cut: view.cut(journal),
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
        metrics.connections.fetch_add(1, Ordering::Relaxed);
        Self {
            hub,
            view,
            metrics,
            ticks,
            live,
            shutdown,
            heartbeat,
            phase,
            pending,
            _permit: permit,
        }
    }

    /// The response body.
    pub(crate) fn into_stream(self) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
        futures_util::stream::unfold(self, |mut subscriber| async move {
            let chunk = subscriber.next_chunk().await?;
            Some((Ok(chunk), subscriber))
        })
    }

    /// The next bytes to write, or `None` to end the stream.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if *self.shutdown.borrow() {
                self.phase = Phase::Done;
            }
            match &mut self.phase {
                Phase::Done => return None,
                Phase::State { cut, sent } => {
                    let mut out = std::mem::take(&mut self.pending);
                    let end = cut.frames.len().min(*sent + MAX_FRAMES_PER_CHUNK);
                    for entry in &cut.frames[*sent..end] {
                        for part in frame::state_parts(entry) {
                            out.extend_from_slice(&part);
                        }
                    }
                    *sent = end;
                    if end == cut.frames.len() {
                        out.extend_from_slice(&frame::synced(cut.cursor, cut.frames.len()));
                        self.phase = Phase::Follow(cut.cursor);
                    }
                    return Some(out.freeze());
                }
                Phase::Follow(cursor) => {
                    let cursor = *cursor;
                    match self.hub.journal().frames_after(
                        self.view.name(),
                        &cursor,
                        MAX_FRAMES_PER_CHUNK,
                    ) {
                        Ok(frames) if !frames.is_empty() => {
                            let mut out = std::mem::take(&mut self.pending);
                            for frame in &frames {
                                out.extend_from_slice(frame);
                            }
                            self.metrics
                                .delivered
                                .fetch_add(frames.len() as u64, Ordering::Relaxed);
                            self.phase = Phase::Follow(Cursor::new(
                                cursor.epoch(),
                                cursor.offset() + frames.len() as u64,
                            ));
                            return Some(out.freeze());
                        }
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
            &self.hub,
            &self.view,
            &self.metrics,
            reason,
            &mut self.pending,
        );
    }

    /// Waits for the tape to move, a cursorless frame, a heartbeat or
    /// shutdown. Returns a chunk to send, or `None` to re-check the tape.
    async fn wait(&mut self) -> Option<Bytes> {
        tokio::select! {
            changed = self.ticks.changed() => {
                if changed.is_err() {
                    self.phase = Phase::Done;
                }
                None
            }
            received = self.live.recv() => match received {
                Ok(frame) => {
                    self.metrics.delivered.fetch_add(1, Ordering::Relaxed);
                    Some(frame)
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    self.reset(ResetReason::Lagged);
                    None
                }
                Err(broadcast::error::RecvError::Closed) => {
                    self.phase = Phase::Done;
                    None
                }
            },
            changed = self.shutdown.changed() => {
                if changed.is_err() {
                    self.phase = Phase::Done;
                }
                None
            }
            () = tokio::time::sleep(self.heartbeat) => Some(Bytes::from_static(b": heartbeat\n\n")),
        }
    }
}

/// Queues `event: reset` (reason and window) and returns the state-transfer
/// phase that follows it.
fn reset_to_state(
    hub: &Hub,
    view: &View,
    metrics: &Metrics,
    reason: ResetReason<'_>,
    pending: &mut BytesMut,
) -> Phase {
    let journal = hub.journal();
    let window = journal.window_now(view.name());
    pending.extend_from_slice(&frame::reset(reason, &window));
    metrics.count_reset(reason.as_str());
    Phase::State {
        cut: view.cut(journal),
        sent: 0,
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.metrics.connections.fetch_sub(1, Ordering::Relaxed);
    }
}
