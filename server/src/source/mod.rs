//! Sources: where a runtime's input comes from.
//!
//! Two kinds feed a runtime: *push* sources, whose input arrives with a request (the HTTP
//! ingest body, wired in the server) and needs no checkpoint, and *pull* sources that the
//! server reads itself and must resume after a restart — today [`FileTail`], which follows a
//! file of lines like `tail -F`. A pull source's position is a [`SourceCheckpoint`], stored
//! with the runtime's state in snapshots. Sources know nothing of runtimes: a runtime's
//! handle follows one (`RuntimeHandle::follow`).

mod file_tail;

use serde::{Deserialize, Serialize};

pub use file_tail::{FileCheckpoint, FileTail, FileTailConfig};

/// Where a pull source stands: what a snapshot stores next to the runtime's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum SourceCheckpoint {
    /// A position in a followed file.
    FileTail(FileCheckpoint),
}
