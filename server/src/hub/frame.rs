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

use std::borrow::Cow;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use viewtape_journal::{Cursor, ReplayError, ReplayWindow};

use crate::host::{EventKind, GuestEvent};

const DATA: &[u8] = b"data: ";
const VALUE_SEPARATOR: &[u8] = b",\"value\":";

/// `data: {"key":` — where the key's JSON string starts, counted from the `data: ` line.
const KEY_PREFIX: &[u8] = b"data: {\"key\":";
/// What ends every event frame.
const FRAME_END: &[u8] = b"}\n\n";

/// One event's wire bytes, encoded once and shared, and where its parts lie in them, so
/// nothing ever parses SSE text back.
///
/// The bytes are behind the same `Arc` the journal's tape holds, and are allocated to their
/// exact length: a frame that no subscriber reads costs one buffer and that `Arc`, and the
/// `Bytes` reference count is made only when one is written out.
///
/// Invariants, set by [`event`] and checked when a frame is read back from a snapshot:
/// `bytes[data_at..]` starts with `data: {"key":`, followed by the key as a JSON string; for
/// an update, `bytes[value_at - 9..value_at]` is `,"value":` and the value runs from
/// `value_at` to the closing `}\n\n`. A value's line breaks are `\ndata: ` in the bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "(Bytes, u32, u32)", into = "(Bytes, u32, u32)")]
pub struct Frame {
    bytes: Arc<Bytes>,
    data_at: u32,
    /// Where an update's value starts; 0 for a delete.
    value_at: u32,
}

impl Frame {
    /// The wire bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The wire bytes, shared: what the journal's tape holds.
    pub fn shared(&self) -> &Arc<Bytes> {
        &self.bytes
    }

    /// The key as a JSON string.
    fn key_json(&self) -> &[u8] {
        let end = if self.value_at == 0 {
            self.bytes.len() - FRAME_END.len()
        } else {
            self.value_at as usize - VALUE_SEPARATOR.len()
        };
        &self.bytes[self.data_at as usize + KEY_PREFIX.len()..end]
    }

    /// An update's value as JSON text (line breaks restored); `None` for a delete.
    pub fn value_json(&self) -> Option<Cow<'_, [u8]>> {
        if self.value_at == 0 {
            return None;
        }
        let value = &self.bytes[self.value_at as usize..self.bytes.len() - FRAME_END.len()];
        Some(unsplit(value))
    }

    /// The `event: state` entry for this update, sharing the frame's `data:` lines.
    pub fn state_parts(&self) -> [Bytes; 2] {
        [
            Bytes::from_static(b"event: state\n"),
            self.bytes.slice(self.data_at as usize..),
        ]
    }

    /// Appends the `"key":value` member of a JSON object of state entries
    /// (`GET /views/{view}`).
    pub fn put_json_member(&self, out: &mut BytesMut) {
        out.put_slice(self.key_json());
        out.put_u8(b':');
        match self.value_json() {
            Some(value) => out.put_slice(&value),
            None => out.put_slice(b"null"),
        }
    }
}

/// Why stored bytes are not an event frame (a snapshot damaged in a way its checksum missed, or
/// not written by this server).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not an event frame: data at {data_at}, value at {value_at}")]
pub struct NotAFrame {
    /// Where the bytes said the `data:` line starts.
    pub data_at: u32,
    /// Where they said the value starts (0: none).
    pub value_at: u32,
}

impl TryFrom<(Bytes, u32, u32)> for Frame {
    type Error = NotAFrame;

    fn try_from((bytes, data_at, value_at): (Bytes, u32, u32)) -> Result<Self, NotAFrame> {
        let (data, value) = (data_at as usize, value_at as usize);
        let well_formed = bytes.get(data..).is_some_and(|d| d.starts_with(KEY_PREFIX))
            && bytes.ends_with(FRAME_END)
            && (value == 0
                || (value >= data + KEY_PREFIX.len() + VALUE_SEPARATOR.len()
                    && value <= bytes.len() - FRAME_END.len()
                    && bytes[value - VALUE_SEPARATOR.len()..value] == *VALUE_SEPARATOR));
        if well_formed {
            Ok(Self {
                bytes: Arc::new(bytes),
                data_at,
                value_at,
            })
        } else {
            Err(NotAFrame { data_at, value_at })
        }
    }
}

