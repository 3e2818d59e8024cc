//! `POST /runtimes/{runtime}/ingest`: one all-or-nothing batch for a runtime's guest, answered
//! once it is durable.
//!
//! Optional idempotent-producer headers: `Producer-Id` (1–256 visible ASCII characters),
//! `Producer-Epoch` (an integer, default 0) and `Producer-Seq` (an integer, required with an id).
//!
//! `POST /runtimes/{runtime}/producers/{id}`: a producer that keeps no store claims a new epoch
//! for its id before its first batch, so that nothing it sends is taken for a previous run's.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};

use super::access::Caller;
use super::body::read_body;
use super::query::Params;
use super::{ApiError, AppState};
use crate::host::GuestError;
use crate::log::producer::{
    ClaimError, ProducerEpoch, ProducerSeq, ProducerStamp, MAX_PRODUCER_ID,
};
use crate::runtime::{IngestError, RuntimeHandle};

const PRODUCER_ID: &str = "producer-id";
const PRODUCER_EPOCH: &str = "producer-epoch";
const PRODUCER_SEQ: &str = "producer-seq";

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/runtimes/{runtime}/ingest", post(ingest))
        .route("/runtimes/{runtime}/producers/{id}", post(claim))
}

/// 200 with the receipt (events per view, gaps, log position, durability; `Producer-Duplicate:
/// true` for a batch committed before); 400 for bad producer headers, a query parameter (the
/// route takes none), an empty body or an unclaimed `Producer-Epoch` of `u64::MAX` (no claim
/// could fence it); 403 for a fenced producer epoch; 404 for an unknown runtime; 409 with
/// `Producer-Expected-Seq` for a producer's batch out of order; 413 past `max_body`; 422 when
/// the guest refused or failed on the batch (nothing was committed); 503 (with `Retry-After`)
/// when the runtime or the log cannot take it.
async fn ingest(
    State(state): State<AppState>,
    runtime: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Path(runtime) = runtime.map_err(|error| ApiError::from(error).closing())?;
    let producer =
        before_body(&state, &runtime, query.as_deref(), &headers).map_err(ApiError::closing)?;
    let limit = state.config.max_body;
    let input = read_body(body, limit).await.inspect_err(|_| {
        state.metrics.ingest_rejected.inc();
    })?;
    // An empty batch means nothing, and would take a log position (and a producer's seq) for
    // it: most likely a client's mistake, refused as one.
    if input.is_empty() {
        state.metrics.ingest_rejected.inc();
        return Err(ApiError::bad_request(
            "the body is empty: a batch is at least one byte of input; nothing was committed",
        ));
    }
    let accepted = on_runtime(&state, &runtime, |handle| {
        let (input, producer) = (input.clone(), producer.clone());
        async move { handle.ingest(input, producer).await }
    })
    .await
    .inspect_err(|_| {
        state.metrics.ingest_rejected.inc();
    })?;
    state.metrics.ingest_accepted.inc();
    let mut response = Json(accepted.receipt).into_response();
    if accepted.duplicate {
        response.headers_mut().insert(
            HeaderName::from_static("producer-duplicate"),
            HeaderValue::from_static("true"),
        );
    }
    Ok(response)
}

