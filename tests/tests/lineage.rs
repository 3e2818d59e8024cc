//! Every file names its history, and the end of the log is known (README, "What a 200
//! promises"): damage is never taken for a torn write, and files of another server are never
//! replayed or adopted.
//!
//! Each test acknowledges batches, reads their cursor, stops the server with `kill -9`, does to
//! the data directory what a flaky disk or an unlucky operator does, and restarts. The old
//! cursor then gets a `reset` (the start failed closed) or resumes exactly where it was (the
//! server kept its own history) — it never gets another event.
//!
//! One file past 500 lines: one subject (files and their history), each test whole.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _};
use viewtape_journal::Cursor;
use viewtape_tests::logfiles::*;
use viewtape_tests::{expect, Feed, Server};

/// A server with small segments (so that there are several), acknowledged batches, and the
/// cursor of its last event.
async fn with_segments(
    feed: &mut Feed,
) -> anyhow::Result<(Server, tempfile::NamedTempFile, Cursor)> {
    let (server, config, last, _) = with_receipts(feed).await?;
    Ok((server, config, last))
}

/// [`with_segments`], and what was acknowledged: the log position of each batch and the `seq`
/// of its last tick.
async fn with_receipts(
    feed: &mut Feed,
) -> anyhow::Result<(Server, tempfile::NamedTempFile, Cursor, Vec<(u64, u64)>)> {
    let (server, config) =
        start_with(&demo_config("builtin:ticker", "segment_bytes = 4096")).await?;
    let dir = log_dir(&server);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut acked = Vec::new();
    // Several segments, the newest holding at least two records.
    while segments(&dir)?.len() < 3 || record_frames(&newest_segment(&server)?.1)?.len() < 2 {
        ensure!(Instant::now() < deadline, "{} batches", acked.len());
        let position = receipt(&server.ingest_ok(&feed.batch(10)).await?, 10)?;
        acked.push((position, feed.next_seq() - 1));
    }
    let last = last_cursor(&server).await?;
    Ok((server, config, last, acked))
}

/// The first position a segment holds, from its name (`log-<20 digits>.vtlog`).
fn first_position(segment: &Path) -> anyhow::Result<u64> {
    let name = file_name(segment);
    name.strip_prefix("log-")
        .and_then(|rest| rest.strip_suffix(".vtlog"))
        .and_then(|digits| digits.parse().ok())
        .with_context(|| format!("not a segment name: {name}"))
}

/// The cursor of the view's newest event.
async fn last_cursor(server: &Server) -> anyhow::Result<Cursor> {
    let (epoch, offset) = head(server, "prices").await?;
    viewtape_tests::parse_cursor(&format!("{epoch}-{offset}"))
}

/// `viewtape_foreign_files_total{kind="…"}`.
async fn foreign(server: &Server, kind: &str) -> anyhow::Result<f64> {
    server
        .metric(&format!("viewtape_foreign_files_total{{kind=\"{kind}\"}}"))
        .await
}

/// A bit flipped in the last record — complete on disk, acknowledged — is damage, not a torn
/// write: the start fails closed and the old cursor gets a reset, never the next batch's event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bit_flipped_in_the_last_complete_record_fails_closed() -> anyhow::Result<()> {
    let mut server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    for _ in 0..5 {
        receipt(&server.ingest_ok(&feed.batch(2)).await?, 2)?;
    }
    let last = last_cursor(&server).await?;
    server.kill9().await?;

    let (segment, mut bytes) = newest_segment(&server)?;
    let &(at, len) = record_frames(&bytes)?.last().context("no record")?;
    ensure!(at + len == bytes.len(), "the last record ends the segment");
    bytes[at + RECORD_HEADER + (len - RECORD_HEADER) / 2] ^= 0x01;
    std::fs::write(&segment, &bytes)?;
    let (code, out) = inspect(&log_dir(&server)).await?;
    ensure!(code != 0 && out.contains("CORRUPT"), "{code}\n{out}");

    server.restart().await?;
    ensure!(
        !server.logs().contains("torn tail"),
        "taken for a torn write:\n{}",
        server.logs()
    );
    let (mut stream, synced) = failed_closed(&server, "corrupt", &last).await?;
    kept(&segment, &bytes)?;
    // The next batch is an event of the fresh epoch, not one the old cursor could name.
    let resp = server.ingest("demo", &feed.batch(1)).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    // (The guest reports the lost ticks as a gap: the stream may get a reset and the state.)
    let fresh = loop {
        let event = stream.next_event().await?;
        if event.event == "update" || event.event == "synced" {
            break expect::cursor_of(&event)?;
        }
    };
    ensure!(fresh.epoch() == synced.epoch() && fresh.epoch() != last.epoch());
    Ok(())
}

