//! SSE frames: the wire bytes of one event, encoded once and shared.
//!
//! ## Shapes
//!
//! ```text
//! id: <cursor>            (absent on cursorless frames: journal sealed or disabled)
//! event: update | delete
//! data: {"key":<key as a JSON string>,"value":<payload>}   (delete: {"key":…})
//!
//! event: state            (one per key during a state transfer; no id)
//! data: {"key":…,"value":…}
//!
//! id: <cursor>
//! event: synced           (end of a state transfer: live events follow after <cursor>)
//! data: {"cursor":"<cursor>","keys":<n>}
//!
//! event: reset            (the cursor cannot be honoured)
//! data: {"reason":"expired","epoch":"…","first":1,"next":9}
//! ```
//!
//! Payloads are JSON. A payload that is not valid JSON is delivered as a JSON
//! string of its (lossy) UTF-8 text, so no event is ever dropped or breaks
//! the envelope. A payload spanning several lines is split into several
//! `data:` lines, which every SSE client joins back with `\n`.
//!
//! A `state` event is a zero-copy slice of the key's latest `update` frame:
//! the view's state holds those frames, never a second copy of payloads.

use bytes::{BufMut, Bytes, BytesMut};
use serde::de::IgnoredAny;
use viewtape_journal::{Cursor, ReplayError, ReplayWindow};

use crate::host::EventKind;

const DATA: &[u8] = b"data: ";
const VALUE_SEPARATOR: &[u8] = b",\"value\":";

/// Encodes one event.
pub(crate) fn event(cursor: Option<Cursor>, kind: EventKind, key: &str, payload: &[u8]) -> Bytes {
    // id (≤ 42) + event (14) + envelope (27) + key + payload: one
    // allocation for the common case, no doubling slack held by the state.
    let mut out = BytesMut::with_capacity(88 + key.len() + payload.len());
    if let Some(cursor) = cursor {
        out.put_slice(b"id: ");
        out.put_slice(cursor.to_string().as_bytes());
        out.put_u8(b'\n');
    }
    match kind {
        EventKind::Update => out.put_slice(b"event: update\n"),
        EventKind::Delete => out.put_slice(b"event: delete\n"),
    }
    out.put_slice(DATA);
    out.put_slice(b"{\"key\":");
    put_json_string(&mut out, key);
    if kind == EventKind::Update {
        out.put_slice(VALUE_SEPARATOR);
        if serde_json::from_slice::<IgnoredAny>(payload).is_ok() {
            put_lines(&mut out, payload);
        } else {
            put_json_string(&mut out, &String::from_utf8_lossy(payload));
        }
    }
    out.put_slice(b"}\n\n");
    out.freeze()
}

/// The `data:` part of a frame (everything from its first `data: ` line).
fn data_part(frame: &Bytes) -> Bytes {
    let at = frame
        .windows(DATA.len())
        .position(|w| w == DATA)
        .unwrap_or(frame.len());
    frame.slice(at..)
}

/// A `state` event for an update frame: `event: state` plus the frame's data,
/// shared rather than copied.
pub(crate) fn state_parts(frame: &Bytes) -> [Bytes; 2] {
    [Bytes::from_static(b"event: state\n"), data_part(frame)]
}

/// The `"key":value` member of an update frame, for a JSON object of state
/// entries (`GET /views/{view}`).
pub(crate) fn state_member(frame: &Bytes) -> Vec<u8> {
    let envelope = unsplit(&data_part(frame));
    // envelope = {"key":K,"value":V} — K is a JSON string, whose quotes are
    // escaped, so the first `,"value":` is the separator.
    let inner = envelope
        .strip_prefix(b"{\"key\":")
        .and_then(|rest| rest.strip_suffix(b"}"))
        .unwrap_or(b"null:null");
    match inner
        .windows(VALUE_SEPARATOR.len())
        .position(|w| w == VALUE_SEPARATOR)
    {
        Some(at) => {
            let mut member = inner[..at].to_vec();
            member.push(b':');
            member.extend_from_slice(&inner[at + VALUE_SEPARATOR.len()..]);
            member
        }
        None => b"null:null".to_vec(),
    }
}

/// Joins a frame's `data:` lines back into the text a client sees.
fn unsplit(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    for (i, line) in data
        .split(|&b| b == b'\n')
        .filter(|line| line.starts_with(DATA))
        .enumerate()
    {
        if i > 0 {
            out.push(b'\n');
        }
        out.extend_from_slice(&line[DATA.len()..]);
    }
    out
}

