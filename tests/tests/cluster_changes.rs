//! A cluster does everything one node does, end to end with a real `nats-server` and real
//! `viewtape serve --nats` nodes: a deploy and a live restore sent to any node are records of
//! the stream that every node applies at the same position; a node started on another build
//! than the cluster acknowledges nothing and stops no one, and nor does one with a runtime the
//! others lack; a record a node cannot read stops
//! it, saying why, and is never skipped.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _};
use viewtape_tests::cluster::{
    admin_nodes, applied, frames, ingest_all, operator, position, view_frames, CONVERGE,
};
use viewtape_tests::server::{config_file, guest_wasm, with_custom_section};
use viewtape_tests::{expect, Feed, NatsServer, Response, Server};

const TOKEN: &str = "cluster-changes-token";

/// An admin request with the token.
async fn admin(server: &Server, method: &str, path: &str, body: &[u8]) -> anyhow::Result<Response> {
    server.admin(TOKEN, method, path, &[], body).await
}

/// The ticker with a custom section naming `build`: the same guest, another module.
fn ticker_build(build: &[u8]) -> anyhow::Result<Vec<u8>> {
    Ok(with_custom_section(
        &std::fs::read(guest_wasm("ticker"))?,
        "build",
        build,
    ))
}

/// `viewtape_runtime_deploys_total` of `demo` on `server`.
async fn deploys(server: &Server) -> anyhow::Result<f64> {
    server
        .metric("viewtape_runtime_deploys_total{runtime=\"demo\"}")
        .await
}

