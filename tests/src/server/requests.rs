//! Requests to a running [`Server`]: plain HTTP on its address, `/metrics` and `/readyz`,
//! ingest, and SSE streams.

use std::time::Duration;

use anyhow::{bail, Context as _};

use super::Server;
use crate::http::{self, Response};
use crate::stream::EventStream;

impl Server {
    /// The value of one series of `/metrics`, named with its labels as the text shows it
    /// (`viewtape_http_connections_total{transport="lean"}`).
    ///
    /// # Errors
    /// On connection errors, or when the series is missing or not a number.
    pub async fn metric(&self, series: &str) -> anyhow::Result<f64> {
        let text = self.get("/metrics").await?.text();
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .with_context(|| format!("no {series} in /metrics:\n{text}"))?
            .trim()
            .parse()
            .context("metric value")
    }

    /// Waits, at most `within`, until `GET /readyz` answers `200` (a node of a cluster that has
    /// caught up); returns its body.
    ///
    /// # Errors
    /// On connection errors, or when it is not ready in time (with its last answer and logs).
    pub async fn ready(&self, within: Duration) -> anyhow::Result<serde_json::Value> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let resp = self.get("/readyz").await?;
            if resp.status() == 200 {
                return resp.json();
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "not ready within {within:?}: {}\n{}",
                    resp.text(),
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `method path` with the admin token `token` (`Authorization: Bearer …`) and `headers`.
    ///
    /// # Errors
    /// When the request cannot be sent or its answer read.
    pub async fn admin(
        &self,
        token: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<Response> {
        let auth = format!("Bearer {token}");
        let mut all = vec![("Authorization", auth.as_str())];
        all.extend_from_slice(headers);
        http::request(self.addr(), method, path, &all, body).await
    }

    /// `GET path`.
    ///
    /// # Errors
    /// On connection or framing errors.
    pub async fn get(&self, path: &str) -> anyhow::Result<Response> {
        http::request(self.addr, "GET", path, &[], b"").await
    }

    /// `POST path` with `body`.
    ///
    /// # Errors
    /// On connection or framing errors.
    pub async fn post(&self, path: &str, body: &[u8]) -> anyhow::Result<Response> {
        http::request(self.addr, "POST", path, &[], body).await
    }

    /// `POST /runtimes/{runtime}/ingest` with an NDJSON body.
    ///
    /// # Errors
    /// On connection or framing errors (not on HTTP error statuses).
    pub async fn ingest(&self, runtime: &str, ndjson: &str) -> anyhow::Result<Response> {
        self.post(&format!("/runtimes/{runtime}/ingest"), ndjson.as_bytes())
            .await
    }

    /// Ingests into `demo` and requires a 200.
    ///
    /// # Errors
    /// On any other status.
    pub async fn ingest_ok(&self, ndjson: &str) -> anyhow::Result<serde_json::Value> {
        let resp = self.ingest("demo", ndjson).await?;
        if resp.status() != 200 {
            bail!("ingest: status {}: {}", resp.status(), resp.text());
        }
        resp.json()
    }

    /// Opens an SSE stream at `path` with extra headers.
    ///
    /// # Errors
    /// See [`EventStream::connect`].
    pub async fn sse(&self, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<EventStream> {
        EventStream::connect(self.addr, path, headers).await
    }
}
