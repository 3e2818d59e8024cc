//! Where a node starts: the newest local snapshot of the stream's epoch that the stream still
//! continues, else the newest shared one, else the stream's beginning; or, when the stream no
//! longer holds what no snapshot covers, nowhere (it fails closed).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt as _;
use viewtape_journal::{JournalEpoch, JournalSnapshot};
use viewtape_snapshots::{Loaded, SnapshotDir};

use super::bucket::shared_position;
use super::{Cluster, ClusterError, Halt};
use crate::hub::Hub;
use crate::log::{Log, LogPosition};
use crate::snapshot::{SnapshotBody, StartFrom};

impl Cluster {
    /// Restores the newest local snapshot that continues this stream into `hub`, or starts
    /// `hub` empty under the stream's epoch when the stream still holds its first message.
    /// Returns the runtimes' states and the log of stream positions, at the snapshot's.
    ///
    /// When the stream dropped messages that no snapshot holds, the node starts empty under an
    /// epoch of its own and stays not ready ([`Halt::Uncovered`] says why).
    ///
    /// # Errors
    /// The snapshot directory cannot be read.
    pub async fn begin(
        &self,
        hub: &Hub,
        snapshots: &SnapshotDir,
    ) -> Result<(StartFrom, Arc<Log>), ClusterError> {
        let first = self.stream_first.max(LogPosition::FIRST);
        let mut usable = self.usable_local(snapshots, first)?;
        if usable.is_none() {
            if let Some(name) = self.fetch_shared(snapshots, first).await {
                usable = self.usable_local(snapshots, first)?;
                if usable.is_none() {
                    tracing::warn!(name, "cluster: the shared snapshot fetched is not usable");
                }
            }
        }
        if let Some((mut loaded, position)) = usable {
            let file = loaded.info.path().display().to_string();
            let passed_over = std::mem::take(&mut loaded.body.passed_over);
            let restored = loaded.body.restore_into(hub, true).await;
            tracing::info!(file, position = position.get(), epoch = %self.epoch, "cluster: restored snapshot");
            return Ok((restored, self.log_at(position, passed_over)));
        }
        let log = self.log_at(LogPosition::ZERO, BTreeMap::new());
        let epoch = match first {
            LogPosition::FIRST => self.epoch,
            _ => {
                // Fail closed: the history before `first` is unknown here, so nothing this node
                // could serve may carry the cluster's epoch. It serves an empty state under an
                // epoch of its own, refuses ingest, and stays not ready.
                let halt = Halt::Uncovered {
                    stream: self.stream.clone(),
                    first,
                    needed: first.prev(),
                };
                self.break_off(halt);
                JournalEpoch::random_other_than(self.epoch)
            }
        };
        let empty = JournalSnapshot {
            epoch: Some(epoch),
            taken_at_unix_ms: crate::log::unix_ms_now(),
            views: Vec::new(),
        };
        hub.restore(empty, true, Vec::new()).await;
        Ok((StartFrom::default(), log))
    }

    /// The newest snapshot in `snapshots`, if it is of this stream's epoch and the stream still
    /// holds every message after it (its first sequence is `first`).
    fn usable_local(
        &self,
        snapshots: &SnapshotDir,
        first: LogPosition,
    ) -> Result<Option<(Loaded<SnapshotBody>, LogPosition)>, ClusterError> {
        let newest = snapshots.load_newest_valid::<SnapshotBody>()?;
        Ok(newest.loaded.and_then(|loaded| {
            let position = loaded.body.log_position?;
            // The stream's own epoch, or (after a live restore) the snapshot says it is part of
            // this stream's history.
            let ours = loaded.body.journal.epoch == Some(self.epoch)
                || loaded.body.stream == Some(self.epoch);
            if !ours {
                tracing::warn!(file = %loaded.info.path().display(), "cluster: the newest snapshot belongs to another epoch (another stream, or this one recreated); not used");
                return None;
            }
            (position.next() >= first).then_some((loaded, position))
        }))
    }

    /// Copies the newest shared snapshot of this epoch that the stream continues (its first
    /// sequence is `first`) into `snapshots`; returns its name. `None` when there is none or the
    /// bucket cannot be read (logged).
    async fn fetch_shared(&self, snapshots: &SnapshotDir, first: LogPosition) -> Option<String> {
        let listed = async {
            let mut names = Vec::new();
            let mut list = self.bucket.list().await?;
            while let Some(info) = list.next().await {
                names.push(info?.name);
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(names)
        };
        let names = match listed.await {
            Ok(names) => names,
            Err(error) => {
                tracing::warn!(%error, "cluster: cannot list the shared snapshots");
                return None;
            }
        };
        let (position, name) = names
            .into_iter()
            .filter_map(|name| Some((shared_position(&name, self.epoch)?, name)))
            .filter(|(position, _)| position.next() >= first)
            .max()?;
        let fetched = async {
            let mut object = self.bucket.get(&name).await?;
            let mut bytes = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut object, &mut bytes).await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(bytes)
        };
        match fetched.await {
            Ok(bytes) => match snapshots.write_encoded(&bytes) {
                Ok(info) => {
                    tracing::info!(name, position = position.get(), file = %info.path().display(), "cluster: fetched a shared snapshot");
                    Some(name)
                }
                Err(error) => {
                    tracing::warn!(%error, name, "cluster: a shared snapshot is damaged; not used");
                    None
                }
            },
            Err(error) => {
                tracing::warn!(%error, name, "cluster: cannot fetch a shared snapshot");
                None
            }
        }
    }
}
