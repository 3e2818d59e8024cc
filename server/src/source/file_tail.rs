//! Follows a file of lines like `tail -F`.
//!
//! ## Checkpoint
//!
//! `(file identity, byte offset)`, where the identity is the file's `(dev, inode)` and the
//! offset is just past the last complete line handed out. A trailing line without its `\n`
//! yet is left for the next read.
//!
//! ## Gaps
//!
//! - **Truncated**: the file is shorter than the offset. Reading resumes at 0, and the batch
//!   says it follows a gap: whatever was written between our last read and the truncation is
//!   lost. Like `tail -F`, truncation is noticed by size: a file truncated and rewritten to at
//!   least its old length between two polls is not detected.
//! - **Replaced**: the path now names another file (rotation, or a checkpoint from another
//!   file). Reading starts at 0 of the new file, and the batch says it follows a gap: lines
//!   appended to the old file after our last read are not read.
//!
//! A missing file is waited for. Polling is bounded by [`FileTailConfig::poll_interval`].

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A position in a followed file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FileCheckpoint {
    /// The file system's device id.
    pub dev: u64,
    /// The file's inode.
    pub inode: u64,
    /// Bytes consumed: just past the last complete line handed out.
    pub offset: u64,
}

/// How to follow a file.
#[derive(Clone, Debug)]
pub struct FileTailConfig {
    /// The file.
    pub path: PathBuf,
    /// How often to look for new lines when there are none. Default 100 ms.
    pub poll_interval: Duration,
    /// Most bytes per batch. Default 1 MiB (keep it under the runtime's `max_batch_bytes`).
    pub max_batch_bytes: usize,
}

impl FileTailConfig {
    /// Follows `path` with the defaults.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            poll_interval: Duration::from_millis(100),
            max_batch_bytes: 1 << 20,
        }
    }
}

/// One batch of complete lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TailBatch {
    /// The lines, each ending in `\n` (empty when the batch only reports a gap).
    pub lines: Bytes,
    /// The position after these lines.
    pub checkpoint: FileCheckpoint,
    /// Why input was lost just before these lines, if it was.
    pub gap: Option<String>,
}

/// A followed file.
#[derive(Debug)]
pub struct FileTail {
    config: FileTailConfig,
    file: Option<File>,
    position: Option<FileCheckpoint>,
}

fn identity(meta: &std::fs::Metadata) -> (u64, u64) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        (meta.dev(), meta.ino())
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        (0, 0)
    }
}

impl FileTail {
    /// Follows `config.path` from `checkpoint` (from the start when `None`).
    pub fn new(config: FileTailConfig, checkpoint: Option<FileCheckpoint>) -> Self {
        Self {
            config,
            file: None,
            position: checkpoint,
        }
    }

    /// The position after the last batch handed out.
    pub fn checkpoint(&self) -> Option<FileCheckpoint> {
        self.position
    }

