//! Runtimes and views at run time, against the real binary: a runtime made with one request
//! takes ingest at once and lives through `kill -9`; a replacement keeps the guest's state; a
//! pattern view serves a stream before its first event, and reads of names nothing was
//! published to leave no view; a deletion retires the views' streams, and a view made again
//! never serves an old cursor for another event; bad definitions are refused naming the field.

use std::time::Duration;

use anyhow::{ensure, Context as _};
use viewtape_tests::server::{guest_wasm, with_custom_section, ADMIN_TOKEN_ENV};
use viewtape_tests::{http, EventStream, Response, Server};

const TOKEN: &str = "runtimes-api-token";

async fn start() -> anyhow::Result<Server> {
    Server::start_with_env(&[], &[(ADMIN_TOKEN_ENV, TOKEN)]).await
}

/// An admin request with the token.
async fn admin(server: &Server, method: &str, path: &str, body: &[u8]) -> anyhow::Result<Response> {
    server.admin(TOKEN, method, path, &[], body).await
}

/// `PUT /admin/runtimes/{runtime}` with `definition`, expecting `status`.
async fn put(
    server: &Server,
    runtime: &str,
    definition: serde_json::Value,
    status: u16,
) -> anyhow::Result<serde_json::Value> {
    let path = format!("/admin/runtimes/{runtime}");
    let resp = admin(server, "PUT", &path, definition.to_string().as_bytes()).await?;
    ensure!(resp.status() == status, "{} {}", resp.status(), resp.text());
    Ok(serde_json::from_str(&resp.text())?)
}

/// One `builtin:json` line.
fn line(view: &str, key: &str, value: serde_json::Value) -> String {
    format!(
        "{}\n",
        serde_json::json!({"view": view, "key": key, "value": value})
    )
}

async fn ingest_ok(server: &Server, runtime: &str, body: &str) -> anyhow::Result<()> {
    let resp = server.ingest(runtime, body).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    Ok(())
}