/// Each way the newest segment can go missing — deleted, emptied, cut to its header, cut at a
/// record boundary before the end the watermark names — leaves a log that scans clean, and
/// each fails closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_way_the_newest_segment_goes_missing_fails_closed() -> anyhow::Result<()> {
    type Harm = fn(&Path, &[u8]) -> anyhow::Result<()>;
    let ways: [(&str, Harm); 4] = [
        ("deleted", |p, _| Ok(std::fs::remove_file(p)?)),
        ("emptied", |p, _| Ok(std::fs::write(p, b"")?)),
        ("cut to its header", |p, b| {
            Ok(std::fs::write(p, &b[..SEGMENT_HEADER])?)
        }),
        ("cut at a record boundary", |p, b| {
            let &(at, _) = record_frames(b)?.last().context("no record")?;
            Ok(std::fs::write(p, &b[..at])?)
        }),
    ];
    for (way, harm) in ways {
        let mut feed = Feed::new(&["ACME", "BOLT"]);
        let (mut server, _config, last) = with_segments(&mut feed).await?;
        server.kill9().await?;
        let (segment, bytes) = newest_segment(&server)?;
        ensure!(
            record_frames(&bytes)?.len() >= 2,
            "{way}: the newest segment holds records"
        );
        harm(&segment, &bytes)?;
        let (code, out) = inspect(&log_dir(&server)).await?;
        ensure!(code != 0, "{way}: inspect exits non-zero:\n{out}");

        server.restart().await?;
        failed_closed(&server, "missing", &last)
            .await
            .with_context(|| format!("{way}:\n{}", server.logs()))?;
        // Nothing the producer sent after what is left is invented; ingest goes on.
        let view = server.get("/views/prices").await?.json()?;
        for symbol in ["ACME", "BOLT"] {
            let seq = &view["entries"][symbol]["seq"];
            ensure!(
                seq.is_null() || seq.as_u64().is_some_and(|s| s < feed.next_seq()),
                "{way}: {symbol}: {view}"
            );
        }
        let resp = server.ingest("demo", &feed.batch(1)).await?;
        ensure!(resp.status() == 200, "{way}: {}", resp.status());
    }
    Ok(())
}

/// A torn tail made by a real partial write — the kernel stops a write at the file size limit
/// in the middle of a record, as a crash does — was never acknowledged: it is cut and the epoch
/// kept; the old cursor resumes with nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_tail_from_a_real_partial_write_keeps_the_epoch() -> anyhow::Result<()> {
    let mut server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME"]);
    for _ in 0..4 {
        receipt(&server.ingest_ok(&feed.batch(2)).await?, 2)?;
    }
    let last = last_cursor(&server).await?;
    server.kill9().await?;
    let (segment, bytes) = newest_segment(&server)?;
    let &(at, len) = record_frames(&bytes)?.last().context("no record")?;
    // `cat` appends a whole record; RLIMIT_FSIZE stops the write halfway through it.
    let record = tempfile::NamedTempFile::new()?;
    std::fs::write(record.path(), &bytes[at..at + len])?;
    append_cut_at(&segment, record.path(), bytes.len() as u64 + len as u64 / 2)?;
    let torn = std::fs::metadata(&segment)?.len();
    ensure!(
        torn > bytes.len() as u64 && torn < (bytes.len() + len) as u64,
        "a partial write: {torn} bytes after {}",
        bytes.len()
    );

    server.restart().await?;
    ensure!(
        !says_fresh_epoch(&server) && server.logs().contains("torn tail"),
        "{}",
        server.logs()
    );
    ensure!(
        std::fs::read(&segment)? == bytes,
        "cut back to what was acknowledged"
    );
    resumes_with_the_next_tick(&server, &mut feed, &last).await
}

