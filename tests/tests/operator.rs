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
