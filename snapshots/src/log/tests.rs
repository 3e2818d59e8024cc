//! The log's tests: appends, scans and every kind of damage, on real files. One file past 500
//! lines: the cases share the helpers that write and damage segments.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};

use super::segment::{frame_at, put_record};
use super::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Appends every payload, one at a time (one record per group: segments rotate finely).
pub(super) fn append_each(
    writer: &LogWriter,
    payloads: Vec<Vec<u8>>,
) -> Vec<(LogPosition, Vec<u8>)> {
    payloads
        .into_iter()
        .map(|payload| {
            let (tx, rx) = mpsc::channel();
            writer.append(
                payload.clone(),
                Box::new(move |result| {
                    let _ = tx.send(result);
                }),
            );
            (rx.recv().expect("completion").expect("appended"), payload)
        })
        .collect()
}

/// Appends every payload from four threads at once; returns the positions given.
pub(super) fn append_all(
    writer: &LogWriter,
    payloads: Vec<Vec<u8>>,
) -> Vec<(LogPosition, Vec<u8>)> {
    let given = Arc::new(Mutex::new(Vec::new()));
    let (done_tx, done_rx) = mpsc::channel();
    let n = payloads.len();
    std::thread::scope(|scope| {
        for chunk in payloads.chunks(n.div_ceil(4).max(1)) {
            let (given, done_tx) = (Arc::clone(&given), done_tx.clone());
            scope.spawn(move || {
                for payload in chunk {
                    let (given, done_tx, copy) =
                        (Arc::clone(&given), done_tx.clone(), payload.clone());
                    writer.append(
                        payload.clone(),
                        Box::new(move |result| {
                            let position = result.expect("appended");
                            given.lock().expect("lock").push((position, copy));
                            let _ = done_tx.send(());
                        }),
                    );
                }
            });
        }
    });
    for _ in 0..n {
        done_rx.recv().expect("completion");
    }
    let mut given = given.lock().expect("lock").clone();
    given.sort();
    given
}

pub(super) fn read_all(log: &LogDir, after: u64) -> Result<Vec<LogRecord>, LogError> {
    let mut records = Vec::new();
    log.read_after(LogPosition::new(after), |record| {
        records.push(record);
        Ok::<_, LogError>(())
    })?;
    Ok(records)
}

pub(super) fn payloads(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("batch {i}").repeat(i % 7 + 1).into_bytes())
        .collect()
}

pub(super) fn small_segments() -> WriterOptions {
    WriterOptions {
        segment_bytes: 2_000,
        ..WriterOptions::default()
    }
}

#[test]
fn concurrent_appends_get_dense_positions_and_read_back_in_order() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let log = LogDir::create(tmp.path())?;
    let writer = LogWriter::start(
        &log,
        LogPosition::new(1),
        small_segments(),
        Box::new(|_| {}),
    )?;
    let mut given = append_all(&writer, payloads(300));
    given.extend(append_each(&writer, payloads(60)));
    drop(writer);
    let positions: Vec<u64> = given.iter().map(|(p, _)| p.get()).collect();
    assert_eq!(positions, (1..=360).collect::<Vec<_>>());
    let scan = log.scan()?;
    assert!(scan.segments.len() >= 3, "rotated: {}", scan.segments.len());
    assert_eq!(scan.corruption(), None);
    assert_eq!(scan.next(), LogPosition::new(361));
    let read = read_all(&log, 0)?;
    assert_eq!(read.len(), 360);
    for (record, (position, payload)) in read.iter().zip(&given) {
        assert_eq!((record.position, &record.payload), (*position, payload));
    }
    assert_eq!(
        read_all(&log, 250)?.first().map(|r| r.position),
        Some(LogPosition::new(251))
    );
    // A reopened writer continues the numbering.
    let writer = LogWriter::start(&log, scan.next(), small_segments(), Box::new(|_| {}))?;
    let more = append_all(&writer, payloads(5));
    assert_eq!(more.first().map(|(p, _)| *p), Some(LogPosition::new(361)));
    Ok(())
}