    /// Reads what is there now: `Ok(None)` when there is nothing new (or no file yet).
    ///
    /// # Errors
    /// I/O errors other than the file not existing.
    pub fn poll(&mut self) -> io::Result<Option<TailBatch>> {
        let meta = match std::fs::metadata(&self.config.path) {
            Ok(meta) => meta,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err),
        };
        let (dev, inode) = identity(&meta);
        let mut gap = None;
        let mut pos = match self.position {
            Some(p) if (p.dev, p.inode) == (dev, inode) => p,
            Some(_) => {
                gap = Some(format!("{} was replaced", self.config.path.display()));
                self.file = None;
                FileCheckpoint {
                    dev,
                    inode,
                    offset: 0,
                }
            }
            None => FileCheckpoint {
                dev,
                inode,
                offset: 0,
            },
        };
        if meta.len() < pos.offset {
            gap = Some(format!(
                "{} was truncated from {} to {} bytes",
                self.config.path.display(),
                pos.offset,
                meta.len()
            ));
            pos.offset = 0;
        }
        if self.file.is_none() {
            self.file = Some(File::open(&self.config.path)?);
        }
        let mut lines = Vec::new();
        if meta.len() > pos.offset {
            if let Some(file) = self.file.as_mut() {
                file.seek(SeekFrom::Start(pos.offset))?;
                let want = (meta.len() - pos.offset).min(self.config.max_batch_bytes as u64);
                file.take(want).read_to_end(&mut lines)?;
            }
            match lines.iter().rposition(|&b| b == b'\n') {
                Some(end) => lines.truncate(end + 1),
                // One line longer than a batch: hand it out whole-as-read rather than stall.
                None if lines.len() >= self.config.max_batch_bytes => {}
                None => lines.clear(),
            }
            pos.offset += lines.len() as u64;
        }
        self.position = Some(pos);
        if lines.is_empty() && gap.is_none() {
            return Ok(None);
        }
        Ok(Some(TailBatch {
            lines: Bytes::from(lines),
            checkpoint: pos,
            gap,
        }))
    }

    /// Waits for the next batch, polling every [`FileTailConfig::poll_interval`].
    ///
    /// # Errors
    /// As [`FileTail::poll`].
    pub async fn next_batch(&mut self) -> io::Result<TailBatch> {
        loop {
            if let Some(batch) = self.poll()? {
                return Ok(batch);
            }
            tokio::time::sleep(self.config.poll_interval).await;
        }
    }

    /// How long to wait before reading again after a failed read.
    pub fn retry_after(&self) -> Duration {
        self.config.poll_interval
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn append(path: &std::path::Path, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn follows_complete_lines_and_resumes_from_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.log");
        let mut tail = FileTail::new(FileTailConfig::new(&path), None);
        assert_eq!(tail.poll().unwrap(), None, "no file yet");
        append(&path, "a\nb\npart");
        let batch = tail.poll().unwrap().unwrap();
        assert_eq!(&batch.lines[..], b"a\nb\n");
        assert_eq!(batch.checkpoint.offset, 4);
        assert_eq!(batch.gap, None);
        assert_eq!(tail.poll().unwrap(), None, "partial line waits");
        append(&path, "ial\n");
        assert_eq!(&tail.poll().unwrap().unwrap().lines[..], b"partial\n");

        append(&path, "c\n");
        let mut resumed = FileTail::new(FileTailConfig::new(&path), Some(batch.checkpoint));
        assert_eq!(&resumed.poll().unwrap().unwrap().lines[..], b"partial\nc\n");
    }

    #[test]
    fn truncation_is_a_gap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.log");
        append(&path, "one\ntwo\n");
        let mut tail = FileTail::new(FileTailConfig::new(&path), None);
        tail.poll().unwrap().unwrap();
        std::fs::write(&path, "x\n").unwrap();
        let batch = tail.poll().unwrap().unwrap();
        assert!(
            batch.gap.as_deref().unwrap_or("").contains("truncated"),
            "{batch:?}"
        );
        assert_eq!(&batch.lines[..], b"x\n");
    }

    #[test]
    fn replacement_is_a_gap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.log");
        append(&path, "old1\nold2\n");
        let mut tail = FileTail::new(FileTailConfig::new(&path), None);
        tail.poll().unwrap().unwrap();
        let next = dir.path().join("new.log");
        append(&next, "new1\n");
        std::fs::rename(&next, &path).unwrap();
        let batch = tail.poll().unwrap().unwrap();
        assert!(
            batch.gap.as_deref().unwrap_or("").contains("replaced"),
            "{batch:?}"
        );
        assert_eq!(&batch.lines[..], b"new1\n");
        assert_eq!(batch.checkpoint.offset, 5);
    }

    #[test]
    fn batches_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.log");
        append(&path, "aaaa\nbbbb\ncccc\n");
        let config = FileTailConfig {
            max_batch_bytes: 12,
            ..FileTailConfig::new(&path)
        };
        let mut tail = FileTail::new(config, None);
        assert_eq!(&tail.poll().unwrap().unwrap().lines[..], b"aaaa\nbbbb\n");
        assert_eq!(&tail.poll().unwrap().unwrap().lines[..], b"cccc\n");
    }
}
