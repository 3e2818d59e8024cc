//! The guests the server embeds are checked in (`server/guests/*.wasm`) so that building the
//! server needs no wasm target. This rebuilds them from `examples/guests` and `runtime-guest`
//! with `scripts/build-guests` into a temporary directory and compares the bytes.
//!
//! Only the rustc recorded in `server/guests/rustc-version` can reproduce them (another version
//! compiles the same sources differently), so the rebuild uses that one: the active toolchain
//! when it is that version, else rustup's toolchain of that release. When neither is there the
//! test fails, naming the install command: passing without comparing would let stale modules
//! through unnoticed on exactly the machines (CI among them) that run a newer stable.
//!
//! The same holds for the clang that compiles the JS engine guest's C (QuickJS), recorded in
//! `server/guests/clang-version`: without that clang here the test fails, naming the install
//! command, as it does without the recorded rustc.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context};

const TARGET: &str = "wasm32-unknown-unknown";

fn repo() -> anyhow::Result<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .context("tests/ has a parent")
}

/// `rustc --version` as `cmd` runs it, or `None` when it cannot run.
fn version_of(mut cmd: Command) -> Option<String> {
    let out = cmd.arg("--version").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `build-guests` as run by the recorded rustc, or why there is none here.
fn recorded_toolchain(repo: &Path, recorded: &str) -> anyhow::Result<Command> {
    // The directory the script builds in, so rustup resolves the toolchain as it will there.
    let dir = repo.join("examples/guests");
    let mut rustc = Command::new("rustc");
    rustc.current_dir(&dir);
    let active = version_of(rustc);
    if active.as_deref() == Some(recorded) {
        return Ok(Command::new("bash"));
    }
    let release = recorded.split_whitespace().nth(1).unwrap_or(recorded);
    let rustup = |program: &str| {
        let mut cmd = Command::new("rustup");
        // Use the release only if it is installed: a test must not download a toolchain.
        cmd.args(["run", release, program])
            .env("RUSTUP_AUTO_INSTALL", "0")
            .current_dir(&dir);
        cmd
    };
    if version_of(rustup("rustc")).as_deref() == Some(recorded) {
        return Ok(rustup("bash"));
    }
    bail!(
        "server/guests/ was built by `{recorded}`, and only that rustc reproduces it; here the \
         active one is {}. Install the recorded one (scripts/test does):\n\n    \
         rustup toolchain install {release} --profile minimal --target {TARGET}\n\n\
         or, to move the guests to your rustc, rebuild them and commit server/guests/:\n\n    \
         scripts/build-guests\n",
        active.map_or("missing".into(), |v| format!("`{v}`"))
    )
}

/// Fails, naming what to do, unless the clang here is the one recorded in `clang-version`.
fn recorded_clang(recorded: &str) -> anyhow::Result<()> {
    let here = Command::new("clang")
        .arg("--version")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .map(|line| line.trim().to_owned())
        });
    ensure!(
        here.as_deref() == Some(recorded),
        "server/guests/js.wasm was built with `{recorded}`, and only that clang reproduces it \
         (it compiles QuickJS's C); here clang is {}. Install it (scripts/test does):\n\n    \
         sudo apt-get install -y clang llvm\n\n\
         or, to move the guests to your clang, rebuild them and commit server/guests/:\n\n    \
         scripts/build-guests\n",
        here.map_or("missing".into(), |v| format!("`{v}`"))
    );
    Ok(())
}

fn wasm_files(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".wasm") {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

#[test]
fn checked_in_guests_are_what_the_sources_build() -> anyhow::Result<()> {
    let repo = repo()?;
    let checked_in = repo.join("server/guests");
    let recorded = fs::read_to_string(checked_in.join("rustc-version"))
        .context("reading server/guests/rustc-version")?
        .trim()
        .to_owned();
    let mut build = recorded_toolchain(&repo, &recorded)?;
    let clang = fs::read_to_string(checked_in.join("clang-version"))
        .context("reading server/guests/clang-version")?;
    recorded_clang(clang.trim())?;

    let tmp = tempfile::tempdir()?;
    let fresh = tmp.path().join("out");
    let output = build
        .arg(repo.join("scripts/build-guests"))
        .arg("--out")
        .arg(&fresh)
        .arg("--target-dir")
        .arg(tmp.path().join("target"))
        .current_dir(&repo)
        .output()
        .context("running scripts/build-guests")?;
    ensure!(
        output.status.success(),
        "scripts/build-guests failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let built_by = fs::read_to_string(fresh.join("rustc-version"))?;
    ensure!(
        built_by.trim() == recorded,
        "the rebuild used `{}`, not the recorded `{recorded}`",
        built_by.trim()
    );

    let names = wasm_files(&checked_in)?;
    ensure!(
        names == wasm_files(&fresh)?,
        "server/guests/ holds {names:?} but the sources build {:?}; rebuild with:\n\n    \
         scripts/build-guests\n",
        wasm_files(&fresh)?
    );
    let mut stale = Vec::new();
    for name in &names {
        if fs::read(checked_in.join(name))? != fs::read(fresh.join(name))? {
            stale.push(name.as_str());
        }
    }
    ensure!(
        stale.is_empty(),
        "server/guests/{{{}}} differ from what examples/guests and runtime-guest build with \
         `{recorded}`. Rebuild them and commit server/guests/:\n\n    scripts/build-guests\n",
        stale.join(",")
    );
    Ok(())
}
