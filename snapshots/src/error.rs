//! Errors, one enum per operation family (the redb habit):
//!
//! - [`FormatError`] — bytes in memory are not a snapshot this build can load (or a body could
//!   not be encoded). It knows nothing of files.
//! - [`SnapshotError`] — the umbrella for operations on files and directories: it names the
//!   file, and wraps either a [`FormatError`] (the file is *invalid*) or an I/O error.

use std::io;
use std::path::PathBuf;

/// Why a byte buffer is not a loadable snapshot, or why a body could not be encoded.
///
/// Every variant but [`FormatError::Encode`] means "this file is damaged, foreign, or from a
/// newer viewtape": such a file is refused and kept on disk for inspection, never deleted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// Fewer bytes than the fixed header needs.
    #[error("short file: {len} bytes, a snapshot header needs {needed}")]
    Short {
        /// Bytes present.
        len: u64,
        /// Bytes the header needs.
        needed: u64,
    },
    /// The file does not start with the viewtape snapshot magic bytes.
    #[error("not a viewtape snapshot: magic bytes are {found:02x?}")]
    ForeignMagic {
        /// The first bytes of the file (at most 8).
        found: Vec<u8>,
    },
    /// The format version is not one this build reads (0, or newer than this build).
    #[error("unsupported snapshot format version {found} (this build reads version {supported}{})",
        if *found > *supported { "; written by a newer viewtape" } else { "" })]
    UnsupportedVersion {
        /// The version in the header.
        found: u16,
        /// The newest version this build reads.
        supported: u16,
    },
    /// The header's own checksum does not match: some header byte changed.
    #[error("header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    HeaderChecksum {
        /// Checksum stored in the header.
        stored: u32,
        /// Checksum computed over the header bytes.
        computed: u32,
    },
    /// The header sets flag bits this build does not know.
    #[error("unknown header flags {flags:#06x}")]
    UnknownFlags {
        /// The raw flags.
        flags: u16,
    },
    /// The file ends before the body the header announces.
    #[error("truncated body: header announces {expected} body bytes, the file holds {actual}")]
    Truncated {
        /// Body length announced by the header.
        expected: u64,
        /// Body bytes present.
        actual: u64,
    },
    /// The file holds bytes after the body the header announces.
    #[error("trailing bytes: header announces {expected} body bytes, the file holds {actual}")]
    TrailingBytes {
        /// Body length announced by the header.
        expected: u64,
        /// Body bytes present.
        actual: u64,
    },
    /// The body's checksum does not match: some body byte changed.
    #[error("body checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BodyChecksum {
        /// Checksum stored in the header.
        stored: u32,
        /// Checksum computed over the body.
        computed: u32,
    },
    /// The file is intact but was written by another data directory (another server, another
    /// history): its positions and offsets mean something else here.
    #[error("the snapshot belongs to another history (its id is {}, this data directory's is {ours})",
        found.map_or_else(|| "unknown: format version 1, written after this directory got its id".to_owned(), |id| id.to_string()))]
    ForeignHistory {
        /// The id it carries (`None`: a version-1 file).
        found: Option<crate::history::HistoryId>,
        /// This directory's.
        ours: crate::history::HistoryId,
    },
    /// The body is intact (checksum verified) but does not decode as the requested type.
    #[error("body does not decode as {type_name}: {source}")]
    Body {
        /// The Rust type the caller asked for.
        type_name: &'static str,
        /// The MessagePack decoder's error.
        #[source]
        source: rmp_serde::decode::Error,
    },
    /// The body could not be encoded (a `Serialize` impl failed).
    #[error("body could not be encoded: {0}")]
    Encode(#[source] rmp_serde::encode::Error),
}

impl FormatError {
    /// `true` when the bytes are not a loadable snapshot (everything but an encode failure).
    pub fn is_invalid_snapshot(&self) -> bool {
        !matches!(self, FormatError::Encode(_))
    }
}

/// An error from an operation on snapshot files or a snapshot directory.
///
/// Its message names the file and the reason, e.g.
/// `snapshot /var/lib/viewtape/snap-….vtsnap is invalid: body checksum mismatch: …`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The file exists and was read, but is not a valid snapshot (see [`FormatError`]).
    /// Such a file is never deleted by this crate.
    #[error("snapshot {} is invalid: {source}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Why it is refused.
        #[source]
        source: FormatError,
    },
    /// An I/O operation on a file or directory failed.
    #[error("snapshot I/O failed: {action} {}: {source}", path.display())]
    Io {
        /// What was being done, e.g. `"fsync"`.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A body could not be encoded before writing.
    #[error("snapshot body could not be encoded: {0}")]
    Encode(#[source] FormatError),
    /// [`crate::SnapshotDir::consume_exact`] was given a snapshot that is not an unconsumed exact
    /// one.
    #[error("snapshot {} is not an unconsumed exact snapshot", path.display())]
    NotExact {
        /// The file.
        path: PathBuf,
    },
}

impl SnapshotError {
    /// The file or directory the error is about, if any.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            SnapshotError::Invalid { path, .. }
            | SnapshotError::Io { path, .. }
            | SnapshotError::NotExact { path } => Some(path),
            SnapshotError::Encode(_) => None,
        }
    }

    /// The validation failure when the error says the file is invalid.
    pub fn format_error(&self) -> Option<&FormatError> {
        match self {
            SnapshotError::Invalid { source, .. } => Some(source),
            _ => None,
        }
    }

    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        SnapshotError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn invalid(path: impl Into<PathBuf>, source: FormatError) -> Self {
        SnapshotError::Invalid {
            path: path.into(),
            source,
        }
    }
}
