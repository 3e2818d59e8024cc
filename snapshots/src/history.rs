//! The identity of a data directory's history: [`HistoryId`], made once, and [`DataHistory`],
//! the small file that keeps it.
//!
//! Every snapshot header and every log segment header carries the history id of the data
//! directory that wrote it. A file that carries another id — another server's log copied in, a
//! snapshot restored from the wrong backup — belongs to another history: its positions and
//! offsets mean something else, so it is refused (set aside, never replayed or adopted), the way
//! PostgreSQL refuses a WAL file whose system identifier is not its own.
//!
//! ## The file
//!
//! `<data-dir>/history`, written once (temp file, fsync, rename, fsync of the directory), text:
//!
//! ```text
//! viewtape-history 1
//! id 6f1c0e4d9a2b7c3e5f60718293a4b5c6
//! legacy-log-through 118
//! legacy-snapshot-seq 12
//! ```
//!
//! The two `legacy-` lines are written only when the file is made in a data directory that
//! already holds files of the formats before history ids (log segments of version 1, snapshots
//! of version 1). Those files are this directory's own — they were there when it got its
//! identity — and stay readable: a version-1 segment whose first position is at most
//! `legacy-log-through`, and a version-1 snapshot whose write sequence is at most
//! `legacy-snapshot-seq`. This build never writes version 1, so any later version-1 file was
//! copied in and is refused.
//!
//! A damaged or unreadable history file stops the start: guessing an identity would either adopt
//! foreign files or refuse the directory's own.

use std::fmt;
use std::fs::{self, File};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::position::LogPosition;

/// The name of the file in the data directory.
pub const HISTORY_FILE: &str = "history";
const FIRST_LINE: &str = "viewtape-history 1";

/// A random 128-bit identity, made once per data directory. All zeros means "none" (a file
/// written without one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HistoryId([u8; 16]);

impl HistoryId {
    /// A fresh random id. std's `RandomState` is keyed from the OS's randomness; two keyed
    /// hashes of nothing give 128 unpredictable bits without another dependency.
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        for (i, half) in bytes.chunks_exact_mut(8).enumerate() {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(0x6869_7374_6f72_7900 | i as u64);
            half.copy_from_slice(&hasher.finish().to_le_bytes());
        }
        if bytes == [0; 16] {
            bytes[0] = 1;
        }
        Self(bytes)
    }

    /// The id from its 16 bytes; `None` for all zeros.
    pub fn from_bytes(bytes: [u8; 16]) -> Option<Self> {
        (bytes != [0; 16]).then_some(Self(bytes))
    }

    /// Its 16 bytes.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0
    }

    /// The bytes a header stores for `id` (zeros for none).
    pub(crate) fn bytes_of(id: Option<Self>) -> [u8; 16] {
        id.map_or([0; 16], Self::to_bytes)
    }

    fn parse_hex(text: &str) -> Option<Self> {
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Self::from_bytes(bytes)
    }
}

impl fmt::Display for HistoryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Which files of the formats before history ids belong to this directory (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Legacy {
    /// A version-1 segment is this directory's if its first position is at most this.
    pub log_through: Option<LogPosition>,
    /// A version-1 snapshot is this directory's if its write sequence is at most this.
    pub snapshot_seq: Option<crate::seq::SnapshotSeq>,
}

/// A data directory's history: its id and the legacy files it owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataHistory {
    /// The id every file it writes carries.
    pub id: HistoryId,
    /// The files from before history ids that it adopted when the id was made.
    pub legacy: Legacy,
}

/// Why the history file could not be read or made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// Reading or writing it failed.
    #[error("history file I/O failed: {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// It is not a history file this build reads.
    #[error("history file {} is damaged: {reason}", path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong (in the message already, so not its `source`).
        reason: HistoryParseError,
    },
}

/// Why the text of a history file is not one this build reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryParseError {
    /// The first line is not the format's.
    #[error("the first line is not {FIRST_LINE:?}")]
    FirstLine,
    /// A line that is not a key, a space and a value.
    #[error("line {0:?} is not `key value`")]
    NotKeyValue(String),
    /// The value of a numeric key is not a number.
    #[error("{key} {value:?} is not a number")]
    NotANumber {
        /// The key.
        key: String,
        /// Its value.
        value: String,
    },
    /// The id is not 32 hex digits (or is all zeros).
    #[error("id {0:?} is not 32 hex digits")]
    BadId(String),
    /// A key this build does not know.
    #[error("unknown key {0:?}")]
    UnknownKey(String),
    /// No `id` line.
    #[error("no id line")]
    NoId,
}

impl DataHistory {
    /// A new history with a random id, adopting `legacy`.
    pub fn new(legacy: Legacy) -> Self {
        Self {
            id: HistoryId::random(),
            legacy,
        }
    }

    /// Whether a file carrying `found` (`None`: a version-1 file) at `legacy_key` (a segment's
    /// first position or a snapshot's write sequence) belongs to this history, where `through`
    /// picks the matching legacy bound.
    pub fn owns<K: Ord>(
        &self,
        found: Option<HistoryId>,
        legacy_key: K,
        through: Option<K>,
    ) -> bool {
        match found {
            Some(id) => id == self.id,
            None => through.is_some_and(|t| legacy_key <= t),
        }
    }

