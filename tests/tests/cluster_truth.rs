//! One truth for what runs, on a cluster of real `viewtape serve --nats` nodes on a real
//! `nats-server`: a deploy through one node is the build another node runs after a snapshot
//! and a restart, so the next deploy and the next batch are the same on both (frames, ids,
//! `/readyz`, module); a runtime created through one node is read through another with the
//! position its `PUT` answered, never a `404`.

use anyhow::{ensure, Context as _};
use serde_json::{json, Value};
use viewtape_tests::cluster::{admin_node, admin_nodes, applied, operator, position, CONVERGE};
use viewtape_tests::server::js_counter;
use viewtape_tests::{expect, NatsServer, Server};

const TOKEN: &str = "cluster-truth-token";

/// An admin request that must answer `status`; its JSON body.
async fn admin_ok(
    server: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    status: u16,
) -> anyhow::Result<Value> {
    let resp = server.admin(TOKEN, method, path, headers, body).await?;
    ensure!(
        resp.status() == status,
        "{method} {path}: {} {}\n{}",
        resp.status(),
        resp.text(),
        server.logs()
    );
    resp.json()
}

/// Deploys build `build` of the counter through `server`; the deploy's answer.
async fn deploy(server: &Server, build: u32) -> anyhow::Result<Value> {
    admin_ok(
        server,
        "PUT",
        "/admin/runtimes/counter/module",
        &[("Content-Type", "text/javascript")],
        js_counter(build).as_bytes(),
        200,
    )
    .await
}

