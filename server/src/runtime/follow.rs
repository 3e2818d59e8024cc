//! A file source feeding its runtime.

use tracing::Instrument;

use super::{IngestError, RuntimeHandle};
use crate::source::{FileTail, SourceCheckpoint};

impl RuntimeHandle {
    /// Feeds `tail` into this runtime until the runtime stops (drop the future to stop
    /// earlier). A batch the guest fails on is lost (the runtime marks a gap and moves on); a
    /// batch the log could not take ([`IngestError::Log`]) committed nothing and is sent again.
    pub async fn follow(&self, mut tail: FileTail) {
        let runtime = self;
        let span = tracing::info_span!("file_tail", runtime = %runtime.name());
        let feed = async move {
            loop {
                let batch = match tail.next_batch().await {
                    Ok(batch) => batch,
                    Err(error) => {
                        tracing::warn!(%error, "reading the followed file failed; retrying");
                        tokio::time::sleep(tail.retry_after()).await;
                        continue;
                    }
                };
                let checkpoint = SourceCheckpoint::FileTail(batch.checkpoint);
                loop {
                    let sent = runtime
                        .ingest_from_source(batch.lines.clone(), checkpoint, batch.gap.clone())
                        .await;
                    match sent {
                        Ok(_) => break,
                        Err(error @ IngestError::Stopped { .. }) => {
                            tracing::debug!(%error, "runtime stopped; file tail ends");
                            return;
                        }
                        // Nothing of it was logged: the same lines again, once the log is back.
                        Err(error @ IngestError::Log { .. }) => {
                            tracing::warn!(%error, "batch from the followed file not logged; retrying it");
                            tokio::time::sleep(tail.retry_after()).await;
                        }
                        Err(error) => {
                            tracing::warn!(%error, "batch from the followed file failed");
                            break;
                        }
                    }
                }
            }
        };
        feed.instrument(span).await
    }
}
