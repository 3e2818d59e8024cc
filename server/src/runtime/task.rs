//! The task's loop: one command at a time; batches waiting together become one group.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use viewtape_journal::JournalScope;

use super::command::Command;
use super::guest::{Fit, GuestSlot, SlotError};
use super::verdict::Verdicts;
use super::{BatchSink, IngestError, RuntimeHalt, RuntimeSnapshot, RuntimeStats, MAX_GROUP};
use crate::host::{GuestBatch, GuestError, GuestModule};
use crate::log::check::{Applied, Checked};
use crate::log::{BatchEntry, Digest, Log, LogPosition};
use crate::schema::ViewSchemas;
use bytes::Bytes;
use tracing::Instrument as _;

/// The task owning one runtime's guest.
pub(super) struct Task<S> {
    pub name: Arc<str>,
    /// The module and its instance.
    pub slot: GuestSlot,
    /// CRC-32C of the guest config, recorded with every batch.
    pub guest_config_crc: u32,
    /// The state, checkpoint and producers after the last batch that ran: between groups, the
    /// last committed ones.
    pub last: RuntimeSnapshot,
    /// Its scope on the journal: the one way a gap it reports (its guest's, its source's, a
    /// fresh start) reaches its views' tapes.
    pub scope: JournalScope,
    pub sink: Arc<S>,
    pub log: Arc<Log>,
    pub stats: Arc<RuntimeStats>,
    /// The module it runs, shared with the handles.
    pub module_now: Arc<Mutex<GuestModule>>,
    /// The schemas of `module`, shared with the handles.
    pub schemas_now: Arc<Mutex<Arc<ViewSchemas>>>,
    /// Verdicts on records published to a cluster's stream, for the handles waiting.
    pub verdicts: Arc<Mutex<Verdicts>>,
    /// Set by a pause that ends the task ([`PauseGuard::stop`](super::PauseGuard::stop)).
    pub stopping: bool,
    /// On a cluster: halts its checks found (the other nodes applied something else).
    pub diverged: (
        mpsc::UnboundedSender<RuntimeHalt>,
        mpsc::UnboundedReceiver<RuntimeHalt>,
    ),
}

impl<S: BatchSink> Task<S> {
    /// Runs the task's commands until its queue closes. What a command does is boxed: an idle
    /// runtime's task holds only this loop, not the largest state of every command's work
    /// (about 7 KB in the loop's future before).
    pub async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        loop {
            let cmd = tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(cmd) => cmd,
                    None => break,
                },
                Some(halt) = self.diverged.1.recv() => {
                    self.halt_diverged(halt);
                    continue;
                }
            };
            let held = match cmd {
                Command::Ingest(first) => {
                    // Everything already waiting joins the group, up to a command of another
                    // kind, which runs right after it.
                    let mut group = vec![*first];
                    let mut held = None;
                    while group.len() < MAX_GROUP && held.is_none() {
                        match rx.try_recv() {
                            Ok(Command::Ingest(next)) => group.push(*next),
                            Ok(other) => held = Some(other),
                            Err(_) => break,
                        }
                    }
                    Box::pin(self.group(group)).await;
                    held
                }
                other => Some(other),
            };
            if let Some(cmd) = held {
                Box::pin(self.other(cmd)).await;
            }
            if self.stopping {
                break;
            }
        }
        // What still waits in the queue is dropped with its reply: each caller learns that the
        // runtime stopped.
        tracing::debug!("runtime task stopped");
    }

    /// Notes the size of the committed state, for whoever reads the stats: at start, and
    /// wherever a new state commits (a batch, a deploy, a restore), before anyone is answered.
    pub fn note_state(&self) {
        let bytes = u64::try_from(self.last.state.len()).unwrap_or(u64::MAX);
        self.stats.state_bytes.store(bytes, Ordering::Relaxed);
        self.stats.note_halt(self.last.halted.as_ref());
    }

    /// Every command but a batch.
    async fn other(&mut self, cmd: Command) {
        match cmd {
            Command::Ingest(ingest) => {
                self.group(vec![*ingest]).await;
            }
            Command::Apply {
                record,
                position,
                reply,
            } => {
                let result = self.apply(*record, position).await;
                let _ = reply.send(result);
            }
            Command::Deploy {
                module,
                when,
                reply,
            } => {
                let result = self.deploy(module, when).await;
                let _ = reply.send(result);
            }
            Command::Save { reply } => {
                let _ = reply.send(self.last.clone());
            }
            Command::Pause { reply, control } => {
                if reply.send(self.last.clone()).is_ok() {
                    // Paused until the guard is dropped.
                    self.paused(control).await;
                }
            }
        }
    }
}

