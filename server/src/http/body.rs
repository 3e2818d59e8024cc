//! A request body read whole, under its route's limit: the one way a route reads a body.
//!
//! ## `Expect: 100-continue`
//!
//! hyper answers `100 Continue` when the body is first polled, not before. So a declared length
//! (`Content-Length`) over the limit is refused here, before the body is polled: a client that
//! waits for an invitation to upload gets the `413` instead, and sends nothing. A body without
//! a declared length is counted as it arrives, and refused as soon as it passes the limit.

use axum::body::Body;
use bytes::Bytes;

use super::ApiError;

/// The whole of `body`, at most `limit` bytes.
///
/// # Errors
/// `413 body_too_large` when its declared length or its bytes pass `limit`; `400 bad_request`
/// when it cannot be read (bad chunked framing, cut short). Either closes the connection
/// ([`ApiError::closing`]): the rest of the body is not read.
pub(crate) async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    if http_body::Body::size_hint(&body).lower() > limit as u64 {
        return Err(ApiError::too_large(limit).closing());
    }
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|error| refusal(&error, limit).closing())
}

/// The answer to a body that could not be read: `413` past the limit, else `400`.
fn refusal(error: &axum::Error, limit: usize) -> ApiError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if error.is::<http_body_util::LengthLimitError>() {
            return ApiError::too_large(limit);
        }
        cause = error.source();
    }
    ApiError::bad_request("the request body is malformed (bad chunked framing, or cut short)")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that has not arrived yet, declaring `length` bytes; it fails the test if it is
    /// polled.
    struct Declared {
        length: u64,
    }

    impl http_body::Body for Declared {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            panic!("a body declared over the limit was polled (hyper would send 100 Continue)");
        }

        fn size_hint(&self) -> http_body::SizeHint {
            http_body::SizeHint::with_exact(self.length)
        }
    }

    fn status(result: Result<Bytes, ApiError>) -> u16 {
        result.map_or_else(|error| error.status().as_u16(), |_| 200)
    }

    #[tokio::test]
    async fn a_declared_length_over_the_limit_is_refused_unread() {
        let body = Body::new(Declared { length: 70 << 20 });
        assert_eq!(status(read_body(body, 64 << 20).await), 413);
    }

    #[tokio::test]
    async fn bodies_within_the_limit_are_read_and_longer_ones_refused() {
        assert_eq!(
            read_body(Body::from("abc"), 3).await.ok(),
            Some(Bytes::from("abc"))
        );
        assert_eq!(status(read_body(Body::from("abcd"), 3).await), 413);
        let chunks = futures_util::stream::iter(["ab", "cd"].map(Ok::<_, std::io::Error>));
        assert_eq!(status(read_body(Body::from_stream(chunks), 3).await), 413);
    }
}
