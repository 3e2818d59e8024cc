use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::dir::{sync_dir, LogDir};
use super::segment::{parse_header, put_record, segment_header, Lineage};
use super::watermark::Watermark;
use super::{
    LogError, LogPosition, GROUP_BYTES, LOG_VERSION, MAX_RECORD_BYTES, SEGMENT_HEADER_LEN,
};

/// How durable an acknowledged append is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Synced to the device (`fdatasync`) before it is acknowledged.
    Fsync,
    /// Handed to the operating system: survives a crash of the process, not of the machine.
    Os,
}

/// How a [`LogWriter`] writes.
#[derive(Clone, Copy, Debug)]
pub struct WriterOptions {
    /// When an append is acknowledged.
    pub durability: Durability,
    /// A new segment starts once the current one holds this many bytes.
    pub segment_bytes: u64,
    /// What every new segment's header carries.
    pub lineage: Lineage,
    /// Keep the end-of-log [`Watermark`] (module docs). Off only to measure what it costs.
    pub watermark: bool,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Fsync,
            segment_bytes: 64 << 20,
            lineage: Lineage::default(),
            watermark: true,
        }
    }
}

/// Called once an append is durable (with the position of its first record) or has failed.
pub type Completion = Box<dyn FnOnce(Result<LogPosition, LogError>) + Send>;

/// What one group commit did, for the writer's observer (metrics).
#[derive(Clone, Copy, Debug)]
pub struct GroupWritten {
    /// Records written.
    pub records: u64,
    /// Bytes written (record framing included).
    pub bytes: u64,
    /// How long the `fdatasync` took, when there was one.
    pub sync: Option<std::time::Duration>,
    /// The position after the last record written.
    pub next: LogPosition,
    /// Whether the group started a new segment.
    pub new_segment: bool,
}

/// Told about every group the writer made durable (on the writer's thread; keep it short).
pub type Observer = Box<dyn FnMut(GroupWritten) + Send>;

struct Append {
    payloads: Vec<Vec<u8>>,
    done: Completion,
}

/// Appends records to a log with group commit; see the module docs. Dropping it stops the
/// writer after the queued appends.
pub struct LogWriter {
    queue: Option<mpsc::Sender<Append>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogWriter").finish_non_exhaustive()
    }
}