/// What `server` says of the counter: its module, its state of `count` and its tape.
async fn seen(
    server: &Server,
    frames: usize,
) -> anyhow::Result<(Value, Value, Vec<(String, String)>)> {
    let runtime = admin_ok(server, "GET", "/admin/runtimes/counter", &[], b"", 200).await?;
    let state = server.get("/views/count").await?.json()?;
    let tape = expect::tape(server, "count", frames)
        .await?
        .into_iter()
        .map(|e| (e.id.unwrap_or_default(), e.data))
        .collect();
    Ok((runtime["module"].clone(), state, tape))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_through_one_node_is_what_a_restarted_node_runs() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let mut nodes = admin_nodes(&nats, TOKEN, 2).await?;
    let uploaded = admin_ok(
        &nodes[0],
        "POST",
        "/admin/modules",
        &[("Content-Type", "text/javascript")],
        js_counter(1).as_bytes(),
        200,
    )
    .await?;
    let made = admin_ok(
        &nodes[0],
        "PUT",
        "/admin/runtimes/counter",
        &[],
        json!({"module": uploaded["module"], "views": ["count"]})
            .to_string()
            .as_bytes(),
        201,
    )
    .await?;
    let made_at = made["position"].as_u64().context("a position")?;
    for node in &nodes {
        applied(node, made_at).await?;
    }
    let mut last = 0;
    for _ in 0..2 {
        let resp = nodes[0].ingest("counter", "tick\n").await?;
        ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
        last = position(&resp.json()?)?;
    }
    // Build 2, deployed through B, applied by A; then A snapshots and restarts.
    let deployed = deploy(&nodes[1], 2).await?;
    let second = deployed["module"].clone();
    let deployed_at = deployed["position"].as_u64().context("a position")?;
    for node in &nodes {
        applied(node, deployed_at.max(last)).await?;
    }
    admin_ok(&nodes[0], "POST", "/admin/snapshot", &[], b"", 200).await?;
    nodes[0].stop_graceful().await?;
    nodes[0].restart().await?;
    nodes[0].ready(CONVERGE).await?;

    // The next deploy (through A) and the next batch (through B) are the same on both nodes.
    let deployed = deploy(&nodes[0], 3).await?;
    ensure!(deployed["previous"] == second, "{deployed}");
    let resp = nodes[1].ingest("counter", "tick\n").await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let last = position(&resp.json()?)?;
    for node in &nodes {
        applied(node, last).await?;
    }
    let reference = seen(&nodes[1], 3).await?;
    ensure!(
        reference.1["entries"]["c"] == json!({"count": 3, "build": 3}),
        "{reference:?}"
    );
    ensure!(reference.0 == deployed["module"], "{reference:?}");
    for node in &nodes {
        ensure!(seen(node, 3).await? == reference, "{}", node.logs());
        let ready = node.get("/readyz").await?;
        ensure!(ready.status() == 200, "{}", ready.text());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_through_one_node_is_read_through_another_after_its_position() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let nodes = admin_nodes(&nats, TOKEN, 2).await?;
    for i in 0..10 {
        let made = admin_ok(
            &nodes[0],
            "PUT",
            &format!("/admin/runtimes/rt{i}"),
            &[],
            json!({"module": "builtin:json", "views": [format!("v{i}")]})
                .to_string()
                .as_bytes(),
            201,
        )
        .await?;
        let at = made["position"].as_u64().context("a position")?;
        let read = nodes[1].get(&format!("/views/v{i}?after={at}")).await?;
        ensure!(read.status() == 200, "{} {}", read.status(), read.text());
        let stream = nodes[1]
            .get(&format!("/views/v{i}/events?after={at}&until=head"))
            .await?;
        ensure!(
            stream.status() == 200,
            "{} {}",
            stream.status(),
            stream.text()
        );
    }
    Ok(())
}

/// Three nodes started in the same moment on a fresh stream, ten times: each settles (the
/// demo's runtime declared by one of them, taken by the others) and is ready, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_started_together_all_become_ready() -> anyhow::Result<()> {
    for round in 0..10 {
        let nats = NatsServer::start().await?;
        let url = nats.url();
        let args = ["--nats", url.as_str()];
        let (a, b, c) = tokio::join!(
            Server::start(&args),
            Server::start(&args),
            Server::start(&args)
        );
        let nodes = [a?, b?, c?];
        for node in &nodes {
            node.ready(CONVERGE)
                .await
                .with_context(|| format!("round {round}:\n{}", node.logs()))?;
        }
        let resp = nodes[2]
            .ingest("demo", "{\"symbol\":\"ACME\",\"price\":1.5,\"seq\":1}\n")
            .await?;
        ensure!(
            resp.status() == 200,
            "round {round}: {} {}",
            resp.status(),
            resp.text()
        );
        let last = position(&resp.json()?)?;
        for node in &nodes {
            applied(node, last).await?;
        }
    }
    Ok(())
}