/// `GET /views/prices` on `server`: (cursor, entries).
async fn state(server: &Server) -> anyhow::Result<(String, serde_json::Value)> {
    let state = server.get("/views/prices").await?.json()?;
    let cursor = state["cursor"]
        .as_str()
        .with_context(|| format!("no cursor: {state}"))?
        .to_owned();
    Ok((cursor, state["entries"].clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_through_one_node_switches_every_node_with_no_reset() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let nodes = admin_nodes(&nats, TOKEN, 3).await?;
    let mut feed = Feed::new(&["ACME", "BOLT", "CRUX"]);
    ingest_all(&nodes, &mut feed, 3, 2).await?;
    let cursor = expect::cursor_of(&expect::tape(&nodes[0], "prices", 6).await?[5])?;
    let mut streams = Vec::new();
    for node in &nodes {
        streams.push(expect::resumes(node, "prices", &cursor).await?);
    }

    // A new build through node A: every node fetches it and switches at the deploy's position.
    let resp = admin(
        &nodes[0],
        "PUT",
        "/admin/runtimes/demo/module",
        &ticker_build(b"2")?,
    )
    .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let deployed = resp.json()?;
    let at = deployed["position"].as_u64().context("a position")?;
    for node in &nodes {
        applied(node, at).await?;
        ensure!(deploys(node).await? == 1.0, "{}", node.logs());
    }

    // Batches through B go on from every subscriber's cursor: no reset, no gap.
    let receipt = nodes[1].ingest_ok(&feed.batch(3)).await?;
    ensure!(position(&receipt)? > at, "{receipt}");
    for (stream, node) in streams.iter_mut().zip(&nodes) {
        for n in 1..=3 {
            let event = stream.next_event().await?;
            expect::update(
                &event,
                cursor.offset().get() + n,
                feed.symbol_of(6 + n),
                6 + n,
            )
            .with_context(|| node.logs())?;
        }
    }
    let tape = frames(&nodes[0], 9).await?;
    for node in &nodes[1..] {
        applied(node, position(&receipt)?).await?;
        ensure!(frames(node, 9).await? == tape, "tapes differ");
    }

    // A build that refuses the state is refused, with the reason, and nothing changes.
    let logstats = std::fs::read(guest_wasm("logstats"))?;
    let resp = admin(&nodes[2], "PUT", "/admin/runtimes/demo/module", &logstats).await?;
    let body = expect::json_error(&resp, 422)?;
    ensure!(body["error"] == "module_refused", "{body}");
    ingest_all(&nodes, &mut feed, 1, 1).await?;
    for node in &nodes {
        ensure!(deploys(node).await? == 1.0, "{}", node.logs());
        ensure!(frames(node, 10).await? == frames(&nodes[0], 10).await?);
        ensure!(node.logs().contains("deploy refused"), "{}", node.logs());
    }

    // A node killed after the deploy rejoins on the deployed build, with the same tape.
    let last = expect::cursor_of(&expect::tape(&nodes[0], "prices", 10).await?[9])?;
    let mut nodes = nodes;
    nodes[2].kill9().await?;
    nodes[2].restart().await?;
    nodes[2].ready(CONVERGE).await?;
    let mut stream = expect::resumes(&nodes[2], "prices", &last).await?;
    let receipt = nodes[0].ingest_ok(&feed.batch(1)).await?;
    expect::update(
        &stream.next_event().await?,
        last.offset().get() + 1,
        feed.symbol_of(11),
        11,
    )?;
    applied(&nodes[2], position(&receipt)?).await?;
    ensure!(frames(&nodes[2], 11).await? == frames(&nodes[0], 11).await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_restore_through_one_node_restores_every_node_under_one_cursor() -> anyhow::Result<()>
{
    let nats = NatsServer::start().await?;
    let mut nodes = admin_nodes(&nats, TOKEN, 3).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    ingest_all(&nodes, &mut feed, 3, 2).await?;
    let (_, snapshot_state) = state(&nodes[2]).await?;

    // Node C writes a snapshot; it is shared in the bucket under its file's name.
    let resp = admin(&nodes[2], "POST", "/admin/snapshot", b"").await?;
    ensure!(resp.status() == 200, "{}", resp.text());
    let name = resp.json()?["name"].as_str().context("a name")?.to_owned();
    let bucket = operator(&nats)
        .await?
        .get_object_store("viewtape-snapshots")
        .await?;
    let deadline = Instant::now() + CONVERGE;
    loop {
        let mut list = bucket.list().await?;
        let mut shared = false;
        while let Some(object) = futures_util::StreamExt::next(&mut list).await {
            shared |= object?.description.as_deref() == Some(name.as_str());
        }
        if shared {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "not shared:\n{}",
            nodes[2].logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ingest_all(&nodes, &mut feed, 3, 2).await?;
    let old = expect::cursor_of(&expect::tape(&nodes[0], "prices", 12).await?[11])?;

    // Restored through B, which never had the file: every node restores it at the record's
    // position, under one new epoch.
    let body = format!("{{\"name\": {name:?}}}");
    let resp = admin(&nodes[1], "POST", "/admin/restore", body.as_bytes()).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let restored = resp.json()?;
    let epoch = restored["epoch"].as_str().context("an epoch")?.to_owned();
    let at = restored["position"].as_u64().context("a position")?;
    let deadline = Instant::now() + CONVERGE;
    let mut cursors = Vec::new();
    for node in &nodes {
        let (cursor, entries) = loop {
            let (cursor, entries) = state(node).await?;
            if cursor.starts_with(&epoch) {
                break (cursor, entries);
            }
            ensure!(Instant::now() < deadline, "not restored:\n{}", node.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        ensure!(entries == snapshot_state, "{entries} vs {snapshot_state}");
        cursors.push(cursor);
        let mut stream = node
            .sse(
                "/views/prices/events",
                &[("Last-Event-ID", &old.to_string())],
            )
            .await?;
        expect::reset(&stream.next_event().await?, "stale_epoch")?;
    }
    ensure!(cursors.iter().all(|c| *c == cursors[0]), "{cursors:?}");

    // A node killed after it rejoins the same state and cursor from the snapshot it wrote at
    // the restore, even once the stream no longer holds anything before it; and the tapes go
    // on alike.
    nodes[2].kill9().await?;
    operator(&nats)
        .await?
        .get_stream("viewtape")
        .await?
        .purge()
        .sequence(at + 1)
        .await?;
    nodes[2].restart().await?;
    nodes[2].ready(CONVERGE).await?;
    ensure!(state(&nodes[2]).await?.0 == cursors[0]);
    let new = viewtape_tests::parse_cursor(&cursors[0])?;
    let mut stream = expect::resumes(&nodes[2], "prices", &new).await?;
    // The guest's state is the snapshot's too: its ticks go on after the snapshot's sixth.
    let mut after = Feed::new(&["ACME", "BOLT"]);
    after.batch(6);
    let receipt = nodes[0].ingest_ok(&after.batch(1)).await?;
    let event = stream.next_event().await?;
    expect::update(&event, new.offset().get() + 1, after.symbol_of(7), 7)?;
    for node in &nodes {
        applied(node, position(&receipt)?).await?;
    }
    let tape = frames(&nodes[0], 7).await?;
    for node in &nodes[1..] {
        ensure!(frames(node, 7).await? == tape);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_on_another_build_acknowledges_nothing_and_stops_no_one() -> anyhow::Result<()> {
    // Another build for `demo` (a config mistake, or one node restarted on a new build).
    let dir = tempfile::tempdir()?;
    let wasm = dir.path().join("ticker.wasm");
    std::fs::write(&wasm, ticker_build(b"rogue")?)?;
    let runtime = format!(
        "[[runtime]]\nname = \"demo\"\nwasm = {:?}\nviews = [\"prices\"]\n",
        wasm.display().to_string()
    );
    a_rogue_node_acknowledges_nothing_and_stops_no_one(&runtime, "deploy", true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_another_guest_config_acknowledges_nothing_and_stops_no_one(
) -> anyhow::Result<()> {
    // The cluster's module, with another `config =` for its guest.
    let runtime = "[[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\nconfig = \"rogue\"\n";
    // It cannot reproduce the cluster's batches with its own config, so it stops applying too.
    a_rogue_node_acknowledges_nothing_and_stops_no_one(runtime, "guest config", false).await
}

/// Two healthy nodes, then a third whose config has `runtime` for `demo`, hammered with ingest
/// from its first second: it acknowledges nothing, says why in `/readyz` (naming `says`), the
/// healthy nodes stay ready and agree, and (if it `applies`) it applies their history meanwhile.
async fn a_rogue_node_acknowledges_nothing_and_stops_no_one(
    runtime: &str,
    says: &str,
    applies: bool,
) -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let healthy = admin_nodes(&nats, TOKEN, 2).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    ingest_all(&healthy, &mut feed, 3, 2).await?;

    let config = config_file(runtime)?;
    let path = config.path().display().to_string();
    let rogue = Server::start(&["--nats", &nats.url(), "--config", &path]).await?;
    // Hammered with ingest from its first second, while the healthy nodes take theirs.
    let mut rogue_feed = Feed::new(&["ROGUE"]);
    let until = Instant::now() + Duration::from_secs(6);
    let mut refused = 0;
    while Instant::now() < until {
        let resp = rogue.ingest("demo", &rogue_feed.batch(1)).await?;
        ensure!(
            resp.status() != 200,
            "the rogue node acknowledged: {}",
            resp.text()
        );
        refused += 1;
        healthy[refused % 2].ingest_ok(&feed.batch(1)).await?;
    }
    let readyz = rogue.get("/readyz").await?;
    ensure!(readyz.status() == 503, "{}", readyz.text());
    let body = readyz.json()?;
    let reason = ["refused", "broken"].map(|k| body[k].as_str().unwrap_or_default().to_owned());
    ensure!(reason.iter().any(|r| r.contains(says)), "{body}");

    // The healthy nodes stay ready, agree, and the rogue applies the same stream meanwhile.
    let receipt = healthy[0].ingest_ok(&feed.batch(1)).await?;
    let last = position(&receipt)?;
    let appliers = if applies { &[&rogue][..] } else { &[] };
    for node in healthy.iter().chain(appliers.iter().copied()) {
        applied(node, last).await?;
    }
    for node in &healthy {
        ensure!(
            node.get("/readyz").await?.status() == 200,
            "{}",
            node.logs()
        );
    }
    let n = 6 + refused + 1;
    let tape = frames(&healthy[0], n).await?;
    ensure!(
        frames(&healthy[1], n).await? == tape,
        "healthy tapes differ"
    );
    ensure!(
        !applies || frames(&rogue, n).await? == tape,
        "the rogue node applies another history"
    );
    ensure!(rogue.get("/readyz").await?.status() == 503);
    ensure!(
        !tape.iter().any(|(_, data)| data.contains("ROGUE")),
        "a rogue batch reached the tape"
    );
    Ok(())
}

/// The cluster's `demo`, and `notes` (no guest) besides.
const WITH_NOTES: &str =
    "[[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n\n\
     [[runtime]]\nname = \"notes\"\nwasm = \"builtin:json\"\nviews = [\"notes\"]\n";

/// A node joining with a runtime in its config that the cluster lacks declares it by a define
/// record: every node runs it from then on, at the same positions, and stays ready; its views
/// are fed and read through any node, and a node that joins later with a config lacking it
/// serves it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joining_with_an_extra_runtime_makes_every_node_run_it() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let healthy = admin_nodes(&nats, TOKEN, 2).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    ingest_all(&healthy, &mut feed, 3, 2).await?;

    let config = config_file(WITH_NOTES)?;
    let path = config.path().display().to_string();
    let extra = Server::start(&["--nats", &nats.url(), "--config", &path]).await?;
    extra.ready(CONVERGE).await?;
    // Ready once it applied its record: the others run `notes` once they have applied as far.
    let defined = extra.get("/readyz").await?.json()?["applied"]
        .as_u64()
        .context("applied")?;
    for node in &healthy {
        applied(node, defined).await?;
    }
    // Every node runs `notes` now: fed through each node in turn, prices beside it.
    let mut last = 0;
    let nodes = [&healthy[0], &healthy[1], &extra];
    for i in 0..12 {
        let note = format!("{{\"view\":\"notes\",\"key\":\"n{i}\",\"value\":{i}}}\n");
        let resp = nodes[i % 3].ingest("notes", &note).await?;
        ensure!(
            resp.status() == 200,
            "{}\n{}",
            resp.text(),
            nodes[i % 3].logs()
        );
        last = position(&nodes[(i + 1) % 3].ingest_ok(&feed.batch(1)).await?)?;
    }
    let late = Server::start(&["--nats", &nats.url()]).await?;
    late.ready(CONVERGE).await?;
    let nodes = [&healthy[0], &healthy[1], &extra, &late];
    for node in nodes {
        applied(node, last).await?;
        let readyz = node.get("/readyz").await?;
        ensure!(readyz.status() == 200, "{}\n{}", readyz.text(), node.logs());
        ensure!(
            readyz.json()?["passed_over"] == serde_json::json!([]),
            "{}",
            readyz.text()
        );
        let notes = node.get("/views/notes").await?;
        ensure!(notes.status() == 200, "{}", notes.text());
        let entries = notes.json()?["entries"].clone();
        ensure!(
            entries.as_object().map(|e| e.len()) == Some(12),
            "{entries}"
        );
    }
    let prices = 6 + 12;
    let tape = frames(&healthy[0], prices).await?;
    for node in &nodes[1..] {
        ensure!(
            frames(node, prices).await? == tape,
            "the tapes of prices differ"
        );
    }
    let notes = view_frames(&healthy[0], "notes", 12).await?;
    for node in &nodes[1..] {
        ensure!(
            view_frames(node, "notes", 12).await? == notes,
            "the tapes of notes differ"
        );
    }
    // The definition is the extra node's config, shown by every node.
    let definition = admin(&healthy[1], "GET", "/admin/runtimes/notes", b"").await?;
    ensure!(definition.status() == 200, "{}", definition.text());
    ensure!(
        definition.json()?["module"] == "builtin:json",
        "{}",
        definition.text()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_a_node_cannot_read_stops_it_and_says_why() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let nodes = admin_nodes(&nats, TOKEN, 2).await?;
    let mut feed = Feed::new(&["ACME"]);
    ingest_all(&nodes, &mut feed, 2, 1).await?;
    let before = frames(&nodes[0], 2).await?;

    // A record of a kind no node knows (as a newer viewtape would publish).
    let js = operator(&nats).await?;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Viewtape-Record", "1");
    js.publish_with_headers(
        "viewtape.in.demo",
        headers,
        "a record of a later kind".into(),
    )
    .await?
    .await?;
    for node in &nodes {
        let deadline = Instant::now() + CONVERGE;
        loop {
            let resp = node.get("/readyz").await?;
            if resp.status() == 503 {
                let body = resp.json()?;
                let broken = body["broken"].as_str().unwrap_or_default();
                ensure!(broken.contains("cannot read"), "{body}");
                break;
            }
            ensure!(Instant::now() < deadline, "still ready:\n{}", node.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // It takes nothing more and skips nothing: its tape stays as it was.
        expect::json_error(&node.ingest("demo", &feed.batch(1)).await?, 503)?;
        ensure!(frames(node, 2).await? == before);
    }
    Ok(())
}
