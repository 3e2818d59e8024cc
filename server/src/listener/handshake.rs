//! A connection's start: the TLS handshake when configured, then HTTP/2 or HTTP/1.1 as the
//! client chose; a client speaking plain HTTP to the TLS port is told to use HTTPS.

use std::sync::Arc;

use tokio::net::TcpStream;

use super::write::answer_and_close;
use super::{Connection, Limits};
use crate::listener::tls::Tls;
use crate::sse::socket::SharedTcp;

/// Answers a plain HTTP request on the TLS port: `400` with a JSON error saying to use HTTPS,
/// in plain text since the client speaks no TLS, then closes.
async fn plain_http_to_tls(stream: TcpStream, limits: Limits) {
    let body = "{\"error\":\"bad_request\",\"message\":\"this port speaks HTTPS only: use https:// in the URL\"}";
    tracing::debug!("plain HTTP on the TLS port; told to use HTTPS");
    answer_and_close(stream, "400 Bad Request", "", body, limits).await;
}

impl Connection {
    /// Serves a fresh connection: over TLS when configured (HTTP/2 when the client chose it by
    /// ALPN), else plain HTTP/1.1.
    pub(super) async fn start(self, stream: TcpStream) {
        match self.shared.tls.clone() {
            None => self.run(SharedTcp::new(stream)).await,
            // Boxed: the TLS path's futures are large, and a task is as large as its future,
            // so a plain connection's task would carry their size with it.
            Some(tls) => Box::pin(self.start_tls(tls, stream)).await,
        }
    }

    /// The TLS handshake, then HTTP/2 or HTTP/1.1 as the client chose. A client that speaks
    /// plain HTTP to the port instead gets a plain `400` saying to use HTTPS.
    async fn start_tls(self, tls: Arc<Tls>, stream: TcpStream) {
        let mut first = [0u8; 1];
        let peeked =
            tokio::time::timeout(self.shared.limits.header_timeout, stream.peek(&mut first)).await;
        if matches!(peeked, Ok(Ok(1))) && first[0].is_ascii_uppercase() {
            self.shared.metrics.tls_failures.inc();
            return plain_http_to_tls(stream, self.shared.limits).await;
        }
        let handshake = tokio::time::timeout(
            self.shared.limits.header_timeout,
            tls.acceptor().accept(stream),
        );
        let stream = match handshake.await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                self.shared.metrics.tls_failures.inc();
                return tracing::debug!(%error, "TLS handshake failed");
            }
            Err(_) => {
                self.shared.metrics.tls_failures.inc();
                return tracing::debug!("TLS handshake timed out");
            }
        };
        if stream.get_ref().1.alpn_protocol() == Some(crate::listener::tls::H2) {
            return self.serve_h2(stream).await;
        }
        self.run(stream).await;
    }
}
