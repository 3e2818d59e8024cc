//! Start-up: the newest valid snapshot, then every log record after its position, replayed
//! through the same guests — or, where continuity cannot be proven, a fresh epoch.
//!
//! 1. [`begin`]: load the newest valid snapshot (an I/O error stops the start; only invalid files
//!    are passed over), scan the log (an I/O error stops the start too), set aside damaged
//!    segments the snapshot does not need, cut a torn tail off the newest segment, and restore
//!    the snapshot keeping its epoch. With the log off, the
//!    snapshot-only rules of [`restore_at_start`] apply instead.
//! 2. The server starts its runtimes from the snapshot's guest states.
//! 3. [`replay`]: every intact record after the snapshot's position, in log order (the
//!    runtimes side by side, each committing in its turn), each checked against its digest;
//!    then the writer starts after the last record.
//!
//! | file | job |
//! |---|---|
//! | this one | steps 1 and 2: the snapshot, the log's scan and torn tail, the plan |
//! | `replay` | step 3: the records replayed, a break's fresh epoch, the writer started |
//! | [`history`] | the data directory's identity: its history id, foreign files set aside, the end of the log |
//!
//! Anything that breaks continuity — a record missing or damaged before the tail, a segment
//! missing, a replay that produces something else, a record of another module or guest config,
//! a machine restart under `fsync = "os"` — **fails closed**: the replay stops at the last
//! proven record, the journal takes a fresh epoch (views keep the state rebuilt so far, every
//! client gets a `reset`), every segment is set aside as `….vtlog.damaged` (kept, never
//! deleted), the log starts over after the highest position ever used (by the records replayed,
//! the segments' names and records, and the watermark: a receipt never names a position an
//! earlier batch was acknowledged with), a metric counts the cause and one log line says all of
//! it. The caller then writes a snapshot at once, so that the next start begins from the new
//! history.
//!
//! ## The end of the log
//!
//! - A log that ends before its watermark (its newest segment deleted, cut, or replaced by
//!   another server's), or whose watermark is damaged or missing, still proves its intact
//!   records: they are replayed, and only then does the start fail closed.
//! - Bytes after the last record of the newest segment, past what the watermark proves
//!   acknowledged, are a torn tail whatever they look like: cut, the epoch kept. Only damage to
//!   what was acknowledged may cost the epoch.
//! - Damage confined to records the snapshot already holds — segments whose positions all lie
//!   at or before its position, or the whole log when the watermark proves nothing after it was
//!   acknowledged — breaks no continuity: those segments are set aside (kept) and the epoch is
//!   kept.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use viewtape_snapshots::log::{Durability, LogDamageKind, LogDir, LogError, LogScan, Watermark};
use viewtape_snapshots::{SnapshotDir, SnapshotError};

use crate::config::{FsyncMode, LogSection};
use crate::hub::Hub;
use crate::log::{Backend, Break, Log, LogMetrics, LogPosition, Segments};
use crate::recovery::history::EndMark;
use crate::snapshot::{RuntimeDump, SnapshotBody, StartFrom};

/// Where the boot id of a life that wrote with `fsync = "os"` is kept.
const UNSYNCED_BOOT: &str = "unsynced-boot-id";

