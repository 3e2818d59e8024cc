//! `POST /runtimes/{runtime}/ingest`: all-or-nothing batches, 400, 404, 413, 422.

use std::time::Duration;

use anyhow::{ensure, Context as _};
use viewtape_tests::{expect, feed::tick, Feed, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_batch_reports_events_per_view() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    let reply = server.ingest_ok(&feed.batch(3)).await?;
    ensure!(reply["events"]["prices"] == 3, "{reply}");
    // Blank lines and CRLF are fine.
    let body = format!("\r\n{}\r\n\n", feed.line().trim_end());
    let reply = server.ingest_ok(&body).await?;
    ensure!(reply["events"]["prices"] == 1, "{reply}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_line_publishes_nothing_from_its_batch() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME"]);
    server.ingest_ok(&feed.batch(1)).await?;
    let mut live = server.sse("/views/prices/events?from=tape", &[]).await?;
    expect::update(&live.next_event().await?, 1, "ACME", 1)?;

    // Lines 1 and 2 are valid (seq 2, 3), line 3 is not.
    let mut attempt = feed.clone();
    let body = format!(
        "{}{}{{\"symbol\":\"ACME\",\"price\":\n",
        attempt.line(),
        attempt.line()
    );
    let resp = server.ingest("demo", &body).await?;
    let error = expect::json_error(&resp, 422)?;
    ensure!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("line 3"),
        "the message names the line: {error}"
    );
    live.expect_silence(Duration::from_millis(300)).await?;

    // The guest rolled back too: seq 2 and 3 are new to it, not redeliveries.
    let reply = server.ingest_ok(&feed.batch(2)).await?;
    ensure!(reply["events"]["prices"] == 2, "{reply}");
    expect::update(&live.next_event().await?, 2, "ACME", 2)?;
    expect::update(&live.next_event().await?, 3, "ACME", 3)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_invalid_ticks_are_422() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    for body in [
        "not json\n".to_owned(),
        "{\"symbol\":\"\",\"price\":1,\"seq\":1}\n".to_owned(),
        "{\"symbol\":\"A\",\"price\":1}\n".to_owned(),
        tick("A", 1.0, 1).replace("1,", "\"x\","),
    ] {
        let resp = server.ingest("demo", &body).await?;
        expect::json_error(&resp, 422).with_context(|| format!("{body:?}"))?;
    }
    let view = server.get("/views/prices").await?.json()?;
    ensure!(
        view["entries"].as_object().is_none_or(|e| e.is_empty()),
        "nothing published: {view}"
    );
    Ok(())
}

