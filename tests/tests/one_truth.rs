//! One truth for what runs, against the real binary: a deploy to a runtime made through the API
//! is the build that runs after every restart (graceful or `kill -9`, from a manual or a
//! periodic snapshot, or from the log alone); `module` names that build in every answer, and a
//! `PUT` without one keeps it; the log wins over a config read again (an API change to a
//! config's runtime stands until the config's declaration of it changes, and no start retires
//! acknowledged data); a `PUT` is judged as a deploy is; changes answer their log position, and
//! reads wait for it with `?after=`.

use std::time::Duration;

use anyhow::{ensure, Context as _};
use serde_json::{json, Value};
use viewtape_tests::server::{config_file, js_counter, ADMIN_TOKEN_ENV};
use viewtape_tests::{Response, Server};

const TOKEN: &str = "one-truth-token";

async fn admin(server: &Server, method: &str, path: &str, body: &[u8]) -> anyhow::Result<Response> {
    server.admin(TOKEN, method, path, &[], body).await
}

/// An admin request that must answer `status`; its JSON body.
async fn admin_ok(
    server: &Server,
    method: &str,
    path: &str,
    body: &[u8],
    status: u16,
) -> anyhow::Result<Value> {
    let resp = admin(server, method, path, body).await?;
    ensure!(
        resp.status() == status,
        "{method} {path}: {} {}",
        resp.status(),
        resp.text()
    );
    resp.json()
}

/// `PUT /admin/runtimes/{runtime}` with `definition`, which must answer `status`; its JSON body.
async fn put(
    server: &Server,
    runtime: &str,
    definition: Value,
    status: u16,
) -> anyhow::Result<Value> {
    let path = format!("/admin/runtimes/{runtime}");
    admin_ok(
        server,
        "PUT",
        &path,
        definition.to_string().as_bytes(),
        status,
    )
    .await
}

/// `POST /admin/modules` with a JavaScript guest; the module it is kept as.
async fn upload(server: &Server, source: &str) -> anyhow::Result<String> {
    let resp = server
        .admin(
            TOKEN,
            "POST",
            "/admin/modules",
            &[("Content-Type", "text/javascript")],
            source.as_bytes(),
        )
        .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    Ok(resp.json()?["module"]
        .as_str()
        .context("module")?
        .to_owned())
}

/// `PUT /admin/runtimes/{runtime}/module` with a JavaScript build.
async fn deploy(server: &Server, runtime: &str, source: &str) -> anyhow::Result<Value> {
    let resp = server
        .admin(
            TOKEN,
            "PUT",
            &format!("/admin/runtimes/{runtime}/module"),
            &[("Content-Type", "text/javascript")],
            source.as_bytes(),
        )
        .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    resp.json()
}

/// One batch to the counter; the `(count, build)` it published, read back from the view.
async fn tick(server: &Server) -> anyhow::Result<(u64, u64)> {
    let resp = server.ingest("counter", "tick\n").await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let state = server.get("/views/count").await?.json()?;
    let value = &state["entries"]["c"];
    Ok((
        value["count"].as_u64().context("count")?,
        value["build"].as_u64().context("build")?,
    ))
}

