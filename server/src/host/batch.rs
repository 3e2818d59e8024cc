//! What a guest emitted for one batch, decoded from its output buffer (`ABI.md`).

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use viewtape_guest::abi;
use viewtape_journal::CompactString;

use super::GuestError;

/// Whether an event sets or deletes its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The payload is the key's new value.
    Update,
    /// The key was deleted; the payload is empty.
    Delete,
}

/// One event a guest emitted.
#[derive(Clone, Debug)]
pub struct GuestEvent {
    /// The view, validated (1–128 bytes of `[A-Za-z0-9._-]`) and interned per runtime.
    pub view: Arc<str>,
    /// The key (UTF-8), held inline up to 24 bytes.
    pub key: CompactString,
    /// Update or delete.
    pub kind: EventKind,
    /// The payload: a zero-copy slice of the batch's output buffer. Empty for deletes.
    pub payload: Bytes,
    /// Whether the payload is JSON text (an update's that is not is published as a JSON string
    /// of its text); `None` until [`GuestEvent::settle_json`]. Settled where batches run side
    /// by side, not where they commit in turn.
    json: Option<bool>,
}

/// Equal events are the same data; whether the JSON verdict was taken yet does not count.
impl PartialEq for GuestEvent {
    fn eq(&self, other: &Self) -> bool {
        self.view == other.view
            && self.key == other.key
            && self.kind == other.kind
            && self.payload == other.payload
    }
}

impl Eq for GuestEvent {}

impl GuestEvent {
    /// An event; an update's payload is checked for being JSON.
    pub fn new(
        view: Arc<str>,
        key: impl Into<CompactString>,
        kind: EventKind,
        payload: Bytes,
    ) -> Self {
        let mut event = Self::unsettled(view, key, kind, payload);
        event.settle_json(false);
        event
    }

    /// An event whose JSON verdict is left to whoever checks it next (see
    /// [`GuestEvent::settle_json`]): a typed view's schema check parses the payload anyway.
    pub(crate) fn unsettled(
        view: Arc<str>,
        key: impl Into<CompactString>,
        kind: EventKind,
        payload: Bytes,
    ) -> Self {
        Self {
            view,
            key: key.into(),
            kind,
            payload,
            json: None,
        }
    }

    /// Takes the JSON verdict if it is not taken yet: `known` says a check that parsed the
    /// payload as JSON has passed (a typed view's schema); otherwise the payload is parsed here.
    pub(crate) fn settle_json(&mut self, known: bool) {
        if self.json.is_none() {
            self.json = Some(known || self.looks_json());
        }
    }

    /// Whether the payload is JSON text.
    pub fn is_json(&self) -> bool {
        self.json.unwrap_or_else(|| self.looks_json())
    }

    /// Whether an update's payload, read as JSON text, escapes a surrogate that has no partner
    /// (`"\ud800"`, or a low one first). The JSON grammar takes it, but it is no Unicode text:
    /// strict readers (serde_json's, I-JSON's) refuse the whole value, so it is not published.
    /// A quick scan of the backslashes, for the text a JSON verdict takes; on other text its
    /// answer means nothing.
    pub fn escapes_lone_surrogate(&self) -> bool {
        self.kind == EventKind::Update && lone_surrogate(&self.payload)
    }

    /// JSON text is UTF-8: skipping a value (`IgnoredAny`) does not check that its strings are.
    fn looks_json(&self) -> bool {
        self.kind == EventKind::Update
            && std::str::from_utf8(&self.payload).is_ok()
            && serde_json::from_slice::<serde::de::IgnoredAny>(&self.payload).is_ok()
    }
}

