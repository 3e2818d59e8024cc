//! Replicas on one JetStream stream, end to end: a real `nats-server` on loopback and three real
//! `viewtape serve --nats` processes. Every node applies the same stream through the same guest,
//! so tapes are identical frame for frame and a cursor from one node resumes on any other.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use viewtape_tests::{expect, Feed, NatsServer, Response, Server, SseEvent};

/// How long a node may take to apply what another node acknowledged.
const CONVERGE: Duration = Duration::from_secs(20);

/// A node of the cluster on `nats`.
async fn node(nats: &NatsServer) -> anyhow::Result<Server> {
    Server::start(&["--nats", &nats.url()]).await
}

/// `n` nodes, each ready.
async fn nodes(nats: &NatsServer, n: usize) -> anyhow::Result<Vec<Server>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let server = node(nats).await?;
        ready(&server).await?;
        out.push(server);
    }
    Ok(out)
}

/// Waits until `/readyz` says 200; returns its body.
async fn ready(server: &Server) -> anyhow::Result<serde_json::Value> {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let resp = server.get("/readyz").await?;
        if resp.status() == 200 {
            return resp.json();
        }
        if Instant::now() > deadline {
            bail!(
                "not ready within {CONVERGE:?}: {}\n{}",
                resp.text(),
                server.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the node has applied stream sequence `position`.
async fn applied(server: &Server, position: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let body = server.get("/readyz").await?.json()?;
        if body["applied"].as_u64().is_some_and(|a| a >= position) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "did not apply {position} within {CONVERGE:?}: {body}\n{}",
                server.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The first `n` frames of the tape of `prices`: (id, data) each.
async fn frames(server: &Server, n: usize) -> anyhow::Result<Vec<(String, String)>> {
    Ok(expect::tape(server, "prices", n)
        .await?
        .into_iter()
        .map(|e| (e.id.unwrap_or_default(), e.data))
        .collect())
}

/// The log position of an ingest receipt.
fn position(receipt: &serde_json::Value) -> anyhow::Result<u64> {
    receipt["position"]
        .as_u64()
        .with_context(|| format!("no position in {receipt}"))
}

/// The `seq` an update carries.
fn seq(event: &SseEvent) -> anyhow::Result<u64> {
    ensure!(event.event == "update", "expected an update, got {event:?}");
    viewtape_tests::feed::event_seq(&serde_json::from_str(&event.data)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_share_one_tape_and_a_cursor_moves_between_them() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let nodes = nodes(&nats, 3).await?;
    let mut feed = Feed::new(&["ACME", "BOLT", "CRUX"]);

    // Ingest spread over every node: each answers once it has applied its own batch.
    let mut last = 0;
    for round in 0..12 {
        let receipt = nodes[round % 3].ingest_ok(&feed.batch(4)).await?;
        let at = position(&receipt)?;
        ensure!(at > last, "positions grow: {at} after {last}");
        ensure!(receipt["durability"] == "stream", "{receipt}");
        ensure!(receipt["events"]["prices"] == 4, "{receipt}");
        last = at;
    }
    for node in &nodes {
        applied(node, last).await?;
    }

    // Every node's tape, frame for frame.
    let tape = frames(&nodes[0], 48).await?;
    for node in &nodes[1..] {
        ensure!(frames(node, 48).await? == tape, "tapes differ");
    }
    let seqs: Vec<u64> = tape
        .iter()
        .map(|(_, data)| viewtape_tests::feed::event_seq(&serde_json::from_str(data)?))
        .collect::<anyhow::Result<_>>()?;
    ensure!(seqs == (1..=48).collect::<Vec<_>>(), "{seqs:?}");

    // A batch the guest rejects is refused the same way whichever node takes it, and every
    // node goes on alike.
    let bad = nodes[1].ingest("demo", "{\"symbol\": 7}\n").await?;
    expect::json_error(&bad, 422)?;

    // A client that lands on another node at every reconnect, with ingest going on between:
    // every event once, in order, no reset.
    let mut cursor = expect::cursor_of(&expect::tape(&nodes[0], "prices", 1).await?[0])?;
    let mut seen = vec![1];
    for hop in 0..9 {
        let receipt = nodes[(hop + 1) % 3].ingest_ok(&feed.batch(2)).await?;
        last = position(&receipt)?;
        let node = &nodes[hop % 3];
        let mut stream = node
            .sse(
                "/views/prices/events",
                &[("Last-Event-ID", &cursor.to_string())],
            )
            .await?;
        // Read a few events, then go away.
        for _ in 0..(3 + hop % 4) {
            let event = stream.next_event().await?;
            seen.push(seq(&event)?);
            cursor = expect::cursor_of(&event)?;
        }
    }
    for node in &nodes {
        applied(node, last).await?;
    }
    let mut stream = nodes[2]
        .sse(
            "/views/prices/events",
            &[("Last-Event-ID", &cursor.to_string())],
        )
        .await?;
    while *seen.last().unwrap_or(&0) < feed.next_seq() - 1 {
        seen.push(seq(&stream.next_event().await?)?);
    }
    let want: Vec<u64> = (1..feed.next_seq()).collect();
    ensure!(seen == want, "events once each, in order: {seen:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_under_ingest_catches_up_after_a_restart() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let mut nodes = nodes(&nats, 2).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    let mut last = 0;
    for _ in 0..5 {
        last = position(&nodes[0].ingest_ok(&feed.batch(3)).await?)?;
    }
    applied(&nodes[1], last).await?;
    let cursor = expect::cursor_of(&expect::tape(&nodes[1], "prices", 15).await?[14])?;

    // kill -9 while the other node takes batches.
    let (writer, victim) = nodes.split_at_mut(1);
    let writer = &writer[0];
    let ingest = async {
        let mut last = 0;
        for _ in 0..20 {
            last = position(&writer.ingest_ok(&feed.batch(3)).await?)?;
        }
        anyhow::Ok(last)
    };
    let kill = async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        victim[0].kill9().await
    };
    let (last, killed) = tokio::join!(ingest, kill);
    let last = last?;
    killed?;
    nodes[1].restart().await?;
    ready(&nodes[1]).await?;
    applied(&nodes[1], last).await?;

    // The restarted node has what the other has, under the same epoch: the cursor resumes
    // with no reset, and the tapes match.
    ensure!(frames(&nodes[1], 75).await? == frames(&nodes[0], 75).await?);
    let mut stream = nodes[1]
        .sse(
            "/views/prices/events",
            &[("Last-Event-ID", &cursor.to_string())],
        )
        .await?;
    for want in 16..=75 {
        ensure!(seq(&stream.next_event().await?)? == want);
    }
    Ok(())
}

/// What a refused ingest looks like while NATS is away: `503` with `Retry-After`.
fn unavailable(resp: &Response) -> anyhow::Result<()> {
    expect::json_error(resp, 503)?;
    ensure!(resp.header("retry-after").is_some(), "no Retry-After");
    Ok(())
}
