//! A live restore on a cluster: any node puts the snapshot file in the bucket and publishes a
//! restore record; every node restores it at the record's position, under the epoch derived
//! from the stream's and that position, so old cursors reset and new ones are valid on every
//! node.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

use super::apply::Appliers;
use super::{restored_epoch, Cluster, Halt};
use crate::log::{unix_ms_now, Entry, Log, LogPosition, Publishing, RestoreEntry};
use crate::snapshot::{RestoreAt, Restored, SnapshotActionError, Snapshots};

/// Outcomes of restores applied, by sequence, for the node that published them.
pub(super) type RestoreOutcomes =
    watch::Sender<BTreeMap<LogPosition, Result<Restored, SnapshotActionError>>>;

/// Restore outcomes kept.
const OUTCOMES_KEPT: usize = 64;

impl Cluster {
    /// Restores the snapshot `name` on every node: a file of this node's snapshot directory, or
    /// a snapshot another node shared in the bucket (by its file name there, or its name in
    /// the bucket). Answers once this node has restored it.
    ///
    /// # Errors
    /// [`SnapshotActionError::NoSuchSnapshot`], [`SnapshotActionError::Unrestorable`] (nothing
    /// changed on any node), or [`SnapshotActionError::Shared`] when the stream did not take it
    /// or this node did not apply it in time.
    pub async fn restore(
        &self,
        snapshots: &Snapshots,
        name: &str,
    ) -> Result<Restored, SnapshotActionError> {
        let shared = |reason: String| SnapshotActionError::Shared(reason);
        let stream = &self.stream_log;
        let bytes = match snapshots.restorable_bytes(name).await {
            Err(SnapshotActionError::NoSuchSnapshot(_)) => self
                .get_shared(name)
                .await
                .map_err(|error| shared(format!("the snapshot bucket: {error}")))?
                .ok_or_else(|| SnapshotActionError::NoSuchSnapshot(name.to_owned()))?,
            other => other?,
        };
        let (object, sha256) = self
            .put_restore(&bytes)
            .await
            .map_err(|error| shared(format!("the snapshot bucket: {error}")))?;
        let entry = Entry::Restore(RestoreEntry {
            object,
            sha256,
            at_ms: unix_ms_now(),
        });
        let published = stream
            .publish(
                "_restore",
                entry.encode(),
                stream.own_id(),
                Publishing::Request,
            )
            .await
            .map_err(|error| shared(error.to_string()))?;
        let sequence = published.sequence;
        let mut outcomes = self.restores.subscribe();
        let applied = tokio::time::timeout(
            stream.timeout(),
            outcomes.wait_for(|outcomes| outcomes.contains_key(&sequence)),
        );
        if !matches!(applied.await, Ok(Ok(_))) {
            return Err(shared(format!(
                "published at sequence {sequence}, not applied by this node within {:?}",
                stream.timeout()
            )));
        }
        let mut outcome = None;
        self.restores
            .send_modify(|outcomes| outcome = outcomes.remove(&sequence));
        match outcome {
            Some(Ok(restored)) => Ok(restored),
            Some(Err(error)) => Err(SnapshotActionError::Unrestorable(error.to_string())),
            None => Err(shared(format!(
                "no outcome for the restore at sequence {sequence}"
            ))),
        }
    }

    /// Restores the snapshot a restore record names, at its position, under the epoch every
    /// node takes there. A snapshot that cannot be restored here cannot be anywhere (every node
    /// runs the same modules at this position): it is refused alike, nothing changes.
    ///
    /// # Errors
    /// [`Halt::Restore`]: the snapshot cannot be fetched, and the node must stop applying.
    pub(super) async fn apply_restore(
        &self,
        appliers: &Appliers,
        log: &Log,
        sequence: LogPosition,
        restore: RestoreEntry,
    ) -> Result<(), Halt> {
        let bytes = match self.get_restore(&restore.object, &restore.sha256).await {
            Ok(bytes) => bytes,
            Err(error) => {
                return Err(Halt::Restore {
                    sequence,
                    object: restore.object,
                    source: Arc::from(error),
                })
            }
        };
        let at = RestoreAt {
            epoch: restored_epoch(self.epoch, sequence),
            position: sequence,
        };
        let outcome = match appliers.snapshots.restore_encoded(&bytes, at).await {
            Ok(restored) => {
                tracing::info!(sequence = sequence.get(), epoch = %restored.epoch, "cluster: snapshot restored; every subscriber is reset");
                Ok(restored)
            }
            Err(error) => {
                tracing::warn!(%error, sequence = sequence.get(), "cluster: the restore is refused; nothing changed");
                drop(log.turn(Some(sequence), 1).await);
                Err(error)
            }
        };
        self.restores.send_modify(|outcomes| {
            outcomes.insert(sequence, outcome);
            while outcomes.len() > OUTCOMES_KEPT {
                outcomes.pop_first();
            }
        });
        Ok(())
    }
}