/// With the watermark off (`[log] watermark = false`) nothing vouches for the end of the log, and
/// nothing is demanded of it either: a restart after `kill -9` keeps the epoch and the cursor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_watermark_a_restart_keeps_the_epoch() -> anyhow::Result<()> {
    let (mut server, _config) =
        start_with(&demo_config("builtin:ticker", "watermark = false")).await?;
    let mut feed = Feed::new(&["ACME"]);
    for _ in 0..4 {
        receipt(&server.ingest_ok(&feed.batch(2)).await?, 2)?;
    }
    let last = last_cursor(&server).await?;
    server.kill9().await?;
    ensure!(
        !log_dir(&server).join("end").exists(),
        "no watermark is written with it off"
    );
    server.restart().await?;
    ensure!(!says_fresh_epoch(&server), "{}", server.logs());
    resumes_with_the_next_tick(&server, &mut feed, &last).await
}

/// Resumes `last` on `prices` without a reset, and requires the feed's next tick to follow it
/// at the next offset, in the same epoch.
async fn resumes_with_the_next_tick(
    server: &Server,
    feed: &mut Feed,
    last: &Cursor,
) -> anyhow::Result<()> {
    let mut resumed = expect::resumes(server, "prices", last).await?;
    let seq = feed.next_seq();
    receipt(&server.ingest_ok(&feed.batch(1)).await?, 1)?;
    let n = last.offset().get() + 1;
    let next = expect::update(&resumed.next_event().await?, n, feed.symbol_of(seq), seq)?;
    ensure!(next.epoch() == last.epoch(), "{next} after {last}");
    Ok(())
}

/// Appends `from` to `to` with `cat` under a file size limit of `limit` bytes.
fn append_cut_at(to: &Path, from: &Path, limit: u64) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let out = std::fs::OpenOptions::new().append(true).open(to)?;
    let mut cat = std::process::Command::new("cat");
    cat.arg(from).stdout(out);
    // SAFETY: between fork and exec only async-signal-safe calls: setrlimit(2) with a valid
    // resource and a pointer to a live rlimit.
    unsafe {
        cat.pre_exec(move || {
            let rlimit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: libc::RLIM_INFINITY,
            };
            match libc::setrlimit(libc::RLIMIT_FSIZE, &rlimit) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    let status = cat.status()?;
    ensure!(!status.success(), "cat was not stopped by the limit");
    Ok(())
}

/// Two servers with acknowledged batches of their own symbols; both stopped with `kill -9`.
async fn two_servers() -> anyhow::Result<(Server, Cursor, Server)> {
    let mut ours = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    for _ in 0..5 {
        receipt(&ours.ingest_ok(&feed.batch(2)).await?, 2)?;
    }
    let last = last_cursor(&ours).await?;
    let mut theirs = Server::start(&[]).await?;
    let mut other = Feed::new(&["ZETA"]);
    for _ in 0..3 {
        receipt(&theirs.ingest_ok(&other.batch(2)).await?, 2)?;
    }
    theirs.stop_graceful().await?;
    ours.kill9().await?;
    Ok((ours, last, theirs))
}

/// The regular files directly in `dir`.
fn files_in(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_file() {
            files.push(path);
        }
    }
    Ok(files)
}

/// Another server's `log/` copied over this one's: its segments are set aside, never
/// replayed; nothing vouches for this server's own end any more, so it fails closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_servers_log_is_never_replayed() -> anyhow::Result<()> {
    let (mut ours, last, theirs) = two_servers().await?;
    let dir = log_dir(&ours);
    for file in files_in(&dir)? {
        std::fs::remove_file(file)?;
    }
    for file in files_in(&log_dir(&theirs))? {
        std::fs::copy(&file, dir.join(file_name(&file)))?;
    }

    ours.restart().await?;
    let (_stream, _) = failed_closed(&ours, "missing", &last).await?;
    ensure!(foreign(&ours, "segment").await? >= 1.0, "{}", ours.logs());
    ensure!(foreign(&ours, "watermark").await? >= 1.0);
    let view = ours.get("/views/prices").await?.json()?;
    ensure!(
        view["entries"]["ZETA"].is_null(),
        "their events replayed: {view}"
    );
    ensure!(
        files_in(&dir)?
            .iter()
            .any(|f| file_name(f).ends_with(".vtlog.foreign")),
        "their segments are kept, set aside"
    );
    Ok(())
}

