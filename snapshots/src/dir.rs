//! A directory of snapshot files: atomic writes, listing, loading with fallback, retention, and
//! consuming exact snapshots (see the crate docs for the rules).

use crate::codec;
use crate::error::{FormatError, SnapshotError};
use crate::header::{SnapshotHeader, SnapshotMeta, HEADER_LEN};
use crate::history::DataHistory;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// How many periodic snapshots [`SnapshotDir::prune`] keeps by default (plus the newest exact).
pub const DEFAULT_KEEP_PERIODIC: usize = 5;

const FILE_PREFIX: &str = "snap-";
const FILE_EXT: &str = ".vtsnap";
/// Temp files start with a dot so they are hidden, and never parse as a snapshot name.
const TEMP_PREFIX: &str = ".tmp-";
/// What a snapshot of another history is renamed to: out of every listing, kept.
pub const FOREIGN_SUFFIX: &str = ".foreign";

/// The kind a snapshot file's *name* states.
///
/// A file is treated as exact only when its name says [`SnapshotKind::Exact`] **and** its header
/// carries the exact flag; every other combination loads as periodic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SnapshotKind {
    /// Exact and not yet adopted by a server life.
    Exact,
    /// Periodic: taken while running.
    Periodic,
    /// Was exact, and a server life has adopted its epoch: from now on it loads as periodic.
    Consumed,
}

impl SnapshotKind {
    /// The word used in file names: `exact`, `periodic` or `consumed`.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Exact => "exact",
            SnapshotKind::Periodic => "periodic",
            SnapshotKind::Consumed => "consumed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "exact" => Some(SnapshotKind::Exact),
            "periodic" => Some(SnapshotKind::Periodic),
            "consumed" => Some(SnapshotKind::Consumed),
            _ => None,
        }
    }
}

impl std::fmt::Display for SnapshotKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The parts of a snapshot file name `snap-<unix_ms:016>-<seq:010>-<kind>.vtsnap`.
///
/// Ordering is by `(unix_ms, seq)`: the writer keeps both non-decreasing, so this is write order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct FileName {
    unix_ms: u64,
    seq: u64,
    kind: SnapshotKind,
}

impl FileName {
    fn render(&self) -> String {
        format!(
            "{FILE_PREFIX}{:016}-{:010}-{}{FILE_EXT}",
            self.unix_ms, self.seq, self.kind
        )
    }

    fn parse(name: &str) -> Option<Self> {
        let mid = name.strip_prefix(FILE_PREFIX)?.strip_suffix(FILE_EXT)?;
        let mut parts = mid.splitn(3, '-');
        let digits = |s: &str| -> Option<u64> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            s.parse().ok()
        };
        let unix_ms = digits(parts.next()?)?;
        let seq = digits(parts.next()?)?;
        let kind = SnapshotKind::parse(parts.next()?)?;
        Some(FileName { unix_ms, seq, kind })
    }
}

/// A snapshot file whose header and body checksum have been verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    path: PathBuf,
    name: FileName,
    header: SnapshotHeader,
}

impl SnapshotInfo {
    /// The file's full path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file name, e.g. `snap-0001764409200000-0000000007-exact.vtsnap`.
    pub fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.name.render())
    }

    /// The write sequence number from the file name (strictly increasing per directory).
    pub fn seq(&self) -> u64 {
        self.name.seq
    }

    /// The kind the file name states.
    pub fn kind(&self) -> SnapshotKind {
        self.name.kind
    }

    /// `true` when this snapshot's epoch and offsets may be adopted: its name says exact (not
    /// consumed) and its header carries the exact flag. Adopt only after
    /// [`SnapshotDir::consume_exact`] succeeded.
    pub fn is_exact(&self) -> bool {
        self.name.kind == SnapshotKind::Exact && self.header.is_exact()
    }

    /// The verified header.
    pub fn header(&self) -> &SnapshotHeader {
        &self.header
    }

    /// Creation time from the header, unix milliseconds.
    pub fn created_at_ms(&self) -> u64 {
        self.header.created_at_ms()
    }

    /// File size in bytes.
    pub fn size(&self) -> u64 {
        self.header.file_len()
    }
}

/// One snapshot file found by [`SnapshotDir::list`], valid or not.
#[derive(Debug)]
pub struct SnapshotEntry {
    /// The file's full path.
    pub path: PathBuf,
    /// The file name.
    pub file_name: String,
    /// The kind the file name states.
    pub kind: SnapshotKind,
    /// The write sequence number from the name.
    pub seq: u64,
    /// The creation time from the name, unix milliseconds (the header's when valid is in
    /// `status`).
    pub name_created_at_ms: u64,
    /// The file size on disk, in bytes.
    pub size: u64,
    /// The verified snapshot, or why the file is refused (header, length and body checksum are
    /// checked; the body is not decoded).
    pub status: Result<SnapshotInfo, SnapshotError>,
}

impl SnapshotEntry {
    /// `true` when header, length and checksum verified.
    pub fn is_valid(&self) -> bool {
        self.status.is_ok()
    }

    /// `true` when valid and exact (see [`SnapshotInfo::is_exact`]).
    pub fn is_exact(&self) -> bool {
        self.status.as_ref().is_ok_and(SnapshotInfo::is_exact)
    }

