//! Replay follows what was acknowledged, against the real binary: a batch acknowledged live is
//! replayed after `kill -9` whatever fuel it would cost the restored instance (the fuel limit
//! judged it once, live), with the same frames and no reset; new batches are judged by the limit
//! of now.

use anyhow::{ensure, Context as _};
use viewtape_tests::logfiles::fail_closed;
use viewtape_tests::server::config_file;
use viewtape_tests::{expect, Server};

/// The demo ticker with `fuel`, no periodic snapshot: a restart after `kill -9` replays the log.
fn ticker(fuel: u64) -> String {
    format!(
        "[server]\nsnapshot_interval = \"0s\"\n\n\
         [[runtime]]\nname = \"demo\"\nmodule = \"builtin:ticker\"\nviews = [\"prices\"]\n\
         [runtime.limits]\nfuel = {fuel}\n"
    )
}

/// Ticks `from..to`, 50 symbols.
fn ticks(from: u64, to: u64) -> String {
    (from..to)
        .map(|seq| {
            format!(
                "{{\"symbol\":\"S{}\",\"price\":1.5,\"seq\":{seq}}}\n",
                seq % 50
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_acknowledged_live_is_replayed_whatever_its_fuel_now() -> anyhow::Result<()> {
    let config = config_file(&ticker(10_000_000_000))?;
    let path = config.path().display().to_string();
    let mut server = Server::start(&["--config", &path, "--demo-rate", "0"]).await?;
    for batch in 0..2 {
        let resp = server
            .ingest("demo", &ticks(1 + batch * 500, 1 + (batch + 1) * 500))
            .await?;
        ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    }
    let tape = expect::tape(&server, "prices", 1000).await?;
    let last = expect::cursor_of(tape.last().context("a frame")?)?;
    let state = server.get("/views/prices").await?.json()?;
    server.kill9().await?;

    // A limit the acknowledged batches would now run out of: they replay all the same.
    std::fs::write(config.path(), ticker(100_000))?;
    server.restart().await?;
    ensure!(
        fail_closed(&server, "digest").await == 0.0,
        "{}",
        server.logs()
    );
    ensure!(
        server.get("/views/prices").await?.json()? == state,
        "the same state"
    );
    ensure!(
        expect::tape(&server, "prices", 1000).await? == tape,
        "the same frames"
    );
    expect::resumes(&server, "prices", &last).await?;
    // New input is judged by the limit of now.
    let resp = server.ingest("demo", &ticks(1001, 1501)).await?;
    ensure!(resp.status() == 422, "{} {}", resp.status(), resp.text());
    ensure!(resp.text().contains("fuel"), "{}", resp.text());
    Ok(())
}