/// Another server's snapshot copied in beside this one's, newer than this one's: set aside,
/// never adopted; this server keeps its own history exactly — the old cursor resumes with no
/// reset and its state is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_servers_snapshot_is_never_adopted() -> anyhow::Result<()> {
    let (mut ours, last, theirs) = two_servers().await?;
    let snapshots = ours.data_dir().join("snapshots");
    let mine = files_in(&snapshots)?;
    let newest_ms = mine
        .iter()
        .filter_map(|f| file_name(f).get(5..21)?.parse::<u64>().ok())
        .max()
        .context("no snapshot of ours")?;
    let their_newest = files_in(&theirs.data_dir().join("snapshots"))?
        .into_iter()
        .max()
        .context("no snapshot of theirs")?;
    let copied = snapshots.join(format!(
        "snap-{:016}-0000000099-exact.vtsnap",
        newest_ms + 1
    ));
    std::fs::copy(&their_newest, &copied)?;

    ours.restart().await?;
    ensure!(!says_fresh_epoch(&ours), "{}", ours.logs());
    ensure!(foreign(&ours, "snapshot").await? == 1.0, "{}", ours.logs());
    let mut aside = copied.into_os_string();
    aside.push(".foreign");
    ensure!(
        Path::new(&aside).exists(),
        "their snapshot is kept, set aside"
    );
    let view = ours.get("/views/prices").await?.json()?;
    ensure!(
        view["entries"]["ZETA"].is_null() && view["entries"]["ACME"]["seq"].is_u64(),
        "{view}"
    );
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    feed.set_next_seq(11);
    resumes_with_the_next_tick(&ours, &mut feed, &last).await
}

/// A graceful stop that cannot write its exact snapshot (a full disk: here the file size
/// limit) logs one line and exits cleanly; the log holds everything acknowledged, so the next
/// start resumes the old cursor with nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_on_a_full_disk_exits_cleanly_and_keeps_everything_acknowledged(
) -> anyhow::Result<()> {
    let mut server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME"]);
    for _ in 0..3 {
        receipt(&server.ingest_ok(&feed.batch(2)).await?, 2)?;
    }
    let last = last_cursor(&server).await?;
    limit_file_size(&server, Some(1))?;
    let status = server.stop_graceful().await?;
    let logs = server.logs();
    ensure!(status.success(), "exit status {status}:\n{logs}");
    ensure!(
        logs.matches("could not write the exact snapshot at stop")
            .count()
            == 1
            && !logs.contains("panicked")
            && !logs.contains("backtrace"),
        "{logs}"
    );
    server.restart().await?;
    ensure!(!says_fresh_epoch(&server), "{}", server.logs());
    resumes_with_the_next_tick(&server, &mut feed, &last).await
}

/// What is left of the log after a harm at its end: which acknowledged records are intact.
#[derive(Clone, Copy, Debug)]
enum Left {
    /// Every record but the last.
    AllButTheLast,
    /// The records before the newest segment.
    BeforeTheNewestSegment,
    /// Every record (only the watermark is harmed).
    Everything,
}

/// Another server's newest segment (its header names another history), the server kept so
/// its data directory lives.
async fn another_servers_segment() -> anyhow::Result<(Server, Vec<u8>)> {
    let mut theirs = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ZETA"]);
    for _ in 0..3 {
        receipt(&theirs.ingest_ok(&feed.batch(2)).await?, 2)?;
    }
    theirs.stop_graceful().await?;
    let (_, bytes) = newest_segment(&theirs)?;
    Ok((theirs, bytes))
}