/// The marker that ends a state transfer.
pub(crate) fn synced(cursor: Cursor, keys: usize) -> Bytes {
    Bytes::from(format!(
        "id: {cursor}\nevent: synced\ndata: {{\"cursor\":\"{cursor}\",\"keys\":{keys}}}\n\n"
    ))
}

/// Why a stream restarts from the view's state.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ResetReason<'a> {
    /// The journal refused the cursor.
    Replay(&'a ReplayError),
    /// The `Last-Event-ID` / `?cursor=` text is not a cursor.
    Malformed,
    /// The subscriber fell behind the cursorless live feed.
    Lagged,
}

impl ResetReason<'_> {
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Self::Replay(error) => error.reason(),
            Self::Malformed => "malformed",
            Self::Lagged => "lagged",
        }
    }
}

/// `event: reset` with the reason and the current window. Its empty `id:`
/// line makes an `EventSource` forget the cursor it can no longer use.
pub(crate) fn reset(reason: ResetReason<'_>, window: &ReplayWindow) -> Bytes {
    Bytes::from(format!(
        "id\nevent: reset\ndata: {{\"reason\":\"{}\",\"epoch\":\"{}\",\"first\":{},\"next\":{}}}\n\n",
        reason.as_str(),
        window.epoch,
        window.first,
        window.next
    ))
}

/// Appends `text` as a JSON string.
fn put_json_string(out: &mut BytesMut, text: &str) {
    // serde_json never fails to write a string into a Vec-like writer.
    let _ = serde_json::to_writer((&mut *out).writer(), text);
}

/// Appends `payload`, turning each line break (CRLF, LF or CR) into a new
/// `data: ` line.
fn put_lines(out: &mut BytesMut, payload: &[u8]) {
    let mut rest = payload;
    while let Some(at) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
        out.put_slice(&rest[..at]);
        out.put_u8(b'\n');
        out.put_slice(DATA);
        let skip = if rest[at] == b'\r' && rest.get(at + 1) == Some(&b'\n') {
            2
        } else {
            1
        };
        rest = &rest[at + skip..];
    }
    out.put_slice(rest);
}

#[cfg(test)]
mod tests {
    use super::*;
    use viewtape_journal::JournalEpoch;

    fn cursor() -> Cursor {
        Cursor::new(JournalEpoch::from_bits(0xab), 7)
    }

    #[test]
    fn update_frame_carries_cursor_kind_key_and_payload() {
        let frame = event(Some(cursor()), EventKind::Update, "ACME", br#"{"price":1}"#);
        assert_eq!(
            &frame[..],
            b"id: 00000000000000ab-7\nevent: update\ndata: {\"key\":\"ACME\",\"value\":{\"price\":1}}\n\n"
        );
    }

    #[test]
    fn cursorless_delete_frame() {
        let frame = event(None, EventKind::Delete, "a\"b", b"");
        assert_eq!(&frame[..], b"event: delete\ndata: {\"key\":\"a\\\"b\"}\n\n");
    }

    #[test]
    fn multi_line_payloads_split_into_data_lines() {
        let frame = event(None, EventKind::Update, "k", b"{\r\n\"a\": 1,\r\"b\":\n2}");
        assert_eq!(
            &frame[..],
            b"event: update\ndata: {\"key\":\"k\",\"value\":{\ndata: \"a\": 1,\ndata: \"b\":\ndata: 2}}\n\n"
        );
        assert_eq!(state_member(&frame), b"\"k\":{\n\"a\": 1,\n\"b\":\n2}");
    }

    #[test]
    fn non_json_payloads_become_json_strings() {
        let frame = event(None, EventKind::Update, "k", b"not json\nat all");
        assert_eq!(
            &frame[..],
            b"event: update\ndata: {\"key\":\"k\",\"value\":\"not json\\nat all\"}\n\n"
        );
    }

    #[test]
    fn state_parts_share_the_frame_and_members_extract_key_and_value() {
        let frame = event(Some(cursor()), EventKind::Update, "x,\"value\":", b"[1,2]");
        let [head, data] = state_parts(&frame);
        assert_eq!(&head[..], b"event: state\n");
        assert_eq!(
            &data[..],
            b"data: {\"key\":\"x,\\\"value\\\":\",\"value\":[1,2]}\n\n"
        );
        assert_eq!(state_member(&frame), b"\"x,\\\"value\\\":\":[1,2]");
    }
}