#[test]
fn a_multi_record_append_is_consecutive_and_observed() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let log = LogDir::create(tmp.path())?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let observer = {
        let seen = Arc::clone(&seen);
        Box::new(move |group: GroupWritten| seen.lock().expect("lock").push(group))
    };
    let writer = LogWriter::start(
        &log,
        LogPosition::new(7),
        WriterOptions::default(),
        observer,
    )?;
    let (tx, rx) = mpsc::channel();
    writer.append_all(
        vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()],
        Box::new(move |result| {
            let _ = tx.send(result);
        }),
    );
    assert_eq!(rx.recv()?.map_err(|e| e.to_string())?, LogPosition::new(7));
    drop(writer);
    let read = read_all(&log, 0)?;
    let got: Vec<_> = read
        .iter()
        .map(|r| (r.position.get(), r.payload.clone()))
        .collect();
    assert_eq!(
        got,
        vec![(7, b"a".to_vec()), (8, b"b".to_vec()), (9, b"c".to_vec())]
    );
    let seen = seen.lock().expect("lock");
    assert_eq!(seen.len(), 1);
    assert_eq!((seen[0].records, seen[0].next), (3, LogPosition::new(10)));
    assert!(seen[0].sync.is_some(), "fsync durability syncs");
    Ok(())
}

#[test]
fn truncate_after_leaves_exactly_the_records_up_to_a_position() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let log = LogDir::create(tmp.path())?;
    let writer = LogWriter::start(
        &log,
        LogPosition::new(1),
        small_segments(),
        Box::new(|_| {}),
    )?;
    append_each(&writer, payloads(200));
    drop(writer);
    assert!(log.scan()?.segments.len() >= 3);
    // A write cut short after it, too.
    let newest = log
        .segment_files()?
        .last()
        .map(|(_, p)| p.clone())
        .ok_or("none")?;
    OpenOptions::new()
        .append(true)
        .open(&newest)?
        .write_all(b"\x10\x00")?;
    log.truncate_after(LogPosition::new(95))?;
    let scan = log.scan()?;
    assert_eq!(
        (scan.next(), scan.corruption()),
        (LogPosition::new(96), None)
    );
    assert_eq!(read_all(&log, 0)?.len(), 95);
    let writer = LogWriter::start(
        &log,
        LogPosition::new(96),
        small_segments(),
        Box::new(|_| {}),
    )?;
    let more = append_each(&writer, payloads(3));
    assert_eq!(more.first().map(|(p, _)| *p), Some(LogPosition::new(96)));
    drop(writer);
    assert_eq!(log.scan()?.corruption(), None);
    Ok(())
}

#[test]
fn a_torn_tail_is_cut_and_the_log_continues() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let log = LogDir::create(tmp.path())?;
    let writer = LogWriter::start(
        &log,
        LogPosition::new(1),
        WriterOptions::default(),
        Box::new(|_| {}),
    )?;
    append_all(&writer, payloads(10));
    drop(writer);
    let newest = log
        .scan()?
        .segments
        .last()
        .ok_or("no segment")?
        .path
        .clone();
    // Half a record, then zeros a crashed file system may leave.
    let mut file = OpenOptions::new().append(true).open(&newest)?;
    file.write_all(&[30, 0, 0, 0, 1, 2, 3, 4, 11, 0, 0])?;
    file.write_all(&[0; 100])?;
    let scan = log.scan()?;
    assert_eq!(scan.corruption(), None);
    assert!(matches!(
        scan.segments.last().and_then(|s| s.damage.clone()),
        Some(Damage::TornTail { .. })
    ));
    assert_eq!(scan.next(), LogPosition::new(11));
    assert_eq!(log.repair(&scan)?, 111);
    assert_eq!(
        log.scan()?.segments.last().and_then(|s| s.damage.clone()),
        None
    );
    let writer = LogWriter::start(
        &log,
        scan.next(),
        WriterOptions::default(),
        Box::new(|_| {}),
    )?;
    append_all(&writer, payloads(1));
    drop(writer);
    assert_eq!(read_all(&log, 0)?.len(), 11);
    Ok(())
}

