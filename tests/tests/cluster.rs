//! Replicas on one JetStream stream, end to end: a real `nats-server` on loopback and three real
//! `viewtape serve --nats` processes. Every node applies the same stream through the same guest,
//! so tapes are identical frame for frame and a cursor from one node resumes on any other.
//!
//! One file past 500 lines: one subject (replicas), each test whole; the nats-server harness is
//! shared from `viewtape_tests`.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use futures_util::StreamExt as _;
use viewtape_tests::cluster::{
    applied, epoch, frames, ingest_all, nodes, operator, position, CONVERGE,
};
use viewtape_tests::{expect, Feed, NatsServer, Response, Server, SseEvent};

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
        ensure!(receipt["durability"] == "stream_os", "{receipt}");
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
    ingest_all(&nodes, &mut feed, 5, 3).await?;
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
    nodes[1].ready(CONVERGE).await?;
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

/// Ingests `ndjson` as producer `id` with sequence `seq`, through `server`.
async fn produce(server: &Server, id: &str, seq: u64, ndjson: &str) -> anyhow::Result<Response> {
    let seq = seq.to_string();
    viewtape_tests::http::request(
        server.addr(),
        "POST",
        "/runtimes/demo/ingest",
        &[("Producer-Id", id), ("Producer-Seq", &seq)],
        ndjson.as_bytes(),
    )
    .await
}

/// Ingests `ndjson` as producer `id` in `epoch` with sequence `seq`, through `server`.
async fn produce_in(
    server: &Server,
    id: &str,
    epoch: u64,
    seq: u64,
    ndjson: &str,
) -> anyhow::Result<Response> {
    let (epoch, seq) = (epoch.to_string(), seq.to_string());
    let headers = [
        ("Producer-Id", id),
        ("Producer-Epoch", epoch.as_str()),
        ("Producer-Seq", seq.as_str()),
    ];
    viewtape_tests::http::request(
        server.addr(),
        "POST",
        "/runtimes/demo/ingest",
        &headers,
        ndjson.as_bytes(),
    )
    .await
}

