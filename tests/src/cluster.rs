//! Clusters of nodes on one NATS server: starting them, feeding them, and reading what they
//! applied, for the end-to-end tests of replicas.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::{expect, Feed, NatsServer, Server};

/// How long a node may take to apply what another node acknowledged.
pub const CONVERGE: Duration = Duration::from_secs(20);

/// A node of the cluster on `nats`.
pub async fn node(nats: &NatsServer) -> anyhow::Result<Server> {
    Server::start(&["--nats", &nats.url()]).await
}

/// `n` nodes, each ready.
pub async fn nodes(nats: &NatsServer, n: usize) -> anyhow::Result<Vec<Server>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let server = node(nats).await?;
        server.ready(CONVERGE).await?;
        out.push(server);
    }
    Ok(out)
}

/// A node on `nats` with the admin routes on under `token`, and `args` besides; ready.
pub async fn admin_node(nats: &NatsServer, token: &str, args: &[&str]) -> anyhow::Result<Server> {
    let url = nats.url();
    let mut all = vec!["--nats", url.as_str()];
    all.extend_from_slice(args);
    let server = Server::start_with_env(&all, &[(crate::server::ADMIN_TOKEN_ENV, token)]).await?;
    server.ready(CONVERGE).await?;
    Ok(server)
}

/// `n` admin nodes on `nats` (see [`admin_node`]), each on the default config.
pub async fn admin_nodes(nats: &NatsServer, token: &str, n: usize) -> anyhow::Result<Vec<Server>> {
    let mut nodes = Vec::new();
    for _ in 0..n {
        nodes.push(admin_node(nats, token, &[]).await?);
    }
    Ok(nodes)
}

/// Waits until the node has applied stream sequence `position`.
pub async fn applied(server: &Server, position: u64) -> anyhow::Result<()> {
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

/// `batches` batches of `size` ticks into the first node; waits until every node has applied
/// them.
pub async fn ingest_all(
    nodes: &[Server],
    feed: &mut Feed,
    batches: usize,
    size: usize,
) -> anyhow::Result<()> {
    let mut last = 0;
    for _ in 0..batches {
        last = position(&nodes[0].ingest_ok(&feed.batch(size)).await?)?;
    }
    for node in nodes {
        applied(node, last).await?;
    }
    Ok(())
}

/// The first `n` frames of the tape of `prices`: (id, data) each.
pub async fn frames(server: &Server, n: usize) -> anyhow::Result<Vec<(String, String)>> {
    view_frames(server, "prices", n).await
}

/// The first `n` frames of `view`'s tape on `server`: id and data.
pub async fn view_frames(
    server: &Server,
    view: &str,
    n: usize,
) -> anyhow::Result<Vec<(String, String)>> {
    Ok(expect::tape(server, view, n)
        .await?
        .into_iter()
        .map(|e| (e.id.unwrap_or_default(), e.data))
        .collect())
}

/// The log position of an ingest receipt.
pub fn position(receipt: &serde_json::Value) -> anyhow::Result<u64> {
    receipt["position"]
        .as_u64()
        .with_context(|| format!("no position in {receipt}"))
}

/// A JetStream context on `nats`, as an operator's tool would have.
pub async fn operator(nats: &NatsServer) -> anyhow::Result<async_nats::jetstream::Context> {
    let client = async_nats::connect(nats.url()).await?;
    Ok(async_nats::jetstream::new(client))
}

/// The epoch of the cursor `GET /views/prices` answers.
pub async fn epoch(server: &Server) -> anyhow::Result<String> {
    let state = server.get("/views/prices").await?.json()?;
    let cursor = state["cursor"]
        .as_str()
        .with_context(|| format!("no cursor: {state}"))?;
    Ok(crate::parse_cursor(cursor)?.epoch().to_string())
}
