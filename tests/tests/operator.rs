//! What an operator's tools read from a live server: the API description at `/openapi.json`
//! (the one kept in the repository), and the metrics the dashboard and the alert rules in
//! `docs/` name.

use anyhow::{ensure, Context as _};
use viewtape_tests::Server;

fn repository_file(path: &str) -> anyhow::Result<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_api_description_is_the_one_in_the_repository() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let served = server.get("/openapi.json").await?;
    ensure!(served.status() == 200);
    ensure!(served.header("content-type") == Some("application/json"));
    let kept = repository_file("docs/openapi.json")?;
    ensure!(
        served.text() == kept,
        "GET /openapi.json differs from docs/openapi.json"
    );
    let document = served.json()?;
    ensure!(document["openapi"] == "3.2.0");
    Ok(())
}

/// Every `viewtape_…` metric name in `text`.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("viewtape_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_the_alert_rules_name_only_metrics_the_server_exports(
) -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    // A batch and a stream, so that the labelled series exist too.
    server
        .ingest_ok(&viewtape_tests::Feed::new(&["ACME"]).batch(3))
        .await?;
    let mut stream = server.sse("/views/prices/events", &[]).await?;
    stream.until_synced(10).await?;
    let scraped = server.get("/metrics").await?.text();
    let exported: std::collections::BTreeSet<String> = scraped
        .lines()
        .filter_map(|line| {
            let line = line.strip_prefix("# TYPE ").unwrap_or(line);
            let name = line.split([' ', '{']).next()?;
            name.starts_with("viewtape_").then(|| name.to_owned())
        })
        .collect();

    let dashboard: serde_json::Value =
        serde_json::from_str(&repository_file("docs/grafana/viewtape.json")?)?;
    let mut queries = String::new();
    for panel in dashboard["panels"].as_array().context("panels")? {
        for target in panel["targets"].as_array().context("targets")? {
            queries.push_str(target["expr"].as_str().context("expr")?);
            queries.push('\n');
        }
    }
    let rules = repository_file("docs/prometheus/alerts.yml")?;
    for (file, text) in [
        ("docs/grafana/viewtape.json", &queries),
        ("docs/prometheus/alerts.yml", &rules),
    ] {
        let named = metric_names(text);
        ensure!(named.len() >= 6, "{file} names too few metrics: {named:?}");
        let unknown: Vec<_> = named.difference(&exported).collect();
        ensure!(
            unknown.is_empty(),
            "{file} names metrics the server does not export: {unknown:?}\n/metrics:\n{scraped}"
        );
    }
    // What the dashboard must show, and the alerts there must be.
    let shown = metric_names(&queries);
    for needed in [
        "viewtape_sse_connections",
        "viewtape_events_delivered_total",
        "viewtape_streams_total",
        "viewtape_ingest_batches_total",
        "viewtape_log_fsync_seconds_bucket",
        "viewtape_log_position",
        "viewtape_cluster_apply_lag_seconds",
        "viewtape_runtime_guest_failures_total",
    ] {
        ensure!(
            shown.contains(needed),
            "the dashboard does not show {needed}"
        );
    }
    for alert in [
        "ViewtapeReconnectStorm",
        "ViewtapeResets",
        "ViewtapeFsyncSlow",
        "ViewtapeLogFailedClosed",
        "ViewtapeNotReady",
        "ViewtapeApplyLag",
    ] {
        ensure!(
            rules.contains(&format!("alert: {alert}\n")),
            "no alert {alert}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_publishes_what_it_shows() -> anyhow::Result<()> {
    let readme = repository_file("README.md")?;
    let block = readme
        .split_once("<!-- quick-start-ingest")
        .and_then(|(_, rest)| rest.split_once("```sh\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block)
        .context("the README's quick-start ingest block")?;
    ensure!(block.contains("viewtape serve --demo-rate 0"), "{block}");
    let payload = block
        .split_once("--data-binary $'")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(payload, _)| payload.replace("\\n", "\n"))
        .context("the curl payload")?;
    let shown: serde_json::Value = serde_json::from_str(
        block
            .lines()
            .find_map(|line| line.strip_prefix("# {"))
            .map(|rest| format!("{{{rest}"))
            .context("the receipt shown")?
            .as_str(),
    )?;

    let server = Server::start(&["--demo-rate", "0"]).await?;
    let mut stream = server.sse("/views/prices/events", &[]).await?;
    stream.until_synced(10).await?;
    let receipt = server.ingest("demo", &payload).await?;
    ensure!(receipt.status() == 200, "{}", receipt.text());
    ensure!(
        receipt.json()? == shown,
        "got {}, the README shows {shown}",
        receipt.text()
    );
    for symbol in ["ACME", "BOLT"] {
        let event = stream.next_event().await?;
        ensure!(
            event.event == "update" && event.json()?["key"] == symbol,
            "{event:?}"
        );
    }
    Ok(())
}
