//! `ticker`: the embedded demo runtime of viewtape.
//!
//! Input: NDJSON, one tick per line: `{"symbol":"ACME","price":12.5,"seq":7}`.
//! Output: view `prices`, key = the symbol, payload = the tick as normalized JSON (fields in
//! the order `symbol`, `price`, `seq`, no whitespace, unknown fields dropped).
//!
//! - A malformed line rejects the whole batch; the error names the line number (1-based
//!   within the batch).
//! - `seq` is the feed's sequence number. A jump (`seq > last + 1`) reports a gap naming the
//!   missing range; a tick with `seq <= last` was already seen (a redelivery) and is skipped,
//!   with a log line saying how many were. A jump of more than [`MAX_SEQ_JUMP`] rejects the batch:
//!   one bad `seq` (say `18446744073709551615`) would otherwise make every later tick look like
//!   a redelivery, and the feed would be skipped for good.
//! - State: the last `seq` seen.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use viewtape_guest::schemars::JsonSchema;
use viewtape_guest::{export_runtime, Context, Error, Level, Result, Runtime, Schemas};

/// The view this runtime publishes into.
pub const VIEW: &str = "prices";

/// The largest `seq` jump accepted (a gap of up to a million ticks).
pub const MAX_SEQ_JUMP: u64 = 1_000_000;

/// One tick, as read and as published: the schema of the `prices` view's values.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[schemars(crate = "viewtape_guest::schemars", deny_unknown_fields)]
pub struct Tick<'a> {
    /// The instrument, e.g. `ACME`.
    #[serde(borrow)]
    #[schemars(length(min = 1))]
    pub symbol: Cow<'a, str>,
    /// The price.
    pub price: f64,
    /// The feed's sequence number.
    pub seq: u64,
}

impl Tick<'_> {
    /// Appends the tick as its normalized JSON: what `serde_json` makes of it, with the field
    /// names written as they are instead of escaped for every tick (an eighth of the
    /// guest's time went on that).
    pub fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        out.extend_from_slice(b"{\"symbol\":");
        serde_json::to_writer(&mut *out, &self.symbol)?;
        out.extend_from_slice(b",\"price\":");
        serde_json::to_writer(&mut *out, &self.price)?;
        out.extend_from_slice(b",\"seq\":");
        serde_json::to_writer(&mut *out, &self.seq)?;
        out.push(b'}');
        Ok(())
    }
}

/// The lines of `input`, as `split` on `\n` gives them, found with `memchr`: a word at a time,
/// where a byte loop is a fuel check per byte.
fn lines(input: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    memchr::memchr_iter(b'\n', input)
        .chain(std::iter::once(input.len()))
        .map(move |end| {
            let line = &input[start..end];
            start = end + 1;
            line
        })
}

/// The runtime: remembers the last sequence number.
#[derive(Debug, Default)]
pub struct Ticker {
    last_seq: Option<u64>,
}

impl Ticker {
    /// The last sequence number seen, if any.
    pub fn last_seq(&self) -> Option<u64> {
        self.last_seq
    }
}

impl Runtime for Ticker {
    fn init(_config: &[u8]) -> Result<Self> {
        Ok(Self::default())
    }

    fn schemas(&self) -> Schemas {
        Schemas::new().view::<Tick<'_>>(VIEW)
    }

    fn on_batch(&mut self, input: &[u8], ctx: &mut Context) -> Result<()> {
        let mut skipped = 0u64;
        for (index, line) in lines(input).enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let tick: Tick<'_> = serde_json::from_slice(line).map_err(|e| {
                // serde counts lines within this one line; say the column only.
                let text = e.to_string();
                let reason = text.split(" at line ").next().unwrap_or(&text);
                Error::msg(format!(
                    "line {}, column {}: malformed tick: {reason}",
                    index + 1,
                    e.column()
                ))
            })?;
            if tick.symbol.is_empty() {
                return Err(Error::msg(format!("line {}: empty symbol", index + 1)));
            }
            if !tick.price.is_finite() {
                return Err(Error::msg(format!(
                    "line {}: price is not finite",
                    index + 1
                )));
            }
            match self.last_seq {
                Some(last) if tick.seq <= last => {
                    skipped += 1;
                    continue;
                }
                Some(last) if tick.seq - last > MAX_SEQ_JUMP => {
                    return Err(Error::msg(format!(
                        "line {}: seq {} is {} ahead of the last seq {last}; more than {MAX_SEQ_JUMP} \
                         ahead is refused, so that one bad seq cannot make every later tick look \
                         already seen",
                        index + 1,
                        tick.seq,
                        tick.seq - last
                    )));
                }
                Some(last) if tick.seq > last + 1 => ctx.report_gap(&format!(
                    "ticker seq jumped from {last} to {}: {} tick(s) missing",
                    tick.seq,
                    tick.seq - last - 1
                )),
                _ => {}
            }
            self.last_seq = Some(tick.seq);
            ctx.publish_with(VIEW, &tick.symbol, |buf| tick.write_json(buf))
                .map_err(|e| Error::msg(format!("line {}: {e}", index + 1)))?;
        }
        if skipped > 0 {
            ctx.log(
                Level::Info,
                &format!("skipped {skipped} tick(s) already seen (seq at or below the last)"),
            );
        }
        Ok(())
    }

    fn save(&self) -> Vec<u8> {
        self.last_seq
            .map(|s| s.to_string())
            .unwrap_or_default()
            .into_bytes()
    }

    fn restore(&mut self, state: &[u8]) -> Result<()> {
        self.last_seq = if state.is_empty() {
            None
        } else {
            let text = std::str::from_utf8(state).map_err(Error::msg)?;
            Some(
                text.parse()
                    .map_err(|e| Error::msg(format!("bad ticker state: {e}")))?,
            )
        };
        Ok(())
    }
}

