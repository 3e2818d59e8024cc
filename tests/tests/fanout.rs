//! The fan-out pass: subscribers waiting at the head of a view's tape are parked, and after a
//! commit one pass writes the new frames to all their sockets. These tests hold it to what a
//! task per subscriber gave: every subscriber gets every event once, in order, whether it keeps
//! up, stalls in the middle of a pass, goes away while parked, or falls more than a chunk behind.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _};
use viewtape_tests::{expect, EventStream, Feed, Server};

const WRITTEN: &str = "viewtape_sse_pass_outcomes_total{outcome=\"written\"}";
const PARTIAL: &str = "viewtape_sse_pass_outcomes_total{outcome=\"partial\"}";
const FULL: &str = "viewtape_sse_pass_outcomes_total{outcome=\"full\"}";
const BEHIND: &str = "viewtape_sse_pass_outcomes_total{outcome=\"behind\"}";
/// Time a subscriber is given to read the tape, find nothing more, and park.
const SETTLE: Duration = Duration::from_millis(300);

/// `n` streams of the whole tape, each past the first event (offset 1).
async fn followers(server: &Server, n: usize) -> anyhow::Result<Vec<EventStream>> {
    let mut streams = Vec::new();
    for _ in 0..n {
        let mut stream = server.sse("/views/prices/events?from=tape", &[]).await?;
        expect::update(&stream.next_event().await?, 1, "ACME", 1)?;
        streams.push(stream);
    }
    Ok(streams)
}

/// Reads every stream through offset `last` at once; fails past `within`.
async fn all_contiguous(
    streams: Vec<EventStream>,
    after: u64,
    last: u64,
    within: Duration,
) -> anyhow::Result<Vec<EventStream>> {
    let readers: Vec<_> = streams
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                expect::contiguous(&mut stream, after, last).await?;
                anyhow::Ok(stream)
            })
        })
        .collect();
    let mut streams = Vec::new();
    for (i, reader) in readers.into_iter().enumerate() {
        let stream = tokio::time::timeout(within, reader)
            .await
            .with_context(|| format!("subscriber {i} did not get everything in time"))?
            .context("reader task")?
            .with_context(|| format!("subscriber {i}"))?;
        streams.push(stream);
    }
    Ok(streams)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stalls_mid_pass_gets_the_rest_in_order_and_holds_no_one_up(
) -> anyhow::Result<()> {
    // Batches of 50 ticks (about 7 KiB of frames: one chunk each), 6 MiB in all: far more than
    // a stalled client's socket buffers hold, so one pass finds its socket full mid-way.
    const BATCHES: u64 = 800;
    const PER_BATCH: usize = 50;
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT", "CORE", "DASH"]);
    server.ingest_ok(&feed.batch(1)).await?;
    let mut stalled = EventStream::connect_with_recv_buffer(
        server.addr(),
        "/views/prices/events?from=tape",
        &[],
        4096,
    )
    .await?;
    expect::update(&stalled.next_event().await?, 1, "ACME", 1)?;
    let others = followers(&server, 8).await?;
    tokio::time::sleep(SETTLE).await;

    let total = 1 + BATCHES * PER_BATCH as u64;
    let readers = tokio::spawn(all_contiguous(others, 1, total, Duration::from_secs(60)));
    let started = Instant::now();
    for _ in 0..BATCHES {
        server.ingest_ok(&feed.batch(PER_BATCH)).await?;
    }
    readers.await.context("readers")??;
    eprintln!(
        "8 subscribers got {total} events in {:?} beside a stalled one",
        started.elapsed()
    );
    let handed_back = server.metric(PARTIAL).await? + server.metric(FULL).await?;
    ensure!(
        handed_back >= 1.0,
        "the stalled subscriber was never handed back to its task"
    );
    ensure!(
        server.metric(WRITTEN).await? >= 8.0,
        "no pass wrote a chunk"
    );

    // The stalled client reads again: the rest of the chunk its socket did not take, then
    // everything after it.
    expect::contiguous(&mut stalled, 1, total).await?;
    stalled.expect_silence(Duration::from_millis(200)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_that_go_away_while_parked_are_let_go_at_once() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT", "CORE", "DASH"]);
    server.ingest_ok(&feed.batch(1)).await?;
    let mut streams = followers(&server, 6).await?;
    tokio::time::sleep(SETTLE).await;
    ensure!(server.metric("viewtape_sse_connections").await? == 6.0);

    // Three clients close while parked; nothing is published meanwhile.
    streams.truncate(3);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.metric("viewtape_sse_connections").await? != 3.0 {
        ensure!(
            Instant::now() < deadline,
            "closed streams were not let go without a commit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    server.ingest_ok(&feed.batch(5)).await?;
    all_contiguous(streams, 1, 6, Duration::from_secs(10)).await?;
    ensure!(
        server.metric(WRITTEN).await? >= 3.0,
        "no pass wrote a chunk"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_more_than_a_chunk_behind_catch_up_on_their_own_then_park_again(
) -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT", "CORE", "DASH"]);
    server.ingest_ok(&feed.batch(1)).await?;
    let streams = followers(&server, 4).await?;
    tokio::time::sleep(SETTLE).await;

    // One commit of 2,000 events is more than a chunk: every parked subscriber is handed back
    // and reads the tape itself.
    server.ingest_ok(&feed.batch(2_000)).await?;
    let streams = all_contiguous(streams, 1, 2_001, Duration::from_secs(30)).await?;
    ensure!(
        server.metric(BEHIND).await? >= 4.0,
        "no subscriber was handed back"
    );
    let written = server.metric(WRITTEN).await?;

    // Caught up, they park again: the next small commits go out through the pass.
    tokio::time::sleep(SETTLE).await;
    for _ in 0..3 {
        server.ingest_ok(&feed.batch(5)).await?;
    }
    all_contiguous(streams, 2_001, 2_016, Duration::from_secs(10)).await?;
    ensure!(
        server.metric(WRITTEN).await? >= written + 4.0,
        "the subscribers did not park again"
    );
    Ok(())
}