/// Ingest through one node while another replaces the runtime again and again: every batch
/// answered `200` is served, every one answered `503 unavailable` is not (and never will be),
/// and none waits past the apply timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_replacement_churn_a_refusal_means_not_applied() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let nodes = admin_nodes(&nats, TOKEN, 2).await?;
    let define = json!({"module": "builtin:json", "views": ["churn"]}).to_string();
    let made = admin_ok(
        &nodes[1],
        "PUT",
        "/admin/runtimes/churn",
        &[],
        define.as_bytes(),
        201,
    )
    .await?;
    applied(&nodes[0], made["position"].as_u64().context("a position")?).await?;
    let addr = nodes[1].addr();
    let churn = tokio::spawn(async move {
        let auth = format!("Bearer {TOKEN}");
        for i in 0..40 {
            let body = json!({"module": "builtin:json", "views": ["churn"], "limits": {"fuel": 1_000_000_000 + i}}).to_string();
            let resp = viewtape_tests::http::request(
                addr,
                "PUT",
                "/admin/runtimes/churn",
                &[("Authorization", &auth)],
                body.as_bytes(),
            )
            .await?;
            ensure!(
                resp.status() == 200 || resp.status() == 503,
                "{} {}",
                resp.status(),
                resp.text()
            );
        }
        Ok::<_, anyhow::Error>(())
    });
    let mut answers = Vec::new();
    for i in 0..200 {
        let line = format!(
            "{}\n",
            json!({"view": "churn", "key": format!("k{i}"), "value": i})
        );
        let sent = std::time::Instant::now();
        let resp = nodes[0].ingest("churn", &line).await?;
        ensure!(
            sent.elapsed() < std::time::Duration::from_secs(8),
            "k{i} took {:?}",
            sent.elapsed()
        );
        let code = match resp.status() {
            200 => "ok".to_owned(),
            _ => {
                let body = resp.json()?;
                ensure!(body["error"] != "not_found", "k{i}: {body}");
                body["error"].as_str().unwrap_or_default().to_owned()
            }
        };
        answers.push(code);
        if churn.is_finished() && i >= 50 {
            break;
        }
    }
    churn.await??;
    // A last batch through each node: both have applied everything before it.
    let resp = nodes[1]
        .ingest(
            "churn",
            "{\"view\":\"churn\",\"key\":\"last\",\"value\":0}\n",
        )
        .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let last = position(&resp.json()?)?;
    for node in &nodes {
        applied(node, last).await?;
    }
    let state = nodes[0].get("/views/churn").await?.json()?;
    let entries = &state["entries"];
    for (i, code) in answers.iter().enumerate() {
        let served = !entries[format!("k{i}")].is_null();
        match code.as_str() {
            "ok" => ensure!(served, "k{i} was acknowledged but is not served: {state}"),
            "unavailable" => ensure!(!served, "k{i} was refused but applied"),
            "outcome_unknown" => {}
            other => anyhow::bail!("k{i}: {other}"),
        }
    }
    ensure!(nodes[1].get("/views/churn").await?.json()?["entries"] == *entries);
    Ok(())
}

/// A JavaScript guest with a module-level variable and a `Set`: what an instance's history
/// would change.
const HISTORY_JS: &str = r#"
let calls = 0;
const seen = new Set();
export function init() { return { n: 0 }; }
export function onBatch(state, input, ctx) {
  calls += 1;
  for (const word of input.split('\n').filter(Boolean)) seen.add(word);
  state.n += 1;
  ctx.publish('history', 'k', { calls, seen: seen.size, n: state.n });
}
"#;

/// Two words into `history` through `server`; the batch's position.
async fn tick(server: &Server, word: u32) -> anyhow::Result<u64> {
    let resp = server
        .ingest("history", &format!("w{word}\nw{}\n", word + 1))
        .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    position(&resp.json()?)
}

/// The frames of view `history` on `server` once it applied `position`: ids and data.
async fn history(
    server: &Server,
    position: u64,
    n: usize,
) -> anyhow::Result<Vec<(String, String)>> {
    applied(server, position).await?;
    Ok(expect::tape(server, "history", n)
        .await?
        .into_iter()
        .map(|e| (e.id.unwrap_or_default(), e.data))
        .collect())
}

/// A node that joins from a snapshot another node shared serves the frames every other node
/// serves, under the same cursors: the guest's output does not depend on how long an instance
/// ran before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joining_from_a_shared_snapshot_serves_the_same_frames() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let first = admin_node(&nats, TOKEN, &[]).await?;
    let uploaded = admin_ok(
        &first,
        "POST",
        "/admin/modules",
        &[("Content-Type", "text/javascript")],
        HISTORY_JS.as_bytes(),
        200,
    )
    .await?;
    let definition = json!({"module": uploaded["module"], "views": ["history"]});
    admin_ok(
        &first,
        "PUT",
        "/admin/runtimes/history",
        &[],
        definition.to_string().as_bytes(),
        201,
    )
    .await?;
    for word in 0..5 {
        tick(&first, word).await?;
    }
    admin_ok(&first, "POST", "/admin/snapshot", &[], b"", 200).await?;
    let mut last = 0;
    for word in 5..9 {
        last = tick(&first, word).await?;
    }
    let late = admin_node(&nats, TOKEN, &[]).await?;
    ensure!(
        late.logs().contains("restored snapshot"),
        "the late node started from the shared snapshot:\n{}",
        late.logs()
    );
    for word in 9..12 {
        last = tick(&late, word).await?;
    }
    let expected = history(&first, last, 12).await?;
    ensure!(
        history(&late, last, 12).await? == expected,
        "{}",
        late.logs()
    );
    let state = late.get("/views/history").await?.json()?;
    ensure!(
        state["entries"]["k"] == json!({"calls": 1, "seen": 2, "n": 12}),
        "{state}"
    );
    // And the nodes checked it: what each applied at the same check points agreed.
    let checks = |outcome: &str| format!("viewtape_cluster_checks_total{{outcome=\"{outcome}\"}}");
    ensure!(
        late.metric(&checks("agreed")).await? >= 1.0,
        "{}",
        late.logs()
    );
    for node in [&first, &late] {
        ensure!(node.metric(&checks("differed")).await? == 0.0);
        ensure!(node.get("/readyz").await?.json()?.get("halted").is_none());
    }
    Ok(())
}

