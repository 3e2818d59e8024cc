//! JavaScript runtimes through the real binary, over their whole life: what a JS guest
//! publishes, deletes and reports as a gap reaches SSE clients as such; a throw, an endless loop
//! and a memory bomb each fail only their batch; the state lives through `kill -9` and through
//! deploys (JS to JS, with and without `migrate`, and from the Rust ticker to a JS build of it);
//! a JS module made through `POST /admin/modules` runs as a runtime made through the API.

use std::time::Duration;

use anyhow::{ensure, Context as _};
use serde_json::json;
use viewtape_tests::server::{config_file, ADMIN_TOKEN_ENV};
use viewtape_tests::{cursor_offset, expect, EventStream, Response, Server, SseEvent};

const TOKEN: &str = "js-runtimes-token";

/// A guest of one-word commands, one per line: `put KEY VALUE`, `del KEY`, `gap REASON`,
/// `throw WHY`, `spin` (never ends), `bomb` (allocates without end).
const OPS: &str = r#"
export function init(config) {
  return { n: 0 };
}
export function onBatch(state, input, ctx) {
  for (const line of input.split('\n')) {
    const [op, key, arg] = line.split(' ');
    switch (op) {
      case 'put': state.n += 1; ctx.publish('items', key, { value: arg, n: state.n }); break;
      case 'del': ctx.delete('items', key); break;
      case 'gap': ctx.reportGap(`lost ${key}`); break;
      case 'throw': throw new Error(`refused ${key}`);
      case 'spin': while (true) {}
      case 'bomb': { const kept = []; while (true) kept.push(new Uint8Array(1 << 20)); }
      case '': break;
      default: throw new Error(`unknown op ${op}`);
    }
  }
  return state;
}
"#;

/// A counter, build 1: publishes `{count}` on view `count`, key `c`.
const COUNTER_V1: &str = r#"
export function init() { return { count: 0 }; }
export function onBatch(state, input, ctx) {
  state.count += 1;
  ctx.publish('count', 'c', { count: state.count, build: 1 });
  return state;
}
"#;

/// Build 2: another source, no `migrate`: it takes build 1's state as it is.
const COUNTER_V2: &str = r#"
export function init() { return { count: 0 }; }
export function onBatch(state, input, ctx) {
  state.count += 1;
  ctx.publish('count', 'c', { count: state.count, build: 2 });
  return state;
}
"#;

/// Build 3: renames the state's field through `migrate`.
const COUNTER_V3: &str = r#"
export function init() { return { total: 0 }; }
export function migrate(old) { return { total: old.count }; }
export function onBatch(state, input, ctx) {
  state.total += 1;
  ctx.publish('count', 'c', { count: state.total, build: 3 });
  return state;
}
"#;

/// `examples/js/ticker.js` with a `migrate` of its own.
fn js_ticker_with(migrate: &str) -> anyhow::Result<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/js/ticker.js");
    Ok(format!("{}\n{migrate}\n", std::fs::read_to_string(path)?))
}

/// Takes over the Rust ticker's state: the last seq as decimal text, or nothing before the
/// first tick (`examples/guests/ticker`, `save`).
const FROM_RUST_TICKER: &str = r#"
export function migrate(old) {
  if (typeof old !== 'string') return old;
  if (old === '') return { last: null };
  const last = Number(old);
  if (!Number.isSafeInteger(last)) throw new Error(`not a ticker state: ${old}`);
  return { last };
}
"#;

/// A server on `config` with the admin routes on.
async fn start(config: &str) -> anyhow::Result<(Server, tempfile::NamedTempFile)> {
    let file = config_file(config)?;
    let path = file.path().display().to_string();
    let server = Server::start_with_env(
        &["--config", &path, "--demo-rate", "0"],
        &[(ADMIN_TOKEN_ENV, TOKEN)],
    )
    .await?;
    server.ready(Duration::from_secs(30)).await?;
    Ok((server, file))
}

