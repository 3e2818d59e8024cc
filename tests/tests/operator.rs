//! What an operator's tools read from a live server: the API description at `/openapi.json`
//! (the one kept in the repository), the metrics the dashboard and the alert rules in `docs/`
//! name, what `GET /admin/runtimes` says of each runtime, and each view's subscribers; and what
//! an operator starts it with: its log lines in files, `serve --help`, `--listen`.

use anyhow::{ensure, Context as _};
use sha2::{Digest, Sha256};
use viewtape_tests::server::{cli, config_file, guest_wasm, with_custom_section, ADMIN_TOKEN_ENV};
use viewtape_tests::{http, Server};

fn repository_file(path: &str) -> anyhow::Result<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))
}

/// The served document is `docs/openapi.json` with the demo's typed view `prices` added: its
/// routes (`/views/prices`, `/views/prices/events`) and its components (`view.prices…`); the rest
/// is the file as kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_api_description_is_the_one_in_the_repository() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let served = server.get("/openapi.json").await?;
    ensure!(served.status() == 200);
    ensure!(served.header("content-type") == Some("application/json"));
    let kept: serde_json::Value = serde_json::from_str(&repository_file("docs/openapi.json")?)?;
    let mut document = served.json()?;
    ensure!(document["openapi"] == "3.2.0");
    let paths = document["paths"].as_object_mut().context("paths")?;
    for typed in ["/views/prices", "/views/prices/events"] {
        ensure!(paths.remove(typed).is_some(), "{typed} is described");
    }
    let components = document["components"]["schemas"]
        .as_object_mut()
        .context("components")?;
    let before = components.len();
    components.retain(|name, _| name != "view.prices" && !name.starts_with("view.prices."));
    ensure!(components.len() < before, "the view's components are there");
    ensure!(
        document == kept,
        "GET /openapi.json differs from docs/openapi.json beyond the typed view"
    );
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
        "ViewtapeClusterHalted",
        "ViewtapeRuntimeHalted",
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

const ADMIN_TOKEN: &str = "operator-test-token";

/// A server running the `misbehave` fixture as runtime `counter` (publishing to `state`), with
/// the admin routes on; its config file, and the module's fingerprint computed from its bytes.
async fn counter_server() -> anyhow::Result<(Server, tempfile::NamedTempFile, String)> {
    let wasm = guest_wasm("misbehave");
    let fingerprint = Sha256::digest(std::fs::read(&wasm)?).iter().fold(
        String::from("sha256:"),
        |mut hex, byte| {
            hex.push_str(&format!("{byte:02x}"));
            hex
        },
    );
    let config = config_file(&format!(
        "[[runtime]]\nname = \"counter\"\nwasm = {:?}\nviews = [\"state\"]\n",
        wasm.display().to_string()
    ))?;
    let path = config.path().display().to_string();
    let server =
        Server::start_with_env(&["--config", &path], &[(ADMIN_TOKEN_ENV, ADMIN_TOKEN)]).await?;
    Ok((server, config, fingerprint))
}

/// `GET /admin/runtimes` with the token: runtime `counter`'s entry.
async fn counter(server: &Server) -> anyhow::Result<serde_json::Value> {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let resp = http::request(
        server.addr(),
        "GET",
        "/admin/runtimes",
        &[("Authorization", &auth)],
        b"",
    )
    .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    ensure!(resp.header("content-type") == Some("application/json"));
    let body = resp.json()?;
    let runtimes = body["runtimes"].as_array().context("runtimes")?;
    ensure!(runtimes.len() == 1, "{body}");
    Ok(runtimes[0].clone())
}

/// Ingests into `counter`, requiring `status`; the answer's body.
async fn send(server: &Server, batch: &str, status: u16) -> anyhow::Result<serde_json::Value> {
    let resp = server.ingest("counter", batch).await?;
    ensure!(resp.status() == status, "{} {}", resp.status(), resp.text());
    resp.json()
}