impl From<Frame> for (Bytes, u32, u32) {
    fn from(frame: Frame) -> Self {
        (
            Arc::unwrap_or_clone(frame.bytes),
            frame.data_at,
            frame.value_at,
        )
    }
}

/// Encodes one event.
pub fn event(cursor: Option<Cursor>, event: &GuestEvent) -> Frame {
    let (kind, key, payload) = (event.kind, event.key.as_str(), &event.payload[..]);
    // id (≤ 42) + event (14) + envelope (27) + key + payload: one
    // allocation for the common case, no doubling slack held by the state.
    let mut out = Vec::with_capacity(88 + key.len() + payload.len());
    if let Some(cursor) = cursor {
        out.put_slice(b"id: ");
        out.put_slice(cursor.text().as_bytes());
        out.put_u8(b'\n');
    }
    match kind {
        EventKind::Update => out.put_slice(b"event: update\n"),
        EventKind::Delete => out.put_slice(b"event: delete\n"),
    }
    let data_at = out.len();
    out.put_slice(KEY_PREFIX);
    put_json_string(&mut out, key);
    let mut value_at = 0;
    if kind == EventKind::Update {
        out.put_slice(VALUE_SEPARATOR);
        value_at = out.len();
        if event.is_json() {
            put_lines(&mut out, payload);
        } else {
            put_json_string(&mut out, &String::from_utf8_lossy(payload));
        }
    }
    out.put_slice(FRAME_END);
    // Frames are bounded by the host's event limit, far below 4 GiB.
    let offset = |at: usize| u32::try_from(at).unwrap_or(u32::MAX);
    // A buffer of its exact length becomes `Bytes` without a reference count of its own
    // (mimalloc shrinks it in place).
    out.shrink_to_fit();
    Frame {
        bytes: Arc::new(Bytes::from(out)),
        data_at: offset(data_at),
        value_at: offset(value_at),
    }
}

/// A value's text with its `\ndata: ` line breaks turned back into `\n`.
fn unsplit(value: &[u8]) -> Cow<'_, [u8]> {
    if !value.contains(&b'\n') {
        return Cow::Borrowed(value);
    }
    let mut out = Vec::with_capacity(value.len());
    for (i, line) in value.split(|&b| b == b'\n').enumerate() {
        if i > 0 {
            out.push(b'\n');
        }
        out.extend_from_slice(line.strip_prefix(DATA).unwrap_or(line));
    }
    Cow::Owned(out)
}

/// The marker that ends a state transfer.
pub(crate) fn synced(cursor: Cursor, keys: usize) -> Bytes {
    Bytes::from(format!(
        "id: {cursor}\nevent: synced\ndata: {{\"cursor\":\"{cursor}\",\"keys\":{keys}}}\n\n"
    ))
}

