//! Runtimes stay in their lane: a runtime publishes only to the views it declares, and a gap it
//! reports touches only those views.

use std::io::Write as _;
use std::time::Duration;

use anyhow::ensure;
use viewtape_tests::{expect, Feed, Server};

/// The demo ticker (`prices`) and the `misbehave` fixture as runtime `m` (`notes`).
async fn two_runtimes() -> anyhow::Result<(Server, tempfile::NamedTempFile)> {
    let wasm = viewtape_tests::server::guest_wasm("misbehave");
    let mut file = tempfile::NamedTempFile::new()?;
    write!(
        file,
        "[[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n\n\
         [[runtime]]\nname = \"m\"\nwasm = \"{}\"\nviews = [\"notes\"]\n",
        wasm.display()
    )?;
    let path = file.path().display().to_string();
    let server = Server::start(&["--config", &path, "--demo-rate", "0"]).await?;
    Ok((server, file))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_in_one_runtime_does_not_reset_another_runtimes_views() -> anyhow::Result<()> {
    let (server, _config) = two_runtimes().await?;
    let mut feed = Feed::new(&["ACME"]);
    server.ingest_ok(&feed.batch(2)).await?;
    let reply = server.ingest("m", "publish notes a 1\n").await?;
    ensure!(reply.status() == 200, "{}", reply.text());
    let prices = expect::tape(&server, "prices", 2).await?;
    let prices_cursor = expect::cursor_of(&prices[1])?;
    let notes = expect::tape(&server, "notes", 1).await?;
    let notes_cursor = expect::cursor_of(&notes[0])?;

    let reply = server
        .ingest("m", "gap the upstream dropped a file\n")
        .await?;
    ensure!(reply.status() == 200, "{}", reply.text());
    let body = reply.json()?;
    ensure!(
        body["gaps"] == serde_json::json!(["the upstream dropped a file"]),
        "the reply names the gap: {body}"
    );

    // The other runtime's subscriber resumes as if nothing happened...
    let id = prices_cursor.to_string();
    let mut stream = server
        .sse("/views/prices/events", &[("Last-Event-ID", id.as_str())])
        .await?;
    server.ingest_ok(&feed.batch(1)).await?;
    let next = stream.next_event().await?;
    ensure!(
        next.event == "update",
        "no reset, the next update: {next:?}"
    );
    stream.expect_silence(Duration::from_millis(200)).await?;
    // ...while a cursor of the runtime that lost input fails closed.
    expect::refused(&server, "notes", &notes_cursor).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_to_an_undeclared_view_rejects_the_batch_and_names_the_setting(
) -> anyhow::Result<()> {
    let (server, _config) = two_runtimes().await?;
    let reply = server
        .ingest("m", "publish notes a 1\npublish prices typo 2\n")
        .await?;
    ensure!(reply.status() == 422, "{} {}", reply.status(), reply.text());
    let message = reply.json()?["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    ensure!(
        message.contains("`prices`") && message.contains("views = [\"notes\"]"),
        "{message}"
    );
    // All or nothing: not even the declared view got its event.
    let state = server.get("/views/notes").await?.json()?;
    ensure!(state["entries"] == serde_json::json!({}), "{state}");
    ensure!(
        server.get("/views/prices").await?.json()?["entries"] == serde_json::json!({}),
        "no view was created by the typo"
    );
    Ok(())
}