/// `GET /admin/runtimes`: the module each runtime runs (its SHA-256, and the deployed one after a
/// deploy), the size of its guest's saved state as it commits, its batches, and its guest's last
/// failure — a refused batch, then a trap — which a later success does not clear; only with the
/// admin token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtimes_route_reports_each_module_state_and_last_failure() -> anyhow::Result<()> {
    let (server, _config, fingerprint) = counter_server().await?;
    for auth in [None, Some("Bearer wrong")] {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
        let resp = http::request(server.addr(), "GET", "/admin/runtimes", &headers, b"").await?;
        ensure!(resp.status() == 401, "{auth:?}: {}", resp.status());
    }

    // Fresh: the configured module, no state saved yet, nothing run, nothing failed.
    let fresh = counter(&server).await?;
    ensure!(fresh["name"] == "counter", "{fresh}");
    ensure!(
        fresh["module"] == fingerprint.as_str(),
        "{fresh}, not {fingerprint}"
    );
    ensure!(
        fresh["state_bytes"] == 0 && fresh["batches"] == 0,
        "{fresh}"
    );
    ensure!(fresh["last_error"].is_null(), "{fresh}");

    // The guest saves its count as text after the SDK's 8-byte version header: "12" makes 10
    // bytes, as soon as the batch is answered.
    send(&server, &"count\n".repeat(12), 200).await?;
    let counted = counter(&server).await?;
    ensure!(
        counted["state_bytes"] == 10 && counted["batches"] == 1,
        "{counted}"
    );
    ensure!(counted["last_error"].is_null(), "{counted}");

    // A batch the guest refuses: the last error, with the guest's message and when.
    let before = unix_ms();
    let answer = send(&server, "count\nfail no such symbol\n", 422).await?;
    let after = unix_ms();
    let refused = counter(&server).await?;
    let error = &refused["last_error"];
    ensure!(error["kind"] == "rejected", "{refused}");
    let message = error["message"].as_str().context("message")?;
    ensure!(message.contains("no such symbol"), "{refused}");
    ensure!(
        answer["message"]
            .as_str()
            .is_some_and(|told| told.ends_with(message)),
        "the sender was told {answer}, the operator sees {message:?}"
    );
    let at = error["at_ms"].as_u64().context("at_ms")?;
    ensure!(
        (before..=after).contains(&at),
        "{at} not in {before}..={after}"
    );
    // Nothing of it committed: the state is the one before it.
    ensure!(
        refused["state_bytes"] == 10 && refused["batches"] == 1,
        "{refused}"
    );

    // A trap replaces it; a success after it does not clear it. It is told in our words, as
    // its sender was: the panic's message and location are in the server's log.
    let panicked = send(&server, "panic the guest gives up\n", 422).await?;
    send(&server, &"count\n".repeat(88), 200).await?;
    let trapped = counter(&server).await?;
    ensure!(trapped["last_error"]["kind"] == "failed", "{trapped}");
    let message = trapped["last_error"]["message"]
        .as_str()
        .context("message")?;
    ensure!(
        message.contains("the guest panicked") && !message.contains("gives up"),
        "{trapped}"
    );
    ensure!(
        panicked["message"]
            .as_str()
            .is_some_and(|told| told.ends_with(message)),
        "the sender was told {panicked}, the operator sees {message:?}"
    );
    ensure!(
        trapped["state_bytes"] == 11 && trapped["batches"] == 2,
        "the count is 100: {trapped}"
    );

    // A deploy: the new module's fingerprint, the state carried over.
    let build = with_custom_section(&std::fs::read(guest_wasm("misbehave"))?, "build", &[7]);
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let resp = http::request(
        server.addr(),
        "PUT",
        "/admin/runtimes/counter/module",
        &[("Authorization", &auth)],
        &build,
    )
    .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let deployed = counter(&server).await?;
    let module = deployed["module"].as_str().context("module")?;
    ensure!(
        module == resp.json()?["module"] && module != fingerprint,
        "{deployed}"
    );
    ensure!(deployed["state_bytes"] == 11, "{deployed}");
    Ok(())
}