    /// Creation time: the header's when valid, else the name's.
    pub fn created_at_ms(&self) -> u64 {
        match &self.status {
            Ok(info) => info.created_at_ms(),
            Err(_) => self.name_created_at_ms,
        }
    }
}

/// A snapshot that was validated and decoded.
#[derive(Debug)]
pub struct Loaded<T> {
    /// The file it came from.
    pub info: SnapshotInfo,
    /// The decoded body.
    pub body: T,
}

/// A snapshot file that [`SnapshotDir::load_newest_valid`] passed over, and why.
#[derive(Debug)]
pub struct Skipped {
    /// The file.
    pub path: PathBuf,
    /// Why it was refused (its message names the file and the reason).
    pub error: SnapshotError,
    /// Where it went when it belongs to another history (renamed `….vtsnap.foreign`); `None`
    /// when it stayed (a damaged file stays where it is).
    pub set_aside: Option<PathBuf>,
}

impl Skipped {
    /// `true` when the file is intact but of another data directory's history.
    pub fn is_foreign(&self) -> bool {
        matches!(
            self.error.format_error(),
            Some(FormatError::ForeignHistory { .. })
        )
    }
}

/// What [`SnapshotDir::load_newest_valid`] found.
#[derive(Debug)]
pub struct NewestValid<T> {
    /// The newest snapshot that validated and decoded, if any.
    pub loaded: Option<Loaded<T>>,
    /// Newer files that were refused, newest first: log them ("fell back to X because Y").
    pub skipped: Vec<Skipped>,
}

/// What [`SnapshotDir::load_for_start`] decided.
#[derive(Debug)]
pub struct StartupRestore<T> {
    /// The newest valid snapshot, if any. When exact and adopted, it is now named `consumed`.
    pub loaded: Option<Loaded<T>>,
    /// `true` only when the snapshot was exact **and** it was durably consumed: hydrate with the
    /// snapshot's epoch. `false`: hydrate the state but take a fresh epoch.
    pub adopt_epoch: bool,
    /// Newer files that were refused, newest first.
    pub skipped: Vec<Skipped>,
    /// Set when an exact snapshot could not be consumed (so `adopt_epoch` is `false`).
    pub consume_error: Option<SnapshotError>,
}

/// What [`SnapshotDir::prune`] did.
#[derive(Debug, Default)]
pub struct PruneReport {
    /// Valid snapshots kept (the newest exact and the newest periodic ones).
    pub kept: Vec<PathBuf>,
    /// Files that failed validation: never deleted, kept for inspection.
    pub kept_invalid: Vec<PathBuf>,
    /// Files removed.
    pub removed: Vec<PathBuf>,
}

/// The highest name handed out so far; the next name is strictly after it.
#[derive(Debug, Default)]
struct NameState {
    last_ms: u64,
    last_seq: u64,
}

/// A directory holding snapshot files.
///
/// One server owns a directory; other readers (the CLI's `verify`) may list and load
/// concurrently. All methods take `&self`; the type is `Send + Sync`.
#[derive(Debug)]
pub struct SnapshotDir {
    dir: PathBuf,
    keep_periodic: usize,
    names: Mutex<NameState>,
    history: Option<History>,
}

/// The history a directory's files must carry, and whether others are refused.
#[derive(Clone, Copy, Debug)]
struct History {
    history: DataHistory,
    refuse_foreign: bool,
}

