//! `json`: the built-in runtime behind `wasm = "builtin:json"` — a view without writing a guest.
//!
//! Input: NDJSON, one change per line:
//!
//! - `{"view": "orders", "key": "o-17", "value": {…}}` publishes the value, any JSON, as it is
//!   written (its text is not re-encoded);
//! - `{"view": "orders", "key": "o-17", "delete": true}` deletes the key;
//! - `"view"` may be left out when the config names a default view (`{"view": "orders"}`; the
//!   server gives a runtime of one view that one by itself).
//!
//! A line that is not such an object (an unknown field, no key, both a value and `delete`,
//! neither, no view and no default) rejects the whole batch, naming the line (1-based within the
//! batch). Blank lines are skipped. State: none — what it publishes is the views' state.
//!
//! Types come from the config's `schemas = { VIEW = "FILE.json" }`: the host checks every value
//! against its view's schema.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use viewtape_guest::{export_runtime, Context, Error, Result, Runtime};

/// The guest config: the view of lines that name none.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    view: Option<String>,
}

/// One input line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line<'a> {
    #[serde(borrow, default)]
    view: Option<Cow<'a, str>>,
    #[serde(borrow)]
    key: Cow<'a, str>,
    /// Present (`null` too) or not.
    #[serde(borrow, default, deserialize_with = "present")]
    value: Option<&'a RawValue>,
    #[serde(default)]
    delete: bool,
}

/// A field that is there, whatever its value (`null` is a value to publish, not an absence).
fn present<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(deserializer).map(Some)
}

/// The runtime: the default view, if any.
#[derive(Debug, Default)]
pub struct Json {
    view: Option<String>,
}

impl Json {
    /// One line, applied to `ctx`.
    fn apply(&self, line: Line<'_>, ctx: &mut Context) -> std::result::Result<(), String> {
        let view =
            match (&line.view, &self.view) {
                (Some(view), _) => view.as_ref(),
                (None, Some(view)) => view.as_str(),
                (None, None) => return Err(
                    "no \"view\", and the runtime has no default view (it declares more than one)"
                        .into(),
                ),
            };
        if line.key.is_empty() {
            return Err("empty \"key\"".into());
        }
        match (line.value, line.delete) {
            (Some(value), false) => {
                ctx.publish(view, &line.key, value.get().as_bytes());
                Ok(())
            }
            (None, true) => {
                ctx.delete(view, &line.key);
                Ok(())
            }
            (Some(_), true) => Err("both a \"value\" and \"delete\": true".into()),
            (None, false) => Err("neither a \"value\" nor \"delete\": true".into()),
        }
    }
}

impl Runtime for Json {
    fn init(config: &[u8]) -> Result<Self> {
        if config.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        let config: Config = serde_json::from_slice(config).map_err(|e| {
            Error::msg(format!(
                "config: {e}; expected {{\"view\": \"VIEW\"}} or nothing"
            ))
        })?;
        Ok(Self { view: config.view })
    }

    fn on_batch(&mut self, input: &[u8], ctx: &mut Context) -> Result<()> {
        for (index, line) in input.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let parsed: Line<'_> = serde_json::from_slice(line).map_err(|e| {
                let text = e.to_string();
                let reason = text.split(" at line ").next().unwrap_or(&text);
                Error::msg(format!(
                    "line {}, column {}: {reason}",
                    index + 1,
                    e.column()
                ))
            })?;
            self.apply(parsed, ctx)
                .map_err(|reason| Error::msg(format!("line {}: {reason}", index + 1)))?;
        }
        Ok(())
    }

    fn save(&self) -> Vec<u8> {
        Vec::new()
    }

    fn restore(&mut self, _state: &[u8]) -> Result<()> {
        Ok(())
    }
}

export_runtime!(Json);

#[cfg(test)]
mod tests {
    use super::*;
    use viewtape_guest::{testing::Harness, Output};

    fn update(view: &str, key: &str, payload: &str) -> Output {
        Output::Update {
            view: view.into(),
            key: key.into(),
            payload: payload.as_bytes().to_vec(),
        }
    }

    #[test]
    fn publishes_values_as_written_and_deletes() {
        let mut h = Harness::<Json>::new(b"")
            .unwrap()
            .declare_views(&["orders", "users"]);
        let out = h
            .batch(
                b"{\"view\":\"orders\",\"key\":\"o-1\",\"value\":{\"total\": 12.50, \"items\":[1,2]}}\r\n\
                  \n\
                  {\"view\":\"users\",\"key\":\"u-1\",\"value\":\"Ada\"}\n\
                  {\"view\":\"orders\",\"key\":\"o-1\",\"delete\":true}",
            )
            .unwrap();
        assert_eq!(
            out,
            vec![
                update("orders", "o-1", "{\"total\": 12.50, \"items\":[1,2]}"),
                update("users", "u-1", "\"Ada\""),
                Output::Delete {
                    view: "orders".into(),
                    key: "o-1".into()
                },
            ]
        );
    }

    #[test]
    fn a_default_view_serves_lines_without_one() {
        let mut h = Harness::<Json>::new(br#"{"view":"orders"}"#)
            .unwrap()
            .declare_views(&["orders"]);
        let out = h.batch(b"{\"key\":\"o-1\",\"value\":null}").unwrap();
        assert_eq!(out, vec![update("orders", "o-1", "null")]);
        assert!(Harness::<Json>::new(b"{\"views\":[]}").is_err());
    }

    #[test]
    fn a_bad_line_rejects_the_batch_naming_it() {
        for (line, needle) in [
            (r#"{"key":"a","value":1}"#, "no \"view\""),
            (r#"{"view":"orders","value":1}"#, "missing field `key`"),
            (r#"{"view":"orders","key":"","value":1}"#, "empty \"key\""),
            (r#"{"view":"orders","key":"a"}"#, "neither"),
            (
                r#"{"view":"orders","key":"a","value":1,"delete":true}"#,
                "both",
            ),
            (
                r#"{"view":"orders","key":"a","value":1,"x":2}"#,
                "unknown field `x`",
            ),
            (r#"{"view":"orders","key":"a","value":tru}"#, "column"),
            ("[1]", "line 2"),
        ] {
            let mut h = Harness::<Json>::new(b"")
                .unwrap()
                .declare_views(&["orders"]);
            let batch = format!("{{\"view\":\"orders\",\"key\":\"ok\",\"value\":1}}\n{line}");
            let error = h.batch(batch.as_bytes()).unwrap_err().to_string();
            assert!(error.contains("line 2"), "{line}: {error}");
            assert!(error.contains(needle), "{line}: {error}");
        }
        // A view the runtime does not declare: the host's refusal, as for any guest.
        let mut h = Harness::<Json>::new(b"")
            .unwrap()
            .declare_views(&["orders"]);
        let error = h
            .batch(br#"{"view":"nope","key":"a","value":1}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("does not declare"), "{error}");
    }
}
