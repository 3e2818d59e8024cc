//! The error bodies the server answers, collected from every test process and checked for
//! internal detail (`tests/error_bodies.rs`).

/// Where the error bodies the server answered are collected, a file per test process
/// ([`record_error_body`]); `tests/error_bodies.rs` checks them all. Under this build's target
/// directory (`target/tmp/`, beside `target/debug/deps/<test>`), so that the checkouts of one
/// machine do not mix.
pub fn error_bodies_dir() -> std::path::PathBuf {
    let target = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_owned()));
    target
        .map_or_else(std::env::temp_dir, |target| target.join("tmp"))
        .join("viewtape-error-bodies")
}

/// Appends a `4xx`/`5xx` answer's body to this process's file in [`error_bodies_dir`]
/// (best effort: collecting must never fail a test by itself).
pub fn record_error_body(status: u16, body: &[u8]) {
    use std::io::Write as _;
    if status < 400 {
        return;
    }
    let dir = error_bodies_dir();
    let line = serde_json::json!({ "status": status, "body": String::from_utf8_lossy(body) });
    let _ = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{}.ndjson", std::process::id())))
            // One write per record: with `append`, records of concurrent tests never interleave.
            .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()))
    });
}

/// What is wrong with an error body, if anything: it is not the JSON error, or its message
/// carries internal detail — a file path, an OS error, a nested error chain, `Debug` text — or
/// words that are not the server's own (a library's refusal, the engine's trap text, a panic's
/// source location).
pub fn error_body_problem(body: &str) -> Option<&'static str> {
    if body.is_empty() {
        return Some("an empty body");
    }
    let Ok(json) = serde_json::from_str::<serde_json::Value>(body) else {
        return Some("not JSON");
    };
    // `/readyz` answers `503` with its readiness document, by contract.
    if json["ready"].is_boolean() {
        return None;
    }
    let (Some(_), Some(message)) = (json["error"].as_str(), json["message"].as_str()) else {
        return Some("not {\"error\", \"message\"}");
    };
    // Directories, not file names: a snapshot's file name is what an operator asks for.
    const PATHS: [&str; 8] = [
        "/tmp/", "/var/", "/home/", "/root/", "/work/", "/proc/", "/usr/", "/etc/",
    ];
    const OS_ERRORS: [&str; 5] = [
        "os error",
        "No space left",
        "Permission denied",
        "No such file",
        "File too large",
    ];
    const DEBUG: [&str; 4] = ["Error {", "Some(", " kind: ", "Custom {"];
    if PATHS.iter().any(|p| message.contains(p)) {
        return Some("a file path");
    }
    if OS_ERRORS.iter().any(|e| message.contains(e)) {
        return Some("an OS error");
    }
    if DEBUG.iter().any(|d| message.contains(d)) {
        return Some("Debug text");
    }
    // axum's and serde's refusals, wasmtime's trap text, a Rust panic's location.
    const FOREIGN: [&str; 7] = [
        "Failed to deserialize",
        "Invalid URL",
        "wasm backtrace",
        "wasm trap",
        "error while executing",
        "panicked at",
        ".rs:",
    ];
    if FOREIGN.iter().any(|f| message.contains(f)) {
        return Some("words that are not ours");
    }
    let mut depth = 0i32;
    for c in message.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if depth >= 2 {
            return Some("a nested error chain");
        }
    }
    message.contains("caused by").then_some("an error chain")
}

#[cfg(test)]
mod tests {
    use super::error_body_problem;

    #[test]
    fn internal_detail_is_caught_and_our_words_pass() {
        let leaked = r#"{"error":"unavailable","message":"runtime `demo`: the log failed, nothing was committed: the log is poisoned (the log is poisoned (log I/O failed: write /tmp/x/log/log-1.vtlog: No space left on device (os error 28)))"}"#;
        assert_eq!(error_body_problem(leaked), Some("a file path"));
        let os = r#"{"error":"unavailable","message":"write failed: No space left on device"}"#;
        assert_eq!(error_body_problem(os), Some("an OS error"));
        let chain = r#"{"error":"x","message":"a (b (c))"}"#;
        assert_eq!(error_body_problem(chain), Some("a nested error chain"));
        assert_eq!(error_body_problem("oops"), Some("not JSON"));
        let ours = r#"{"error":"unauthorized","message":"invalid token: it has expired (`exp`): get a new one"}"#;
        assert_eq!(error_body_problem(ours), None);
        assert_eq!(error_body_problem(""), Some("an empty body"));
        let axum = r#"{"error":"bad_request","message":"bad query: Failed to deserialize query string: unknown field `x`, expected `access_token`"}"#;
        assert_eq!(error_body_problem(axum), Some("words that are not ours"));
        let trap = r#"{"error":"batch_rejected","message":"runtime `m`: guest panicked: boom (at src/lib.rs:77:28; wasm trap: wasm `unreachable` instruction executed)"}"#;
        assert_eq!(error_body_problem(trap), Some("words that are not ours"));
    }
}
