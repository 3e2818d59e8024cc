//! The log (DESIGN §8): what a `200` promises.
//!
//! - A `kill -9` loses nothing acknowledged and keeps the epoch: restart replays the log, so
//!   cursors resume with no `reset` and the same offsets (also over rounds of crashes with
//!   concurrent producers, periodic snapshots and small segments).
//! - A torn tail is cut at start, the epoch kept; anything else that breaks continuity (a bad
//!   record before the tail, a missing segment, a guest module swapped behind the server's
//!   back) fails closed: the server starts and serves with a fresh epoch, says so in its log
//!   output and in `viewtape_log_fail_closed_total{cause}`, and keeps the files; its receipts
//!   name positions after every one acknowledged before.
//! - `viewtape log inspect DIR` exits 0 on a clean log and non-zero on corruption.
//! - Idempotent producers (`Producer-Id`, `Producer-Epoch`, `Producer-Seq`): duplicates,
//!   `409` with the expected seq, `403` for a fenced epoch, and the producer table rebuilt by
//!   replay after a crash.
//!
//! A graceful stop and restart keeping the epoch is covered in `restart.rs` and `snapshots.rs`.
//!
//! One file past 500 lines: one subject (what a `200` promises), each test whole and independent
//! of the others; a binary per subject keeps the suite's count of binaries down.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use viewtape_journal::Cursor;
use viewtape_tests::logfiles::*;
use viewtape_tests::server::{config_file, guest_wasm, with_custom_section};
use viewtape_tests::{expect, feed::event_seq, http, EventStream, Feed, Response, Server};

/// `POST /runtimes/{runtime}/ingest` as an idempotent producer.
async fn produce(
    server: &Server,
    id: &str,
    epoch: Option<u64>,
    seq: u64,
    body: &str,
) -> anyhow::Result<Response> {
    let seq = seq.to_string();
    let epoch = epoch.map(|e| e.to_string());
    let mut headers = vec![("Producer-Id", id), ("Producer-Seq", seq.as_str())];
    if let Some(epoch) = &epoch {
        headers.push(("Producer-Epoch", epoch.as_str()));
    }
    http::request(
        server.addr(),
        "POST",
        "/runtimes/demo/ingest",
        &headers,
        body.as_bytes(),
    )
    .await
}

