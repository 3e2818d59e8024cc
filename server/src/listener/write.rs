//! The one answer written on a connection whose request is not read.

use std::io::IoSlice;

use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::Limits;
use crate::sse::socket::write_all;

/// Writes one JSON answer with `status` (and the header lines `extra`, each ending in CRLF)
/// on a connection whose request is not read, then closes it.
pub(super) async fn answer_and_close<S: AsyncWrite + Unpin>(
    mut stream: S,
    status: &str,
    extra: &str,
    body: &str,
    limits: Limits,
) {
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         {extra}connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = write_all(
        &mut stream,
        &mut [IoSlice::new(response.as_bytes())],
        limits.write_timeout,
    )
    .await;
    let _ = stream.shutdown().await;
}