/// Every way the end of the log goes missing or loses what vouches for it — the newest segment
/// cut in the middle of a record, deleted, cut to its header, the end-of-log watermark zeroed
/// or deleted, another server's segment in place of the newest — fails closed (a fresh epoch,
/// the files kept) but keeps the state that the intact records before the damage prove: every
/// one of them is served under the new epoch, not an empty state. And the log positions go on
/// after every one acknowledged before: a receipt never names a position an earlier batch was
/// acknowledged with. (It used to restart with an empty state, and to hand out the positions of
/// the lost records again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_end_of_the_log_keeps_what_the_intact_records_prove() -> anyhow::Result<()> {
    let (_theirs, their_segment) = another_servers_segment().await?;
    type Harm = fn(&Path, &[u8], &[u8]) -> anyhow::Result<()>;
    let ways: [(&str, Left, Harm); 6] = [
        ("cut mid-record", Left::AllButTheLast, |p, b, _| {
            let &(at, len) = record_frames(b)?.last().context("no record")?;
            Ok(std::fs::write(p, &b[..at + len / 2])?)
        }),
        ("deleted", Left::BeforeTheNewestSegment, |p, _, _| {
            Ok(std::fs::remove_file(p)?)
        }),
        (
            "cut to its header",
            Left::BeforeTheNewestSegment,
            |p, b, _| Ok(std::fs::write(p, &b[..SEGMENT_HEADER])?),
        ),
        ("watermark zeroed", Left::Everything, |p, _, _| {
            let mark = p.with_file_name("end");
            let len = std::fs::metadata(&mark)?.len() as usize;
            Ok(std::fs::write(mark, vec![0u8; len])?)
        }),
        ("watermark deleted", Left::Everything, |p, _, _| {
            Ok(std::fs::remove_file(p.with_file_name("end"))?)
        }),
        (
            "another server's segment in its place",
            Left::BeforeTheNewestSegment,
            |p, _, theirs| Ok(std::fs::write(p, theirs)?),
        ),
    ];
    for (way, left, harm) in ways {
        let mut feed = Feed::new(&["ACME", "BOLT"]);
        let (mut server, _config, last, acked) = with_receipts(&mut feed).await?;
        server.kill9().await?;
        let (segment, bytes) = newest_segment(&server)?;
        let last_acked = acked.iter().map(|(p, _)| *p).max().context("no batch")?;
        let intact_through = match left {
            Left::AllButTheLast => last_acked - 1,
            Left::BeforeTheNewestSegment => first_position(&segment)? - 1,
            Left::Everything => last_acked,
        };
        // The last tick of the last batch whose record is intact.
        let proven = acked
            .iter()
            .filter(|(position, _)| *position <= intact_through)
            .map(|(_, seq)| *seq)
            .max()
            .context("no intact batch")?;
        harm(&segment, &bytes, &their_segment)?;

        server.restart().await?;
        let context = || format!("{way}:\n{}", server.logs());
        let (mut stream, synced) = failed_closed(&server, "missing", &last)
            .await
            .with_context(context)?;
        // The state every intact record proves, under the fresh epoch.
        let view = server.get("/views/prices").await?.json()?;
        for seq in [proven - 1, proven] {
            let symbol = feed.symbol_of(seq);
            ensure!(
                view["entries"][symbol]["seq"].as_u64() == Some(seq),
                "{way}: {symbol} at seq {seq} is served: {view}\n{}",
                server.logs()
            );
        }
        if way.starts_with("another server") {
            ensure!(foreign(&server, "segment").await? >= 1.0, "{}", context());
        }
        // The next tick follows the proven state, at a log position after every one
        // acknowledged before.
        feed.set_next_seq(proven + 1);
        let position = receipt(&server.ingest_ok(&feed.batch(1)).await?, 1)?;
        ensure!(
            position > last_acked,
            "{way}: position {position} again, after {last_acked} was acknowledged"
        );
        let next = expect::update(
            &stream.next_event().await?,
            synced.offset().get() + 1,
            feed.symbol_of(proven + 1),
            proven + 1,
        )?;
        ensure!(next.epoch() == synced.epoch(), "{way}: {next} vs {synced}");
    }
    Ok(())
}

