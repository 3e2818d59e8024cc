//! A directory of snapshot files: atomic writes, listing, loading with fallback, retention, and
//! consuming exact snapshots (see the crate docs for the rules).
//!
//! | file | job |
//! |---|---|
//! | this one | the names' constants and the public names |
//! | `name` | file names: [`SnapshotKind`] and the name's parts |
//! | `info` | what the directory hands back: [`SnapshotInfo`], [`SnapshotEntry`], [`Loaded`], reports |
//! | `directory` | [`SnapshotDir`]: opening, its history, setting foreign files aside |
//! | `write` | atomic writes, retention, temp files |
//! | `load` | listing, loading with fallback, consuming exact snapshots |
//! | `file` | one file: [`read_header`], [`verify_file`], [`load_file`], and the I/O helpers |

mod directory;
mod file;
mod info;
mod load;
mod name;
mod write;

#[cfg(test)]
mod tests;

pub use directory::SnapshotDir;
pub use file::{load_file, read_header, verify_file};
pub use info::{
    Loaded, NewestValid, PruneReport, Skipped, SnapshotEntry, SnapshotInfo, StartupRestore,
};
pub use name::{SnapshotKind, SnapshotSeq};

/// How many periodic snapshots [`SnapshotDir::prune`] keeps by default (plus the newest exact).
pub const DEFAULT_KEEP_PERIODIC: usize = 5;

const FILE_PREFIX: &str = "snap-";
const FILE_EXT: &str = ".vtsnap";
/// Temp files start with a dot so they are hidden, and never parse as a snapshot name.
const TEMP_PREFIX: &str = ".tmp-";
/// What a snapshot of another history is renamed to: out of every listing, kept.
pub const FOREIGN_SUFFIX: &str = ".foreign";