/// An empty body took a log position of its own (a record of nothing, and a `200` receipt
/// for it): it is a `400` now, and the next batch takes the very next position. A query
/// parameter, which ingest does not take, was ignored: it is a `400` naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_batch_or_a_query_is_400_and_takes_no_log_position() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME"]);
    let first = server.ingest_ok(&feed.batch(1)).await?;
    let position = first["position"].as_u64().context("a position")?;
    for (producer, headers) in [
        (false, Vec::new()),
        (true, vec![("Producer-Id", "p"), ("Producer-Seq", "0")]),
    ] {
        let resp = viewtape_tests::http::request(
            server.addr(),
            "POST",
            "/runtimes/demo/ingest",
            &headers,
            b"",
        )
        .await?;
        let error = expect::json_error(&resp, 400).with_context(|| format!("{producer}"))?;
        ensure!(
            error["message"]
                .as_str()
                .is_some_and(|m| m.contains("the body is empty")),
            "{error}"
        );
    }
    let query = server
        .post("/runtimes/demo/ingest?verbose=1", feed.batch(1).as_bytes())
        .await?;
    let error = expect::json_error(&query, 400)?;
    ensure!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("\"verbose\"")),
        "{error}"
    );
    let next = server.ingest_ok(&feed.batch(1)).await?;
    ensure!(
        next["position"].as_u64() == Some(position + 1),
        "nothing took a position in between: {first} then {next}"
    );
    // The producer's seq 0 is still to come: the empty batch did not take it.
    let resp = viewtape_tests::http::request(
        server.addr(),
        "POST",
        "/runtimes/demo/ingest",
        &[("Producer-Id", "p"), ("Producer-Seq", "0")],
        feed.batch(1).as_bytes(),
    )
    .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    ensure!(
        resp.json()?["position"].as_u64() == Some(position + 2),
        "{}",
        resp.text()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_runtime_is_404() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let resp = server
        .ingest("nosuch", &Feed::new(&["ACME"]).batch(1))
        .await?;
    ensure!(resp.status() == 404, "{} {}", resp.status(), resp.text());
    resp.json()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_over_one_mebibyte_is_413() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME"]);
    let mut body = String::new();
    while body.len() <= 1024 * 1024 {
        body.push_str(&feed.line());
    }
    let resp = server.ingest("demo", &body).await?;
    ensure!(
        resp.status() == 413,
        "{} {:.200}",
        resp.status(),
        resp.text()
    );

    // Just under the limit is accepted.
    let mut feed = Feed::new(&["ACME"]);
    let mut body = String::new();
    loop {
        let line = feed.line();
        if body.len() + line.len() > 1024 * 1024 {
            break;
        }
        body.push_str(&line);
    }
    let resp = server.ingest("demo", &body).await?;
    ensure!(
        resp.status() == 200,
        "{} {:.200}",
        resp.status(),
        resp.text()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_over_the_limit_gets_413_before_any_upload() -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::start(&["--demo-rate", "0"]).await?;
    let mut stream = tokio::net::TcpStream::connect(server.addr()).await?;
    stream
        .write_all(
            b"POST /runtimes/demo/ingest HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n\
              Expect: 100-continue\r\n\r\n",
        )
        .await?;
    let mut seen = Vec::new();
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await??;
        ensure!(n > 0, "closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    let seen = String::from_utf8_lossy(&seen);
    ensure!(seen.starts_with("HTTP/1.1 413 "), "{seen}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_wild_seq_cannot_wedge_the_ticker() -> anyhow::Result<()> {
    let server = Server::start(&["--demo-rate", "0"]).await?;
    server
        .ingest_ok("{\"symbol\":\"ACME\",\"price\":1.5,\"seq\":1}\n")
        .await?;
    let wild = server
        .ingest(
            "demo",
            "{\"symbol\":\"ACME\",\"price\":1.5,\"seq\":18446744073709551615}\n",
        )
        .await?;
    ensure!(wild.status() == 422, "{} {}", wild.status(), wild.text());
    let reply = server
        .ingest_ok("{\"symbol\":\"ACME\",\"price\":1.6,\"seq\":2}\n")
        .await?;
    ensure!(reply["events"]["prices"] == 1, "the feed goes on: {reply}");
    Ok(())
}

/// `batch` into `demo` from producer `p` at `epoch` and `seq`.
async fn stamped(
    server: &Server,
    epoch: u64,
    seq: u64,
    batch: &str,
) -> anyhow::Result<viewtape_tests::Response> {
    let (epoch, seq) = (epoch.to_string(), seq.to_string());
    let headers = [
        ("Producer-Id", "p"),
        ("Producer-Epoch", epoch.as_str()),
        ("Producer-Seq", seq.as_str()),
    ];
    let path = "/runtimes/demo/ingest";
    viewtape_tests::http::request(server.addr(), "POST", path, &headers, batch.as_bytes()).await
}

/// A batch could bring `Producer-Epoch: 18446744073709551615` (`u64::MAX`), after which every
/// claim saturated at that epoch and fenced nobody: fencing was off for the producer id. The
/// last epoch is a claim's alone now, a claim past it is refused, and the claim route, like
/// ingest, refuses a query parameter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_producer_epoch_is_a_claims_alone() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let mut feed = Feed::new(&["ACME"]);
    let says = |error: &serde_json::Value, words: &str| {
        ensure!(
            error["message"].as_str().is_some_and(|m| m.contains(words)),
            "{error}"
        );
        Ok(())
    };

    let unclaimed = stamped(&server, u64::MAX, 0, &feed.batch(1)).await?;
    let error = expect::json_error(&unclaimed, 400)?;
    says(&error, "is the last epoch, which only a claim gives")?;

    let query = server
        .post("/runtimes/demo/producers/p?epoch=1", b"")
        .await?;
    let error = expect::json_error(&query, 400)?;
    says(&error, "unknown query parameter \"epoch\"")?;

    // The epoch before the last may be sent; a claim fences it with the last.
    let resp = stamped(&server, u64::MAX - 1, 0, &feed.batch(1)).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let claim = server.post("/runtimes/demo/producers/p", b"").await?;
    ensure!(claim.status() == 200, "{} {}", claim.status(), claim.text());
    ensure!(
        claim.json()?["epoch"].as_u64() == Some(u64::MAX),
        "{}",
        claim.text()
    );
    let fenced = stamped(&server, u64::MAX - 1, 1, &feed.batch(1)).await?;
    ensure!(expect::json_error(&fenced, 403)?["error"] == "producer_fenced");
    let resp = stamped(&server, u64::MAX, 0, &feed.batch(1)).await?;
    ensure!(
        resp.status() == 200,
        "claimed, it runs: {} {}",
        resp.status(),
        resp.text()
    );

    // No epoch is left to fence it with: the claim is refused, and the holder goes on.
    let used_up = server.post("/runtimes/demo/producers/p", b"").await?;
    let error = expect::json_error(&used_up, 409)?;
    ensure!(error["error"] == "producer_epochs_used_up", "{error}");
    says(&error, "no claim can fence it")?;
    let resp = stamped(&server, u64::MAX, 1, &feed.batch(1)).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    Ok(())
}

/// An ingest refused before its body is read (an unknown runtime, past `max_body`) says that the
/// connection closes, and closes it: the unread body cannot be taken for the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_before_the_body_is_read_says_connection_close() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    let body = vec![b'a'; 200_000];
    for path in ["/runtimes/nope/ingest", "/runtimes/demo/ingest?x=1"] {
        let mut conn = viewtape_tests::http::HttpConn::connect(server.addr()).await?;
        let resp = conn.send("POST", path, &[], &body).await?;
        ensure!(
            resp.status() == 404 || resp.status() == 400,
            "{path}: {} {}",
            resp.status(),
            resp.text()
        );
        ensure!(
            resp.header("connection") == Some("close"),
            "{path}: {:?}",
            resp.header("connection")
        );
        ensure!(
            conn.send("GET", "/healthz", &[], b"").await.is_err(),
            "{path}: the connection is closed"
        );
    }
    Ok(())
}
