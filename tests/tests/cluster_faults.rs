//! A cluster node whose NATS stops answering, against a real `nats-server` held with `SIGSTOP`
//! (its connections stay open, nothing is answered: a link that stops forwarding looks the
//! same): the node notices within its pings, says it is behind on `/readyz`, answers an ingest
//! in flight at once with `503` and an unknown outcome rather than after its apply timeout, and
//! is ready again once NATS answers.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _};
use viewtape_tests::cluster::CONVERGE;
use viewtape_tests::server::config_file;
use viewtape_tests::{NatsServer, Server};

/// Sends `signal` to process `pid`.
fn signal(pid: u32, signal: libc::c_int) -> anyhow::Result<()> {
    let pid = libc::pid_t::try_from(pid)?;
    // SAFETY: kill(2) with a pid this test spawned and a valid signal number.
    let sent = unsafe { libc::kill(pid, signal) };
    ensure!(sent == 0, "kill({pid}, {signal}) failed");
    Ok(())
}

/// Polls `/readyz` until `ready` says what it must; its last body.
async fn readyz_until(
    server: &Server,
    ready: impl Fn(u16, &serde_json::Value) -> bool,
) -> anyhow::Result<serde_json::Value> {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let resp = server.get("/readyz").await?;
        let body = resp.json()?;
        if ready(resp.status(), &body) {
            return Ok(body);
        }
        ensure!(Instant::now() < deadline, "/readyz stayed {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_nats_stops_answering_says_so_and_answers_at_once() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    // An apply timeout far longer than the pings take, so that an answer within it shows the
    // pings at work, not the timeout.
    let config = config_file(&format!(
        "[cluster]\nnats_url = \"{}\"\napply_timeout = \"20s\"\n\n\
         [[runtime]]\nname = \"items\"\nmodule = \"builtin:json\"\nviews = [\"items\"]\n",
        nats.url()
    ))?;
    let path = config.path().display().to_string();
    let node = Server::start(&["--config", &path]).await?;
    node.ready(CONVERGE).await?;
    let line = |key: &str| format!("{{\"key\":\"{key}\",\"value\":1}}\n");
    let resp = node.ingest("items", &line("a")).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());

    signal(nats.pid(), libc::SIGSTOP)?;
    let sent = Instant::now();
    let resp = node.ingest("items", &line("b")).await?;
    let answered = sent.elapsed();
    ensure!(
        resp.status() == 503,
        "{} {}\n{}",
        resp.status(),
        resp.text(),
        node.logs()
    );
    ensure!(resp.header("retry-after").is_some(), "no Retry-After");
    ensure!(
        answered < Duration::from_secs(5),
        "answered after {answered:?}, not when the pings found NATS gone: {}",
        resp.text()
    );
    let body = readyz_until(&node, |status, body| {
        status == 503 && body["behind"].as_str().is_some()
    })
    .await?;
    let behind = body["behind"].as_str().context("behind")?;
    ensure!(behind.contains("not connected"), "{body}");

    signal(nats.pid(), libc::SIGCONT)?;
    readyz_until(&node, |status, body| {
        status == 200 && body["behind"].is_null()
    })
    .await?;
    let resp = node.ingest("items", &line("c")).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let state = node.get("/views/items").await?.json()?;
    ensure!(state["entries"]["c"] == 1, "{state}");
    Ok(())
}
