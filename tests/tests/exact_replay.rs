//! Replay follows what was acknowledged, against the real binary: a batch acknowledged live is
//! replayed after `kill -9` whatever fuel it would cost the restored instance (the fuel limit
//! judged it once, live), with the same frames and no reset; new batches are judged by the limit
//! of now. A record a replay cannot reproduce halts its runtime alone.

use anyhow::{ensure, Context as _};
use viewtape_tests::logfiles::{fail_closed, newest_segment, rewrite_record};
use viewtape_tests::server::{config_file, guest_wasm, with_custom_section, ADMIN_TOKEN_ENV};
use viewtape_tests::{expect, Server};

/// The demo ticker with `fuel`, no periodic snapshot: a restart after `kill -9` replays the log.
fn ticker(fuel: u64) -> String {
    format!(
        "[server]\nsnapshot_interval = \"0s\"\n\n\
         [[runtime]]\nname = \"demo\"\nmodule = \"builtin:ticker\"\nviews = [\"prices\"]\n\
         [runtime.limits]\nfuel = {fuel}\n"
    )
}

/// Ticks `from..to`, 50 symbols.
fn ticks(from: u64, to: u64) -> String {
    (from..to)
        .map(|seq| {
            format!(
                "{{\"symbol\":\"S{}\",\"price\":1.5,\"seq\":{seq}}}\n",
                seq % 50
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_acknowledged_live_is_replayed_whatever_its_fuel_now() -> anyhow::Result<()> {
    let config = config_file(&ticker(10_000_000_000))?;
    let path = config.path().display().to_string();
    let mut server = Server::start(&["--config", &path, "--demo-rate", "0"]).await?;
    for batch in 0..2 {
        let resp = server
            .ingest("demo", &ticks(1 + batch * 500, 1 + (batch + 1) * 500))
            .await?;
        ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    }
    let tape = expect::tape(&server, "prices", 1000).await?;
    let last = expect::cursor_of(tape.last().context("a frame")?)?;
    let state = server.get("/views/prices").await?.json()?;
    server.kill9().await?;

    // A limit the acknowledged batches would now run out of: they replay all the same.
    std::fs::write(config.path(), ticker(100_000))?;
    server.restart().await?;
    ensure!(
        fail_closed(&server, "digest").await == 0.0,
        "{}",
        server.logs()
    );
    ensure!(
        server.get("/views/prices").await?.json()? == state,
        "the same state"
    );
    ensure!(
        expect::tape(&server, "prices", 1000).await? == tape,
        "the same frames"
    );
    expect::resumes(&server, "prices", &last).await?;
    // New input is judged by the limit of now.
    let resp = server.ingest("demo", &ticks(1001, 1501)).await?;
    ensure!(resp.status() == 422, "{} {}", resp.status(), resp.text());
    ensure!(resp.text().contains("fuel"), "{}", resp.text());
    Ok(())
}

/// Two runtimes of `builtin:json`, `alpha` (view `pa`) and `beta` (view `pb`), no periodic
/// snapshot.
const TWO: &str = "[server]\nsnapshot_interval = \"0s\"\n\n\
    [[runtime]]\nname = \"alpha\"\nmodule = \"builtin:json\"\nviews = [\"pa\"]\n\n\
    [[runtime]]\nname = \"beta\"\nmodule = \"builtin:json\"\nviews = [\"pb\"]\n";

/// Keys `from..to` of `view`, each at `price`.
fn priced(view: &str, from: u64, to: u64, price: &str) -> String {
    (from..to)
        .map(|seq| {
            format!("{{\"view\":\"{view}\",\"key\":\"k{seq}\",\"value\":{{\"price\":{price},\"seq\":{seq}}}}}\n")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_replay_cannot_reproduce_halts_its_runtime_alone() -> anyhow::Result<()> {
    let config = config_file(TWO)?;
    let path = config.path().display().to_string();
    let mut server =
        Server::start_with_env(&["--config", &path], &[(ADMIN_TOKEN_ENV, "admin")]).await?;
    for (runtime, ticks) in [
        ("alpha", priced("pa", 1, 101, "1.5")),
        ("beta", priced("pb", 1, 101, "1.5")),
        ("alpha", priced("pa", 101, 201, "7.25")),
        ("beta", priced("pb", 101, 201, "1.5")),
    ] {
        let resp = server.ingest(runtime, &ticks).await?;
        ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    }
    let (alpha, beta) = (
        expect::tape(&server, "pa", 200).await?,
        expect::tape(&server, "pb", 200).await?,
    );
    server.kill9().await?;

    // Alpha's second batch now says another price than the one its digest was taken of.
    let (segment, _) = newest_segment(&server)?;
    rewrite_record(&segment, b"7.25", b"7.75")?;
    server.restart().await?;
    ensure!(
        fail_closed(&server, "digest").await == 0.0,
        "{}",
        server.logs()
    );
    let ready = server.ready(std::time::Duration::from_secs(5)).await?;
    let halt = &ready["halted"]["alpha"];
    ensure!(halt["position"].as_u64() == Some(3), "{ready}");
    let reason = halt["reason"].as_str().context("a reason")?;
    ensure!(
        reason.contains("another result than the logged one"),
        "{reason}"
    );
    ensure!(ready["halted"].get("beta").is_none(), "{ready}");
    ensure!(
        server
            .metric("viewtape_runtime_halted{runtime=\"alpha\"}")
            .await?
            == 1.0
    );
    ensure!(
        server
            .metric("viewtape_runtime_halted{runtime=\"beta\"}")
            .await?
            == 0.0
    );

    // Beta lost nothing: every frame, the same cursor.
    ensure!(
        expect::tape(&server, "pb", 200).await? == beta,
        "beta's frames"
    );
    let last = expect::cursor_of(beta.last().context("a frame")?)?;
    expect::resumes(&server, "pb", &last).await?;
    // Alpha keeps what it reproduced, and serves nothing else under the cursors it issued:
    // the second batch's cursors are ahead of its tape, and reset.
    ensure!(
        expect::tape(&server, "pa", 100).await? == alpha[..100],
        "alpha's first batch"
    );
    let issued = expect::cursor_of(alpha.last().context("a frame")?)?;
    expect::refused(&server, "pa", &issued).await?;
    let kept = expect::cursor_of(&alpha[99])?;
    expect::resumes(&server, "pa", &kept).await?;

    let resp = server
        .ingest("alpha", &priced("pa", 201, 202, "1.5"))
        .await?;
    let error = expect::json_error(&resp, 503)?;
    ensure!(error["error"] == "runtime_halted", "{error}");
    ensure!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("log position 3")),
        "{error}"
    );
    let resp = server
        .ingest("beta", &priced("pb", 201, 301, "1.5"))
        .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());

    // Halted it stays, through a snapshot and a restart, until it is deleted.
    server.stop_graceful().await?;
    server.restart().await?;
    let ready = server.ready(std::time::Duration::from_secs(5)).await?;
    ensure!(
        ready["halted"]["alpha"]["position"].as_u64() == Some(3),
        "{ready}"
    );
    let listed = server
        .admin("admin", "GET", "/admin/runtimes", &[], b"")
        .await?
        .json()?;
    let halted = |listed: &serde_json::Value, name: &str| {
        listed["runtimes"]
            .as_array()
            .and_then(|all| all.iter().find(|r| r["name"] == name))
            .map(|r| r["halted"].clone())
    };
    ensure!(
        halted(&listed, "alpha").is_some_and(|h| h["position"] == 3),
        "{listed}"
    );
    ensure!(
        halted(&listed, "beta") == Some(serde_json::Value::Null),
        "{listed}"
    );
    ensure!(
        expect::tape(&server, "pb", 300).await?[..200] == beta[..],
        "beta's frames"
    );

    // A new module named in its config starts it fresh, numbering on past every cursor issued.
    let build = with_custom_section(&std::fs::read(guest_wasm("json"))?, "build", b"2");
    let wasm = tempfile::NamedTempFile::new()?;
    std::fs::write(wasm.path(), build)?;
    let module = wasm.path().display().to_string();
    std::fs::write(config.path(), TWO.replacen("builtin:json", &module, 1))?;
    server.stop_graceful().await?;
    server.restart().await?;
    let ready = server.ready(std::time::Duration::from_secs(5)).await?;
    ensure!(ready.get("halted").is_none(), "{ready}");
    let mut stream = expect::refused(&server, "pa", &issued).await?;
    let (_, synced) = stream.until_synced(10_000).await?;
    let synced = expect::cursor_of(&synced)?;
    ensure!(synced.offset() > issued.offset(), "{synced} past {issued}");
    let resp = server
        .ingest("alpha", &priced("pa", 201, 202, "1.5"))
        .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let event = stream.next_event().await?;
    ensure!(
        expect::cursor_of(&event)?.offset().get() == synced.offset().get() + 1,
        "{event:?}"
    );
    Ok(())
}