/// Another server's segment added after a complete log (named as the segment that would come
/// next; its header names another history and another first position) is foreign, not damage:
/// it is set aside and counted in `viewtape_foreign_files_total{kind="segment"}`, and this
/// server's own log, whole, keeps its epoch — the old cursor resumes with no reset. (It used to
/// be taken for a damaged segment: a fresh epoch, and the foreign-files metric stayed 0.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_segment_after_a_complete_log_is_foreign_not_damage() -> anyhow::Result<()> {
    let (mut ours, last, theirs) = two_servers().await?;
    let dir = log_dir(&ours);
    let (newest, bytes) = newest_segment(&ours)?;
    let next = first_position(&newest)? + record_frames(&bytes)?.len() as u64;
    let (_, their_bytes) = newest_segment(&theirs)?;
    let added = dir.join(format!("log-{next:020}.vtlog"));
    std::fs::write(&added, &their_bytes)?;

    ours.restart().await?;
    ensure!(!says_fresh_epoch(&ours), "{}", ours.logs());
    ensure!(foreign(&ours, "segment").await? == 1.0, "{}", ours.logs());
    ensure!(
        fail_closed(&ours, "corrupt").await == 0.0,
        "{}",
        ours.logs()
    );
    let mut aside = added.into_os_string();
    aside.push(".foreign");
    ensure!(
        std::fs::read(&aside)? == their_bytes,
        "their segment is kept, set aside as it was"
    );
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    feed.set_next_seq(11);
    resumes_with_the_next_tick(&ours, &mut feed, &last).await
}

/// Bytes after the last record of the newest segment, past everything the end-of-log watermark
/// proves acknowledged, were never acknowledged, whatever they look like — 37 bytes that make a
/// complete record failing its checksum, or 37 bytes announcing more than any record: a torn
/// tail, cut, the epoch kept, the old cursor resumed with no reset. (They were taken for damage
/// to a complete record: a fresh epoch and a reset for every client, although no acknowledged
/// byte was touched.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_past_the_watermark_are_a_torn_tail_and_keep_the_epoch() -> anyhow::Result<()> {
    let mut server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME"]);
    for _ in 0..4 {
        receipt(&server.ingest_ok(&feed.batch(2)).await?, 2)?;
    }
    let mut complete = vec![21, 0, 0, 0];
    complete.extend((0..33u8).map(|i| i.wrapping_mul(97).wrapping_add(13)));
    let mut huge = vec![0xa5, 0x5a, 0x00, 0xff];
    huge.extend((0..33u8).map(|i| i.wrapping_mul(31).wrapping_add(7)));
    for (round, tail) in [complete, huge].into_iter().enumerate() {
        let last = last_cursor(&server).await?;
        server.kill9().await?;
        let (segment, bytes) = newest_segment(&server)?;
        std::fs::write(&segment, [&bytes[..], &tail].concat())?;

        server.restart().await?;
        ensure!(
            !says_fresh_epoch(&server) && server.logs().contains("torn tail"),
            "round {round}:\n{}",
            server.logs()
        );
        ensure!(
            fail_closed(&server, "corrupt").await == 0.0,
            "round {round}"
        );
        ensure!(
            std::fs::read(&segment)? == bytes,
            "round {round}: cut back to what was acknowledged"
        );
        resumes_with_the_next_tick(&server, &mut feed, &last).await?;
    }
    Ok(())
}

/// Damage confined to records an exact snapshot already holds — a byte flipped in the first
/// record after a graceful stop, then the whole newest segment deleted after another — breaks
/// no continuity: the snapshot plus nothing rebuilds the server exactly, so the damaged files
/// are set aside (kept as they were) and the epoch is kept; the old cursor resumes with no
/// reset. (Such damage used to force a fresh epoch.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_only_to_records_an_exact_snapshot_holds_keeps_the_epoch() -> anyhow::Result<()> {
    let mut server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME"]);
    for round in 0..2 {
        for _ in 0..3 {
            receipt(&server.ingest_ok(&feed.batch(2)).await?, 2)?;
        }
        let last = last_cursor(&server).await?;
        server.stop_graceful().await?;
        let (segment, mut bytes) = newest_segment(&server)?;
        if round == 0 {
            let &(at, len) = record_frames(&bytes)?.first().context("no record")?;
            bytes[at + RECORD_HEADER + (len - RECORD_HEADER) / 2] ^= 0x5a;
            std::fs::write(&segment, &bytes)?;
        } else {
            std::fs::remove_file(&segment)?;
        }

        server.restart().await?;
        ensure!(
            !says_fresh_epoch(&server),
            "round {round}:\n{}",
            server.logs()
        );
        for cause in ["corrupt", "missing"] {
            ensure!(fail_closed(&server, cause).await == 0.0, "round {round}");
        }
        if round == 0 {
            kept(&segment, &bytes)?;
        }
        resumes_with_the_next_tick(&server, &mut feed, &last).await?;
    }
    Ok(())
}
