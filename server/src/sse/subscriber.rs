//! A subscriber's life: how it starts (after a cursor, from the state or the whole tape),
//! `?until=head`, resets to the state, its response body, and its end.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use tokio::sync::OwnedSemaphorePermit;
use viewtape_journal::{Cursor, ReplayError};

use super::direct::Pass;
use super::wake::Wake;
use super::{Phase, Start, Streams, Subscriber};
use crate::hub::frame::{self, ResetReason};
use crate::hub::narrow::Narrow;
use crate::hub::{Hub, ReadHold, View};
use crate::metrics::Metrics;
use crate::sse::socket::SharedTcp;

impl Subscriber {
    pub(super) fn new(
        streams: Arc<Streams>,
        hold: ReadHold,
        start: Start,
        narrow: Narrow,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        let view = Arc::clone(hold.view());
        let (hub, metrics) = (&streams.hub, &streams.metrics);
        // Registered before the tape is first read: nothing committed after that read is missed.
        let wake = Wake::register(&view, &narrow);
        let mut invalidations = hub.journal().invalidations();
        invalidations.borrow_and_update();
        let live = view.live();
        let mut pending =
            BytesMut::from(format!("retry: {}\n\n", streams.retry.as_millis()).as_bytes());
        let phase = first_phase(hub, &view, &narrow, metrics, start, &mut pending);
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
            direct: None,
            place: None,
            _hold: hold,
            _permit: permit,
        }
    }

    /// Ends the stream once it has delivered everything up to the view's head as it is now
    /// (`?until=head`): right after `synced` for a state transfer, after the last retained
    /// event for a cursor or the tape. A reset to another epoch ends it after that state.
    #[must_use]
    pub fn until_head(mut self) -> Self {
        self.until = Some(Box::new(
            self.streams.hub.journal().window_now(self.view.name()),
        ));
        self
    }

    /// Lets the view's pass write to `socket` while the subscriber waits at the head of the
    /// tape: for a stream the lean transport serves over plain TCP, as HTTP/1.1 chunks.
    #[must_use]
    pub fn direct(mut self, socket: SharedTcp) -> Self {
        self.direct = Some(socket);
        self
    }

    /// Whether a `?until=head` stream following after `cursor` has delivered everything.
    pub(super) fn reached_head(&self, cursor: &Cursor) -> bool {
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

    /// Switches to a state transfer after telling the client why.
    pub(super) fn reset(&mut self, reason: ResetReason<'_>) {
        self.phase = reset_to_state(
            &self.streams.hub,
            &self.view,
            &self.narrow,
            &self.streams.metrics,
            reason,
            &mut self.pending,
        );
    }
}

/// The phase a subscriber begins in, as `start` says: a cursor the journal refuses, or a
/// malformed one, queues `event: reset` in `pending` and begins with the state.
fn first_phase(
    hub: &Hub,
    view: &View,
    narrow: &Narrow,
    metrics: &Metrics,
    start: Start,
    pending: &mut BytesMut,
) -> Phase {
    let journal = hub.journal();
    match start {
        Start::Cursor(cursor) => match journal.frames_after(view.name(), &cursor, 0) {
            Ok(_) | Err(ReplayError::Disabled) => {
                metrics.resumes.inc();
                Phase::Follow(cursor)
            }
            Err(error) => reset_to_state(
                hub,
                view,
                narrow,
                metrics,
                ResetReason::Replay(&error),
                pending,
            ),
        },
        Start::Malformed => {
            reset_to_state(hub, view, narrow, metrics, ResetReason::Malformed, pending)
        }
        Start::State => {
            metrics.state_starts.inc();
            Phase::State {
                cut: view.cut(journal, narrow),
                sent: 0,
            }
        }
        Start::Tape => {
            // Following from just before the first retained record
            // replays the whole tape — or, when it holds a gap, the
            // tape since the newest gap.
            let window = journal.window_now(view.name());
            let mut cursor = Cursor::new(window.epoch, window.first.prev());
            if let Err(ReplayError::Gap { resume_from, .. }) =
                journal.frames_after(view.name(), &cursor, 0)
            {
                cursor = Cursor::new(window.epoch, resume_from);
            }
            Phase::Follow(cursor)
        }
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
        if let Some(place) = self.place.take() {
            Pass::leave(place);
        }
        self.streams.metrics.connections.dec();
        self.view.count_subscriber(false);
    }
}