#[test]
fn corruption_before_the_tail_and_missing_segments_are_never_repaired() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let log = LogDir::create(tmp.path())?;
    let writer = LogWriter::start(
        &log,
        LogPosition::new(1),
        small_segments(),
        Box::new(|_| {}),
    )?;
    append_each(&writer, payloads(100));
    drop(writer);
    let scan = log.scan()?;
    let newest = scan.segments.last().ok_or("no segment")?;
    // A flipped byte inside the newest segment's first record.
    let mut bytes = fs::read(&newest.path)?;
    bytes[SEGMENT_HEADER_LEN + 20] ^= 0x40;
    fs::write(&newest.path, &bytes)?;
    let (path, reason) = log.scan()?.corruption().ok_or("not detected")?;
    assert_eq!(path, newest.path);
    assert!(reason.contains("intact records after it"), "{reason}");
    // Reading stops at the damage: nothing after it is served.
    assert_eq!(read_all(&log, 0)?.len() as u64, newest.first.prev().get());

    // A missing middle segment.
    let tmp = tempfile::tempdir()?;
    let log = LogDir::create(tmp.path())?;
    let writer = LogWriter::start(
        &log,
        LogPosition::new(1),
        small_segments(),
        Box::new(|_| {}),
    )?;
    append_each(&writer, payloads(100));
    drop(writer);
    let middle = log.scan()?.segments[1].path.clone();
    fs::remove_file(&middle)?;
    let (_, reason) = log.scan()?.corruption().ok_or("not detected")?;
    assert!(reason.contains("missing"), "{reason}");
    let kept = log.set_aside(&log.scan()?.segments[1].path)?;
    assert!(kept.exists());
    Ok(())
}

#[test]
fn old_segments_are_deleted_once_no_snapshot_needs_them() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let log = LogDir::create(tmp.path())?;
    let writer = LogWriter::start(
        &log,
        LogPosition::new(1),
        small_segments(),
        Box::new(|_| {}),
    )?;
    append_each(&writer, payloads(100));
    drop(writer);
    let before = log.scan()?.segments;
    let keep_from = before[2].first; // a snapshot at position keep_from - 1
    assert_eq!(log.delete_before(keep_from.prev())?, 2);
    let after = log.scan()?;
    assert_eq!(after.segments.first().map(|s| s.first), Some(keep_from));
    assert_eq!(after.corruption(), None);
    assert_eq!(
        read_all(&log, keep_from.prev().get())?.len() as u64,
        LogPosition::new(101).since(keep_from)
    );
    Ok(())
}

pub(super) fn segment_paths(log: &LogDir) -> Vec<PathBuf> {
    log.segment_files()
        .expect("list")
        .into_iter()
        .map(|(_, p)| p)
        .collect()
}

/// Writes `payloads(5)` into the new log `log`, a record at a time; its one segment's path and
/// bytes.
fn five_records(log: &LogDir) -> Result<(PathBuf, Vec<u8>), Box<dyn std::error::Error>> {
    let writer = LogWriter::start(
        log,
        LogPosition::new(1),
        WriterOptions::default(),
        Box::new(|_| {}),
    )?;
    append_each(&writer, payloads(5));
    drop(writer);
    let path = segment_paths(log).pop().ok_or("no segment")?;
    let bytes = fs::read(&path)?;
    Ok((path, bytes))
}

fn watermark(log: &LogDir) -> Watermark {
    log.read_watermark()
        .expect("read")
        .expect("a watermark")
        .expect("valid")
}

#[test]
fn a_complete_last_record_that_fails_its_checksum_is_damage_not_a_torn_write() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let log = LogDir::create(tmp.path())?;
    let (path, bytes) = five_records(&log)?;
    let last_len = RECORD_HEADER_LEN + payloads(5)[4].len();
    let at = bytes.len() - last_len;
    // Every byte but the length field: the record is whole on disk, so it is damage.
    for i in at + 4..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0x10;
        fs::write(&path, &bad)?;
        let scan = log.scan()?;
        let (_, reason) = scan.corruption().ok_or(format!("byte {i}: not detected"))?;
        assert!(reason.contains("complete record"), "{reason}");
    }
    // The length field: announcing more than the file holds looks torn, and the watermark
    // says the log ends too early.
    let mut bad = bytes.clone();
    bad[at + 2] ^= 0x01;
    fs::write(&path, &bad)?;
    let scan = log.scan()?;
    assert_eq!(scan.corruption(), None);
    assert!(scan.end_problem(&watermark(&log)).is_some());
    // A zero-filled tail, and a partial record ending in zeros, are torn.
    for tail in [
        vec![0u8; 300],
        [&bytes[at..at + 9], &[0u8; 200][..]].concat(),
    ] {
        fs::write(&path, [&bytes[..], &tail].concat())?;
        let scan = log.scan()?;
        assert_eq!(scan.corruption(), None);
        assert_eq!(scan.next(), LogPosition::new(6));
        assert_eq!(scan.end_problem(&watermark(&log)), None);
    }
    Ok(())
}

