//! SSE requests are served straight on the socket when their request line
//! arrives whole, and through the router otherwise; both paths speak the same
//! protocol. Oversized or broken request heads are refused.

use std::time::Duration;

use anyhow::ensure;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use viewtape_tests::Server;

/// Reads from `stream` until `needle` appears or 10 s pass.
async fn read_until(stream: &mut TcpStream, needle: &str) -> anyhow::Result<String> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&seen).contains(needle) {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buf)).await??;
        ensure!(
            n > 0,
            "closed before {needle:?}: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&seen).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_line_in_pieces_is_served_by_the_router() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    for (first, pause) in [("GET /views/prices/ev", 200), ("G", 200), ("", 0)] {
        let mut stream = TcpStream::connect(server.addr()).await?;
        let request = "GET /views/prices/events HTTP/1.1\r\nHost: x\r\n\r\n";
        stream.write_all(first.as_bytes()).await?;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        stream.write_all(&request.as_bytes()[first.len()..]).await?;
        let seen = read_until(&mut stream, "event: synced").await?;
        ensure!(seen.starts_with("HTTP/1.1 200 OK\r\n"), "{seen}");
        ensure!(
            seen.to_ascii_lowercase()
                .contains("content-type: text/event-stream"),
            "{seen}"
        );
        ensure!(seen.contains("retry: 2000"), "{seen}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_heads_are_refused_not_hung() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;

    let mut stream = TcpStream::connect(server.addr()).await?;
    let huge = format!(
        "GET /views/prices/events HTTP/1.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    stream.write_all(huge.as_bytes()).await?;
    let seen = read_until(&mut stream, "\r\n\r\n").await?;
    ensure!(seen.starts_with("HTTP/1.1 431 "), "{seen}");

    let mut stream = TcpStream::connect(server.addr()).await?;
    stream
        .write_all(b"GET /views/prices/events HTTP/1.1\r\nBad Header\r\n\r\n")
        .await?;
    let seen = read_until(&mut stream, "\r\n\r\n").await?;
    ensure!(seen.starts_with("HTTP/1.1 400 "), "{seen}");

    let mut stream = TcpStream::connect(server.addr()).await?;
    stream
        .write_all(b"GET /views/nope/events HTTP/1.1\r\nHost: x\r\n\r\n")
        .await?;
    let seen = read_until(&mut stream, "}").await?;
    ensure!(seen.starts_with("HTTP/1.1 404 Not Found\r\n"), "{seen}");
    ensure!(seen.contains("\"error\":\"not_found\""), "{seen}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_does_not_hold_up_others() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    // Like a browser's speculative preconnect: connected, nothing sent.
    let _silent: Vec<TcpStream> = silent_connections(&server, 3).await?;
    let started = std::time::Instant::now();
    let health = server.get("/healthz").await?;
    ensure!(health.status() == 200);
    let mut stream = server.sse("/views/prices/events", &[]).await?;
    stream.until_synced(10).await?;
    ensure!(
        started.elapsed() < Duration::from_millis(500),
        "served in {:?}",
        started.elapsed()
    );
    Ok(())
}

async fn silent_connections(server: &Server, n: usize) -> anyhow::Result<Vec<TcpStream>> {
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        streams.push(TcpStream::connect(server.addr()).await?);
    }
    Ok(streams)
}
