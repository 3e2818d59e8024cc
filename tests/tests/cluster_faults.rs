//! Faults of NATS under a cluster, against real `nats-server`s:
//! - a NATS server held with `SIGSTOP` (its connections stay open, nothing is answered): the
//!   node notices within its pings, says it is behind on `/readyz`, answers an ingest in flight
//!   at once with `503` and an unknown outcome rather than after its apply timeout, and is ready
//!   again once NATS answers;
//! - on a three-server NATS cluster (the stream at three replicas): a stream leader killed stops
//!   ingest no longer than its election and a second; a node whose links stop forwarding says it
//!   is behind, answers a cursor of another node `503` rather than `reset`, and resumes it once
//!   its links are back; a node whose link to its own server goes silent moves to another.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _};
use viewtape_tests::cluster::CONVERGE;
use viewtape_tests::nemesis::nats_cluster::{operator, NatsCluster};
use viewtape_tests::nemesis::nodes::{Nodes, RUNTIME, STREAM, VIEW};
use viewtape_tests::nemesis::proxy::LinkMode;
use viewtape_tests::server::config_file;
use viewtape_tests::{expect, NatsServer, Server};

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

/// One line of the nemesis runtime: `key` → `n`.
fn line(key: &str, n: u64) -> String {
    format!("{{\"view\":\"{VIEW}\",\"key\":\"{key}\",\"value\":{n}}}\n")
}

/// Ingests `n`'s batch through `server` as producer `p`, sequence `n`: its status.
async fn produce(server: &Server, n: u64) -> anyhow::Result<u16> {
    let seq = n.to_string();
    let resp = viewtape_tests::http::request(
        server.addr(),
        "POST",
        &format!("/runtimes/{RUNTIME}/ingest"),
        &[("Producer-Id", "p"), ("Producer-Seq", &seq)],
        line(&format!("k{n}"), n).as_bytes(),
    )
    .await?;
    Ok(resp.status())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_leader_killed_stops_ingest_no_longer_than_its_election() -> anyhow::Result<()> {
    let mut nats = NatsCluster::start(3).await?;
    let nodes = Nodes::start(&nats, 2).await?;
    let js = operator(&nats.urls()).await?;
    ensure!(produce(&nodes.servers[0], 0).await? == 200);
    let leader = nats.leader(&js, STREAM).await.context("no stream leader")?;
    nats.peers[leader].kill().await?;
    let killed = Instant::now();
    // The election, as JetStream reports it; ingest, as a producer sees it: the same batch
    // again until it is taken.
    let elected = async {
        loop {
            if nats.leader(&js, STREAM).await.is_some_and(|l| l != leader) {
                return killed.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let taken = async {
        loop {
            if produce(&nodes.servers[0], 1).await? == 200 {
                return anyhow::Ok(killed.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let (elected, taken) =
        tokio::time::timeout(CONVERGE * 2, async { tokio::join!(elected, taken) })
            .await
            .context("no leader, or no ingest, within the timeout")?;
    let taken = taken?;
    println!("stream leader killed: elected after {elected:?}, ingest taken again after {taken:?}");
    ensure!(
        taken <= elected + Duration::from_millis(2500),
        "elected after {elected:?}, ingest taken again after {taken:?}\n{}",
        nodes.servers[0].logs()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_answers_a_cursor_of_another_node_503_and_resumes_it_later(
) -> anyhow::Result<()> {
    let nats = NatsCluster::start(3).await?;
    let nodes = Nodes::start(&nats, 2).await?;
    let (cut, other) = (&nodes.servers[0], &nodes.servers[1]);
    ensure!(produce(other, 0).await? == 200);
    expect::tape(cut, VIEW, 1).await?;

    // Node 0's links stop forwarding; node 1 takes more.
    for server in 0..3 {
        nodes
            .link(0, server)
            .context("link")?
            .set(LinkMode::Blackhole);
    }
    for n in 1..=3 {
        ensure!(produce(other, n).await? == 200);
    }
    let tape = expect::tape(other, VIEW, 4).await?;
    let cursor = tape[3].id.clone().context("id")?;
    let body = readyz_until(cut, |status, body| {
        status == 503 && body["behind"].as_str().is_some()
    })
    .await?;
    ensure!(body["behind"].is_string(), "{body}");
    let path = format!("/views/{VIEW}/events");
    let headers = [
        ("Accept", "text/event-stream"),
        ("Last-Event-ID", cursor.as_str()),
    ];
    let asked = viewtape_tests::http::request(cut.addr(), "GET", &path, &headers, b"");
    let resp = tokio::time::timeout(Duration::from_secs(15), asked)
        .await
        .context("no answer to a cursor ahead")??;
    ensure!(
        resp.status() == 503 && resp.header("retry-after").is_some(),
        "{} {}",
        resp.status(),
        resp.text()
    );
    ensure!(
        resp.text().contains("ahead of this node"),
        "{}",
        resp.text()
    );

    // Back: node 0 catches up, and the cursor resumes there with what came after it.
    nodes.heal_links();
    readyz_until(cut, |status, _| status == 200).await?;
    let mut stream = cut.sse(&path, &[("Last-Event-ID", &cursor)]).await?;
    ensure!(produce(other, 4).await? == 200);
    let next = stream.next_event().await?;
    ensure!(next.event != "reset", "{next:?}");
    ensure!(next.data.contains("k4"), "{next:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_link_to_its_server_goes_silent_moves_to_another() -> anyhow::Result<()> {
    let nats = NatsCluster::start(3).await?;
    let nodes = Nodes::start(&nats, 1).await?;
    let node = &nodes.servers[0];
    ensure!(produce(node, 0).await? == 200);
    // Its own server comes first in its list: the one it is connected to.
    nodes.link(0, 0).context("link")?.set(LinkMode::Blackhole);
    let cut = Instant::now();
    // The same batch again until it is taken, as a producer does after an unknown outcome.
    let taken = async {
        loop {
            if produce(node, 1).await? == 200 {
                return anyhow::Ok(cut.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let taken = tokio::time::timeout(CONVERGE, taken)
        .await
        .with_context(|| format!("ingest never taken again\n{}", node.logs()))??;
    ensure!(
        taken <= Duration::from_secs(6),
        "ingest taken again after {taken:?}\n{}",
        node.logs()
    );
    readyz_until(node, |status, _| status == 200).await?;
    Ok(())
}
