//! The guest author's tools through the real binary: `viewtape run` over recorded input, and
//! `viewtape new` → `cargo test` → a wasm build → `viewtape run` → `viewtape deploy` of new
//! builds into a running server with a subscriber attached.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{ensure, Context as _};
use tokio::io::AsyncWriteExt;
use viewtape_tests::server::{binary, cli, run_guest, ADMIN_TOKEN_ENV};
use viewtape_tests::Server;

/// Also: `viewtape run` exited 0 when batches failed; it still runs every batch and saves the
/// state, then exits 1 saying how many failed.
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
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.code() == Some(1), "{stdout}\n{stderr}");
    ensure!(
        stderr.contains("error: 1 of 3 batches failed"),
        "{stdout}\n{stderr}"
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
    ensure!(
        std::fs::read(&state)? == b"\xffVTS\0\0\0\x003",
        "saved state"
    );
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
            // Built as a user's crate is: none of this run's compiler settings (scripts/test
            // compiles the workspace through clippy) reach it.
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .env_remove("CLIPPY_ARGS")
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

/// `viewtape run` on a file that is not WebAssembly printed wasmtime's parser message with a
/// dump of the bytes it found: one line of ours, naming the file and what to give instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_on_a_file_that_is_not_wasm_says_so_in_one_line() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // Text would be taken for JavaScript (and refused as JavaScript that does not compile):
    // a compressed file is neither.
    let path = dir.path().join("input.ndjson.gz");
    std::fs::write(&path, b"\x1f\x8b\x08\0\0\0\0\0")?;
    let path = path.display().to_string();
    let (code, output) = cli(&["run", &path], &[]).await?;
    ensure!(code == 1, "exit {code}:\n{output}");
    ensure!(
        output.trim_end()
            == format!(
                "error: {path}: not a WebAssembly module (it does not start with `\\0asm`): give \
                 the .wasm a guest's build writes (cargo build --target wasm32-unknown-unknown), \
                 or a JavaScript module's source"
            ),
        "{output}"
    );
    Ok(())
}

/// `viewtape new` wrote the absolute path of the checkout the binary was built in into the new
/// crate, which exists on no user's machine: by default the crate depends on the SDK of the
/// binary's release by git; a path only with `--sdk`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_guest_depends_on_the_releases_sdk_not_on_the_build_machine() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let parent = dir.path().display().to_string();
    let (code, output) = cli(&["new", "orders", "--dir", &parent], &[]).await?;
    ensure!(code == 0, "exit {code}:\n{output}");
    let manifest = std::fs::read_to_string(dir.path().join("orders/Cargo.toml"))?;
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the checkout")?
        .canonicalize()?;
    ensure!(
        !manifest.contains(&*checkout.to_string_lossy()) && !manifest.contains("path ="),
        "{manifest}"
    );
    ensure!(
        manifest.contains(&format!(
            "viewtape-guest = {{ git = \"https://github.com/viewtape/viewtape\", tag = \"v{}\", \
             features = [\"schema\"] }}",
            env!("CARGO_PKG_VERSION")
        )),
        "{manifest}"
    );
    Ok(())
}

/// With `--sdk` (this checkout's SDK, so that it builds offline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_guest_builds_passes_its_tests_and_runs() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime-guest");
    let out = tokio::process::Command::new(binary().await?)
        .args(["new", "orders", "--dir"])
        .arg(dir.path())
        .arg("--sdk")
        .arg(&sdk)
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
    let module = wasm.display().to_string();
    let (ok, lines) = run_guest(&[&module], std::fs::read(crate_dir.join("input.ndjson"))?).await?;
    ensure!(ok, "{lines:?}");
    let last_alice = lines
        .iter()
        .rfind(|l| l["update"]["key"] == "alice")
        .context("no update for alice")?;
    ensure!(
        last_alice["update"]["view"] == "orders" && last_alice["update"]["value"]["total"] == 3,
        "{lines:?}"
    );
    deploy_builds_into_a_running_server(&crate_dir, &wasm).await
}

/// `viewtape deploy orders WASM` against `server`.
async fn deploy(server: &Server, token: &str, wasm: &Path) -> anyhow::Result<(i32, String)> {
    let path = wasm.display().to_string();
    let addr = server.addr().to_string();
    cli(
        &["deploy", "orders", &path, "--server", &addr],
        &[(ADMIN_TOKEN_ENV, token)],
    )
    .await
}

