//! The replay→live seam: clients connect with cursors while a publisher runs; each one's
//! offsets are exactly contiguous from its cursor to the last event, with no duplicate and no
//! loss. A slow consumer that does not read costs a fast one nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use tokio::sync::watch;
use viewtape_tests::{cursor_offset, expect, feed::event_seq, EventStream, Feed, Server};

/// Publishing runs this long, in small batches.
const PUBLISH_FOR: Duration = Duration::from_secs(3);
/// At most this many batches (bounds the loop independently of time).
const MAX_BATCHES: u64 = 2_000;
const CLIENTS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_connecting_while_publishing_see_no_dup_and_no_loss() -> anyhow::Result<()> {
    let server = Arc::new(Server::start(&[]).await?);
    let mut feed = Feed::new(&["ACME", "BOLT", "CORE"]);
    server.ingest_ok(&feed.batch(10)).await?;

    // A tracker follows the tape, checks it, and shares the latest cursor it saw; once the
    // publisher is done and it has everything, it announces the last offset.
    let mut tracker_stream = server.sse("/views/prices/events?from=tape", &[]).await?;
    let (latest_tx, latest_rx) = watch::channel(String::new());
    let (published_tx, mut published_rx) = watch::channel(0u64);
    let (last_tx, last_rx) = watch::channel(0u64);

    let publisher = {
        let server = Arc::clone(&server);
        tokio::spawn(async move {
            let start = Instant::now();
            let mut batches = 0u64;
            while start.elapsed() < PUBLISH_FOR && batches < MAX_BATCHES {
                let n = 1 + (batches % 5) as usize;
                server.ingest_ok(&feed.batch(n)).await?;
                batches += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let last = feed.next_seq() - 1;
            let _ = published_tx.send(last);
            anyhow::Ok(last)
        })
    };
    let tracker = tokio::spawn(async move {
        track(&mut tracker_stream, latest_tx, &mut published_rx, last_tx).await
    });

    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        tokio::time::sleep(PUBLISH_FOR / (CLIENTS as u32 + 1)).await;
        let server = Arc::clone(&server);
        let cursor = latest_rx.borrow().clone();
        let mut last_rx = last_rx.clone();
        clients.push(tokio::spawn(async move {
            let (mut stream, after) = if i % 4 == 3 {
                // No cursor: state, synced at C, then contiguous after C.
                let mut stream = server.sse("/views/prices/events", &[]).await?;
                let (_, synced) = stream.until_synced(100).await?;
                let after = cursor_offset(synced.id.as_deref().unwrap_or(""))?;
                (stream, after)
            } else if i % 2 == 0 {
                let stream = server
                    .sse("/views/prices/events", &[("Last-Event-ID", &cursor)])
                    .await?;
                (stream, cursor_offset(&cursor)?)
            } else {
                let stream = server
                    .sse(&format!("/views/prices/events?cursor={cursor}"), &[])
                    .await?;
                (stream, cursor_offset(&cursor)?)
            };
            let last = wait_last(&mut last_rx).await?;
            expect::contiguous(&mut stream, after, last).await?;
            stream.expect_silence(Duration::from_millis(200)).await?;
            anyhow::Ok(())
        }));
    }

    let last = publisher.await.context("publisher task")??;
    ensure!(last > 50, "the publisher published only {last} events");
    tracker.await.context("tracker task")??;
    for (i, client) in clients.into_iter().enumerate() {
        client
            .await
            .context("client task")?
            .with_context(|| format!("client {i}"))?;
    }
    Ok(())
}

/// Waits until the tracker announces the last offset.
async fn wait_last(last: &mut watch::Receiver<u64>) -> anyhow::Result<u64> {
    let deadline = Instant::now() + PUBLISH_FOR + Duration::from_secs(30);
    loop {
        let value = *last.borrow_and_update();
        if value != 0 {
            return Ok(value);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("the publisher did not finish in time");
        }
        tokio::time::timeout(left, last.changed())
            .await
            .context("waiting for the publisher")??;
    }
}

/// The tracker loop (offsets equal seqs here: every tick is published once, from offset 1).
async fn track(
    stream: &mut EventStream,
    latest: watch::Sender<String>,
    published: &mut watch::Receiver<u64>,
    last_tx: watch::Sender<u64>,
) -> anyhow::Result<()> {
    let mut expected = 1u64;
    let deadline = Instant::now() + PUBLISH_FOR + Duration::from_secs(30);
    loop {
        let last = *published.borrow_and_update();
        if last != 0 && expected > last {
            let _ = last_tx.send(last);
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "tracker ran out of time at {expected}"
        );
        let event = tokio::select! {
            event = stream.next_event() => event?,
            // Once the last seq is known the sender is gone: stop watching it.
            changed = published.changed(), if last == 0 => {
                changed?;
                continue;
            }
        };
        let cursor = expect::cursor_of(&event)?;
        ensure!(
            cursor.offset().get() == expected,
            "tracker: expected {expected}, got {event:?}"
        );
        ensure!(event_seq(&event.json()?)? == expected, "{event:?}");
        expected += 1;
        let _ = latest.send(cursor.to_string());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_does_not_stall_a_fast_one() -> anyhow::Result<()> {
    const BATCHES: u64 = 40;
    const PER_BATCH: usize = 1_000;
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT", "CORE", "DASH"]);
    server.ingest_ok(&feed.batch(1)).await?;

    // Connected, then never read until the end: its socket buffers fill up.
    let mut slow = EventStream::connect_with_recv_buffer(
        server.addr(),
        "/views/prices/events?from=tape",
        &[],
        4096,
    )
    .await?;
    let mut fast = server.sse("/views/prices/events?from=tape", &[]).await?;
    expect::update(&fast.next_event().await?, 1, "ACME", 1)?;

    let started = Instant::now();
    let total = 1 + BATCHES * PER_BATCH as u64;
    let reader = tokio::spawn(async move {
        expect::contiguous(&mut fast, 1, total).await?;
        anyhow::Ok(started.elapsed())
    });
    for _ in 0..BATCHES {
        server.ingest_ok(&feed.batch(PER_BATCH)).await?;
    }
    let took = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .context("the fast consumer stalled behind the slow one")?
        .context("reader task")??;
    eprintln!("fast consumer got {total} events in {took:?} next to a stalled one");

    // The slow one fell behind on the tape (the default window holds all of it): it still
    // gets everything, in order, or, at worst, an explicit reset, never a silent skip.
    let first = slow.next_event().await?;
    if first.event == "reset" {
        return Ok(());
    }
    expect::update(&first, 1, "ACME", 1)?;
    expect::contiguous(&mut slow, 1, total).await
}
