//! Runtimes as data on a cluster, end to end with a real `nats-server` and real `viewtape serve
//! --nats` nodes: a runtime created through one node runs on every node (fed through another,
//! read through a third, the same frames and cursors everywhere), outlives a restart and a
//! `kill -9` of a node whose config does not name it, and a `DELETE` through one node retires it
//! on every node.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use viewtape_tests::cluster::{admin_nodes, applied, position, CONVERGE};
use viewtape_tests::{expect, EventStream, NatsServer, Response, Server};

const TOKEN: &str = "cluster-runtimes-token";

/// The runtime every test creates: one `builtin:json` runtime for any number of rooms.
const CHAT: &str = r#"{"module":"builtin:json","views":["chat.*"]}"#;

/// The room the tests write to.
const ROOM: &str = "chat.room-1";

/// An admin request with the token.
async fn admin(server: &Server, method: &str, path: &str, body: &[u8]) -> anyhow::Result<Response> {
    server.admin(TOKEN, method, path, &[], body).await
}

/// Waits until `GET /admin/runtimes/{runtime}` on `server` answers `status`.
async fn runtime_status(server: &Server, runtime: &str, status: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let resp = admin(server, "GET", &format!("/admin/runtimes/{runtime}"), b"").await?;
        if resp.status() == status {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "GET /admin/runtimes/{runtime}: still {} {} after {CONVERGE:?}\n{}",
                resp.status(),
                resp.text(),
                server.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Creates `chat` through `server`, and waits until every node of `nodes` runs it.
async fn create_chat(server: &Server, nodes: &[&Server]) -> anyhow::Result<()> {
    let resp = admin(server, "PUT", "/admin/runtimes/chat", CHAT.as_bytes()).await?;
    ensure!(
        resp.status() == 201,
        "{} {}\n{}",
        resp.status(),
        resp.text(),
        server.logs()
    );
    for node in nodes {
        runtime_status(node, "chat", 200).await?;
    }
    Ok(())
}

/// Messages `from..to` into `ROOM`, as NDJSON.
fn messages(from: usize, to: usize) -> String {
    (from..to)
        .map(|i| {
            format!("{{\"view\":\"{ROOM}\",\"key\":\"m{i}\",\"value\":{{\"text\":\"hello {i}\",\"n\":{i}}}}}\n")
        })
        .collect()
}

/// Ingests `ndjson` into `chat` through `server`; the log position of the receipt.
async fn ingest_chat(server: &Server, ndjson: &str) -> anyhow::Result<u64> {
    let resp = server.ingest("chat", ndjson).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    position(&resp.json()?)
}

/// `GET /views/chat.room-1` on `server`: (cursor, entries).
async fn room_state(server: &Server) -> anyhow::Result<(String, serde_json::Value)> {
    let resp = server.get(&format!("/views/{ROOM}")).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let state = resp.json()?;
    let cursor = state["cursor"]
        .as_str()
        .with_context(|| format!("no cursor: {state}"))?
        .to_owned();
    Ok((cursor, state["entries"].clone()))
}

/// The first `n` frames of the tape of the room: (id, data) each.
async fn room_frames(server: &Server, n: usize) -> anyhow::Result<Vec<(String, String)>> {
    Ok(expect::tape(server, ROOM, n)
        .await?
        .into_iter()
        .map(|e| (e.id.unwrap_or_default(), e.data))
        .collect())
}

/// A live stream of the room, read past its state transfer.
async fn follow_room(server: &Server) -> anyhow::Result<EventStream> {
    let mut stream = server.sse(&format!("/views/{ROOM}/events"), &[]).await?;
    stream.until_synced(1_000).await?;
    Ok(stream)
}

/// Requires `server` to serve the room as `reference` does: the same state, cursor and tape
/// of `n` frames.
async fn same_room(
    server: &Server,
    reference: &(String, serde_json::Value),
    frames: &[(String, String)],
) -> anyhow::Result<()> {
    let state = room_state(server).await?;
    ensure!(
        state == *reference,
        "{state:?} != {reference:?}\n{}",
        server.logs()
    );
    ensure!(
        room_frames(server, frames.len()).await? == frames,
        "tapes differ"
    );
    Ok(())
}

/// Created through A, fed through B, read through C: every node has the same frames and
/// cursors; C restarted, and killed, on a config that does not name the runtime, serves it
/// still, with the same state, and goes on applying it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_created_through_one_node_runs_on_every_node() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let mut nodes = admin_nodes(&nats, TOKEN, 3).await?;
    {
        let all: Vec<&Server> = nodes.iter().collect();
        create_chat(&nodes[0], &all).await?;
    }
    // The room exists on every node before anything was written to it: an empty state.
    let mut live = Vec::new();
    for node in &nodes {
        live.push(follow_room(node).await?);
    }

    let last = ingest_chat(&nodes[1], &messages(0, 5)).await?;
    for node in &nodes {
        applied(node, last).await?;
    }
    let reference = room_state(&nodes[2]).await?;
    ensure!(
        reference.1.as_object().map(|e| e.len()) == Some(5),
        "{reference:?}"
    );
    ensure!(reference.1["m3"]["text"] == "hello 3", "{reference:?}");
    let frames = room_frames(&nodes[2], 5).await?;
    for node in &nodes {
        same_room(node, &reference, &frames).await?;
    }
    // Every live stream got the same frames, with the same ids.
    for (stream, node) in live.iter_mut().zip(&nodes) {
        for (id, data) in &frames {
            let event = stream.next_event().await.with_context(|| node.logs())?;
            ensure!(event.event == "update", "{event:?}");
            ensure!(
                event.id.as_deref() == Some(id.as_str()),
                "{event:?} != {id}"
            );
            ensure!(event.data == *data, "{event:?}");
        }
    }
    // A cursor from C resumes on A and B with nothing missed and nothing again.
    let cursor = expect::cursor_of(&expect::tape(&nodes[2], ROOM, 3).await?[2])?;
    for node in &nodes[..2] {
        let mut stream = node
            .sse(
                &format!("/views/{ROOM}/events"),
                &[("Last-Event-ID", &cursor.to_string())],
            )
            .await?;
        for (id, _) in &frames[3..] {
            let event = stream.next_event().await?;
            ensure!(event.id.as_deref() == Some(id.as_str()), "{event:?}");
        }
    }

    // C stopped and started again (its config names no `chat`): the runtime is there, as it
    // was, and C is ready.
    drop(live);
    nodes[2].stop_graceful().await?;
    nodes[2].restart().await?;
    nodes[2].ready(CONVERGE).await?;
    runtime_status(&nodes[2], "chat", 200).await?;
    same_room(&nodes[2], &reference, &frames).await?;

    // Killed after more messages: it comes back with them, and applies what follows.
    let last = ingest_chat(&nodes[0], &messages(5, 8)).await?;
    applied(&nodes[2], last).await?;
    nodes[2].kill9().await?;
    let more = ingest_chat(&nodes[1], &messages(8, 10)).await?;
    nodes[2].restart().await?;
    nodes[2].ready(CONVERGE).await?;
    for node in &nodes {
        applied(node, more).await?;
    }
    let reference = room_state(&nodes[0]).await?;
    ensure!(
        reference.1.as_object().map(|e| e.len()) == Some(10),
        "{reference:?}"
    );
    let frames = room_frames(&nodes[0], 10).await?;
    for node in &nodes {
        same_room(node, &reference, &frames).await?;
    }
    // And C takes ingest for it again.
    let last = ingest_chat(&nodes[2], &messages(10, 11)).await?;
    for node in &nodes {
        applied(node, last).await?;
    }
    Ok(())
}

/// A `DELETE` through one node: ingest answers `404` on every node, and the open streams of
/// every node end with `event: retired`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_deleted_through_one_node_is_retired_on_every_node() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let nodes = admin_nodes(&nats, TOKEN, 3).await?;
    let all: Vec<&Server> = nodes.iter().collect();
    create_chat(&nodes[0], &all).await?;
    let last = ingest_chat(&nodes[2], &messages(0, 3)).await?;
    for node in &nodes {
        applied(node, last).await?;
    }
    let mut live = Vec::new();
    for node in &nodes {
        live.push(follow_room(node).await?);
    }

    let resp = admin(&nodes[1], "DELETE", "/admin/runtimes/chat", b"").await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    for (stream, node) in live.iter_mut().zip(&nodes) {
        let event = stream.next_event().await.with_context(|| node.logs())?;
        ensure!(event.event == "retired", "{event:?}");
        ensure!(event.id.is_none(), "{event:?}");
        ensure!(
            stream.next_within(Duration::from_secs(5)).await?.is_none(),
            "the stream goes on after retired"
        );
    }
    for node in &nodes {
        runtime_status(node, "chat", 404).await?;
        let resp = node.ingest("chat", &messages(3, 4)).await?;
        expect::json_error(&resp, 404)?;
        ensure!(
            node.get(&format!("/views/{ROOM}")).await?.status() == 404,
            "{}",
            node.logs()
        );
    }
    // A second DELETE finds nothing; the nodes stay ready.
    let resp = admin(&nodes[2], "DELETE", "/admin/runtimes/chat", b"").await?;
    ensure!(resp.status() == 404, "{} {}", resp.status(), resp.text());
    for node in &nodes {
        ensure!(
            node.get("/readyz").await?.status() == 200,
            "{}",
            node.logs()
        );
    }
    Ok(())
}