/// Build 1 of the scaffolded guest serves; build 2 (another payload) is deployed with
/// subscribers attached and carries the running totals over; build 3 (a new state version
/// without a migration) is refused while build 2 keeps serving; a crash and restart keep the
/// epoch and build 2.
async fn deploy_builds_into_a_running_server(crate_dir: &Path, built: &Path) -> anyhow::Result<()> {
    let keep = tempfile::tempdir()?;
    let build1 = keep.path().join("orders-1.wasm");
    std::fs::copy(built, &build1)?;
    let config = keep.path().join("viewtape.toml");
    std::fs::write(
        &config,
        format!(
            "[[runtime]]\nname = \"orders\"\nwasm = {:?}\nviews = [\"orders\"]\n",
            build1.display().to_string()
        ),
    )?;
    let config = config.display().to_string();
    let token = "guest-tools-token";
    let mut server =
        Server::start_with_env(&["--config", &config], &[(ADMIN_TOKEN_ENV, token)]).await?;
    let mut stream = server.sse("/views/orders/events", &[]).await?;
    stream.until_synced(10).await?;
    let order = |amount: i64| format!("{{\"key\":\"alice\",\"amount\":{amount}}}\n");
    let ingest = |server: &Server, amount: i64| {
        let body = order(amount);
        let addr = server.addr();
        async move {
            let resp = viewtape_tests::http::request(
                addr,
                "POST",
                "/runtimes/orders/ingest",
                &[],
                body.as_bytes(),
            )
            .await?;
            ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
            anyhow::Ok(())
        }
    };
    ingest(&server, 5).await?;
    let first = stream.next_event().await?;
    ensure!(first.data.contains("\"total\":5"), "{first:?}");

    // Build 2 publishes one more field; the totals carry over.
    let source = crate_dir.join("src/lib.rs");
    let text = std::fs::read_to_string(&source)?;
    let build2 = text.replace(
        "serde_json::to_writer(buf, &total)",
        "serde_json::to_writer(buf, &serde_json::json!({ \"total\": total.total, \"build\": 2 }))",
    );
    ensure!(build2 != text, "the scaffold's payload line moved");
    std::fs::write(&source, &build2)?;
    let wasm_build = [
        "build",
        "--release",
        "--target",
        "wasm32-unknown-unknown",
        "--quiet",
    ];
    cargo(crate_dir, &wasm_build).await?;
    let (code, out) = deploy(&server, token, built).await?;
    ensure!(code == 0, "{out}");
    ingest(&server, 3).await?;
    let carried = stream.next_event().await?;
    ensure!(
        carried.event == "update"
            && carried.data.contains("\"total\":8")
            && carried.data.contains("\"build\":2"),
        "the deployed build runs on the carried-over total: {carried:?}"
    );

    // Build 3 changes its state version without a migration: refused, build 2 serves on.
    std::fs::write(
        &source,
        build2.replace(
            "impl Runtime for Totals {",
            "impl Runtime for Totals {\n    const STATE_VERSION: u32 = 1;\n",
        ),
    )?;
    cargo(crate_dir, &wasm_build).await?;
    let (code, out) = deploy(&server, token, built).await?;
    ensure!(
        code != 0 && out.contains("no migration from state version 0"),
        "{out}"
    );
    ingest(&server, 1).await?;
    let still = stream.next_event().await?;
    ensure!(
        still.data.contains("\"total\":9") && still.data.contains("\"build\":2"),
        "{still:?}"
    );

    // A crash: the same epoch, build 2, the totals.
    let last = still.id.clone().context("an id")?;
    drop(stream);
    server.kill9().await?;
    server.restart().await?;
    let mut resumed = server
        .sse("/views/orders/events", &[("Last-Event-ID", &last)])
        .await?;
    resumed.expect_silence(Duration::from_millis(300)).await?;
    ingest(&server, 1).await?;
    let after = resumed.next_event().await?;
    ensure!(
        after.event == "update"
            && after.data.contains("\"total\":10")
            && after.data.contains("\"build\":2"),
        "{after:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_dump_gives_a_runtimes_input_that_viewtape_run_replays() -> anyhow::Result<()> {
    let server = Server::start(&["--demo-rate", "0"]).await?;
    let mut feed = viewtape_tests::Feed::new(&["ACME", "BOLT"]);
    let batches = [feed.batch(3), feed.batch(2)];
    for batch in &batches {
        server.ingest_ok(batch).await?;
    }
    let log = server.data_dir().join("log").display().to_string();
    let (code, out) = cli(&["log", "dump", &log, "demo"], &[]).await?;
    ensure!(code == 0, "{out}");
    let dumped = batches.concat();
    ensure!(
        out == format!("{dumped}2 batches of runtime \"demo\"\n"),
        "the input as it arrived, then the count (stderr):\n{out}"
    );

    // Replayed through the same guest: the same five ticks, no gap, no error.
    let mut child = tokio::process::Command::new(binary().await?)
        .arg("run")
        .arg(viewtape_tests::server::guest_wasm("ticker"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().context("stdin")?;
    stdin.write_all(dumped.as_bytes()).await?;
    drop(stdin);
    let run = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await??;
    let stdout = String::from_utf8_lossy(&run.stdout);
    ensure!(run.status.success(), "{stdout}");
    ensure!(
        stdout.matches("\"update\"").count() == 5
            && !stdout.contains("\"gap\"")
            && !stdout.contains("\"error\""),
        "{stdout}"
    );

    // The data dir instead of its log, and a runtime that logged nothing: said, and exit 1.
    let data = server.data_dir().display().to_string();
    let (code, out) = cli(&["log", "dump", &data, "demo"], &[]).await?;
    ensure!(
        code == 1 && out.contains("looks like a data directory"),
        "{out}"
    );
    let (code, out) = cli(&["log", "dump", &log, "nope"], &[]).await?;
    ensure!(
        code == 1 && out.contains("no batch of runtime \"nope\""),
        "{out}"
    );
    Ok(())
}
