//! The runtime's side of the consistency cut: paused between batches until the guard is
//! dropped, and a restore staged and committed inside it (see [`PauseGuard`](super::PauseGuard)).

use tokio::sync::mpsc;

use super::command::PauseOp;
use super::task::Task;
use super::{BatchSink, RuntimeSnapshot};

impl<S: BatchSink> Task<S> {
    /// Serves the holder of the cut until it drops its guard.
    pub(super) async fn paused(&mut self, mut control: mpsc::Receiver<PauseOp>) {
        let mut staged: Option<RuntimeSnapshot> = None;
        while let Some(op) = control.recv().await {
            match op {
                PauseOp::Stage { snapshot, reply } => {
                    let made = self
                        .slot
                        .instantiate(self.slot.module(), Some(&snapshot.state[..]))
                        .await;
                    // The state is checked by an instance of the running module.
                    let result = made.map(|_| staged = Some(*snapshot));
                    let _ = reply.send(result);
                }
                PauseOp::Commit { reply } => {
                    let committed = match staged.take() {
                        Some(mut snapshot) => {
                            // The modules it ran stay this runtime's history.
                            for module in std::mem::take(&mut self.last.modules) {
                                snapshot.ran(&module);
                            }
                            self.last = snapshot;
                            self.note_state();
                            tracing::info!("guest state restored from a snapshot");
                            true
                        }
                        None => false,
                    };
                    let _ = reply.send(committed);
                }
                PauseOp::Stop { reply } => {
                    self.stopping = true;
                    let _ = reply.send(());
                    return;
                }
            }
        }
    }
}
