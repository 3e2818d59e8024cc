//! An incremental Server-Sent Events parser, per the WHATWG HTML "event stream" section.
//!
//! ## What it follows
//! - Lines end with CRLF, LF or CR, including a CR at the end of one read and its LF at the
//!   start of the next (that pair is one line end, not two).
//! - A leading UTF-8 BOM is dropped; every field value is decoded as UTF-8 with replacement.
//! - `field: value` strips exactly one space after the colon; a line without a colon is a field
//!   with an empty value; a line starting with `:` is a comment (counted, never dispatched).
//! - `data` lines are joined with `\n`; `event` sets the type (default `message`); `id` sets the
//!   last event ID unless it contains NUL; `retry` is honoured only when all ASCII digits.
//! - A blank line dispatches the event, unless its data buffer is empty (then the block is
//!   dropped, as a browser does); the event and data buffers are reset either way.
//!
//! ## `id` per event vs. last event ID
//! [`SseEvent::id`] is the `id` field *set in that event's block* (so a test can tell a
//! `state` frame without `id:` from an `update` with one), while
//! [`SseParser::last_event_id`] is the sticky value a browser would send as `Last-Event-ID`.

use std::collections::VecDeque;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `id` field set within this event's block, if any.
    pub id: Option<String>,
    /// The event type (`message` when the block had no `event` field).
    pub event: String,
    /// The data lines joined with `\n`.
    pub data: String,
}

impl SseEvent {
    /// The data parsed as JSON.
    ///
    /// # Errors
    /// When the data is not JSON.
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_str(&self.data).map_err(|e| {
            anyhow::anyhow!(
                "event {:?} data is not JSON ({e}): {}",
                self.event,
                self.data
            )
        })
    }
}

/// A borrowed view of a dispatched event, for callers that do not want to allocate per event
/// (the bench's subscribers).
#[derive(Debug, Clone, Copy)]
pub struct SseEventRef<'a> {
    /// See [`SseEvent::id`].
    pub id: Option<&'a str>,
    /// See [`SseEvent::event`].
    pub event: &'a str,
    /// See [`SseEvent::data`].
    pub data: &'a str,
}

impl SseEventRef<'_> {
    /// An owned copy.
    pub fn to_owned_event(&self) -> SseEvent {
        SseEvent {
            id: self.id.map(str::to_owned),
            event: self.event.to_owned(),
            data: self.data.to_owned(),
        }
    }
}