/// What `GET /admin/runtimes/{runtime}` says it runs: `module` and `status.running_module`.
async fn runs(server: &Server, runtime: &str) -> anyhow::Result<(String, String)> {
    let got = admin_ok(
        server,
        "GET",
        &format!("/admin/runtimes/{runtime}"),
        b"",
        200,
    )
    .await?;
    Ok((
        got["module"].as_str().context("module")?.to_owned(),
        got["status"]["running_module"]
            .as_str()
            .context("running_module")?
            .to_owned(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_to_an_api_runtime_is_what_runs_after_every_restart() -> anyhow::Result<()> {
    // Periodic snapshots every second, so that restarts also start from one of those.
    let config = config_file("[server]\nsnapshot_interval = \"1s\"\n")?;
    let path = config.path().display().to_string();
    let mut server =
        Server::start_with_env(&["--config", &path], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
    let first = upload(&server, &js_counter(1)).await?;
    let made = put(
        &server,
        "counter",
        json!({"module": first, "views": ["count"]}),
        201,
    )
    .await?;
    ensure!(made["position"].as_u64().is_some(), "{made}");
    ensure!(tick(&server).await? == (1, 1));

    let deployed = deploy(&server, "counter", &js_counter(2)).await?;
    let second = deployed["module"].as_str().context("module")?.to_owned();
    ensure!(tick(&server).await? == (2, 2));
    ensure!(runs(&server, "counter").await? == (second.clone(), second.clone()));

    // A manual snapshot, then a graceful restart.
    admin_ok(&server, "POST", "/admin/snapshot", b"", 200).await?;
    server.stop_graceful().await?;
    server.restart().await?;
    ensure!(runs(&server, "counter").await? == (second.clone(), second.clone()));
    ensure!(
        tick(&server).await? == (3, 2),
        "the deployed build runs after a restart"
    );

    // A periodic snapshot, then `kill -9`.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    server.kill9().await?;
    server.restart().await?;
    ensure!(
        tick(&server).await? == (4, 2),
        "after kill -9, from a periodic snapshot"
    );

    // A deploy that only the log holds (no snapshot after it), then `kill -9`.
    let third = deploy(&server, "counter", &js_counter(3)).await?["module"]
        .as_str()
        .context("module")?
        .to_owned();
    ensure!(tick(&server).await? == (5, 3));
    server.kill9().await?;
    server.restart().await?;
    ensure!(
        tick(&server).await? == (6, 3),
        "after kill -9, from the log"
    );
    ensure!(runs(&server, "counter").await? == (third.clone(), third.clone()));

    // GET, then PUT the same back: nothing rolls back; a PUT without `module` keeps the build.
    let got = admin_ok(&server, "GET", "/admin/runtimes/counter", b"", 200).await?;
    let back = json!({"module": got["module"], "views": got["views"], "config": got["config"], "limits": got["limits"]});
    let same = put(&server, "counter", back, 200).await?;
    ensure!(same["module"] == third.as_str(), "{same}");
    let kept = put(&server, "counter", json!({"views": ["count"]}), 200).await?;
    ensure!(kept["module"] == third.as_str(), "{kept}");
    ensure!(tick(&server).await? == (7, 3));
    server.stop_graceful().await?;
    server.restart().await?;
    ensure!(tick(&server).await? == (8, 3));
    Ok(())
}

/// A config of two `builtin:json` runtimes: `items` (views `items` and `extra`) and `gone`.
fn two_runtimes(items_config: &str) -> String {
    format!(
        "[[runtime]]\nname = \"items\"\nmodule = \"builtin:json\"\nviews = [\"items\", \"extra\"]\n{items_config}\n\
         [[runtime]]\nname = \"gone\"\nmodule = \"builtin:json\"\nviews = [\"gone\"]\n"
    )
}

fn line(view: &str, key: &str, value: Value) -> String {
    format!("{}\n", json!({"view": view, "key": key, "value": value}))
}

async fn ingest(server: &Server, runtime: &str, body: String) -> anyhow::Result<()> {
    let resp = server.ingest(runtime, &body).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    Ok(())
}

/// The entries of `view`, or `None` for a `404`.
async fn entries(server: &Server, view: &str) -> anyhow::Result<Option<Value>> {
    let resp = server.get(&format!("/views/{view}")).await?;
    match resp.status() {
        404 => Ok(None),
        200 => Ok(Some(resp.json()?["entries"].clone())),
        status => anyhow::bail!("{status} {}", resp.text()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_wins_over_a_config_read_again() -> anyhow::Result<()> {
    let config = config_file(&two_runtimes(""))?;
    let path = config.path().display().to_string();
    let mut server = Server::start_with_env(
        &["--config", &path, "--demo-rate", "0"],
        &[(ADMIN_TOKEN_ENV, TOKEN)],
    )
    .await?;
    ingest(&server, "items", line("extra", "a", json!(1))).await?;
    ingest(&server, "gone", line("gone", "g", json!(1))).await?;

    // Through the API: `items` now publishes to `items` and `more` (not `extra`, retired), and
    // `gone` is deleted.
    put(&server, "items", json!({"views": ["items", "more"]}), 200).await?;
    ingest(&server, "items", line("more", "m", json!(2))).await?;
    let deleted = admin_ok(&server, "DELETE", "/admin/runtimes/gone", b"", 200).await?;
    ensure!(deleted["position"].as_u64().is_some(), "{deleted}");

    // Restarts with the same config, from the log alone and from a snapshot: the API's changes
    // stand, and what `more` acknowledged is served.
    for snapshot_first in [false, true] {
        if snapshot_first {
            admin_ok(&server, "POST", "/admin/snapshot", b"", 200).await?;
            server.stop_graceful().await?;
        }
        server.restart().await?;
        ensure!(entries(&server, "more").await? == Some(json!({"m": 2})));
        ensure!(entries(&server, "extra").await?.is_none());
        ensure!(entries(&server, "gone").await?.is_none());
        let resp = server.ingest("gone", &line("gone", "g", json!(2))).await?;
        ensure!(resp.status() == 404, "{} {}", resp.status(), resp.text());
        let got = admin_ok(&server, "GET", "/admin/runtimes/items", b"", 200).await?;
        ensure!(got["views"] == json!(["items", "more"]), "{got}");
        ensure!(
            server.logs().contains("config declaration skipped"),
            "the start says it skipped the config's declaration"
        );
    }

    // `check-config` with the data directory says the same of the next start.
    let data_dir = server.data_dir().display().to_string();
    let check = [
        "check-config",
        path.as_str(),
        "--data-dir",
        data_dir.as_str(),
    ];
    let (code, said) = viewtape_tests::server::cli(&check, &[]).await?;
    ensure!(code == 0, "{said}");
    ensure!(
        said.contains("items: skipped: changed through the API"),
        "{said}"
    );
    ensure!(
        said.contains("gone: skipped: deleted through the API"),
        "{said}"
    );

    // The config's declaration of `items` changes: declared again at the next start.
    std::fs::write(config.path(), two_runtimes("config = \"{}\""))?;
    let (code, said) = viewtape_tests::server::cli(&check, &[]).await?;
    ensure!(code == 0, "{said}");
    ensure!(said.contains("items: declared by a record"), "{said}");
    ensure!(said.contains("gone: skipped: deleted"), "{said}");
    server.stop_graceful().await?;
    server.restart().await?;
    let got = admin_ok(&server, "GET", "/admin/runtimes/items", b"", 200).await?;
    ensure!(got["views"] == json!(["items", "extra"]), "{got}");
    ensure!(
        entries(&server, "more").await?.is_none(),
        "retired by the config's new declaration"
    );
    // `gone`'s declaration did not change: it stays deleted.
    ensure!(server.ingest("gone", "").await?.status() == 404);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_is_judged_as_a_deploy_and_answers_a_position_to_read_after() -> anyhow::Result<()> {
    let server = Server::start_with_env(&[], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
    let made = put(
        &server,
        "docs",
        json!({"module": "builtin:json", "views": ["doc"]}),
        201,
    )
    .await?;
    let position = made["position"].as_u64().context("a position")?;
    let read = server.get(&format!("/views/doc?after={position}")).await?;
    ensure!(read.status() == 200, "{} {}", read.status(), read.text());
    let bad = server.get("/views/doc?after=soon").await?;
    ensure!(bad.status() == 400, "{} {}", bad.status(), bad.text());

    let resp = server
        .ingest("docs", &line("doc", "a", json!({"n": "text"})))
        .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    // A schema the state no longer fits is refused, as a deploy refuses it; nothing changes.
    let stricter = json!({"views": ["doc"], "schemas": {"doc": {"type": "object", "properties": {"n": {"type": "number"}}}}});
    let refused = admin(
        &server,
        "PUT",
        "/admin/runtimes/docs",
        stricter.to_string().as_bytes(),
    )
    .await?;
    ensure!(
        refused.status() == 422,
        "{} {}",
        refused.status(),
        refused.text()
    );
    ensure!(
        refused.text().contains("key \\\"a\\\""),
        "{}",
        refused.text()
    );
    let got = admin_ok(&server, "GET", "/admin/runtimes/docs", b"", 200).await?;
    ensure!(got["schemas"] == json!({}), "{got}");
    // One the state fits is taken.
    let fits = json!({"views": ["doc"], "schemas": {"doc": {"type": "object", "properties": {"n": {"type": "string"}}}}});
    put(&server, "docs", fits, 200).await?;
    Ok(())
}

/// The file of `module` (`sha256:<hex>`) in the data directory's module store.
fn module_file(server: &Server, module: &str) -> std::path::PathBuf {
    let hex = module.trim_start_matches("sha256:");
    server
        .data_dir()
        .join("modules")
        .join(format!("{hex}.wasm"))
}

/// Flips one byte in the middle of `path`.
fn flip_a_byte(path: &std::path::Path) -> anyhow::Result<()> {
    let mut bytes = std::fs::read(path)?;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(path, bytes)?;
    Ok(())
}

/// Two runtimes made through the API, each with a batch: `docs` on the built-in JSON guest
/// (`doc` holds `a: 1`) and `counter` on an uploaded JS build (count 1). Their modules:
/// the built-in's and the upload's.
async fn docs_and_counter(server: &Server) -> anyhow::Result<(String, String)> {
    let made = put(
        server,
        "docs",
        json!({"module": "builtin:json", "views": ["doc"]}),
        201,
    )
    .await?;
    let builtin = made["status"]["running_module"]
        .as_str()
        .context("running_module")?
        .to_owned();
    let custom = upload(server, &js_counter(1)).await?;
    put(
        server,
        "counter",
        json!({"module": custom, "views": ["count"]}),
        201,
    )
    .await?;
    ingest(server, "docs", line("doc", "a", json!(1))).await?;
    ensure!(tick(server).await? == (1, 1));
    Ok((builtin, custom))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_module_file_is_repaired_and_costs_no_data() -> anyhow::Result<()> {
    let mut server = Server::start_with_env(&[], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
    let (builtin, custom) = docs_and_counter(&server).await?;

    // Damaged while the server runs: the same bytes uploaded again repair the file.
    flip_a_byte(&module_file(&server, &custom))?;
    ensure!(upload(&server, &js_counter(1)).await? == custom);
    ensure!(std::fs::read(module_file(&server, &custom))? == js_counter(1).as_bytes());

    // A built-in's file damaged, and an interrupted write left behind, while it is stopped: the
    // next start repairs the one from the built-in and removes the other; every runtime keeps
    // its data and takes batches.
    admin_ok(&server, "POST", "/admin/snapshot", b"", 200).await?;
    server.stop_graceful().await?;
    flip_a_byte(&module_file(&server, &builtin))?;
    let leftover = module_file(&server, &custom).with_extension("wasm.tmp");
    std::fs::write(&leftover, b"half a module")?;
    server.restart().await?;
    ensure!(entries(&server, "doc").await? == Some(json!({"a": 1})));
    ensure!(tick(&server).await? == (2, 1));
    ingest(&server, "docs", line("doc", "b", json!(2))).await?;
    ensure!(!leftover.exists(), "the leftover is removed");
    ensure!(
        server
            .logs()
            .contains("repaired from the copy the server holds"),
        "the start says it repaired the file"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_no_start_can_read_halts_only_its_runtime_until_its_bytes_are_kept_again(
) -> anyhow::Result<()> {
    let mut server = Server::start_with_env(&[], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
    let (_, custom) = docs_and_counter(&server).await?;
    ensure!(tick(&server).await? == (2, 1));

    // Damaged while stopped, with no copy anywhere: the server starts all the same; the other
    // runtime keeps its data and takes batches; this one keeps what it served and is halted,
    // named in /readyz with the module, its ingest refused.
    admin_ok(&server, "POST", "/admin/snapshot", b"", 200).await?;
    server.stop_graceful().await?;
    flip_a_byte(&module_file(&server, &custom))?;
    server.restart().await?;
    ensure!(entries(&server, "doc").await? == Some(json!({"a": 1})));
    ingest(&server, "docs", line("doc", "b", json!(2))).await?;
    let count = server.get("/views/count").await?.json()?;
    ensure!(count["entries"]["c"]["count"] == 2, "{count}");
    let ready = server.get("/readyz").await?;
    ensure!(ready.status() == 200, "{} {}", ready.status(), ready.text());
    let halted = &ready.json()?["halted"]["counter"];
    ensure!(halted["unreadable"] == json!(custom), "{halted}");
    ensure!(
        halted["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("POST /admin/modules")),
        "{halted}"
    );
    let refused = server.ingest("counter", "tick\n").await?;
    ensure!(
        refused.status() == 503 && refused.text().contains("runtime_halted"),
        "{} {}",
        refused.status(),
        refused.text()
    );
    let listed = admin_ok(&server, "GET", "/admin/runtimes", b"", 200).await?;
    ensure!(listed.to_string().contains(&custom), "{listed}");

    // A snapshot keeps the halt; the bytes kept again and a restart run it on from its state.
    admin_ok(&server, "POST", "/admin/snapshot", b"", 200).await?;
    ensure!(upload(&server, &js_counter(1)).await? == custom);
    server.stop_graceful().await?;
    server.restart().await?;
    let ready = server.get("/readyz").await?.json()?;
    ensure!(ready.get("halted").is_none(), "{ready}");
    ensure!(tick(&server).await? == (3, 1));
    ensure!(entries(&server, "doc").await? == Some(json!({"a": 1, "b": 2})));
    ensure!(
        server.logs().contains("reads again"),
        "the start says the runtime runs on"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_of_a_user_shares_one_compilation_of_the_js_engine() -> anyhow::Result<()> {
    // No cache named: the user's, as on a machine where nothing is set.
    let home = tempfile::tempdir()?;
    let home_path = home.path().to_string_lossy().into_owned();
    let env = [
        (ADMIN_TOKEN_ENV, TOKEN),
        ("VIEWTAPE_CACHE_DIR", ""),
        ("XDG_CACHE_HOME", home_path.as_str()),
    ];
    let cache = home.path().join("viewtape");
    let compiled = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&cache)
            .map(|dir| dir.flatten().map(|entry| entry.path()).collect())
            .unwrap_or_default()
    };
    // The first node compiles the engine as it starts, before any JavaScript is defined.
    let first = Server::start_with_env(&[], &env).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !first.logs().contains("kept in the cache") {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the engine was not compiled at start: {}",
            first.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(compiled().len() == 1, "{:?}", compiled());
    // A second node, on its own data directory, loads it: nothing is compiled again.
    let second = Server::start_with_env(&[], &env).await?;
    let custom = upload(&second, &js_counter(1)).await?;
    put(
        &second,
        "counter",
        json!({"module": custom, "views": ["count"]}),
        201,
    )
    .await?;
    ensure!(tick(&second).await? == (1, 1));
    ensure!(
        !second.logs().contains("kept in the cache"),
        "{}",
        second.logs()
    );
    ensure!(compiled().len() == 1, "{:?}", compiled());
    for server in [&first, &second] {
        ensure!(!server.data_dir().join("cache").exists());
    }
    Ok(())
}