fn is_duplicate(resp: &Response) -> bool {
    resp.header("producer-duplicate")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// A `200` that ran (not a duplicate); returns the receipt.
fn ran(resp: &Response, events: u64) -> anyhow::Result<serde_json::Value> {
    ensure!(
        resp.status() == 200,
        "expected 200: {} {}",
        resp.status(),
        resp.text()
    );
    ensure!(
        !is_duplicate(resp),
        "not a duplicate: {:?} {}",
        resp.head.headers,
        resp.text()
    );
    let reply = resp.json()?;
    receipt(&reply, events)?;
    Ok(reply)
}

/// A `200` duplicate; returns the receipt.
fn duplicate(resp: &Response) -> anyhow::Result<serde_json::Value> {
    ensure!(
        resp.status() == 200,
        "a duplicate is a 200: {} {}",
        resp.status(),
        resp.text()
    );
    ensure!(
        is_duplicate(resp),
        "Producer-Duplicate: true expected: {:?} {}",
        resp.head.headers,
        resp.text()
    );
    resp.json()
}

/// A `409` naming the seq the server expects.
fn out_of_order(resp: &Response, expected: u64) -> anyhow::Result<()> {
    expect::json_error(resp, 409)?;
    ensure!(
        resp.header("producer-expected-seq").map(str::trim) == Some(expected.to_string().as_str()),
        "Producer-Expected-Seq: {expected} expected: {:?}",
        resp.head.headers
    );
    Ok(())
}

/// A `409 producer_seq_reused`: a used seq sent with another body, naming the next seq.
fn reused(resp: &Response, next: u64) -> anyhow::Result<()> {
    out_of_order(resp, next)?;
    let error = resp.json()?;
    ensure!(
        error["error"] == "producer_seq_reused" && error["next_seq"] == next,
        "producer_seq_reused naming {next}: {error}"
    );
    Ok(())
}

/// `POST /runtimes/demo/producers/{id}`: the epoch claimed.
async fn claim(server: &Server, id: &str) -> anyhow::Result<u64> {
    let resp = server
        .post(&format!("/runtimes/demo/producers/{id}"), b"")
        .await?;
    ensure!(
        resp.status() == 200,
        "a claim is a 200: {} {}",
        resp.status(),
        resp.text()
    );
    let claimed = resp.json()?;
    ensure!(
        claimed["producer"] == id && claimed["seq"] == 0 && claimed["position"].is_u64(),
        "the claim names the producer, seq 0 and its log position: {claimed}"
    );
    claimed["epoch"].as_u64().context("an epoch")
}

// ---- crash and replay ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_keeps_the_epoch_and_every_acknowledged_batch() -> anyhow::Result<()> {
    let mut server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    let mut last_position = 0;
    for _ in 0..5 {
        let position = receipt(&server.ingest_ok(&feed.batch(2)).await?, 2)?;
        ensure!(
            position > last_position,
            "positions increase: {position} after {last_position}"
        );
        last_position = position;
    }
    let tape = expect::tape(&server, "prices", 10).await?;
    for (i, event) in tape.iter().enumerate() {
        let n = i as u64 + 1;
        expect::update(event, n, feed.symbol_of(n), n)?;
    }
    let middle = expect::cursor_of(&tape[5])?;
    let last = expect::cursor_of(&tape[9])?;
    let before = server.get("/views/prices").await?.json()?;

    server.kill9().await?;
    // Every acknowledged batch is on disk, in a clean log.
    let dir = log_dir(&server);
    let files = segments(&dir)?;
    ensure!(!files.is_empty(), "no segment in {}", dir.display());
    let (code, out) = inspect(&dir).await?;
    ensure!(code == 0, "inspect of a clean log exits 0: {code}\n{out}");
    ensure!(
        out.contains(&file_name(&files[0])) && out.contains(&last_position.to_string()),
        "inspect names the segments and positions (up to {last_position}):\n{out}"
    );

    server.restart().await?;
    ensure!(
        !says_fresh_epoch(&server),
        "no fresh epoch after a clean crash:\n{}",
        server.logs()
    );
    // The same state at the same cursor.
    let after = server.get("/views/prices").await?.json()?;
    ensure!(after == before, "state after replay: {after} vs {before}");
    // A client that had read up to offset 6 gets exactly 7..=10: no reset, nothing repeated.
    let mut resumed = server
        .sse(
            "/views/prices/events",
            &[("Last-Event-ID", &middle.to_string())],
        )
        .await?;
    for n in 7..=10 {
        let cursor = expect::update(&resumed.next_event().await?, n, feed.symbol_of(n), n)?;
        ensure!(cursor.epoch() == last.epoch(), "same epoch: {cursor}");
    }
    resumed.expect_silence(Duration::from_millis(300)).await?;
    // A client that had read everything waits for new events, which continue the offsets.
    let mut live = expect::resumes(&server, "prices", &last).await?;
    // The guest's state was replayed too: seq 11 is the next it accepts.
    let position = receipt(&server.ingest_ok(&feed.batch(1)).await?, 1)?;
    ensure!(
        position > last_position,
        "positions go on increasing after a restart: {position} after {last_position}"
    );
    for stream in [&mut live, &mut resumed] {
        let cursor = expect::update(&stream.next_event().await?, 11, feed.symbol_of(11), 11)?;
        ensure!(cursor.epoch() == last.epoch(), "same epoch: {cursor}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_tail_is_cut_at_start_and_the_epoch_kept() -> anyhow::Result<()> {
    let mut server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME"]);
    let mut last_position = 0;
    for _ in 0..4 {
        last_position = receipt(&server.ingest_ok(&feed.batch(2)).await?, 2)?;
    }
    let mut last = expect::cursor_of(&expect::tape(&server, "prices", 8).await?[7])?;
    let epoch = last.epoch();

    // Two crashes, each leaving a partial record after the last acknowledged one, as a crash
    // in the middle of a write does: (1) a few bytes that are no record at all; (2) the first
    // half of a copy of the last record (a well-formed record header, its payload cut short).
    // Either way no acknowledged byte is touched, so nothing may be lost.
    for round in 0..2 {
        server.kill9().await?;
        let (segment, bytes) = newest_segment(&server)?;
        let frames = record_frames(&bytes)?;
        let torn: Vec<u8> = if round == 0 {
            vec![
                0xa5, 0x5a, 0x00, 0xff, 0x13, 0x37, 0x00, 0x01, 0x02, 0x03, 0x04,
            ]
        } else {
            let &(at, len) = frames.last().context("no record in the newest segment")?;
            bytes[at..at + len / 2].to_vec()
        };
        let mut damaged = bytes.clone();
        damaged.extend_from_slice(&torn);
        std::fs::write(&segment, &damaged)?;

        server.restart().await?;
        ensure!(
            !says_fresh_epoch(&server),
            "a torn tail keeps the epoch (round {round}):\n{}",
            server.logs()
        );
        ensure!(
            fail_closed(&server, "corrupt").await == 0.0,
            "a torn tail is not corruption (round {round})"
        );
        // Repaired: the acknowledged bytes are as they were, the torn bytes are gone.
        let now = std::fs::read(&segment)?;
        ensure!(
            now.starts_with(&bytes),
            "the intact records are kept (round {round})"
        );
        ensure!(
            now.get(bytes.len()..bytes.len() + torn.len()) != Some(&torn[..]),
            "the torn tail was cut (round {round})"
        );
        // The cursor of the last acknowledged event resumes: no reset, nothing new yet.
        let mut resumed = expect::resumes(&server, "prices", &last).await?;
        // New batches continue the offsets, the guest's seq and the log positions.
        let position = receipt(&server.ingest_ok(&feed.batch(2)).await?, 2)?;
        ensure!(
            position > last_position,
            "position {position} after {last_position} (round {round})"
        );
        last_position = position;
        for _ in 0..2 {
            let n = last.offset().get() + 1;
            last = expect::update(&resumed.next_event().await?, n, "ACME", n)?;
            ensure!(last.epoch() == epoch, "same epoch (round {round}): {last}");
        }
        let (code, out) = inspect(&log_dir(&server)).await?;
        ensure!(
            code == 0,
            "inspect after the repair exits 0 (round {round}): {code}\n{out}"
        );
    }
    // Nothing acknowledged was lost: the whole tape, dense.
    let tape = expect::tape(&server, "prices", 12).await?;
    for (i, event) in tape.iter().enumerate() {
        let n = i as u64 + 1;
        ensure!(expect::update(event, n, "ACME", n)?.epoch() == epoch);
    }
    Ok(())
}

// ---- failing closed --------------------------------------------------------------------------

/// A flipped byte in the first record, with intact records after it, fails closed; the new
/// history's receipts name positions after every one acknowledged before, never one an earlier
/// batch was acknowledged with (they used to start again at the damaged record's position).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_record_before_the_tail_fails_closed() -> anyhow::Result<()> {
    let mut server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    let mut last_position = 0;
    for _ in 0..5 {
        last_position = receipt(&server.ingest_ok(&feed.batch(2)).await?, 2)?;
    }
    let last = expect::cursor_of(&expect::tape(&server, "prices", 10).await?[9])?;
    server.kill9().await?;

    // One flipped byte in the middle of the first record's payload, with intact records after
    // it: not a torn tail.
    let (segment, mut bytes) = newest_segment(&server)?;
    let frames = record_frames(&bytes)?;
    ensure!(frames.len() >= 2, "records after the first: {frames:?}");
    let (at, len) = frames[0];
    ensure!(len > RECORD_HEADER, "the first record has a payload");
    bytes[at + RECORD_HEADER + (len - RECORD_HEADER) / 2] ^= 0x5a;
    std::fs::write(&segment, &bytes)?;

    let dir = log_dir(&server);
    let (code, out) = inspect(&dir).await?;
    ensure!(code != 0, "inspect of a corrupted log fails: {code}\n{out}");
    ensure!(
        out.contains(&file_name(&segment)),
        "inspect names the segment:\n{out}"
    );
    ensure!(
        std::fs::read(&segment)? == bytes,
        "inspect changed the segment"
    );

    server.restart().await?;
    let (mut stream, synced) = failed_closed(&server, "corrupt", &last).await?;
    kept(&segment, &bytes)?;

    // It serves: seq 11 follows whatever the guest's state was rebuilt to (nothing, or seq 10)
    // without a gap, at a log position after every one acknowledged before.
    let position = receipt(&server.ingest_ok(&feed.batch(1)).await?, 1)?;
    ensure!(
        position > last_position,
        "position {position} again, after {last_position} was acknowledged"
    );
    let fresh = expect::update(
        &stream.next_event().await?,
        synced.offset().get() + 1,
        feed.symbol_of(11),
        11,
    )?;
    ensure!(fresh.epoch() == synced.epoch(), "{fresh} vs {synced}");

    // From then on the log is healthy again: the next crash keeps the fresh epoch, and the
    // kept file does not fail the start a second time.
    drop(stream);
    server.kill9().await?;
    server.restart().await?;
    expect::resumes(&server, "prices", &fresh).await?;
    ensure!(
        !says_fresh_epoch(&server),
        "no second fresh epoch:\n{}",
        server.logs()
    );
    kept(&segment, &bytes)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_middle_segment_fails_closed() -> anyhow::Result<()> {
    let (mut server, _config) =
        start_with(&demo_config("builtin:ticker", "segment_bytes = 4096")).await?;
    let dir = log_dir(&server);
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut batches = 0;
    while segments(&dir)?.len() < 4 {
        ensure!(
            batches < 300 && Instant::now() < deadline,
            "{batches} batches made only {} segments of 4096 bytes",
            segments(&dir)?.len()
        );
        receipt(&server.ingest_ok(&feed.batch(10)).await?, 10)?;
        batches += 1;
    }
    let acked = feed.next_seq() - 1;
    let (epoch, offset) = head(&server, "prices").await?;
    let last = viewtape_tests::parse_cursor(&format!("{epoch}-{offset}"))?;
    ensure!(offset == acked, "one event per tick: {offset} vs {acked}");

    server.kill9().await?;
    let files = segments(&dir)?;
    let later: Vec<(PathBuf, Vec<u8>)> = files[2..]
        .iter()
        .map(|f| Ok((f.clone(), std::fs::read(f)?)))
        .collect::<anyhow::Result<_>>()?;
    std::fs::remove_file(&files[1])?;
    let (code, out) = inspect(&dir).await?;
    ensure!(
        code != 0,
        "inspect of a log with a hole fails: {code}\n{out}"
    );

    server.restart().await?;
    failed_closed(&server, "missing", &last).await?;
    for (file, bytes) in &later {
        kept(file, bytes)?;
    }
    // Rebuilt at most as far as proven: no tick the producer never sent.
    let view = server.get("/views/prices").await?.json()?;
    for symbol in ["ACME", "BOLT"] {
        let seq = &view["entries"][symbol]["seq"];
        ensure!(
            seq.is_null() || seq.as_u64().is_some_and(|s| s <= acked),
            "{symbol}: {view}"
        );
    }
    // And it takes new batches.
    let resp = server.ingest("demo", &feed.batch(1)).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    Ok(())
}

/// A server on a copy of the ticker at a path of its own, killed with `-9` after six ticks.
struct Crashed {
    server: Server,
    _config: tempfile::NamedTempFile,
    _modules: tempfile::TempDir,
    /// Where the config's module is.
    wasm: PathBuf,
    /// Its bytes.
    original: Vec<u8>,
    feed: Feed,
    /// The cursor of the last tick.
    last: Cursor,
}

impl Crashed {
    async fn on_a_build_of_the_ticker() -> anyhow::Result<Self> {
        let modules = tempfile::tempdir()?;
        let wasm = modules.path().join("ticker.wasm");
        // A build of its own, not the built-in ticker's bytes, which the server holds anyway
        // (and repairs a kept file from).
        let original = with_custom_section(
            &std::fs::read(guest_wasm("ticker"))?,
            "viewtape-test",
            b"first build",
        );
        std::fs::write(&wasm, &original)?;
        let (mut server, config) =
            start_with(&demo_config(&wasm.display().to_string(), "")).await?;
        let mut feed = Feed::new(&["ACME", "BOLT"]);
        for _ in 0..3 {
            receipt(&server.ingest_ok(&feed.batch(2)).await?, 2)?;
        }
        let last = expect::cursor_of(&expect::tape(&server, "prices", 6).await?[5])?;
        server.kill9().await?;
        Ok(Self {
            server,
            _config: config,
            _modules: modules,
            wasm,
            original,
            feed,
            last,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_changed_in_the_config_after_a_crash_is_a_deploy_at_start() -> anyhow::Result<()> {
    let mut crashed = Crashed::on_a_build_of_the_ticker().await?;
    let (server, feed, last) = (&mut crashed.server, &mut crashed.feed, crashed.last);

    // Another build at the same path while the server was down: the log is replayed by the
    // module that wrote it (kept by its hash), then the new build takes the state over.
    std::fs::write(
        &crashed.wasm,
        with_custom_section(&crashed.original, "viewtape-test", b"another build"),
    )?;
    server.restart().await?;
    ensure!(
        server.logs().contains("deployed at start"),
        "{}",
        server.logs()
    );
    ensure!(fail_closed(server, "module").await == 0.0);
    let mut stream = expect::resumes(server, "prices", &last).await?;
    receipt(&server.ingest_ok(&feed.batch(1)).await?, 1)?;
    expect::update(
        &stream.next_event().await?,
        last.offset().get() + 1,
        feed.symbol_of(7),
        7,
    )?;
    ensure!(
        server
            .metric("viewtape_runtime_deploys_total{runtime=\"demo\"}")
            .await?
            == 1.0,
        "one deploy"
    );
    let last = expect::cursor_of(&expect::tape(server, "prices", 7).await?[6])?;
    server.kill9().await?;
    // And again, with the log holding the deploy: replayed exactly, no reset.
    server.restart().await?;
    expect::resumes(server, "prices", &last).await?;
    ensure!(fail_closed(server, "module").await == 0.0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_module_swapped_behind_the_servers_back_starts_its_runtime_fresh_past_every_cursor(
) -> anyhow::Result<()> {
    let mut crashed = Crashed::on_a_build_of_the_ticker().await?;
    let (server, feed, last) = (&mut crashed.server, &mut crashed.feed, crashed.last);
    let files: Vec<(PathBuf, Vec<u8>)> = segments(&log_dir(server))?
        .into_iter()
        .map(|f| {
            let bytes = std::fs::read(&f)?;
            Ok((f, bytes))
        })
        .collect::<anyhow::Result<_>>()?;
    ensure!(!files.is_empty(), "no segment");

    // A different, valid module at the same path, and the module that wrote the log gone
    // from the server's module store: nothing can reproduce the records.
    std::fs::write(
        &crashed.wasm,
        with_custom_section(&crashed.original, "viewtape-test", b"another build"),
    )?;
    for kept in std::fs::read_dir(server.data_dir().join("modules"))? {
        std::fs::remove_file(kept?.path())?;
    }
    server.restart().await?;
    // The runtime halted at its first record, and the module its config names started it
    // fresh: no epoch is taken, nothing else is touched, the log goes on.
    ensure!(
        fail_closed(server, "module").await == 0.0,
        "{}",
        server.logs()
    );
    ensure!(!says_fresh_epoch(server), "{}", server.logs());
    ensure!(
        server.logs().contains("starts fresh on a new module"),
        "{}",
        server.logs()
    );
    let ready = server.ready(std::time::Duration::from_secs(5)).await?;
    ensure!(ready.get("halted").is_none(), "{ready}");
    for (file, bytes) in &files {
        kept(file, bytes)?;
    }
    // Every cursor issued before is refused, and the tape numbers on past all of them.
    let mut stream = expect::refused(server, "prices", &last).await?;
    let (_, synced) = stream.until_synced(10_000).await?;
    let synced = expect::cursor_of(&synced)?;
    ensure!(synced.epoch() == last.epoch(), "{synced} vs {last}");
    ensure!(synced.offset() > last.offset(), "{synced} vs {last}");
    // The new module runs: seq 7 follows.
    receipt(&server.ingest_ok(&feed.batch(1)).await?, 1)?;
    expect::update(
        &stream.next_event().await?,
        synced.offset().get() + 1,
        feed.symbol_of(7),
        7,
    )?;
    // And so it is after a crash: the log replays to the same place.
    let tape = expect::tape(server, "prices", 1).await?;
    server.kill9().await?;
    server.restart().await?;
    ensure!(server
        .ready(std::time::Duration::from_secs(5))
        .await?
        .get("halted")
        .is_none());
    ensure!(
        expect::tape(server, "prices", 1).await? == tape,
        "the same frame"
    );
    Ok(())
}

// ---- idempotent producers --------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producers_dedupe_fence_and_name_the_expected_seq() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME"]);

    // A new producer starts at seq 0; Producer-Epoch defaults to 0.
    let (body0, body1) = (feed.batch(2), feed.batch(2));
    let first = ran(&produce(&server, "orders", None, 0, &body0).await?, 2)?;
    let second = ran(&produce(&server, "orders", Some(0), 1, &body1).await?, 2)?;
    ensure!(
        second["position"].as_u64() > first["position"].as_u64(),
        "{first} then {second}"
    );

    // A retry of the last seq, or of an earlier one, gets that batch's own receipt.
    let dup = duplicate(&produce(&server, "orders", None, 1, &body1).await?)?;
    ensure!(
        dup == second,
        "a duplicate of the last seq answers with the original receipt: {dup} vs {second}"
    );
    let dup = duplicate(&produce(&server, "orders", Some(0), 0, &body0).await?)?;
    ensure!(
        dup == first,
        "a duplicate of an earlier seq answers with its original receipt: {dup} vs {first}"
    );
    // A used seq with another body (ticks the guest would accept, seq 5, 6) is not a retry: a
    // 409 naming the next seq, and nothing runs.
    let unseen = feed.clone().batch(2);
    reused(&produce(&server, "orders", None, 1, &unseen).await?, 2)?;
    reused(&produce(&server, "orders", Some(0), 0, &unseen).await?, 2)?;
    // Ahead of the next seq: 409, naming it; nothing runs.
    out_of_order(&produce(&server, "orders", None, 3, &unseen).await?, 2)?;
    let view = server.get("/views/prices").await?.json()?;
    ensure!(
        view["entries"]["ACME"]["seq"] == 4
            && view["cursor"].as_str().is_some_and(|c| c.ends_with("-4")),
        "nothing published by a duplicate or a 409: {view}"
    );

    // The next seq runs: seq 5 and 6 are new to the guest.
    ran(
        &produce(&server, "orders", None, 2, &feed.batch(2)).await?,
        2,
    )?;

    // A newer epoch starts over at seq 0 and fences the older one.
    out_of_order(
        &produce(&server, "orders", Some(1), 3, &feed.clone().batch(1)).await?,
        0,
    )?;
    let epoch1 = feed.batch(1);
    ran(&produce(&server, "orders", Some(1), 0, &epoch1).await?, 1)?;
    expect::json_error(
        &produce(&server, "orders", Some(0), 3, &feed.clone().batch(1)).await?,
        403,
    )?;
    expect::json_error(
        &produce(&server, "orders", Some(0), 2, &feed.clone().batch(1)).await?,
        403,
    )?;
    duplicate(&produce(&server, "orders", Some(1), 0, &epoch1).await?)?;

    // Another producer id has its own sequence, starting at 0.
    out_of_order(
        &produce(&server, "billing", None, 1, &feed.clone().batch(1)).await?,
        0,
    )?;
    ran(
        &produce(&server, "billing", None, 0, &feed.batch(1)).await?,
        1,
    )?;
    // A batch without producer headers is not affected.
    receipt(&server.ingest_ok(&feed.batch(1)).await?, 1)?;

    // On the tape: exactly seq 1..=9, once each, dense.
    let mut stream = server.sse("/views/prices/events?from=tape", &[]).await?;
    for n in 1..=9 {
        expect::update(&stream.next_event().await?, n, "ACME", n)?;
    }
    stream.expect_silence(Duration::from_millis(300)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_retrying_after_kill_nine_gets_a_duplicate() -> anyhow::Result<()> {
    let mut server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    let mut sent = Vec::new();
    for seq in 0..5 {
        let body = feed.batch(2);
        let receipt = ran(&produce(&server, "ingestor", Some(3), seq, &body).await?, 2)?;
        sent.push((body, receipt));
    }
    let last = sent[4].1.clone();
    let cursor = expect::cursor_of(&expect::tape(&server, "prices", 10).await?[9])?;

    // The 200 of seq 4 got lost with the crash; the producer retries it on the restarted
    // server.
    server.kill9().await?;
    server.restart().await?;
    let mut resumed = server
        .sse(
            "/views/prices/events",
            &[("Last-Event-ID", &cursor.to_string())],
        )
        .await?;
    let dup = duplicate(&produce(&server, "ingestor", Some(3), 4, &sent[4].0).await?)?;
    ensure!(
        dup == last,
        "the original receipt, rebuilt by the replay: {dup} vs {last}"
    );
    let dup = duplicate(&produce(&server, "ingestor", Some(3), 1, &sent[1].0).await?)?;
    ensure!(dup == sent[1].1, "{dup} vs {}", sent[1].1);
    // Ticks the guest would accept under a used seq do not run, before or after the crash.
    reused(
        &produce(&server, "ingestor", Some(3), 4, &feed.clone().batch(2)).await?,
        5,
    )?;
    // The table came back whole: the expected seq and the fence.
    out_of_order(
        &produce(&server, "ingestor", Some(3), 7, &feed.clone().batch(2)).await?,
        5,
    )?;
    expect::json_error(
        &produce(&server, "ingestor", Some(2), 5, &feed.clone().batch(2)).await?,
        403,
    )?;
    resumed.expect_silence(Duration::from_millis(300)).await?;

    let next = ran(
        &produce(&server, "ingestor", Some(3), 5, &feed.batch(2)).await?,
        2,
    )?;
    ensure!(
        next["position"].as_u64() > last["position"].as_u64(),
        "{next} after {last}"
    );
    for n in 11..=12 {
        let c = expect::update(&resumed.next_event().await?, n, feed.symbol_of(n), n)?;
        ensure!(c.epoch() == cursor.epoch(), "same epoch: {c}");
    }

    // The snapshot of a graceful stop carries the table as well.
    drop(resumed);
    ensure!(server.stop_graceful().await?.success());
    server.restart().await?;
    let dup = duplicate(&produce(&server, "ingestor", Some(3), 3, &sent[3].0).await?)?;
    ensure!(dup == sent[3].1, "{dup} vs {}", sent[3].1);
    reused(
        &produce(&server, "ingestor", Some(3), 5, &feed.clone().batch(2)).await?,
        6,
    )?;
    out_of_order(
        &produce(&server, "ingestor", Some(3), 9, &feed.clone().batch(2)).await?,
        6,
    )?;
    let (_, offset) = head(&server, "prices").await?;
    ensure!(offset == 12, "nothing published by the retries: {offset}");
    Ok(())
}

/// A producer with no store of its own, run twice under one id, lost the second run's data: its
/// first batches went as epoch 0, seq 0, 1, … again, were taken for the first run's
/// duplicates, and were answered `200` without running. A producer with no stored position
/// claims an epoch first: both runs' batches are published, across a `kill -9` too, and the
/// first run, still sending, is fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storeless_producer_run_twice_publishes_both_runs() -> anyhow::Result<()> {
    let mut server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME"]);

    let first_run = claim(&server, "feed-1").await?;
    ensure!(first_run == 1, "an unknown id claims epoch 1: {first_run}");
    for seq in 0..3 {
        ran(
            &produce(&server, "feed-1", Some(first_run), seq, &feed.batch(1)).await?,
            1,
        )?;
    }
    // The claim is in the log: a crash does not give the same epoch twice.
    server.kill9().await?;
    server.restart().await?;
    let second_run = claim(&server, "feed-1").await?;
    ensure!(second_run > first_run, "{second_run} after {first_run}");
    for seq in 0..2 {
        ran(
            &produce(&server, "feed-1", Some(second_run), seq, &feed.batch(1)).await?,
            1,
        )?;
    }
    // The first run, still going, is fenced rather than taken for the second.
    let fenced = expect::json_error(
        &produce(
            &server,
            "feed-1",
            Some(first_run),
            3,
            &feed.clone().batch(1),
        )
        .await?,
        403,
    )?;
    ensure!(fenced["error"] == "producer_fenced", "{fenced}");

    // Both runs' ticks are on the tape, once each.
    let mut stream = server.sse("/views/prices/events?from=tape", &[]).await?;
    for n in 1..=5 {
        expect::update(&stream.next_event().await?, n, "ACME", n)?;
    }
    stream.expect_silence(Duration::from_millis(300)).await?;

    // A bad id is a 400 in the server's words; an unknown runtime a 404.
    let long = "p".repeat(257);
    let resp = server
        .post(&format!("/runtimes/demo/producers/{long}"), b"")
        .await?;
    expect::json_error(&resp, 400)?;
    let resp = server.post("/runtimes/nope/producers/p", b"").await?;
    expect::json_error(&resp, 404)?;
    Ok(())
}

/// 300 sends under one producer id racing each other: a duplicate answered while its original
/// was still being committed, or of a seq older than the last, got `{"events":{},
/// "position":null}` instead of the original receipt. Every duplicate's body is now byte for
/// byte the original's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_id_race_gets_the_original_receipt_on_every_duplicate() -> anyhow::Result<()> {
    /// The seqs sent: no more than the server keeps receipts of.
    const SEQS: u64 = 8;
    /// Copies of each seq racing each other, then copies of any seq racing every other.
    const COPIES: usize = 20;
    const LATE: usize = 300 - SEQS as usize * COPIES;
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    let bodies: Vec<String> = (0..SEQS).map(|_| feed.batch(2)).collect();

    let send = |seq: u64| {
        let (addr, body) = (server.addr(), bodies[seq as usize].clone());
        async move {
            let seq = seq.to_string();
            let headers = [("Producer-Id", "racer"), ("Producer-Seq", seq.as_str())];
            http::request(
                addr,
                "POST",
                "/runtimes/demo/ingest",
                &headers,
                body.as_bytes(),
            )
            .await
        }
    };
    let mut answers: Vec<(u64, Response)> = Vec::new();
    for seq in 0..SEQS {
        let copies = futures_util::future::join_all((0..COPIES).map(|_| send(seq))).await;
        for resp in copies {
            answers.push((seq, resp?));
        }
    }
    let late = futures_util::future::join_all((0..LATE).map(|i| send(i as u64 % SEQS))).await;
    for (i, resp) in late.into_iter().enumerate() {
        answers.push((i as u64 % SEQS, resp?));
    }

    let mut originals: BTreeMap<u64, String> = BTreeMap::new();
    for (seq, resp) in &answers {
        ensure!(
            resp.status() == 200,
            "seq {seq}: {} {}",
            resp.status(),
            resp.text()
        );
        if !is_duplicate(resp) {
            ensure!(
                originals.insert(*seq, resp.text()).is_none(),
                "seq {seq} ran twice"
            );
        }
    }
    ensure!(
        originals.len() == SEQS as usize,
        "every seq ran once: {originals:?}"
    );
    for (seq, resp) in &answers {
        ensure!(
            resp.text() == originals[seq],
            "seq {seq}: {} is not the original {}",
            resp.text(),
            originals[seq]
        );
    }
    let (_, offset) = head(&server, "prices").await?;
    ensure!(offset == 2 * SEQS, "each batch published once: {offset}");
    Ok(())
}

// ---- rounds of crashes under concurrent load ----------------------------------------------

/// Rounds of kill -9.
const ROUNDS: usize = 5;
/// Concurrent producers, each with a runtime of its own (the ticker keeps one `seq` per
/// runtime: producers sharing one would race each other's seqs and see ticks skipped).
const PRODUCERS: usize = 4;
/// Ticks per batch.
const TICKS: usize = 3;
/// Batches the leading producer sends per round; the kill follows its last `200`.
const LEAD_BATCHES: usize = 12;
/// Bound on any producer's batches per round.
const MAX_BATCHES: usize = 400;

/// One producer: its runtime, its feed (symbols `P<i>A`, `P<i>B`, seqs 1, 2, 3, …), and what
/// the server promised it.
#[derive(Debug)]
struct Producer {
    runtime: String,
    feed: Feed,
    /// Every seq up to this one is acknowledged (batches go one at a time, in order).
    acked: u64,
    /// A batch that got no answer (the server died): its outcome is unknown, so it is sent
    /// again first in the next round; the guest skips its ticks if the first try was logged.
    unanswered: Option<(String, u64)>,
}

impl Producer {
    /// The highest seq ever sent.
    fn sent(&self) -> u64 {
        self.feed.next_seq() - 1
    }
}

/// Sends batches until the server stops answering, `max` batches, or 20 s.
async fn produce_until_killed(
    addr: SocketAddr,
    mut producer: Producer,
    max: usize,
) -> anyhow::Result<Producer> {
    let path = format!("/runtimes/{}/ingest", producer.runtime);
    let deadline = Instant::now() + Duration::from_secs(20);
    for _ in 0..max {
        if Instant::now() >= deadline {
            break;
        }
        let (body, last_seq, retry) = match producer.unanswered.take() {
            Some((body, last_seq)) => (body, last_seq, true),
            None => {
                let body = producer.feed.batch(TICKS);
                (body, producer.sent(), false)
            }
        };
        match http::request(addr, "POST", &path, &[], body.as_bytes()).await {
            Ok(resp) if resp.status() == 200 => {
                let reply = resp.json()?;
                let events = reply["events"]["prices"].as_u64().unwrap_or(0);
                ensure!(
                    events == TICKS as u64 || (retry && events == 0),
                    "{}: {TICKS} events expected (or 0 for a retry already logged): {reply}",
                    producer.runtime
                );
                ensure!(
                    reply["gaps"] == serde_json::json!([]) && reply["durability"] == "fsync",
                    "{}: {reply}",
                    producer.runtime
                );
                producer.acked = last_seq;
            }
            Ok(resp) => bail!(
                "{}: ingest answered {} {}",
                producer.runtime,
                resp.status(),
                resp.text()
            ),
            Err(_) => {
                producer.unanswered = Some((body, last_seq));
                break;
            }
        }
    }
    Ok(producer)
}

/// Reads `count` events from `stream`: updates at offsets `after + 1 ..`, in `epoch`; returns
/// their (symbol, seq).
async fn read_updates(
    stream: &mut EventStream,
    after: u64,
    count: u64,
    epoch: &str,
) -> anyhow::Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    for offset in after + 1..=after + count {
        let event = stream.next_event().await?;
        ensure!(
            event.event == "update",
            "update at offset {offset} expected, got {event:?}"
        );
        let cursor = expect::cursor_of(&event)?;
        ensure!(
            cursor.offset().get() == offset && cursor.epoch().to_string() == epoch,
            "{epoch}-{offset} expected, got {event:?}"
        );
        let data = event.json()?;
        let symbol = data["key"]
            .as_str()
            .with_context(|| format!("no key: {event:?}"))?
            .to_owned();
        out.push((symbol, event_seq(&data)?));
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_of_kill_nine_under_concurrent_producers_lose_nothing_acknowledged(
) -> anyhow::Result<()> {
    // Periodic snapshots every second and small segments, so restarts replay the log on top of
    // a snapshot, and old segments get deleted along the way.
    let mut config =
        String::from("[server]\nsnapshot_interval = \"1s\"\n\n[log]\nsegment_bytes = 4096\n\n");
    for i in 0..PRODUCERS {
        config.push_str(&format!(
            "[[runtime]]\nname = \"p{i}\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n\n"
        ));
    }
    let (mut server, _config) = start_with(&config).await?;
    let (epoch, start) = head(&server, "prices").await?;
    ensure!(start == 0, "an empty tape at first");

    let mut producers: Vec<Producer> = (0..PRODUCERS)
        .map(|i| {
            let (a, b) = (format!("P{i}A"), format!("P{i}B"));
            Producer {
                runtime: format!("p{i}"),
                feed: Feed::new(&[a.as_str(), b.as_str()]),
                acked: 0,
                unanswered: None,
            }
        })
        .collect();
    // Every event read so far, in offset order: (symbol, seq).
    let mut seen: Vec<(String, u64)> = Vec::new();

    for round in 0..ROUNDS {
        let addr = server.addr();
        let mut tasks = Vec::new();
        for (i, producer) in producers.drain(..).enumerate() {
            let max = if i == 0 { LEAD_BATCHES } else { MAX_BATCHES };
            tasks.push(tokio::spawn(produce_until_killed(addr, producer, max)));
        }
        let mut tasks = tasks.into_iter();
        let lead = tasks.next().context("no producer")?.await??;
        // Right after the lead's last 200, with the others in flight.
        server.kill9().await?;
        producers.push(lead);
        for task in tasks {
            producers.push(task.await??);
        }
        ensure!(
            producers[0].unanswered.is_none() && producers[0].acked > 0,
            "round {round}: the lead producer was acknowledged: {:?}",
            producers[0]
        );

        server.restart().await?;
        let (now_epoch, now) = head(&server, "prices").await?;
        ensure!(
            now_epoch == epoch,
            "round {round}: the epoch survives kill -9: {now_epoch} vs {epoch}"
        );
        let before = seen.len() as u64;
        ensure!(
            now >= before,
            "round {round}: the tape shrank from {before} to {now}"
        );
        // Resume where the last round's reading ended: no reset, offsets dense.
        let mut stream = if before == 0 {
            server.sse("/views/prices/events?from=tape", &[]).await?
        } else {
            let cursor = format!("{epoch}-{before}");
            server
                .sse("/views/prices/events", &[("Last-Event-ID", &cursor)])
                .await?
        };
        seen.extend(read_updates(&mut stream, before, now - before, &epoch).await?);
        stream.expect_silence(Duration::from_millis(200)).await?;

        // Per producer: its seqs in offset order are exactly 1, 2, …, m — every acknowledged
        // one, nothing twice, nothing it did not send.
        for (i, producer) in producers.iter().enumerate() {
            let prefix = format!("P{i}");
            let seqs: Vec<u64> = seen
                .iter()
                .filter(|(symbol, _)| symbol.starts_with(&prefix))
                .map(|(symbol, seq)| {
                    ensure!(
                        symbol == producer.feed.symbol_of(*seq),
                        "round {round}: {symbol} with seq {seq}"
                    );
                    Ok(*seq)
                })
                .collect::<anyhow::Result<_>>()?;
            let m = seqs.len() as u64;
            ensure!(
                seqs.iter().copied().eq(1..=m),
                "round {round}: {} seqs are not 1..={m}: {seqs:?}",
                producer.runtime
            );
            ensure!(
                m >= producer.acked && m <= producer.sent(),
                "round {round}: {}: {m} on the tape, {} acknowledged, {} sent",
                producer.runtime,
                producer.acked,
                producer.sent()
            );
        }
    }

    // The whole tape once more, from the start, and the state it adds up to.
    let tape = expect::tape(&server, "prices", seen.len()).await?;
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for (i, event) in tape.iter().enumerate() {
        let (symbol, seq) = &seen[i];
        expect::update(event, i as u64 + 1, symbol, *seq)?;
        last.insert(symbol.clone(), *seq);
    }
    let view = server.get("/views/prices").await?.json()?;
    let entries = view["entries"]
        .as_object()
        .with_context(|| format!("{view}"))?;
    ensure!(entries.len() == last.len(), "{view}");
    for (symbol, seq) in &last {
        ensure!(entries[symbol]["seq"] == *seq, "{symbol} at {seq}: {view}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn os_durability_is_named_in_the_receipt_and_survives_a_process_crash() -> anyhow::Result<()>
{
    let (mut server, _config) =
        start_with(&demo_config("builtin:ticker", "fsync = \"os\"")).await?;
    let mut feed = Feed::new(&["ACME"]);
    for _ in 0..3 {
        let reply = server.ingest_ok(&feed.batch(2)).await?;
        ensure!(
            reply["durability"] == "os" && reply["events"]["prices"] == 2,
            "{reply}"
        );
    }
    let last = expect::cursor_of(&expect::tape(&server, "prices", 6).await?[5])?;
    // The machine did not go down (same boot id): the OS has every byte.
    server.kill9().await?;
    server.restart().await?;
    let mut resumed = expect::resumes(&server, "prices", &last).await?;
    server.ingest_ok(&feed.batch(1)).await?;
    let next = expect::update(&resumed.next_event().await?, 7, "ACME", 7)?;
    ensure!(next.epoch() == last.epoch(), "{next} vs {last}");
    Ok(())
}

/// With `fsync = "os"`, a restart of the machine may have lost the unsynced tail: the server
/// cannot tell, so it keeps what the log still proves and takes a fresh epoch. (The test stands
/// in for a reboot by changing the boot id the server noted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn os_durability_after_a_machine_restart_fails_closed() -> anyhow::Result<()> {
    let (mut server, _config) =
        start_with(&demo_config("builtin:ticker", "fsync = \"os\"")).await?;
    let mut feed = Feed::new(&["ACME"]);
    for _ in 0..3 {
        server.ingest_ok(&feed.batch(2)).await?;
    }
    let last = expect::cursor_of(&expect::tape(&server, "prices", 6).await?[5])?;
    server.kill9().await?;
    let noted = log_dir(&server).join("unsynced-boot-id");
    ensure!(noted.exists(), "an os-mode life notes its boot id");
    std::fs::write(&noted, "00000000-another-boot\n")?;
    server.restart().await?;
    let (mut stream, synced) = failed_closed(&server, "boot", &last).await?;
    // Everything the log still holds was replayed: the state is whole.
    let view = server.get("/views/prices").await?.json()?;
    ensure!(view["entries"]["ACME"]["seq"] == 6, "{view}");
    server.ingest_ok(&feed.batch(1)).await?;
    let next = expect::update(
        &stream.next_event().await?,
        synced.offset().get() + 1,
        "ACME",
        7,
    )?;
    ensure!(next.epoch() == synced.epoch());
    // The boot id now noted is this machine's: the next crash keeps the new epoch.
    server.kill9().await?;
    server.restart().await?;
    let (epoch, _) = head(&server, "prices").await?;
    ensure!(
        epoch == synced.epoch().to_string(),
        "{epoch} vs {}",
        synced.epoch()
    );
    Ok(())
}

/// A log write that fails (here: past the file size limit) is never acknowledged and nothing of
/// it is served; the log is reopened on its own — the partial write cut, what is left verified —
/// and ingest resumes; a restart then finds exactly the acknowledged batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_log_write_is_never_acknowledged_and_the_log_reopens() -> anyhow::Result<()> {
    let (mut server, _config) = start_with(&demo_config("builtin:ticker", "")).await?;
    let mut feed = Feed::new(&["ACME"]);
    let before = receipt(&server.ingest_ok(&feed.batch(2)).await?, 2)?;
    let (_, bytes) = newest_segment(&server)?;
    let mut stream = server.sse("/views/prices/events?from=tape", &[]).await?;
    for offset in 1..=2 {
        expect::update(&stream.next_event().await?, offset, "ACME", offset)?;
    }

    // The next write cannot complete: refused with 503, nothing served.
    limit_file_size(&server, Some(bytes.len() as u64 + 10))?;
    let refused = server.ingest("demo", &feed.batch(2)).await?;
    ensure!(
        refused.status() == 503 && refused.header("retry-after").is_some(),
        "{} {}",
        refused.status(),
        refused.text()
    );
    ensure!(refused.text().contains("log"), "{}", refused.text());
    stream.expect_silence(Duration::from_millis(300)).await?;

    // Once the disk takes writes again, the log reopens by itself and ingest resumes; the
    // refused ticks are sent again.
    limit_file_size(&server, None)?;
    feed.set_next_seq(3);
    let deadline = Instant::now() + Duration::from_secs(15);
    let resumed = loop {
        let reply = server.ingest("demo", &feed.batch(2)).await?;
        if reply.status() == 200 {
            break reply.json()?;
        }
        ensure!(
            reply.status() == 503 && Instant::now() < deadline,
            "{} {}\n{}",
            reply.status(),
            reply.text(),
            server.logs()
        );
        feed.set_next_seq(3);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let position = receipt(&resumed, 2)?;
    ensure!(
        position == before + 1,
        "the failed write's position is reused: {position} after {before}"
    );
    for offset in 3..=4 {
        expect::update(&stream.next_event().await?, offset, "ACME", offset)?;
    }
    ensure!(server.logs().contains("log reopened"), "{}", server.logs());

    // The log holds exactly what was acknowledged: a crash and restart bring back 1..=4.
    let (code, out) = inspect(&log_dir(&server)).await?;
    ensure!(code == 0, "{out}");
    server.kill9().await?;
    server.restart().await?;
    let tape = expect::tape(&server, "prices", 4).await?;
    for (i, event) in tape.iter().enumerate() {
        let offset = i as u64 + 1;
        expect::update(event, offset, "ACME", offset)?;
    }
    ensure!(!says_fresh_epoch(&server), "{}", server.logs());
    Ok(())
}

/// Segments that no kept snapshot needs are deleted after a snapshot; the ones a kept snapshot
/// still needs stay, so a restart from the oldest kept snapshot could still replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_no_kept_snapshot_needs_are_deleted() -> anyhow::Result<()> {
    let token = "segments-token";
    let config = config_file(
        "[server]\nsnapshot_interval = \"0s\"\nkeep_snapshots = 1\n\n[log]\nsegment_bytes = \"4KiB\"\n\n\
         [[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n",
    )?;
    let path = config.path().display().to_string();
    let mut server = Server::start_with_env(
        &["--config", &path],
        &[(viewtape_tests::server::ADMIN_TOKEN_ENV, token)],
    )
    .await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    for _ in 0..60 {
        receipt(&server.ingest_ok(&feed.batch(10)).await?, 10)?;
    }
    let before = segments(&log_dir(&server))?;
    ensure!(before.len() >= 4, "several segments: {before:?}");
    let snapshot = |server: &Server| {
        let addr = server.addr();
        async move {
            let auth = format!("Bearer {token}");
            let resp = http::request(
                addr,
                "POST",
                "/admin/snapshot",
                &[("Authorization", &auth)],
                b"",
            )
            .await?;
            ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
            anyhow::Ok(())
        }
    };
    // keep_snapshots = 1 and no exact snapshot yet: a snapshot leaves only itself kept, so the
    // segments wholly before its position can go (the newest segment always stays).
    snapshot(&server).await?;
    let after = segments(&log_dir(&server))?;
    ensure!(
        after.len() < before.len() && after.len() <= 2,
        "deleted what no snapshot needs: {before:?} -> {after:?}"
    );
    ensure!(
        server.metric("viewtape_log_segments").await? == after.len() as f64,
        "the metric follows"
    );
    // Nothing needed went: a crash and restart replays from the kept snapshot, same epoch.
    let (epoch, offset) = head(&server, "prices").await?;
    server.ingest_ok(&feed.batch(2)).await?;
    server.kill9().await?;
    server.restart().await?;
    let (epoch_after, offset_after) = head(&server, "prices").await?;
    ensure!(
        epoch_after == epoch && offset_after == offset + 2,
        "{epoch}-{offset} then {epoch_after}-{offset_after}"
    );
    ensure!(!says_fresh_epoch(&server), "{}", server.logs());
    Ok(())
}

/// Polls `GET /views/prices` until its head reaches `offset` (10 s at most).
async fn wait_for_offset(server: &Server, offset: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, at) = head(server, "prices").await?;
        if at >= offset {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "offset {offset} never came: at {at}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A file source's position is part of every logged batch: after `kill -9` the restarted
/// server follows the file from where the replayed history left it — every line published once,
/// none twice, in the same epoch. (The `misbehave` guest publishes whatever a line says, so a
/// line read twice would show twice.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_file_is_read_once_across_kill_nine() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("commands.txt");
    let lines = |from: u64, to: u64| -> String {
        (from..=to)
            .map(|n| format!("publish prices k{n} {n}\n"))
            .collect()
    };
    std::fs::write(&file, lines(1, 5))?;
    let config = config_file(&format!(
        "[server]\nsnapshot_interval = \"0s\"\n\n[[runtime]]\nname = \"demo\"\n\
         wasm = {:?}\nviews = [\"prices\"]\n[runtime.source]\nfile = {:?}\n",
        guest_wasm("misbehave").display().to_string(),
        file.display().to_string()
    ))?;
    let path = config.path().display().to_string();
    let mut server = Server::start(&["--config", &path]).await?;
    wait_for_offset(&server, 5).await?;
    let (epoch, _) = head(&server, "prices").await?;
    server.kill9().await?;
    std::fs::OpenOptions::new()
        .append(true)
        .open(&file)
        .and_then(|mut f| std::io::Write::write_all(&mut f, lines(6, 10).as_bytes()))?;
    server.restart().await?;
    wait_for_offset(&server, 10).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (epoch_after, offset) = head(&server, "prices").await?;
    ensure!(
        epoch_after == epoch && offset == 10,
        "{epoch}: every line once, in the same epoch: {epoch_after}-{offset}"
    );
    for (i, event) in expect::tape(&server, "prices", 10)
        .await?
        .iter()
        .enumerate()
    {
        let n = i + 1;
        ensure!(
            event.data == format!("{{\"key\":\"k{n}\",\"value\":{n}}}"),
            "line {n}: {event:?}"
        );
    }
    Ok(())
}