/// Whether JSON `text` holds a `\uXXXX` escape of a surrogate without its partner. In JSON text
/// every backslash starts an escape inside a string, so each is read as one.
fn lone_surrogate(text: &[u8]) -> bool {
    let unit = |at: usize| {
        let hex = text.get(at..at + 4)?;
        u16::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
    };
    let mut at = 0;
    while let Some(found) = text.get(at..).and_then(|rest| memchr::memchr(b'\\', rest)) {
        let escape = at + found;
        if text.get(escape + 1) != Some(&b'u') {
            at = escape + 2;
            continue;
        }
        at = escape + 6;
        match unit(escape + 2) {
            Some(0xD800..=0xDBFF) => {
                let low = text.get(at..at + 2) == Some(b"\\u".as_slice());
                if !(low && matches!(unit(at + 2), Some(0xDC00..=0xDFFF))) {
                    return true;
                }
                at += 6;
            }
            Some(0xDC00..=0xDFFF) => return true,
            _ => {}
        }
    }
    false
}

/// Everything one successful batch emitted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuestBatch {
    /// The events, in the order the guest emitted them.
    pub events: Vec<GuestEvent>,
    /// The reasons of the gaps the guest reported, in order. They precede the events.
    pub gaps: Vec<String>,
}

impl GuestBatch {
    /// A batch of `events` that reported no gap.
    pub fn of_events(events: Vec<GuestEvent>) -> Self {
        Self {
            events,
            gaps: Vec::new(),
        }
    }
}

/// Interns view names so an event costs an `Arc` clone, not a `String`.
#[derive(Debug, Default)]
pub(crate) struct ViewNames {
    names: HashSet<Arc<str>>,
}

/// Most view names an instance keeps interned: past it they start over, so that a guest
/// publishing to ever new views (a pattern's) costs a hash lookup per event and bounded memory.
const MAX_INTERNED: usize = 4096;

impl ViewNames {
    fn get(&mut self, view: &[u8]) -> Result<Arc<str>, GuestError> {
        let name = std::str::from_utf8(view)
            .ok()
            .filter(|_| abi::is_valid_view(view))
            .ok_or_else(|| GuestError::InvalidView {
                view: String::from_utf8_lossy(view).into_owned(),
            })?;
        if let Some(name) = self.names.get(name) {
            return Ok(Arc::clone(name));
        }
        if self.names.len() >= MAX_INTERNED {
            self.names.clear();
        }
        let name: Arc<str> = Arc::from(name);
        self.names.insert(Arc::clone(&name));
        Ok(name)
    }
}

struct Reader {
    buf: Bytes,
    at: usize,
}

impl Reader {
    fn field(&mut self) -> Result<(usize, usize), GuestError> {
        let len = self
            .buf
            .get(self.at..self.at + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_le_bytes)
            .ok_or_else(|| GuestError::Protocol("output buffer truncated".into()))?
            as usize;
        let start = self.at + 4;
        let end = start
            .checked_add(len)
            .filter(|&end| end <= self.buf.len())
            .ok_or_else(|| GuestError::Protocol("output field runs past the buffer".into()))?;
        self.at = end;
        Ok((start, end))
    }

    /// The field at `start..end` as text.
    fn utf8<T: for<'a> From<&'a str>>(
        &self,
        start: usize,
        end: usize,
        what: &str,
    ) -> Result<T, GuestError> {
        std::str::from_utf8(&self.buf[start..end])
            .map(T::from)
            .map_err(|_| GuestError::Protocol(format!("{what} is not UTF-8")))
    }
}

/// Most bytes of a gap reason that are kept. A reason says why input was skipped, to an
/// operator reading a receipt or a log: a longer one is cut at the last whole character within
/// this many bytes and marked, `… (cut from N bytes)`, rather than refusing the batch (whose
/// events are fine) or carrying megabytes into every receipt and record.
pub const MAX_GAP_REASON: usize = 1024;

/// `whole` (UTF-8, at most [`MAX_GAP_REASON`] bytes) of a reason of `size` bytes, marked as cut.
fn cut_reason(whole: &[u8], size: usize) -> String {
    format!(
        "{}… (cut from {size} bytes)",
        String::from_utf8_lossy(whole)
    )
}

/// How many characters of a refused key an error shows.
const SHOWN_KEY_CHARS: usize = 32;