/// On a cluster, another body sent under a used seq went under the same JetStream message id as
/// the first and was dropped as its duplicate, answered `200`. A claim made through one node
/// fences on every node; a retry through another node gets the original receipt; another body
/// under a used seq is `409 producer_seq_reused` through any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_claim_retry_and_reuse_alike_on_every_node() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let nodes = nodes(&nats, 2).await?;
    let mut feed = Feed::new(&["ACME"]);
    let claim = |node: usize| nodes[node].post("/runtimes/demo/producers/p", b"");

    let first = claim(0).await?.json()?;
    let epoch = first["epoch"].as_u64().context("an epoch")?;
    ensure!(epoch == 1 && first["seq"] == 0, "{first}");
    let body = feed.batch(1);
    let sent = produce_in(&nodes[1], "p", epoch, 0, &body).await?;
    ensure!(
        sent.status() == 200 && sent.header("producer-duplicate").is_none(),
        "{}",
        sent.text()
    );
    for node in [0, 1] {
        let retry = produce_in(&nodes[node], "p", epoch, 0, &body).await?;
        ensure!(
            retry.status() == 200 && retry.header("producer-duplicate") == Some("true"),
            "node {node}: {} {}",
            retry.status(),
            retry.text()
        );
        ensure!(
            retry.text() == sent.text(),
            "the original receipt: {} vs {}",
            retry.text(),
            sent.text()
        );
        let other = produce_in(&nodes[node], "p", epoch, 0, &feed.clone().batch(1)).await?;
        let error = expect::json_error(&other, 409)?;
        ensure!(
            error["error"] == "producer_seq_reused" && error["next_seq"] == 1,
            "node {node}: {error}"
        );
    }
    let second = claim(1).await?.json()?;
    ensure!(second["epoch"] == 2, "{second}");
    let fenced = produce_in(&nodes[0], "p", epoch, 1, &feed.clone().batch(1)).await?;
    expect::json_error(&fenced, 403)?;
    ensure!(
        produce_in(&nodes[0], "p", 2, 0, &feed.batch(1))
            .await?
            .status()
            == 200
    );

    for node in &nodes {
        ensure!(frames(node, 2).await?.len() == 2);
    }
    ensure!(
        frames(&nodes[0], 2).await? == frames(&nodes[1], 2).await?,
        "tapes differ"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_restarted_under_load_loses_no_acknowledged_batch() -> anyhow::Result<()> {
    let mut nats = NatsServer::start().await?;
    let nodes = nodes(&nats, 2).await?;
    let mut subscriber = nodes[1].sse("/views/prices/events?from=tape", &[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);

    // A producer that resends a refused batch as it was (same Producer-Seq) until it is taken.
    let mut refused = 0;
    let mut last = 0;
    let started = Instant::now();
    for batch in 0..40u64 {
        let ndjson = feed.batch(2);
        if batch == 15 {
            for node in &nodes {
                applied(node, last).await?;
            }
            nats.kill().await?;
        }
        if batch == 15 || batch == 25 {
            // While NATS is away: refused with Retry-After, and subscribers of the other node
            // keep streaming what it has.
            let resp = produce(&nodes[0], "p", batch, &ndjson).await?;
            unavailable(&resp)?;
            refused += 1;
            if batch == 15 {
                for want in 1..=30 {
                    ensure!(seq(&subscriber.next_event().await?)? == want);
                }
            }
            nats.restart().await?;
        }
        loop {
            ensure!(
                started.elapsed() < Duration::from_secs(90),
                "producer took too long"
            );
            let resp = produce(&nodes[batch as usize % 2], "p", batch, &ndjson).await?;
            match resp.status() {
                200 => {
                    last = position(&resp.json()?)?;
                    break;
                }
                503 => {
                    unavailable(&resp)?;
                    refused += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                status => bail!("ingest: {status}: {}", resp.text()),
            }
        }
        if batch == 24 {
            // Kill NATS again right after an acknowledged batch: it was stored before the ack.
            // It comes back after the next batch was refused (restarted at once, a node could
            // be connected again before that batch, and take it).
            nats.kill().await?;
        }
    }
    ensure!(refused >= 2, "NATS being away was noticed");
    // Every acknowledged tick once, in order, on both nodes.
    for want in 31..=80 {
        ensure!(seq(&subscriber.next_event().await?)? == want);
    }
    let tape = frames(&nodes[0], 80).await?;
    ensure!(frames(&nodes[1], 80).await? == tape);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_node_starts_from_a_shared_snapshot_and_an_uncovered_one_fails_closed(
) -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    // Snapshots only when asked for.
    let config = viewtape_tests::server::config_file(
        "[server]\nsnapshot_interval = \"0s\"\n\n[[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n",
    )?;
    let path = config.path().display().to_string();
    let args = ["--nats", &nats.url(), "--config", &path];
    let first = Server::start_with_env(&args, &[("VIEWTAPE_ADMIN_TOKEN", "admin")]).await?;
    first.ready(CONVERGE).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    for _ in 0..10 {
        first.ingest_ok(&feed.batch(2)).await?;
    }
    let resp = viewtape_tests::http::request(
        first.addr(),
        "POST",
        "/admin/snapshot",
        &[("Authorization", "Bearer admin")],
        b"",
    )
    .await?;
    ensure!(resp.status() == 200, "{}", resp.text());
    // A restore and a deploy go through the stream; bad ones are refused before they reach it.
    for (method, path, body, status) in [
        ("POST", "/admin/restore", &b"{\"name\": \"x\"}"[..], 404),
        ("PUT", "/admin/runtimes/demo/module", b"\0asm", 422),
    ] {
        let resp = viewtape_tests::http::request(
            first.addr(),
            method,
            path,
            &[("Authorization", "Bearer admin")],
            body,
        )
        .await?;
        expect::json_error(&resp, status)?;
    }
    // Shared in the bucket.
    let js = operator(&nats).await?;
    let bucket = js.get_object_store("viewtape-snapshots").await?;
    let deadline = Instant::now() + CONVERGE;
    loop {
        let mut list = bucket.list().await?;
        let mut shared = false;
        while let Some(object) = list.next().await {
            shared |= !object?.name.starts_with("module-");
        }
        if shared {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "no shared snapshot:\n{}",
            first.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut last = 0;
    for _ in 0..5 {
        last = position(&first.ingest_ok(&feed.batch(2)).await?)?;
    }
    // The stream drops its first messages (the snapshot is at 11: the module's declaration,
    // then ten batches).
    let stream = js.get_stream("viewtape").await?;
    stream.purge().sequence(9).await?;

    let late = Server::start(&args).await?;
    late.ready(CONVERGE).await?;
    applied(&late, last).await?;
    ensure!(epoch(&late).await? == epoch(&first).await?);
    ensure!(frames(&late, 30).await? == frames(&first, 30).await?);
    last = position(&late.ingest_ok(&feed.batch(2)).await?)?;
    applied(&first, last).await?;

    // Now the stream drops everything, past the only snapshot: a new node cannot know the
    // history, and says so instead of guessing.
    stream.purge().await?;
    let uncovered = Server::start(&args).await?;
    let resp = uncovered.get("/readyz").await?;
    ensure!(resp.status() == 503, "{}", resp.text());
    let body = resp.json()?;
    ensure!(
        body["broken"]
            .as_str()
            .is_some_and(|b| b.contains("no snapshot")),
        "{body}"
    );
    // The halt is named by its kind, on /readyz and as the metric's label.
    ensure!(body["halt"] == "uncovered", "{body}");
    let halted = |reason| format!("viewtape_cluster_halted{{reason=\"{reason}\"}}");
    ensure!(uncovered.metric(&halted("uncovered")).await? == 1.0);
    ensure!(uncovered.metric(&halted("gone")).await? == 0.0);
    ensure!(first.metric(&halted("uncovered")).await? == 0.0);
    ensure!(
        epoch(&uncovered).await? != epoch(&first).await?,
        "an epoch of its own"
    );
    unavailable(&uncovered.ingest("demo", &feed.batch(1)).await?)?;
    // The nodes that hold the history go on.
    first.ingest_ok(&feed.batch(2)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_stream_is_another_history_and_nodes_fail_closed() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let mut nodes = nodes(&nats, 2).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    ingest_all(&nodes, &mut feed, 4, 2).await?;
    let before = epoch(&nodes[0]).await?;
    let cursor = expect::cursor_of(&expect::tape(&nodes[0], "prices", 8).await?[7])?;

    // A cursor ahead of everything the stream holds, on a node that applied all of it: no node
    // can have issued it, so it is answered `ahead`.
    let ahead = viewtape_journal::Cursor::new(cursor.epoch(), cursor.offset().saturating_add(5));
    expect::tape(&nodes[1], "prices", 8).await?;
    let mut stream = nodes[1]
        .sse(
            "/views/prices/events",
            &[("Last-Event-ID", &ahead.to_string())],
        )
        .await?;
    expect::reset(&stream.next_event().await?, "ahead")?;

    // A message on the stream's subjects that no node published: every node passes over it
    // alike and goes on.
    let js = operator(&nats).await?;
    js.publish("viewtape.in.demo", "not a batch".into())
        .await?
        .await?;
    ingest_all(&nodes, &mut feed, 1, 2).await?;
    for node in &nodes {
        ensure!(
            node.get("/readyz").await?.status() == 200,
            "{}",
            node.logs()
        );
    }
    ensure!(frames(&nodes[1], 10).await? == frames(&nodes[0], 10).await?);

    // The stream is deleted and created again behind the nodes' backs.
    js.delete_stream("viewtape").await?;
    nodes[1].kill9().await?;
    nodes[1].restart().await?;
    nodes[1].ready(CONVERGE).await?;
    let after = epoch(&nodes[1]).await?;
    ensure!(after != before, "the new stream's history is another epoch");
    // The old cursor means nothing there: a reset, never a resume.
    let mut stream = nodes[1]
        .sse(
            "/views/prices/events",
            &[("Last-Event-ID", &cursor.to_string())],
        )
        .await?;
    expect::reset(&stream.next_event().await?, "stale_epoch")?;
    // The new stream begins with the node's declaration of its module, then the batch.
    let receipt = nodes[1].ingest_ok(&Feed::new(&["ACME"]).batch(1)).await?;
    ensure!(position(&receipt)? == 2, "{receipt}");

    // The node that lived through it stops applying: its tape is the old history, under the
    // old epoch; it is not ready and takes no ingest.
    let deadline = Instant::now() + CONVERGE;
    loop {
        let resp = nodes[0].get("/readyz").await?;
        if resp.status() == 503 {
            ensure!(resp.text().contains("created again"), "{}", resp.text());
            ensure!(resp.json()?["halt"] == "recreated", "{}", resp.text());
            break;
        }
        ensure!(Instant::now() < deadline, "still ready: {}", resp.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(epoch(&nodes[0]).await? == before);
    unavailable(&nodes[0].ingest("demo", &feed.batch(1)).await?)?;
    Ok(())
}

/// The `seq`s of the demo feed's ticks on `server`'s tape, which must be 1, 2, 3, … with
/// nothing missing or twice.
async fn fed(server: &Server) -> anyhow::Result<u64> {
    let state = server.get("/views/prices").await?.json()?;
    let entries = state["entries"]
        .as_object()
        .with_context(|| format!("no entries: {state}"))?;
    let newest = entries
        .values()
        .filter_map(|tick| tick["seq"].as_u64())
        .max()
        .unwrap_or(0);
    let tape = expect::tape(server, "prices", newest as usize).await?;
    let seqs: Vec<u64> = tape.iter().map(seq).collect::<anyhow::Result<_>>()?;
    ensure!(seqs == (1..=newest).collect::<Vec<_>>(), "{seqs:?}");
    Ok(newest)
}

/// Waits until `server` has fed more than `than` ticks, and returns how many.
async fn fed_beyond(server: &Server, than: u64) -> anyhow::Result<u64> {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let fed = fed(server).await?;
        if fed > than {
            return Ok(fed);
        }
        ensure!(
            Instant::now() < deadline,
            "the feed stopped at {fed}:\n{}",
            server.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_feed_runs_once_per_cluster_and_moves_when_its_node_dies() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let server = Server::start(&["--nats", &nats.url(), "--demo-rate", "20"]).await?;
        server.ready(CONVERGE).await?;
        nodes.push(server);
    }
    fed_beyond(&nodes[0], 20).await?;
    let holding = |server: &Server| server.logs().matches("holds the lease").count();
    let holders: Vec<usize> = nodes.iter().map(holding).collect();
    ensure!(holders.iter().sum::<usize>() == 1, "one feed: {holders:?}");
    let leader = holders.iter().position(|&n| n == 1).unwrap_or(0);
    let other = 1 - leader;

    // The node feeding dies; the other takes the lease and the feed goes on where it was,
    // with no gap and nothing twice.
    let before = fed(&nodes[other]).await?;
    nodes[leader].kill9().await?;
    let deadline = Instant::now() + CONVERGE;
    while holding(&nodes[other]) == 0 {
        ensure!(
            Instant::now() < deadline,
            "no takeover:\n{}",
            nodes[other].logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fed_beyond(&nodes[other], before + 20).await?;
    Ok(())
}

/// Appends ticks `seqs` (one symbol per tick, cycling over four) to the file at `path`.
fn append_ticks(path: &std::path::Path, seqs: std::ops::RangeInclusive<u64>) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    for seq in seqs {
        let symbol = ["ACME", "BOLT", "CRUX", "DYNA"][(seq % 4) as usize];
        writeln!(
            file,
            "{{\"symbol\":\"{symbol}\",\"price\":{seq}.5,\"seq\":{seq}}}"
        )?;
    }
    file.sync_all()?;
    Ok(())
}

/// Waits until `server` has fed at least `n` ticks (each once, none missing).
/// Appends `n` log lines for the `logstats` guest (service `svc`, level info).
fn append_lines(path: &std::path::Path, n: usize) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    for _ in 0..n {
        writeln!(file, "svc info a line")?;
    }
    file.sync_all()?;
    Ok(())
}

/// The lines `logstats` counted for service `svc` on `server` (0 before the first).
async fn counted(server: &Server) -> anyhow::Result<u64> {
    let view = server.get("/views/log-levels").await?.json()?;
    Ok(view["entries"]["svc"]["total"].as_u64().unwrap_or(0))
}

async fn fed_at_least(server: &Server, n: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + CONVERGE;
    while fed(server).await? < n {
        ensure!(
            Instant::now() < deadline,
            "fed {} of {n}:\n{}",
            fed(server).await?,
            server.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_source_runs_once_per_cluster_and_moves_on_from_its_checkpoint() -> anyhow::Result<()>
{
    let nats = NatsServer::start().await?;
    let dir = tempfile::tempdir()?;
    let ticks = dir.path().join("ticks.ndjson");
    append_ticks(&ticks, 1..=20)?;
    // Besides, a guest that counts every line it is given (the ticker passes over a seq it has
    // seen, so a line read twice would go unnoticed on its tape alone).
    let lines = dir.path().join("lines.log");
    append_lines(&lines, 20)?;
    let config = viewtape_tests::server::config_file(&format!(
        "[[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n\n[runtime.source]\nfile = {:?}\n\n\
         [[runtime]]\nname = \"stats\"\nwasm = \"builtin:logstats\"\nviews = [\"log-levels\"]\n\n[runtime.source]\nfile = {:?}\n",
        ticks.display().to_string(),
        lines.display().to_string()
    ))?;
    let path = config.path().display().to_string();
    let args = ["--nats", &nats.url(), "--config", &path];
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let server = Server::start(&args).await?;
        server.ready(CONVERGE).await?;
        nodes.push(server);
    }
    for node in &nodes {
        fed_at_least(node, 20).await?;
    }
    // The ticks' reader (the counting runtime holds a lease of its own).
    let holding = |server: &Server| {
        server
            .logs()
            .lines()
            .filter(|line| line.contains("holds the lease") && line.contains("source-demo"))
            .count()
    };
    let holders: Vec<usize> = nodes.iter().map(holding).collect();
    ensure!(
        holders.iter().sum::<usize>() == 1,
        "one reader: {holders:?}"
    );
    let leader = holders.iter().position(|&n| n == 1).unwrap_or(0);
    let other = 1 - leader;

    // The reader dies; the other node takes the lease and reads on from the checkpoint of
    // the last record applied: every line once, none twice.
    nodes[leader].kill9().await?;
    append_ticks(&ticks, 21..=40)?;
    append_lines(&lines, 20)?;
    fed_at_least(&nodes[other], 40).await?;
    ensure!(holding(&nodes[other]) == 1, "{}", nodes[other].logs());
    // The restarted node catches up to the same tape.
    nodes[leader].restart().await?;
    nodes[leader].ready(CONVERGE).await?;
    append_ticks(&ticks, 41..=45)?;
    append_lines(&lines, 5)?;
    for node in &nodes {
        fed_at_least(node, 45).await?;
    }
    ensure!(frames(&nodes[leader], 45).await? == frames(&nodes[other], 45).await?);
    // Every line counted once on every node: never lost, never read twice.
    for node in &nodes {
        let deadline = Instant::now() + CONVERGE;
        while counted(node).await? < 45 {
            ensure!(Instant::now() < deadline, "{}", node.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        ensure!(counted(node).await? == 45, "lines counted twice");
    }
    Ok(())
}

/// Config of the gathering test: `notes` and `memos`, one record per key each.
const NOTES: &str = "[[runtime]]\nname = \"notes\"\nwasm = \"builtin:json\"\nviews = [\"notes\"]\n\n[[runtime]]\nname = \"memos\"\nwasm = \"builtin:json\"\nviews = [\"memos\"]\n";

/// Sends `note` to `runtime` through `server`, as producer `id` with sequence `seq` if given.
async fn note(
    server: &Server,
    runtime: &str,
    producer: Option<(&str, u64)>,
    note: &str,
) -> anyhow::Result<Response> {
    let seq = producer.map(|(_, seq)| seq.to_string());
    let headers: Vec<(&str, &str)> = match (producer, &seq) {
        (Some((id, _)), Some(seq)) => vec![("Producer-Id", id), ("Producer-Seq", seq)],
        _ => Vec::new(),
    };
    viewtape_tests::http::request(
        server.addr(),
        "POST",
        &format!("/runtimes/{runtime}/ingest"),
        &headers,
        note.as_bytes(),
    )
    .await
}

/// Many producers of two runtimes at once through one node: the node gathers the batches that
/// wait while a message is on its way into one message, both runtimes' alike, and each batch is
/// still judged alone — acked once, a producer's concurrent second copy a duplicate, a bad batch
/// refused without costing its neighbours — with every node applying the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_batches_share_stream_messages_and_are_judged_alone() -> anyhow::Result<()> {
    const PRODUCERS: u64 = 48;
    const SEQS: u64 = 4;
    const RUNTIMES: [&str; 2] = ["notes", "memos"];
    let nats = NatsServer::start().await?;
    let config = viewtape_tests::server::config_file(NOTES)?;
    let path = config.path().display().to_string();
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let node = Server::start(&["--nats", &nats.url(), "--config", &path]).await?;
        node.ready(CONVERGE).await?;
        nodes.push(node);
    }
    let before = nodes[0].get("/readyz").await?.json()?["stream_last"]
        .as_u64()
        .context("stream_last")?;

    // Producer `p` writes to runtime `p % 2`, view of the same name.
    let runtime = |p: u64| RUNTIMES[(p % 2) as usize];
    let entry = |p: u64, s: u64| {
        let view = runtime(p);
        format!("{{\"view\":\"{view}\",\"key\":\"p{p}-{s}\",\"value\":{s}}}\n")
    };
    let producer = |p: u64| {
        let (node, entry) = (&nodes[0], entry);
        async move {
            let id = format!("p{p}");
            let mut duplicates = 0;
            let mut positions = Vec::new();
            for s in 0..SEQS {
                let body = entry(p, s);
                // The second batch goes twice at once: one of the copies is a duplicate.
                let copies = if s == 1 { 2 } else { 1 };
                let answers = futures_util::future::join_all(
                    (0..copies).map(|_| note(node, runtime(p), Some((&id, s)), &body)),
                )
                .await;
                for answer in answers {
                    let answer = answer?;
                    ensure!(answer.status() == 200, "p{p} seq {s}: {}", answer.text());
                    if answer.header("producer-duplicate") == Some("true") {
                        duplicates += 1;
                    } else {
                        let position = answer.json()?["position"].as_u64();
                        positions.push(position.context("a receipt's position")?);
                    }
                }
            }
            anyhow::Ok((duplicates, positions))
        }
    };
    let bad = async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        note(&nodes[0], "notes", None, "{\"view\":7}\n").await
    };
    let (answers, bad) = tokio::join!(
        futures_util::future::join_all((0..PRODUCERS).map(producer)),
        bad
    );
    let mut runtimes_at = std::collections::BTreeMap::<u64, Vec<&str>>::new();
    for (p, answer) in (0..).zip(answers) {
        let (duplicates, positions) = answer?;
        ensure!(
            duplicates == 1,
            "one copy of each doubled batch is a duplicate"
        );
        for position in positions {
            runtimes_at.entry(position).or_default().push(runtime(p));
        }
    }
    expect::json_error(&bad?, 422)?;
    ensure!(
        runtimes_at
            .values()
            .any(|runtimes| RUNTIMES.iter().all(|runtime| runtimes.contains(runtime))),
        "no message gathered batches of both runtimes: {runtimes_at:?}"
    );

    // Fewer messages than batches: they were gathered, and both nodes applied them alike.
    let readyz = nodes[0].get("/readyz").await?.json()?;
    let last = readyz["stream_last"].as_u64().context("stream_last")?;
    let published = PRODUCERS * (SEQS + 1) + 1;
    ensure!(
        last - before < published,
        "{published} batches took {} messages",
        last - before
    );
    let keys = (PRODUCERS / 2 * SEQS) as usize;
    for view in RUNTIMES {
        let mut tapes = Vec::new();
        for node in &nodes {
            applied(node, last).await?;
            ensure!(
                node.metric("viewtape_cluster_records_total{kind=\"batches\"}")
                    .await?
                    >= 1.0
            );
            let tape = expect::tape(node, view, keys).await?;
            tapes.push(
                tape.iter()
                    .map(|event| (event.id.clone(), event.data.clone()))
                    .collect::<Vec<_>>(),
            );
        }
        ensure!(tapes[0] == tapes[1], "the nodes' {view} tapes differ");
        let mut seen: Vec<String> = tapes[0].iter().map(|(_, data)| data.clone()).collect();
        seen.sort();
        seen.dedup();
        ensure!(
            seen.len() == keys,
            "every {view} batch once: {} distinct",
            seen.len()
        );
    }
    Ok(())
}