/// The next event of `stream`, which must be an update of `key`; its id.
async fn update(stream: &mut EventStream, key: &str) -> anyhow::Result<String> {
    let event = stream.next_event().await?;
    ensure!(event.event == "update", "{event:?}");
    ensure!(event.json()?["key"] == key, "{event:?}");
    event.id.context("an update has an id")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_made_by_one_request_takes_ingest_and_lives_through_kill_9() -> anyhow::Result<()>
{
    let mut server = start().await?;
    let made = put(
        &server,
        "chat",
        serde_json::json!({"module": "builtin:json", "views": ["chat.*"]}),
        201,
    )
    .await?;
    ensure!(made["views"] == serde_json::json!(["chat.*"]), "{made}");
    ensure!(made["declared_by"] == "record", "{made}");

    // A stream opened on a name the pattern takes, before any event: the empty state, synced,
    // then the first event live.
    let mut stream = server.sse("/views/chat.room-7/events", &[]).await?;
    let (states, _) = stream.until_synced(0).await?;
    ensure!(states.is_empty());
    ingest_ok(
        &server,
        "chat",
        &line("chat.room-7", "m1", serde_json::json!({"text": "hi"})),
    )
    .await?;
    let first = update(&mut stream, "m1").await?;
    let listed = server.get("/views").await?.text();
    ensure!(listed.contains("\"chat.room-7\""), "{listed}");
    // A name no runtime takes stays unknown.
    ensure!(server.get("/views/news.x").await?.status() == 404);

    server.kill9().await?;
    server.restart().await?;
    // The runtime is back without any config, and the cursor resumes: no reset.
    let mut resumed = server
        .sse("/views/chat.room-7/events", &[("Last-Event-ID", &first)])
        .await?;
    ingest_ok(
        &server,
        "chat",
        &line("chat.room-7", "m2", serde_json::json!({"text": "again"})),
    )
    .await?;
    let next = resumed.next_event().await?;
    ensure!(
        next.event == "update",
        "a resume after kill -9 is not reset: {next:?}"
    );
    ensure!(next.json()?["key"] == "m2", "{next:?}");
    let state = server.get("/views/chat.room-7").await?.text();
    ensure!(
        state.contains("\"m1\"") && state.contains("\"m2\""),
        "{state}"
    );
    Ok(())
}

/// `misbehave` with a custom section: the same counting guest, another module.
fn counter(build: u8) -> anyhow::Result<Vec<u8>> {
    let wasm = std::fs::read(guest_wasm("misbehave"))?;
    Ok(with_custom_section(&wasm, "build", &[build]))
}

/// Uploads `wasm`; its fingerprint.
async fn upload(server: &Server, wasm: &[u8]) -> anyhow::Result<String> {
    let resp = admin(server, "POST", "/admin/modules", wasm).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let kept: serde_json::Value = serde_json::from_str(&resp.text())?;
    ensure!(
        kept["kind"] == "wasm" && kept["bytes"] == wasm.len(),
        "{kept}"
    );
    // The same bytes twice: the same answer.
    let again = admin(server, "POST", "/admin/modules", wasm).await?;
    ensure!(again.text() == resp.text());
    Ok(kept["module"].as_str().context("module")?.to_owned())
}

/// Sends `count`; the count the guest published.
async fn count(server: &Server, stream: &mut EventStream) -> anyhow::Result<u64> {
    ingest_ok(server, "counter", "count\n").await?;
    let event = stream.next_event().await?;
    ensure!(event.event == "update", "{event:?}");
    event.json()?["value"].as_u64().context("a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_keeps_the_state_and_retires_the_views_it_drops() -> anyhow::Result<()> {
    let server = start().await?;
    let first = upload(&server, &counter(0)?).await?;
    let second = upload(&server, &counter(1)?).await?;
    ensure!(first != second);
    put(
        &server,
        "counter",
        serde_json::json!({"module": first, "views": ["state", "extra"]}),
        201,
    )
    .await?;
    let mut stream = server.sse("/views/state/events", &[]).await?;
    stream.until_synced(10).await?;
    let mut extra = server.sse("/views/extra/events", &[]).await?;
    extra.until_synced(10).await?;
    for expected in 1..=3 {
        ensure!(count(&server, &mut stream).await? == expected);
    }
    // The same definition again changes nothing.
    let same = serde_json::json!({"module": first, "views": ["state", "extra"]});
    put(&server, "counter", same, 200).await?;

    let replaced = put(
        &server,
        "counter",
        serde_json::json!({"module": second, "views": ["state"]}),
        200,
    )
    .await?;
    ensure!(replaced["status"]["running_module"] == second, "{replaced}");
    // The state carried over: the count goes on, on the same stream, with no reset.
    ensure!(count(&server, &mut stream).await? == 4);
    // The view it no longer declares is retired: its stream ends, its reads are 404.
    let last = extra.next_event().await?;
    ensure!(last.event == "retired" && last.id.is_none(), "{last:?}");
    ensure!(last.json()?["view"] == "extra");
    ensure!(extra.next_within(Duration::from_secs(5)).await?.is_none());
    ensure!(server.get("/views/extra").await?.status() == 404);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_retires_the_streams_and_a_view_made_again_resets_old_cursors(
) -> anyhow::Result<()> {
    let server = start().await?;
    let chat = serde_json::json!({"module": "builtin:json", "views": ["chat.*"]});
    put(&server, "chat", chat.clone(), 201).await?;
    let mut stream = server.sse("/views/chat.a/events", &[]).await?;
    stream.until_synced(0).await?;
    ingest_ok(&server, "chat", &line("chat.a", "k1", serde_json::json!(1))).await?;
    update(&mut stream, "k1").await?;
    ingest_ok(&server, "chat", &line("chat.a", "k2", serde_json::json!(2))).await?;
    let old = update(&mut stream, "k2").await?;

    let resp = admin(&server, "DELETE", "/admin/runtimes/chat", b"").await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let last = stream.next_event().await?;
    ensure!(last.event == "retired" && last.id.is_none(), "{last:?}");
    ensure!(stream.next_within(Duration::from_secs(5)).await?.is_none());
    let refused = server
        .ingest("chat", &line("chat.a", "k3", serde_json::json!(3)))
        .await?;
    ensure!(
        refused.status() == 404,
        "{} {}",
        refused.status(),
        refused.text()
    );
    ensure!(server.get("/views/chat.a").await?.status() == 404);
    let gone = admin(&server, "GET", "/admin/runtimes/chat", b"").await?;
    ensure!(gone.status() == 404);
    let again = admin(&server, "DELETE", "/admin/runtimes/chat", b"").await?;
    ensure!(again.status() == 404);

    // Made again, under the same name: the old cursor never names the new event.
    put(&server, "chat", chat, 201).await?;
    ingest_ok(
        &server,
        "chat",
        &line("chat.a", "new", serde_json::json!(9)),
    )
    .await?;
    let mut resumed = server
        .sse("/views/chat.a/events", &[("Last-Event-ID", &old)])
        .await?;
    let first = resumed.next_event().await?;
    ensure!(
        first.event == "reset",
        "an old cursor must be reset: {first:?}"
    );
    let (states, _) = resumed.until_synced(10).await?;
    ensure!(states.len() == 1, "only the new view's state: {states:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_definitions_are_refused_naming_the_field() -> anyhow::Result<()> {
    let server = start().await?;
    let code = |resp: &Response| -> anyhow::Result<(u16, serde_json::Value)> {
        Ok((resp.status(), serde_json::from_str(&resp.text())?))
    };
    let cases: [(&str, &[u8], u16, Option<&str>); 9] = [
        ("a", b"not json", 400, None),
        ("a", b"[1]", 400, None),
        ("a", br#"{"views":["x"]}"#, 400, None),
        (
            "a",
            br#"{"module":"builtin:json","views":["x"],"extra":1}"#,
            400,
            None,
        ),
        (
            "a",
            br#"{"module":"builtin:json","views":"x"}"#,
            422,
            Some("views"),
        ),
        (
            "a",
            br#"{"module":"builtin:nope","views":["x"]}"#,
            422,
            Some("module"),
        ),
        (
            "a",
            br#"{"module":"builtin:json","views":["x","a b"]}"#,
            422,
            Some("views[1]"),
        ),
        (
            "a",
            br#"{"module":"builtin:json","views":["x"],"schemas":{"x":{"type":"nope"}}}"#,
            422,
            Some("schemas.x"),
        ),
        (
            "a",
            br#"{"module":"builtin:json","views":["x"],"limits":{"fuel":0}}"#,
            422,
            Some("limits.fuel"),
        ),
    ];
    for (runtime, body, status, field) in cases {
        let resp = admin(&server, "PUT", &format!("/admin/runtimes/{runtime}"), body).await?;
        let (got, json) = code(&resp)?;
        ensure!(
            got == status,
            "{}: {got} {json}",
            String::from_utf8_lossy(body)
        );
        if let Some(field) = field {
            ensure!(
                json["field"] == field,
                "{}: {json}",
                String::from_utf8_lossy(body)
            );
        }
    }
    let unknown = format!(r#"{{"module":"sha256:{}","views":["x"]}}"#, "0".repeat(64));
    let resp = admin(&server, "PUT", "/admin/runtimes/a", unknown.as_bytes()).await?;
    ensure!(
        resp.status() == 422 && resp.text().contains("\"module\""),
        "{}",
        resp.text()
    );

    // Overlaps with another runtime's views: the demo publishes `prices`.
    for views in [r#"["prices"]"#, r#"["pri*"]"#, r#"["*"]"#] {
        let body = format!(r#"{{"module":"builtin:json","views":{views}}}"#);
        let resp = admin(&server, "PUT", "/admin/runtimes/other", body.as_bytes()).await?;
        let (status, json) = code(&resp)?;
        ensure!(
            status == 409 && json["error"] == "view_conflict",
            "{views}: {json}"
        );
        ensure!(json["runtime"] == "demo", "{json}");
    }
    // Without the token, nothing.
    let resp = http::request(server.addr(), "PUT", "/admin/runtimes/a", &[], b"{}").await?;
    ensure!(resp.status() == 401);
    // Nothing was made by any of it.
    let listed = server.get("/views").await?.text();
    ensure!(!listed.contains("\"x\""), "{listed}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_runtime_quick_start_works_as_written() -> anyhow::Result<()> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))?;
    let block = readme
        .split_once("<!-- quick-start-runtime")
        .and_then(|(_, rest)| rest.split_once("```sh\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block)
        .context("the README's quick-start runtime block")?;
    let quoted = |after: &str, quote: char| {
        block
            .split_once(after)
            .and_then(|(_, rest)| rest.split_once(quote))
            .map(|(text, _)| text.replace("\\n", "\n"))
    };
    let definition = quoted("-d '", '\'').context("the PUT body")?;
    let payload = quoted("--data-binary $'", '\'').context("the ingest payload")?;
    let shown = block
        .lines()
        .find_map(|line| line.strip_prefix("# "))
        .context("the receipt shown")?;
    ensure!(block.contains("/admin/runtimes/chat") && block.contains("/runtimes/chat/ingest"));

    let server = Server::start_with_env(&[], &[(ADMIN_TOKEN_ENV, "dev")]).await?;
    let auth = "Bearer dev";
    let made = http::request(
        server.addr(),
        "PUT",
        "/admin/runtimes/chat",
        &[("Authorization", auth)],
        definition.as_bytes(),
    )
    .await?;
    ensure!(made.status() == 201, "{} {}", made.status(), made.text());
    let mut stream = server.sse("/views/chat.room-7/events", &[]).await?;
    stream.until_synced(0).await?;
    let receipt = server.ingest("chat", &payload).await?;
    ensure!(receipt.status() == 200, "{}", receipt.text());
    let events = receipt.json()?["events"].to_string();
    ensure!(
        shown.contains(&events),
        "got {events}, the README shows {shown}"
    );
    update(&mut stream, "m1").await?;
    Ok(())
}

/// The embedded demo is a config's runtime like any other: changed or deleted through the API,
/// it stays so across restarts (the log wins), with what it acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_changed_or_deleted_through_the_api_stays_so() -> anyhow::Result<()> {
    let mut server = start().await?;
    let tick = |seq: u64| format!("{{\"symbol\":\"ACME\",\"price\":1.5,\"seq\":{seq}}}\n");
    ingest_ok(&server, "demo", &tick(1)).await?;
    put(
        &server,
        "demo",
        serde_json::json!({"module": "builtin:ticker", "views": ["prices"], "config": "other"}),
        200,
    )
    .await?;
    ingest_ok(&server, "demo", &tick(2)).await?;
    server.kill9().await?;
    server.restart().await?;
    let back = admin(&server, "GET", "/admin/runtimes/demo", b"").await?;
    let back: serde_json::Value = serde_json::from_str(&back.text())?;
    ensure!(
        back["config"] == "other",
        "the API's definition stands: {back}"
    );
    let state = server.get("/views/prices").await?.json()?;
    ensure!(state["entries"]["ACME"]["seq"] == 2, "{state}");

    // Deleted: it stays deleted across restarts, graceful or not.
    let resp = admin(&server, "DELETE", "/admin/runtimes/demo", b"").await?;
    ensure!(resp.status() == 200, "{}", resp.text());
    ensure!(server.ingest("demo", &tick(3)).await?.status() == 404);
    ensure!(server.get("/views/prices").await?.status() == 404);
    server.kill9().await?;
    server.restart().await?;
    ensure!(server.ingest("demo", &tick(3)).await?.status() == 404);
    admin(&server, "POST", "/admin/snapshot", b"").await?;
    server.stop_graceful().await?;
    server.restart().await?;
    ensure!(server.ingest("demo", &tick(3)).await?.status() == 404);
    ensure!(server.get("/views/prices").await?.status() == 404);
    Ok(())
}

/// A batch that waited in the queue of a runtime while it was replaced runs on the replacement
/// (it never ran on the old task); one that waited while it was deleted is `404`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_queued_across_a_replacement_runs_on_the_replacement() -> anyhow::Result<()> {
    let server = start().await?;
    let first = upload(&server, &counter(0)?).await?;
    let second = upload(&server, &counter(1)?).await?;
    // `loop` runs for a few seconds before it runs out of fuel: the window in which the
    // requests below queue up behind it, in the order they are sent.
    let limits = serde_json::json!({"fuel": 60_000_000_000u64, "batch_timeout": "60s"});
    let definition = |module: &str| serde_json::json!({"module": module, "views": ["state"], "limits": limits.clone()});
    put(&server, "counter", definition(&first), 201).await?;
    let addr = server.addr();
    let send = move |method: &'static str, path: &'static str, body: Vec<u8>| {
        let auth = format!("Bearer {TOKEN}");
        tokio::spawn(async move {
            http::request(addr, method, path, &[("Authorization", &auth)], &body).await
        })
    };
    // The task is busy with a batch that runs out of fuel; the replacement waits behind it,
    // and `count` behind the replacement.
    let busy = send("POST", "/runtimes/counter/ingest", b"loop\n".to_vec());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let replace = send(
        "PUT",
        "/admin/runtimes/counter",
        definition(&second).to_string().into_bytes(),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queued = send("POST", "/runtimes/counter/ingest", b"count\n".to_vec());
    let busy = busy.await??;
    ensure!(busy.status() == 422, "{} {}", busy.status(), busy.text());
    let replace = replace.await??;
    ensure!(
        replace.status() == 200,
        "{} {}",
        replace.status(),
        replace.text()
    );
    let queued = queued.await??;
    ensure!(
        queued.status() == 200,
        "{} {}",
        queued.status(),
        queued.text()
    );
    let state = server.get("/views/state").await?.json()?;
    ensure!(state["entries"]["count"] == 1, "{state}");

    // The same with a deletion: the waiting batch learns that the runtime is gone.
    let busy = send("POST", "/runtimes/counter/ingest", b"loop\n".to_vec());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let delete = send("DELETE", "/admin/runtimes/counter", Vec::new());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queued = send("POST", "/runtimes/counter/ingest", b"count\n".to_vec());
    ensure!(busy.await??.status() == 422);
    ensure!(delete.await??.status() == 200);
    let queued = queued.await??;
    ensure!(
        queued.status() == 404,
        "{} {}",
        queued.status(),
        queued.text()
    );
    Ok(())
}

/// The names of the `chat.` views `GET /views` lists.
async fn listed_chats(server: &Server) -> anyhow::Result<Vec<String>> {
    let listed = server.get("/views").await?.json()?;
    let mut chats = Vec::new();
    for view in listed["views"].as_array().context("views")? {
        let name = view["name"].as_str().context("name")?;
        if name.starts_with("chat.") {
            chats.push(name.to_owned());
        }
    }
    Ok(chats)
}

/// Reads of names a pattern takes, before anything was published there, each made a view that
/// stayed for good (listed, kept in snapshots, back after a restart). They leave nothing now, and
/// a stream opened before the first publish still receives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_names_nothing_was_published_to_make_no_view() -> anyhow::Result<()> {
    const READS: usize = 1_000;
    const STREAMS: usize = 5;
    let mut server = start().await?;
    put(
        &server,
        "chat",
        serde_json::json!({"module": "builtin:json", "views": ["chat.*"]}),
        201,
    )
    .await?;
    let mut conn = http::HttpConn::connect(server.addr()).await?;
    for i in 0..READS {
        let resp = conn
            .send("GET", &format!("/views/chat.r{i}"), &[], b"")
            .await?;
        ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
        ensure!(
            resp.json()?["entries"] == serde_json::json!({}),
            "{}",
            resp.text()
        );
    }
    for i in 0..STREAMS {
        let mut stream = server.sse(&format!("/views/chat.s{i}/events"), &[]).await?;
        let (states, _) = stream.until_synced(0).await?;
        ensure!(states.is_empty());
    }
    let mut waiting = server.sse("/views/chat.first/events", &[]).await?;
    let (states, _) = waiting.until_synced(0).await?;
    ensure!(states.is_empty());
    let views = listed_chats(&server).await?;
    ensure!(
        views.is_empty(),
        "reads list nothing: {} views, from {:?}",
        views.len(),
        views.first()
    );
    // Nor do they stay in memory: a state read lets go of its view as it answers.
    let metrics = server.get("/metrics").await?.text();
    ensure!(!metrics.contains("view=\"chat.r"), "{metrics}");

    // The first publish reaches the stream that waited, and only it makes a view that lasts.
    ingest_ok(
        &server,
        "chat",
        &line("chat.first", "m1", serde_json::json!({"text": "hi"})),
    )
    .await?;
    update(&mut waiting, "m1").await?;
    drop(waiting);
    ensure!(listed_chats(&server).await? == ["chat.first"]);

    server.stop_graceful().await?;
    server.restart().await?;
    ensure!(
        listed_chats(&server).await? == ["chat.first"],
        "after a restart too"
    );
    let state = server.get("/views/chat.r7").await?;
    ensure!(state.status() == 200, "{} {}", state.status(), state.text());
    ensure!(listed_chats(&server).await? == ["chat.first"]);
    Ok(())
}

/// What `PUT /admin/runtimes/{runtime}` takes, out of what `GET` shows of a runtime.
fn definition_of(shown: &serde_json::Value) -> serde_json::Value {
    let fields = ["module", "views", "config", "schemas", "limits"];
    fields
        .iter()
        .map(|&field| (field.to_owned(), shown[field].clone()))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_bodies_are_read_strictly_in_our_words() -> anyhow::Result<()> {
    let server = start().await?;
    let cases: [(&[u8], u16, &str); 9] = [
        // A key given twice is refused, naming it, at any depth: no last-one-wins.
        (
            br#"{"module":"builtin:json","views":["x"],"views":["y"]}"#,
            400,
            "views",
        ),
        (
            br#"{"module":"builtin:json","views":["x"],"limits":{"fuel":1,"fuel":0}}"#,
            400,
            "limits.fuel",
        ),
        (
            br#"{"module":"builtin:json","views":["x"],"schemas":{"x":{"type":"object","type":"array"}}}"#,
            400,
            "schemas.x.type",
        ),
        // `limits` is an object, never read by position (`[1]` was one byte of memory).
        (
            br#"{"module":"builtin:json","views":["x"],"limits":[1]}"#,
            422,
            "limits",
        ),
        (
            br#"{"module":"builtin:json","views":["x"],"limits":{"memory":[1]}}"#,
            422,
            "limits.memory",
        ),
        (
            br#"{"module":"builtin:json","views":["x"],"limits":{"fuel":-1}}"#,
            422,
            "limits.fuel",
        ),
        (
            br#"{"module":"builtin:json","views":["x"],"limits":{"batch_timeout":"500us"}}"#,
            422,
            "limits.batch_timeout",
        ),
        (
            br#"{"module":"builtin:json","views":["x"],"limits":{"max_events":1}}"#,
            422,
            "limits.max_events",
        ),
        (br#"{"module":"builtin:json","views":5}"#, 422, "views"),
    ];
    for (body, status, field) in cases {
        let resp = admin(&server, "PUT", "/admin/runtimes/strict", body).await?;
        let text = resp.text();
        let shown = String::from_utf8_lossy(body);
        ensure!(resp.status() == status, "{shown}: {} {text}", resp.status());
        let json: serde_json::Value = serde_json::from_str(&text)?;
        ensure!(json["field"] == field, "{shown}: {json}");
        ensure!(
            json["message"].as_str().is_some_and(|m| m.contains(field)),
            "{shown}: {json}"
        );
        ensure!(http::error_body_problem(&text).is_none(), "{shown}: {text}");
        for serde in [
            "invalid type",
            "expected struct",
            "sequence",
            "untagged",
            "line 1",
        ] {
            ensure!(!text.contains(serde), "{shown}: serde's words: {text}");
        }
    }
    ensure!(
        admin(&server, "GET", "/admin/runtimes/strict", b"")
            .await?
            .status()
            == 404
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definition_as_get_shows_it_is_put_back_unchanged() -> anyhow::Result<()> {
    let server = start().await?;
    let limits = [
        serde_json::json!(null),
        serde_json::json!({"memory": "32MiB", "fuel": 1_000_000, "batch_timeout": "1500ms",
            "max_batch": 65_536, "max_event": "4KiB"}),
        serde_json::json!({"batch_timeout": "1ms", "memory": 16_777_216, "max_event": 1}),
    ];
    for (i, limits) in limits.into_iter().enumerate() {
        let runtime = format!("round{i}");
        let mut definition = serde_json::json!({
            "module": "builtin:json",
            "views": [format!("round{i}")],
            "config": "",
            "schemas": {format!("round{i}"): {"type": "object"}},
        });
        if !limits.is_null() {
            definition["limits"] = limits;
        }
        put(&server, &runtime, definition, 201).await?;
        let path = format!("/admin/runtimes/{runtime}");
        let shown: serde_json::Value = admin(&server, "GET", &path, b"").await?.json()?;
        let again = definition_of(&shown);
        let replaced = put(&server, &runtime, again.clone(), 200).await?;
        ensure!(
            definition_of(&replaced) == again,
            "{runtime}: {again} became {replaced}"
        );
        let shown_again: serde_json::Value = admin(&server, "GET", &path, b"").await?.json()?;
        ensure!(definition_of(&shown_again) == again, "{shown_again}");
    }
    Ok(())
}

/// Writes `head` (a request with `Expect: 100-continue` and no body yet); the status line of
/// the first answer.
async fn first_answer(server: &Server, head: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(server.addr()).await?;
    stream.write_all(head.as_bytes()).await?;
    let mut seen = Vec::new();
    while !seen.windows(2).any(|w| w == b"\r\n") {
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await??;
        ensure!(n > 0, "closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    let seen = String::from_utf8_lossy(&seen);
    Ok(seen.lines().next().unwrap_or_default().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_past_an_admin_routes_limit_gets_413_and_no_invitation(
) -> anyhow::Result<()> {
    let server = start().await?;
    let head = |method: &str, path: &str, length: usize| {
        format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Length: {length}\r\nExpect: 100-continue\r\n\r\n"
        )
    };
    for (method, path, length) in [
        ("POST", "/admin/modules", 70 << 20),
        ("PUT", "/admin/runtimes/demo/module", 70 << 20),
        ("PUT", "/admin/runtimes/big", 1 << 20),
        ("POST", "/admin/restore", 64 << 10),
    ] {
        let status = first_answer(&server, &head(method, path, length)).await?;
        ensure!(
            status.starts_with("HTTP/1.1 413 "),
            "{method} {path}: {status}"
        );
    }
    // Within the limit, the client is invited to send its body.
    let status = first_answer(&server, &head("POST", "/admin/modules", 1 << 20)).await?;
    ensure!(status == "HTTP/1.1 100 Continue", "{status}");
    Ok(())
}

/// Past `[server] max_runtimes`, a new runtime is refused with `503` naming the bound, not as a
/// module the guest refused; the runtimes already there go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_runtime_bound_a_runtime_is_refused_naming_it() -> anyhow::Result<()> {
    let config = viewtape_tests::server::config_file("[server]\nmax_runtimes = 4\n")?;
    let path = config.path().display().to_string();
    let server = Server::start_with_env(&["--config", &path], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
    let mut made = 0;
    let refused = loop {
        let definition =
            serde_json::json!({"module": "builtin:json", "views": [format!("v{made}")]});
        let path = format!("/admin/runtimes/r{made}");
        let resp = admin(&server, "PUT", &path, definition.to_string().as_bytes()).await?;
        if resp.status() != 201 {
            break resp;
        }
        made += 1;
        ensure!(made < 10, "no bound");
    };
    ensure!(made >= 1, "{} {}", refused.status(), refused.text());
    ensure!(
        refused.status() == 503,
        "{} {}",
        refused.status(),
        refused.text()
    );
    ensure!(
        refused.text().contains("max_runtimes"),
        "{}",
        refused.text()
    );
    ingest_ok(&server, "r0", &line("v0", "k", serde_json::json!(1))).await?;
    // A runtime that is there is replaced past the bound: it makes none.
    let definition = serde_json::json!({"module": "builtin:json", "views": ["v0", "w0"]});
    put(&server, "r0", definition, 200).await?;
    Ok(())
}

/// An instance is made for a batch and dropped after it: far more runtimes than
/// `[server] guest_instances` are made, take batches and keep their state, through a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtimes_outnumber_guest_instances() -> anyhow::Result<()> {
    const RUNTIMES: usize = 70;
    let config = viewtape_tests::server::config_file("[server]\nguest_instances = 2\n")?;
    let path = config.path().display().to_string();
    let mut server =
        Server::start_with_env(&["--config", &path], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
    // Counts its batches, publishing the count to the view the batch names.
    let source = "export function onBatch(state, input, ctx) {\n  state.n = (state.n ?? 0) + 1;\n  ctx.publish(input.trim(), 'n', state.n);\n}\n";
    let resp = admin(&server, "POST", "/admin/modules", source.as_bytes()).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let kept: serde_json::Value = serde_json::from_str(&resp.text())?;
    let module = kept["module"].as_str().context("module")?.to_owned();
    for i in 0..RUNTIMES {
        let definition = serde_json::json!({"module": module, "views": [format!("c{i}")]});
        put(&server, &format!("r{i}"), definition, 201).await?;
    }
    // Batches to every runtime at once, more of them than there are instances.
    let batches = (0..RUNTIMES).map(|i| {
        let server = &server;
        async move {
            for _ in 0..=i % 3 {
                let resp = server.ingest(&format!("r{i}"), &format!("c{i}\n")).await?;
                ensure!(
                    resp.status() == 200,
                    "r{i}: {} {}",
                    resp.status(),
                    resp.text()
                );
            }
            anyhow::Ok(())
        }
    });
    for done in futures_util::future::join_all(batches).await {
        done?;
    }
    server.restart().await?;
    for i in 0..RUNTIMES {
        let resp = server.get(&format!("/views/c{i}")).await?;
        ensure!(
            resp.status() == 200,
            "c{i}: {} {}",
            resp.status(),
            resp.text()
        );
        let state = resp.json()?;
        ensure!(state["entries"]["n"] == i % 3 + 1, "c{i}: {state}");
    }
    Ok(())
}
