//! `viewtape snapshot inspect FILE`, `viewtape snapshot verify DIR`, `viewtape log inspect DIR`
//! and `viewtape log dump DIR RUNTIME`. None of them creates or changes anything.

use std::io::Write;
use std::path::{Path, PathBuf};

use viewtape_snapshots::log::{Damage, LogDir, LogError};
use viewtape_snapshots::{load_file, SnapshotDir, SnapshotKind};

use crate::snapshot::SnapshotBody;

/// Prints a snapshot's header, epoch, views and runtimes. Returns whether it
/// is valid.
///
/// # Errors
/// Only failures to write to `out`.
pub fn inspect_file(path: &Path, out: &mut impl Write) -> std::io::Result<bool> {
    match load_file::<SnapshotBody>(path) {
        Ok((header, body)) => {
            writeln!(out, "file:     {}", path.display())?;
            writeln!(out, "valid:    yes")?;
            writeln!(out, "exact:    {}", header.is_exact())?;
            match header.history() {
                Some(id) => writeln!(out, "history:  {id}")?,
                None => writeln!(out, "history:  none (format version {})", header.version())?,
            }
            writeln!(out, "created:  {}", readable_time(header.created_at_ms()))?;
            writeln!(
                out,
                "size:     {} bytes (body {})",
                header.file_len(),
                header.body_len()
            )?;
            match body.journal.epoch {
                Some(epoch) => writeln!(out, "epoch:    {epoch}")?,
                None => writeln!(out, "epoch:    none (journal disabled)")?,
            }
            match body.log_position {
                Some(position) => writeln!(out, "log:      through position {position}")?,
                None => writeln!(out, "log:      none (taken with the log off)")?,
            }
            writeln!(out, "views:")?;
            for view in &body.journal.views {
                let bytes: usize = view.records.iter().map(|r| r.frame.len()).sum();
                let keys = body
                    .views
                    .iter()
                    .find(|s| s.view == view.name)
                    .map_or(0, |s| s.entries.len());
                writeln!(
                    out,
                    "  {:<24} offsets {}..{}  records {}  bytes {}  keys {}",
                    view.name,
                    view.first,
                    view.next(),
                    view.records.len(),
                    bytes,
                    keys
                )?;
            }
            writeln!(out, "runtimes:")?;
            for runtime in &body.runtimes {
                writeln!(
                    out,
                    "  {:<24} module {}  state {} bytes  checkpoint {:?}",
                    runtime.name,
                    runtime.module,
                    runtime.saved.state.len(),
                    runtime.saved.checkpoint
                )?;
            }
            Ok(true)
        }
        Err(error) => {
            writeln!(out, "file:     {}", path.display())?;
            writeln!(out, "valid:    NO — {error}")?;
            Ok(false)
        }
    }
}

/// `ms` since the Unix epoch as a date and time (UTC) and how long ago that was.
fn readable_time(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    let ago = std::time::SystemTime::now().duration_since(at).map_or_else(
        |_| "in the future".to_owned(),
        |ago| format!("{}s ago", ago.as_secs()),
    );
    format!(
        "{} ({ago}; {ms} ms since the Unix epoch)",
        httpdate::fmt_http_date(at)
    )
}

/// Checks every snapshot in `dir`, one line each. Returns whether all are
/// valid.
///
/// # Errors
/// Only failures to write to `out`.
pub fn verify_dir(dir: &Path, out: &mut impl Write) -> std::io::Result<bool> {
    let entries = match SnapshotDir::open_existing(dir).and_then(|d| d.list()) {
        Ok(entries) => entries,
        Err(error) => {
            writeln!(out, "{}: {error}", dir.display())?;
            return Ok(false);
        }
    };
    if entries.is_empty() {
        writeln!(out, "{}", nothing_in(dir, "snapshot files", "snapshots"))?;
        return Ok(false);
    }
    let mut all_valid = true;
    for entry in entries {
        let verdict = match load_file::<SnapshotBody>(&entry.path) {
            Ok((header, body)) => format!(
                "valid    {:<9} {:>12} bytes  epoch {}  records {}",
                // What a start-up would make of it: exact only by name and header, and only
                // until a life has consumed it.
                match entry.kind {
                    SnapshotKind::Exact if header.is_exact() => "exact",
                    SnapshotKind::Consumed => "consumed",
                    SnapshotKind::Manual => "manual",
                    _ => "periodic",
                },
                header.file_len(),
                body.journal
                    .epoch
                    .map_or_else(|| "none".to_owned(), |e| e.to_string()),
                body.journal.record_count()
            ),
            Err(error) => {
                all_valid = false;
                format!("INVALID  {error}")
            }
        };
        writeln!(out, "{}  {verdict}", entry.file_name)?;
    }
    Ok(all_valid)
}
/// What to say about a directory holding none of `what`: a data directory given instead of its
/// `sub` directory is named as such.
fn nothing_in(dir: &Path, what: &str, sub: &str) -> String {
    let inner = dir.join(sub);
    match inner.is_dir() {
        true => format!(
            "{}: no {what} here; this looks like a data directory: try {}",
            dir.display(),
            inner.display()
        ),
        false => format!("{}: no {what} here", dir.display()),
    }
}