impl SnapshotDir {
    /// Opens `dir`, creating it if missing, and scans existing names so new files sort after
    /// them.
    ///
    /// # Errors
    /// [`SnapshotError::Io`] when the directory cannot be created or read.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, SnapshotError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| SnapshotError::io("create directory", &dir, e))?;
        Self::open_existing(dir)
    }

    /// Opens a directory that must already exist, creating nothing: for inspection.
    ///
    /// # Errors
    /// [`SnapshotError::Io`] when the directory does not exist or cannot be listed.
    pub fn open_existing(dir: impl Into<PathBuf>) -> Result<Self, SnapshotError> {
        let dir = dir.into();
        let mut state = NameState::default();
        for (_, name) in scan(&dir)? {
            state.last_ms = state.last_ms.max(name.unix_ms);
            state.last_seq = state.last_seq.max(name.seq);
        }
        Ok(SnapshotDir {
            dir,
            keep_periodic: DEFAULT_KEEP_PERIODIC,
            names: Mutex::new(state),
            history: None,
        })
    }

    /// Stamps every snapshot written from now on with `history`'s id; with `refuse_foreign`,
    /// loading and listing also refuse a file of another history
    /// ([`FormatError::ForeignHistory`]), and [`SnapshotDir::load_newest_valid`] sets it aside
    /// (`….vtsnap.foreign`). A cluster's nodes share snapshots across data directories and
    /// check the stream's epoch instead: they stamp without refusing.
    #[must_use]
    pub fn with_history(mut self, history: DataHistory, refuse_foreign: bool) -> Self {
        self.history = Some(History {
            history,
            refuse_foreign,
        });
        self
    }

    /// The data directory's history, when one was set.
    pub fn history(&self) -> Option<DataHistory> {
        self.history.map(|h| h.history)
    }

    /// The highest write sequence among the snapshot files here (0 for none).
    pub fn last_seq(&self) -> u64 {
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last_seq
    }

    /// Refuses a verified file of another history, when this directory refuses them.
    fn check_history(
        &self,
        path: &Path,
        name: &FileName,
        header: &SnapshotHeader,
    ) -> Result<(), SnapshotError> {
        let Some(History {
            history,
            refuse_foreign: true,
        }) = self.history
        else {
            return Ok(());
        };
        if history.owns(header.history(), name.seq, history.legacy.snapshot_seq) {
            return Ok(());
        }
        Err(SnapshotError::invalid(
            path,
            FormatError::ForeignHistory {
                found: header.history(),
                ours: history.id,
            },
        ))
    }

    /// Renames a file of another history out of the directory's listing, keeping it.
    fn set_aside(&self, path: &Path) -> Result<PathBuf, SnapshotError> {
        let mut kept = path.as_os_str().to_owned();
        kept.push(FOREIGN_SUFFIX);
        let kept = PathBuf::from(kept);
        fs::rename(path, &kept).map_err(|e| SnapshotError::io("set aside", path, e))?;
        sync_dir(&self.dir)?;
        Ok(kept)
    }

    /// Sets how many periodic (and consumed) snapshots [`SnapshotDir::prune`] keeps besides the
    /// newest exact one. Default [`DEFAULT_KEEP_PERIODIC`].
    #[must_use]
    pub fn with_keep_periodic(mut self, keep: usize) -> Self {
        self.keep_periodic = keep;
        self
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Encodes `body` and writes it atomically as a new snapshot file (see
    /// [`SnapshotDir::write_encoded`]). Does not prune: call [`SnapshotDir::prune`] after.
    ///
    /// # Errors
    /// [`SnapshotError::Encode`] or [`SnapshotError::Io`].
    pub fn write<T: Serialize + ?Sized>(
        &self,
        body: &T,
        meta: &SnapshotMeta,
    ) -> Result<SnapshotInfo, SnapshotError> {
        let history = self.history.map(|h| h.history.id);
        let bytes =
            codec::encode_in_history(body, meta, history, 0).map_err(SnapshotError::Encode)?;
        self.write_encoded(&bytes)
    }

    /// Writes an already encoded snapshot ([`crate::encode`]) atomically: a temp file in this
    /// directory, write, fsync, rename to its final name, fsync the directory. When this
    /// returns `Ok`, the file is durable under its final name; on error no file with a snapshot
    /// name was created (a crash may leave a hidden `.tmp-*` file: see
    /// [`SnapshotDir::remove_temp_files`]).
    ///
    /// # Errors
    /// [`SnapshotError::Invalid`] when `bytes` do not verify (nothing is written), or
    /// [`SnapshotError::Io`].
    pub fn write_encoded(&self, bytes: &[u8]) -> Result<SnapshotInfo, SnapshotError> {
        let header = codec::verify(bytes)
            .map_err(|e| SnapshotError::invalid("<encoded bytes to write>", e))?;
        let name = self.next_name(&header);
        let path = self.dir.join(name.render());
        let tmp = self.dir.join(format!("{TEMP_PREFIX}{}", name.render()));
        if let Err(err) = write_durably(&tmp, bytes).and_then(|()| {
            fs::rename(&tmp, &path).map_err(|e| SnapshotError::io("rename temp file to", &path, e))
        }) {
            // Best effort: the temp file is not a snapshot and holds nothing we need.
            let _ = fs::remove_file(&tmp);
            return Err(err);
        }
        sync_dir(&self.dir)?;
        Ok(SnapshotInfo { path, name, header })
    }

    fn next_name(&self, header: &SnapshotHeader) -> FileName {
        let mut state = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        // Names stay in write order even if the clock steps back.
        state.last_ms = state.last_ms.max(header.created_at_ms());
        state.last_seq += 1;
        FileName {
            unix_ms: state.last_ms,
            seq: state.last_seq,
            kind: if header.is_exact() {
                SnapshotKind::Exact
            } else {
                SnapshotKind::Periodic
            },
        }
    }

    /// Lists every snapshot file, newest first, verifying each one's header, length and body
    /// checksum (it reads every file; the body is not decoded). Files whose names are not
    /// snapshot names are ignored.
    ///
    /// # Errors
    /// [`SnapshotError::Io`] when the directory cannot be read; per-file problems are in
    /// [`SnapshotEntry::status`].
    pub fn list(&self) -> Result<Vec<SnapshotEntry>, SnapshotError> {
        let mut entries = Vec::new();
        for (path, name) in self.scan_newest_first()? {
            let size = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            let status = read_file(&path).and_then(|bytes| {
                let header = codec::verify(&bytes).map_err(|e| SnapshotError::invalid(&path, e))?;
                self.check_history(&path, &name, &header)?;
                Ok(SnapshotInfo {
                    path: path.clone(),
                    name,
                    header,
                })
            });
            entries.push(SnapshotEntry {
                file_name: path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| name.render()),
                path,
                kind: name.kind,
                seq: name.seq,
                name_created_at_ms: name.unix_ms,
                size,
                status,
            });
        }
        Ok(entries)
    }

    /// Walks snapshots newest → oldest and returns the first that validates completely and
    /// decodes as `T`, plus every newer file it refused as invalid (for the log: "fell back to X
    /// because Y"). Refused files stay on disk. Only invalid files are passed over: a file that
    /// cannot be *read* may well be intact, and falling back past it would silently lose what it
    /// holds.
    ///
    /// # Errors
    /// [`SnapshotError::Io`] when the directory or a snapshot file cannot be read (naming the
    /// file). Invalid files are in [`NewestValid::skipped`].
    pub fn load_newest_valid<T: DeserializeOwned>(&self) -> Result<NewestValid<T>, SnapshotError> {
        let mut skipped = Vec::new();
        for (path, name) in self.scan_newest_first()? {
            let loaded = load_file::<T>(&path).and_then(|(header, body)| {
                self.check_history(&path, &name, &header)?;
                Ok((header, body))
            });
            match loaded {
                Ok((header, body)) => {
                    return Ok(NewestValid {
                        loaded: Some(Loaded {
                            info: SnapshotInfo { path, name, header },
                            body,
                        }),
                        skipped,
                    })
                }
                Err(error @ SnapshotError::Invalid { .. }) => {
                    let mut skipped_file = Skipped {
                        path,
                        error,
                        set_aside: None,
                    };
                    if skipped_file.is_foreign() {
                        skipped_file.set_aside = Some(self.set_aside(&skipped_file.path)?);
                    }
                    skipped.push(skipped_file);
                }
                Err(error) => return Err(error),
            }
        }
        Ok(NewestValid {
            loaded: None,
            skipped,
        })
    }

    /// Loads `file_name` from this directory (an operator's `restore`), validating completely.
    ///
    /// # Errors
    /// [`SnapshotError::Invalid`] or [`SnapshotError::Io`].
    pub fn load_named<T: DeserializeOwned>(
        &self,
        file_name: &str,
    ) -> Result<Loaded<T>, SnapshotError> {
        let path = self.dir.join(file_name);
        let Some(name) = FileName::parse(file_name) else {
            return Err(SnapshotError::io(
                "find snapshot",
                &path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "not a snapshot file name"),
            ));
        };
        let (header, body) = load_file::<T>(&path)?;
        self.check_history(&path, &name, &header)?;
        Ok(Loaded {
            info: SnapshotInfo { path, name, header },
            body,
        })
    }

    /// Marks an exact snapshot as adopted by this server life, durably: renames
    /// `…-exact.vtsnap` to `…-consumed.vtsnap` and fsyncs the directory. From then on it loads
    /// as periodic (fresh epoch), so a crash of this life cannot make a later start adopt the
    /// epoch again. Call it after loading and **before** issuing any offset in the snapshot's
    /// epoch; if it fails, do not adopt the epoch. See the crate docs, "Exact snapshots vouch for
    /// one life". Returns the renamed snapshot.
    ///
    /// # Errors
    /// [`SnapshotError::NotExact`] when `info` is not an unconsumed exact snapshot;
    /// [`SnapshotError::Io`] when the rename or fsync fails (the file may or may not have been
    /// renamed; either way the caller must take a fresh epoch).
    pub fn consume_exact(&self, info: &SnapshotInfo) -> Result<SnapshotInfo, SnapshotError> {
        if !info.is_exact() {
            return Err(SnapshotError::NotExact {
                path: info.path.clone(),
            });
        }
        let name = FileName {
            kind: SnapshotKind::Consumed,
            ..info.name
        };
        let path = self.dir.join(name.render());
        fs::rename(&info.path, &path)
            .map_err(|e| SnapshotError::io("rename to consumed", &info.path, e))?;
        sync_dir(&self.dir)?;
        Ok(SnapshotInfo {
            path,
            name,
            header: info.header,
        })
    }

    /// The start-up rule in one call: load the newest valid snapshot; when it is exact, consume
    /// it durably and adopt its epoch only if that succeeded.
    ///
    /// # Errors
    /// [`SnapshotError::Io`] when the directory cannot be read.
    pub fn load_for_start<T: DeserializeOwned>(&self) -> Result<StartupRestore<T>, SnapshotError> {
        let NewestValid {
            mut loaded,
            skipped,
        } = self.load_newest_valid::<T>()?;
        let mut adopt_epoch = false;
        let mut consume_error = None;
        if let Some(snapshot) = loaded.as_mut().filter(|l| l.info.is_exact()) {
            match self.consume_exact(&snapshot.info) {
                Ok(consumed) => {
                    snapshot.info = consumed;
                    adopt_epoch = true;
                }
                Err(err) => consume_error = Some(err),
            }
        }
        Ok(StartupRestore {
            loaded,
            adopt_epoch,
            skipped,
            consume_error,
        })
    }

    /// Applies retention: keeps the newest exact snapshot and the newest `keep_periodic`
    /// periodic or consumed ones, and removes the other valid snapshots. A file that fails
    /// validation is never removed (it is kept for inspection) and does not count towards the
    /// kept ones. Verifies every file's checksum before deciding.
    ///
    /// # Errors
    /// [`SnapshotError::Io`] when the directory cannot be read, a file cannot be removed, or the
    /// directory cannot be synced.
    pub fn prune(&self) -> Result<PruneReport, SnapshotError> {
        let mut report = PruneReport::default();
        let mut kept_exact = false;
        let mut kept_periodic = 0usize;
        for entry in self.list()? {
            let Ok(info) = &entry.status else {
                report.kept_invalid.push(entry.path);
                continue;
            };
            // Whatever does not load as exact (periodic, consumed, or a name and header that
            // disagree) is retained as periodic.
            let keep = if info.is_exact() {
                !std::mem::replace(&mut kept_exact, true)
            } else {
                kept_periodic += 1;
                kept_periodic <= self.keep_periodic
            };
            if keep {
                report.kept.push(entry.path);
            } else {
                fs::remove_file(&entry.path)
                    .map_err(|e| SnapshotError::io("remove old snapshot", &entry.path, e))?;
                report.removed.push(entry.path);
            }
        }
        if !report.removed.is_empty() {
            sync_dir(&self.dir)?;
        }
        Ok(report)
    }

    /// Removes hidden `.tmp-*` files left by a crash during a write. Call it only from the
    /// process that owns the directory (the server at start), never while it may be writing.
    /// Returns the removed paths.
    ///
    /// # Errors
    /// [`SnapshotError::Io`].
    pub fn remove_temp_files(&self) -> Result<Vec<PathBuf>, SnapshotError> {
        let mut removed = Vec::new();
        for entry in read_dir(&self.dir)? {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(TEMP_PREFIX) && name.ends_with(FILE_EXT) {
                let path = entry.path();
                fs::remove_file(&path)
                    .map_err(|e| SnapshotError::io("remove temp file", &path, e))?;
                removed.push(path);
            }
        }
        if !removed.is_empty() {
            sync_dir(&self.dir)?;
        }
        Ok(removed)
    }

    fn scan_newest_first(&self) -> Result<Vec<(PathBuf, FileName)>, SnapshotError> {
        let mut files = scan(&self.dir)?;
        files.sort_by_key(|f| std::cmp::Reverse(f.1));
        Ok(files)
    }
}

