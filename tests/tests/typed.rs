//! Typed views against the real binary: a value that breaks its view's schema rejects the whole
//! batch (`422 schema_violation` naming the view, the key and the JSON pointer), and nothing of
//! it is seen, logged or restored after `kill -9`; the schema endpoint serves what the guest or
//! the config declares, and the OpenAPI document carries the same schema; a deploy whose
//! running state does not fit the new build's schema is refused, and one that fits changes the
//! schema from its position on, across a restart; `builtin:json` publishes NDJSON with no guest
//! to write, typed by a schema file.

use std::time::Duration;

use anyhow::{ensure, Context as _};
use serde_json::{json, Value};
use viewtape_tests::server::{config_file, guest_wasm, ADMIN_TOKEN_ENV};
use viewtape_tests::{expect, http, EventStream, Response, Server};

const TOKEN: &str = "typed-test-token";

/// The schema the config gives the view `public` in these tests.
fn counter_schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["n"],
        "properties": { "n": { "type": "integer", "minimum": 0 } },
    })
}

/// A server whose runtime `notes` runs the `misbehave` fixture (it publishes what it is told)
/// into `public`, typed by `counter_schema()` from a file, and `loose`, untyped.
async fn start_notes(dir: &std::path::Path) -> anyhow::Result<Server> {
    let schema = dir.join("counter.schema.json");
    std::fs::write(&schema, counter_schema().to_string())?;
    let config = dir.join("viewtape.toml");
    std::fs::write(
        &config,
        format!(
            "[[runtime]]\nname = \"notes\"\nwasm = {:?}\nviews = [\"public\", \"loose\"]\n\
             schemas = {{ public = {:?} }}\n",
            guest_wasm("misbehave").display().to_string(),
            schema.display().to_string()
        ),
    )?;
    let config = config.display().to_string();
    Server::start_in(&dir.join("data"), &["--config", &config]).await
}

/// The keys and values of `GET /views/{view}`.
async fn entries(server: &Server, view: &str) -> anyhow::Result<Value> {
    let resp = server.get(&format!("/views/{view}")).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    Ok(resp.json()?["entries"].clone())
}

/// A `422 schema_violation` naming `view`, `key` and `pointer`.
fn violation(resp: &Response, view: &str, key: &str, pointer: &str) -> anyhow::Result<String> {
    let error = expect::json_error(resp, 422)?;
    ensure!(error["error"] == "schema_violation", "{error}");
    ensure!(
        error["view"] == view && error["key"] == key && error["pointer"] == pointer,
        "{error}"
    );
    let message = error["message"].as_str().context("message")?;
    ensure!(message.contains(view) && message.contains(key), "{message}");
    Ok(message.to_owned())
}