#[test]
fn a_segment_header_of_an_unknown_version_is_damage_and_nothing_of_it_is_read() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let log = LogDir::create(tmp.path())?;
    let writer = LogWriter::start(
        &log,
        LogPosition::new(1),
        small_segments(),
        Box::new(|_| {}),
    )?;
    append_each(&writer, payloads(100));
    drop(writer);
    let newest = log.scan()?.segments.last().ok_or("none")?.clone();
    let mut bytes = fs::read(&newest.path)?;
    bytes[8] = 9;
    let crc = crc32c::crc32c(&bytes[..44]);
    bytes[44..48].copy_from_slice(&crc.to_le_bytes());
    fs::write(&newest.path, &bytes)?;
    let (_, reason) = log.scan()?.corruption().ok_or("not detected")?;
    assert!(reason.contains("version 9"), "{reason}");
    assert_eq!(read_all(&log, 0)?.len() as u64, newest.first.prev().get());
    Ok(())
}

#[test]
fn bad_headers_and_watermarks_are_told_in_the_words_a_reader_sees() {
    use super::segment::{parse_header, read_header, segment_header};
    use super::watermark::WatermarkError;
    let say = |result: Result<_, segment::SegmentHeaderError>| result.err().map(|e| e.to_string());
    let first = LogPosition::new(7);
    let good = segment_header(first, &Lineage::default());
    let mut version = good.clone();
    version[8] = 9;
    let mut checksum = good.clone();
    checksum[40] ^= 1;
    let cases = [
        (
            read_header(b"nope"),
            "not a viewtape log segment (bad magic)",
        ),
        (read_header(&good[..9]), "shorter than a segment header"),
        (read_header(&good[..30]), "shorter than a segment header"),
        (
            read_header(&version),
            "segment format version 9; this build reads 1 and 2",
        ),
        (read_header(&checksum), "segment header checksum mismatch"),
        (
            parse_header(&good, LogPosition::new(8)),
            "header says first position 7, the name says 8",
        ),
    ];
    for (result, words) in cases {
        assert_eq!(say(result).as_deref(), Some(words));
    }
    assert!(parse_header(&good, first).is_ok());
    let mark = Watermark {
        history: None,
        rolled_at: first,
        through: first,
    }
    .to_bytes();
    let (mut version, mut checksum) = (mark, mark);
    version[8] = 2;
    checksum[30] ^= 1;
    for (bytes, error, words) in [
        (
            &mark[..47],
            WatermarkError::NotAWatermark,
            "not a viewtape log watermark",
        ),
        (
            &version[..],
            WatermarkError::UnknownVersion,
            "unknown watermark version",
        ),
        (
            &checksum[..],
            WatermarkError::Checksum,
            "watermark checksum mismatch",
        ),
    ] {
        assert_eq!(Watermark::parse(bytes), Err(error));
        assert_eq!(error.to_string(), words);
    }
}

