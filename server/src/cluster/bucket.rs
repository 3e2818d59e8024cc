//! The cluster's object store bucket: snapshots shared by epoch and position, modules by
//! SHA-256 (`module-<hex>`), and snapshot files put there to be restored by every node
//! (`restore-<hex>`).

use std::sync::Arc;

use async_nats::jetstream::object_store;
use futures_util::StreamExt as _;
use sha2::Digest as _;
use tokio::task::JoinHandle;
use tracing::Instrument as _;
use viewtape_journal::JournalEpoch;

use super::{Cluster, SHARED_KEPT};
use crate::host::ModuleFingerprint;
use crate::log::LogPosition;
use crate::snapshot::Snapshots;

/// A boxed error of NATS or of the object store.
pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Cluster {
    /// Shares every snapshot `snapshots` writes from now on in the bucket, keeping the newest
    /// [`SHARED_KEPT`] of this epoch.
    pub fn spawn_share(self: &Arc<Self>, snapshots: &Snapshots) -> JoinHandle<()> {
        let cluster = Arc::clone(self);
        let mut written = snapshots.follow_written();
        let span = tracing::info_span!("cluster_share", stream = %self.stream);
        tokio::spawn(
            async move {
                while written.changed().await.is_ok() {
                    let Some((path, position)) = written.borrow_and_update().clone() else {
                        continue;
                    };
                    if let Err(error) = cluster.share(&path, position).await {
                        tracing::warn!(%error, file = %path.display(), "cluster: sharing a snapshot failed");
                    }
                }
            }
            .instrument(span),
        )
    }

    /// Puts the snapshot `path` (at stream sequence `position`) in the bucket, and deletes this
    /// epoch's older ones past [`SHARED_KEPT`].
    async fn share(&self, path: &std::path::Path, position: LogPosition) -> Result<(), BoxError> {
        let bytes = tokio::fs::read(path).await?;
        let name = shared_name(self.epoch, position);
        // The file's name, by which any node may name it in a restore.
        let meta = object_store::ObjectMetadata {
            name: name.clone(),
            description: path.file_name().map(|f| f.to_string_lossy().into_owned()),
            ..object_store::ObjectMetadata::default()
        };
        self.bucket.put(meta, &mut bytes.as_slice()).await?;
        let mut ours = Vec::new();
        let mut list = self.bucket.list().await?;
        while let Some(info) = list.next().await {
            let info = info?;
            if let Some(position) = shared_position(&info.name, self.epoch) {
                ours.push((position, info.name));
            }
        }
        ours.sort_unstable();
        let old = ours.len().saturating_sub(SHARED_KEPT);
        for (_, name) in ours.drain(..old) {
            self.bucket.delete(&name).await?;
        }
        tracing::debug!(name, "cluster: snapshot shared");
        Ok(())
    }

    /// Puts `wasm` in the bucket under its fingerprint, unless it is there already.
    ///
    /// # Errors
    /// The bucket cannot be read or written.
    pub async fn put_module(&self, wasm: &[u8]) -> Result<ModuleFingerprint, BoxError> {
        let fingerprint = ModuleFingerprint::of(wasm);
        let name = module_name(&fingerprint);
        if self.bucket.info(&name).await.is_err() {
            self.bucket.put(name.as_str(), &mut &wasm[..]).await?;
            tracing::info!(module = %fingerprint, "cluster: module put in the bucket");
        }
        Ok(fingerprint)
    }

    /// The module `fingerprint` from the bucket, checked against it.
    ///
    /// # Errors
    /// It is not there, cannot be read, or its bytes are another module's.
    pub async fn get_module(&self, fingerprint: &ModuleFingerprint) -> Result<Vec<u8>, BoxError> {
        let wasm = self.get_object(&module_name(fingerprint)).await?;
        if ModuleFingerprint::of(&wasm) != *fingerprint {
            return Err(
                format!("the bucket's copy of module {fingerprint} holds other bytes").into(),
            );
        }
        Ok(wasm)
    }

    /// Puts a snapshot file's bytes in the bucket for every node to restore; returns its object
    /// name and SHA-256 (hex).
    ///
    /// # Errors
    /// The bucket cannot be written.
    pub async fn put_restore(&self, bytes: &[u8]) -> Result<(String, String), BoxError> {
        let sha256 = hex(&sha2::Sha256::digest(bytes));
        let name = format!("restore-{sha256}");
        self.bucket.put(name.as_str(), &mut &bytes[..]).await?;
        Ok((name, sha256))
    }

    /// The snapshot file `name` put there to be restored, checked against its SHA-256.
    ///
    /// # Errors
    /// It is not there, cannot be read, or holds other bytes.
    pub async fn get_restore(&self, name: &str, sha256: &str) -> Result<Vec<u8>, BoxError> {
        let bytes = self.get_object(name).await?;
        if hex(&sha2::Sha256::digest(&bytes)) != sha256 {
            return Err(
                format!("the bucket's {name} is not the snapshot the restore names").into(),
            );
        }
        Ok(bytes)
    }

    /// The shared snapshot that a node wrote as the file `file`, or is named `file` in the
    /// bucket; `None` when there is none.
    ///
    /// # Errors
    /// The bucket cannot be read.
    pub(super) async fn get_shared(&self, file: &str) -> Result<Option<Vec<u8>>, BoxError> {
        let mut found = None;
        let mut list = self.bucket.list().await?;
        while let Some(info) = list.next().await {
            let info = info?;
            let shared = shared_position(&info.name, self.epoch).is_some();
            if shared && (info.name == file || info.description.as_deref() == Some(file)) {
                found = Some(info.name);
            }
        }
        match found {
            Some(name) => Ok(Some(self.get_object(&name).await?)),
            None => Ok(None),
        }
    }

    pub(super) async fn get_object(&self, name: &str) -> Result<Vec<u8>, BoxError> {
        let mut object = self.bucket.get(name).await?;
        let mut bytes = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut object, &mut bytes).await?;
        Ok(bytes)
    }
}

/// A module's object name.
fn module_name(fingerprint: &ModuleFingerprint) -> String {
    let text = fingerprint.to_string();
    format!("module-{}", text.strip_prefix("sha256:").unwrap_or(&text))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The name of a shared snapshot: its epoch and stream position.
pub(super) fn shared_name(epoch: JournalEpoch, position: LogPosition) -> String {
    format!("{epoch}-{position:020}")
}

/// The position in a shared snapshot's name, if it is one of `epoch`.
pub(super) fn shared_position(name: &str, epoch: JournalEpoch) -> Option<LogPosition> {
    let (of, position) = name.split_once('-')?;
    (of == epoch.to_string()).then(|| position.parse().ok())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_snapshot_names_carry_epoch_and_position() {
        let epoch = JournalEpoch::from_bits(42);
        let name = shared_name(epoch, LogPosition::new(42));
        assert_eq!(shared_position(&name, epoch), Some(LogPosition::new(42)));
        assert_eq!(shared_position(&name, JournalEpoch::from_bits(43)), None);
        assert_eq!(shared_position("garbage", epoch), None);
        assert_eq!(shared_position(&format!("{epoch}-x"), epoch), None);
        assert_eq!(shared_position("module-00ab", epoch), None);
        // Names sort as positions do.
        assert!(shared_name(epoch, LogPosition::new(9)) < shared_name(epoch, LogPosition::new(10)));
    }
}