/// Prints every segment of the log in `dir` — its positions, size and damage — and whether
/// the log is intact. Returns `false` on any damage, a torn tail included (a start-up would
/// cut it).
///
/// # Errors
/// Only failures to write to `out`.
pub fn inspect_log(dir: &Path, out: &mut impl Write) -> std::io::Result<bool> {
    let mut scan = match LogDir::open_existing(dir).and_then(|log| log.scan()) {
        Ok(scan) => scan,
        Err(error) => {
            writeln!(out, "{}: {error}", dir.display())?;
            return Ok(false);
        }
    };
    if scan.segments.is_empty() {
        writeln!(out, "{}", nothing_in(dir, "log segments", "log"))?;
        return Ok(false);
    }
    let mark = LogDir::open_existing(dir).and_then(|log| log.read_watermark());
    // As a start does: past what the watermark of the newest segment's history proves
    // acknowledged, bad bytes are a torn tail.
    if let Ok(Some(Ok(mark))) = &mark {
        if scan
            .segments
            .last()
            .is_some_and(|newest| newest.history == mark.history)
        {
            scan.torn_past(mark);
        }
    }
    for segment in &scan.segments {
        let name = segment
            .path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let positions = match segment.records {
            0 => "no records".to_owned(),
            n => format!(
                "positions {}..={}",
                segment.first,
                segment.first.saturating_add(n - 1)
            ),
        };
        let state = match &segment.damage {
            None => "intact".to_owned(),
            Some(Damage::TornTail { valid_len }) => {
                format!("TORN TAIL after byte {valid_len} (cut at the next start)")
            }
            Some(Damage::Corrupt { offset, reason, .. }) => {
                format!("CORRUPT at byte {offset}: {reason}")
            }
        };
        let lineage = match (segment.history, segment.epoch) {
            (Some(history), Some(epoch)) => format!("history {history} epoch {epoch:016x}"),
            _ => format!("format version {}", segment.version),
        };
        writeln!(
            out,
            "{name}  {positions}  {} bytes  {lineage}  {state}",
            segment.len
        )?;
    }
    match mark {
        Ok(Some(Ok(mark))) => {
            writeln!(
                out,
                "watermark: newest segment from {}, durable through {}",
                mark.rolled_at, mark.through
            )?;
            if let Some(problem) = scan.end_problem(&mark) {
                writeln!(out, "log is damaged: {problem}")?;
                return Ok(false);
            }
        }
        Ok(Some(Err(reason))) => writeln!(out, "watermark: DAMAGED: {reason}")?,
        Ok(None) => writeln!(out, "watermark: none")?,
        Err(error) => writeln!(out, "watermark: {error}")?,
    }
    let corruption = scan.corruption();
    if let Some((path, reason)) = &corruption {
        writeln!(out, "log is damaged: {}: {reason}", path.display())?;
    }
    let torn = scan
        .segments
        .iter()
        .any(|s| matches!(s.damage, Some(Damage::TornTail { .. })));
    writeln!(
        out,
        "{} segments, next position {}",
        scan.segments.len(),
        scan.next()
    )?;
    Ok(corruption.is_none() && !torn)
}

/// Why `viewtape log dump` had nothing to dump.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DumpError {
    /// The log could not be opened or read.
    #[error("{}: {source}", dir.display())]
    Log {
        /// The log's directory.
        dir: PathBuf,
        /// Why.
        source: LogError,
    },
    /// The directory holds no log segments.
    #[error("{}", nothing_in(dir, "log segments", "log"))]
    NoSegments {
        /// The directory.
        dir: PathBuf,
    },
    /// The log holds no batch of the runtime.
    #[error("{}: no batch of runtime {runtime:?} in the log", dir.display())]
    NoBatches {
        /// The log's directory.
        dir: PathBuf,
        /// The runtime.
        runtime: String,
    },
}

