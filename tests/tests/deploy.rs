//! Deploying a new module without a restart, against the real binary: `viewtape deploy` swaps
//! it in with the guest's state carried over — no gap, no new epoch, no reset — a module that
//! does not load is refused with the reason while the old one keeps running, and the deployed
//! module is the one that runs after a crash or a graceful restart.

use anyhow::{ensure, Context as _};
use viewtape_tests::server::{cli, config_file, guest_wasm, with_custom_section, ADMIN_TOKEN_ENV};
use viewtape_tests::{http, EventStream, Response, Server};

const TOKEN: &str = "deploy-test-token-41";

/// `misbehave` with a custom section naming `build`: the same guest, another module.
fn build(build: u8) -> anyhow::Result<Vec<u8>> {
    let wasm = std::fs::read(guest_wasm("misbehave"))?;
    Ok(with_custom_section(&wasm, "build", &[build]))
}

/// `viewtape deploy counter FILE --server http://localhost:PORT/` with the token (a URL and a
/// host name, as an operator writes them); exit code and output.
async fn deploy_cli(server: &Server, wasm: &[u8]) -> anyhow::Result<(i32, String)> {
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), wasm)?;
    let path = file.path().display().to_string();
    let addr = format!("http://localhost:{}/", server.addr().port());
    cli(
        &["deploy", "counter", &path, "--server", &addr],
        &[(ADMIN_TOKEN_ENV, TOKEN)],
    )
    .await
}

/// `PUT /admin/runtimes/{runtime}/module` over HTTP.
async fn put_module(
    server: &Server,
    runtime: &str,
    token: Option<&str>,
    wasm: &[u8],
) -> anyhow::Result<Response> {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/wasm")];
    if let Some(auth) = &auth {
        headers.push(("Authorization", auth));
    }
    let path = format!("/admin/runtimes/{runtime}/module");
    http::request(server.addr(), "PUT", &path, &headers, wasm).await
}

