use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::*;
use crate::codec::encode;
use crate::error::{FormatError, SnapshotError};
use crate::header::SnapshotMeta;
use crate::seq::SnapshotSeq;

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
        manual: false,
    }
}

#[test]
fn a_snapshot_of_another_history_is_set_aside_never_loaded() -> TestResult {
    use crate::history::{DataHistory, Legacy};
    let tmp = tempfile::tempdir()?;
    // A version-1 file the directory held before it had a history: its own.
    let v1 =
        crate::codec::tests::as_version_1(&encode(&State { epoch: 1, n: 1 }, &meta(false, 1_000))?);
    fs::write(
        tmp.path()
            .join("snap-0000000000001000-0000000001-periodic.vtsnap"),
        &v1,
    )?;
    let ours = DataHistory::new(Legacy {
        log_through: None,
        snapshot_seq: Some(SnapshotSeq::new(1)),
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
    assert_eq!(third.seq(), SnapshotSeq::new(3));
    let listed: Vec<u64> = dir.list()?.iter().map(|e| e.seq.get()).collect();
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

/// A snapshot an operator asked for was named `periodic`, like the timer's: it is named
/// `manual`, listed so, and otherwise loads and is retained as a periodic one.
#[test]
fn a_manual_snapshot_is_named_so_and_kept_as_a_periodic_one() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = SnapshotDir::open(tmp.path())?.with_keep_periodic(2);
    let manual = dir.write(&State { epoch: 1, n: 0 }, &SnapshotMeta::manual_now())?;
    assert!(
        manual.file_name().ends_with("-manual.vtsnap"),
        "{}",
        manual.file_name()
    );
    assert_eq!(manual.kind(), SnapshotKind::Manual);
    assert!(!manual.is_exact());
    let listed = dir.list()?;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].kind, SnapshotKind::Manual);
    assert!(listed[0].is_valid());
    let newest = dir.load_newest_valid::<State>()?;
    assert_eq!(newest.loaded.map(|l| l.body.n), Some(0));
    // Two periodic ones later, it is the oldest of three: retention removes it.
    for n in 1..=2 {
        dir.write(&State { epoch: 1, n }, &SnapshotMeta::periodic_now())?;
    }
    let report = dir.prune()?;
    assert_eq!(report.removed, vec![manual.path().to_owned()]);
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
