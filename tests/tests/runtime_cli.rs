//! Runtimes as data from the command line, against the real binary: `viewtape runtime put`
//! creates a runtime on a running server (a pattern view serves a room from its first event),
//! `get` shows it, `delete` retires its views; `viewtape module put` and `runtime put --module
//! FILE` upload a build first. A refusal is one line naming the server's code and message, and
//! exit code 1.

use anyhow::{ensure, Context as _};
use sha2::{Digest, Sha256};
use viewtape_tests::server::{cli, guest_wasm, ADMIN_TOKEN_ENV};
use viewtape_tests::Server;

const TOKEN: &str = "runtime-cli-token-7";

/// `viewtape ARGS --server http://localhost:PORT/` with the admin token; exit code and output.
async fn viewtape(server: &Server, args: &[&str]) -> anyhow::Result<(i32, String)> {
    let addr = format!("http://localhost:{}/", server.addr().port());
    let mut args = args.to_vec();
    args.extend(["--server", addr.as_str()]);
    cli(&args, &[(ADMIN_TOKEN_ENV, TOKEN)]).await
}

/// The JSON a successful command printed.
fn printed(code: i32, out: &str) -> anyhow::Result<serde_json::Value> {
    ensure!(code == 0, "exit {code}: {out}");
    serde_json::from_str(out.trim()).with_context(|| format!("not JSON: {out}"))
}

/// A refusal: exit code 1 and one line, `error: the server answered STATUS CODE: …`.
fn refused(code: i32, out: &str, status_and_code: &str) -> anyhow::Result<()> {
    ensure!(code == 1, "exit {code}: {out}");
    ensure!(out.trim().lines().count() == 1, "one line: {out}");
    ensure!(
        out.starts_with(&format!("error: the server answered {status_and_code}: ")),
        "{out}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtimes_are_created_shown_and_deleted_from_the_command_line() -> anyhow::Result<()> {
    let server = Server::start_with_env(&[], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;

    // Created: a pattern view serves a room from before its first event.
    let put_chat = [
        "runtime",
        "put",
        "chat",
        "--module",
        "builtin:json",
        "--view",
        "chat.*",
    ];
    let (code, out) = viewtape(&server, &put_chat).await?;
    let created = printed(code, &out)?;
    ensure!(
        created["runtime"] == "chat"
            && created["module"] == "builtin:json"
            && created["views"] == serde_json::json!(["chat.*"])
            && created["declared_by"] == "record",
        "{created}"
    );
    let mut room = server.sse("/views/chat.room-7/events", &[]).await?;
    room.until_synced(10).await?;
    let resp = server
        .ingest(
            "chat",
            "{\"view\":\"chat.room-7\",\"key\":\"m1\",\"value\":{\"text\":\"hi\"}}\n",
        )
        .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let event = room.next_event().await?;
    ensure!(
        event.event == "update" && event.data.contains("\"hi\""),
        "{event:?}"
    );

    // Shown; the same definition again changes nothing.
    let (code, out) = viewtape(&server, &["runtime", "get", "chat"]).await?;
    let shown = printed(code, &out)?;
    ensure!(
        shown["views"] == serde_json::json!(["chat.*"]) && shown["status"]["batches"] == 1,
        "{shown}"
    );
    let (code, out) = viewtape(&server, &put_chat).await?;
    printed(code, &out)?;

    // Refused, in one line: a view another runtime has, the demo's or the pattern's.
    for view in ["prices", "chat.lobby"] {
        let (code, out) = viewtape(
            &server,
            &[
                "runtime",
                "put",
                "other",
                "--module",
                "builtin:json",
                "--view",
                view,
            ],
        )
        .await?;
        refused(code, &out, "409 view_conflict")?;
        ensure!(out.contains(view), "{out}");
    }
    let (code, out) = viewtape(
        &server,
        &[
            "runtime",
            "put",
            "other",
            "--module",
            "builtin:nope",
            "--view",
            "x",
        ],
    )
    .await?;
    refused(code, &out, "422 invalid_definition")?;
    ensure!(out.contains("no built-in guest"), "{out}");

    // A schema from a file travels with the definition.
    let schema = tempfile::NamedTempFile::new()?;
    std::fs::write(schema.path(), r#"{"type":"object","required":["text"]}"#)?;
    let schema_arg = format!("notes={}", schema.path().display());
    let (code, out) = viewtape(
        &server,
        &[
            "runtime",
            "put",
            "notes",
            "--module",
            "builtin:json",
            "--view",
            "notes",
            "--schema",
            &schema_arg,
        ],
    )
    .await?;
    let notes = printed(code, &out)?;
    ensure!(
        notes["schemas"]["notes"]["required"] == serde_json::json!(["text"]),
        "{notes}"
    );

    // Modules: uploaded on their own, or by `runtime put --module FILE`, kept by their SHA-256.
    let wasm_path = guest_wasm("misbehave");
    let wasm = std::fs::read(&wasm_path)?;
    let sha = format!("sha256:{:x}", Sha256::digest(&wasm));
    let path = wasm_path.display().to_string();
    let (code, out) = viewtape(&server, &["module", "put", &path]).await?;
    let kept = printed(code, &out)?;
    ensure!(
        kept["module"] == sha.as_str() && kept["bytes"] == wasm.len(),
        "{kept}"
    );
    let (code, out) = viewtape(
        &server,
        &[
            "runtime", "put", "counter", "--module", &path, "--view", "state",
        ],
    )
    .await?;
    let counter = printed(code, &out)?;
    ensure!(
        counter["module"] == sha.as_str() && counter["status"]["running_module"] == sha.as_str(),
        "{counter}"
    );
    let junk = tempfile::NamedTempFile::new()?;
    std::fs::write(junk.path(), b"not a module")?;
    let junk_path = junk.path().display().to_string();
    let (code, out) = viewtape(&server, &["module", "put", &junk_path]).await?;
    refused(code, &out, "422 module_refused")?;

    // Deleted: the room's stream ends with `retired`, ingest and the runtime answer 404.
    let (code, out) = viewtape(&server, &["runtime", "delete", "chat"]).await?;
    let deleted = printed(code, &out)?;
    ensure!(deleted["deleted"] == true, "{deleted}");
    let last = room.next_event().await?;
    ensure!(last.event == "retired" && last.id.is_none(), "{last:?}");
    let resp = server
        .ingest(
            "chat",
            "{\"view\":\"chat.room-7\",\"key\":\"m2\",\"value\":{}}\n",
        )
        .await?;
    ensure!(resp.status() == 404, "{} {}", resp.status(), resp.text());
    let (code, out) = viewtape(&server, &["runtime", "get", "chat"]).await?;
    refused(code, &out, "404 not_found")?;
    let (code, out) = viewtape(&server, &["runtime", "delete", "chat"]).await?;
    refused(code, &out, "404 not_found")?;

    // Without the token, or with another one, nothing reaches the runtimes.
    let addr = server.addr().to_string();
    let (code, out) = cli(&["runtime", "get", "demo", "--server", &addr], &[]).await?;
    ensure!(code == 1 && out.contains(ADMIN_TOKEN_ENV), "{out}");
    let (code, out) = cli(
        &["runtime", "delete", "demo", "--server", &addr],
        &[(ADMIN_TOKEN_ENV, "wrong")],
    )
    .await?;
    refused(code, &out, "401 unauthorized")?;
    let (code, out) = viewtape(&server, &["runtime", "get", "demo"]).await?;
    ensure!(printed(code, &out)?["declared_by"] == "config", "{out}");
    Ok(())
}