/// What an ingest checks before it reads the body: the caller's access, the query (none), the
/// runtime, the producer headers.
fn before_body(
    state: &AppState,
    runtime: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<Option<ProducerStamp>, ApiError> {
    Caller::of(state, headers, None)?.ingest(runtime)?;
    Params::parse(query, &[], &[])?;
    if state.runtimes.get(runtime).is_none() {
        return Err(no_runtime(state, runtime));
    }
    producer_stamp(headers)
}

/// How many times a request follows its runtime to the task that replaced it.
const REPLACEMENTS_FOLLOWED: usize = 4;

/// Runs `op` on the task of `runtime`. A task that stopped because a define record replaced
/// the runtime meanwhile never ran what waited in its queue: `op` runs again on its successor.
/// A runtime deleted meanwhile is `404`.
async fn on_runtime<T, Op, Fut>(state: &AppState, runtime: &str, op: Op) -> Result<T, ApiError>
where
    Op: Fn(RuntimeHandle) -> Fut,
    Fut: std::future::Future<Output = Result<T, IngestError>>,
{
    let mut handle = state
        .runtimes
        .get(runtime)
        .ok_or_else(|| no_runtime(state, runtime))?
        .handle;
    for _ in 0..REPLACEMENTS_FOLLOWED {
        match op(handle.clone()).await {
            Err(IngestError::Stopped { .. }) => match state.runtimes.successor(runtime, &handle) {
                Some(next) => handle = next,
                None if state.runtimes.get(runtime).is_none() => {
                    return Err(no_runtime(state, runtime))
                }
                None => break,
            },
            answer => return answer.map_err(refusal),
        }
    }
    Err(refusal(IngestError::Stopped {
        runtime: runtime.to_owned(),
    }))
}

fn no_runtime(state: &AppState, runtime: &str) -> ApiError {
    state.unknown(format!("no runtime named {runtime:?}"))
}

/// The answer to a batch that was not committed.
fn refusal(error: IngestError) -> ApiError {
    let unavailable = match error {
        IngestError::Guest {
            source: GuestError::SchemaViolation(ref violation),
            ..
        } => {
            return ApiError::unprocessable("schema_violation", error.to_string())
                .with_field("view", violation.view.as_str())
                .with_field("key", violation.key.as_str())
                .with_field("pointer", violation.pointer.as_str())
        }
        // The guest's failure in our words: a trap's text and a panic's location are logged.
        IngestError::Guest {
            ref runtime,
            ref source,
        } => {
            return ApiError::unprocessable(
                "batch_rejected",
                format!("runtime `{runtime}`: {}", source.public_message()),
            )
        }
        IngestError::OutOfOrder { expected, .. } => {
            return with_next_seq(
                ApiError::conflict("producer_out_of_order", error.to_string()),
                expected,
            )
        }
        IngestError::SeqReused { next, .. } => {
            return with_next_seq(
                ApiError::conflict("producer_seq_reused", error.to_string()),
                next,
            )
        }
        IngestError::SeqStale { next, .. } => {
            return with_next_seq(
                ApiError::conflict("producer_seq_stale", error.to_string()),
                next,
            )
        }
        IngestError::Fenced { .. } => {
            return ApiError::forbidden("producer_fenced", error.to_string())
        }
        IngestError::LastEpoch { .. } => return ApiError::bad_request(error.to_string()),
        IngestError::Claim {
            source: ClaimError::EpochsUsedUp,
            ..
        } => return ApiError::conflict("producer_epochs_used_up", error.to_string()),
        IngestError::Stopped { .. } => ApiError::unavailable(error.to_string()),
        IngestError::Halted { .. } => ApiError::halted(error.to_string()),
        // The rest carries what the client must not see (paths, OS errors, chains): logged.
        IngestError::Log { .. } => ApiError::unavailable_hiding(
            "the log cannot take writes now; nothing of the batch was committed; send it again",
            &error,
        ),
        // Not published: nothing was applied, and nothing will be.
        IngestError::NotTaken { .. } => {
            ApiError::unavailable(format!("{error}; nothing of the batch was applied; send it again"))
        }
        // Perhaps published: the client learns how to find out, never "send it again" alone.
        IngestError::Unknown { position, .. } => {
            let how = match position {
                Some(position) => format!("it was published at log position {position}: a view read with ?after={position} shows whether it applied; "),
                None => String::new(),
            };
            tracing::warn!(%error, "ingest: outcome unknown");
            ApiError::outcome_unknown(format!("the batch's outcome is not known: this node saw no verdict on it in time, and it may yet apply; {how}send it again with its producer stamp to apply it at most once (without one it may apply twice)"))
            .with_field("position", position.map(|p| p.get()))
        }
        IngestError::Shared { .. } => ApiError::unavailable_hiding(
            "the shared log cannot take batches now; nothing of the batch was committed; send it again",
            &error,
        ),
        _ => ApiError::unavailable_hiding(
            "the runtime cannot run batches now; nothing of the batch was committed; send it again",
            &error,
        ),
    };
    unavailable.with_header(
        axum::http::header::RETRY_AFTER,
        HeaderValue::from_static("1"),
    )
}

/// A producer's refusal naming the `seq` it may send next: the `Producer-Expected-Seq` header,
/// and `next_seq` in the body.
fn with_next_seq(error: ApiError, next: ProducerSeq) -> ApiError {
    error
        .with_header(
            HeaderName::from_static("producer-expected-seq"),
            next.get().into(),
        )
        .with_field("next_seq", next.get())
}

/// The producer headers, if any.
fn producer_stamp(headers: &HeaderMap) -> Result<Option<ProducerStamp>, ApiError> {
    let text = |name: &str| -> Result<Option<&str>, ApiError> {
        let mut values = headers.get_all(name).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return match headers.contains_key(name) {
                true => Err(ApiError::bad_request(format!(
                    "{name} is given more than once"
                ))),
                false => Ok(None),
            };
        };
        value
            .to_str()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("{name} is not visible ASCII")))
    };
    let number = |name: &str| -> Result<Option<u64>, ApiError> {
        text(name)?
            .map(|value| {
                // Plain decimal digits: `+2`, ` 2` and `2.0` are refused, not read as 2.
                let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
                digits
                    .then(|| value.parse::<u64>().ok())
                    .flatten()
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "{name} must be an integer from 0 to {}, not {value:?}",
                            u64::MAX
                        ))
                    })
            })
            .transpose()
    };
    let id = text(PRODUCER_ID)?;
    let epoch = number(PRODUCER_EPOCH)?;
    let seq = number(PRODUCER_SEQ)?;
    let Some(id) = id else {
        if epoch.is_some() || seq.is_some() {
            return Err(ApiError::bad_request(
                "Producer-Epoch and Producer-Seq need a Producer-Id",
            ));
        }
        return Ok(None);
    };
    let id = producer_id(id)?;
    let Some(seq) = seq else {
        return Err(ApiError::bad_request("Producer-Id needs a Producer-Seq"));
    };
    Ok(Some(ProducerStamp {
        id,
        epoch: epoch.map_or(ProducerEpoch::default(), ProducerEpoch::new),
        seq: ProducerSeq::new(seq),
        claim: false,
    }))
}