/// `viewtape_view_subscribers`: the streams open on each view, counted as they open and close;
/// their sum is `viewtape_sse_connections`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_views_subscribers_are_counted_as_they_come_and_go() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let prices = "viewtape_view_subscribers{view=\"prices\"}";
    ensure!(server.metric(prices).await? == 0.0);
    let mut first = server.sse("/views/prices/events", &[]).await?;
    first.until_synced(10).await?;
    let mut second = server.sse("/views/prices/events", &[]).await?;
    second.until_synced(10).await?;
    ensure!(server.metric(prices).await? == 2.0);
    ensure!(server.metric("viewtape_sse_connections").await? == 2.0);
    drop(first);
    // The server notices at its next write: the next batch, or a heartbeat.
    server
        .ingest_ok(&viewtape_tests::Feed::new(&["ACME"]).batch(1))
        .await?;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while server.metric(prices).await? != 1.0 {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the closed stream is still counted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    ensure!(server.metric("viewtape_sse_connections").await? == 1.0);
    drop(second);
    Ok(())
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Log lines carried ANSI colour codes into files and pipes, and there was no JSON format: off a
/// terminal they are plain text, and `--log-format json` (or `VIEWTAPE_LOG_FORMAT=json`) writes
/// one JSON object per line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_plain_off_a_terminal_and_json_when_asked() -> anyhow::Result<()> {
    let text = Server::start(&[]).await?.logs();
    ensure!(text.contains("viewtape serving"), "{text}");
    ensure!(!text.contains('\x1b'), "ANSI escapes in a pipe:\n{text:?}");
    for server in [
        Server::start(&["--log-format", "json"]).await?,
        Server::start_with_env(&[], &[("VIEWTAPE_LOG_FORMAT", "json")]).await?,
    ] {
        let logs = server.logs();
        let lines = logs
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<Vec<serde_json::Value>, _>>()
            .with_context(|| format!("not one JSON object per line:\n{logs}"))?;
        ensure!(
            lines.iter().any(|line| line["level"] == "INFO"
                && line["message"]
                    .as_str()
                    .is_some_and(|message| message.starts_with("viewtape serving"))),
            "{logs}"
        );
    }
    Ok(())
}

/// `serve --help` named no environment variable, though the server reads several: it lists them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_help_names_the_environment_it_reads() -> anyhow::Result<()> {
    let (code, help) = cli(&["serve", "--help"], &[]).await?;
    ensure!(code == 0, "exit {code}:\n{help}");
    for variable in [
        "VIEWTAPE_JWT_SECRET",
        ADMIN_TOKEN_ENV,
        "VIEWTAPE_LOG_FORMAT",
        "RUST_LOG",
        "NO_COLOR",
    ] {
        ensure!(help.contains(variable), "{variable} missing:\n{help}");
    }
    Ok(())
}

/// `--listen localhost:8080` was refused as an invalid address, with no hint: a host name and a
/// port is resolved (to its IPv4 address), and what is neither is refused with a hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_takes_a_host_name_and_refuses_nonsense_with_a_hint() -> anyhow::Result<()> {
    let server = Server::start(&["--listen", "localhost:0"]).await?;
    ensure!(
        server.addr().is_ipv4() && server.addr().ip().is_loopback(),
        "{}",
        server.addr()
    );
    let health = server.get("/healthz").await?;
    ensure!(health.status() == 200, "{}", health.text());
    let data = tempfile::tempdir()?;
    let data = data.path().display().to_string();
    let (code, output) = cli(
        &["serve", "--listen", "localhost", "--data-dir", &data],
        &[],
    )
    .await?;
    ensure!(code == 2, "exit {code}:\n{output}");
    ensure!(
        output.contains("use an IP address and a port, such as 127.0.0.1:8080"),
        "{output}"
    );
    Ok(())
}