#[test]
fn segments_carry_their_history_and_epoch_and_version_1_is_still_read() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let log = LogDir::create(tmp.path())?;
    // A version-1 segment, as builds before history ids wrote it.
    let mut v1 = LOG_MAGIC.to_vec();
    v1.extend_from_slice(&1u16.to_le_bytes());
    v1.extend_from_slice(&[0, 0]);
    v1.extend_from_slice(&1u64.to_le_bytes());
    let crc = crc32c::crc32c(&v1);
    v1.extend_from_slice(&crc.to_le_bytes());
    for (i, payload) in payloads(3).iter().enumerate() {
        put_record(&mut v1, LogPosition::new(i as u64 + 1), payload);
    }
    fs::write(log.segment_path(LogPosition::new(1)), &v1)?;
    let scan = log.scan()?;
    assert_eq!(
        (scan.next(), scan.corruption()),
        (LogPosition::new(4), None)
    );
    assert_eq!(
        (scan.segments[0].version, scan.segments[0].history),
        (1, None)
    );
    assert_eq!(read_all(&log, 0)?.len(), 3);

    let history = crate::history::DataHistory::new(crate::history::Legacy {
        log_through: Some(LogPosition::new(1)),
        snapshot_seq: None,
    });
    assert_eq!(
        scan.foreign(&history).count(),
        0,
        "held when the id was made"
    );
    let stranger = crate::history::DataHistory::new(crate::history::Legacy::default());
    assert_eq!(scan.foreign(&stranger).count(), 1);

    // The writer does not append to it: a new segment, of this history and epoch.
    let options = WriterOptions {
        lineage: Lineage {
            history: Some(history.id),
            epoch: 77,
        },
        ..WriterOptions::default()
    };
    let writer = LogWriter::start(&log, LogPosition::new(4), options, Box::new(|_| {}))?;
    append_each(&writer, payloads(2));
    drop(writer);
    let scan = log.scan()?;
    assert_eq!(scan.segments.len(), 2);
    let newest = &scan.segments[1];
    assert_eq!(
        (newest.first, newest.version, newest.history, newest.epoch),
        (LogPosition::new(4), 2, Some(history.id), Some(77))
    );
    assert_eq!(scan.foreign(&history).count(), 0);
    assert_eq!(scan.foreign(&stranger).count(), 2);
    assert_eq!(read_all(&log, 0)?.len(), 5);
    let mark = watermark(&log);
    assert_eq!(
        (mark.history, mark.rolled_at, mark.through),
        (Some(history.id), LogPosition::new(4), LogPosition::new(5))
    );
    Ok(())
}

#[test]
fn the_watermark_notices_every_way_the_end_of_the_log_goes_missing() -> TestResult {
    let written = |tmp: &Path| -> Result<(LogDir, Vec<PathBuf>), Box<dyn std::error::Error>> {
        let log = LogDir::create(tmp)?;
        let writer = LogWriter::start(
            &log,
            LogPosition::new(1),
            small_segments(),
            Box::new(|_| {}),
        )?;
        append_each(&writer, payloads(100));
        drop(writer);
        let paths = segment_paths(&log);
        assert!(paths.len() >= 3);
        assert_eq!(watermark(&log).through, LogPosition::new(100));
        assert_eq!(log.scan()?.end_problem(&watermark(&log)), None);
        Ok((log, paths))
    };
    type Damage = fn(&Path, &[u8]) -> std::io::Result<()>;
    let ways: [(&str, Damage); 4] = [
        ("deleted", |p, _| fs::remove_file(p)),
        ("emptied", |p, _| fs::write(p, b"")),
        ("header only", |p, b| fs::write(p, &b[..SEGMENT_HEADER_LEN])),
        ("cut at a record boundary", |p, b| {
            let mut at = SEGMENT_HEADER_LEN;
            let mut boundaries = vec![];
            while let Some((_, _, len)) = frame_at(b, at) {
                at += len;
                boundaries.push(at);
            }
            fs::write(p, &b[..boundaries[boundaries.len() - 2]])
        }),
    ];
    for (name, damage) in ways {
        let tmp = tempfile::tempdir()?;
        let (log, paths) = written(tmp.path())?;
        let newest = paths.last().ok_or("none")?;
        damage(newest, &fs::read(newest)?)?;
        let scan = log.scan()?;
        assert_eq!(scan.corruption(), None, "{name}: the log scans clean");
        assert!(
            scan.end_problem(&watermark(&log)).is_some(),
            "{name}: not noticed"
        );
    }
    // Cutting never-acknowledged records after a failure moves the watermark with them.
    let tmp = tempfile::tempdir()?;
    let (log, _) = written(tmp.path())?;
    log.truncate_after(LogPosition::new(60))?;
    assert_eq!(watermark(&log).through, LogPosition::new(60));
    assert_eq!(log.scan()?.end_problem(&watermark(&log)), None);
    Ok(())
}

#[test]
fn inspection_creates_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let missing = tmp.path().join("log");
    assert!(LogDir::open_existing(&missing).is_err());
    assert!(!missing.exists());
}

