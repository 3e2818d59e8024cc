//! A TypeScript guest from nothing, through the real binary and npm:
//! `viewtape new demo --lang ts --sdk clients/guest` → `npm install` → `npm run build` (one
//! `dist/guest.js`, no imports left) → `npm test` (node:test on `@viewtape/guest`'s harness, which
//! runs the bundle with this build's binary) → `viewtape run dist/guest.js` over the package's
//! own input. Needs Node and npm, and the npm registry for esbuild and TypeScript.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{ensure, Context as _};
use viewtape_tests::server::{binary, run_guest};

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

/// `viewtape new NAME --lang LANG` in `dir`, on this checkout's built `@viewtape/guest`; the
/// package's directory.
async fn scaffold(viewtape: &Path, name: &str, lang: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    let sdk = built_sdk().await?;
    let out = tokio::process::Command::new(viewtape)
        .args(["new", name, "--lang", lang, "--dir"])
        .arg(dir)
        .arg("--sdk")
        .arg(&sdk)
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(dir.join(name))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_ts_guest_installs_builds_and_passes_its_tests() -> anyhow::Result<()> {
    let viewtape = binary().await?;
    let dir = tempfile::tempdir()?;
    let package = scaffold(&viewtape, "demo", "ts", dir.path()).await?;
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
    let guest = package.join("dist/guest.js").display().to_string();
    let (ok, lines) = run_guest(&[&guest], std::fs::read(package.join("input.ndjson"))?).await?;
    ensure!(ok, "{lines:?}");
    let last_alice = lines
        .iter()
        .rfind(|l| l["update"]["key"] == "alice")
        .context("no update for alice")?;
    ensure!(
        last_alice["update"]["view"] == "demo" && last_alice["update"]["value"]["total"] == 3,
        "{lines:?}"
    );
    Ok(())
}

/// The type check is part of `npm test`: a guest that calls `ctx` wrongly does not pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ts_guest_that_misuses_ctx_fails_its_type_check() -> anyhow::Result<()> {
    let viewtape = binary().await?;
    let dir = tempfile::tempdir()?;
    let package = scaffold(&viewtape, "typo", "typescript", dir.path()).await?;
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