/// A `[[runtime]]` named `name` running the JS file `module` (kept by the caller).
fn runtime(name: &str, module: &std::path::Path, views: &str, extra: &str) -> String {
    format!(
        "[[runtime]]\nname = {name:?}\nmodule = {:?}\nviews = [{views:?}]\n{extra}",
        module.display().to_string()
    )
}

/// `source` written to a `.js` file.
fn js_file(source: &str) -> anyhow::Result<tempfile::NamedTempFile> {
    let file = tempfile::Builder::new().suffix(".js").tempfile()?;
    std::fs::write(file.path(), source)?;
    Ok(file)
}

/// An admin request with the token and `content_type`.
async fn admin(
    server: &Server,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> anyhow::Result<Response> {
    let headers = [("Content-Type", content_type)];
    server.admin(TOKEN, method, path, &headers, body).await
}

/// `PUT /admin/runtimes/{runtime}/module` with JavaScript.
async fn deploy_js(server: &Server, runtime: &str, source: &str) -> anyhow::Result<Response> {
    let path = format!("/admin/runtimes/{runtime}/module");
    admin(server, "PUT", &path, "text/javascript", source.as_bytes()).await
}

fn ok(resp: &Response) -> anyhow::Result<serde_json::Value> {
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    resp.json()
}

/// A counter's update: `{count, build}`; its id.
fn counted(event: SseEvent, count: u64, build: u64) -> anyhow::Result<String> {
    ensure!(event.event == "update", "{event:?}");
    ensure!(
        event.json()?["value"] == json!({"count": count, "build": build}),
        "expected count {count} of build {build}: {event:?}"
    );
    event.id.context("an id")
}

/// The next event, which must be `kind` of `key`.
async fn next(stream: &mut EventStream, kind: &str, key: &str) -> anyhow::Result<SseEvent> {
    let event = stream.next_event().await?;
    ensure!(
        event.event == kind && event.json()?["key"] == key,
        "expected {kind} of {key}, got {event:?}"
    );
    Ok(event)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_js_guest_publishes_deletes_reports_gaps_and_fails_only_its_batch() -> anyhow::Result<()>
{
    let module = js_file(OPS)?;
    let limits = "[runtime.limits]\nfuel = 40000000\nmemory = \"16MiB\"\n";
    let (server, _config) = start(&runtime("ops", module.path(), "items", limits)).await?;
    let mut stream = server.sse("/views/items/events", &[]).await?;
    stream.until_synced(10).await?;

    let receipt = ok(&server.ingest("ops", "put a 1\nput b 2\n").await?)?;
    ensure!(receipt["events"]["items"] == 2, "{receipt}");
    let a = next(&mut stream, "update", "a").await?;
    ensure!(a.json()?["value"] == json!({"value": "1", "n": 1}), "{a:?}");
    next(&mut stream, "update", "b").await?;
    ok(&server.ingest("ops", "del a\n").await?)?;
    let deleted = next(&mut stream, "delete", "a").await?;
    let before_gap = expect::cursor_of(&deleted)?;

    // A gap: the receipt names it, and a cursor from before it is refused with a reset.
    let receipt = ok(&server.ingest("ops", "gap feed-restart\nput c 3\n").await?)?;
    ensure!(receipt["gaps"] == json!(["lost feed-restart"]), "{receipt}");
    let mut resumed = server
        .sse(
            "/views/items/events",
            &[("Last-Event-ID", &before_gap.to_string())],
        )
        .await?;
    expect::reset(&resumed.next_event().await?, "gap")?;
    let (states, _) = resumed.until_synced(10).await?;
    let mut keys: Vec<_> = states
        .iter()
        .map(|e| Ok(e.json()?["key"].clone()))
        .collect::<anyhow::Result<_>>()?;
    keys.sort_by_key(ToString::to_string);
    ensure!(keys == [json!("b"), json!("c")], "{states:?}");
    // The live stream is told too: a reset, then the state as of after the batch, then on.
    expect::reset(&stream.next_event().await?, "gap")?;
    let (live_states, synced) = stream.until_synced(10).await?;
    ensure!(live_states.len() == 2, "{live_states:?}");
    let after_gap = expect::cursor_of(&synced)?;

    // A throw, an endless loop and a memory bomb each fail their batch whole: 422, no event,
    // and the next batch runs from the state before it.
    for (round, (batch, says)) in [
        ("put z 9\nthrow bad\n", "Error: refused bad"),
        ("put z 9\nspin\n", "CPU budget"),
        ("put z 9\nbomb\n", "memory limit"),
    ]
    .into_iter()
    .enumerate()
    {
        let resp = server.ingest("ops", batch).await?;
        let error = expect::json_error(&resp, 422)?;
        ensure!(
            error["message"].as_str().is_some_and(|m| m.contains(says)),
            "{batch:?}: {error}"
        );
        stream.expect_silence(Duration::from_millis(300)).await?;
        ok(&server.ingest("ops", "put d 4\n").await?)?;
        let d = next(&mut stream, "update", "d").await?;
        ensure!(
            d.json()?["value"]["n"] == 4 + round,
            "the failed batch counted: {d:?}"
        );
        // Undo, so every round starts alike.
        ok(&server.ingest("ops", "del d\n").await?)?;
        next(&mut stream, "delete", "d").await?;
    }
    let view = server.get("/views/items").await?.json()?;
    ensure!(
        view["entries"] == json!({"b": {"value": "2", "n": 2}, "c": {"value": "3", "n": 3}}),
        "nothing of a failed batch is seen: {view}"
    );
    // The cursor after the gap still resumes: failed batches took no offsets.
    let mut resumed = server
        .sse(
            "/views/items/events",
            &[("Last-Event-ID", &after_gap.to_string())],
        )
        .await?;
    let mut offset = after_gap.offset().get();
    for kind in ["update", "delete"].repeat(3) {
        let event = next(&mut resumed, kind, "d").await?;
        offset += 1;
        ensure!(
            expect::cursor_of(&event)?.offset().get() == offset,
            "{event:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_state_lives_through_kill_9_and_deploys_with_and_without_migrate() -> anyhow::Result<()>
{
    let module = js_file(COUNTER_V1)?;
    let (mut server, _config) = start(&runtime("counter", module.path(), "count", "")).await?;
    let mut stream = server.sse("/views/count/events", &[]).await?;
    stream.until_synced(10).await?;
    for n in 1..=2 {
        ok(&server.ingest("counter", "tick\n").await?)?;
        counted(stream.next_event().await?, n, 1)?;
    }

    // Build 2, no migrate: the state as it was.
    let deployed = ok(&deploy_js(&server, "counter", COUNTER_V2).await?)?;
    ensure!(
        deployed["module"]
            .as_str()
            .is_some_and(|m| m.starts_with("sha256:")),
        "{deployed}"
    );
    ok(&server.ingest("counter", "tick\n").await?)?;
    counted(stream.next_event().await?, 3, 2)?;

    // Build 3, through migrate.
    ok(&deploy_js(&server, "counter", COUNTER_V3).await?)?;
    ok(&server.ingest("counter", "tick\n").await?)?;
    let cursor = counted(stream.next_event().await?, 4, 3)?;

    // kill -9: the deployed build, its state replayed, the cursor resumes without a reset.
    drop(stream);
    server.kill9().await?;
    server.restart().await?;
    server.ready(Duration::from_secs(30)).await?;
    let mut resumed = server
        .sse("/views/count/events", &[("Last-Event-ID", &cursor)])
        .await?;
    resumed.expect_silence(Duration::from_millis(300)).await?;
    ok(&server.ingest("counter", "tick\n").await?)?;
    let id = counted(resumed.next_event().await?, 5, 3)?;
    ensure!(
        cursor_offset(&id)? == cursor_offset(&cursor)? + 1,
        "offsets go on: {id} after {cursor}"
    );

    // A build whose migrate throws is refused; build 3 keeps running.
    let refused = deploy_js(
        &server,
        "counter",
        &COUNTER_V3.replace("return { total: old.count };", "throw new Error('no way');"),
    )
    .await?;
    let error = expect::json_error(&refused, 422)?;
    ensure!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("no way")),
        "{error}"
    );
    ok(&server.ingest("counter", "tick\n").await?)?;
    counted(resumed.next_event().await?, 6, 3)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_ticker_deploys_to_a_js_build_whose_migrate_reads_its_state() -> anyhow::Result<()>
{
    let config =
        "[[runtime]]\nname = \"demo\"\nmodule = \"builtin:ticker\"\nviews = [\"prices\"]\n";
    let (mut server, _config) = start(config).await?;
    let mut stream = server.sse("/views/prices/events", &[]).await?;
    stream.until_synced(10).await?;
    let tick = |seq: u64| format!("{{\"symbol\":\"ACME\",\"price\":{seq}.5,\"seq\":{seq}}}\n");
    for seq in 1..=3 {
        ok(&server.ingest("demo", &tick(seq)).await?)?;
        expect::update(&stream.next_event().await?, seq, "ACME", seq)?;
    }

    let definition = ok(&admin(
        &server,
        "GET",
        "/admin/runtimes/demo",
        "application/json",
        b"",
    )
    .await?)?;
    let rust_module = definition["status"]["running_module"].clone();
    // Refused: a JS build without a migrate cannot read the Rust state, and one whose migrate
    // throws refuses it; the Rust ticker keeps running, its state untouched.
    for (source, says) in [
        (js_ticker_with("")?, "export migrate(old)"),
        (
            js_ticker_with(
                "export function migrate(old) { throw new Error(`cannot read ${old}`); }",
            )?,
            "cannot read 3",
        ),
    ] {
        let resp = deploy_js(&server, "demo", &source).await?;
        let error = expect::json_error(&resp, 422)?;
        ensure!(
            error["message"].as_str().is_some_and(|m| m.contains(says)),
            "{error}"
        );
    }
    let definition = ok(&admin(
        &server,
        "GET",
        "/admin/runtimes/demo",
        "application/json",
        b"",
    )
    .await?)?;
    ensure!(
        definition["status"]["running_module"] == rust_module
            && definition["status"]["batches"] == 3,
        "{definition}"
    );
    ok(&server.ingest("demo", &tick(4)).await?)?;
    expect::update(&stream.next_event().await?, 4, "ACME", 4)?;

    // Accepted: migrate reads the last seq; the JS build goes on from it.
    let deployed = ok(&deploy_js(&server, "demo", &js_ticker_with(FROM_RUST_TICKER)?).await?)?;
    ensure!(deployed["previous"] == rust_module, "{deployed}");
    let definition = ok(&admin(
        &server,
        "GET",
        "/admin/runtimes/demo",
        "application/json",
        b"",
    )
    .await?)?;
    ensure!(
        definition["status"]["running_module"] == deployed["module"],
        "{definition} {deployed}"
    );
    // seq 4 again is a redelivery (no event); 6 is after a gap of one.
    let receipt = ok(&server.ingest("demo", &tick(4)).await?)?;
    ensure!(
        receipt["events"].get("prices").is_none_or(|n| n == 0),
        "{receipt}"
    );
    let receipt = ok(&server.ingest("demo", &tick(6)).await?)?;
    ensure!(
        receipt["gaps"] == json!(["ticker seq jumped from 4 to 6: 1 tick(s) missing"]),
        "{receipt}"
    );
    let event = stream.next_except(&["reset"]).await?;
    ensure!(event.json()?["value"]["seq"] == 6, "{event:?}");

    // And after kill -9 the JS build runs on from the replayed state.
    drop(stream);
    server.kill9().await?;
    server.restart().await?;
    server.ready(Duration::from_secs(30)).await?;
    let receipt = ok(&server.ingest("demo", &tick(7)).await?)?;
    ensure!(
        receipt["events"]["prices"] == 1 && receipt["gaps"].as_array().is_none_or(Vec::is_empty),
        "{receipt}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_js_module_posted_to_the_api_runs_as_a_runtime_made_by_put() -> anyhow::Result<()> {
    let server = Server::start_with_env(&["--demo-rate", "0"], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
    server.ready(Duration::from_secs(30)).await?;
    let kept = ok(&admin(
        &server,
        "POST",
        "/admin/modules",
        "text/javascript",
        OPS.as_bytes(),
    )
    .await?)?;
    ensure!(kept["kind"] == "js" && kept["bytes"] == OPS.len(), "{kept}");
    let module = kept["module"].as_str().context("module")?;
    ensure!(module.starts_with("sha256:"), "{kept}");
    // A source that does not compile is refused there, naming the line.
    let broken = admin(
        &server,
        "POST",
        "/admin/modules",
        "text/javascript",
        b"export function onBatch(s) {\n  return s +;\n}\n",
    )
    .await?;
    let error = expect::json_error(&broken, 422)?;
    ensure!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("guest.js:2:")),
        "{error}"
    );

    let definition = json!({"module": module, "views": ["items"]});
    let made = admin(
        &server,
        "PUT",
        "/admin/runtimes/x",
        "application/json",
        definition.to_string().as_bytes(),
    )
    .await?;
    ensure!(made.status() == 201, "{} {}", made.status(), made.text());
    let mut stream = server.sse("/views/items/events", &[]).await?;
    stream.until_synced(10).await?;
    ok(&server.ingest("x", "put k hello\n").await?)?;
    let event = next(&mut stream, "update", "k").await?;
    ensure!(
        event.json()?["value"] == json!({"value": "hello", "n": 1}),
        "{event:?}"
    );
    Ok(())
}

/// A guest that writes a forged log line (a newline, then what looks like a line of the
/// server's, with an escape sequence), and then thousands of lines in one batch.
const NOISY: &str = r#"
export function init() { return {}; }
export function onBatch(state, input, ctx) {
  ctx.log('warn', 'ok\n2026-01-01T00:00:00.000000Z  INFO viewtape_server::http::admin: admin: forged \u001b[31mred');
  for (let i = 0; i < 5000; i++) ctx.log('info', `noise ${i}`);
  throw new Error('refused\nFORGED-ERROR-LINE');
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_text_is_escaped_and_bounded_in_the_servers_log() -> anyhow::Result<()> {
    let module = js_file(NOISY)?;
    let (server, _config) = start(&runtime("noisy", module.path(), "out", "")).await?;
    let resp = server.ingest("noisy", "go\n").await?;
    ensure!(resp.status() == 422, "{} {}", resp.status(), resp.text());
    ensure!(!resp.text().contains("refused\n"), "{}", resp.text());
    let logs = server.logs();
    ensure!(
        logs.lines().all(|line| !line.starts_with("2026-01-01")
            && !line.starts_with("FORGED-ERROR-LINE")
            && !line.contains('\u{1b}')),
        "a guest forged a log line:\n{logs}"
    );
    ensure!(
        logs.contains(r"ok\n2026-01-01"),
        "the guest's line, escaped"
    );
    let noise = logs.lines().filter(|line| line.contains("noise ")).count();
    ensure!(
        noise <= 100,
        "{noise} guest lines of one batch reached the log"
    );
    ensure!(logs.contains("guest log lines dropped"), "the drop is said");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_text_is_a_field_of_json_logs() -> anyhow::Result<()> {
    let module = js_file(NOISY)?;
    let config = config_file(&runtime("noisy", module.path(), "out", ""))?;
    let path = config.path().display().to_string();
    let server = Server::start_with_env(
        &[
            "--config",
            &path,
            "--demo-rate",
            "0",
            "--log-format",
            "json",
        ],
        &[],
    )
    .await?;
    let resp = server.ingest("noisy", "go\n").await?;
    ensure!(resp.status() == 422, "{} {}", resp.status(), resp.text());
    let logs = server.logs();
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .with_context(|| format!("every line is one JSON object:\n{logs}"))?;
    let guest: Vec<&str> = lines
        .iter()
        .filter_map(|line| line["guest"].as_str())
        .collect();
    ensure!(
        guest.iter().any(|text| text.starts_with(r"ok\n2026-01-01")),
        "the guest's text, escaped, in its own field: {guest:?}"
    );
    ensure!(
        lines.iter().all(|line| line["message"]
            .as_str()
            .is_none_or(|message| !message.contains("forged"))),
        "no guest text in a message of the server's"
    );
    Ok(())
}
