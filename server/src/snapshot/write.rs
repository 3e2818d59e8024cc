//! Writing a snapshot under the consistency cut, pruning old ones with the log segments no kept
//! snapshot needs, and the periodic timer.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::Instrument;
use viewtape_snapshots::{SnapshotError, SnapshotInfo, SnapshotMeta};

use super::{RuntimeDump, SnapshotActionError, SnapshotBody, Snapshots};
use crate::log::{Backend, LogPosition};
use crate::runtime::registry::Cut;

/// A snapshot that [`Snapshots::write`] or [`Snapshots::write_exact`] wrote.
#[derive(Debug)]
pub struct WrittenSnapshot {
    /// The file.
    pub info: SnapshotInfo,
    /// Journal records it holds.
    pub records: usize,
}

impl Snapshots {
    /// Takes the cut, dumps, releases the cut and writes a periodic snapshot (then prunes old
    /// ones).
    ///
    /// # Errors
    /// A runtime could not be paused, or the file could not be written.
    pub async fn write(&self) -> Result<WrittenSnapshot, SnapshotActionError> {
        self.write_as(SnapshotMeta::periodic_now()).await
    }

    /// [`Snapshots::write`] for an operator who asked for it: the file is named `manual`.
    ///
    /// # Errors
    /// As [`Snapshots::write`].
    pub async fn write_manual(&self) -> Result<WrittenSnapshot, SnapshotActionError> {
        self.write_as(SnapshotMeta::manual_now()).await
    }

    async fn write_as(&self, meta: SnapshotMeta) -> Result<WrittenSnapshot, SnapshotActionError> {
        let _busy = self.busy.lock().await;
        let (body, cut) = self.dump(false).await?;
        drop(cut);
        self.store(body, meta).await
    }

    /// What a graceful stop writes last: seals the journal inside the cut, dumps and writes an
    /// exact snapshot. The runtimes stay paused while the returned [`Cut`] lives — keep it until
    /// the process ends, so nothing commits after the snapshot.
    ///
    /// # Errors
    /// A runtime could not be paused, or the file could not be written.
    pub async fn write_exact(&self) -> Result<(WrittenSnapshot, Cut), SnapshotActionError> {
        let _busy = self.busy.lock().await;
        let (body, cut) = self.dump(true).await?;
        let written = self.store(body, SnapshotMeta::exact_now()).await?;
        Ok((written, cut))
    }

    /// Takes the cut (sealing first when `seal`) and dumps everything under it.
    async fn dump(&self, seal: bool) -> Result<(SnapshotBody, Cut), SnapshotActionError> {
        let cut = self.runtimes.pause_all().await?;
        if seal {
            self.hub.journal().seal();
        }
        Ok((self.body_under(&cut).await, cut))
    }

    /// Everything a snapshot holds, read inside `cut`.
    pub(super) async fn body_under(&self, cut: &Cut) -> SnapshotBody {
        let journal = self.hub.journal().dump().await;
        let views = self.hub.dump_states();
        let runtimes = cut
            .runtimes()
            .iter()
            .map(|paused| RuntimeDump {
                name: paused.name.clone(),
                module: paused.module.clone(),
                configured: Some(paused.configured.clone()),
                saved: paused.saved.clone(),
                definition: paused.definition.clone(),
            })
            .collect();
        // A cluster's snapshot names the stream's history it belongs to, and the runtimes
        // this node passed over in it.
        let (stream, passed_over) = match self.log.backend() {
            Backend::Stream(stream) => (Some(stream.epoch()), stream.passed_over()),
            Backend::Off | Backend::Segments(_) => (None, Default::default()),
        };
        SnapshotBody {
            journal,
            views,
            runtimes,
            log_position: self.log.position(),
            stream,
            passed_over,
            deleted: self.runtimes.all_deleted(),
        }
    }

    /// Writes `body` off the async threads, then prunes old snapshots.
    pub(super) async fn store(
        &self,
        body: SnapshotBody,
        meta: SnapshotMeta,
    ) -> Result<WrittenSnapshot, SnapshotActionError> {
        let records = body.journal.record_count();
        let position = body.log_position;
        let dir = Arc::clone(&self.dir);
        let (info, pruned) = tokio::task::spawn_blocking(move || {
            let info = dir.write(&body, &meta)?;
            let pruned = dir.prune();
            if let Err(error) = &pruned {
                tracing::warn!(%error, "pruning old snapshots failed");
            }
            Ok::<_, SnapshotError>((info, pruned.ok()))
        })
        .await??;
        if let (Some(position), Some(pruned)) = (position, pruned) {
            self.forget_log_before(info.path(), position, &pruned.kept);
        }
        if let Some(position) = position {
            self.written
                .send_replace(Some((info.path().to_owned(), position)));
        }
        Ok(WrittenSnapshot { info, records })
    }

    /// Notes that `file` is at log `position`, and deletes the segments no kept snapshot needs.
    /// A kept snapshot of an earlier life (its position unknown) keeps every segment.
    fn forget_log_before(
        &self,
        file: &std::path::Path,
        position: LogPosition,
        kept: &[std::path::PathBuf],
    ) {
        let oldest = {
            let mut positions = self
                .positions
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            positions.insert(file.to_owned(), position);
            positions.retain(|path, _| kept.contains(path));
            match kept.iter().all(|path| positions.contains_key(path)) {
                true => positions.values().min().copied(),
                false => None,
            }
        };
        if let Some(oldest) = oldest {
            match self.log.delete_before(oldest) {
                Ok(0) => {}
                Ok(deleted) => tracing::debug!(
                    deleted,
                    before = oldest.get(),
                    "log segments no snapshot needs deleted"
                ),
                Err(error) => tracing::warn!(%error, "deleting old log segments failed"),
            }
        }
    }

    /// Writes a periodic snapshot every `every` until the handle is aborted.
    pub fn spawn_periodic(self: &Arc<Self>, every: Duration) -> JoinHandle<()> {
        let snapshots = Arc::clone(self);
        let span = tracing::info_span!("periodic_snapshots");
        tokio::spawn(
            async move {
                let mut ticker = tokio::time::interval(every);
                ticker.tick().await;
                loop {
                    ticker.tick().await;
                    match snapshots.write().await {
                        Ok(written) => tracing::debug!(file = %written.info.path().display(), "periodic snapshot written"),
                        Err(error) => tracing::warn!(%error, "periodic snapshot failed"),
                    }
                }
            }
            .instrument(span),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::server;

    #[tokio::test]
    async fn nothing_commits_after_the_exact_snapshot_while_its_cut_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let (snapshots, hub, handle) = server(dir.path()).await;
        let (_, cut) = snapshots.write_exact().await.unwrap();
        let tick = bytes::Bytes::from_static(b"{\"symbol\":\"ACME\",\"price\":1.5,\"seq\":1}\n");
        let late = tokio::spawn({
            let handle = handle.clone();
            let tick = tick.clone();
            async move { handle.ingest(tick, None).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!late.is_finished(), "a batch ran after the exact snapshot");
        assert!(hub.view("prices").is_none_or(|view| view.keys() == 0));
        drop(cut);
        late.await.unwrap().unwrap();
    }
}