    /// Reads the history file in `data_dir`; when there is none, makes one (durably) with
    /// `legacy()` — what the directory already holds — and returns it with `true`.
    ///
    /// # Errors
    /// The file cannot be read, is damaged, or cannot be written.
    pub fn open_or_create(
        data_dir: &Path,
        legacy: impl FnOnce() -> Legacy,
    ) -> Result<(Self, bool), HistoryError> {
        let path = data_dir.join(HISTORY_FILE);
        match fs::read_to_string(&path) {
            Ok(text) => Self::parse(&text)
                .map(|history| (history, false))
                .map_err(|reason| HistoryError::Damaged { path, reason }),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                let history = Self::new(legacy());
                history.write(data_dir)?;
                Ok((history, true))
            }
            Err(source) => Err(HistoryError::Io {
                action: "read",
                path,
                source,
            }),
        }
    }

    /// Writes the file atomically into `data_dir`.
    fn write(&self, data_dir: &Path) -> Result<(), HistoryError> {
        let path = data_dir.join(HISTORY_FILE);
        let tmp = data_dir.join(format!(".tmp-{HISTORY_FILE}"));
        let io = |action: &'static str, path: &Path| {
            let path = path.to_owned();
            move |source| HistoryError::Io {
                action,
                path,
                source,
            }
        };
        fs::create_dir_all(data_dir).map_err(io("create directory", data_dir))?;
        let mut file = File::create(&tmp).map_err(io("create", &tmp))?;
        file.write_all(self.render().as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(io("write", &tmp))?;
        fs::rename(&tmp, &path).map_err(io("rename", &path))?;
        File::open(data_dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io("sync directory", data_dir))
    }

    fn render(&self) -> String {
        let mut text = format!("{FIRST_LINE}\nid {}\n", self.id);
        if let Some(through) = self.legacy.log_through {
            text.push_str(&format!("legacy-log-through {through}\n"));
        }
        if let Some(seq) = self.legacy.snapshot_seq {
            text.push_str(&format!("legacy-snapshot-seq {seq}\n"));
        }
        text
    }

    fn parse(text: &str) -> Result<Self, HistoryParseError> {
        let mut lines = text.lines();
        if lines.next() != Some(FIRST_LINE) {
            return Err(HistoryParseError::FirstLine);
        }
        let mut id = None;
        let mut legacy = Legacy::default();
        for line in lines {
            let (key, value) = line
                .split_once(' ')
                .ok_or_else(|| HistoryParseError::NotKeyValue(line.to_owned()))?;
            fn number<N: std::str::FromStr>(
                key: &str,
                value: &str,
            ) -> Result<N, HistoryParseError> {
                value
                    .parse::<N>()
                    .map_err(|_| HistoryParseError::NotANumber {
                        key: key.to_owned(),
                        value: value.to_owned(),
                    })
            }
            match key {
                "id" => {
                    id = Some(
                        HistoryId::parse_hex(value)
                            .ok_or_else(|| HistoryParseError::BadId(value.to_owned()))?,
                    )
                }
                "legacy-log-through" => legacy.log_through = Some(number(key, value)?),
                "legacy-snapshot-seq" => legacy.snapshot_seq = Some(number(key, value)?),
                _ => return Err(HistoryParseError::UnknownKey(key.to_owned())),
            }
        }
        Ok(Self {
            id: id.ok_or(HistoryParseError::NoId)?,
            legacy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_is_made_once_and_read_back() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let legacy = Legacy {
            log_through: Some(LogPosition::new(118)),
            snapshot_seq: None,
        };
        let (made, created) = DataHistory::open_or_create(tmp.path(), || legacy)?;
        assert!(created);
        let (read, created) = DataHistory::open_or_create(tmp.path(), Legacy::default)?;
        assert!(!created);
        assert_eq!(read, made);
        assert!(read.owns(Some(made.id), 0, None));
        assert!(!read.owns(Some(HistoryId::random()), 0, None));
        assert!(read.owns(None, LogPosition::new(118), read.legacy.log_through));
        assert!(!read.owns(None, LogPosition::new(119), read.legacy.log_through));
        assert!(!read.owns(
            None,
            crate::seq::SnapshotSeq::new(1),
            read.legacy.snapshot_seq
        ));
        assert_ne!(HistoryId::random(), HistoryId::random());
        Ok(())
    }

    #[test]
    fn a_damaged_history_file_is_told_in_the_words_a_reader_sees() {
        let id = "id 6f1c0e4d9a2b7c3e5f60718293a4b5c6";
        for (text, words) in [
            ("", "the first line is not \"viewtape-history 1\""),
            (
                "viewtape-history 1\nsome",
                "line \"some\" is not `key value`",
            ),
            (
                "viewtape-history 1\nid 12",
                "id \"12\" is not 32 hex digits",
            ),
            (
                &format!("viewtape-history 1\n{id}\nlegacy-log-through x"),
                "legacy-log-through \"x\" is not a number",
            ),
            ("viewtape-history 1\nsome thing", "unknown key \"some\""),
            ("viewtape-history 1\n", "no id line"),
        ] {
            let error = DataHistory::parse(text).err().map(|e| e.to_string());
            assert_eq!(error.as_deref(), Some(words), "{text:?}");
        }
        let damaged = HistoryError::Damaged {
            path: PathBuf::from("/data/history"),
            reason: HistoryParseError::NoId,
        };
        assert_eq!(
            damaged.to_string(),
            "history file /data/history is damaged: no id line"
        );
    }

    #[test]
    fn a_damaged_history_file_is_refused() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        for text in [
            "",
            "viewtape-history 1\n",
            "viewtape-history 1\nid 12\n",
            "viewtape-history 1\nid 6f1c0e4d9a2b7c3e5f60718293a4b5c6\nsome thing\n",
            "viewtape-history 2\nid 6f1c0e4d9a2b7c3e5f60718293a4b5c6\n",
        ] {
            fs::write(tmp.path().join(HISTORY_FILE), text)?;
            assert!(
                matches!(
                    DataHistory::open_or_create(tmp.path(), Legacy::default),
                    Err(HistoryError::Damaged { .. })
                ),
                "{text:?}"
            );
        }
        Ok(())
    }
}