/// Reads and validates the header of the snapshot at `path` without reading the body: magic,
/// version, header checksum, flags, and that the file size matches the announced body length.
/// Cheap enough for listings; the body checksum is *not* verified (use [`verify_file`]).
///
/// # Errors
/// [`SnapshotError::Invalid`] or [`SnapshotError::Io`].
pub fn read_header(path: impl AsRef<Path>) -> Result<SnapshotHeader, SnapshotError> {
    let path = path.as_ref();
    let mut file = File::open(path).map_err(|e| SnapshotError::io("open", path, e))?;
    let mut buf = Vec::with_capacity(HEADER_LEN);
    (&mut file)
        .take(HEADER_LEN as u64)
        .read_to_end(&mut buf)
        .map_err(|e| SnapshotError::io("read", path, e))?;
    let header = SnapshotHeader::parse(&buf).map_err(|e| SnapshotError::invalid(path, e))?;
    let len = file
        .metadata()
        .map_err(|e| SnapshotError::io("stat", path, e))?
        .len();
    header
        .check_body_len(len.saturating_sub(header.len() as u64))
        .map_err(|e| SnapshotError::invalid(path, e))?;
    Ok(header)
}

/// Reads the snapshot at `path` and verifies header, length and body checksum, without decoding
/// the body.
///
/// # Errors
/// [`SnapshotError::Invalid`] or [`SnapshotError::Io`].
pub fn verify_file(path: impl AsRef<Path>) -> Result<SnapshotHeader, SnapshotError> {
    let path = path.as_ref();
    let bytes = read_file(path)?;
    codec::verify(&bytes).map_err(|e| SnapshotError::invalid(path, e))
}

