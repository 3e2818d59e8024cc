//! Waiting: for the tape to move (every commit, or the commits that touch a narrowed
//! subscriber's keys), a cursorless frame, a heartbeat, the token's expiry or the stop.

use std::pin::Pin;

use bytes::Bytes;
use tokio::sync::{broadcast, watch};
use tokio::time::Sleep;

use super::{Phase, Subscriber};
use crate::frame::ResetReason;
use crate::hub::{KeyWake, View};
use crate::narrow::Narrow;

impl Subscriber {
    /// Waits for the tape to move, a cursorless frame, a heartbeat or
    /// shutdown. Returns a chunk to send, or `None` to re-check the tape.
    pub(super) async fn wait(&mut self) -> Option<Bytes> {
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
