use std::io;
use std::path::{Path, PathBuf};

use super::MAX_RECORD_BYTES;

/// What went wrong with a log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// Reading, writing or syncing a file failed.
    #[error("log I/O failed: {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A payload over [`MAX_RECORD_BYTES`].
    #[error("log record of {0} bytes is over the limit of {MAX_RECORD_BYTES}")]
    TooLarge(usize),
    /// A write or sync failed (this one or an earlier one); nothing more is written until the
    /// log is reopened and scanned.
    #[error("the log is poisoned ({0}); nothing is written until it is reopened")]
    Poisoned(String),
    /// The writer's thread has stopped.
    #[error("the log writer has stopped")]
    Stopped,
}

impl LogError {
    pub(super) fn io(action: &'static str, path: &Path, source: io::Error) -> Self {
        Self::Io {
            action,
            path: path.to_owned(),
            source,
        }
    }
}
