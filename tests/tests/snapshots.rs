//! Snapshots end to end: exact snapshots across graceful restarts; with the log off, resets
//! after crashes — including the exact-then-crash sequence, where an exact snapshot must vouch
//! for one life only; fallback past a corrupted newest snapshot (the log replays what came
//! after the older one); the admin routes and their token, a live restore, and
//! `viewtape snapshot inspect|verify`.
//!
//! One file past 500 lines: one subject (snapshots end to end), each test whole.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context as _};
use viewtape_journal::Cursor;
use viewtape_tests::server::{cli, config_file, ADMIN_TOKEN_ENV};
use viewtape_tests::{expect, http, EventStream, Feed, Response, Server};

const TOKEN: &str = "test-admin-token-7f3a";

/// `POST /admin/restore` of the snapshot file `name`, with the token.
async fn restore(server: &Server, name: &str) -> anyhow::Result<Response> {
    let body = serde_json::json!({ "name": name }).to_string();
    admin(
        server,
        "POST",
        "/admin/restore",
        Some(TOKEN),
        body.as_bytes(),
    )
    .await
}

/// The snapshot files in a data directory, oldest first.
fn snapshot_files(data_dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let dir = data_dir.join("snapshots");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("read {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("snap-") && n.ends_with(".vtsnap"))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Flips one byte in the middle of `path`.
fn corrupt(path: &Path) -> anyhow::Result<Vec<u8>> {
    let mut bytes = std::fs::read(path)?;
    ensure!(
        bytes.len() > 64,
        "snapshot too small to corrupt: {}",
        bytes.len()
    );
    let at = bytes.len() / 2;
    bytes[at] ^= 0x5a;
    std::fs::write(path, &bytes)?;
    Ok(bytes)
}

/// Resumes `cursor` on `prices` and requires a reset that is not `malformed`.
async fn expect_reset(server: &Server, cursor: &Cursor) -> anyhow::Result<EventStream> {
    expect::refused(server, "prices", cursor).await
}

async fn admin(
    server: &Server,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> anyhow::Result<Response> {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("Authorization", a), ("Content-Type", "application/json")])
        .unwrap_or_default();
    http::request(server.addr(), method, path, &headers, body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_restart_keeps_a_live_cursor_valid() -> anyhow::Result<()> {
    let mut server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    // A client following live from the start.
    let mut stream = server.sse("/views/prices/events?from=tape", &[]).await?;
    server.ingest_ok(&feed.batch(4)).await?;
    let mut last = None;
    for offset in 1..=4 {
        last = Some(expect::update(
            &stream.next_event().await?,
            offset,
            feed.symbol_of(offset),
            offset,
        )?);
    }
    let last = last.context("no events")?;
    let status = server.stop_graceful().await?;
    ensure!(status.success(), "graceful stop: {status}");
    drop(stream);

    server.restart().await?;
    // The client reconnects with its last cursor: no reset, no duplicate, nothing lost.
    let mut resumed = expect::resumes(&server, "prices", &last).await?;
    server.ingest_ok(&feed.batch(3)).await?;
    for offset in 5..=7 {
        let cursor = expect::update(
            &resumed.next_event().await?,
            offset,
            feed.symbol_of(offset),
            offset,
        )?;
        ensure!(
            cursor.epoch() == last.epoch(),
            "epoch kept across a graceful restart"
        );
    }
    resumed.expect_silence(Duration::from_millis(200)).await?;
    Ok(())
}

/// A config with the log off (the snapshot-only rules) and the demo runtime; keep it alive
/// while the server may restart.
fn log_off() -> anyhow::Result<(tempfile::NamedTempFile, String)> {
    let config = config_file(
        "[log]\nenabled = false\n\n[[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n",
    )?;
    let path = config.path().display().to_string();
    Ok((config, path))
}

/// With the log off, an exact snapshot is all that vouches for an epoch across a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_snapshot_vouches_for_one_life_only() -> anyhow::Result<()> {
    // Life 1: publish, stop gracefully (the exact snapshot is written).
    let (_config, config) = log_off()?;
    let mut server = Server::start(&["--config", &config]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    server.ingest_ok(&feed.batch(3)).await?;
    let first_life = expect::cursor_of(&expect::tape(&server, "prices", 3).await?[2])?;
    ensure!(server.stop_graceful().await?.success());
    let files = snapshot_files(server.data_dir())?;
    ensure!(
        files
            .iter()
            .any(|f| f.to_string_lossy().ends_with("-exact.vtsnap")),
        "an exact snapshot after a graceful stop: {files:?}"
    );

    // Life 2: adopts the epoch (the first-life cursor resumes silently), consumes the file,
    // publishes more, and crashes.
    server.restart().await?;
    let files = snapshot_files(server.data_dir())?;
    ensure!(
        files
            .iter()
            .any(|f| f.to_string_lossy().ends_with("-consumed.vtsnap"))
            && !files
                .iter()
                .any(|f| f.to_string_lossy().ends_with("-exact.vtsnap")),
        "the exact snapshot is consumed at start: {files:?}"
    );
    let mut resumed = expect::resumes(&server, "prices", &first_life).await?;
    server.ingest_ok(&feed.batch(3)).await?;
    let mut second_life = first_life;
    for offset in 4..=6 {
        second_life = expect::update(
            &resumed.next_event().await?,
            offset,
            feed.symbol_of(offset),
            offset,
        )?;
    }
    ensure!(second_life.epoch() == first_life.epoch());
    drop(resumed);
    server.kill9().await?;

    // Life 3: the consumed snapshot loads as periodic. Neither cursor may be replayed — the
    // offsets 4..=6 of that epoch went on the wire in life 2 and are not in any snapshot.
    server.restart().await?;
    let mut stream = expect_reset(&server, &second_life).await?;
    let (_, synced) = stream.until_synced(100).await?;
    let third = expect::cursor_of(&synced)?;
    ensure!(
        third.epoch() != first_life.epoch(),
        "a fresh epoch in life 3"
    );
    expect_reset(&server, &first_life).await?;
    // The guest's state came from the consumed snapshot (seq 3): new offsets carry the new
    // epoch, so the same offset numbers as life 2 never mean two things.
    feed.set_next_seq(4);
    server.ingest_ok(&feed.batch(1)).await?;
    let next = stream.next_event().await?;
    let cursor = expect::update(&next, third.offset().get() + 1, feed.symbol_of(4), 4)?;
    ensure!(cursor.epoch() == third.epoch() && cursor.epoch() != second_life.epoch());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_newest_snapshot_falls_back_and_is_kept() -> anyhow::Result<()> {
    let mut server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME"]);
    server.ingest_ok(&feed.batch(2)).await?;
    ensure!(server.stop_graceful().await?.success());
    server.restart().await?;
    server.ingest_ok(&feed.batch(2)).await?;
    let before = server.get("/views/prices").await?.json()?;
    ensure!(server.stop_graceful().await?.success());
    let files = snapshot_files(server.data_dir())?;
    ensure!(files.len() >= 2, "two snapshots: {files:?}");
    let newest = files.last().context("no snapshot")?.clone();
    let corrupted = corrupt(&newest)?;

    server.restart().await?;
    // Started from the older one, and the log replayed what came after it: nothing is lost,
    // the view is at seq 4, in the same epoch.
    let view = server.get("/views/prices").await?.json()?;
    ensure!(
        view["entries"]["ACME"]["seq"] == 4 && view["cursor"] == before["cursor"],
        "older snapshot plus the log: {view}, before the stop: {before}"
    );
    let newest_name = newest
        .file_name()
        .and_then(|n| n.to_str())
        .context("name")?
        .to_owned();
    let logs = server.logs();
    ensure!(
        logs.contains("falling back") && logs.contains(&newest_name),
        "the fallback is logged, naming the file:\n{logs}"
    );
    // Kept for inspection, untouched.
    ensure!(
        std::fs::read(&newest)? == corrupted,
        "the corrupted file is kept as it was"
    );
    // The guest's state came back too: seq 5 is accepted without a gap.
    server.ingest_ok(&feed.batch(1)).await?;
    let view = server.get("/views/prices").await?.json()?;
    ensure!(view["entries"]["ACME"]["seq"] == 5, "{view}");

    // The CLI agrees.
    let (code, out) = cli(&["snapshot", "inspect", &newest.to_string_lossy()], &[]).await?;
    ensure!(
        code == 1,
        "inspect of a corrupted file exits 1: {code}\n{out}"
    );
    ensure!(
        out.contains("NO") && out.to_lowercase().contains("checksum"),
        "inspect names the reason:\n{out}"
    );
    let files = snapshot_files(server.data_dir())?;
    let good = files
        .iter()
        .rev()
        .find(|f| *f != &newest)
        .context("a valid snapshot")?;
    let (code, out) = cli(&["snapshot", "inspect", &good.to_string_lossy()], &[]).await?;
    ensure!(code == 0, "inspect of a good file exits 0: {code}\n{out}");
    ensure!(
        out.contains("valid:    yes")
            && out.contains("epoch:")
            && out.contains("log:      through position 0"),
        "inspect prints header, epoch and log position:\n{out}"
    );
    let dir = server.data_dir().join("snapshots");
    let (code, out) = cli(&["snapshot", "verify", &dir.to_string_lossy()], &[]).await?;
    ensure!(
        code == 1,
        "verify with a corrupted file exits 1: {code}\n{out}"
    );
    ensure!(
        out.contains("INVALID") && out.contains(&newest_name) && out.contains("valid "),
        "verify lists each file with its verdict:\n{out}"
    );
    // Without the corrupted file, verify passes.
    std::fs::remove_file(&newest)?;
    let (code, out) = cli(&["snapshot", "verify", &dir.to_string_lossy()], &[]).await?;
    ensure!(code == 0, "verify of good files exits 0: {code}\n{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_routes_are_404_without_a_configured_token() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let at_start = snapshot_files(server.data_dir())?;
    for (method, path) in [
        ("POST", "/admin/snapshot"),
        ("GET", "/admin/snapshots"),
        ("POST", "/admin/restore"),
    ] {
        for token in [None, Some(TOKEN), Some("")] {
            let resp = admin(&server, method, path, token, b"{\"name\":\"x\"}").await?;
            ensure!(
                resp.status() == 404,
                "{method} {path} with {token:?}: {} {}",
                resp.status(),
                resp.text()
            );
        }
    }
    ensure!(
        snapshot_files(server.data_dir())? == at_start,
        "nothing was written"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_token_is_required_and_checked() -> anyhow::Result<()> {
    let server = Server::start_with_env(&[], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
    let at_start = snapshot_files(server.data_dir())?;
    let wrong = format!("{TOKEN}x");
    let short = &TOKEN[..TOKEN.len() - 1];
    for (method, path) in [("POST", "/admin/snapshot"), ("GET", "/admin/snapshots")] {
        for token in [None, Some(wrong.as_str()), Some(short), Some("")] {
            let resp = admin(&server, method, path, token, b"").await?;
            ensure!(
                resp.status() == 401,
                "{method} {path} with {token:?}: {} {}",
                resp.status(),
                resp.text()
            );
            ensure!(
                resp.header("www-authenticate") == Some("Bearer"),
                "401 names the scheme"
            );
            ensure!(resp.json()?["error"] == "unauthorized");
        }
    }
    // A restore with a bad token is refused before its body is looked at.
    let resp = admin(&server, "POST", "/admin/restore", None, b"not json").await?;
    ensure!(resp.status() == 401, "{}", resp.status());
    ensure!(snapshot_files(server.data_dir())? == at_start);

    let mut feed = Feed::new(&["ACME"]);
    server.ingest_ok(&feed.batch(3)).await?;
    let resp = admin(&server, "POST", "/admin/snapshot", Some(TOKEN), b"").await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let written = resp.json()?;
    let name = written["name"].as_str().context("name")?.to_owned();
    ensure!(
        written["exact"] == false && written["records"] == 3,
        "{written}"
    );
    ensure!(written["size"].as_u64().is_some_and(|s| s > 0), "{written}");
    // An operator's snapshot was named and listed as the timer's ("periodic"): it says
    // "manual" now, wherever it is labelled.
    ensure!(name.ends_with("-manual.vtsnap"), "{name}");

    let resp = admin(&server, "GET", "/admin/snapshots", Some(TOKEN), b"").await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let listed = resp.json()?;
    let entry = listed["snapshots"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["name"] == name.as_str()))
        .with_context(|| format!("{name} listed: {listed}"))?;
    ensure!(
        entry["valid"] == true
            && entry["exact"] == false
            && entry["kind"] == "manual"
            && entry["size"] == written["size"]
            && entry["error"].is_null()
            && entry["age_seconds"]
                .as_f64()
                .is_some_and(|a| (0.0..60.0).contains(&a)),
        "{entry}"
    );
    Ok(())
}

/// Unknown query parameters and body fields on the admin routes were accepted and ignored:
/// each is a `400` naming it now, after the token is checked, and nothing is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_routes_refuse_what_they_do_not_take_naming_it() -> anyhow::Result<()> {
    let server = Server::start_with_env(&[], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
    let at_start = snapshot_files(server.data_dir())?;
    for (method, path, body, named) in [
        ("POST", "/admin/snapshot?kind=exact", &b""[..], "\"kind\""),
        (
            "POST",
            "/admin/snapshot",
            b"{\"label\":\"before upgrade\"}",
            "\"label\"",
        ),
        (
            "POST",
            "/admin/snapshot",
            b"not json",
            "expected a JSON body",
        ),
        ("GET", "/admin/snapshots?verbose=1", b"", "\"verbose\""),
        ("GET", "/admin/runtimes?name=demo", b"", "\"name\""),
        ("GET", "/admin/?x=1", b"", "\"x\""),
        (
            "POST",
            "/admin/restore",
            b"{\"name\":\"snap-x.vtsnap\",\"force\":true}",
            "\"force\"",
        ),
        (
            "POST",
            "/admin/restore",
            b"{\"nam\":\"snap-x.vtsnap\"}",
            "\"nam\"",
        ),
        ("POST", "/admin/restore", b"[]", "expected a JSON body"),
        // A body of blank lines is a body, and not JSON: not the empty body a snapshot takes.
        ("POST", "/admin/snapshot", b"\r\n", "expected a JSON body"),
        (
            "POST",
            "/admin/restore?dry_run=1",
            b"{\"name\":\"x\"}",
            "\"dry_run\"",
        ),
        (
            "PUT",
            "/admin/runtimes/demo/module?force=1",
            b"\0asm",
            "\"force\"",
        ),
    ] {
        let resp = admin(&server, method, path, Some(TOKEN), body).await?;
        let error = expect::json_error(&resp, 400).with_context(|| format!("{method} {path}"))?;
        let message = error["message"].as_str().unwrap_or_default();
        ensure!(message.contains(named), "{method} {path}: {message}");
        ensure!(
            http::error_body_problem(&resp.text()).is_none(),
            "{method} {path}: {message}"
        );
    }
    // The token first: without it, a 401 whatever the query.
    let resp = admin(&server, "POST", "/admin/snapshot?kind=exact", None, b"").await?;
    ensure!(resp.status() == 401, "{} {}", resp.status(), resp.text());
    ensure!(
        snapshot_files(server.data_dir())? == at_start,
        "nothing was written"
    );
    // An empty body and `{}` are what a snapshot takes.
    for body in [&b""[..], b"{}", b" { } "] {
        let resp = admin(&server, "POST", "/admin/snapshot", Some(TOKEN), body).await?;
        ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_restore_resets_subscribers_to_the_restored_state() -> anyhow::Result<()> {
    let mut server = Server::start_with_env(&[], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    server.ingest_ok(&feed.batch(3)).await?;
    let resp = admin(&server, "POST", "/admin/snapshot", Some(TOKEN), b"").await?;
    ensure!(resp.status() == 200, "{}", resp.text());
    let name = resp.json()?["name"].as_str().context("name")?.to_owned();
    let at_snapshot = server.get("/views/prices").await?.json()?;

    server.ingest_ok(&feed.batch(3)).await?;
    let before = server.get("/views/prices").await?.json()?;
    ensure!(
        before["entries"] != at_snapshot["entries"],
        "state moved on"
    );

    // An invalid snapshot is refused with the reason, and nothing changes.
    let resp = admin(&server, "POST", "/admin/snapshot", Some(TOKEN), b"").await?;
    let bad = resp.json()?["name"].as_str().context("name")?.to_owned();
    corrupt(&server.data_dir().join("snapshots").join(&bad))?;
    let resp = restore(&server, &bad).await?;
    ensure!(resp.status() == 422, "{} {}", resp.status(), resp.text());
    ensure!(
        resp.text().to_lowercase().contains("checksum"),
        "the reason: {}",
        resp.text()
    );
    for missing in [
        "snap-0000000000000001-0000000001-periodic.vtsnap",
        "../etc/passwd",
    ] {
        let resp = restore(&server, missing).await?;
        ensure!(
            resp.status() == 404,
            "{missing}: {} {}",
            resp.status(),
            resp.text()
        );
    }
    let resp = admin(&server, "POST", "/admin/restore", Some(TOKEN), b"{}").await?;
    ensure!(resp.status() == 400, "{} {}", resp.status(), resp.text());
    ensure!(
        server.get("/views/prices").await?.json()? == before,
        "nothing touched"
    );

    // Two subscribers: one following live with a cursor, one from the state.
    let head = expect::cursor_of(&expect::tape(&server, "prices", 6).await?[5])?;
    let mut live = server
        .sse(
            "/views/prices/events",
            &[("Last-Event-ID", &head.to_string())],
        )
        .await?;
    let mut fresh = server.sse("/views/prices/events", &[]).await?;
    fresh.until_synced(100).await?;
    live.expect_silence(Duration::from_millis(200)).await?;

    let resp = restore(&server, &name).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let restored = resp.json()?;
    ensure!(
        restored["epoch"] != head.epoch().to_string().as_str(),
        "fresh epoch: {restored}"
    );

    for stream in [&mut live, &mut fresh] {
        let event = stream.next_event().await?;
        ensure!(
            event.event == "reset",
            "every subscriber is reset: {event:?}"
        );
        let (states, synced) = stream.until_synced(100).await?;
        ensure!(states.len() == 2, "two keys restored: {states:?}");
        let cursor = expect::cursor_of(&synced)?;
        ensure!(cursor.epoch().to_string() == restored["epoch"].as_str().unwrap_or_default());
    }
    let after = server.get("/views/prices").await?.json()?;
    ensure!(
        after["entries"] == at_snapshot["entries"],
        "the view equals the restored state: {after} vs {at_snapshot}"
    );
    // The old cursor fails closed.
    expect_reset(&server, &head).await?;

    // The guest's state was restored too: seq 4 is the next one it accepts.
    feed.set_next_seq(4);
    server.ingest_ok(&feed.batch(1)).await?;
    let event = live.next_event().await?;
    let synced_offset = after["cursor"]
        .as_str()
        .context("cursor")?
        .rsplit('-')
        .next()
        .and_then(|o| o.parse::<u64>().ok())
        .context("offset")?;
    expect::update(&event, synced_offset + 1, feed.symbol_of(4), 4)?;
    let view = server.get("/views/prices").await?.json()?;
    if view["entries"][feed.symbol_of(4)]["seq"] != 4 {
        bail!("seq 4 accepted after the restore: {view}");
    }

    // A crash right after: the restored history is what comes back (the restore wrote a
    // snapshot of it before any batch could commit on it), with the batch after it, same epoch.
    server.kill9().await?;
    server.restart().await?;
    let back = server.get("/views/prices").await?.json()?;
    ensure!(back == view, "after kill -9: {back} vs {view}");
    feed.set_next_seq(5);
    server.ingest_ok(&feed.batch(1)).await?;
    Ok(())
}

/// The highest tick `seq` in the demo's `prices` view.
async fn highest_seq(server: &Server) -> anyhow::Result<u64> {
    let view = server.get("/views/prices").await?.json()?;
    let entries = view["entries"].as_object().context("entries")?;
    Ok(entries
        .values()
        .filter_map(|tick| tick["seq"].as_u64())
        .max()
        .unwrap_or(0))
}

/// Waits (≤ 20 s) until the demo feed has published past `seq`.
async fn feed_passes(server: &Server, seq: u64) -> anyhow::Result<u64> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = highest_seq(server).await?;
        if now > seq {
            return Ok(now);
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "the demo feed stopped at {now}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A restore while the demo feed runs: subscribers get one reset (the restore's), then the
/// restored state, then the feed's next ticks — it continues from the restored state instead
/// of declaring the ticks the restore took back a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_under_the_demo_feed_is_the_only_reset() -> anyhow::Result<()> {
    let server =
        Server::start_with_env(&["--demo-rate", "50"], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
    feed_passes(&server, 10).await?;
    let resp = admin(&server, "POST", "/admin/snapshot", Some(TOKEN), b"").await?;
    ensure!(resp.status() == 200, "{}", resp.text());
    let name = resp.json()?["name"].as_str().context("name")?.to_owned();
    let at_snapshot = feed_passes(&server, 0).await?;
    feed_passes(&server, at_snapshot + 20).await?;

    let mut stream = server.sse("/views/prices/events", &[]).await?;
    stream.until_synced(100).await?;
    let resp = restore(&server, &name).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let reset = stream.next_except(&["update"]).await?;
    expect::reset(&reset, "stale_epoch")?;
    let (_, synced) = stream.until_synced(100).await?;
    let restored = expect::cursor_of(&synced)?;
    // The feed goes on (50 ticks/s): a second's worth of updates, and not one more reset.
    let mut updates = 0;
    while updates < 25 {
        let event = stream.next_event().await?;
        ensure!(event.event == "update", "after the restore: {event:?}");
        let cursor = expect::cursor_of(&event)?;
        ensure!(
            cursor.epoch() == restored.epoch(),
            "{cursor} after {restored}"
        );
        updates += 1;
    }
    ensure!(
        !server.logs().contains("guest reported a gap"),
        "{}",
        server.logs()
    );
    Ok(())
}

/// A restore back to an older snapshot, then forward to a newer one: meanwhile the feed used
/// the newer one's producer seqs for other ticks, which the runtime now refuses as reused or
/// stale. The feed takes up the runtime's next seq and goes on, as after any restore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_feed_goes_on_after_a_restore_back_and_then_forward() -> anyhow::Result<()> {
    let server =
        Server::start_with_env(&["--demo-rate", "50"], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
    let mut snapshots = Vec::new();
    for _ in 0..2 {
        let passed = feed_passes(&server, 0).await?;
        feed_passes(&server, passed + 20).await?;
        let resp = admin(&server, "POST", "/admin/snapshot", Some(TOKEN), b"").await?;
        ensure!(resp.status() == 200, "{}", resp.text());
        snapshots.push(resp.json()?["name"].as_str().context("name")?.to_owned());
    }
    for name in &snapshots {
        let resp = restore(&server, name).await?;
        ensure!(
            resp.status() == 200,
            "{name}: {} {}",
            resp.status(),
            resp.text()
        );
        let restored = highest_seq(&server).await?;
        feed_passes(&server, restored + 10)
            .await
            .with_context(|| format!("after the restore of {name}"))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_same_data_dir_refuses_at_once() -> anyhow::Result<()> {
    let server = Server::start(&["--demo-rate", "0"]).await?;
    let data_dir = server.data_dir().to_string_lossy().into_owned();
    let (code, out) = cli(
        &["serve", "--listen", "127.0.0.1:0", "--data-dir", &data_dir],
        &[],
    )
    .await?;
    ensure!(code != 0, "the second server started: {out}");
    ensure!(
        out.contains(&data_dir) && out.contains(&format!("pid {}", server.pid())),
        "names the dir and the holder: {out}"
    );
    ensure!(
        !out.contains("restored snapshot"),
        "touched the snapshots first: {out}"
    );
    ensure!(server.get("/healthz").await?.status() == 200);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_changes_nothing_and_names_consumed_snapshots() -> anyhow::Result<()> {
    let missing = tempfile::tempdir()?.path().join("nope");
    let (code, out) = cli(&["snapshot", "verify", &missing.to_string_lossy()], &[]).await?;
    ensure!(code != 0, "verify of a missing dir exits non-zero: {out}");
    ensure!(!missing.exists(), "verify created {}", missing.display());

    let (_config, config) = log_off()?;
    let mut server = Server::start(&["--demo-rate", "0", "--config", &config]).await?;
    server.stop_graceful().await?;
    server.restart().await?; // adopts, and so consumes, the exact snapshot
    let dir = server.data_dir().join("snapshots");
    let (code, out) = cli(&["snapshot", "verify", &dir.to_string_lossy()], &[]).await?;
    ensure!(code == 0, "{out}");
    ensure!(
        out.lines()
            .any(|l| l.contains("-consumed.vtsnap") && l.contains("valid    consumed")),
        "a consumed snapshot is labelled consumed:\n{out}"
    );
    ensure!(
        !out.contains("valid    exact"),
        "nothing is exact any more:\n{out}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_newest_snapshot_stops_the_start_instead_of_losing_it() -> anyhow::Result<()>
{
    let mut server = Server::start(&["--demo-rate", "0"]).await?;
    let mut feed = Feed::new(&["ACME"]);
    server.ingest_ok(&feed.batch(3)).await?;
    let before = server.get("/views/prices").await?.json()?;
    server.stop_graceful().await?;
    let data_dir = server.data_dir().to_path_buf();
    // Named like a newer snapshot, but unreadable (a directory: root reads any file).
    let unreadable = data_dir
        .join("snapshots")
        .join("snap-9999999999999999-9999999999-periodic.vtsnap");
    std::fs::create_dir(&unreadable)?;
    let (code, out) = cli(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &data_dir.to_string_lossy(),
        ],
        &[],
    )
    .await?;
    ensure!(code != 0, "started past an unreadable snapshot: {out}");
    ensure!(
        out.contains("9999999999-periodic.vtsnap"),
        "names the file: {out}"
    );
    // Nothing was superseded or consumed: with the obstacle gone, the exact snapshot is adopted.
    std::fs::remove_dir(&unreadable)?;
    server.restart().await?;
    let after = server.get("/views/prices").await?.json()?;
    ensure!(after == before, "{before} vs {after}");
    Ok(())
}
