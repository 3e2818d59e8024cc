//! Assertions shared by the end-to-end tests, over the wire format of DESIGN §5.

use anyhow::{bail, ensure, Context as _};
use viewtape_journal::Cursor;

use crate::feed::{event_seq, parse_cursor};
use crate::http::Response;
use crate::server::Server;
use crate::sse::SseEvent;

/// The cursor of an event that must carry one.
///
/// # Errors
/// When the event has no `id` or it is not a cursor.
pub fn cursor_of(event: &SseEvent) -> anyhow::Result<Cursor> {
    let id = event
        .id
        .as_deref()
        .with_context(|| format!("event without id: {event:?}"))?;
    parse_cursor(id)
}

/// Checks an `update` event: kind, id offset, key, and the ticker payload's `seq`.
///
/// # Errors
/// On any mismatch.
pub fn update(event: &SseEvent, offset: u64, key: &str, seq: u64) -> anyhow::Result<Cursor> {
    ensure!(event.event == "update", "expected update, got {event:?}");
    let cursor = cursor_of(event)?;
    ensure!(
        cursor.offset().get() == offset,
        "expected offset {offset}, got {event:?}"
    );
    let data = event.json()?;
    ensure!(data["key"] == key, "expected key {key}, got {event:?}");
    ensure!(
        event_seq(&data)? == seq,
        "expected seq {seq}, got {event:?}"
    );
    ensure!(
        data["value"]["symbol"] == key,
        "payload symbol is not the key: {event:?}"
    );
    Ok(cursor)
}

/// Checks a `reset` event and returns its JSON data (`reason`, `epoch`, `first`, `next`).
///
/// # Errors
/// When the event is not a reset with that reason and a well-formed window.
pub fn reset(event: &SseEvent, reason: &str) -> anyhow::Result<serde_json::Value> {
    ensure!(
        event.event == "reset",
        "expected reset ({reason}), got {event:?}"
    );
    // No cursor; an empty `id:` is fine (it clears a browser's last event ID, so its next
    // reconnect does not resend the cursor that was refused).
    ensure!(
        event.id.as_deref().is_none_or(str::is_empty),
        "a reset carries no cursor: {event:?}"
    );
    let data = event.json()?;
    ensure!(
        data["reason"] == reason,
        "expected reason {reason:?}, got {data}"
    );
    let epoch = data["epoch"]
        .as_str()
        .with_context(|| format!("reset without epoch: {data}"))?;
    ensure!(
        epoch.len() == 16
            && epoch
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "reset epoch is not 16 lowercase hex: {data}"
    );
    let first = data["first"].as_u64();
    let next = data["next"].as_u64();
    match (first, next) {
        (Some(first), Some(next)) if first <= next => {}
        _ => bail!("reset window is not first <= next: {data}"),
    }
    Ok(data)
}

/// A refusal with `status` and the one error shape of every route, `{"error","message"}`;
/// returns the body.
///
/// # Errors
/// Another status, or another body.
pub fn json_error(resp: &Response, status: u16) -> anyhow::Result<serde_json::Value> {
    ensure!(
        resp.status() == status,
        "expected {status}: {} {}",
        resp.status(),
        resp.text()
    );
    let error = resp.json()?;
    ensure!(
        error["error"].is_string() && error["message"].is_string(),
        "a JSON error body: {error}"
    );
    Ok(error)
}

/// Resumes `cursor` on `view` and requires the stream to stay silent for 300 ms: no reset, and
/// nothing missed. Returns the stream, to follow on.
///
/// # Errors
/// When anything arrives.
pub async fn resumes(
    server: &Server,
    view: &str,
    cursor: &Cursor,
) -> anyhow::Result<crate::stream::EventStream> {
    let mut stream = server
        .sse(
            &format!("/views/{view}/events"),
            &[("Last-Event-ID", &cursor.to_string())],
        )
        .await?;
    stream
        .expect_silence(std::time::Duration::from_millis(300))
        .await?;
    Ok(stream)
}

/// Reads `stream` until the event at offset `last`, requiring offsets to run exactly
/// `after + 1 ..= last` (no duplicate, no loss) and each update to carry the tick whose `seq` is
/// its offset (every tick published once, from offset 1).
///
/// # Errors
/// On the first event out of line, or a read error.
pub async fn contiguous(
    stream: &mut crate::stream::EventStream,
    after: u64,
    last: u64,
) -> anyhow::Result<()> {
    for expected in after + 1..=last {
        let event = stream.next_event().await?;
        ensure!(event.event == "update", "after {}: {event:?}", expected - 1);
        let offset = cursor_of(&event)?.offset().get();
        ensure!(
            offset == expected,
            "expected offset {expected}, got {offset} (a duplicate or a loss)"
        );
        ensure!(event_seq(&event.json()?)? == offset, "{event:?}");
    }
    Ok(())
}

/// The first `n` events of the retained tape of `view` (`?from=tape`, no cursor).
///
/// # Errors
/// On connection errors, timeouts, or a non-update/delete event.
pub async fn tape(server: &Server, view: &str, n: usize) -> anyhow::Result<Vec<SseEvent>> {
    let mut stream = server
        .sse(&format!("/views/{view}/events?from=tape"), &[])
        .await?;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let event = stream.next_event().await?;
        ensure!(
            event.event == "update" || event.event == "delete",
            "tape replay yielded {event:?}"
        );
        out.push(event);
    }
    Ok(out)
}

/// Resumes `cursor` on `view` and requires the first event to be a reset for a reason other
/// than `malformed` (the cursor is well-formed; the server must refuse it for what it means).
/// Returns the stream, positioned after the reset.
///
/// # Errors
/// When the first event is not such a reset.
pub async fn refused(
    server: &Server,
    view: &str,
    cursor: &Cursor,
) -> anyhow::Result<crate::stream::EventStream> {
    let mut stream = server
        .sse(
            &format!("/views/{view}/events"),
            &[("Last-Event-ID", &cursor.to_string())],
        )
        .await?;
    let event = stream.next_event().await?;
    ensure!(
        event.event == "reset",
        "cursor {cursor} must not resume silently, got {event:?}"
    );
    let reason = event.json()?["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    reset(&event, &reason)?;
    ensure!(reason != "malformed", "{event:?}");
    Ok(stream)
}
