//! `viewtape run`: a guest module over recorded input, through the real binary.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{ensure, Context as _};
use tokio::io::AsyncWriteExt;
use viewtape_tests::server::binary;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_prints_each_batch_as_ndjson_and_saves_the_state() -> anyhow::Result<()> {
    let ticker = viewtape_tests::server::guest_wasm("ticker");
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
    // As the host stores it: the SDK's version header (`\xffVTS`, version 0), then the ticker's
    // own state.
    ensure!(std::fs::read(&state)? == b"\xffVTS\0\0\0\x003", "saved state");
    Ok(())
}

/// Runs `cargo ARGS` on the crate in `dir`, with a target directory kept between test runs.
async fn cargo(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/scaffolded-guests");
    let out = tokio::time::timeout(
        Duration::from_secs(600),
        tokio::process::Command::new(cargo)
            .args(args)
            .arg("--manifest-path")
            .arg(dir.join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .output(),
    )
    .await??;
    ensure!(
        out.status.success(),
        "cargo {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_guest_builds_passes_its_tests_and_runs() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let out = tokio::process::Command::new(binary().await?)
        .args(["new", "orders", "--dir"])
        .arg(dir.path())
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let crate_dir = dir.path().join("orders");
    cargo(&crate_dir, &["test", "--quiet"]).await?;
    cargo(
        &crate_dir,
        &[
            "build",
            "--release",
            "--target",
            "wasm32-unknown-unknown",
            "--quiet",
        ],
    )
    .await?;
    let wasm = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/scaffolded-guests/wasm32-unknown-unknown/release/orders.wasm");
    let input = std::fs::File::open(crate_dir.join("input.ndjson"))?;
    let out = tokio::process::Command::new(binary().await?)
        .arg("run")
        .arg(&wasm)
        .stdin(Stdio::from(input))
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last_alice = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .rfind(|l| l["update"]["key"] == "alice")
        .context("no update for alice")?;
    ensure!(
        last_alice["update"]["view"] == "orders" && last_alice["update"]["value"]["total"] == 3,
        "{stdout}"
    );
    Ok(())
}
