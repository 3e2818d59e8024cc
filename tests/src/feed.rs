//! Input for the embedded `ticker` guest, and cursor helpers.
//!
//! The ticker keeps one `seq` for the whole feed (not one per symbol): a tick with
//! `seq <= last` is a redelivery and is skipped, a jump reports a gap. [`Feed`] therefore
//! numbers ticks globally, 1, 2, 3, …, whatever their symbol.

use anyhow::{anyhow, Context as _};
use viewtape_journal::Cursor;

/// A generator of NDJSON ticks with a global, dense `seq`.
#[derive(Debug, Clone)]
pub struct Feed {
    symbols: Vec<String>,
    next_seq: u64,
}

impl Feed {
    /// Ticks cycling over `symbols`, starting at `seq` 1.
    pub fn new(symbols: &[&str]) -> Self {
        Self {
            symbols: symbols.iter().map(|s| (*s).to_owned()).collect(),
            next_seq: 1,
        }
    }

    /// The `seq` the next tick will carry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Skips `n` sequence numbers (the next batch then makes the guest report a gap).
    pub fn skip(&mut self, n: u64) {
        self.next_seq += n;
    }

    /// Continues at `seq` (e.g. after a restart that lost the guest's state).
    pub fn set_next_seq(&mut self, seq: u64) {
        self.next_seq = seq;
    }

    /// The symbol a tick with this `seq` carries.
    pub fn symbol_of(&self, seq: u64) -> &str {
        let n = self.symbols.len().max(1) as u64;
        self.symbols
            .get(((seq.saturating_sub(1)) % n) as usize)
            .map_or("ACME", String::as_str)
    }

    /// One tick line (with its `\n`) and advances.
    pub fn line(&mut self) -> String {
        let seq = self.next_seq;
        self.next_seq += 1;
        tick(self.symbol_of(seq), price_of(seq), seq)
    }

    /// `n` tick lines.
    pub fn batch(&mut self, n: usize) -> String {
        (0..n).map(|_| self.line()).collect()
    }
}

/// A deterministic price for a `seq` (exact in binary floating point).
pub fn price_of(seq: u64) -> f64 {
    (seq % 10_000) as f64 / 4.0 + 1.0
}

/// One NDJSON tick line, newline included.
pub fn tick(symbol: &str, price: f64, seq: u64) -> String {
    format!("{{\"symbol\":\"{symbol}\",\"price\":{price},\"seq\":{seq}}}\n")
}

/// Parses a cursor text (`<16 hex>-<offset>`).
///
/// # Errors
/// When it is not one.
pub fn parse_cursor(text: &str) -> anyhow::Result<Cursor> {
    text.parse()
        .map_err(|e| anyhow!("{text:?} is not a cursor: {e}"))
}

/// The offset of a cursor text.
///
/// # Errors
/// When it is not a cursor.
pub fn cursor_offset(text: &str) -> anyhow::Result<u64> {
    parse_cursor(text).map(|c| c.offset().get())
}

/// Finds `"seq":N` in a ticker payload without a JSON parser (the bench's hot path).
pub fn scan_seq(data: &str) -> Option<u64> {
    let at = data.find("\"seq\":")? + 6;
    let digits = data[at..]
        .trim_start()
        .bytes()
        .take_while(u8::is_ascii_digit)
        .count();
    let start = at + (data[at..].len() - data[at..].trim_start().len());
    data[start..start + digits].parse().ok()
}

/// The `seq` of an update event's JSON data `{"key":…,"value":{…,"seq":N}}`.
///
/// # Errors
/// When the data has no numeric `value.seq`.
pub fn event_seq(data: &serde_json::Value) -> anyhow::Result<u64> {
    data.get("value")
        .and_then(|v| v.get("seq"))
        .and_then(serde_json::Value::as_u64)
        .with_context(|| format!("no value.seq in {data}"))
}

/// Ingest bodies for the `misbehave` fixture that fill its view `big` with `keys` values of
/// `size` bytes each, every body under the server's default 1 MiB limit.
pub fn big_state_batches(keys: usize, size: usize) -> Vec<String> {
    let payload = "x".repeat(size);
    let per_batch = (900 * 1024 / (size + 32)).max(1);
    (0..keys)
        .step_by(per_batch)
        .map(|start| {
            (start..keys.min(start + per_batch))
                .map(|k| format!("publish big k{k} {payload}\n"))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feed_is_global_and_parses_as_json() {
        let mut feed = Feed::new(&["A", "B"]);
        let batch = feed.batch(3);
        let lines: Vec<serde_json::Value> = batch
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["symbol"], "A");
        assert_eq!(lines[1]["symbol"], "B");
        assert_eq!(lines[2]["symbol"], "A");
        assert_eq!(lines[2]["seq"], 3);
        assert_eq!(feed.next_seq(), 4);
    }

    #[test]
    fn scans_seq() {
        assert_eq!(
            scan_seq(r#"{"key":"A","value":{"symbol":"A","price":1.5,"seq":42}}"#),
            Some(42)
        );
        assert_eq!(scan_seq(r#"{"seq": 7}"#), Some(7));
        assert_eq!(scan_seq(r#"{"key":"A"}"#), None);
    }

    #[test]
    fn cursor_helpers() {
        assert_eq!(cursor_offset("00f3a9c1d2e4b5a6-42").unwrap(), 42);
        assert!(cursor_offset("zzz").is_err());
    }
}