/// The next event's key and value.
async fn next_update(stream: &mut EventStream) -> anyhow::Result<(String, Value)> {
    let event = stream.next_event().await?;
    ensure!(event.event == "update", "{event:?}");
    let data = event.json()?;
    Ok((
        data["key"].as_str().context("key")?.to_owned(),
        data["value"].clone(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_breaks_its_schema_rejects_the_batch_whole() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut server = start_notes(dir.path()).await?;
    let mut stream = server.sse("/views/public/events", &[]).await?;
    stream.until_synced(10).await?;

    // A good value, an untyped one, then one that breaks the schema: none of it commits.
    let batch =
        "publish public a {\"n\":1}\npublish loose x anything\npublish public b {\"n\":\"x\"}\n";
    let resp = server.ingest("notes", batch).await?;
    let message = violation(&resp, "public", "b", "/n")?;
    ensure!(message.contains("integer"), "{message}");
    // The whole value, where it is not JSON or misses a required part.
    let resp = server
        .ingest("notes", "publish public c not-json\n")
        .await?;
    let message = violation(&resp, "public", "c", "")?;
    ensure!(message.contains("not JSON"), "{message}");
    let resp = server.ingest("notes", "publish public d {}\n").await?;
    violation(&resp, "public", "d", "")?;
    let resp = server
        .ingest("notes", "publish public e {\"n\":-1}\n")
        .await?;
    violation(&resp, "public", "e", "/n")?;

    // Deletes carry no value; an untyped view takes anything.
    let resp = server
        .ingest(
            "notes",
            "publish public f {\"n\":6}\ndelete public zz\npublish loose y not-json\n",
        )
        .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    // The subscriber's first event is the first committed one: nothing of the refused batches.
    ensure!(next_update(&mut stream).await? == ("f".to_owned(), json!({"n": 6})));
    let delete = stream.next_event().await?;
    ensure!(
        delete.event == "delete" && delete.data.contains("zz"),
        "{delete:?}"
    );
    stream.expect_silence(Duration::from_millis(200)).await?;
    ensure!(entries(&server, "public").await? == json!({"f": {"n": 6}}));
    ensure!(entries(&server, "loose").await? == json!({"y": "not-json"}));

    // A crash and a restart replay the log: what was refused was never logged.
    server.kill9().await?;
    server.restart().await?;
    ensure!(entries(&server, "public").await? == json!({"f": {"n": 6}}));
    ensure!(entries(&server, "loose").await? == json!({"y": "not-json"}));
    let resp = server
        .ingest("notes", "publish public g {\"n\":true}\n")
        .await?;
    violation(&resp, "public", "g", "/n")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_endpoint_serves_what_the_config_gives_and_the_openapi_document_agrees(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = start_notes(dir.path()).await?;
    let resp = server.get("/views/public/schema").await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    ensure!(
        resp.header("content-type") == Some("application/schema+json"),
        "{:?}",
        resp.header("content-type")
    );
    ensure!(resp.json()? == counter_schema());
    let error = expect::json_error(&server.get("/views/loose/schema").await?, 404)?;
    ensure!(error["error"] == "no_schema", "{error}");
    let error = expect::json_error(&server.get("/views/nope/schema").await?, 404)?;
    ensure!(error["error"] == "not_found", "{error}");
    expect::json_error(&server.get("/views/public/schema?x=1").await?, 400)?;

    let document = server.get("/openapi.json").await?.json()?;
    ensure!(
        from_document(&document, "public")? == counter_schema(),
        "view.public: {}",
        document["components"]["schemas"]["view.public"]
    );
    ensure!(document["components"]["schemas"]
        .get("view.loose")
        .is_none());
    ensure!(document["paths"].get("/views/loose/events").is_none());
    Ok(())
}

/// The schema of `view` as the OpenAPI document carries it, put back together: its component,
/// its lifted `$defs`, references turned back, and the `$schema` the document leaves out.
fn from_document(document: &Value, view: &str) -> anyhow::Result<Value> {
    let components = document["components"]["schemas"]
        .as_object()
        .context("components")?;
    let base = format!("view.{view}");
    let mut schema = components
        .get(&base)
        .context("the view's component")?
        .clone();
    let defs: serde_json::Map<String, Value> = components
        .iter()
        .filter_map(|(name, def)| {
            let name = name.strip_prefix(&format!("{base}."))?;
            (!["UpdateEvent", "StateEvent", "ViewState"].contains(&name))
                .then(|| (name.to_owned(), def.clone()))
        })
        .collect();
    let text = schema
        .to_string()
        .replace(&format!("#/components/schemas/{base}."), "#/$defs/");
    schema = serde_json::from_str(&text)?;
    let object = schema.as_object_mut().context("an object schema")?;
    if !defs.is_empty() {
        let defs = Value::Object(defs).to_string();
        let defs = defs.replace(&format!("#/components/schemas/{base}."), "#/$defs/");
        object.insert("$defs".into(), serde_json::from_str(&defs)?);
    }
    object.insert(
        "$schema".into(),
        json!("https://json-schema.org/draft/2020-12/schema"),
    );
    // The typed routes carry it as the type of their values.
    let reference = json!({ "$ref": format!("#/components/schemas/{base}") });
    let value_of = |event: &str| {
        components[&format!("{base}.{event}")]["properties"]["data"]["contentSchema"]["properties"]
            ["value"]
            .clone()
    };
    ensure!(value_of("UpdateEvent") == reference && value_of("StateEvent") == reference);
    let events = document["paths"][format!("/views/{view}/events")].to_string();
    ensure!(events.contains(&format!("{base}.UpdateEvent")), "{events}");
    let state = &document["paths"][format!("/views/{view}")]["get"]["responses"]["200"];
    ensure!(
        state.to_string().contains(&format!("{base}.ViewState")),
        "{state}"
    );
    Ok(schema)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_ticker_declares_its_schema_and_the_openapi_document_agrees() -> anyhow::Result<()>
{
    let server = Server::start(&[]).await?;
    let schema = server.get("/views/prices/schema").await?.json()?;
    ensure!(
        schema["required"] == json!(["symbol", "price", "seq"]),
        "{schema}"
    );
    ensure!(schema["additionalProperties"] == false, "{schema}");
    let document = server.get("/openapi.json").await?.json()?;
    let mut carried = from_document(&document, "prices")?;
    // The guest's own `$schema`, whichever draft URI schemars writes.
    carried["$schema"] = schema["$schema"].clone();
    ensure!(carried == schema, "{carried}\n!=\n{schema}");
    // What the ticker publishes fits (every batch is checked: a 200 says so).
    server
        .ingest_ok("{\"symbol\":\"ACME\",\"price\":12.5,\"seq\":1}\n")
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_whose_state_does_not_fit_the_new_schema_is_refused() -> anyhow::Result<()> {
    // `demo` runs the untyped fixture into `prices`; the ticker types `prices`.
    let config = config_file(&format!(
        "[[runtime]]\nname = \"demo\"\nwasm = {:?}\nviews = [\"prices\"]\n",
        guest_wasm("misbehave").display().to_string()
    ))?;
    let path = config.path().display().to_string();
    let mut server =
        Server::start_with_env(&["--config", &path], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
    let ticker = std::fs::read(guest_wasm("ticker"))?;
    let deploy = |server: &Server| {
        let addr = server.addr();
        let ticker = ticker.clone();
        async move {
            let auth = format!("Bearer {TOKEN}");
            http::request(
                addr,
                "PUT",
                "/admin/runtimes/demo/module",
                &[
                    ("Authorization", &auth),
                    ("Content-Type", "application/wasm"),
                ],
                &ticker,
            )
            .await
        }
    };
    let ok = |resp: Response| {
        ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
        Ok(())
    };
    ok(server
        .ingest(
            "demo",
            "publish prices ACME {\"symbol\":\"ACME\",\"price\":1,\"seq\":1}\n\
             publish prices BOLT {\"symbol\":\"BOLT\",\"price\":\"high\",\"seq\":2}\n",
        )
        .await?)?;
    let error = expect::json_error(&server.get("/views/prices/schema").await?, 404)?;
    ensure!(error["error"] == "no_schema", "{error}");
    let mut stream = server.sse("/views/prices/events", &[]).await?;
    stream.until_synced(10).await?;

    // BOLT's value does not fit a tick: refused, naming the key and why; the fixture serves on.
    let error = expect::json_error(&deploy(&server).await?, 422)?;
    ensure!(error["error"] == "module_refused", "{error}");
    let message = error["message"].as_str().unwrap_or_default();
    ensure!(
        message.contains("\"BOLT\"") && message.contains("/price"),
        "{message}"
    );
    ensure!(
        !message.contains("ACME"),
        "the first misfit only: {message}"
    );
    let error = expect::json_error(&server.get("/views/prices/schema").await?, 404)?;
    ensure!(error["error"] == "no_schema", "{error}");
    ok(server
        .ingest(
            "demo",
            "publish prices BOLT {\"symbol\":\"BOLT\",\"price\":2,\"seq\":2}\n",
        )
        .await?)?;
    ensure!(next_update(&mut stream).await?.0 == "BOLT");

    // Now the state fits: the ticker takes over, typed from here on, with no reset (it reads
    // the fixture's saved counter, 0, as its last seq).
    ok(deploy(&server).await?)?;
    let schema = server.get("/views/prices/schema").await?.json()?;
    ensure!(
        schema["required"] == json!(["symbol", "price", "seq"]),
        "{schema}"
    );
    server
        .ingest_ok("{\"symbol\":\"CHIP\",\"price\":3,\"seq\":1}\n")
        .await?;
    let (key, value) = next_update(&mut stream)
        .await
        .with_context(|| server.logs())?;
    ensure!(key == "CHIP" && value["price"] == 3.0, "{key} {value}");

    // A crash replays the deploy: still the ticker, still typed.
    server.kill9().await?;
    server.restart().await?;
    let again = server.get("/views/prices/schema").await?.json()?;
    ensure!(again == schema, "{again}");
    server
        .ingest_ok("{\"symbol\":\"DASH\",\"price\":4,\"seq\":2}\n")
        .await?;
    Ok(())
}

/// A `builtin:json` view without a schema took a value nested 200,000 deep, which most JSON
/// parsers (the clients' among them) cannot read; a typed view refused one past 128 calling it
/// "not JSON". One bound holds for every view now, typed or not, and says what it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_view_refuses_a_value_nested_past_the_one_bound() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let schema = dir.path().join("deep.schema.json");
    std::fs::write(&schema, json!({ "type": "array" }).to_string())?;
    let config = config_file(&format!(
        "[[runtime]]\nname = \"json\"\nwasm = \"builtin:json\"\nviews = [\"plain\", \"typed\"]\n\
         schemas = {{ typed = {:?} }}\n",
        schema.display().to_string()
    ))?;
    let path = config.path().display().to_string();
    let server = Server::start(&["--config", &path]).await?;
    let nested = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    for view in ["plain", "typed"] {
        for depth in [129, 200_000] {
            let line = format!(
                "{{\"view\":\"{view}\",\"key\":\"deep\",\"value\":{}}}\n",
                nested(depth)
            );
            let resp = server.ingest("json", &line).await?;
            let error =
                expect::json_error(&resp, 422).with_context(|| format!("{view} {depth}"))?;
            ensure!(error["error"] == "batch_rejected", "{error}");
            let message = error["message"].as_str().unwrap_or_default();
            ensure!(
                message.contains("nested deeper than 128")
                    && message.contains(view)
                    && !message.contains("not JSON"),
                "{view} {depth}: {message}"
            );
        }
        // Within the bound, a value is taken and read back as written.
        let line = format!(
            "{{\"view\":\"{view}\",\"key\":\"ok\",\"value\":{}}}\n",
            nested(100)
        );
        let resp = server.ingest("json", &line).await?;
        ensure!(
            resp.status() == 200,
            "{view}: {} {}",
            resp.status(),
            resp.text()
        );
        let state = server.get(&format!("/views/{view}")).await?;
        ensure!(
            state.text().contains(&nested(100)),
            "{view}: {}",
            state.text()
        );
        ensure!(
            !state.text().contains("\"deep\""),
            "{view}: {}",
            state.text()
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builtin_json_publishes_ndjson_typed_by_a_schema_file() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let schema = dir.path().join("orders.schema.json");
    std::fs::write(
        &schema,
        json!({
            "type": "object",
            "required": ["total", "status"],
            "properties": {
                "total": { "type": "number", "minimum": 0 },
                "status": { "enum": ["open", "paid"] },
            },
        })
        .to_string(),
    )?;
    let config = config_file(&format!(
        "[[runtime]]\nname = \"orders\"\nwasm = \"builtin:json\"\nviews = [\"orders\"]\n\
         schemas = {{ orders = {:?} }}\n\n\
         [[runtime]]\nname = \"misc\"\nwasm = \"builtin:json\"\nviews = [\"a\", \"b\"]\n",
        schema.display().to_string()
    ))?;
    let path = config.path().display().to_string();
    let server = Server::start(&["--config", &path]).await?;
    let mut stream = server.sse("/views/orders/events", &[]).await?;
    stream.until_synced(10).await?;

    // One declared view: lines may leave it out; values are published as written.
    let resp = server
        .ingest(
            "orders",
            "{\"key\":\"o-1\",\"value\":{\"total\":12.5,\"status\":\"open\"}}\n\
             {\"view\":\"orders\",\"key\":\"o-2\",\"value\":{\"status\":\"paid\",\"total\":3}}\n",
        )
        .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    ensure!(resp.json()?["events"]["orders"] == 2);
    ensure!(
        next_update(&mut stream).await? == ("o-1".into(), json!({"total": 12.5, "status": "open"}))
    );
    ensure!(next_update(&mut stream).await?.0 == "o-2");
    let resp = server
        .ingest("orders", "{\"key\":\"o-1\",\"delete\":true}\n")
        .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let event = stream.next_event().await?;
    ensure!(event.event == "delete", "{event:?}");

    // The schema file holds: a value that does not fit is a 422 naming the pointer.
    let resp = server
        .ingest(
            "orders",
            "{\"key\":\"o-3\",\"value\":{\"total\":1,\"status\":\"open\"}}\n\
             {\"key\":\"o-4\",\"value\":{\"total\":-1,\"status\":\"open\"}}\n",
        )
        .await?;
    violation(&resp, "orders", "o-4", "/total")?;
    // A line that is not a change is the guest's refusal, naming the line.
    let resp = server
        .ingest("orders", "{\"key\":\"o-5\",\"value\":1,\"delete\":true}\n")
        .await?;
    let error = expect::json_error(&resp, 422)?;
    ensure!(error["error"] == "batch_rejected", "{error}");
    ensure!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("line 1") && m.contains("both")),
        "{error}"
    );
    stream.expect_silence(Duration::from_millis(200)).await?;
    ensure!(entries(&server, "orders").await? == json!({"o-2": {"status": "paid", "total": 3}}));
    let served = server.get("/views/orders/schema").await?.json()?;
    ensure!(served["required"] == json!(["total", "status"]), "{served}");

    // Several views: each line names its own; untyped views take any JSON.
    let resp = server
        .ingest(
            "misc",
            "{\"view\":\"a\",\"key\":\"k\",\"value\":[1,2]}\n{\"view\":\"b\",\"key\":\"k\",\"value\":\"s\"}\n",
        )
        .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    ensure!(entries(&server, "a").await? == json!({"k": [1, 2]}));
    let resp = server
        .ingest("misc", "{\"key\":\"k\",\"value\":1}\n")
        .await?;
    let error = expect::json_error(&resp, 422)?;
    ensure!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("no \\\"view\\\"") || m.contains("no \"view\"")),
        "{error}"
    );
    Ok(())
}