/// The parser state. Feed it body bytes in any split; take events from the queue
/// ([`SseParser::feed`] + [`SseParser::pop`]) or through a callback ([`SseParser::feed_with`]).
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of a line whose end has not arrived yet.
    partial: Vec<u8>,
    /// The previous input ended with CR: a LF at the start of the next input belongs to it.
    pending_cr: bool,
    /// The BOM check is done (it applies to the first bytes of the stream only).
    started: bool,
    data: String,
    event: String,
    /// This block set an `id` (the one in `last_event_id`, which every accepted `id` sets).
    block_has_id: bool,
    last_event_id: String,
    retry: Option<u64>,
    comments: u64,
    queue: VecDeque<SseEvent>,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// The sticky last event ID (what a reconnecting browser sends), `None` before any `id`.
    pub fn last_event_id(&self) -> Option<&str> {
        (!self.last_event_id.is_empty()).then_some(self.last_event_id.as_str())
    }

    /// The last valid `retry:` value, in milliseconds.
    pub fn retry(&self) -> Option<u64> {
        self.retry
    }

    /// How many comment lines (heartbeats) were seen.
    pub fn comments(&self) -> u64 {
        self.comments
    }

    /// Parses `input` and queues every event it completes.
    pub fn feed(&mut self, input: &[u8]) {
        let mut out = std::mem::take(&mut self.queue);
        self.feed_with(input, |ev| out.push_back(ev.to_owned_event()));
        self.queue = out;
    }

    /// Takes the oldest queued event.
    pub fn pop(&mut self) -> Option<SseEvent> {
        self.queue.pop_front()
    }

    /// Parses `input`, handing each completed event to `on_event` (nothing is queued).
    pub fn feed_with(&mut self, mut input: &[u8], mut on_event: impl FnMut(SseEventRef<'_>)) {
        if !self.started {
            // The BOM may itself arrive split; wait until 3 bytes (or a non-BOM prefix) are in.
            self.partial.extend_from_slice(input);
            const BOM: &[u8] = b"\xEF\xBB\xBF";
            let n = self.partial.len().min(3);
            if self.partial[..n] != BOM[..n] {
                self.started = true;
            } else if self.partial.len() >= 3 {
                self.partial.drain(..3);
                self.started = true;
            } else {
                return;
            }
            let buffered = std::mem::take(&mut self.partial);
            self.feed_lines(&buffered, &mut on_event);
            return;
        }
        if self.pending_cr {
            self.pending_cr = false;
            if let Some(rest) = input.strip_prefix(b"\n") {
                input = rest;
            }
        }
        self.feed_lines(input, &mut on_event);
    }

    fn feed_lines(&mut self, input: &[u8], on_event: &mut impl FnMut(SseEventRef<'_>)) {
        let mut start = 0;
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            if b != b'\n' && b != b'\r' {
                i += 1;
                continue;
            }
            let end = i;
            i += 1;
            if b == b'\r' {
                if i < input.len() {
                    if input[i] == b'\n' {
                        i += 1;
                    }
                } else {
                    self.pending_cr = true;
                }
            }
            if self.partial.is_empty() {
                self.line(&input[start..end], on_event);
            } else {
                let mut line = std::mem::take(&mut self.partial);
                line.extend_from_slice(&input[start..end]);
                self.line(&line, on_event);
                line.clear();
                self.partial = line;
            }
            start = i;
        }
        self.partial.extend_from_slice(&input[start..]);
    }

    fn line(&mut self, line: &[u8], on_event: &mut impl FnMut(SseEventRef<'_>)) {
        if line.is_empty() {
            self.dispatch(on_event);
            return;
        }
        if line[0] == b':' {
            self.comments += 1;
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"event" => {
                self.event.clear();
                self.event.push_str(&value);
            }
            b"data" => {
                self.data.push_str(&value);
                self.data.push('\n');
            }
            b"id" if !value.contains('\0') => {
                self.last_event_id.clear();
                self.last_event_id.push_str(&value);
                self.block_has_id = true;
            }
            b"retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                self.retry = value.parse().ok();
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(SseEventRef<'_>)) {
        if !self.data.is_empty() {
            let data = self.data.strip_suffix('\n').unwrap_or(&self.data);
            let event = if self.event.is_empty() {
                "message"
            } else {
                &self.event
            };
            on_event(SseEventRef {
                id: self.block_has_id.then_some(self.last_event_id.as_str()),
                event,
                data,
            });
        }
        self.data.clear();
        self.event.clear();
        self.block_has_id = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(chunks: &[&[u8]]) -> (Vec<SseEvent>, SseParser) {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c);
            while let Some(e) = p.pop() {
                out.push(e);
            }
        }
        (out, p)
    }

    fn ev(id: Option<&str>, event: &str, data: &str) -> SseEvent {
        SseEvent {
            id: id.map(str::to_owned),
            event: event.to_owned(),
            data: data.to_owned(),
        }
    }

    const STREAM: &[u8] = b": hello\nretry: 2500\n\nid: e-1\nevent: update\ndata: {\"key\":\"A\"}\n\nevent: state\ndata: line1\ndata:line2\ndata\n\ndata: plain\n\n";

    fn expected() -> Vec<SseEvent> {
        vec![
            ev(Some("e-1"), "update", "{\"key\":\"A\"}"),
            ev(None, "state", "line1\nline2\n"),
            ev(None, "message", "plain"),
        ]
    }

    #[test]
    fn parses_fields_multiline_data_comments_retry() {
        let (events, p) = parse_all(&[STREAM]);
        assert_eq!(events, expected());
        assert_eq!(p.comments(), 1);
        assert_eq!(p.retry(), Some(2500));
        assert_eq!(p.last_event_id(), Some("e-1"), "the id is sticky");
    }

    #[test]
    fn every_split_point_and_line_ending_gives_the_same_events() {
        for ending in [&b"\r\n"[..], b"\r", b"\n"] {
            let text: Vec<u8> = STREAM
                .split(|&b| b == b'\n')
                .collect::<Vec<_>>()
                .join(ending);
            for cut in 0..=text.len() {
                let (a, b) = text.split_at(cut);
                let (events, _) = parse_all(&[a, b]);
                assert_eq!(events, expected(), "ending {ending:?} cut at {cut}");
            }
            // Byte by byte.
            let bytes: Vec<&[u8]> = text.chunks(1).collect();
            assert_eq!(parse_all(&bytes).0, expected());
        }
    }

    #[test]
    fn crlf_split_across_reads_is_one_line_end() {
        let (events, _) = parse_all(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]);
        assert_eq!(events, vec![ev(None, "message", "a\nb")]);
    }

    #[test]
    fn bom_is_dropped_even_when_split() {
        let (events, _) = parse_all(&[b"\xEF", b"\xBB", b"\xBFdata: x\n\n"]);
        assert_eq!(events, vec![ev(None, "message", "x")]);
        // A second BOM is not stripped: the field name becomes "\u{feff}data", ignored.
        let (events, _) = parse_all(&[b"\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\n"]);
        assert!(events.is_empty());
    }

    #[test]
    fn empty_data_is_not_dispatched_but_id_sticks() {
        let (events, p) = parse_all(&[b"id: 7\nevent: x\n\ndata: y\n\n"]);
        assert_eq!(events, vec![ev(None, "message", "y")]);
        assert_eq!(p.last_event_id(), Some("7"));
    }

    #[test]
    fn only_one_space_is_stripped_and_bad_retry_ignored() {
        let (events, p) = parse_all(&[b"retry: 12x\ndata:  two\n\n"]);
        assert_eq!(events, vec![ev(None, "message", " two")]);
        assert_eq!(p.retry(), None);
    }

    #[test]
    fn id_with_nul_is_ignored() {
        let (events, p) = parse_all(&[b"id: a\0b\ndata: x\n\n"]);
        assert_eq!(events, vec![ev(None, "message", "x")]);
        assert_eq!(p.last_event_id(), None);
    }

    #[test]
    fn unterminated_event_is_not_dispatched() {
        let (events, _) = parse_all(&[b"data: x\n"]);
        assert!(events.is_empty());
    }
}
