//! `viewtape run`: a guest module over recorded input, through the real binary.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{ensure, Context as _};
use tokio::io::AsyncWriteExt;
use viewtape_tests::server::binary;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_prints_each_batch_as_ndjson_and_saves_the_state() -> anyhow::Result<()> {
    let ticker = Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/guests/ticker.wasm");
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let mut child = tokio::process::Command::new(binary().await?)
        .arg("run")
        .arg(&ticker)
        .args(["--batch-lines", "1", "--save-state"])
        .arg(&state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().context("stdin")?;
    stdin
        .write_all(b"{\"symbol\":\"ACME\",\"price\":1.5,\"seq\":1}\nnot a tick\n{\"symbol\":\"ACME\",\"price\":1.6,\"seq\":3}\n")
        .await?;
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    ensure!(lines[0]["update"]["value"]["price"] == 1.5, "{stdout}");
    ensure!(
        lines[1]["batch"] == 2
            && lines[1]["error"]
                .as_str()
                .is_some_and(|e| e.contains("line 1, column")),
        "{stdout}"
    );
    ensure!(
        lines[2]["gap"]
            .as_str()
            .is_some_and(|g| g.contains("1 tick(s) missing")),
        "{stdout}"
    );
    ensure!(lines[3]["update"]["value"]["seq"] == 3, "{stdout}");
    ensure!(std::fs::read(&state)? == b"3", "saved state");
    Ok(())
}
