//! JavaScript guests (`DESIGN.md` §15) through the real binary: a `[[runtime]]` whose `module`
//! is a `.js` file serves its view over HTTP; `viewtape run` runs the JS ticker
//! (`examples/js/ticker.js`) as it runs a `.wasm`; `check-config` refuses a module that does not
//! compile, naming the line and the column.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::ensure;
use serde_json::json;
use viewtape_tests::server::{cli, config_file};
use viewtape_tests::Server;

fn js_ticker() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/js/ticker.js")
}

fn config(module: &str) -> String {
    format!("[[runtime]]\nname = \"demo\"\nmodule = {module:?}\nviews = [\"prices\"]\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_js_runtime_serves_its_view_over_http() -> anyhow::Result<()> {
    let module = js_ticker().display().to_string();
    let file = config_file(&config(&module))?;
    let path = file.path().display().to_string();
    let mut server = Server::start(&["--config", &path]).await?;
    server.ready(Duration::from_secs(30)).await?;
    server
        .ingest_ok(
            "{\"symbol\":\"ACME\",\"price\":12.5,\"seq\":1}\n{\"symbol\":\"XYZ\",\"price\":3,\"seq\":2}\n",
        )
        .await?;
    // A throw rejects the whole batch, naming the line of the input the ticker names.
    let rejected = server
        .ingest(
            "demo",
            "{\"symbol\":\"ACME\",\"price\":13,\"seq\":3}\n{oops\n",
        )
        .await?;
    ensure!(
        rejected.status() == 422,
        "{} {}",
        rejected.status(),
        rejected.text()
    );
    ensure!(
        rejected.text().contains("line 2: malformed tick"),
        "{}",
        rejected.text()
    );

    let resp = server.get("/views/prices").await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let entries = resp.json()?["entries"].clone();
    ensure!(
        entries
            == json!({
                "ACME": {"symbol": "ACME", "price": 12.5, "seq": 1},
                "XYZ": {"symbol": "XYZ", "price": 3, "seq": 2},
            }),
        "{entries}"
    );
    // The guest's schemas export is the view's schema.
    let schema = server.get("/views/prices/schema").await?;
    ensure!(
        schema.status() == 200,
        "{} {}",
        schema.status(),
        schema.text()
    );
    ensure!(
        schema.json()?["required"] == json!(["symbol", "price", "seq"]),
        "{}",
        schema.text()
    );
    server.stop_graceful().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewtape_run_runs_the_js_ticker() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("ticks.ndjson");
    std::fs::write(
        &input,
        "{\"symbol\":\"ACME\",\"price\":1.5,\"seq\":1}\n{\"symbol\":\"ACME\",\"price\":2,\"seq\":4}\n",
    )?;
    let module = js_ticker().display().to_string();
    let out = tokio::process::Command::new(viewtape_tests::server::binary().await?)
        .args(["run", &module])
        .stdin(std::fs::File::open(&input)?)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    ensure!(
        lines
            .iter()
            .any(|l| l["gap"] == "ticker seq jumped from 1 to 4: 2 tick(s) missing"),
        "{stdout}"
    );
    let updates: Vec<_> = lines.iter().filter_map(|l| l.get("update")).collect();
    ensure!(updates.len() == 2, "{stdout}");
    ensure!(
        updates[1]
            == &json!({"view": "prices", "key": "ACME", "value": {"symbol": "ACME", "price": 2, "seq": 4}}),
        "{stdout}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_refuses_js_that_does_not_compile_naming_line_and_column() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let module = dir.path().join("broken.js");
    std::fs::write(
        &module,
        "export function onBatch(state) {\n  return state +;\n}\n",
    )?;
    let file = config_file(&config(&module.display().to_string()))?;
    let path = file.path().display().to_string();
    let (code, output) = cli(&["check-config", &path], &[]).await?;
    ensure!(code != 0, "exit {code}:\n{output}");
    ensure!(output.contains("runtime[0].module"), "{output}");
    ensure!(
        output.contains("the JavaScript module does not compile: SyntaxError")
            && output.contains("guest.js:2:"),
        "{output}"
    );

    // The same file, fixed, passes.
    std::fs::write(
        &module,
        "export function onBatch(state) {\n  return state;\n}\n",
    )?;
    let (code, output) = cli(&["check-config", &path], &[]).await?;
    ensure!(code == 0, "exit {code}:\n{output}");
    Ok(())
}
