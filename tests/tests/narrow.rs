//! Narrowed streams and state reads (`?keys=`, `?prefix=`), end to end: cursors stay the view's
//! cursors, so a narrowed stream resumes exactly from a cursor a full stream gave, and a full
//! stream from one a narrowed stream gave, across `kill -9`; a narrowed client of a few keys of
//! a large view gets those keys' events and nothing else; bad narrowing is a `400`.

use std::time::Duration;

use anyhow::{ensure, Context as _};
use viewtape_tests::{expect, Feed, Server};

const SYMBOLS: [&str; 4] = ["ACME", "BOLT", "CRUX", "DYNA"];

/// The `key` of an `update` event.
fn key_of(event: &viewtape_tests::SseEvent) -> anyhow::Result<String> {
    Ok(event.json()?["key"].as_str().context("key")?.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowed_and_full_streams_resume_from_each_others_cursors_after_kill_9(
) -> anyhow::Result<()> {
    let mut server = Server::start(&[]).await?;
    let mut feed = Feed::new(&SYMBOLS);
    server.ingest_ok(&feed.batch(8)).await?;
    // A cursor a full stream gave: the 6th event (BOLT, seq 6).
    let tape = expect::tape(&server, "prices", 8).await?;
    let from_full = expect::cursor_of(&tape[5])?;
    ensure!(key_of(&tape[5])? == "BOLT");

    server.kill9().await?;
    server.restart().await?;
    server.ingest_ok(&feed.batch(8)).await?;

    // Narrowed to ACME and CRUX from the full stream's cursor: exactly their events after it
    // (seqs 7, 9, 11, 13, 15), each at its offset in the view, and no reset.
    let mut narrowed = server
        .sse(
            "/views/prices/events?keys=ACME,CRUX",
            &[("Last-Event-ID", &from_full.to_string())],
        )
        .await?;
    let mut last = from_full;
    for seq in [7, 9, 11, 13, 15] {
        last = expect::update(&narrowed.next_event().await?, seq, feed.symbol_of(seq), seq)?;
    }
    narrowed.expect_silence(Duration::from_millis(300)).await?;

    // A full stream from the narrowed stream's cursor: every event after it, all keys.
    server.kill9().await?;
    server.restart().await?;
    let mut full = server
        .sse(
            "/views/prices/events",
            &[("Last-Event-ID", &last.to_string())],
        )
        .await?;
    expect::update(&full.next_event().await?, 16, feed.symbol_of(16), 16)?;
    server.ingest_ok(&feed.batch(4)).await?;
    for seq in 17..=20 {
        expect::update(&full.next_event().await?, seq, feed.symbol_of(seq), seq)?;
    }

    // A narrowed stream from the state: only the prefix's keys, then only their events.
    let mut prefixed = server.sse("/views/prices/events?prefix=D", &[]).await?;
    let (states, synced) = prefixed.until_synced(10).await?;
    ensure!(
        states.len() == 1 && key_of(&states[0])? == "DYNA",
        "{states:?}"
    );
    ensure!(expect::cursor_of(&synced)?.offset().get() == 20);
    server.ingest_ok(&feed.batch(4)).await?;
    expect::update(&prefixed.next_event().await?, 24, "DYNA", 24)?;
    prefixed.expect_silence(Duration::from_millis(300)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_three_keys_of_a_large_view_gets_only_theirs() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let names: Vec<String> = (0..5_000).map(|i| format!("K{i:04}")).collect();
    let symbols: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut feed = Feed::new(&symbols);
    server.ingest_ok(&feed.batch(5_000)).await?;

    let picked = ["K0042", "K1234", "K4999"];
    let mut stream = server
        .sse(
            &format!("/views/prices/events?keys={}", picked.join(",")),
            &[],
        )
        .await?;
    let (states, synced) = stream.until_synced(10).await?;
    let mut keys: Vec<String> = states.iter().map(key_of).collect::<Result<_, _>>()?;
    keys.sort();
    ensure!(keys == picked, "{keys:?}");
    ensure!(expect::cursor_of(&synced)?.offset().get() == 5_000);

    // Two more rounds over every key: three updates each, nothing else.
    for round in 1..=2u64 {
        server.ingest_ok(&feed.batch(5_000)).await?;
        for key in picked {
            let seq = round * 5_000 + key[1..].parse::<u64>()? + 1;
            expect::update(&stream.next_event().await?, seq, key, seq)?;
        }
    }
    stream.expect_silence(Duration::from_millis(300)).await?;

    let state = server.get("/views/prices?keys=K0042,K1234").await?.json()?;
    let entries = state["entries"].as_object().context("entries")?;
    ensure!(
        entries.len() == 2 && entries["K1234"]["seq"] == 11_235,
        "{state}"
    );
    let state = server.get("/views/prices?prefix=K49").await?.json()?;
    ensure!(state["entries"].as_object().map(|e| e.len()) == Some(100));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_narrowing_is_refused() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let many = (0..101)
        .map(|i| format!("k{i}"))
        .collect::<Vec<_>>()
        .join(",");
    for query in [
        "keys=A&prefix=B".to_owned(),
        "keys=".to_owned(),
        "keys=A,,B".to_owned(),
        "prefix=".to_owned(),
        format!("keys={many}"),
    ] {
        for path in ["/views/prices", "/views/prices/events"] {
            let resp = server.get(&format!("{path}?{query}")).await?;
            let error = expect::json_error(&resp, 400)?;
            ensure!(
                error["message"].as_str().unwrap_or_default().contains('?'),
                "{path}?{query}: {error}"
            );
        }
    }
    Ok(())
}
