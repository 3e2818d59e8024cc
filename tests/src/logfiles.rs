//! The files of a server's log on disk, for tests that damage them, and the checks a start
//! that fails closed (or keeps its epoch) must pass.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context as _};
use viewtape_journal::Cursor;

use crate::server::{cli, config_file};
use crate::{expect, EventStream, Server};

/// The size of a segment header (format version 2: magic, version, first position, history id,
/// epoch, checksum); records follow it.
pub const SEGMENT_HEADER: usize = 48;
/// The size of a record header (length, CRC, position); the payload follows it.
pub const RECORD_HEADER: usize = 16;

/// Starts with a config file (and `--demo-rate 0`, the harness default).
pub async fn start_with(config: &str) -> anyhow::Result<(Server, tempfile::NamedTempFile)> {
    let file = config_file(config)?;
    let path = file.path().display().to_string();
    let server = Server::start(&["--config", &path]).await?;
    Ok((server, file))
}

/// The runtime `demo` running `wasm` into `prices`, with no periodic snapshot (so a restart
/// after `kill -9` rebuilds everything from the log) and optional extra `[log]` lines.
pub fn demo_config(wasm: &str, log: &str) -> String {
    format!(
        "[server]\nsnapshot_interval = \"0s\"\n\n[log]\n{log}\n\n\
         [[runtime]]\nname = \"demo\"\nwasm = \"{wasm}\"\nviews = [\"prices\"]\n"
    )
}

/// The log directory of a server.
pub fn log_dir(server: &Server) -> PathBuf {
    server.data_dir().join("log")
}

/// The segment files (`log-<20 digits>.vtlog`) of a log directory, oldest first.
pub fn segments(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("read {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.strip_prefix("log-")
                    .and_then(|rest| rest.strip_suffix(".vtlog"))
                    .is_some_and(|digits| {
                        digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit())
                    })
            })
        })
        .collect();
    files.sort();
    Ok(files)
}

/// The newest segment and its bytes.
pub fn newest_segment(server: &Server) -> anyhow::Result<(PathBuf, Vec<u8>)> {
    let dir = log_dir(server);
    let newest = segments(&dir)?
        .pop()
        .with_context(|| format!("no segment in {}", dir.display()))?;
    let bytes = std::fs::read(&newest)?;
    Ok((newest, bytes))
}

/// The record frames of a whole segment, as `(start, length)` (header included), walking the
/// length fields only. Fails unless the records end exactly at the end of the file.
pub fn record_frames(bytes: &[u8]) -> anyhow::Result<Vec<(usize, usize)>> {
    ensure!(
        bytes.len() >= SEGMENT_HEADER,
        "segment of {} bytes has no header",
        bytes.len()
    );
    let mut frames = Vec::new();
    let mut at = SEGMENT_HEADER;
    while at < bytes.len() {
        let head = bytes
            .get(at..at + RECORD_HEADER)
            .with_context(|| format!("partial record header at byte {at}"))?;
        let payload = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let len = RECORD_HEADER + payload;
        ensure!(
            at + len <= bytes.len(),
            "record at byte {at} of {len} bytes runs past the end ({})",
            bytes.len()
        );
        frames.push((at, len));
        at += len;
    }
    Ok(frames)
}

