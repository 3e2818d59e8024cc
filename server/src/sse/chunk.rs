//! The next chunk a subscriber writes: the stop's hint, the token's expiry, the state's entries,
//! then the tape's frames — small ones copied together, large ones shared.

use bytes::{Bytes, BytesMut};
use viewtape_journal::{Cursor, FramesWhere, ReplayError};

use super::{Phase, Subscriber, MAX_CHUNK_BYTES, MAX_FRAMES_PER_CHUNK, SHARED_FRAME_BYTES};
use crate::hub::frame::{self, ResetReason};
use crate::hub::StateCut;

/// The last event of a stream whose token expired (no `id`: the client's cursor stays where it
/// was).
const REAUTH: &[u8] = b"event: reauth\ndata: {\"reason\":\"the token expired; reconnect with a fresh one and your cursor\"}\n\n";

impl Subscriber {
    /// The next bytes to write, or `None` to end the stream.
    pub(super) async fn next_chunk(&mut self) -> Option<Bytes> {
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
            if let Some(reason) = self.view.retired() {
                if !matches!(self.phase, Phase::Done) {
                    self.phase = Phase::Done;
                    self.shared = None;
                    return Some(frame::retired(self.view.name(), reason));
                }
            }
            match &mut self.phase {
                Phase::Done => return None,
                Phase::State { cut, sent } => {
                    let mut out = std::mem::take(&mut self.pending);
                    take_state(&mut out, cut, sent, &mut self.shared);
                    if *sent == cut.entries.len() && self.shared.is_none() {
                        out.extend_from_slice(&frame::synced(cut.cursor, cut.entries.len()));
                        self.phase = Phase::Follow(cut.cursor);
                    }
                    return Some(out.freeze());
                }
                Phase::Follow(cursor) => {
                    let cursor = *cursor;
                    if let Some(chunk) = self.follow(cursor).await {
                        return Some(chunk);
                    }
                }
            }
        }
    }

    /// Reads the tape after `cursor`: the next chunk, or `None` to look again (the phase moved
    /// on, was reset or is done, or a wake-up came with nothing to send).
    async fn follow(&mut self, cursor: Cursor) -> Option<Bytes> {
        if self.reached_head(&cursor) {
            self.phase = Phase::Done;
            if !self.pending.is_empty() {
                return Some(std::mem::take(&mut self.pending).freeze());
            }
            return None;
        }
        let narrow = &self.narrow;
        match self.streams.hub.journal().frames_after_where(
            self.view.name(),
            &cursor,
            MAX_FRAMES_PER_CHUNK,
            |key| narrow.keeps(key),
        ) {
            Ok(found) if !found.frames.is_empty() => Some(self.take_frames(cursor, &found)),
            // Records, none of them for this stream's keys: passed over.
            Ok(FramesWhere {
                through: Some(through),
                ..
            }) => {
                self.phase = Phase::Follow(Cursor::new(cursor.epoch(), through));
                None
            }
            Ok(_) => match self.park(cursor) {
                true => self.pending_or_wait().await,
                false => None,
            },
            Err(ReplayError::Disabled) => {
                // No tape: live frames come only through the
                // cursorless feed.
                self.pending_or_wait().await
            }
            // Retired meanwhile: the gap a retirement marks ends the stream with `retired`
            // (the loop's next turn), not a reset.
            Err(_) if self.view.retired().is_some() => None,
            Err(error) => {
                self.reset(ResetReason::Replay(&error));
                None
            }
        }
    }

    /// The chunk of `found`'s frames (read after `cursor`) to send next, after the pending
    /// bytes: small frames copied together within [`MAX_CHUNK_BYTES`], a large one on its own,
    /// shared. The stream follows on after the last frame taken.
    fn take_frames(&mut self, cursor: Cursor, found: &FramesWhere) -> Bytes {
        let mut out = std::mem::take(&mut self.pending);
        let mut taken = 0;
        // Past the last frame taken; past every record looked at when all
        // were taken (a narrowed stream passes over the others).
        let mut through = cursor.offset();
        // A `?until=head` stream delivers nothing past the head it saw at open, though the tape
        // may hold more by now.
        let head = self
            .until
            .as_ref()
            .filter(|head| head.epoch == cursor.epoch())
            .map(|head| head.next);
        for (offset, frame) in &found.frames {
            if head.is_some_and(|head| *offset >= head) {
                break;
            }
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
        match self.shared.take() {
            Some(frame) if out.is_empty() => frame,
            shared => {
                self.shared = shared;
                out.freeze()
            }
        }
    }

    /// The pending bytes, if any; else what waiting gives (`None`: read the tape again).
    async fn pending_or_wait(&mut self) -> Option<Bytes> {
        if !self.pending.is_empty() {
            return Some(std::mem::take(&mut self.pending).freeze());
        }
        self.wait().await
    }
}

/// Adds the state entries after `sent` to `out`, within [`MAX_FRAMES_PER_CHUNK`] entries and
/// [`MAX_CHUNK_BYTES`]. An entry of [`SHARED_FRAME_BYTES`] or more ends the chunk after its
/// head: its data, shared, goes into `shared` to be sent next.
fn take_state(out: &mut BytesMut, cut: &StateCut, sent: &mut usize, shared: &mut Option<Bytes>) {
    let end = cut.entries.len().min(*sent + MAX_FRAMES_PER_CHUNK);
    while *sent < end {
        let [head, data] = cut.entries[*sent].state_parts();
        if data.len() >= SHARED_FRAME_BYTES {
            out.extend_from_slice(&head);
            *shared = Some(data);
            *sent += 1;
            break;
        }
        if !out.is_empty() && out.len() + head.len() + data.len() > MAX_CHUNK_BYTES {
            break;
        }
        out.extend_from_slice(&head);
        out.extend_from_slice(&data);
        *sent += 1;
    }
}