impl<S: BatchSink> Task<S> {
    /// Runs `entry`'s input through the guest (an empty input from a source runs nothing). On
    /// success the guest's new state is the last good one; on failure the instance is made
    /// again from the last good state.
    pub(super) async fn run_guest(
        &mut self,
        entry: &BatchEntry,
        fit: Fit,
    ) -> Result<GuestBatch, IngestError> {
        if entry.input.is_empty() && entry.checkpoint.is_some() {
            return Ok(GuestBatch::default());
        }
        let runtime = self.name.to_string();
        match self
            .slot
            .run(&entry.input, entry.at_ms, &mut self.last.state, fit)
            .await
        {
            Ok(batch) => Ok(batch),
            Err(SlotError::Unavailable(source)) => {
                tracing::error!(error = %source, "runtime unavailable: re-instantiation failed");
                Err(IngestError::Unavailable { runtime, source })
            }
            // The wall-clock backstop is a fault of the moment, not a verdict on the batch.
            Err(SlotError::Failed(source @ GuestError::Timeout { .. })) => {
                Err(IngestError::Unavailable { runtime, source })
            }
            Err(SlotError::Failed(source)) => Err(IngestError::Guest { runtime, source }),
        }
    }

    /// On a cluster: checks what this task applied of the batch at `position` (its events
    /// `digest`, and the state after it) against the other nodes, if it is a check point
    /// ([`crate::log::check`]); a difference halts the runtime here.
    pub(super) fn check(&mut self, position: LogPosition, digest: &Digest) {
        let previous = self.last.last_batch.replace(position);
        let Some(stream) = self.log.stream() else {
            return;
        };
        if !Applied::is_check_point(position, previous) {
            return;
        }
        let applied = Applied {
            events: digest.per_view.values().sum(),
            crc: digest.crc,
            state: crc32c::crc32c(&self.last.state),
        };
        let (stream, log) = (Arc::clone(stream), Arc::clone(&self.log));
        let (runtime, diverged) = (Arc::clone(&self.name), self.diverged.0.clone());
        let checking = async move {
            let checked = stream.checks().check(&runtime, position, applied).await;
            log.metrics().checked(&checked);
            match checked {
                Checked::Differed(theirs) => {
                    let reason = format!("this node applied the batch at stream sequence {position} as \"{} {:08x} {:08x}\" (events, their CRC, the state's CRC); the first node to check it applied \"{theirs}\"", applied.events, applied.crc, applied.state);
                    let _ = diverged.send(RuntimeHalt {
                        position,
                        reason,
                        lost: 0,
                        unreadable: None,
                    });
                }
                Checked::Unchecked(reason) => {
                    tracing::debug!(position = position.get(), reason, "not checked");
                }
                Checked::First | Checked::Agreed => {}
            }
        };
        tokio::spawn(checking.instrument(tracing::Span::current()));
    }

    /// Halts the runtime on this node, found to have applied something else than the other
    /// nodes: its views take nothing more here, and a gap on them resets every cursor issued
    /// for them, so that none is served another event than the other nodes serve.
    fn halt_diverged(&mut self, halt: RuntimeHalt) {
        if self.last.halted.is_some() {
            return;
        }
        tracing::error!(
            position = halt.position.get(),
            reason = halt.reason,
            "runtime halted on this node: it applied something else than the other nodes of the cluster; its views take nothing new here, and their readers are reset; every other runtime goes on"
        );
        self.mark_gap();
        self.last.halted = Some(halt);
        self.note_state();
    }

    /// Puts the guest back to `state`, an earlier good one: the next batch runs from it.
    pub(super) fn rewind(&mut self, state: Bytes) {
        self.last.state = state;
    }

    /// Marks a gap on this runtime's views, through its scope: the loss of its input touches
    /// nothing else.
    pub(super) fn mark_gap(&self) {
        self.mark_loss(0);
    }

    /// Marks a gap on this runtime's views after `lost` offsets a life of the server issued
    /// that this one does not hold ([`JournalScope::report_loss`]).
    pub(super) fn mark_loss(&self, lost: u64) {
        self.stats.gaps.fetch_add(1, Ordering::Relaxed);
        self.scope.report_loss(lost);
    }
}