/// Reads, validates and decodes the snapshot at `path`.
///
/// # Errors
/// [`SnapshotError::Invalid`] (including an undecodable body) or [`SnapshotError::Io`].
pub fn load_file<T: DeserializeOwned>(
    path: impl AsRef<Path>,
) -> Result<(SnapshotHeader, T), SnapshotError> {
    let path = path.as_ref();
    let bytes = read_file(path)?;
    codec::decode(&bytes).map_err(|e: FormatError| SnapshotError::invalid(path, e))
}

fn read_file(path: &Path) -> Result<Vec<u8>, SnapshotError> {
    fs::read(path).map_err(|e| SnapshotError::io("read", path, e))
}

fn write_durably(tmp: &Path, bytes: &[u8]) -> Result<(), SnapshotError> {
    let mut file = File::options()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(|e| SnapshotError::io("create temp file", tmp, e))?;
    file.write_all(bytes)
        .map_err(|e| SnapshotError::io("write temp file", tmp, e))?;
    file.sync_all()
        .map_err(|e| SnapshotError::io("fsync temp file", tmp, e))
}

/// Makes renames and removals in `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), SnapshotError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| SnapshotError::io("fsync directory", dir, e))
}

fn read_dir(dir: &Path) -> Result<Vec<fs::DirEntry>, SnapshotError> {
    fs::read_dir(dir)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| SnapshotError::io("read directory", dir, e))
}

