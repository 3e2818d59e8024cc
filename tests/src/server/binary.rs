//! The binary and what it runs on: finding `viewtape` (building it once per process), running
//! it as a command line, the checked-in guest modules, and config files.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use tokio::process::Command;

/// A JavaScript guest, build `build` of a counter: once per batch it publishes `{count, build}`
/// to view `count`, key `c`. Another build is another module with the same state.
pub fn js_counter(build: u32) -> String {
    format!(
        r#"
export function init() {{ return {{ count: 0 }}; }}
export function onBatch(state, input, ctx) {{
  state.count += 1;
  ctx.publish('count', 'c', {{ count: state.count, build: {build} }});
  return state;
}}
"#
    )
}

/// A guest module as checked in with the server's embedded guests: `ticker`, `logstats`, or
/// `misbehave` (the test fixture that publishes, fails, traps or loops on command).
pub fn guest_wasm(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../server/guests")
        .join(format!("{name}.wasm"))
}

/// `module` with a custom section (id 0) named `name` holding `data` appended: a valid module
/// that runs the same and has other bytes (another build, to the server).
pub fn with_custom_section(module: &[u8], name: &str, data: &[u8]) -> Vec<u8> {
    fn leb128(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut payload = Vec::new();
    leb128(name.len(), &mut payload);
    payload.extend_from_slice(name.as_bytes());
    payload.extend_from_slice(data);
    let mut out = module.to_vec();
    out.push(0);
    leb128(payload.len(), &mut out);
    out.extend_from_slice(&payload);
    out
}

/// Locates the binary, building it once per process.
///
/// # Errors
/// When the build fails or the binary cannot be found.
pub async fn binary() -> anyhow::Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    if let Some(found) = BUILT.get() {
        return found.clone().map_err(|e| anyhow!(e));
    }
    let found = tokio::task::spawn_blocking(|| {
        BUILT
            .get_or_init(|| locate_or_build().map_err(|e| format!("{e:#}")))
            .clone()
    })
    .await
    .context("build task")?;
    found.map_err(|e| anyhow!(e))
}

fn locate_or_build() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("VIEWTAPE_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().context("current_exe")?;
    let mut dir = exe
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent", exe.display()))?
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("viewtape");
    if std::env::var_os("VIEWTAPE_NO_BUILD").is_none() {
        let release = dir.file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = std::process::Command::new(cargo);
        cmd.args([
            "build",
            "--quiet",
            "-p",
            "viewtape-server",
            "--bin",
            "viewtape",
        ]);
        if release {
            cmd.arg("--release");
        }
        // Build into the same target directory the running executable came from.
        if let Some(target) = dir.parent() {
            cmd.env("CARGO_TARGET_DIR", target);
        }
        let status = cmd
            .stdin(Stdio::null())
            .status()
            .context("run cargo build")?;
        if !status.success() && !bin.exists() {
            bail!("cargo build -p viewtape-server --bin viewtape failed: {status}");
        }
    }
    if !bin.exists() {
        bail!("no viewtape binary at {}", bin.display());
    }
    Ok(bin)
}

/// The environment variable that names the server's code cache directory.
pub const CACHE_DIR_VAR: &str = "VIEWTAPE_CACHE_DIR";

/// The code cache the servers of the tests share: `$VIEWTAPE_CACHE_DIR` if set, else
/// `code-cache` beside the binary (`target/debug/code-cache`).
pub fn code_cache_dir(bin: &Path) -> PathBuf {
    match std::env::var_os(CACHE_DIR_VAR) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => bin.with_file_name("code-cache"),
    }
}

/// `viewtape run ARGS < input`: whether it exited 0, and its stdout as NDJSON lines (a failed
/// batch is an `error` line there).
///
/// # Errors
/// It cannot be built or started, or its stdout is not NDJSON (the error shows stdout and
/// stderr).
pub async fn run_guest(
    args: &[&str],
    input: impl AsRef<[u8]>,
) -> anyhow::Result<(bool, Vec<serde_json::Value>)> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("input");
    std::fs::write(&path, input)?;
    let out = Command::new(binary().await?)
        .arg("run")
        .args(args)
        .stdin(std::fs::File::open(&path)?)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .with_context(|| format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))?;
    Ok((out.status.success(), lines))
}

/// Runs the binary with `args` (and `env`) to completion, within 60 s; its exit code and its
/// stdout followed by its stderr.
///
/// # Errors
/// It cannot be built or started, or it runs too long.
pub async fn cli(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<(i32, String)> {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(binary().await?)
            .args(args)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .output(),
    )
    .await
    .with_context(|| format!("viewtape {args:?} timed out"))??;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.code().unwrap_or(-1), text))
}

/// A config file holding `text`, for `--config`; keep it alive as long as the server may
/// restart.
///
/// # Errors
/// The file cannot be written.
pub fn config_file(text: &str) -> anyhow::Result<tempfile::NamedTempFile> {
    let file = tempfile::Builder::new()
        .prefix("viewtape-config-")
        .suffix(".toml")
        .tempfile()?;
    std::fs::write(file.path(), text)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_custom_section_is_appended_whole() {
        let header = b"\0asm\x01\0\0\0";
        let out = with_custom_section(header, "build", &3u64.to_le_bytes());
        let mut want = header.to_vec();
        want.extend_from_slice(&[0, 14, 5]);
        want.extend_from_slice(b"build");
        want.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(out, want);
        let long = with_custom_section(header, "n", &[7; 200]);
        assert_eq!(
            &long[8..11],
            &[0, 0xca, 0x01],
            "LEB128 of 1 + 1 + 200 = 202"
        );
    }
}