/// Writes the input of every batch `runtime` committed that the log in `dir` still holds (since
/// the oldest kept snapshot), in order, as it arrived — NDJSON for a runtime fed NDJSON, ready
/// for `viewtape run` — each batch ending with a newline. Stops at the first damage. Returns the
/// number of batches written, or why there is nothing to dump ([`DumpError`]: no log there, or
/// no batch of that runtime).
///
/// # Errors
/// Only failures to write to `out`.
pub fn dump_log(
    dir: &Path,
    runtime: &str,
    out: &mut impl Write,
) -> std::io::Result<Result<u64, DumpError>> {
    let unreadable = |source| DumpError::Log {
        dir: dir.to_owned(),
        source,
    };
    let log = match LogDir::open_existing(dir) {
        Ok(log) => log,
        Err(error) => return Ok(Err(unreadable(error))),
    };
    match log.scan() {
        Ok(scan) if scan.segments.is_empty() => {
            return Ok(Err(DumpError::NoSegments {
                dir: dir.to_owned(),
            }))
        }
        Ok(_) => {}
        Err(error) => return Ok(Err(unreadable(error))),
    }
    let mut batches = 0u64;
    let mut written: std::io::Result<()> = Ok(());
    let read = log.read_after(crate::log::LogPosition::ZERO, |record| {
        let Ok(crate::log::Entry::Batch(batch)) = crate::log::Entry::decode(&record.payload) else {
            return Ok::<(), viewtape_snapshots::log::LogError>(());
        };
        if batch.runtime != runtime
            || !matches!(batch.outcome, crate::log::Outcome::Committed(_))
            || written.is_err()
        {
            return Ok(());
        }
        written = out
            .write_all(&batch.input)
            .and_then(|()| match batch.input.last() {
                Some(b'\n') | None => Ok(()),
                Some(_) => out.write_all(b"\n"),
            });
        batches += 1;
        Ok(())
    });
    written?;
    if let Err(error) = read {
        return Ok(Err(unreadable(error)));
    }
    match batches {
        0 => Ok(Err(DumpError::NoBatches {
            dir: dir.to_owned(),
            runtime: runtime.to_owned(),
        })),
        n => Ok(Ok(n)),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use viewtape_snapshots::log::{LogPosition, LogWriter, WriterOptions};

    use super::*;

    fn inspect(dir: &Path) -> (bool, String) {
        let mut out = Vec::new();
        let ok = inspect_log(dir, &mut out).unwrap();
        (ok, String::from_utf8(out).unwrap())
    }

    #[test]
    fn a_data_directory_given_for_its_log_or_snapshots_is_named_as_such() {
        let data = tempfile::tempdir().unwrap();
        std::fs::create_dir(data.path().join("log")).unwrap();
        std::fs::create_dir(data.path().join("snapshots")).unwrap();
        let (ok, out) = inspect(data.path());
        assert!(!ok);
        assert!(
            out.contains("no log segments here; this looks like a data directory: try"),
            "{out}"
        );
        let mut out = Vec::new();
        assert!(!verify_dir(data.path(), &mut out).unwrap());
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.contains("no snapshot files here; this looks like a data directory: try"),
            "{out}"
        );
        assert!(readable_time(0).starts_with("Thu, 01 Jan 1970 00:00:00 GMT"));
    }

    #[test]
    fn log_inspect_reports_positions_and_damage_and_creates_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("log");
        assert!(!inspect(&missing).0);
        assert!(!missing.exists(), "inspection created the directory");

        let log = LogDir::create(&missing).unwrap();
        let writer = LogWriter::start(
            &log,
            LogPosition::new(1),
            WriterOptions::default(),
            Box::new(|_| {}),
        )
        .unwrap();
        for i in 0..5 {
            let (tx, rx) = mpsc::channel();
            let done = Box::new(move |result: Result<LogPosition, _>| {
                let _ = tx.send(result.is_ok());
            });
            writer.append(format!("batch {i}").into_bytes(), done);
            assert!(rx.recv().unwrap());
        }
        drop(writer);
        let (ok, out) = inspect(&missing);
        assert!(ok, "{out}");
        assert!(
            out.contains("positions 1..=5") && out.contains("intact"),
            "{out}"
        );

        let segment = log.scan().unwrap().segments[0].path.clone();
        let mut bytes = std::fs::read(&segment).unwrap();
        bytes[30] ^= 1; // inside the first record, with four intact ones after it
        std::fs::write(&segment, &bytes).unwrap();
        let (ok, out) = inspect(&missing);
        assert!(!ok);
        assert!(
            out.contains("CORRUPT") && out.contains("log is damaged"),
            "{out}"
        );
        assert_eq!(
            std::fs::read(&segment).unwrap(),
            bytes,
            "inspection changed the file"
        );
    }
}