#[test]
fn bytes_past_what_the_watermark_proves_acknowledged_are_a_torn_tail() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let log = LogDir::create(tmp.path())?;
    let (path, bytes) = five_records(&log)?;
    let mark = watermark(&log);
    assert_eq!(mark.through, LogPosition::new(5));
    // 37 bytes after the last record: a record header announcing the 21 bytes that follow (a
    // complete record that fails its checksum), and bytes announcing more than the limit.
    let mut complete = vec![21, 0, 0, 0];
    complete.extend((0..33u8).map(|i| i.wrapping_mul(97).wrapping_add(13)));
    let mut huge = vec![0xa5, 0x5a, 0x00, 0xff];
    huge.extend((0..33u8).map(|i| i.wrapping_mul(31).wrapping_add(7)));
    for tail in [complete, huge] {
        assert_eq!(tail.len(), 37);
        fs::write(&path, [&bytes[..], &tail].concat())?;
        let mut scan = log.scan()?;
        assert!(scan.corruption().is_some(), "without the watermark: damage");
        assert!(scan.torn_past(&mark));
        assert_eq!(scan.corruption(), None);
        assert_eq!(scan.end_problem(&mark), None);
        assert_eq!(log.repair(&scan)?, 37);
        assert_eq!(fs::read(&path)?, bytes);
        assert_eq!(read_all(&log, 0)?.len(), 5);
    }
    // Damage to an acknowledged record stays damage.
    let mut bad = bytes.clone();
    let last = bad.len() - 3;
    bad[last] ^= 0x10;
    fs::write(&path, &bad)?;
    let mut scan = log.scan()?;
    assert!(!scan.torn_past(&mark));
    assert!(scan.corruption().is_some());
    // So do bad bytes with an intact record after them: it was written after them.
    let mut next = Vec::new();
    put_record(&mut next, LogPosition::new(7), b"later");
    fs::write(&path, [&bytes[..], &[0xee; 37][..], &next].concat())?;
    let mut scan = log.scan()?;
    assert!(!scan.torn_past(&mark));
    assert!(scan.corruption().is_some());
    assert_eq!(
        scan.last_used(),
        LogPosition::new(7),
        "the record after the damage used position 7"
    );
    Ok(())
}

#[test]
fn a_segment_of_another_history_is_foreign_under_any_name() -> TestResult {
    let ours = crate::history::DataHistory::new(crate::history::Legacy::default());
    let theirs = crate::history::DataHistory::new(crate::history::Legacy::default());
    let written = |dir: &Path, history: &crate::history::DataHistory, n: usize| {
        let log = LogDir::create(dir)?;
        let options = WriterOptions {
            lineage: Lineage {
                history: Some(history.id),
                epoch: 1,
            },
            ..WriterOptions::default()
        };
        let writer = LogWriter::start(&log, LogPosition::new(1), options, Box::new(|_| {}))?;
        append_each(&writer, payloads(n));
        drop(writer);
        Ok::<_, Box<dyn std::error::Error>>(log)
    };
    let tmp = tempfile::tempdir()?;
    let log = written(&tmp.path().join("ours"), &ours, 10)?;
    let other = written(&tmp.path().join("theirs"), &theirs, 3)?;
    // Their segment (its header says position 1) named as the one after our last record.
    let their_segment = segment_paths(&other).pop().ok_or("none")?;
    fs::copy(&their_segment, log.segment_path(LogPosition::new(11)))?;
    let scan = log.scan()?;
    let foreign: Vec<_> = scan.foreign(&ours).map(|s| s.path.clone()).collect();
    assert_eq!(foreign, vec![log.segment_path(LogPosition::new(11))]);
    assert_eq!(scan.foreign(&theirs).count(), 1, "ours, to them");
    Ok(())
}

#[test]
fn the_last_position_used_counts_the_watermark_and_every_segment() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let log = LogDir::create(tmp.path())?;
    let writer = LogWriter::start(
        &log,
        LogPosition::new(1),
        small_segments(),
        Box::new(|_| {}),
    )?;
    append_each(&writer, payloads(100));
    drop(writer);
    let paths = segment_paths(&log);
    let newest = log.scan()?.segments.last().ok_or("none")?.first;
    fs::remove_file(paths.last().ok_or("none")?)?;
    let scan = log.scan()?;
    assert_eq!(scan.last_used(), newest.prev());
    assert_eq!(watermark(&log).last_used(), LogPosition::new(100));
    Ok(())
}
