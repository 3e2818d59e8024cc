use std::fs::{self, OpenOptions};
use std::path::Path;

use proptest::prelude::*;

use super::tests::{append_all, append_each, payloads, read_all, segment_paths, small_segments};
use super::*;
use crate::history::HistoryId;

/// One way a log can be damaged between two lives.
#[derive(Clone, Debug)]
enum Harm {
    Flip { file: usize, at: f64, mask: u8 },
    Cut { file: usize, at: f64 },
    Delete { file: usize },
    Swap { a: usize, b: usize },
    Foreign { file: usize },
    FlipWatermark { at: usize },
    Append { file: usize, bytes: Vec<u8> },
}

fn harm() -> impl Strategy<Value = Harm> {
    prop_oneof![
        (0usize..8, 0.0f64..1.0, 1u8..=255).prop_map(|(file, at, mask)| Harm::Flip {
            file,
            at,
            mask
        }),
        (0usize..8, 0.0f64..1.0).prop_map(|(file, at)| Harm::Cut { file, at }),
        (0usize..8).prop_map(|file| Harm::Delete { file }),
        (0usize..8, 0usize..8).prop_map(|(a, b)| Harm::Swap { a, b }),
        (0usize..8).prop_map(|file| Harm::Foreign { file }),
        (0usize..WATERMARK_LEN).prop_map(|at| Harm::FlipWatermark { at }),
        (0usize..8, proptest::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(file, bytes)| Harm::Append { file, bytes }),
    ]
}

fn apply(harm: &Harm, log: &LogDir, stranger: &Path) -> std::io::Result<()> {
    let paths = segment_paths(log);
    let pick = |i: usize| paths.get(i % paths.len().max(1)).cloned();
    match harm {
        Harm::Flip { file, at, mask } => {
            if let Some(p) = pick(*file) {
                let mut b = fs::read(&p)?;
                if !b.is_empty() {
                    let i = ((b.len() as f64 * at) as usize).min(b.len() - 1);
                    b[i] ^= mask;
                    fs::write(&p, b)?;
                }
            }
        }
        Harm::Cut { file, at } => {
            if let Some(p) = pick(*file) {
                let len = fs::metadata(&p)?.len();
                OpenOptions::new()
                    .write(true)
                    .open(&p)?
                    .set_len((len as f64 * at) as u64)?;
            }
        }
        Harm::Delete { file } => {
            if let Some(p) = pick(*file) {
                fs::remove_file(p)?;
            }
        }
        Harm::Swap { a, b } => {
            if let (Some(a), Some(b)) = (pick(*a), pick(*b)) {
                let (ba, bb) = (fs::read(&a)?, fs::read(&b)?);
                fs::write(&a, bb)?;
                fs::write(&b, ba)?;
            }
        }
        Harm::Foreign { file } => {
            // Another server's segment, under a name of this log.
            let theirs = segment_paths(&LogDir::create(stranger).expect("their log"));
            if let Some(p) = theirs.get(file % theirs.len().max(1)) {
                fs::copy(p, log.dir.join(p.file_name().unwrap_or_default()))?;
            }
        }
        Harm::Append { file, bytes } => {
            if let Some(p) = pick(*file) {
                let mut b = fs::read(&p)?;
                b.extend_from_slice(bytes);
                fs::write(&p, b)?;
            }
        }
        Harm::FlipWatermark { at } => {
            let p = log.watermark_path();
            let mut b = fs::read(&p)?;
            b[*at] ^= 0x04;
            fs::write(&p, b)?;
        }
    }
    Ok(())
}

fn write_log(dir: &Path, history: HistoryId, n: usize) -> Vec<(LogPosition, Vec<u8>)> {
    let log = LogDir::create(dir).expect("log");
    let options = WriterOptions {
        lineage: Lineage {
            history: Some(history),
            epoch: 1,
        },
        durability: Durability::Os, // what is on disk is what matters here, and it is fast
        ..small_segments()
    };
    let writer =
        LogWriter::start(&log, LogPosition::new(1), options, Box::new(|_| {})).expect("writer");
    append_each(&writer, payloads(n))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever happens to the files between two lives (flips, cuts, deletions, swaps,
    /// another server's segments, a damaged watermark, bytes appended): a start that accepts the log — no
    /// corruption, nothing foreign, a valid watermark of its history that the log reaches —
    /// reads back every acknowledged record, each as it was acknowledged. So no position,
    /// and no offset, is ever handed to a second batch.
    #[test]
    fn damage_is_noticed_or_harmless(n in 20usize..120, harms in proptest::collection::vec(harm(), 1..4)) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let ours = crate::history::DataHistory::new(crate::history::Legacy::default());
        let theirs = crate::history::DataHistory::new(crate::history::Legacy::default());
        let given = write_log(&tmp.path().join("ours"), ours.id, n);
        write_log(&tmp.path().join("theirs"), theirs.id, 90);
        let log = LogDir::create(tmp.path().join("ours")).expect("log");
        for harm in &harms {
            apply(harm, &log, &tmp.path().join("theirs")).expect("harm");
        }
        let mut scan = log.scan().expect("scan");
        let mark = log.read_watermark().expect("read");
        // As the server does: past what its own watermark proves acknowledged, bad bytes at the
        // end are a torn tail.
        if let Some(Ok(m)) = &mark {
            if m.history == Some(ours.id) {
                scan.torn_past(m);
            }
        }
        // As the server does for a snapshot at position 0: the log must start right after it.
        let accepted = scan.segments.first().is_some_and(|s| s.first == LogPosition::new(1))
            && scan.corruption().is_none()
            && scan.foreign(&ours).count() == 0
            && matches!(mark, Some(Ok(m)) if m.history == Some(ours.id) && scan.end_problem(&m).is_none());
        if accepted {
            log.repair(&scan).expect("repair");
            let read = read_all(&log, 0).expect("read");
            prop_assert!(read.len() >= n, "{} of {} acknowledged records", read.len(), n);
            for (record, (position, payload)) in read.iter().zip(&given) {
                prop_assert_eq!((record.position, &record.payload), (*position, payload));
            }
        }
    }

    /// A crash at any byte of a write: the scan finds no corruption, every record wholly
    /// written before the cut reads back as it was, and nothing after it.
    #[test]
    fn a_cut_at_any_byte_is_a_torn_tail(n in 1usize..40, cut in 0.0f64..1.0) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let log = LogDir::create(tmp.path()).expect("log");
        let writer = LogWriter::start(&log, LogPosition::new(1), WriterOptions::default(), Box::new(|_| {})).expect("writer");
        let given = append_all(&writer, payloads(n));
        drop(writer);
        let path = log.scan().expect("scan").segments[0].path.clone();
        let len = fs::metadata(&path).expect("stat").len();
        let keep = (len as f64 * cut) as u64;
        OpenOptions::new().write(true).open(&path).expect("open").set_len(keep).expect("cut");
        let scan = log.scan().expect("scan");
        prop_assert_eq!(scan.corruption(), None);
        log.repair(&scan).expect("repair");
        let read = read_all(&log, 0).expect("read");
        prop_assert_eq!(read.len() as u64, scan.next().prev().get());
        for (record, (position, payload)) in read.iter().zip(&given) {
            prop_assert_eq!((record.position, &record.payload), (*position, payload));
        }
        let whole = given.iter().take_while(|(p, _)| {
            let end: usize = given.iter().take(p.get() as usize).map(|(_, b)| b.len() + RECORD_HEADER_LEN).sum();
            (SEGMENT_HEADER_LEN + end) as u64 <= keep
        }).count();
        prop_assert_eq!(read.len(), whole);
    }
}
