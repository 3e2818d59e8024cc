//! JavaScript guests on a cluster, end to end with a real `nats-server`: a JS module posted to
//! one node runs on every node, and a guest that calls `Date.now()` and `Math.random()`
//! publishes the same frames on every node (deterministic by construction: the time is the
//! batch's, as logged).

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use serde_json::json;
use viewtape_tests::cluster::{applied, position, CONVERGE};
use viewtape_tests::server::ADMIN_TOKEN_ENV;
use viewtape_tests::{expect, NatsServer, Response, Server};

const TOKEN: &str = "js-cluster-token";

/// Publishes, for every input line, the clock and two random draws.
const DRAWS: &str = r#"
export function onBatch(state, input, ctx) {
  for (const line of input.split('\n')) {
    if (!line) continue;
    ctx.publish('draws', line, {
      now: Date.now(),
      date: new Date().toISOString(),
      random: [Math.random(), Math.random()],
    });
  }
}
"#;

async fn admin(
    server: &Server,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> anyhow::Result<Response> {
    let headers = [("Content-Type", content_type)];
    server.admin(TOKEN, method, path, &headers, body).await
}

/// Waits until `runtime` exists on `server`.
async fn runtime_exists(server: &Server, runtime: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + CONVERGE;
    let path = format!("/admin/runtimes/{runtime}");
    loop {
        let resp = admin(server, "GET", &path, "application/json", b"").await?;
        if resp.status() == 200 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{runtime} not on {}: {}", server.addr(), resp.text());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_publish_the_same_frames_from_date_and_random() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let url = nats.url();
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let node = Server::start_with_env(&["--nats", &url], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
        node.ready(CONVERGE).await?;
        nodes.push(node);
    }

    // The module is posted to one node, the runtime made on the other.
    let kept = admin(
        &nodes[0],
        "POST",
        "/admin/modules",
        "text/javascript",
        DRAWS.as_bytes(),
    )
    .await?;
    ensure!(kept.status() == 200, "{} {}", kept.status(), kept.text());
    let kept = kept.json()?;
    ensure!(kept["kind"] == "js", "{kept}");
    let definition = json!({"module": kept["module"], "views": ["draws"]});
    let made = admin(
        &nodes[1],
        "PUT",
        "/admin/runtimes/rand",
        "application/json",
        definition.to_string().as_bytes(),
    )
    .await?;
    ensure!(made.status() == 201, "{} {}", made.status(), made.text());
    for node in &nodes {
        runtime_exists(node, "rand").await?;
    }

    // Batches through both nodes.
    let unix_ms = || -> anyhow::Result<u64> {
        Ok(u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis(),
        )?)
    };
    let before = unix_ms()?;
    let mut last = 0;
    for batch in 0..6 {
        let body = format!("k{batch}a\nk{batch}b\n");
        let resp = nodes[batch % 2].ingest("rand", &body).await?;
        ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
        last = position(&resp.json()?)?;
    }
    let after = unix_ms()?;
    for node in &nodes {
        applied(node, last).await?;
    }
    let tape = |events: Vec<viewtape_tests::SseEvent>| -> Vec<(Option<String>, String)> {
        events.into_iter().map(|e| (e.id, e.data)).collect()
    };
    let first = tape(expect::tape(&nodes[0], "draws", 12).await?);
    let second = tape(expect::tape(&nodes[1], "draws", 12).await?);
    ensure!(first == second, "the nodes differ:\n{first:?}\n{second:?}");

    // The draws are numbers in [0, 1), not one number repeated; the clock is one value.
    let values: Vec<serde_json::Value> = first
        .iter()
        .map(|(_, data)| Ok(serde_json::from_str::<serde_json::Value>(data)?["value"].clone()))
        .collect::<anyhow::Result<_>>()?;
    let mut draws = Vec::new();
    for value in &values {
        for r in value["random"].as_array().context("random")? {
            let r = r.as_f64().context("a number")?;
            ensure!((0.0..1.0).contains(&r), "{value}");
            draws.push(r.to_bits());
        }
    }
    draws.sort_unstable();
    draws.dedup();
    ensure!(draws.len() == 24, "every draw differs: {values:?}");
    // Date.now() and new Date() are the batch's ingest time as logged: within the time the
    // batches were sent, one value per batch, the same on both nodes (the tapes are equal).
    for value in &values {
        let now = value["now"].as_u64().context("now")?;
        ensure!(
            (before..=after).contains(&now),
            "{before}..{after}: {value}"
        );
        let date = value["date"].as_str().context("date")?;
        ensure!(date.ends_with('Z') && date.starts_with("20"), "{value}");
    }
    for pair in values.chunks(2) {
        ensure!(
            pair[0]["now"] == pair[1]["now"],
            "one time per batch: {pair:?}"
        );
    }
    Ok(())
}