impl LogWriter {
    /// Starts writing `log` at position `next` (what a scan, and a repair, left), in its newest
    /// segment or a new one.
    ///
    /// # Errors
    /// The segment cannot be opened or created.
    pub fn start(
        log: &LogDir,
        next: LogPosition,
        options: WriterOptions,
        observer: Observer,
    ) -> Result<Self, LogError> {
        let (file, path, len, rolled_at) = open_segment(log, next, &options.lineage)?;
        let mark = match options.watermark {
            true => Some(start_watermark(log, next, rolled_at, &options.lineage)?),
            false => None,
        };
        let (queue, appends) = mpsc::channel::<Append>();
        let mut state = WriterState {
            dir: LogDir {
                dir: log.dir.clone(),
            },
            file,
            path,
            len,
            next,
            options,
            poisoned: None,
            observer,
            mark,
            rolled_at,
        };
        let thread = std::thread::Builder::new()
            .name("viewtape-log".into())
            .spawn(move || state.run(&appends))
            .map_err(|e| LogError::io("start the writer for", &log.dir, e))?;
        Ok(Self {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    /// Queues `payload`; `done` is called, on the writer's thread, once it is durable (with its
    /// position) or has failed. Keep `done` short: it delays the next group.
    pub fn append(&self, payload: Vec<u8>, done: Completion) {
        self.append_all(vec![payload], done);
    }

    /// Queues `payloads` as consecutive records, made durable together; `done` is called with
    /// the position of the first once all are durable, or with the failure.
    pub fn append_all(&self, payloads: Vec<Vec<u8>>, done: Completion) {
        if let Some(big) = payloads.iter().find(|p| p.len() > MAX_RECORD_BYTES) {
            return done(Err(LogError::TooLarge(big.len())));
        }
        let Some(queue) = &self.queue else {
            return done(Err(LogError::Stopped));
        };
        if let Err(mpsc::SendError(append)) = queue.send(Append { payloads, done }) {
            (append.done)(Err(LogError::Stopped));
        }
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        self.queue = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The segment to write at `next`: the newest one when it is of this format and history, else
/// a new one. Returns it, its path, its length and its first position.
fn open_segment(
    log: &LogDir,
    next: LogPosition,
    lineage: &Lineage,
) -> Result<(File, PathBuf, u64, LogPosition), LogError> {
    let files = log.segment_files()?;
    Ok(match files.last() {
        Some((first, path)) => {
            let mut file = OpenOptions::new()
                .append(true)
                .read(true)
                .open(path)
                .map_err(|e| LogError::io("open", path, e))?;
            let mut head = Vec::with_capacity(SEGMENT_HEADER_LEN);
            (&mut file)
                .take(SEGMENT_HEADER_LEN as u64)
                .read_to_end(&mut head)
                .map_err(|e| LogError::io("read", path, e))?;
            let len = file
                .seek(SeekFrom::End(0))
                .map_err(|e| LogError::io("seek", path, e))?;
            // Appended to only when it is of this format and history.
            let continues = parse_header(&head, *first).is_ok_and(|header| {
                header.version == LOG_VERSION && header.history == lineage.history
            });
            if continues {
                (file, path.clone(), len, *first)
            } else {
                let (file, path, len) = new_segment_file(log, next, lineage)?;
                (file, path, len, next)
            }
        }
        None => {
            let (file, path, len) = new_segment_file(log, next, lineage)?;
            (file, path, len, next)
        }
    })
}

/// Writes and syncs the watermark a writer starts with, and opens its file for the writer.
fn start_watermark(
    log: &LogDir,
    next: LogPosition,
    rolled_at: LogPosition,
    lineage: &Lineage,
) -> Result<File, LogError> {
    let mark = Watermark {
        history: lineage.history,
        rolled_at,
        through: next.prev(),
    };
    let path = log.watermark_path();
    mark.write(&path)?;
    sync_dir(&log.dir)?;
    OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| LogError::io("open", &path, e))
}

fn new_segment_file(
    log: &LogDir,
    first: LogPosition,
    lineage: &Lineage,
) -> Result<(File, PathBuf, u64), LogError> {
    let path = log.segment_path(first);
    let header = segment_header(first, lineage);
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .read(true)
        .open(&path)
        .map_err(|e| LogError::io("create", &path, e))?;
    file.write_all(&header)
        .and_then(|()| file.sync_all())
        .map_err(|e| LogError::io("write", &path, e))?;
    sync_dir(&log.dir)?;
    Ok((file, path, SEGMENT_HEADER_LEN as u64))
}

struct WriterState {
    dir: LogDir,
    file: File,
    path: PathBuf,
    len: u64,
    next: LogPosition,
    options: WriterOptions,
    /// Why writing stopped for good, once it has.
    poisoned: Option<String>,
    observer: Observer,
    /// The watermark's file, when kept.
    mark: Option<File>,
    /// The first position of the segment being written.
    rolled_at: LogPosition,
}

impl WriterState {
    fn run(&mut self, appends: &mpsc::Receiver<Append>) {
        let mut group = Vec::new();
        let mut bytes = Vec::new();
        let size = |append: &Append| append.payloads.iter().map(Vec::len).sum::<usize>();
        while let Ok(first) = appends.recv() {
            let mut queued = size(&first);
            group.push(first);
            // Everything queued meanwhile shares this round's write and sync (up to 8 MiB).
            while queued < GROUP_BYTES {
                let Ok(append) = appends.try_recv() else {
                    break;
                };
                queued += size(&append);
                group.push(append);
            }
            bytes.clear();
            let mut position = self.next;
            let written = self.write_group(&group, &mut bytes);
            for append in group.drain(..) {
                // Every append of a failed group fails alike, each with an error of its own.
                let outcome = match &written {
                    Ok(()) => Ok(position),
                    Err(_) => self.poisoned().map(|()| position),
                };
                position = position.saturating_add(append.payloads.len() as u64);
                (append.done)(outcome);
            }
        }
        // Stopping: the watermark goes to the device with the rest (best effort: a later start
        // needs it only to be no further than the log, which it never is).
        if let Some(mark) = &self.mark {
            let _ = mark.sync_data();
        }
    }

    /// Rewrites the watermark in place, when kept: the newest segment's first position and the
    /// last position written; synced when `sync`.
    fn mark_end(&mut self, sync: bool) -> Result<(), LogError> {
        let Some(file) = &self.mark else {
            return Ok(());
        };
        let mark = Watermark {
            history: self.options.lineage.history,
            rolled_at: self.rolled_at,
            through: self.next.prev(),
        };
        file.write_all_at(&mark.to_bytes(), 0)
            .and_then(|()| if sync { file.sync_data() } else { Ok(()) })
            .map_err(|e| LogError::io("write", &self.dir.watermark_path(), e))
    }

    /// [`LogError::Poisoned`], with the first failure's words, once a write or sync has failed.
    fn poisoned(&self) -> Result<(), LogError> {
        match &self.poisoned {
            Some(reason) => Err(LogError::Poisoned(reason.clone())),
            None => Ok(()),
        }
    }

    /// Writes and (with [`Durability::Fsync`]) syncs one group; the first failure poisons.
    ///
    /// # Errors
    /// [`LogError::Poisoned`]: this group's write or sync failed, or an earlier one did.
    fn write_group(&mut self, group: &[Append], bytes: &mut Vec<u8>) -> Result<(), LogError> {
        self.poisoned()?;
        if let Err(error) = self.try_write_group(group, bytes) {
            self.poisoned = Some(error.to_string());
        }
        self.poisoned()
    }

    fn try_write_group(&mut self, group: &[Append], bytes: &mut Vec<u8>) -> Result<(), LogError> {
        let new_segment = self.len >= self.options.segment_bytes;
        if new_segment {
            (self.file, self.path, self.len) =
                new_segment_file(&self.dir, self.next, &self.options.lineage)?;
            // Synced before any record of the new segment exists: its loss is always noticed.
            self.rolled_at = self.next;
            self.mark_end(true)?;
        }
        let mut records = 0;
        for payload in group.iter().flat_map(|append| &append.payloads) {
            put_record(bytes, self.next.saturating_add(records), payload);
            records += 1;
        }
        self.file
            .write_all(bytes)
            .map_err(|e| LogError::io("write", &self.path, e))?;
        let sync = if self.options.durability == Durability::Fsync {
            let started = std::time::Instant::now();
            self.file
                .sync_data()
                .map_err(|e| LogError::io("sync", &self.path, e))?;
            Some(started.elapsed())
        } else {
            None
        };
        self.len += bytes.len() as u64;
        self.next = self.next.saturating_add(records);
        // Before the appends are acknowledged; no sync of its own (module docs).
        self.mark_end(false)?;
        (self.observer)(GroupWritten {
            records,
            bytes: bytes.len() as u64,
            sync,
            next: self.next,
            new_segment,
        });
        Ok(())
    }
}
