//! `viewtape snapshot inspect FILE` and `viewtape snapshot verify DIR`.

use std::io::Write;
use std::path::Path;

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
            writeln!(
                out,
                "created:  {} ms since the Unix epoch",
                header.created_at_ms()
            )?;
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
