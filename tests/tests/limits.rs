//! Limits that protect the server: the SSE connection limit (503 past it),
//! heartbeats on idle streams, and a config file refused at start.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::ensure;
use viewtape_tests::server::binary;
use viewtape_tests::Server;

fn config(text: &str) -> anyhow::Result<tempfile::NamedTempFile> {
    let mut file = tempfile::NamedTempFile::new()?;
    file.write_all(text.as_bytes())?;
    Ok(file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_get_503_until_one_closes() -> anyhow::Result<()> {
    let file = config("[server]\nmax_connections = 2\n")?;
    let path = file.path().display().to_string();
    let server = Server::start(&["--config", &path]).await?;
    let mut first = server.sse("/views/prices/events", &[]).await?;
    let _second = server.sse("/views/prices/events", &[]).await?;
    first.until_synced(100).await?;

    let refused = server.get("/views/prices/events").await?;
    ensure!(refused.status() == 503, "status {}", refused.status());
    let body = refused.json()?;
    ensure!(body["error"] == "unavailable", "{body}");
    ensure!(
        body["message"].as_str().unwrap_or("").contains("limit 2"),
        "{body}"
    );

    // Closing a stream frees its slot — as soon as the server has seen the close, which a retry
    // may beat: every refusal the test sees is one the server counts, no more and no fewer.
    drop(first);
    let mut refusals = 1;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match server.sse("/views/prices/events", &[]).await {
            Ok(mut stream) => {
                stream.until_synced(100).await?;
                break;
            }
            Err(error) if Instant::now() < deadline => {
                ensure!(format!("{error:#}").contains("status 503"), "{error:#}");
                refusals += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => return Err(error.context("the freed slot was never reusable")),
        }
    }
    let metrics = String::from_utf8(server.get("/metrics").await?.body)?;
    ensure!(
        metrics.contains(&format!(
            "viewtape_sse_connections_refused_total {refusals}\n"
        )),
        "{refusals} refusals seen: {metrics}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_streams_get_heartbeats() -> anyhow::Result<()> {
    let file = config("[server]\nheartbeat = \"200ms\"\n")?;
    let path = file.path().display().to_string();
    let server = Server::start(&["--config", &path]).await?;
    let mut stream = server.sse("/views/prices/events", &[]).await?;
    stream.until_synced(100).await?;
    stream.expect_silence(Duration::from_millis(900)).await?;
    ensure!(stream.comments() >= 2, "{} heartbeats", stream.comments());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_config_is_refused_with_its_line() -> anyhow::Result<()> {
    let file = config("[journal]\nmax_age = \"1h\"\nmax_records_per_view = \"lots\"\n")?;
    let bin = binary().await?;
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(bin)
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(file.path())
            .output(),
    )
    .await??;
    ensure!(!output.status.success(), "a bad config must not start");
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        stderr.contains("line 3") && stderr.contains("max_records_per_view"),
        "{stderr}"
    );
    ensure!(output.stdout.is_empty(), "nothing listened");
    Ok(())
}
