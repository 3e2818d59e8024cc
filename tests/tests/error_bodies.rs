//! Every error the server answers is the JSON error, and none carries internal detail (README,
//! "HTTP API"): no file path, no OS error, no error chain, no `Debug` text.
//!
//! The test library's HTTP helpers record the body of every `4xx`/`5xx` answer the end-to-end
//! tests get, a file per test process ([`http::error_bodies_dir`]). The test here provokes an
//! answer of each kind itself — a failed log write's `503` under RLIMIT_FSIZE among them — and
//! then checks every body recorded so far, by this process and by the test processes that ran
//! before it, and clears what it checked. `scripts/test` runs it once more after the whole
//! suite, for the bodies of the test binaries that ran after it.

use std::time::Duration;

use anyhow::{ensure, Context as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use viewtape_tests::logfiles::{limit_file_size, newest_segment};
use viewtape_tests::{http, token, Feed, Server};

/// Sends raw request bytes on a fresh connection and reads the answer until the server closes.
async fn raw(server: &Server, request: &[u8]) -> anyhow::Result<http::Response> {
    let mut stream = http::connect(server.addr()).await?;
    stream.write_all(request).await?;
    let mut bytes = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut bytes)).await;
    let (head, len) = http::parse_head(&bytes)?.context("no response head")?;
    let body = bytes[len..].to_vec();
    http::record_error_body(head.status, &body);
    Ok(http::Response { head, body })
}

/// `status`, and the JSON error with `code`.
fn refused(response: &http::Response, status: u16, code: &str) -> anyhow::Result<()> {
    let json = response.json()?;
    ensure!(
        response.status() == status && json["error"] == code && json["message"].is_string(),
        "expected {status} {code}: {} {json}",
        response.status()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_error_answer_carries_internal_detail() -> anyhow::Result<()> {
    let secret = "error-bodies-secret";
    let server = Server::start_with_env(&[], &[("VIEWTAPE_JWT_SECRET", secret)]).await?;
    let admin = token::hs256(secret, 600, "viewtape", &["*"], &["*"]);
    let bearer = format!("Bearer {admin}");
    let auth = [("Authorization", bearer.as_str())];
    let get = |path: &'static str| {
        let server = &server;
        async move { http::request(server.addr(), "GET", path, &auth, b"").await }
    };

    refused(&get("/no/such/route").await?, 404, "not_found")?;
    refused(&get("/views/nope").await?, 404, "not_found")?;
    refused(
        &get("/views/prices/events?from=bogus").await?,
        400,
        "bad_request",
    )?;
    refused(
        &get("/views/prices/events?form=tape").await?,
        400,
        "bad_request",
    )?;
    // The refusals of a path or a query are ours, not axum's or serde's: neither names the
    // parameters a route takes when they are off (`access_token` here) nor the library's parts.
    for path in [
        "/views?verbose=1",
        "/views/%FF",
        "/views/%FF/schema",
        "/views/prices/events?cursor=%FF",
        "/views/prices?keys=a&keys=b",
    ] {
        let answer = get(path).await?;
        refused(&answer, 400, "bad_request")?;
        ensure!(
            http::error_body_problem(&answer.text()).is_none()
                && !answer.text().contains("access_token"),
            "{path}: {}",
            answer.text()
        );
    }
    let wrong_method = http::request(server.addr(), "DELETE", "/views/prices", &auth, b"").await?;
    refused(&wrong_method, 405, "method_not_allowed")?;
    for bad in [
        "Bearer not.a.jwt",
        "Bearer eyJhbGciOiJub25lIn0.e30.",
        "Basic Zm9v",
    ] {
        let answer = http::request(
            server.addr(),
            "GET",
            "/views",
            &[("Authorization", bad)],
            b"",
        )
        .await?;
        refused(&answer, 401, "unauthorized")?;
    }
    let tick = Feed::new(&["ACME"]).batch(1);
    let plus = http::request(
        server.addr(),
        "POST",
        "/runtimes/demo/ingest",
        &[auth[0], ("Producer-Id", "p"), ("Producer-Seq", "+2")],
        tick.as_bytes(),
    )
    .await?;
    refused(&plus, 400, "bad_request")?;
    let chunked = format!(
        "POST /runtimes/demo/ingest HTTP/1.1\r\nHost: x\r\n{}: {bearer}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{tick}\r\n0\r\n\r\n",
        "Authorization"
    );
    refused(&raw(&server, chunked.as_bytes()).await?, 400, "bad_request")?;
    // Heads refused before any router sees them: malformed, too large, too many fields.
    let malformed = "POST /runtimes/demo/ingest HTTP/1.1\r\nNo colon here\r\n\r\n";
    refused(
        &raw(&server, malformed.as_bytes()).await?,
        400,
        "bad_request",
    )?;
    let long = format!(
        "GET /views HTTP/1.1\r\nX-Long: {}\r\n\r\n",
        "a".repeat(64 << 10)
    );
    refused(
        &raw(&server, long.as_bytes()).await?,
        431,
        "headers_too_large",
    )?;
    let many = format!("POST /views HTTP/1.1\r\n{}\r\n", "X-A: b\r\n".repeat(200));
    refused(
        &raw(&server, many.as_bytes()).await?,
        431,
        "headers_too_large",
    )?;

    // A log write that fails: 503, in our words, with nothing of the file or the OS error.
    let (_, segment) = newest_segment(&server)?;
    limit_file_size(&server, Some(segment.len() as u64 + 10))?;
    let failed = http::request(
        server.addr(),
        "POST",
        "/runtimes/demo/ingest",
        &auth,
        Feed::new(&["ACME"]).batch(50).as_bytes(),
    )
    .await?;
    limit_file_size(&server, None)?;
    refused(&failed, 503, "unavailable")?;
    ensure!(
        http::error_body_problem(&failed.text()).is_none(),
        "{}",
        failed.text()
    );
    // The log line is written by the server as it handles the failure, which may be just
    // after the answer is read here: look for a while.
    let logged = |logs: String| logs.contains("File too large") || logs.contains("os error");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !logged(server.logs()) {
        ensure!(
            std::time::Instant::now() < deadline,
            "the detail is in the server's log:\n{}",
            server.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Every body recorded by every test process so far.
    let mut problems = Vec::new();
    let mut checked = 0;
    let dir = http::error_bodies_dir();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)?;
        for line in text.lines() {
            let record: serde_json::Value = serde_json::from_str(line)?;
            let body = record["body"].as_str().unwrap_or_default();
            checked += 1;
            if let Some(problem) = http::error_body_problem(body) {
                problems.push(format!("{} {problem}: {body:.300}", record["status"]));
            }
        }
        std::fs::remove_file(&path)?;
    }
    ensure!(checked >= 12, "only {checked} error bodies were recorded");
    ensure!(
        problems.is_empty(),
        "error answers with internal detail:\n{}",
        problems.join("\n")
    );
    Ok(())
}