/// Rewrites, in the segment at `path`, the one record whose payload holds `from` into one that
/// holds `to` (of the same length) there, and gives it the checksum of its new bytes: a record
/// intact on disk that says something else than what was logged, as a bug could write it.
pub fn rewrite_record(path: &Path, from: &[u8], to: &[u8]) -> anyhow::Result<()> {
    ensure!(from.len() == to.len(), "the same length");
    let mut bytes = std::fs::read(path)?;
    let holding: Vec<(usize, usize)> = record_frames(&bytes)?
        .into_iter()
        .filter(|&(start, len)| {
            bytes[start + RECORD_HEADER..start + len]
                .windows(from.len())
                .any(|w| w == from)
        })
        .collect();
    let [(start, len)] = holding[..] else {
        anyhow::bail!("{} records hold the bytes, not one", holding.len());
    };
    let payload = start + RECORD_HEADER..start + len;
    let at = bytes[payload.clone()]
        .windows(from.len())
        .position(|w| w == from)
        .context("held")?;
    let at = payload.start + at;
    bytes[at..at + to.len()].copy_from_slice(to);
    let crc = crc32c::crc32c_append(
        crc32c::crc32c(&bytes[start + 8..start + RECORD_HEADER]),
        &bytes[payload],
    );
    bytes[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(path, bytes)?;
    Ok(())
}

/// The name of a file, for matching output.
pub fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A damaged (or fail-closed) file is kept for inspection: either set aside as
/// `<name>.damaged` with exactly the bytes it had, or still in place, starting with them.
pub fn kept(original: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut damaged = original.as_os_str().to_owned();
    damaged.push(".damaged");
    let damaged = PathBuf::from(damaged);
    if let Ok(now) = std::fs::read(&damaged) {
        ensure!(
            now == bytes,
            "{} is not the file as it was ({} bytes, was {})",
            damaged.display(),
            now.len(),
            bytes.len()
        );
        return Ok(());
    }
    let now = std::fs::read(original).with_context(|| {
        format!(
            "neither {} nor {} is kept",
            original.display(),
            damaged.display()
        )
    })?;
    ensure!(
        now.starts_with(bytes),
        "{} was kept in place but changed ({} bytes, was {})",
        original.display(),
        now.len(),
        bytes.len()
    );
    Ok(())
}

/// `viewtape log inspect DIR`.
pub async fn inspect(dir: &Path) -> anyhow::Result<(i32, String)> {
    cli(&["log", "inspect", &dir.to_string_lossy()], &[]).await
}

/// Checks a `200` ingest receipt: `events.prices`, no gap, fsync durability; returns the
/// batch's log position.
pub fn receipt(reply: &serde_json::Value, events: u64) -> anyhow::Result<u64> {
    ensure!(
        reply["events"]["prices"].as_u64().unwrap_or(0) == events,
        "expected {events} events: {reply}"
    );
    ensure!(
        reply["gaps"] == serde_json::json!([]),
        "no gap expected: {reply}"
    );
    ensure!(
        reply["durability"] == "fsync",
        "the receipt names fsync durability: {reply}"
    );
    reply["position"]
        .as_u64()
        .with_context(|| format!("the receipt has no numeric position: {reply}"))
}

/// The view's cursor from `GET /views/{view}`: epoch text and offset (`<epoch>-0` when empty).
pub async fn head(server: &Server, view: &str) -> anyhow::Result<(String, u64)> {
    let state = server.get(&format!("/views/{view}")).await?.json()?;
    let cursor = state["cursor"]
        .as_str()
        .with_context(|| format!("no cursor in {state}"))?;
    let (epoch, offset) = cursor
        .split_once('-')
        .with_context(|| format!("bad cursor {cursor:?}"))?;
    Ok((epoch.to_owned(), offset.parse().context("cursor offset")?))
}

/// Whether the server's log output says it took a fresh epoch.
pub fn says_fresh_epoch(server: &Server) -> bool {
    server.logs().to_lowercase().contains("fresh epoch")
}

/// `viewtape_log_fail_closed_total{cause="…"}`; a series that is not there yet counts 0.
pub async fn fail_closed(server: &Server, cause: &str) -> f64 {
    server
        .metric(&format!(
            "viewtape_log_fail_closed_total{{cause=\"{cause}\"}}"
        ))
        .await
        .unwrap_or(0.0)
}

/// The checks every fail-closed start shares: a clear log line, the metric, and a cursor of
/// the old epoch refused with a reset, then a fresh epoch. Returns the stream after `synced`
/// and its cursor.
pub async fn failed_closed(
    server: &Server,
    cause: &str,
    old: &Cursor,
) -> anyhow::Result<(EventStream, Cursor)> {
    ensure!(
        says_fresh_epoch(server),
        "the log output names the fresh epoch:\n{}",
        server.logs()
    );
    let count = fail_closed(server, cause).await;
    ensure!(
        count >= 1.0,
        "viewtape_log_fail_closed_total{{cause=\"{cause}\"}} is {count}"
    );
    let mut stream = expect::refused(server, "prices", old).await?;
    let (_, synced) = stream.until_synced(10_000).await?;
    let synced = expect::cursor_of(&synced)?;
    ensure!(
        synced.epoch() != old.epoch(),
        "a fresh epoch after failing closed: {synced} vs {old}"
    );
    Ok((stream, synced))
}

/// Sets the server's file size limit (RLIMIT_FSIZE); `None` lifts it.
pub fn limit_file_size(server: &Server, bytes: Option<u64>) -> anyhow::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: bytes.unwrap_or(libc::RLIM_INFINITY),
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: prlimit(2) on a process this test spawned, with a valid resource and a pointer to
    // a live rlimit; the old limit is not asked for.
    let set = unsafe {
        libc::prlimit(
            server.pid() as libc::pid_t,
            libc::RLIMIT_FSIZE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    ensure!(set == 0, "prlimit failed");
    Ok(())
}
