//! Resuming after a cursor, state transfer, `?from=tape`, header vs query, HTTP surface.

use std::time::Duration;

use anyhow::ensure;
use viewtape_tests::{cursor_offset, expect, Feed, Server};

const QUIET: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_after_cursor_has_no_duplicate_and_no_loss() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    server.ingest_ok(&feed.batch(5)).await?;

    let mut stream = server.sse("/views/prices/events", &[]).await?;
    let (states, synced) = stream.until_synced(100).await?;
    ensure!(states.len() == 2, "two keys in the state: {states:?}");
    ensure!(cursor_offset(synced.id.as_deref().unwrap_or(""))? == 5);

    server.ingest_ok(&feed.batch(5)).await?;
    let mut last = None;
    for offset in 6..=10 {
        let event = stream.next_event().await?;
        let seq = offset;
        expect::update(&event, offset, feed.symbol_of(seq), seq)?;
        last = event.id.clone();
    }
    ensure!(stream.last_event_id() == last.as_deref());
    drop(stream);

    // Missed while disconnected.
    server.ingest_ok(&feed.batch(5)).await?;
    let last = last.unwrap_or_default();
    let mut stream = server
        .sse("/views/prices/events", &[("Last-Event-ID", &last)])
        .await?;
    for offset in 11..=15 {
        expect::update(
            &stream.next_event().await?,
            offset,
            feed.symbol_of(offset),
            offset,
        )?;
    }
    stream.expect_silence(QUIET).await?;
    // And then live.
    server.ingest_ok(&feed.batch(1)).await?;
    expect::update(&stream.next_event().await?, 16, feed.symbol_of(16), 16)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_cursor_resumes_like_the_header() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME"]);
    server.ingest_ok(&feed.batch(4)).await?;
    let tape = expect::tape(&server, "prices", 4).await?;
    let c2 = tape[1].id.clone().unwrap_or_default();
    let mut stream = server
        .sse(&format!("/views/prices/events?cursor={c2}"), &[])
        .await?;
    expect::update(&stream.next_event().await?, 3, "ACME", 3)?;
    expect::update(&stream.next_event().await?, 4, "ACME", 4)?;
    stream.expect_silence(QUIET).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_wins_over_query() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME"]);
    server.ingest_ok(&feed.batch(6)).await?;
    let tape = expect::tape(&server, "prices", 6).await?;
    let (c2, c4) = (
        tape[1].id.clone().unwrap_or_default(),
        tape[3].id.clone().unwrap_or_default(),
    );
    let mut stream = server
        .sse(
            &format!("/views/prices/events?cursor={c2}"),
            &[("Last-Event-ID", &c4)],
        )
        .await?;
    expect::update(&stream.next_event().await?, 5, "ACME", 5)?;
    expect::update(&stream.next_event().await?, 6, "ACME", 6)?;
    stream.expect_silence(QUIET).await?;

    // A valid header also wins over a malformed query cursor.
    let mut stream = server
        .sse("/views/prices/events?cursor=zzz", &[("Last-Event-ID", &c4)])
        .await?;
    expect::update(&stream.next_event().await?, 5, "ACME", 5)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_transfer_then_synced_then_live() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT", "CORE"]);
    server.ingest_ok(&feed.batch(7)).await?;

    let mut stream = server.sse("/views/prices/events", &[]).await?;
    let (states, synced) = stream.until_synced(100).await?;
    ensure!(states.len() == 3, "{states:?}");
    for state in &states {
        ensure!(state.id.is_none(), "state frames carry no id: {state:?}");
        let data = state.json()?;
        let key = data["key"].as_str().unwrap_or_default();
        // The latest tick per symbol: ACME 7, BOLT 5, CORE 6.
        let want = match key {
            "ACME" => 7,
            "BOLT" => 5,
            "CORE" => 6,
            other => anyhow::bail!("unexpected key {other}"),
        };
        ensure!(data["value"]["seq"] == want, "{data}");
    }
    let synced_id = synced.id.clone().unwrap_or_default();
    let data = synced.json()?;
    ensure!(
        data["cursor"] == synced_id.as_str(),
        "{data} vs id {synced_id}"
    );
    ensure!(data["keys"] == 3, "{data}");
    ensure!(cursor_offset(&synced_id)? == 7);

    // GET /views/prices reflects the same cursor and entries.
    let view = server.get("/views/prices").await?;
    ensure!(view.status() == 200, "{}", view.text());
    let view = view.json()?;
    ensure!(view["cursor"] == synced_id.as_str(), "{view}");
    ensure!(view["entries"]["ACME"]["seq"] == 7, "{view}");
    ensure!(
        view["entries"].as_object().map(|o| o.len()) == Some(3),
        "{view}"
    );

    server.ingest_ok(&feed.batch(1)).await?;
    expect::update(&stream.next_event().await?, 8, "BOLT", 8)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_tape_replays_the_retained_tape_then_live() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    server.ingest_ok(&feed.batch(4)).await?;
    let mut stream = server.sse("/views/prices/events?from=tape", &[]).await?;
    for offset in 1..=4 {
        expect::update(
            &stream.next_event().await?,
            offset,
            feed.symbol_of(offset),
            offset,
        )?;
    }
    stream.expect_silence(QUIET).await?;
    server.ingest_ok(&feed.batch(1)).await?;
    expect::update(&stream.next_event().await?, 5, "ACME", 5)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_view_state_is_just_synced() -> anyhow::Result<()> {
    // The embedded default declares `prices`: it streams before any event.
    let server = Server::start(&[]).await?;
    let mut stream = server.sse("/views/prices/events", &[]).await?;
    let (states, synced) = stream.until_synced(10).await?;
    ensure!(states.is_empty(), "{states:?}");
    ensure!(synced.json()?["keys"] == 0);
    let mut feed = Feed::new(&["ACME"]);
    server.ingest_ok(&feed.batch(1)).await?;
    expect::update(&stream.next_event().await?, 1, "ACME", 1)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_view_is_404_before_streaming() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    for path in [
        "/views/nosuch/events",
        "/views/nosuch/events?from=tape",
        "/views/nosuch",
    ] {
        let resp = server.get(path).await?;
        ensure!(
            resp.status() == 404,
            "{path}: {} {}",
            resp.status(),
            resp.text()
        );
        ensure!(
            !resp
                .header("content-type")
                .unwrap_or_default()
                .starts_with("text/event-stream"),
            "{path}: a 404 is not a stream"
        );
        resp.json()?;
    }
    ensure!(server.sse("/views/nosuch/events", &[]).await.is_err());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_headers_forbid_caching_and_buffering() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let stream = server.sse("/views/prices/events", &[]).await?;
    let content_type = stream.header("content-type").unwrap_or_default();
    ensure!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let cache = stream.header("cache-control").unwrap_or_default();
    ensure!(cache.contains("no-store"), "{cache}");
    ensure!(stream.header("x-accel-buffering") == Some("no"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_views_and_metrics() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME"]);
    server.ingest_ok(&feed.batch(3)).await?;
    ensure!(server.get("/healthz").await?.status() == 200);

    let views = server.get("/views").await?;
    ensure!(views.status() == 200, "{}", views.text());
    let text = views.text();
    ensure!(
        views.json()?.is_array() || views.json()?.is_object(),
        "{text}"
    );
    ensure!(text.contains("\"prices\""), "{text}");

    let metrics = server.get("/metrics").await?;
    ensure!(metrics.status() == 200);
    ensure!(
        metrics
            .header("content-type")
            .unwrap_or_default()
            .starts_with("text/plain"),
        "{:?}",
        metrics.header("content-type")
    );
    ensure!(
        metrics.text().lines().any(|l| l.starts_with("# TYPE ")),
        "{}",
        metrics.text()
    );
    Ok(())
}

/// Every event of `stream` until the server ends it (within a few seconds); fails when it does
/// not end.
async fn until_end(
    stream: &mut viewtape_tests::EventStream,
) -> anyhow::Result<Vec<viewtape_tests::SseEvent>> {
    let mut events = Vec::new();
    while let Some(event) = stream.next_within(Duration::from_secs(5)).await? {
        events.push(event);
    }
    ensure!(stream.is_closed(), "the stream did not end");
    Ok(events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_head_ends_a_stream_once_it_delivered_the_head_it_saw_at_open() -> anyhow::Result<()>
{
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    server.ingest_ok(&feed.batch(5)).await?;

    // The state: two keys, `synced`, the end.
    let mut stream = server.sse("/views/prices/events?until=head", &[]).await?;
    // Published after the stream opened: past the head it saw, so never delivered.
    server.ingest_ok(&feed.batch(2)).await?;
    let events = until_end(&mut stream).await?;
    let kinds: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    ensure!(kinds == ["state", "state", "synced"], "{kinds:?}");
    ensure!(cursor_offset(events[2].id.as_deref().unwrap_or(""))? == 5);

    // After a cursor: what follows it up to the head, then the end.
    let c5 = events[2].id.clone().unwrap_or_default();
    let mut stream = server
        .sse("/views/prices/events?until=head", &[("Last-Event-ID", &c5)])
        .await?;
    server.ingest_ok(&feed.batch(1)).await?;
    let events = until_end(&mut stream).await?;
    ensure!(events.len() == 2, "offsets 6 and 7: {events:?}");
    for (event, offset) in events.iter().zip(6..) {
        expect::update(event, offset, feed.symbol_of(offset), offset)?;
    }

    // The whole tape.
    let mut stream = server
        .sse("/views/prices/events?from=tape&until=head", &[])
        .await?;
    let events = until_end(&mut stream).await?;
    ensure!(events.len() == 8, "offsets 1 to 8: {events:?}");

    // Already at the head: nothing, then the end.
    let c8 = events[7].id.clone().unwrap_or_default();
    let mut stream = server
        .sse(&format!("/views/prices/events?until=head&cursor={c8}"), &[])
        .await?;
    ensure!(until_end(&mut stream).await?.is_empty());

    let refused = server.get("/views/prices/events?until=tomorrow").await?;
    expect::json_error(&refused, 400)?;
    Ok(())
}