/// Sends `count` and returns the count the guest published.
async fn count(server: &Server, stream: &mut EventStream) -> anyhow::Result<(u64, String)> {
    let resp = server.ingest("counter", "count\n").await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let event = stream.next_event().await?;
    ensure!(event.event == "update", "{event:?}");
    let data: serde_json::Value = serde_json::from_str(&event.data)?;
    let n = data["value"].as_u64().context("a count")?;
    Ok((n, event.id.context("an id")?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployed_module_takes_over_the_state_without_a_restart() -> anyhow::Result<()> {
    let wasm = tempfile::NamedTempFile::new()?;
    std::fs::write(wasm.path(), build(0)?)?;
    let config = config_file(&format!(
        "[[runtime]]\nname = \"counter\"\nwasm = {:?}\nviews = [\"state\"]\n",
        wasm.path().display().to_string()
    ))?;
    let config_path = config.path().display().to_string();
    let mut server =
        Server::start_with_env(&["--config", &config_path], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
    let mut stream = server.sse("/views/state/events", &[]).await?;
    stream.until_synced(10).await?;
    for expected in 1..=3 {
        ensure!(count(&server, &mut stream).await?.0 == expected);
    }

    // Deployed: the state carries over, the stream goes on with the next offset.
    let (code, out) = deploy_cli(&server, &build(1)?).await?;
    ensure!(code == 0, "{out}");
    let reply: serde_json::Value = serde_json::from_str(out.trim())?;
    let module = reply["module"].as_str().context("module")?.to_owned();
    ensure!(
        reply["runtime"] == "counter"
            && module.starts_with("sha256:")
            && reply["previous"] != reply["module"]
            && reply["position"].as_u64().is_some(),
        "{reply}"
    );
    let (n, id) = count(&server, &mut stream).await?;
    ensure!(n == 4, "the state carried over: {n}");
    let hex = module.trim_start_matches("sha256:");
    ensure!(
        server
            .data_dir()
            .join("modules")
            .join(format!("{hex}.wasm"))
            .exists(),
        "the module is kept by its hash"
    );

    // Refused: not wasm, and wasm that is not a guest; the old module keeps running.
    for (bytes, says) in [
        (&b"not a module"[..], "does not load"),
        (b"\0asm\x01\0\0\0", "does not load"),
    ] {
        let resp = put_module(&server, "counter", Some(TOKEN), bytes).await?;
        ensure!(
            resp.status() == 422 && resp.text().contains(says),
            "{} {}",
            resp.status(),
            resp.text()
        );
    }
    ensure!(
        put_module(&server, "nope", Some(TOKEN), &build(2)?)
            .await?
            .status()
            == 404
    );
    ensure!(
        put_module(&server, "counter", None, &build(2)?)
            .await?
            .status()
            == 401
    );
    ensure!(
        put_module(&server, "counter", Some("wrong"), &build(2)?)
            .await?
            .status()
            == 401
    );
    ensure!(count(&server, &mut stream).await?.0 == 5);
    // The same module again changes nothing.
    let (code, out) = deploy_cli(&server, &build(1)?).await?;
    ensure!(code == 0 && out.contains("\"position\":null"), "{out}");

    // After kill -9 the deployed module runs on, from the replayed state, in the same epoch.
    drop(stream);
    server.kill9().await?;
    server.restart().await?;
    let mut resumed = server
        .sse("/views/state/events", &[("Last-Event-ID", &id)])
        .await?;
    let missed = resumed.next_event().await?;
    ensure!(missed.data.contains("\"value\":5"), "{missed:?}");
    ensure!(count(&server, &mut resumed).await?.0 == 6);
    ensure!(
        !server.logs().to_lowercase().contains("fresh epoch"),
        "{}",
        server.logs()
    );

    // And after a graceful stop, from the exact snapshot.
    let status = server.stop_graceful().await?;
    ensure!(status.success());
    server.restart().await?;
    let mut after = server.sse("/views/state/events", &[]).await?;
    after.until_synced(10).await?;
    ensure!(count(&server, &mut after).await?.0 == 7);
    let resp = put_module(&server, "counter", Some(TOKEN), &build(1)?).await?;
    let body = resp.json()?;
    ensure!(
        resp.status() == 200 && body["position"].is_null() && body["module"] == module.as_str(),
        "the deployed module still runs: {body}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_changed_while_stopped_is_deployed_at_start_and_a_refusing_one_resets_only_its_views(
) -> anyhow::Result<()> {
    let wasm = tempfile::NamedTempFile::new()?;
    std::fs::write(wasm.path(), build(0)?)?;
    let config = config_file(&format!(
        "[[runtime]]\nname = \"counter\"\nwasm = {:?}\nviews = [\"state\"]\n\n\
         [[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n",
        wasm.path().display().to_string()
    ))?;
    let config_path = config.path().display().to_string();
    let mut server = Server::start(&["--config", &config_path]).await?;
    let mut stream = server.sse("/views/state/events", &[]).await?;
    stream.until_synced(10).await?;
    for expected in 1..=3 {
        ensure!(count(&server, &mut stream).await?.0 == expected);
    }
    let mut feed = viewtape_tests::Feed::new(&["ACME"]);
    server.ingest_ok(&feed.batch(2)).await?;
    let prices = viewtape_tests::expect::cursor_of(
        &viewtape_tests::expect::tape(&server, "prices", 2).await?[1],
    )?;

    // Another build of the same guest while stopped: it takes the state over at start.
    server.stop_graceful().await?;
    std::fs::write(wasm.path(), build(1)?)?;
    server.restart().await?;
    ensure!(
        server.logs().contains("deployed at start"),
        "{}",
        server.logs()
    );
    let mut stream = server.sse("/views/state/events", &[]).await?;
    stream.until_synced(10).await?;
    let (n, id) = count(&server, &mut stream).await?;
    ensure!(n == 4, "the state carried over: {n}");
    let counter = viewtape_tests::parse_cursor(&id)?;

    // A build that refuses the state: that runtime starts fresh, and only its views reset.
    server.stop_graceful().await?;
    std::fs::write(wasm.path(), std::fs::read(guest_wasm("logstats"))?)?;
    server.restart().await?;
    ensure!(server.logs().contains("starts fresh"), "{}", server.logs());
    viewtape_tests::expect::refused(&server, "state", &counter).await?;
    viewtape_tests::expect::resumes(&server, "prices", &prices).await?;
    Ok(())
}