/// Why start-up failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoveryError {
    /// The snapshot directory could not be read.
    #[error(transparent)]
    Snapshots(#[from] SnapshotError),
    /// The log could not be read, repaired or started.
    #[error(transparent)]
    Log(#[from] LogError),
    /// A blocking file task failed.
    #[error("log file task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// What [`begin`] restored, for the runtimes to start from and [`replay`] to finish.
#[derive(Debug)]
pub struct Begun {
    /// The runtimes' states from the snapshot, by name.
    pub dumps: BTreeMap<String, RuntimeDump>,
    /// The runtimes the snapshot says a record deleted ([`StartFrom::deleted`]).
    pub deleted: BTreeMap<String, String>,
    /// The log, positioned at the snapshot.
    pub log: Arc<Log>,
    plan: Option<Plan>,
}

/// The log's part of a start.
#[derive(Debug)]
struct Plan {
    dir: LogDir,
    scan: LogScan,
    segment_bytes: u64,
    /// The snapshot's position: replay starts after it.
    from: LogPosition,
    /// A break found before replaying anything, after which no record of the log can follow
    /// the snapshot: `(cause, what)`. Nothing is replayed.
    broken_before: Option<(Break, String)>,
    /// A break at the end of the log (it ends before its watermark, nothing vouches for its
    /// end, or a machine restart under `fsync = "os"` may have lost its tail): the intact
    /// records before it are proven and replayed, then the start fails closed.
    broken_at_end: Option<(Break, String)>,
    /// The highest position the log's files showed was used: a log that starts over after a
    /// break starts after it, so no position is ever handed out twice.
    used: LogPosition,
    /// The snapshot holds no log position (taken with the log off).
    unpositioned: bool,
    /// No snapshot was found: nothing holds the epoch of what the log may hold.
    no_snapshot: bool,
    /// The data directory's history, which new segments carry.
    history: Option<viewtape_snapshots::history::HistoryId>,
    /// Keep the end-of-log watermark.
    watermark: bool,
}

impl Begun {
    /// A start whose history lies in a cluster's shared log: the runtimes start from `dumps`,
    /// and nothing local is replayed.
    pub fn shared(restored: StartFrom, log: Arc<Log>) -> Self {
        Self {
            dumps: restored.dumps,
            deleted: restored.deleted,
            log,
            plan: None,
        }
    }
}

/// Restores the newest valid snapshot in `dir` into `hub` by the one-life rule (see [`crate::snapshot`]), logging every file it passed over. Returns the runtimes' dumps by name, for their
/// tasks to start from, and the deleted runtimes. Call it before any offset is issued.
///
/// # Errors
/// When the snapshot directory cannot be read.
pub async fn restore_at_start(hub: &Hub, dir: &SnapshotDir) -> Result<StartFrom, SnapshotError> {
    let start = dir.load_for_start::<SnapshotBody>()?;
    for skipped in &start.skipped {
        tracing::warn!(file = %skipped.path.display(), error = %skipped.error, "snapshot skipped; falling back to an older one");
    }
    if let Some(error) = &start.consume_error {
        tracing::warn!(%error, "could not mark the exact snapshot consumed; taking a fresh epoch");
    }
    let Some(loaded) = start.loaded else {
        return Ok(StartFrom::default());
    };
    let restored = loaded.body.restore_into(hub, start.adopt_epoch).await;
    tracing::info!(
        file = %loaded.info.path().display(),
        exact = start.adopt_epoch,
        epoch = %hub.journal().epoch().await,
        "restored snapshot"
    );
    Ok(restored)
}

/// Loads the newest valid snapshot into `hub` and prepares the log; see the module docs.
///
/// # Errors
/// The snapshot directory or the log cannot be read, or a torn tail cannot be cut.
pub async fn begin(
    hub: &Hub,
    snapshots: &SnapshotDir,
    log_dir: &Path,
    settings: &LogSection,
) -> Result<Begun, RecoveryError> {
    let durability = match settings.fsync {
        FsyncMode::Always => Durability::Fsync,
        FsyncMode::Os => Durability::Os,
    };
    if !settings.enabled {
        let restored = restore_at_start(hub, snapshots).await?;
        return Ok(Begun {
            dumps: restored.dumps,
            deleted: restored.deleted,
            log: Arc::new(Log::new(Backend::Off, LogPosition::ZERO)),
            plan: None,
        });
    }
    let newest = snapshots.load_newest_valid::<SnapshotBody>()?;
    let (body, file, exact) = match newest.loaded {
        Some(loaded) => (
            Some(loaded.body),
            Some(loaded.info.path().to_owned()),
            loaded.info.is_exact(),
        ),
        None => (None, None, false),
    };
    let from = body.as_ref().and_then(|b| b.log_position);
    let log = Arc::new(Log::new(
        Backend::Segments(Segments::new(durability)),
        from.unwrap_or(LogPosition::ZERO),
    ));
    crate::recovery::history::note_skipped_snapshots(&newest.skipped, log.metrics());
    let dir = LogDir::create(log_dir)?;
    let history = snapshots.history();
    let prepared = {
        let dir = LogDir::open_existing(log_dir)?;
        let os = durability == Durability::Os;
        let metrics = log.metrics().clone();
        let watermark = settings.watermark;
        tokio::task::spawn_blocking(move || {
            prepare(&dir, os, watermark, &metrics, history.as_ref(), from)
        })
        .await??
    };
    let Prepared {
        scan,
        boot_changed,
        end_problem,
        used,
        started_over,
    } = prepared;
    // A snapshot taken with the log off: an empty log may start from it (a snapshot follows at
    // once); a log with records cannot be related to it.
    let unpositioned = body.is_some() && from.is_none();
    let mut broken_before = None;
    if unpositioned && !scan.segments.iter().all(|s| s.records == 0) {
        broken_before = Some((
            Break::Missing,
            "the snapshot was taken with the log off, so the log's records cannot follow it"
                .to_owned(),
        ));
    }
    let from = from.unwrap_or(LogPosition::ZERO);
    let mut broken_at_end = end_problem.map(|problem| (Break::Missing, problem));
    if boot_changed {
        broken_at_end.get_or_insert((
            Break::Boot,
            "the machine restarted since the log was written with fsync = \"os\"; its unsynced tail may be gone".to_owned(),
        ));
    }
    if let Some(first) = scan.segments.first().filter(|s| s.first > from.next()) {
        broken_before.get_or_insert((
            Break::Missing,
            format!(
                "the snapshot is at log position {from}, but the log starts at {}",
                first.first
            ),
        ));
    }
    if !started_over && scan.next() < from.next() {
        broken_before.get_or_insert((
            Break::Missing,
            format!(
                "the snapshot is at log position {from}, but the log ends at {}",
                scan.next().prev()
            ),
        ));
    }
    let mut restored = StartFrom::default();
    if let Some(body) = body {
        // The epoch is kept unless continuity is already broken (the replay may still break
        // it); a snapshot taken with the log off keeps it only if it was exact.
        let keep = broken_before.is_none() && broken_at_end.is_none() && (!unpositioned || exact);
        restored = body.restore_into(hub, keep).await;
        tracing::info!(
            file = %file.as_deref().unwrap_or(Path::new("")).display(),
            log_position = from.get(),
            epoch = %hub.journal().epoch().await,
            "restored snapshot"
        );
    }
    Ok(Begun {
        dumps: restored.dumps,
        deleted: restored.deleted,
        log,
        plan: Some(Plan {
            dir,
            scan,
            segment_bytes: settings.segment_bytes as u64,
            from,
            broken_before,
            broken_at_end,
            used,
            unpositioned,
            no_snapshot: file.is_none(),
            history: history.map(|h| h.id),
            watermark: settings.watermark,
        }),
    })
}

/// What [`prepare`] found and did.
struct Prepared {
    scan: LogScan,
    /// A `fsync = "os"` life ran on another boot of the machine.
    boot_changed: bool,
    /// Why the log's end cannot be vouched for: it ends before its watermark, or nothing
    /// vouches for it.
    end_problem: Option<String>,
    /// The highest position the segments and the watermark showed was used.
    used: LogPosition,
    /// The snapshot holds everything the log held: the log was set aside whole and starts over
    /// after the snapshot, with its epoch.
    started_over: bool,
}

/// Scans the log, sets aside segments of another history, checks its end against the
/// watermark, sets aside damaged segments whose records the snapshot at `from` already holds
/// ([`set_aside_covered`]), and cuts a torn tail (only when nothing else is wrong); syncs what an
/// earlier life left unsynced and notes (or clears) this life's boot id. With the watermark off
/// nothing vouches for the end, so nothing is checked against it; with it, bytes past what it
/// proves acknowledged are a torn tail whatever they look like.
fn prepare(
    dir: &LogDir,
    os: bool,
    watermark: bool,
    metrics: &LogMetrics,
    history: Option<&viewtape_snapshots::history::DataHistory>,
    from: Option<LogPosition>,
) -> Result<Prepared, LogError> {
    let mut scan = dir.scan()?;
    let mut mark = EndMark::Unneeded;
    if let Some(history) = history {
        let before = scan.clone();
        if crate::recovery::history::set_aside_foreign(dir, &scan, history, metrics)? {
            scan = dir.scan()?;
        }
        if watermark {
            mark = crate::recovery::history::end_mark(dir, &before, history, metrics)?;
        }
    }
    if let Some(ours) = mark.ours() {
        scan.torn_past(ours);
    }
    let used = scan
        .last_used()
        .max(mark.ours().map_or(LogPosition::ZERO, Watermark::last_used));
    let mut end_problem = mark.problem(&scan);
    let started_over = match from {
        Some(from) => set_aside_covered(dir, &mut scan, from, mark.ours(), &mut end_problem)?,
        None => false,
    };
    if scan.corruption().is_none() && end_problem.is_none() {
        let cut = dir.repair(&scan)?;
        if cut > 0 {
            metrics.repaired_bytes.inc_by(cut);
            tracing::warn!(
                bytes = cut,
                "cut a torn tail off the newest log segment (never acknowledged)"
            );
            scan = dir.scan()?;
        }
    }
    let marker = dir.path().join(UNSYNCED_BOOT);
    let boot = boot_id();
    let boot_changed = match std::fs::read_to_string(&marker) {
        Ok(noted) => noted.trim() != boot,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => false,
        Err(error) => {
            return Err(LogError::Io {
                action: "read",
                path: marker,
                source: error,
            })
        }
    };
    dir.sync_all()?;
    let io = |action: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| LogError::Io {
            action,
            path,
            source,
        }
    };
    if os {
        std::fs::write(&marker, &boot).map_err(io("write", &marker))?;
    } else if marker.exists() {
        std::fs::remove_file(&marker).map_err(io("remove", &marker))?;
    }
    Ok(Prepared {
        scan,
        boot_changed,
        end_problem,
        used,
        started_over,
    })
}

/// Sets aside (`….vtlog.damaged`, kept) the segments a start does not need because the
/// snapshot at position `from` already holds every record in them, when they are damaged or
/// come before a hole: damage confined to what the snapshot holds breaks no continuity. When
/// the snapshot holds the whole log — `mark` proves nothing after `from` was acknowledged and
/// no segment shows a later position — a log that is damaged, ends early or ends before the
/// snapshot is set aside whole, `end_problem` is cleared (the snapshot vouches for the end),
/// and the log starts over after `from`. Returns whether it was set aside whole.
fn set_aside_covered(
    dir: &LogDir,
    scan: &mut LogScan,
    from: LogPosition,
    mark: Option<&Watermark>,
    end_problem: &mut Option<String>,
) -> Result<bool, LogError> {
    let mut kept = Vec::new();
    let mut whole = false;
    // Each round sets aside at least one segment, or is the last.
    for _ in 0..=scan.segments.len() {
        // The segments before `needed` hold the damage (or end before the hole); the start
        // needs them only if they hold a position after `from`.
        let needed = match scan.first_damage() {
            Some(damage) => {
                let Some(at) = scan.segments.iter().position(|s| s.path == damage.path) else {
                    break;
                };
                match damage.kind {
                    LogDamageKind::Missing { .. } => at,
                    _ => at + 1,
                }
            }
            None if end_problem.is_some() || scan.next() <= from => scan.segments.len(),
            None => break,
        };
        whole = match scan.segments.get(needed) {
            Some(next) if next.first <= from.next() => false,
            Some(_) => break,
            None if mark.is_some_and(|m| m.last_used() <= from) && scan.last_used() <= from => true,
            None => break,
        };
        for segment in &scan.segments[..needed] {
            kept.push(dir.set_aside(&segment.path)?);
        }
        *scan = dir.scan()?;
        if whole {
            *end_problem = None;
            break;
        }
    }
    if whole || !kept.is_empty() {
        tracing::warn!(
            log_position = from.get(),
            kept = ?kept,
            whole,
            "log segments the snapshot makes unneeded are damaged or end early: set aside (kept); they break no continuity"
        );
    }
    Ok(whole)
}

/// This boot of the machine (Linux); elsewhere a constant, so the rule never fires.
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

pub mod history;
mod replay;

pub use replay::replay;
