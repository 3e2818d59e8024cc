//! Shutdown and restart: a graceful stop closes streams, exits 0 and writes an exact
//! snapshot, so cursors resume after the restart with no reset. (A kill -9 keeps them too, by
//! the log: `durability.rs`.) With the log off, a kill -9 cannot vouch for its offsets, so the
//! same resume gets a reset.

use std::time::Duration;

use anyhow::ensure;
use viewtape_tests::{expect, Feed, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_exits_zero_and_cursors_survive_the_restart() -> anyhow::Result<()> {
    let mut server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    server.ingest_ok(&feed.batch(5)).await?;
    let mut stream = server.sse("/views/prices/events?from=tape", &[]).await?;
    let mut last = None;
    for offset in 1..=5 {
        let event = stream.next_event().await?;
        last = Some(expect::update(
            &event,
            offset,
            feed.symbol_of(offset),
            offset,
        )?);
    }
    let last = last.unwrap_or_else(|| unreachable!());

    // An open stream must not hold the shutdown up: the server closes it.
    let stopping = std::time::Instant::now();
    let status = server.stop_graceful().await?;
    ensure!(status.success(), "graceful stop exit status {status}");
    ensure!(
        stopping.elapsed() < Duration::from_secs(10),
        "graceful stop took {:?} with a stream open",
        stopping.elapsed()
    );
    match stream.next_within(Duration::from_secs(5)).await {
        Ok(None) => {}
        Ok(Some(event)) => anyhow::bail!("an event after shutdown: {event:?}"),
        Err(e) => ensure!(
            !e.to_string().contains(" within "),
            "the stream was left open: {e}"
        ),
    }

    server.restart().await?;
    let mut resumed = expect::resumes(&server, "prices", &last).await?;
    // The guest's state came back too: seq 6 is the next one it accepts.
    server.ingest_ok(&feed.batch(2)).await?;
    let six = expect::update(&resumed.next_event().await?, 6, "BOLT", 6)?;
    ensure!(
        six.epoch() == last.epoch(),
        "same epoch after an exact snapshot"
    );
    expect::update(&resumed.next_event().await?, 7, "ACME", 7)?;

    // The state survived as well.
    let view = server.get("/views/prices").await?.json()?;
    ensure!(view["entries"]["ACME"]["seq"] == 7, "{view}");
    ensure!(view["entries"]["BOLT"]["seq"] == 6, "{view}");

    // SIGINT is graceful too.
    let status = server.stop_interrupt().await?;
    ensure!(status.success(), "SIGINT exit status {status}");
    Ok(())
}

/// With `[log] enabled = false` nothing vouches for the offsets a crashed server issued: the
/// same resume that survives a kill -9 with the log gets a reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_with_the_log_off_resets_old_cursors() -> anyhow::Result<()> {
    let config = viewtape_tests::server::config_file(
        "[log]\nenabled = false\n\n[[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n",
    )?;
    let path = config.path().display().to_string();
    let mut server = Server::start(&["--config", &path]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    server.ingest_ok(&feed.batch(5)).await?;
    let tape = expect::tape(&server, "prices", 5).await?;
    let last = expect::cursor_of(&tape[4])?;

    server.kill9().await?;
    server.restart().await?;
    let mut stream = expect::refused(&server, "prices", &last).await?;
    // Then state and live, as for any reset.
    let (_, synced) = stream.until_synced(100).await?;
    let synced = expect::cursor_of(&synced)?;
    ensure!(
        synced.epoch() != last.epoch(),
        "a fresh epoch after a crash"
    );
    let receipt = server.ingest_ok(&feed.batch(1)).await?;
    ensure!(
        receipt["position"].is_null() && receipt["durability"].is_null(),
        "no log, no position: {receipt}"
    );
    ensure!(
        !server.data_dir().join("log").exists(),
        "no log directory with the log off"
    );
    Ok(())
}
