//! `viewtape check-config FILE` on the files of `tests/configs/`: every good one passes, every
//! bad one is refused naming the file, the line and the key its first line announces
//! (`# expect: line N, key K`), and `viewtape serve --config` refuses it in the same words. No
//! refusal prints a backtrace, even with `RUST_BACKTRACE` set.
//!
//! The files name other files with placeholders: `@DIR@` (their own directory), `@GUESTS@` (the
//! checked-in guest modules) and `@TLS@` (a directory this test fills with a certificate, its
//! key and an EC public key).

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context as _};
use viewtape_tests::server::{cli, guest_wasm};
use viewtape_tests::Server;

fn corpus(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("configs")
        .join(kind)
}

/// The TLS and auth files the corpus names under `@TLS@`.
fn tls_dir() -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])?;
    std::fs::write(dir.path().join("cert.pem"), made.cert.pem())?;
    std::fs::write(dir.path().join("key.pem"), made.key_pair.serialize_pem())?;
    std::fs::write(
        dir.path().join("public.pem"),
        made.key_pair.public_key_pem(),
    )?;
    Ok(dir)
}

/// Every `.toml` of `tests/configs/<kind>`, its placeholders filled in, written to `out`: the
/// original's name, and the path to check.
fn instances(kind: &str, tls: &Path, out: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let dir = corpus(kind);
    let guests = viewtape_tests::server::guest_wasm("ticker");
    let guests = guests.parent().context("guests dir")?;
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|ext| ext != "toml") {
            continue;
        }
        let name = path
            .file_name()
            .context("name")?
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&path)?
            .replace("@DIR@", &dir.display().to_string())
            .replace("@GUESTS@", &guests.display().to_string())
            .replace("@TLS@", &tls.display().to_string());
        let instance = out.join(&name);
        std::fs::write(&instance, text)?;
        files.push((name, instance));
    }
    files.sort();
    Ok(files)
}

/// The one `error: …` line of a command's output.
fn error_line(output: &str) -> anyhow::Result<&str> {
    let mut errors = output.lines().filter(|line| line.starts_with("error: "));
    let line = errors
        .next()
        .with_context(|| format!("no error line in:\n{output}"))?;
    ensure!(
        errors.next().is_none(),
        "more than one error line:\n{output}"
    );
    Ok(line)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn good_files_pass() -> anyhow::Result<()> {
    let (tls, out) = (tls_dir()?, tempfile::tempdir()?);
    let files = instances("good", tls.path(), out.path())?;
    ensure!(files.len() >= 3, "the good corpus: {files:?}");
    for (name, path) in files {
        let path = path.display().to_string();
        let (code, output) = cli(&["check-config", &path], &[]).await?;
        ensure!(code == 0, "{name}: exit {code}:\n{output}");
        ensure!(output.contains(&format!("{path}: ok")), "{name}:\n{output}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_files_are_refused_naming_file_line_and_key_by_check_config_and_serve_alike(
) -> anyhow::Result<()> {
    let (tls, out, data) = (tls_dir()?, tempfile::tempdir()?, tempfile::tempdir()?);
    let files = instances("bad", tls.path(), out.path())?;
    ensure!(files.len() >= 20, "the bad corpus: {files:?}");
    let env = [("RUST_BACKTRACE", "1")];
    for (name, path) in files {
        let text = std::fs::read_to_string(&path)?;
        let expect = text
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("# expect: "))
            .with_context(|| format!("{name}: no `# expect:` first line"))?;
        let path = path.display().to_string();
        let (code, checked) = cli(&["check-config", &path], &env).await?;
        ensure!(code == 1, "{name}: check-config exit {code}:\n{checked}");
        let line = error_line(&checked)?;
        let located = format!("error: invalid config {path}, {expect}");
        ensure!(
            line.starts_with(&located)
                && line[located.len()..].starts_with(':')
                && line.len() > located.len() + 3,
            "{name}: expected `{located}: …`, got\n{line}"
        );
        let data_dir = data.path().join(&name);
        let data_dir = data_dir.display().to_string();
        let (code, served) = cli(
            &[
                "serve",
                "--config",
                &path,
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                &data_dir,
            ],
            &env,
        )
        .await?;
        ensure!(code == 1, "{name}: serve exit {code}:\n{served}");
        ensure!(
            error_line(&served)? == line,
            "{name}: serve refused it in other words:\n{served}\ncheck-config:\n{line}"
        );
        for output in [&checked, &served] {
            ensure!(
                !output.to_lowercase().contains("backtrace"),
                "{name}: a backtrace:\n{output}"
            );
        }
    }
    Ok(())
}

/// `check-config` on a file it cannot read printed the OS error twice (in the message and again
/// as its cause): once, after the file's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_config_names_the_os_error_once() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("missing.toml").display().to_string();
    let (code, output) = cli(&["check-config", &path], &[]).await?;
    ensure!(code == 1, "exit {code}:\n{output}");
    let line = error_line(&output)?;
    // What the OS says, as `std::io::Error` words it: "No such file or directory (os error 2)".
    let why = std::fs::read(&path)
        .err()
        .context("the file is missing")?
        .to_string();
    ensure!(
        line == format!("error: cannot read config {path}: {why}"),
        "{line}"
    );
    Ok(())
}

/// Relative paths in a config were read from the working directory, not from the config's: a
/// config beside its module, schema and TLS files checks and serves from anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relative_paths_are_the_config_files_directorys() -> anyhow::Result<()> {
    let (tls, dir) = (tls_dir()?, tempfile::tempdir()?);
    let files = dir.path().join("files");
    std::fs::create_dir(&files)?;
    std::fs::copy(guest_wasm("ticker"), files.join("ticker.wasm"))?;
    for name in ["cert.pem", "key.pem", "public.pem"] {
        std::fs::copy(tls.path().join(name), files.join(name))?;
    }
    std::fs::copy(
        corpus("good").join("orders.schema.json"),
        files.join("orders.schema.json"),
    )?;
    let config = dir.path().join("viewtape.toml");
    std::fs::write(
        &config,
        r#"[server]
tls_cert = "files/cert.pem"
tls_key = "files/key.pem"

[auth]
public_keys = "files/public.pem"

[[runtime]]
name = "demo"
wasm = "files/ticker.wasm"
views = ["prices"]

[[runtime]]
name = "orders"
wasm = "builtin:json"
views = ["orders"]
schemas = { orders = "files/orders.schema.json" }
"#,
    )?;
    // The tests run in the `tests` directory, far from the config's.
    ensure!(std::env::current_dir()? != dir.path());
    let path = config.display().to_string();
    let (code, output) = cli(&["check-config", &path], &[]).await?;
    ensure!(code == 0, "check-config exit {code}:\n{output}");
    let server = Server::start(&["--config", &path]).await?;
    ensure!(server.scheme() == "https", "{}", server.logs());
    Ok(())
}
