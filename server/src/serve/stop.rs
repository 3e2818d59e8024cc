//! The stop, after the listener has closed: the tasks beside it stopped, then the exact
//! snapshot under the consistency cut.

use super::start::Started;
use super::tasks::Tasks;
use crate::runtime::registry::Cut;

/// Stops `tasks` and writes the exact snapshot. Returns the snapshot's cut, to hold until the
/// process ends: requests that outlived the drain may still be waiting on a runtime, and none
/// of them may commit after the snapshot. A snapshot that cannot be written is logged and the
/// stop still ends cleanly.
pub(super) async fn stop(tasks: Tasks, started: &Started) -> Option<Cut> {
    tasks.abort();
    match started.snapshots.write_exact().await {
        Ok((written, cut)) => {
            tracing::info!(file = %written.info.path().display(), "exact snapshot written; bye");
            Some(cut)
        }
        // A full disk, say: the stop still ends cleanly. With positions, every acknowledged
        // batch is in the log (or the stream) and the next start replays it.
        Err(error) if started.log.position().is_some() => {
            tracing::error!(%error, "could not write the exact snapshot at stop; everything acknowledged is in the log and replays at the next start; bye");
            None
        }
        Err(error) => {
            tracing::error!(%error, "could not write the exact snapshot at stop; with the log off, the next start takes a fresh epoch from the last snapshot; bye");
            None
        }
    }
}