/// A node that applied something else than the first node to check a batch halts that runtime
/// alone: its views take nothing more there, their readers are reset, and every other runtime
/// goes on. (The reference is forged here, as a diverged node would have written it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_applied_something_else_halts_that_runtime_alone() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let node = admin_node(&nats, TOKEN, &[]).await?;
    for name in ["chat", "notes"] {
        let definition = json!({"module": "builtin:json", "views": [name]});
        let path = format!("/admin/runtimes/{name}");
        admin_ok(
            &node,
            "PUT",
            &path,
            &[],
            definition.to_string().as_bytes(),
            201,
        )
        .await?;
    }
    let line = |n: u32| format!("{{\"key\":\"k{n}\",\"value\":{n}}}\n");
    let resp = node.ingest("chat", &line(0)).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let first = expect::cursor_of(&expect::tape(&node, "chat", 1).await?[0])?;

    // The next sequences of the stream, as another node would have checked them.
    let js = operator(&nats).await?;
    let last = js
        .get_stream("viewtape")
        .await?
        .info()
        .await?
        .state
        .last_sequence;
    let bucket = js.get_key_value("viewtape-checks").await?;
    let runtime: String = "chat".bytes().map(|b| format!("{b:02x}")).collect();
    for sequence in last + 1..=last + 9 {
        let key = format!("{runtime}.{sequence}");
        bucket
            .create(&key, "1 00000000 00000000 elsewhere".into())
            .await?;
    }
    // Within 9 sequences a batch begins a band of 8: a check point.
    let mut ready = Value::Null;
    for n in 1..=9 {
        let resp = node.ingest("chat", &line(n)).await?;
        ensure!(
            resp.status() == 200 || resp.status() == 503,
            "{} {}",
            resp.status(),
            resp.text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        ready = node.get("/readyz").await?.json()?;
        if ready.get("halted").is_some() {
            break;
        }
    }
    let reason = ready["halted"]["chat"]["reason"]
        .as_str()
        .unwrap_or_default();
    let metrics = node.get("/metrics").await?.text();
    let checks: Vec<&str> = metrics.lines().filter(|l| l.contains("checks")).collect();
    ensure!(
        reason.contains("elsewhere"),
        "{ready}\n{checks:?}\n{}",
        node.logs()
    );
    ensure!(ready["ready"] == true, "{ready}");
    ensure!(
        node.metric("viewtape_cluster_checks_total{outcome=\"differed\"}")
            .await?
            == 1.0
    );
    ensure!(
        node.metric("viewtape_runtime_halted{runtime=\"chat\"}")
            .await?
            == 1.0
    );
    // Its readers are reset; it takes nothing more; another runtime goes on.
    expect::refused(&node, "chat", &first).await?;
    let resp = node.ingest("chat", &line(10)).await?;
    let error = expect::json_error(&resp, 503)?;
    ensure!(error["error"] == "runtime_halted", "{error}");
    let resp = node.ingest("notes", &line(11)).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    ensure!(
        node.metric("viewtape_runtime_halted{runtime=\"notes\"}")
            .await?
            == 0.0
    );
    Ok(())
}

