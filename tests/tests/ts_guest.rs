//! A TypeScript guest from nothing, through the real binary and npm:
//! `viewtape new demo --lang ts --sdk clients/guest` → `npm install` → `npm run build` (one
//! `dist/guest.js`, no imports left) → `npm test` (node:test on `@viewtape/guest`'s harness, which
//! runs the bundle with this build's binary) → `viewtape run dist/guest.js` over the package's
//! own input. Needs Node and npm, and the npm registry for esbuild and TypeScript.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{ensure, Context as _};
use viewtape_tests::server::binary;

/// One npm command: installs fetch from the registry, and the tests run the debug binary.
const NPM_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs `npm ARGS` in `dir` with `env`; fails with its output unless it succeeds.
async fn npm(dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> anyhow::Result<String> {
    let mut command = tokio::process::Command::new("npm");
    command
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    let out = tokio::time::timeout(NPM_TIMEOUT, command.output())
        .await
        .with_context(|| {
            format!(
                "npm {args:?} in {}: no end in {NPM_TIMEOUT:?}",
                dir.display()
            )
        })?
        .with_context(|| format!("npm {args:?}: is npm installed?"))?;
    let output = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success(),
        "npm {args:?} in {} failed:\n{output}",
        dir.display()
    );
    Ok(output)
}

/// This checkout's `clients/guest`, built: a `file:` dependency is used as it is, so its `dist/`
/// must exist (scripts/test builds it; from a bare checkout, this does, from its lockfile).
async fn built_sdk() -> anyhow::Result<PathBuf> {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../clients/guest")
        .canonicalize()?;
    if !sdk.join("dist/harness.js").is_file() {
        if !sdk.join("node_modules/typescript").is_dir() {
            npm(&sdk, &["ci", "--no-audit", "--no-fund"], &[]).await?;
        }
        npm(&sdk, &["run", "build"], &[]).await?;
    }
    Ok(sdk)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_ts_guest_installs_builds_and_passes_its_tests() -> anyhow::Result<()> {
    let viewtape = binary().await?;
    let sdk = built_sdk().await?;
    let dir = tempfile::tempdir()?;
    let out = tokio::process::Command::new(&viewtape)
        .args(["new", "demo", "--lang", "ts", "--dir"])
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
    let package = dir.path().join("demo");
    ensure!(package.join("src/guest.ts").is_file(), "no src/guest.ts");

    npm(&package, &["install", "--no-audit", "--no-fund"], &[]).await?;
    npm(&package, &["run", "build"], &[]).await?;
    let bundle = std::fs::read_to_string(package.join("dist/guest.js"))?;
    ensure!(
        !bundle
            .lines()
            .any(|line| line.trim_start().starts_with("import ")),
        "imports left in the bundle:\n{bundle}"
    );
    ensure!(
        bundle.contains("export"),
        "the bundle exports nothing:\n{bundle}"
    );

    // `npm test` type-checks, builds and runs the generated tests, on this build's binary.
    let tested = npm(&package, &["test"], &[("VIEWTAPE_BIN", &viewtape)]).await?;
    ensure!(
        tested.contains("# pass 3") && tested.contains("# fail 0"),
        "{tested}"
    );

    // The bundle is a module the server runs: the package's own input, in `viewtape run`.
    let input = std::fs::File::open(package.join("input.ndjson"))?;
    let out = tokio::process::Command::new(&viewtape)
        .arg("run")
        .arg(package.join("dist/guest.js"))
        .stdin(Stdio::from(input))
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last_alice = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .rfind(|l| l["update"]["key"] == "alice")
        .context("no update for alice")?;
    ensure!(
        last_alice["update"]["view"] == "demo" && last_alice["update"]["value"]["total"] == 3,
        "{stdout}"
    );
    Ok(())
}

/// The type check is part of `npm test`: a guest that calls `ctx` wrongly does not pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ts_guest_that_misuses_ctx_fails_its_type_check() -> anyhow::Result<()> {
    let viewtape = binary().await?;
    let sdk = built_sdk().await?;
    let dir = tempfile::tempdir()?;
    let out = tokio::process::Command::new(&viewtape)
        .args(["new", "typo", "--lang", "typescript", "--dir"])
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
    let package = dir.path().join("typo");
    let guest = package.join("src/guest.ts");
    let source = std::fs::read_to_string(&guest)?;
    let broken = source.replace("ctx.log('debug', 'batch done');", "ctx.log('loud', 42);");
    ensure!(broken != source, "the template changed: fix this test");
    std::fs::write(&guest, broken)?;
    npm(&package, &["install", "--no-audit", "--no-fund"], &[]).await?;
    let refused = npm(&package, &["run", "typecheck"], &[]).await;
    let error = format!("{:#}", refused.err().context("the type check passed")?);
    ensure!(error.contains("src/guest.ts"), "{error}");
    Ok(())
}