/// The start of a refused key, to name it in an error without carrying all of it.
fn shown(key: &[u8]) -> String {
    let head = &key[..key.len().min(4 * SHOWN_KEY_CHARS)];
    let text = String::from_utf8_lossy(head);
    let mut shown: String = text.chars().take(SHOWN_KEY_CHARS).collect();
    if shown.len() < key.len() {
        shown.push('…');
    }
    shown
}

/// How many events `buf` holds, at most: its records' tags, read past their fields as the
/// decode reads them but without checking them (the decode does), to size the events once.
fn count_events(buf: &Bytes) -> usize {
    let mut r = Reader {
        buf: buf.clone(),
        at: 0,
    };
    let mut events = 0;
    while let Some(&tag) = r.buf.get(r.at) {
        let fields = match tag {
            abi::TAG_UPDATE => 3,
            abi::TAG_DELETE => 2,
            abi::TAG_GAP => 1,
            _ => return events,
        };
        r.at += 1;
        for _ in 0..fields {
            if r.field().is_err() {
                return events;
            }
        }
        events += usize::from(tag != abi::TAG_GAP);
    }
    events
}

/// Decodes an output buffer, enforcing the event size limit.
pub(crate) fn decode(
    buf: Bytes,
    views: &mut ViewNames,
    max_event_bytes: usize,
) -> Result<GuestBatch, GuestError> {
    let mut batch = GuestBatch {
        events: Vec::with_capacity(count_events(&buf)),
        gaps: Vec::new(),
    };
    let mut r = Reader { buf, at: 0 };
    while let Some(&tag) = r.buf.get(r.at) {
        r.at += 1;
        match tag {
            abi::TAG_UPDATE | abi::TAG_DELETE => {
                let (vs, ve) = r.field()?;
                let view = views.get(&r.buf[vs..ve])?;
                let (ks, ke) = r.field()?;
                if ke - ks > max_event_bytes {
                    return Err(GuestError::KeyTooLarge {
                        view: view.to_string(),
                        key: shown(&r.buf[ks..ke]),
                        size: ke - ks,
                        limit: max_event_bytes,
                    });
                }
                let key: CompactString = r.utf8(ks, ke, "key")?;
                let (kind, payload) = if tag == abi::TAG_UPDATE {
                    let (ps, pe) = r.field()?;
                    if pe - ps > max_event_bytes {
                        return Err(GuestError::EventTooLarge {
                            view: view.to_string(),
                            key: key.into(),
                            size: pe - ps,
                            limit: max_event_bytes,
                        });
                    }
                    (EventKind::Update, r.buf.slice(ps..pe))
                } else {
                    (EventKind::Delete, Bytes::new())
                };
                batch
                    .events
                    .push(GuestEvent::unsettled(view, key, kind, payload));
            }
            abi::TAG_GAP => {
                let (start, end) = r.field()?;
                let cut = end.min(start + MAX_GAP_REASON);
                let reason: String = match std::str::from_utf8(&r.buf[start..cut]) {
                    Ok(reason) if cut == end => reason.to_owned(),
                    // Cut at the last whole character: the bytes past it are checked no more.
                    Err(error) if cut < end && error.error_len().is_none() => {
                        let whole = &r.buf[start..start + error.valid_up_to()];
                        cut_reason(whole, end - start)
                    }
                    Ok(whole) => cut_reason(whole.as_bytes(), end - start),
                    Err(_) => {
                        return Err(GuestError::Protocol("gap reason is not UTF-8".into()));
                    }
                };
                batch.gaps.push(reason);
            }
            other => {
                return Err(GuestError::Protocol(format!(
                    "unknown output record tag {other}"
                )))
            }
        }
    }
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(out: &mut Vec<u8>, tag: u8, fields: &[&str]) {
        out.push(tag);
        for field in fields {
            out.extend_from_slice(&(field.len() as u32).to_le_bytes());
            out.extend_from_slice(field.as_bytes());
        }
    }

    #[test]
    fn events_are_counted_before_they_are_decoded() {
        let mut out = Vec::new();
        record(&mut out, abi::TAG_GAP, &["lost"]);
        record(&mut out, abi::TAG_UPDATE, &["v", "a", "1"]);
        record(&mut out, abi::TAG_DELETE, &["v", "a"]);
        record(&mut out, abi::TAG_UPDATE, &["w", "b", "{}"]);
        assert_eq!(count_events(&Bytes::from(out.clone())), 3);
        let batch = decode(Bytes::from(out.clone()), &mut ViewNames::default(), 1 << 20).unwrap();
        assert_eq!((batch.events.len(), batch.events.capacity()), (3, 3));
        // Broken buffers are the decode's to refuse; the count stops where it cannot read on.
        let mut truncated = out.clone();
        truncated.extend_from_slice(&[abi::TAG_UPDATE, 1, 0]);
        assert_eq!(count_events(&Bytes::from(truncated)), 3);
        let mut unknown = out.clone();
        record(&mut unknown, 0xee, &[]);
        record(&mut unknown, abi::TAG_DELETE, &["v", "a"]);
        assert_eq!(count_events(&Bytes::from(unknown)), 3);
        let huge = [abi::TAG_UPDATE, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(count_events(&Bytes::copy_from_slice(&huge)), 0);
    }

    #[test]
    fn keys_are_bounded_like_payloads() {
        let decoded = |key: &str, limit: usize| {
            let mut out = Vec::new();
            record(&mut out, abi::TAG_UPDATE, &["v", key, "1"]);
            record(&mut out, abi::TAG_DELETE, &["v", key]);
            decode(Bytes::from(out), &mut ViewNames::default(), limit)
        };
        assert_eq!(decoded("abcd", 4).map(|b| b.events.len()).ok(), Some(2));
        let long = "k".repeat(2 << 20);
        match decoded(&long, 1 << 20) {
            Err(GuestError::KeyTooLarge {
                view,
                key,
                size,
                limit,
            }) => {
                assert_eq!((view.as_str(), size, limit), ("v", 2 << 20, 1 << 20));
                assert_eq!(key, format!("{}…", "k".repeat(SHOWN_KEY_CHARS)));
            }
            other => panic!("{other:?}"),
        }
        let mut delete = Vec::new();
        record(&mut delete, abi::TAG_DELETE, &["v", "abcde"]);
        let refused = decode(Bytes::from(delete), &mut ViewNames::default(), 4);
        assert!(matches!(
            refused,
            Err(GuestError::KeyTooLarge { size: 5, .. })
        ));
    }

    #[test]
    fn long_gap_reasons_are_cut_at_a_character_and_marked() {
        let gaps = |reason: &[u8]| {
            let mut out = vec![abi::TAG_GAP];
            out.extend_from_slice(&(reason.len() as u32).to_le_bytes());
            out.extend_from_slice(reason);
            decode(Bytes::from(out), &mut ViewNames::default(), 1).map(|b| b.gaps)
        };
        let short = "lost 3..7".as_bytes();
        assert_eq!(gaps(short).ok(), Some(vec!["lost 3..7".to_owned()]));
        let exact = "x".repeat(MAX_GAP_REASON);
        assert_eq!(gaps(exact.as_bytes()).ok(), Some(vec![exact.clone()]));
        // A megabyte of `é` (two bytes each): cut after the last whole one within the bound.
        let long = "é".repeat(1 << 19);
        let kept = gaps(long.as_bytes()).expect("a long reason is kept, cut");
        let kept_text = "é".repeat(MAX_GAP_REASON / 2);
        assert_eq!(
            kept,
            vec![format!("{kept_text}… (cut from {} bytes)", 1 << 20)]
        );
        let odd = format!("x{long}");
        let kept = gaps(odd.as_bytes()).expect("cut mid-character");
        let kept_text = format!("x{}", "é".repeat(MAX_GAP_REASON / 2 - 1));
        assert_eq!(
            kept,
            vec![format!("{kept_text}… (cut from {} bytes)", odd.len())]
        );
        // Bytes that are not UTF-8 within the kept part are still an ABI breach.
        let mut broken = vec![0xff];
        broken.extend_from_slice(&[b'x'; 2 * MAX_GAP_REASON]);
        assert!(matches!(gaps(&broken), Err(GuestError::Protocol(_))));
        assert!(matches!(gaps(&[0xff]), Err(GuestError::Protocol(_))));
    }

    #[test]
    fn lone_surrogates_are_found_in_json_text() {
        for lone in [
            r#"{"a":"\ud800"}"#,
            r#"["\uDC00x"]"#,
            r#""\ud83d\u0041""#,
            r#""\ud83d""#,
            r#"{"a":"\ud83d\ude00","b":"\udbff"}"#,
            r#""\\\ud800""#,
        ] {
            assert!(lone_surrogate(lone.as_bytes()), "{lone}");
            assert!(
                serde_json::from_str::<serde_json::Value>(lone).is_err(),
                "{lone}"
            );
        }
        for whole in [
            r#"{"a":"\ud83d\ude00"}"#,
            r#""\\ud800""#,
            r#""\u0041\n\"\\""#,
            r#"{"a":"é😀"}"#,
            "1",
        ] {
            assert!(!lone_surrogate(whole.as_bytes()), "{whole}");
            assert!(
                serde_json::from_str::<serde_json::Value>(whole).is_ok(),
                "{whole}"
            );
        }
    }

    use proptest::prelude::*;

    /// An output buffer: records of every tag, fields whose declared lengths may lie, and
    /// bytes of any kind between them.
    fn buffers() -> impl Strategy<Value = Vec<u8>> {
        let field = prop_oneof![
            prop::sample::select(vec!["v", "w.x", "", "bad view", "k", "{}", "1"])
                .prop_map(|text| text.as_bytes().to_vec()),
            prop::collection::vec(any::<u8>(), 0..6),
        ];
        let length = prop_oneof![
            4 => Just(None),
            1 => any::<u32>().prop_map(Some),
        ];
        let record = (
            prop::sample::select(vec![
                abi::TAG_UPDATE,
                abi::TAG_DELETE,
                abi::TAG_GAP,
                0,
                0xee,
            ]),
            prop::collection::vec((field, length), 0..4),
        )
            .prop_map(|(tag, fields)| {
                let mut out = vec![tag];
                for (field, declared) in fields {
                    let len = declared.unwrap_or(field.len() as u32);
                    out.extend_from_slice(&len.to_le_bytes());
                    out.extend_from_slice(&field);
                }
                out
            });
        prop_oneof![
            prop::collection::vec(record, 0..6).prop_map(|records| records.concat()),
            prop::collection::vec(any::<u8>(), 0..64),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// Whatever a guest leaves in its output buffer: no panic; a buffer that decodes has
        /// as many events as were counted, each view a valid name, each update's payload
        /// within the limit.
        /// On JSON text, the scan agrees with serde_json's reading of strings.
        #[test]
        fn lone_surrogates_are_what_serde_json_refuses(units in prop::collection::vec(
            prop_oneof![Just(0xd83du16), Just(0xde00), Just(0x41), Just(0x5c), 0xd7f0u16..0xe010],
            0..6,
        )) {
            let text: String = units.iter().map(|unit| format!("\\u{unit:04x}")).collect();
            let json = format!("\"{text}\"");
            prop_assert_eq!(
                lone_surrogate(json.as_bytes()),
                serde_json::from_str::<String>(&json).is_err(),
                "{}", json
            );
        }

        #[test]
        fn any_output_buffer_decodes_or_is_refused(buf in buffers(), limit in 0usize..8) {
            let counted = count_events(&Bytes::from(buf.clone()));
            if let Ok(batch) = decode(Bytes::from(buf), &mut ViewNames::default(), limit) {
                prop_assert_eq!(batch.events.len(), counted);
                for event in &batch.events {
                    prop_assert!(!event.view.is_empty() && event.view.len() <= 128);
                    prop_assert!(event.payload.len() <= limit);
                    prop_assert!(event.key.len() <= limit);
                }
            }
        }
    }
}
