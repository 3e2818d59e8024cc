//! Waiting: for the tape to move (every commit, or the commits that touch a narrowed
//! subscriber's keys), a cursorless frame, a heartbeat, the token's expiry or the stop.

use std::pin::Pin;

use bytes::Bytes;
use futures_util::future::{Either, FutureExt};
use tokio::sync::{broadcast, watch};
use tokio::time::Sleep;

use super::direct::Place;
use super::{Phase, Subscriber};
use crate::hub::frame::ResetReason;
use crate::hub::narrow::Narrow;
use crate::hub::{KeyWake, View};

/// What ended a wait.
enum Woke {
    /// The tape may have moved: read it again.
    Look,
    /// The view, the journal or the server is going away.
    Closed,
    /// A cursorless frame of one of its keys.
    Live(Bytes),
    /// It fell too far behind the cursorless frames.
    Lagged,
    /// The heartbeat's timer.
    Heartbeat,
}

impl Subscriber {
    /// Waits for the tape to move, a cursorless frame, a heartbeat or
    /// shutdown. Returns a chunk to send, or `None` to re-check the tape.
    pub(super) async fn wait(&mut self) -> Option<Bytes> {
        // A closed channel means the hub or the server is going away.
        let woke = tokio::select! {
            closed = changed(&mut self.wake, self.place.as_ref()) => match closed {
                true => Woke::Closed,
                false => Woke::Look,
            },
            changed = self.invalidations.changed() => match changed {
                Ok(()) => Woke::Look,
                Err(_) => Woke::Closed,
            },
            changed = self.shutdown.changed() => match changed {
                Ok(()) => Woke::Look,
                Err(_) => Woke::Closed,
            },
            received = self.live.recv() => match received {
                Ok((key, frame)) if self.narrow.keeps(&key) => Woke::Live(frame),
                Ok(_) => Woke::Look,
                Err(broadcast::error::RecvError::Lagged(_)) => Woke::Lagged,
                Err(broadcast::error::RecvError::Closed) => Woke::Closed,
            },
            () = self.heartbeat.as_mut() => Woke::Heartbeat,
            () = fired(&mut self.expiry) => Woke::Look,
        };
        // Nothing is written, by the pass or here, until the subscriber is unparked.
        self.unpark().await;
        match woke {
            Woke::Look => None,
            Woke::Closed => {
                self.phase = Phase::Done;
                None
            }
            Woke::Live(frame) => {
                self.streams.metrics.delivered.inc();
                Some(frame)
            }
            Woke::Lagged => {
                self.reset(ResetReason::Lagged);
                None
            }
            Woke::Heartbeat => {
                let now = tokio::time::Instant::now();
                let due = self.sent_at + self.streams.heartbeat;
                if due > now {
                    self.heartbeat.as_mut().reset(due);
                    None
                } else {
                    self.heartbeat.as_mut().reset(now + self.streams.heartbeat);
                    Some(Bytes::from_static(b": heartbeat\n\n"))
                }
            }
        }
    }
}

/// Resolves at the next wake-up: from the view's pass while parked, else from `wake`; `true`
/// when the view is gone. No future of its own: it is one of the two it picks.
fn changed<'a>(
    wake: &'a mut Wake,
    place: Option<&'a Place>,
) -> impl std::future::Future<Output = bool> + 'a {
    match place {
        Some(place) => Either::Left(place.woken().map(|()| false)),
        None => Either::Right(wake.changed()),
    }
}

/// What wakes a subscriber to read the tape again.
pub(super) enum Wake {
    /// Every commit to the view.
    View(watch::Receiver<u64>),
    /// Commits that touch the keys it reads.
    Keys(KeyWake),
}

impl Wake {
    /// Wake-ups from `view` for a subscriber reading the keys `narrow` takes.
    pub(super) fn register(view: &View, narrow: &Narrow) -> Self {
        match narrow.is_all() {
            true => {
                let mut ticks = view.ticks();
                ticks.borrow_and_update();
                Wake::View(ticks)
            }
            false => Wake::Keys(view.key_wake(narrow)),
        }
    }

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
