//! JavaScript guests through the real binary: a `[[runtime]]` whose `module`
//! is a `.js` file serves its view over HTTP; `viewtape run` runs the JS ticker
//! (`examples/js/ticker.js`) as it runs a `.wasm`; `check-config` refuses a module that does not
//! compile, naming the line and the column.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context as _};
use serde_json::json;
use viewtape_tests::server::{cli, config_file, run_guest};
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
    let ticks =
        "{\"symbol\":\"ACME\",\"price\":1.5,\"seq\":1}\n{\"symbol\":\"ACME\",\"price\":2,\"seq\":4}\n";
    let module = js_ticker().display().to_string();
    let (ok, lines) = run_guest(&[&module], ticks).await?;
    ensure!(ok, "{lines:?}");
    ensure!(
        lines
            .iter()
            .any(|l| l["gap"] == "ticker seq jumped from 1 to 4: 2 tick(s) missing"),
        "{lines:?}"
    );
    let updates: Vec<_> = lines.iter().filter_map(|l| l.get("update")).collect();
    ensure!(updates.len() == 2, "{lines:?}");
    ensure!(
        updates[1]
            == &json!({"view": "prices", "key": "ACME", "value": {"symbol": "ACME", "price": 2, "seq": 4}}),
        "{lines:?}"
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

fn example(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/js")
        .join(name)
        .display()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_js_logstats_publishes_what_the_rust_one_does() -> anyhow::Result<()> {
    let input = "api ERROR boom\napi info ok\nweb warn slow\napi INFO again\n\
                 db debug x\nweb retired\ndb trace y\nweb info back\napi odd level\n";
    let rust = viewtape_tests::server::guest_wasm("logstats")
        .display()
        .to_string();
    let js = example("logstats.js");
    for batch_lines in ["1", "4", "100"] {
        let (rust_ok, rust_out) = run_guest(&[&rust, "--batch-lines", batch_lines], input).await?;
        let (js_ok, js_out) = run_guest(&[&js, "--batch-lines", batch_lines], input).await?;
        ensure!(rust_ok && js_ok, "{rust_out:?}\n{js_out:?}");
        // All but the size of the saved state, whose format is each guest's own.
        let published = |out: &[serde_json::Value]| -> Vec<serde_json::Value> {
            out.iter()
                .filter(|l| l.get("state_bytes").is_none())
                .cloned()
                .collect()
        };
        ensure!(
            published(&rust_out) == published(&js_out) && js_out.len() > 3,
            "batches of {batch_lines}:\n{rust_out:?}\n{js_out:?}"
        );
        ensure!(
            js_out.iter().any(|l| l["update"]["value"]
                == json!({"service": "api", "error": 1, "warn": 0, "info": 2, "debug": 0,
                          "trace": 0, "other": 1, "total": 4})),
            "{js_out:?}"
        );
    }
    // A bad service name rejects the batch, naming the line.
    let (ok, out) = run_guest(&[&js], "api info\nbad/name info\n").await?;
    ensure!(!ok, "{out:?}");
    ensure!(
        out.iter()
            .any(|l| l.to_string().contains("line 2: service name")),
        "{out:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_js_logstats_takes_over_the_rust_logstats_state() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let state_arg = state.display().to_string();
    let rust = viewtape_tests::server::guest_wasm("logstats")
        .display()
        .to_string();
    let (ok, _) = run_guest(
        &[&rust, "--save-state", &state_arg],
        "api error a\napi info b\nweb warn c\n",
    )
    .await?;
    ensure!(ok);
    let (ok, out) = run_guest(
        &[&example("logstats.js"), "--state", &state_arg],
        "api info d\n",
    )
    .await?;
    ensure!(ok, "{out:?}");
    ensure!(
        out.iter().any(|l| l["update"]["value"]
            == json!({"service": "api", "error": 1, "warn": 0, "info": 2, "debug": 0,
                      "trace": 0, "other": 0, "total": 3})),
        "{out:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_js_vwap_averages_each_symbols_last_n_trades() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("window");
    std::fs::write(&config, "2")?;
    let config = config.display().to_string();
    let trades = "{\"symbol\":\"ACME\",\"price\":10,\"qty\":100}\n\
                  {\"symbol\":\"BOLT\",\"price\":3,\"qty\":10}\n\
                  {\"symbol\":\"ACME\",\"price\":11,\"qty\":300}\n\
                  {\"symbol\":\"ACME\",\"price\":12,\"qty\":100}\n";
    let (ok, out) = run_guest(
        &[
            &example("vwap.js"),
            "--config",
            &config,
            "--batch-lines",
            "2",
        ],
        trades,
    )
    .await?;
    ensure!(ok, "{out:?}");
    let updates: Vec<_> = out.iter().filter_map(|l| l.get("update")).collect();
    ensure!(
        updates
            == [
                &json!({"view": "vwap", "key": "ACME", "value": {"symbol": "ACME", "vwap": 10, "volume": 100, "trades": 1}}),
                &json!({"view": "vwap", "key": "BOLT", "value": {"symbol": "BOLT", "vwap": 3, "volume": 10, "trades": 1}}),
                // The window of 2: (11·300 + 12·100) / 400; the trade at 10 has left it.
                &json!({"view": "vwap", "key": "ACME", "value": {"symbol": "ACME", "vwap": 11.25, "volume": 400, "trades": 2}}),
            ],
        "{out:?}"
    );
    // A bad trade rejects its batch, naming the line; a bad window is refused at init.
    let (ok, out) = run_guest(
        &[&example("vwap.js")],
        "{\"symbol\":\"ACME\",\"price\":-1,\"qty\":1}\n",
    )
    .await?;
    ensure!(
        !ok && out
            .iter()
            .any(|l| l.to_string().contains("line 1: price and qty")),
        "{out:?}"
    );
    std::fs::write(dir.path().join("bad"), "zero")?;
    let bad = dir.path().join("bad").display().to_string();
    let (ok, out) = run_guest(&[&example("vwap.js"), "--config", &bad], "")
        .await
        .unwrap_or((false, Vec::new()));
    ensure!(!ok, "{out:?}");
    Ok(())
}

/// The compiled JS engine is kept in the user's cache by default: a restart loads it instead of
/// compiling it again, and a damaged copy (here: after `kill -9`) is compiled again and replaced,
/// never loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compiled_js_engine_is_kept_and_a_damaged_copy_is_replaced() -> anyhow::Result<()> {
    let module = js_ticker().display().to_string();
    let file = config_file(&config(&module))?;
    let path = file.path().display().to_string();
    // An empty VIEWTAPE_CACHE_DIR is unset: the server's own default (the user's cache, here a
    // directory of this test's), not the tests' shared one.
    let home = tempfile::tempdir()?;
    let home_path = home.path().display().to_string();
    let env = [
        ("VIEWTAPE_CACHE_DIR", ""),
        ("XDG_CACHE_HOME", home_path.as_str()),
    ];
    let mut server = Server::start_with_env(&["--config", &path], &env).await?;
    server.ready(Duration::from_secs(30)).await?;
    server
        .ingest_ok("{\"symbol\":\"ACME\",\"price\":1,\"seq\":1}\n")
        .await?;
    let cache = home.path().join("viewtape");
    let kept: Vec<PathBuf> = std::fs::read_dir(&cache)
        .with_context(|| format!("{} holds the compiled engine", cache.display()))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    ensure!(
        kept.len() == 1 && kept[0].extension().is_some_and(|e| e == "cwasm"),
        "{kept:?}"
    );
    let whole = std::fs::read(&kept[0])?;

    server.kill9().await?;
    let mut damaged = whole.clone();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x55;
    std::fs::write(&kept[0], &damaged)?;
    server.restart().await?;
    server.ready(Duration::from_secs(30)).await?;
    server
        .ingest_ok("{\"symbol\":\"ACME\",\"price\":2,\"seq\":2}\n")
        .await?;
    let resp = server.get("/views/prices").await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    ensure!(
        resp.json()?["entries"]["ACME"]["price"] == json!(2),
        "{}",
        resp.text()
    );
    ensure!(
        server.logs().contains("cached code is damaged"),
        "the damage is logged: {}",
        server.logs()
    );
    let replaced = std::fs::read(&kept[0])?;
    ensure!(
        replaced != damaged && replaced.len() == whole.len(),
        "the damaged copy was replaced by a whole one"
    );
    server.stop_graceful().await?;
    Ok(())
}

/// What a guest publishes is bounded and valid JSON, whatever it tries: a key longer than
/// `max_event` refuses the batch (the key is not echoed whole); a gap reason of a megabyte is
/// kept cut, and marked; a string with half a surrogate pair, nested in a value, refuses the
/// batch, naming the key, instead of reaching the view as text that JSON readers refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_js_guests_output_is_bounded_and_valid_json() -> anyhow::Result<()> {
    let source = "export function init(config) { return {}; }\n\
        export function onBatch(state, input, ctx) {\n\
          const cmd = input.trim();\n\
          if (cmd === 'bigkey') ctx.publish('v', 'k'.repeat(2 * 1024 * 1024), 1);\n\
          else if (cmd === 'gap') { ctx.reportGap('r'.repeat(1024 * 1024)); ctx.publish('v', 'g', 1); }\n\
          else if (cmd === 'lone') ctx.publish('v', 'lone', { a: ['\\uD800'] });\n\
          else ctx.publish('v', cmd, { pair: '\\uD83D\\uDE00' });\n\
          return state;\n\
        }\n";
    let dir = tempfile::tempdir()?;
    let module = dir.path().join("bounds.js");
    std::fs::write(&module, source)?;
    let file = config_file(&format!(
        "[[runtime]]\nname = \"b\"\nmodule = {:?}\nviews = [\"v\"]\n",
        module.display().to_string()
    ))?;
    let path = file.path().display().to_string();
    let server = Server::start(&["--config", &path, "--demo-rate", "0"]).await?;
    server.ready(Duration::from_secs(30)).await?;

    let refused = |resp: &viewtape_tests::Response, told: &str| -> anyhow::Result<()> {
        let text = resp.text();
        ensure!(resp.status() == 422, "{} {text}", resp.status());
        let message = resp.json()?["message"]
            .as_str()
            .context("a message")?
            .to_owned();
        ensure!(message.contains(told), "{message}");
        ensure!(
            message.len() < 1024,
            "the message carries the key: {} bytes",
            message.len()
        );
        Ok(())
    };
    refused(
        &server.ingest("b", "bigkey\n").await?,
        "key of 2097152 bytes",
    )?;
    refused(&server.ingest("b", "lone\n").await?, "unpaired surrogate")?;

    let kept = server.ingest("b", "gap\n").await?;
    ensure!(kept.status() == 200, "{} {}", kept.status(), kept.text());
    let receipt = kept.json()?;
    let gap = receipt["gaps"][0].as_str().context("a gap")?;
    ensure!(
        gap.len() < 2048,
        "the reason is bounded: {} bytes",
        gap.len()
    );
    ensure!(gap.ends_with("… (cut from 1048576 bytes)"), "{gap}");

    let resp = server.ingest("b", "ok\n").await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let view = server.get("/views/v").await?;
    let entries = view.json()?["entries"].clone();
    ensure!(
        entries == json!({"g": 1, "ok": {"pair": "😀"}}),
        "{entries}"
    );
    Ok(())
}