/// Snapshot files in `dir` (by name; unrelated files are ignored), unordered.
fn scan(dir: &Path) -> Result<Vec<(PathBuf, FileName)>, SnapshotError> {
    let mut files = Vec::new();
    for entry in read_dir(dir)? {
        let file_name = entry.file_name();
        if let Some(name) = file_name.to_str().and_then(FileName::parse) {
            files.push((entry.path(), name));
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::encode;
    use serde::Deserialize;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct State {
        epoch: u64,
        n: u32,
    }

    fn meta(exact: bool, ms: u64) -> SnapshotMeta {
        SnapshotMeta {
            exact,
            created_at_ms: ms,
        }
    }

    #[test]
    fn a_snapshot_of_another_history_is_set_aside_never_loaded() -> TestResult {
        use crate::history::{DataHistory, Legacy};
        let tmp = tempfile::tempdir()?;
        // A version-1 file the directory held before it had a history: its own.
        let v1 = crate::codec::tests::as_version_1(&encode(
            &State { epoch: 1, n: 1 },
            &meta(false, 1_000),
        )?);
        fs::write(
            tmp.path()
                .join("snap-0000000000001000-0000000001-periodic.vtsnap"),
            &v1,
        )?;
        let ours = DataHistory::new(Legacy {
            log_through: None,
            snapshot_seq: Some(1),
        });
        let dir = SnapshotDir::open(tmp.path())?.with_history(ours, true);
        let own = dir.write(&State { epoch: 2, n: 2 }, &meta(false, 2_000))?;
        assert_eq!(own.header().history(), Some(ours.id));
        // Another server's snapshot, newer, and a version-1 file copied in later.
        let theirs =
            SnapshotDir::open(tmp.path())?.with_history(DataHistory::new(Legacy::default()), true);
        let foreign = theirs.write(&State { epoch: 3, n: 3 }, &meta(true, 3_000))?;
        let late_v1 = tmp
            .path()
            .join("snap-0000000000004000-0000000009-periodic.vtsnap");
        fs::write(&late_v1, &v1)?;

        let dir = SnapshotDir::open(tmp.path())?.with_history(ours, true);
        assert!(matches!(
            dir.load_named::<State>(&foreign.file_name()),
            Err(SnapshotError::Invalid {
                source: FormatError::ForeignHistory { .. },
                ..
            })
        ));
        let listed = dir.list()?;
        assert_eq!(listed.iter().filter(|e| e.is_valid()).count(), 2);
        let newest = dir.load_newest_valid::<State>()?;
        assert_eq!(newest.loaded.map(|l| l.body.n), Some(2));
        assert_eq!(newest.skipped.len(), 2);
        for skipped in &newest.skipped {
            assert!(skipped.is_foreign(), "{}", skipped.error);
            let kept = skipped.set_aside.as_ref().ok_or("not set aside")?;
            assert!(kept.exists() && !skipped.path.exists());
        }
        // Set aside: a later start does not see them; the legacy file still loads.
        fs::remove_file(own.path())?;
        let newest = dir.load_newest_valid::<State>()?;
        assert_eq!(newest.loaded.map(|l| l.body.n), Some(1));
        assert!(newest.skipped.is_empty());
        Ok(())
    }

    fn names(dir: &Path) -> Result<Vec<String>, std::io::Error> {
        let mut names = fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<Vec<_>, _>>()?;
        names.sort();
        Ok(names)
    }

    fn flip_byte(path: &Path, at_from_end: usize) -> std::io::Result<()> {
        let mut bytes = fs::read(path)?;
        let at = bytes.len() - at_from_end;
        bytes[at] ^= 0x40;
        fs::write(path, bytes)
    }

    #[test]
    fn write_then_load_round_trips_and_leaves_no_temp_file() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let dir = SnapshotDir::open(tmp.path().join("snaps"))?;
        let state = State { epoch: 7, n: 3 };
        let info = dir.write(&state, &meta(true, 1_000))?;
        assert_eq!(
            info.file_name(),
            "snap-0000000000001000-0000000001-exact.vtsnap"
        );
        assert!(info.is_exact());
        assert_eq!(names(dir.path())?, [info.file_name()]);
        assert_eq!(read_header(info.path())?.created_at_ms(), 1_000);
        assert_eq!(info.size(), fs::metadata(info.path())?.len());

        let found = dir.load_newest_valid::<State>()?;
        assert!(found.skipped.is_empty());
        let loaded = found.loaded.ok_or("nothing loaded")?;
        assert_eq!(loaded.body, state);
        assert_eq!(loaded.info, info);
        assert_eq!(dir.load_named::<State>(&info.file_name())?.body, state);
        Ok(())
    }

    #[test]
    fn invalid_bytes_are_not_written() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let dir = SnapshotDir::open(tmp.path())?;
        let mut bytes = encode(&State { epoch: 1, n: 1 }, &meta(false, 5))?;
        bytes.pop();
        let err = dir.write_encoded(&bytes).err().ok_or("written")?;
        assert!(matches!(
            err.format_error(),
            Some(FormatError::Truncated { .. })
        ));
        assert!(names(dir.path())?.is_empty());
        Ok(())
    }

    #[test]
    fn names_stay_in_write_order_when_the_clock_steps_back() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let dir = SnapshotDir::open(tmp.path())?;
        dir.write(&State { epoch: 1, n: 1 }, &meta(false, 5_000))?;
        dir.write(&State { epoch: 1, n: 2 }, &meta(false, 4_000))?;
        let newest = dir
            .load_newest_valid::<State>()?
            .loaded
            .ok_or("nothing loaded")?;
        assert_eq!(newest.body.n, 2);
        // A reopened directory continues the sequence.
        let dir = SnapshotDir::open(tmp.path())?;
        let third = dir.write(&State { epoch: 1, n: 3 }, &meta(false, 1))?;
        assert_eq!(third.seq(), 3);
        let listed: Vec<u64> = dir.list()?.iter().map(|e| e.seq).collect();
        assert_eq!(listed, [3, 2, 1]);
        Ok(())
    }

    #[test]
    fn an_unreadable_newest_file_stops_the_load_instead_of_falling_back() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let dir = SnapshotDir::open(tmp.path())?;
        dir.write(&State { epoch: 1, n: 1 }, &meta(false, 10))?;
        // Named like the newest snapshot, but reading it fails (it is a directory).
        let unreadable = tmp
            .path()
            .join("snap-0000000000000020-0000000002-periodic.vtsnap");
        fs::create_dir(&unreadable)?;
        let error = dir.load_newest_valid::<State>().err().ok_or("fell back")?;
        assert!(matches!(error, SnapshotError::Io { .. }), "{error}");
        assert!(error.to_string().contains("0000000002"), "{error}");
        Ok(())
    }

    #[test]
    fn inspection_creates_nothing() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let missing = tmp.path().join("missing");
        assert!(SnapshotDir::open_existing(&missing).is_err());
        assert!(!missing.exists());
        Ok(())
    }

    #[test]
    fn load_falls_back_past_a_corrupted_newest_file_and_keeps_it() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let dir = SnapshotDir::open(tmp.path())?;
        dir.write(&State { epoch: 1, n: 1 }, &meta(false, 10))?;
        let middle = dir.write(&State { epoch: 1, n: 2 }, &meta(false, 20))?;
        let newest = dir.write(&State { epoch: 1, n: 3 }, &meta(true, 30))?;
        flip_byte(newest.path(), 1)?;

        let found = dir.load_newest_valid::<State>()?;
        let loaded = found.loaded.ok_or("nothing loaded")?;
        assert_eq!(loaded.info.path(), middle.path());
        assert_eq!(loaded.body.n, 2);
        assert_eq!(found.skipped.len(), 1);
        let skipped = &found.skipped[0];
        assert_eq!(skipped.path, newest.path());
        assert!(matches!(
            skipped.error.format_error(),
            Some(FormatError::BodyChecksum { .. })
        ));
        let message = skipped.error.to_string();
        assert!(message.contains(&newest.file_name()), "{message}");
        assert!(message.contains("checksum"), "{message}");
        assert!(newest.path().exists(), "a refused file is kept");
        Ok(())
    }

    #[test]
    fn a_body_of_the_wrong_type_is_skipped() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let dir = SnapshotDir::open(tmp.path())?;
        dir.write(&State { epoch: 1, n: 1 }, &meta(false, 10))?;
        dir.write(&"not a state", &meta(false, 20))?;
        let found = dir.load_newest_valid::<State>()?;
        assert_eq!(found.loaded.ok_or("nothing loaded")?.body.n, 1);
        assert!(matches!(
            found.skipped[0].error.format_error(),
            Some(FormatError::Body { .. })
        ));
        Ok(())
    }

    #[test]
    fn list_reports_validity_and_read_header_catches_truncation() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let dir = SnapshotDir::open(tmp.path())?;
        let good = dir.write(&State { epoch: 1, n: 1 }, &meta(true, 10))?;
        let bad = dir.write(&State { epoch: 1, n: 2 }, &meta(false, 20))?;
        let bytes = fs::read(bad.path())?;
        fs::write(bad.path(), &bytes[..bytes.len() - 2])?;
        fs::write(dir.path().join("notes.txt"), "ignored")?;

        let entries = dir.list()?;
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].path, bad.path());
        assert!(!entries[0].is_valid());
        assert_eq!(entries[0].size, bytes.len() as u64 - 2);
        assert_eq!(entries[0].created_at_ms(), 20);
        assert!(entries[1].is_valid() && entries[1].is_exact());
        assert_eq!(entries[1].path, good.path());

        let err = read_header(bad.path()).err().ok_or("accepted")?;
        assert!(matches!(
            err.format_error(),
            Some(FormatError::Truncated { .. })
        ));
        assert!(err.to_string().contains(&bad.file_name()), "{err}");
        Ok(())
    }

    #[test]
    fn prune_keeps_n_periodic_plus_newest_exact_and_never_invalid_files() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let dir = SnapshotDir::open(tmp.path())?.with_keep_periodic(3);
        let mut periodic = Vec::new();
        let mut exact = Vec::new();
        for i in 0..10u32 {
            let is_exact = i == 2 || i == 5;
            let info = dir.write(&State { epoch: 1, n: i }, &meta(is_exact, u64::from(i)))?;
            if is_exact {
                exact.push(info);
            } else {
                periodic.push(info);
            }
        }
        // The oldest periodic file is damaged: it must survive retention.
        flip_byte(periodic[0].path(), 3)?;
        // A foreign file with a snapshot name is invalid too.
        let foreign = dir
            .path()
            .join("snap-0000000000000099-0000000099-periodic.vtsnap");
        fs::write(&foreign, b"hello")?;

        let report = dir.prune()?;
        let mut expected_kept: Vec<&Path> = periodic[periodic.len() - 3..]
            .iter()
            .map(SnapshotInfo::path)
            .collect();
        expected_kept.push(exact[1].path());
        let mut kept: Vec<&Path> = report.kept.iter().map(PathBuf::as_path).collect();
        kept.sort();
        expected_kept.sort();
        assert_eq!(kept, expected_kept);
        assert_eq!(report.kept_invalid.len(), 2);
        assert!(periodic[0].path().exists() && foreign.exists());
        assert!(!exact[0].path().exists());
        assert_eq!(report.removed.len(), 10 - 4 - 1);
        // Idempotent.
        assert!(dir.prune()?.removed.is_empty());
        Ok(())
    }

    #[test]
    fn consumed_exact_snapshot_survives_a_crash_as_periodic() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let state = State { epoch: 77, n: 9 };
        {
            // Life 1 ends gracefully with an exact snapshot.
            let dir = SnapshotDir::open(tmp.path())?;
            dir.write(&State { epoch: 77, n: 1 }, &meta(false, 10))?;
            dir.write(&state, &meta(true, 20))?;
        }
        {
            // Life 2 starts: adopts the epoch, consumed durably before serving ...
            let dir = SnapshotDir::open(tmp.path())?;
            let start = dir.load_for_start::<State>()?;
            assert!(start.adopt_epoch);
            assert!(start.consume_error.is_none());
            let loaded = start.loaded.ok_or("nothing loaded")?;
            assert_eq!(loaded.body, state);
            assert_eq!(loaded.info.kind(), SnapshotKind::Consumed);
            assert!(!loaded.info.is_exact());
            assert!(loaded.info.file_name().ends_with("-consumed.vtsnap"));
            // ... and then crashes (kill -9): nothing more is written.
        }
        // Life 3: the same file still restores the state, but never the epoch.
        let dir = SnapshotDir::open(tmp.path())?;
        let start = dir.load_for_start::<State>()?;
        assert!(!start.adopt_epoch);
        assert_eq!(start.loaded.ok_or("nothing loaded")?.body, state);
        let listed = dir.list()?;
        assert!(listed.iter().all(|e| e.is_valid() && !e.is_exact()));
        // A graceful stop of a life writes a new exact snapshot: the next baton.
        dir.write(&State { epoch: 78, n: 0 }, &meta(true, 30))?;
        let dir = SnapshotDir::open(tmp.path())?;
        assert!(dir.load_for_start::<State>()?.adopt_epoch);
        assert!(!dir.load_for_start::<State>()?.adopt_epoch);
        Ok(())
    }

    #[test]
    fn only_unconsumed_exact_snapshots_can_be_consumed() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let dir = SnapshotDir::open(tmp.path())?;
        let periodic = dir.write(&State { epoch: 1, n: 1 }, &meta(false, 10))?;
        let err = dir.consume_exact(&periodic).err().ok_or("consumed")?;
        assert!(matches!(err, SnapshotError::NotExact { .. }), "{err}");

        let exact = dir.write(&State { epoch: 1, n: 2 }, &meta(true, 20))?;
        let consumed = dir.consume_exact(&exact)?;
        assert!(matches!(
            dir.consume_exact(&consumed),
            Err(SnapshotError::NotExact { .. })
        ));
        // A stale handle to the old name cannot consume twice: the file is gone.
        assert!(matches!(
            dir.consume_exact(&exact),
            Err(SnapshotError::Io { .. })
        ));
        Ok(())
    }

    #[test]
    fn a_name_that_disagrees_with_the_header_loads_as_periodic() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let dir = SnapshotDir::open(tmp.path())?;
        let periodic = dir.write(&State { epoch: 1, n: 1 }, &meta(false, 10))?;
        let renamed = dir
            .path()
            .join(periodic.file_name().replace("periodic", "exact"));
        fs::rename(periodic.path(), &renamed)?;
        let start = dir.load_for_start::<State>()?;
        assert!(!start.adopt_epoch);
        assert!(renamed.exists(), "not consumed: it was never exact");
        Ok(())
    }

    #[test]
    fn stale_temp_files_are_ignored_then_removed() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let dir = SnapshotDir::open(tmp.path())?;
        let torn = dir
            .path()
            .join(".tmp-snap-0000000000000500-0000000009-exact.vtsnap");
        fs::write(&torn, b"\x89VTSNAP\n torn")?;
        assert!(dir.list()?.is_empty());
        assert!(dir.load_newest_valid::<State>()?.loaded.is_none());
        assert_eq!(dir.remove_temp_files()?, std::slice::from_ref(&torn));
        assert!(!torn.exists());
        Ok(())
    }
}