export_runtime!(Ticker);

#[cfg(test)]
mod tests {
    use super::*;
    use viewtape_guest::{testing::Harness, Output};

    #[test]
    fn publishes_normalized_json_keyed_by_symbol() {
        let mut h = Harness::<Ticker>::new(b"").unwrap().declare_views(&[VIEW]);
        let out = h
            .batch(b"{ \"seq\": 1, \"price\": 12.5, \"symbol\": \"ACME\", \"x\": 0 }\n")
            .unwrap();
        assert_eq!(
            out,
            vec![Output::Update {
                view: "prices".into(),
                key: "ACME".into(),
                payload: br#"{"symbol":"ACME","price":12.5,"seq":1}"#.to_vec(),
            }]
        );
    }

    #[test]
    fn lines_are_what_split_gives() {
        let long = "{\"symbol\":\"A\",\"price\":1,\"seq\":1}\n".repeat(40);
        for input in [
            "",
            "\n",
            "a",
            "a\n",
            "\na",
            "a\n\nb",
            "a\r\nb\n\n",
            &long[..],
        ] {
            let input = input.as_bytes();
            assert_eq!(
                lines(input).collect::<Vec<_>>(),
                input.split(|&b| b == b'\n').collect::<Vec<_>>(),
                "{input:?}"
            );
        }
    }

    #[test]
    fn writes_what_serde_json_writes() {
        let ticks = [
            ("ACME", 12.5, 1),
            ("Ünï \"quoted\" \\ \u{1}\n", -0.0, u64::MAX),
            ("x", 1e300, 0),
            ("y", 5e-324, 7),
            ("z", 100.0, 42),
        ];
        for (symbol, price, seq) in ticks {
            let tick = Tick {
                symbol: symbol.into(),
                price,
                seq,
            };
            let mut written = Vec::new();
            tick.write_json(&mut written).unwrap();
            assert_eq!(
                String::from_utf8(written).unwrap(),
                serde_json::to_string(&tick).unwrap()
            );
        }
    }

    #[test]
    fn declares_the_schema_of_a_tick() {
        let h = Harness::<Ticker>::new(b"").unwrap();
        let schemas = h.schemas();
        let schema: serde_json::Value = serde_json::from_str(schemas.get(VIEW).unwrap()).unwrap();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(
            schema["required"],
            serde_json::json!(["symbol", "price", "seq"])
        );
        assert_eq!(schema["properties"]["symbol"]["minLength"], 1);
        assert_eq!(schema["properties"]["price"]["type"], "number");
        assert_eq!(schema["properties"]["seq"]["type"], "integer");
    }

    #[test]
    fn malformed_line_rejects_batch_with_line_number() {
        let mut h = Harness::<Ticker>::new(b"").unwrap().declare_views(&[VIEW]);
        let err = h
            .batch(b"{\"symbol\":\"A\",\"price\":1,\"seq\":1}\n\nnope\n")
            .unwrap_err();
        assert!(
            err.message()
                .starts_with("line 3, column 2: malformed tick"),
            "{err}"
        );
        assert!(
            !err.message().contains("line 1"),
            "no second line number: {err}"
        );
        assert_eq!(h.runtime().last_seq(), None, "rolled back");
    }

    #[test]
    fn seq_jump_reports_gap_and_redelivery_is_skipped() {
        let mut h = Harness::<Ticker>::new(b"").unwrap().declare_views(&[VIEW]);
        h.batch(b"{\"symbol\":\"A\",\"price\":1,\"seq\":1}")
            .unwrap();
        let out = h
            .batch(b"{\"symbol\":\"A\",\"price\":1,\"seq\":1}\n{\"symbol\":\"A\",\"price\":2,\"seq\":5}")
            .unwrap();
        assert!(matches!(&out[0], Output::Gap { reason } if reason.contains("3 tick(s) missing")));
        assert_eq!(out.len(), 2);
        assert_eq!(h.runtime().save(), b"5");
        let state = h.save();
        h.restore(&state).unwrap();
        assert_eq!(h.runtime().last_seq(), Some(5));
    }

    #[test]
    fn one_wild_seq_cannot_wedge_the_feed() {
        let mut h = Harness::<Ticker>::new(b"").unwrap().declare_views(&[VIEW]);
        h.batch(b"{\"symbol\":\"A\",\"price\":1,\"seq\":1}")
            .unwrap();
        let err = h
            .batch(b"{\"symbol\":\"A\",\"price\":1,\"seq\":18446744073709551615}")
            .unwrap_err();
        assert!(
            err.to_string().contains("line 1: seq 18446744073709551615"),
            "{err}"
        );
        assert_eq!(h.runtime().last_seq(), Some(1), "rolled back");
        let out = h
            .batch(b"{\"symbol\":\"A\",\"price\":2,\"seq\":2}")
            .unwrap();
        assert_eq!(out.len(), 1, "the feed goes on: {out:?}");
    }
}