/// The last event of a retired view's streams: no `id` (no cursor names it), then the stream
/// ends.
pub(crate) fn retired(view: &str, reason: &str) -> Bytes {
    let mut out = BytesMut::from(&b"event: retired\ndata: {\"view\":"[..]);
    put_json_string(&mut out, view);
    out.extend_from_slice(b",\"reason\":");
    put_json_string(&mut out, reason);
    out.extend_from_slice(b"}\n\n");
    out.freeze()
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
fn put_json_string(out: &mut impl BufMut, text: &str) {
    // serde_json never fails to write a string into a Vec-like writer.
    let _ = serde_json::to_writer((&mut *out).writer(), text);
}

/// Appends `payload`, turning each line break (CRLF, LF or CR) into a new
/// `data: ` line.
fn put_lines(out: &mut impl BufMut, payload: &[u8]) {
    let mut rest = payload;
    while let Some(at) = memchr::memchr2(b'\n', b'\r', rest) {
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
    use viewtape_journal::{JournalEpoch, ViewOffset};

    fn cursor() -> Cursor {
        Cursor::new(JournalEpoch::from_bits(0xab), ViewOffset::new(7))
    }

    fn encode(cursor: Option<Cursor>, kind: EventKind, key: &str, payload: &[u8]) -> Frame {
        let payload = Bytes::copy_from_slice(payload);
        event(
            cursor,
            &GuestEvent::new("v".into(), key.to_owned(), kind, payload),
        )
    }

    fn member(frame: &Frame) -> Vec<u8> {
        let mut out = BytesMut::new();
        frame.put_json_member(&mut out);
        out.to_vec()
    }

    #[test]
    fn update_frame_carries_cursor_kind_key_and_payload() {
        let frame = encode(Some(cursor()), EventKind::Update, "ACME", br#"{"price":1}"#);
        assert_eq!(
            &frame.bytes()[..],
            b"id: 00000000000000ab-7\nevent: update\ndata: {\"key\":\"ACME\",\"value\":{\"price\":1}}\n\n"
        );
        assert_eq!(frame.value_json().as_deref(), Some(&br#"{"price":1}"#[..]));
        assert_eq!(member(&frame), br#""ACME":{"price":1}"#);
    }

    #[test]
    fn retired_is_one_event_without_an_id() {
        let frame = retired("chat.\"x\"", "its runtime was deleted");
        assert_eq!(
            &frame[..],
            b"event: retired\ndata: {\"view\":\"chat.\\\"x\\\"\",\"reason\":\"its runtime was deleted\"}\n\n"
        );
    }

    #[test]
    fn cursorless_delete_frame() {
        let frame = encode(None, EventKind::Delete, "a\"b", b"");
        assert_eq!(
            &frame.bytes()[..],
            b"event: delete\ndata: {\"key\":\"a\\\"b\"}\n\n"
        );
        assert_eq!(frame.value_json(), None);
        assert_eq!(frame.key_json(), br#""a\"b""#);
    }

    #[test]
    fn multi_line_payloads_split_into_data_lines() {
        let frame = encode(None, EventKind::Update, "k", b"{\r\n\"a\": 1,\r\"b\":\n2}");
        assert_eq!(
            &frame.bytes()[..],
            b"event: update\ndata: {\"key\":\"k\",\"value\":{\ndata: \"a\": 1,\ndata: \"b\":\ndata: 2}}\n\n"
        );
        assert_eq!(member(&frame), b"\"k\":{\n\"a\": 1,\n\"b\":\n2}");
    }

    #[test]
    fn non_json_payloads_become_json_strings() {
        let frame = encode(None, EventKind::Update, "k", b"not json\nat all");
        assert_eq!(
            &frame.bytes()[..],
            b"event: update\ndata: {\"key\":\"k\",\"value\":\"not json\\nat all\"}\n\n"
        );
    }

    #[test]
    fn state_parts_share_the_frame_and_members_use_the_spans() {
        let frame = encode(Some(cursor()), EventKind::Update, "x,\"value\":", b"[1,2]");
        let [head, data] = frame.state_parts();
        assert_eq!(&head[..], b"event: state\n");
        assert_eq!(
            &data[..],
            b"data: {\"key\":\"x,\\\"value\\\":\",\"value\":[1,2]}\n\n"
        );
        assert_eq!(
            data.as_ptr(),
            frame.bytes()[frame.data_at as usize..].as_ptr()
        );
        assert_eq!(member(&frame), b"\"x,\\\"value\\\":\":[1,2]");
    }

    #[test]
    fn frames_round_trip_through_snapshots_and_bad_spans_are_refused() {
        let frame = encode(Some(cursor()), EventKind::Update, "k", b"{\"a\":\n1}");
        let encoded = rmp_serde::to_vec(&frame).unwrap();
        let decoded: Frame = rmp_serde::from_slice(&encoded).unwrap();
        assert_eq!(decoded, frame);
        let (bytes, data_at, value_at) = frame.into();
        for (data_at, value_at) in [
            (data_at + 1, value_at),
            (data_at, value_at + 1),
            (data_at, 5),
            (9_999, 0),
        ] {
            assert!(
                Frame::try_from((bytes.clone(), data_at, value_at)).is_err(),
                "{data_at} {value_at}"
            );
        }
    }

    /// A payload that would be JSON but for bytes inside a string that are not UTF-8 was sent
    /// as it was: the stream carried bytes no client decodes as the JSON they were taken for.
    #[test]
    fn a_payload_with_broken_utf8_becomes_a_json_string() {
        let frame = encode(None, EventKind::Update, "k", b"{\"a\":\"\xff\"}");
        assert_eq!(
            &frame.bytes()[..],
            "event: update\ndata: {\"key\":\"k\",\"value\":\"{\\\"a\\\":\\\"\u{fffd}\\\"}\"}\n\n"
                .as_bytes()
        );
    }

    /// The data of an SSE frame as a client reads it: its lines up to the blank line that
    /// ends it, the `data:` ones joined with `\n`.
    fn client_data(frame: &[u8]) -> Vec<u8> {
        let body = frame
            .strip_suffix(b"\n\n")
            .expect("a frame ends with a blank line");
        assert!(!body.contains(&b'\r'), "a CR would break a line");
        let mut data: Vec<&[u8]> = Vec::new();
        for line in body.split(|&b| b == b'\n') {
            assert!(
                !line.is_empty(),
                "a blank line inside a frame ends it early"
            );
            match line.strip_prefix(b"data:") {
                Some(value) => data.push(value.strip_prefix(b" ").unwrap_or(value)),
                None => assert!(
                    line.starts_with(b"id: ") || line.starts_with(b"event: "),
                    "a stray field: {:?}",
                    String::from_utf8_lossy(line)
                ),
            }
        }
        data.join(&b'\n')
    }

    /// Bytes like a payload: JSON-ish text with line breaks, spaces, escapes and broken UTF-8.
    fn payloads() -> impl Strategy<Value = Vec<u8>> {
        let alphabet = prop::sample::select(
            b"{}[]\":,0123456789.-eE \t\r\n\\u00dfnulltrue\xff\xc3\xa9\x01x".to_vec(),
        );
        prop_oneof![
            prop::collection::vec(alphabet, 0..40),
            prop::collection::vec(any::<u8>(), 0..40),
            prop::sample::select(vec![
                &b"{\"a\":\n[1,\r\n2]}\r"[..],
                b"\"\xff\"",
                b"\"\\ud800\"",
                b"\"\xc3\xa9\"",
                b" 1 ",
                b"{}\n\n{}",
                b"\n\n",
            ])
            .prop_map(<[u8]>::to_vec),
        ]
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// Whatever a guest publishes, the frame is one SSE event whose data is valid UTF-8
        /// JSON of the key and the value: the payload itself (its line breaks as `\n`) when it
        /// is JSON, else the JSON string of its text.
        #[test]
        fn any_payload_makes_one_well_formed_frame(
            key in "\\PC{0,8}",
            payload in payloads(),
        ) {
            let frame = encode(Some(cursor()), EventKind::Update, &key, &payload);
            let data = client_data(frame.bytes());
            let text = std::str::from_utf8(&data);
            prop_assert!(text.is_ok(), "not UTF-8: {:?}", String::from_utf8_lossy(&data));
            let key_json = serde_json::to_string(&key).unwrap();
            let prefix = format!("{{\"key\":{key_json},\"value\":");
            let enveloped = data.starts_with(prefix.as_bytes()) && data.ends_with(b"}");
            prop_assert!(enveloped, "not the envelope: {:?}", String::from_utf8_lossy(&data));
            let value = &data[prefix.len()..data.len() - 1];
            let event = GuestEvent::new("v".into(), key.clone(), EventKind::Update, Bytes::from(payload.clone()));
            if event.is_json() {
                let unix = String::from_utf8_lossy(&payload).replace("\r\n", "\n").replace('\r', "\n");
                prop_assert_eq!(value, unix.as_bytes());
                prop_assert!(std::str::from_utf8(&payload).is_ok(), "a JSON payload is UTF-8");
                prop_assert!(serde_json::from_slice::<serde::de::IgnoredAny>(&data).is_ok());
            } else {
                let parsed: serde_json::Value = serde_json::from_slice(&data).unwrap();
                prop_assert_eq!(&parsed["value"], &serde_json::Value::from(String::from_utf8_lossy(&payload)));
                prop_assert_eq!(&parsed["key"], &serde_json::Value::from(key.clone()));
            }
            let value_json = frame.value_json();
            prop_assert_eq!(value_json.as_deref(), Some(value));
        }
    }
}