/// A deploy whose module a node can neither find in its store nor fetch from the bucket halts
/// that runtime on that node alone: the node stays ready and serves every other runtime, and the
/// other nodes run the deploy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_a_node_cannot_load_halts_that_runtime_there_alone() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let mut nodes = admin_nodes(&nats, TOKEN, 2).await?;
    let mut second = nodes.pop().context("two nodes")?;
    let first = &nodes[0];
    for name in ["chat", "notes"] {
        let definition = json!({"module": "builtin:json", "views": [name]});
        let path = format!("/admin/runtimes/{name}");
        let body = definition.to_string();
        admin_ok(first, "PUT", &path, &[], body.as_bytes(), 201).await?;
    }
    let line = |n: u32| format!("{{\"key\":\"k{n}\",\"value\":{n}}}\n");
    let receipt = ingested(first, "chat", &line(0)).await?;
    applied(&second, position(&receipt)?).await?;
    second.stop_graceful().await?;

    // Another build of the module, deployed while the second node is down, then gone from
    // the bucket: only the first node holds it.
    let build = viewtape_tests::server::with_custom_section(
        &std::fs::read(viewtape_tests::server::guest_wasm("json"))?,
        "build",
        b"2",
    );
    let path = "/admin/runtimes/chat/module";
    admin_ok(first, "PUT", path, &[], &build, 200).await?;
    let bucket = operator(&nats)
        .await?
        .get_object_store("viewtape-snapshots")
        .await?;
    let mut modules = Vec::new();
    let mut list = bucket.list().await?;
    while let Some(object) = futures_util::StreamExt::next(&mut list).await {
        modules.extend(Some(object?.name).filter(|name| name.starts_with("module-")));
    }
    for name in modules {
        bucket.delete(&name).await?;
    }
    let receipt = ingested(first, "chat", &line(1)).await?;

    second.restart().await?;
    let ready = second.ready(CONVERGE).await?;
    applied(&second, position(&receipt)?).await?;
    let ready = match ready.get("halted") {
        Some(_) => ready,
        None => second.get("/readyz").await?.json()?,
    };
    let reason = ready["halted"]["chat"]["reason"]
        .as_str()
        .unwrap_or_default();
    ensure!(
        reason.contains("cannot be loaded here"),
        "{ready}\n{}",
        second.logs()
    );
    let resp = second.ingest("notes", &line(2)).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let resp = second.ingest("chat", &line(3)).await?;
    ensure!(expect::json_error(&resp, 503)?["error"] == "runtime_halted");
    // The first node runs the deploy, and takes the chat's batches.
    ensure!(first.get("/readyz").await?.json()?.get("halted").is_none());
    ingested(first, "chat", &line(4)).await?;
    Ok(())
}

/// `ndjson` ingested into `runtime` through `server`, answered `200`: the receipt.
async fn ingested(server: &Server, runtime: &str, ndjson: &str) -> anyhow::Result<Value> {
    let resp = server.ingest(runtime, ndjson).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    resp.json()
}

/// `nats_url` names several servers, separated by commas (spaces allowed): a node connects to
/// one that answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_takes_several_nats_servers_separated_by_commas() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let servers = format!("nats://127.0.0.1:1, {}", nats.url());
    let node = Server::start(&["--nats", &servers]).await?;
    node.ready(CONVERGE).await?;
    ingested(
        &node,
        "demo",
        "{\"symbol\":\"A\",\"price\":1.5,\"seq\":1}\n",
    )
    .await?;
    let resp = Server::start(&["--nats", "nats://127.0.0.1:1,not a url"]).await;
    let error = format!(
        "{:#}",
        resp.err()
            .context("a server list with a bad entry is refused")?
    );
    ensure!(error.contains("not a url"), "{error}");
    Ok(())
}
