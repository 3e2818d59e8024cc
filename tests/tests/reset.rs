//! Every cursor the server cannot honour gets `event: reset` (reason + window), then the
//! view's state, then live events. Never a silent skip, never a hang.

use std::io::Write as _;
use std::time::Duration;

use anyhow::ensure;
use viewtape_journal::{Cursor, JournalEpoch, ViewOffset};
use viewtape_tests::{cursor_offset, expect, parse_cursor, EventStream, Feed, Server};

/// After the reset: the state (one entry per symbol), `synced` at the head, then live.
async fn heals(
    server: &Server,
    stream: &mut EventStream,
    feed: &mut Feed,
    keys: usize,
    head: u64,
) -> anyhow::Result<()> {
    let (states, synced) = stream.until_synced(1000).await?;
    ensure!(states.len() == keys, "{} states, want {keys}", states.len());
    ensure!(
        cursor_offset(synced.id.as_deref().unwrap_or(""))? == head,
        "{synced:?}"
    );
    let seq = feed.next_seq();
    server.ingest_ok(&feed.batch(1)).await?;
    expect::update(
        &stream.next_event().await?,
        head + 1,
        feed.symbol_of(seq),
        seq,
    )?;
    Ok(())
}

async fn five_events(server: &Server, feed: &mut Feed) -> anyhow::Result<Cursor> {
    server.ingest_ok(&feed.batch(5)).await?;
    let tape = expect::tape(server, "prices", 5).await?;
    expect::cursor_of(&tape[4])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_cursor_resets() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    let head = five_events(&server, &mut feed).await?;
    for bad in [
        "zzz",
        "00f3a9c1d2e4b5a6-",
        "00F3A9C1D2E4B5A6-1",
        "00f3a9c1d2e4b5a6-01",
    ] {
        let mut stream = server
            .sse(&format!("/views/prices/events?cursor={bad}"), &[])
            .await?;
        let data = expect::reset(&stream.next_event().await?, "malformed")?;
        ensure!(data["epoch"] == head.epoch().to_string().as_str(), "{data}");
        ensure!(data["next"] == 6, "{data}");
        let (states, _) = stream.until_synced(100).await?;
        ensure!(states.len() == 2);
    }
    // The same through the header.
    let mut stream = server
        .sse("/views/prices/events", &[("Last-Event-ID", "not-a-cursor")])
        .await?;
    expect::reset(&stream.next_event().await?, "malformed")?;
    heals(&server, &mut stream, &mut feed, 2, 5).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_from_another_epoch_resets() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    let head = five_events(&server, &mut feed).await?;
    let other = Cursor::new(
        JournalEpoch::random_other_than(head.epoch()),
        ViewOffset::new(3),
    );
    let mut stream = server
        .sse(
            "/views/prices/events",
            &[("Last-Event-ID", &other.to_string())],
        )
        .await?;
    let data = expect::reset(&stream.next_event().await?, "stale_epoch")?;
    ensure!(data["epoch"] == head.epoch().to_string().as_str(), "{data}");
    ensure!(data["first"] == 1 && data["next"] == 6, "{data}");
    heals(&server, &mut stream, &mut feed, 2, 5).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_ahead_of_the_head_resets() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    let head = five_events(&server, &mut feed).await?;
    let ahead = Cursor::new(head.epoch(), ViewOffset::new(6));
    let mut stream = server
        .sse(&format!("/views/prices/events?cursor={ahead}"), &[])
        .await?;
    let data = expect::reset(&stream.next_event().await?, "ahead")?;
    ensure!(data["next"] == 6, "{data}");
    heals(&server, &mut stream, &mut feed, 2, 5).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_before_the_window_resets_as_expired() -> anyhow::Result<()> {
    let mut config = tempfile::NamedTempFile::new()?;
    write!(
        config,
        r#"
[journal]
max_age = "1h"
max_records_per_view = 5
max_bytes_per_view = "64MiB"

[[runtime]]
name = "demo"
wasm = "builtin:ticker"
views = ["prices"]
"#
    )?;
    let path = config.path().display().to_string();
    let server = Server::start(&["--config", &path]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT", "CORE"]);
    server.ingest_ok(&feed.batch(20)).await?;

    // The tape keeps the last 5 records: offsets 16..=20.
    let tape = expect::tape(&server, "prices", 5).await?;
    let first = expect::cursor_of(&tape[0])?;
    ensure!(first.offset().get() == 16, "window starts at 16: {tape:?}");
    let mut replay = server.sse("/views/prices/events?from=tape", &[]).await?;
    for _ in 0..5 {
        replay.next_event().await?;
    }
    replay.expect_silence(Duration::from_millis(300)).await?;

    let stale = Cursor::new(first.epoch(), ViewOffset::new(2));
    let mut stream = server
        .sse(
            "/views/prices/events",
            &[("Last-Event-ID", &stale.to_string())],
        )
        .await?;
    let data = expect::reset(&stream.next_event().await?, "expired")?;
    ensure!(data["first"] == 16 && data["next"] == 21, "{data}");
    heals(&server, &mut stream, &mut feed, 3, 20).await?;

    // `heals` published offset 21, so the window is now 17..=21: a cursor at 16 (the last
    // pruned offset) still resumes whole, one at 15 does not.
    let edge = Cursor::new(first.epoch(), ViewOffset::new(16));
    let mut stream = server
        .sse(
            "/views/prices/events",
            &[("Last-Event-ID", &edge.to_string())],
        )
        .await?;
    let event = stream.next_event().await?;
    ensure!(
        event.event == "update",
        "cursor 16 with window 17..=21: {event:?}"
    );
    ensure!(
        parse_cursor(event.id.as_deref().unwrap_or(""))?
            .offset()
            .get()
            == 17
    );
    let below = Cursor::new(first.epoch(), ViewOffset::new(15));
    let mut stream = server
        .sse(
            "/views/prices/events",
            &[("Last-Event-ID", &below.to_string())],
        )
        .await?;
    expect::reset(&stream.next_event().await?, "expired")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_across_a_gap_resets() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    server.ingest_ok(&feed.batch(3)).await?;
    let tape = expect::tape(&server, "prices", 3).await?;
    let before_gap = expect::cursor_of(&tape[2])?;

    // seq 4..=8 never arrive: the ticker reports a gap.
    feed.skip(5);
    server.ingest_ok(&feed.batch(2)).await?;
    let mut stream = server
        .sse(
            "/views/prices/events",
            &[("Last-Event-ID", &before_gap.to_string())],
        )
        .await?;
    expect::reset(&stream.next_event().await?, "gap")?;
    let (states, synced) = stream.until_synced(100).await?;
    ensure!(states.len() == 2);
    let after_gap = synced.id.clone().unwrap_or_default();
    // The head is past the two new ticks (offsets 4, 5), plus whatever the gap itself took.
    let head = cursor_offset(&after_gap)?;
    ensure!(head >= 5, "{synced:?}");

    // A cursor issued after the gap resumes normally.
    let mut resumed = server
        .sse("/views/prices/events", &[("Last-Event-ID", &after_gap)])
        .await?;
    resumed.expect_silence(Duration::from_millis(300)).await?;
    let seq = feed.next_seq();
    server.ingest_ok(&feed.batch(1)).await?;
    expect::update(
        &resumed.next_event().await?,
        head + 1,
        feed.symbol_of(seq),
        seq,
    )?;
    expect::update(
        &stream.next_event().await?,
        head + 1,
        feed.symbol_of(seq),
        seq,
    )?;
    Ok(())
}