/// A producer id, as a header or a path gives it: 1–256 visible ASCII characters.
fn producer_id(id: &str) -> Result<String, ApiError> {
    if id.is_empty() || id.len() > MAX_PRODUCER_ID || id.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(ApiError::bad_request(format!(
            "a producer id must be 1 to {MAX_PRODUCER_ID} visible ASCII characters"
        )));
    }
    Ok(id.to_owned())
}

/// 200 with the producer's new epoch and its next `seq` (0): every batch of an older epoch of
/// this id is fenced from here on. The claim is logged like a batch, so it holds across a
/// restart and on every node of a cluster. 400 for a bad id or a query parameter (the route
/// takes none); 404 for an unknown runtime; 409 when the producer holds the last epoch (no
/// claim can fence it); 503 (with `Retry-After`) when the runtime or the log cannot take it.
async fn claim(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path((runtime, id)) = path?;
    Caller::of(&state, &headers, None)?.ingest(&runtime)?;
    Params::parse(query.as_deref(), &[], &[])?;
    if state.runtimes.get(&runtime).is_none() {
        return Err(no_runtime(&state, &runtime));
    }
    let id = producer_id(&id)?;
    let accepted = on_runtime(&state, &runtime, |handle| {
        let id = id.clone();
        async move { handle.claim(id).await }
    })
    .await?;
    let Some(epoch) = accepted.claimed else {
        return Err(ApiError::internal("the claim was answered as a batch"));
    };
    tracing::info!(producer = %id, %epoch, "producer claimed an epoch");
    Ok(Json(serde_json::json!({
        "producer": id,
        "epoch": epoch.get(),
        "seq": 0,
        "position": accepted.receipt.position,
        "durability": accepted.receipt.durability,
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn producer_numbers_are_plain_decimal_digits() {
        let stamp = |seq: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(PRODUCER_ID, HeaderValue::from_static("p"));
            headers.insert(PRODUCER_SEQ, HeaderValue::from_str(seq).unwrap());
            producer_stamp(&headers).map(|s| s.map(|s| s.seq))
        };
        assert_eq!(stamp("2").unwrap(), Some(ProducerSeq::new(2)));
        assert_eq!(stamp("007").unwrap(), Some(ProducerSeq::new(7)));
        for refused in [
            "+2",
            "-0",
            " 2",
            "2 ",
            "2.0",
            "0x2",
            "",
            "18446744073709551616",
        ] {
            let error = stamp(refused).expect_err(refused);
            assert_eq!(
                error.status(),
                axum::http::StatusCode::BAD_REQUEST,
                "{refused:?}"
            );
        }
    }
}
