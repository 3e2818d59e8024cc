use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use super::read::{scan_segment, SegmentReader};
use super::scan::{LogRecord, LogScan};
use super::segment::Damage;
use super::segment::{parse_header, record_at};
use super::watermark::{Watermark, WatermarkError};
use super::{LogError, LogPosition, SEGMENT_PREFIX, SEGMENT_SUFFIX, WATERMARK_FILE};

/// A log directory.
#[derive(Debug)]
pub struct LogDir {
    pub(super) dir: PathBuf,
}

impl LogDir {
    /// The log in `dir`, created if missing.
    ///
    /// # Errors
    /// The directory cannot be created.
    pub fn create(dir: impl Into<PathBuf>) -> Result<Self, LogError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| LogError::io("create directory", &dir, e))?;
        Ok(Self { dir })
    }

    /// The log in `dir`, which must exist; creates nothing (for inspection).
    ///
    /// # Errors
    /// `dir` is not a directory.
    pub fn open_existing(dir: impl Into<PathBuf>) -> Result<Self, LogError> {
        let dir = dir.into();
        let meta = fs::metadata(&dir).map_err(|e| LogError::io("open", &dir, e))?;
        if !meta.is_dir() {
            return Err(LogError::io(
                "open",
                &dir,
                io::ErrorKind::NotADirectory.into(),
            ));
        }
        Ok(Self { dir })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Reads every segment and reports what is intact and what is damaged. Changes nothing.
    ///
    /// # Errors
    /// [`LogError::Io`] naming the file that could not be read.
    pub fn scan(&self) -> Result<LogScan, LogError> {
        let mut segments = Vec::new();
        for (first, path) in self.segment_files()? {
            segments.push(scan_segment(path, first)?);
        }
        Ok(LogScan { segments })
    }

    /// Cuts a torn tail off the newest segment (and syncs it), as `scan` found it. Returns the
    /// bytes cut. Call it only when [`LogScan::corruption`] is `None`.
    ///
    /// # Errors
    /// The file cannot be truncated or synced.
    pub fn repair(&self, scan: &LogScan) -> Result<u64, LogError> {
        let Some(newest) = scan.segments.last() else {
            return Ok(0);
        };
        let Some(Damage::TornTail { valid_len }) = newest.damage else {
            return Ok(0);
        };
        let file = OpenOptions::new()
            .write(true)
            .open(&newest.path)
            .map_err(|e| LogError::io("open", &newest.path, e))?;
        file.set_len(valid_len)
            .map_err(|e| LogError::io("truncate", &newest.path, e))?;
        file.sync_all()
            .map_err(|e| LogError::io("sync", &newest.path, e))?;
        Ok(newest.len - valid_len)
    }

    /// Renames a damaged segment out of the log (`….vtlog.damaged`), keeping it for inspection.
    ///
    /// # Errors
    /// The rename or the directory sync fails.
    pub fn set_aside(&self, segment: &Path) -> Result<PathBuf, LogError> {
        self.set_aside_as(segment, ".damaged")
    }

    /// Renames a file out of the log, appending `suffix` to its name (`.damaged`, `.foreign`),
    /// keeping it for inspection.
    ///
    /// # Errors
    /// The rename or the directory sync fails.
    pub fn set_aside_as(&self, file: &Path, suffix: &str) -> Result<PathBuf, LogError> {
        let mut kept = file.as_os_str().to_owned();
        kept.push(suffix);
        let kept = PathBuf::from(kept);
        fs::rename(file, &kept).map_err(|e| LogError::io("rename", file, e))?;
        sync_dir(&self.dir)?;
        Ok(kept)
    }

    /// The watermark file's path.
    pub fn watermark_path(&self) -> PathBuf {
        self.dir.join(WATERMARK_FILE)
    }

    /// The end-of-log watermark: `Ok(None)` when there is none, `Ok(Some(Err(why)))` when the
    /// file is there but is not a valid watermark.
    ///
    /// # Errors
    /// The file exists and cannot be read.
    pub fn read_watermark(&self) -> Result<Option<Result<Watermark, WatermarkError>>, LogError> {
        let path = self.watermark_path();
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(Watermark::parse(&bytes))),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(LogError::io("read", &path, error)),
        }
    }

    /// Removes every record after `position`: segments that start after it are deleted, the one
    /// holding it is cut after it (and synced). For records that were written but never made
    /// durable by a writer that then failed: they were never acknowledged. Fails if a segment
    /// up to `position` does not hold its records intact.
    ///
    /// # Errors
    /// A file cannot be read, cut, deleted or synced, or the records up to `position` are not
    /// intact.
    pub fn truncate_after(&self, position: LogPosition) -> Result<(), LogError> {
        let mut newest = None;
        for (first, path) in self.segment_files()?.into_iter().rev() {
            if first > position {
                fs::remove_file(&path).map_err(|e| LogError::io("delete", &path, e))?;
                continue;
            }
            newest = Some(first);
            let bytes = fs::read(&path).map_err(|e| LogError::io("read", &path, e))?;
            let mut at = parse_header(&bytes, first).map_or(bytes.len(), |h| h.len);
            let mut next = first;
            while next <= position {
                let Some((_, len)) = record_at(&bytes, at, next) else {
                    return Err(LogError::io(
                        "cut",
                        &path,
                        io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("record {next} is not intact"),
                        ),
                    ));
                };
                at += len;
                next = next.next();
            }
            let file = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| LogError::io("open", &path, e))?;
            file.set_len(at as u64)
                .and_then(|()| file.sync_all())
                .map_err(|e| LogError::io("cut", &path, e))?;
            break;
        }
        sync_dir(&self.dir)?;
        // The watermark follows: what was cut was never acknowledged.
        if let Some(Ok(mut mark)) = self.read_watermark()? {
            mark.rolled_at = mark.rolled_at.min(newest.unwrap_or(position.next()));
            mark.through = mark.through.min(position);
            mark.write(&self.watermark_path())?;
        }
        Ok(())
    }

    /// Sets every segment aside ([`LogDir::set_aside`]): the log starts over, its files kept.
    /// Returns where they went.
    ///
    /// # Errors
    /// Listing, a rename or the directory sync fails.
    pub fn set_aside_all(&self) -> Result<Vec<PathBuf>, LogError> {
        let mut kept: Vec<PathBuf> = self
            .segment_files()?
            .into_iter()
            .map(|(_, path)| self.set_aside(&path))
            .collect::<Result<_, _>>()?;
        let mark = self.watermark_path();
        if mark.exists() {
            kept.push(self.set_aside(&mark)?);
        }
        Ok(kept)
    }

    /// Syncs every segment to the device (what an earlier life wrote without syncing).
    ///
    /// # Errors
    /// A segment cannot be opened or synced.
    pub fn sync_all(&self) -> Result<(), LogError> {
        for (_, path) in self.segment_files()? {
            File::open(&path)
                .and_then(|file| file.sync_all())
                .map_err(|e| LogError::io("sync", &path, e))?;
        }
        sync_dir(&self.dir)
    }

    /// Segment files and their bytes on disk.
    ///
    /// # Errors
    /// Listing or reading a file's size fails.
    pub fn usage(&self) -> Result<(u64, u64), LogError> {
        let mut bytes = 0;
        let files = self.segment_files()?;
        for (_, path) in &files {
            bytes += fs::metadata(path)
                .map_err(|e| LogError::io("stat", path, e))?
                .len();
        }
        Ok((files.len() as u64, bytes))
    }

    /// Calls `visit` with every intact record after position `after`, in order, stopping at the
    /// first damage.
    ///
    /// # Errors
    /// A segment cannot be read, or `visit` fails (its error is returned).
    pub fn read_after<E: From<LogError>>(
        &self,
        after: LogPosition,
        mut visit: impl FnMut(LogRecord) -> Result<(), E>,
    ) -> Result<(), E> {
        let files = self.segment_files()?;
        for (i, (first, path)) in files.iter().enumerate() {
            let next_first = files.get(i + 1).map(|(f, _)| *f);
            if next_first.is_some_and(|n| n <= after.next()) {
                continue; // every record of this segment is at or before `after`
            }
            let Ok((mut reader, _)) = SegmentReader::open(path, *first)? else {
                return Ok(()); // a bad header: nothing in or after this segment is proven
            };
            while let Some(record) = reader.next_record()? {
                if record.position > after {
                    visit(record)?;
                }
            }
            if !reader.ended() {
                return Ok(()); // damage: nothing after it is proven
            }
        }
        Ok(())
    }

    /// Deletes the segments whose records are all at or before `position` (what the kept
    /// snapshots no longer need). The newest segment is never deleted. Returns how many were.
    ///
    /// # Errors
    /// Listing or deleting fails.
    pub fn delete_before(&self, position: LogPosition) -> Result<usize, LogError> {
        let files = self.segment_files()?;
        let mut deleted = 0;
        for pair in files.windows(2) {
            let [(_, path), (next_first, _)] = pair else {
                continue;
            };
            if *next_first <= position.next() {
                fs::remove_file(path).map_err(|e| LogError::io("delete", path, e))?;
                deleted += 1;
            }
        }
        if deleted > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(deleted)
    }

    /// The segment files, by first position.
    pub(super) fn segment_files(&self) -> Result<Vec<(LogPosition, PathBuf)>, LogError> {
        let entries = fs::read_dir(&self.dir).map_err(|e| LogError::io("list", &self.dir, e))?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| LogError::io("list", &self.dir, e))?;
            let name = entry.file_name();
            let first = name
                .to_str()
                .and_then(|n| n.strip_prefix(SEGMENT_PREFIX)?.strip_suffix(SEGMENT_SUFFIX))
                .filter(|digits| digits.len() == 20)
                .and_then(|digits| digits.parse::<LogPosition>().ok());
            if let Some(first) = first {
                files.push((first, entry.path()));
            }
        }
        files.sort();
        Ok(files)
    }

    pub(super) fn segment_path(&self, first: LogPosition) -> PathBuf {
        self.dir
            .join(format!("{SEGMENT_PREFIX}{first:020}{SEGMENT_SUFFIX}"))
    }
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LogError::io("sync directory", dir, e))
}
