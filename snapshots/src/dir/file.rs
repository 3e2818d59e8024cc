use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use super::name::FileName;
use crate::codec;
use crate::error::{FormatError, SnapshotError};
use crate::header::{SnapshotHeader, HEADER_LEN};

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

pub(super) fn read_file(path: &Path) -> Result<Vec<u8>, SnapshotError> {
    fs::read(path).map_err(|e| SnapshotError::io("read", path, e))
}

pub(super) fn write_durably(tmp: &Path, bytes: &[u8]) -> Result<(), SnapshotError> {
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
pub(super) fn sync_dir(dir: &Path) -> Result<(), SnapshotError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| SnapshotError::io("fsync directory", dir, e))
}

pub(super) fn read_dir(dir: &Path) -> Result<Vec<fs::DirEntry>, SnapshotError> {
    fs::read_dir(dir)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| SnapshotError::io("read directory", dir, e))
}

/// Snapshot files in `dir` (by name; unrelated files are ignored), unordered.
pub(super) fn scan(dir: &Path) -> Result<Vec<(PathBuf, FileName)>, SnapshotError> {
    let mut files = Vec::new();
    for entry in read_dir(dir)? {
        let file_name = entry.file_name();
        if let Some(name) = file_name.to_str().and_then(FileName::parse) {
            files.push((entry.path(), name));
        }
    }
    Ok(files)
}
