//! `logstats`: log lines to per-service counts by level.
//!
//! Input: one log line per line, `<service> <level> <message…>`, e.g.
//! `checkout ERROR payment declined`. Levels: `error`, `warn`, `info`, `debug`, `trace` (any
//! case); anything else counts as `other`. The line `<service> retired` retires a service.
//!
//! Output, view `log-levels`, key = the service: once per batch for every service the batch
//! touched, its totals as JSON, e.g.
//! `{"service":"checkout","error":1,"warn":0,"info":3,"debug":0,"trace":0,"other":0,"total":4}`.
//! A retired service's key is deleted (and its counts forgotten).
//!
//! Unlike `ticker` (one event per input line), this runtime aggregates: a batch of 1,000 lines
//! about 3 services publishes 3 events.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use viewtape_guest::schemars::JsonSchema;
use viewtape_guest::{export_runtime, Context, Error, Result, Runtime, Schemas};

/// The view this runtime publishes into.
pub const VIEW: &str = "log-levels";

const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "other"];

/// A service's totals, as published (written by hand, in this field order): the schema of the
/// `log-levels` view's values.
#[derive(JsonSchema)]
#[schemars(crate = "viewtape_guest::schemars", deny_unknown_fields)]
#[allow(dead_code)] // only its schema is used
pub struct ServiceCounts {
    /// The service.
    service: String,
    /// Lines at `error`.
    error: u64,
    /// Lines at `warn`.
    warn: u64,
    /// Lines at `info`.
    info: u64,
    /// Lines at `debug`.
    debug: u64,
    /// Lines at `trace`.
    trace: u64,
    /// Lines at any other level.
    other: u64,
    /// Every line.
    total: u64,
}

/// The runtime: counts per service, by level (in the order of `LEVELS`).
#[derive(Debug, Default)]
pub struct LogStats {
    counts: BTreeMap<String, [u64; 6]>,
}

impl LogStats {
    /// The counts of `service`, in the order error, warn, info, debug, trace, other.
    pub fn counts(&self, service: &str) -> Option<[u64; 6]> {
        self.counts.get(service).copied()
    }
}

fn level_index(level: &str) -> usize {
    LEVELS[..5]
        .iter()
        .position(|l| l.eq_ignore_ascii_case(level))
        .unwrap_or(5)
}

fn valid_service(s: &str) -> bool {
    s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl Runtime for LogStats {
    fn init(_config: &[u8]) -> Result<Self> {
        Ok(Self::default())
    }

    fn schemas(&self) -> Schemas {
        Schemas::new().view::<ServiceCounts>(VIEW)
    }

    fn on_batch(&mut self, input: &[u8], ctx: &mut Context) -> Result<()> {
        let text = std::str::from_utf8(input)
            .map_err(|e| Error::msg(format!("input is not UTF-8: {e}")))?;
        let mut touched = BTreeSet::new();
        let mut retired = BTreeSet::new();
        for (index, line) in text.lines().enumerate() {
            let mut words = line.split_whitespace();
            let Some(service) = words.next() else {
                continue;
            };
            if !valid_service(service) {
                return Err(Error::msg(format!(
                    "line {}: service name {service:?} is not [A-Za-z0-9._-]{{1,128}}",
                    index + 1
                )));
            }
            let level = words.next().unwrap_or("");
            if level == "retired" && words.next().is_none() {
                self.counts.remove(service);
                touched.remove(service);
                retired.insert(service);
                continue;
            }
            retired.remove(service);
            self.counts.entry(service.to_owned()).or_default()[level_index(level)] += 1;
            touched.insert(service);
        }
        for service in retired {
            ctx.delete(VIEW, service);
        }
        for service in touched {
            let Some(counts) = self.counts.get(service) else {
                continue;
            };
            ctx.publish_with(VIEW, service, |buf| {
                let mut json = format!("{{\"service\":\"{service}\"");
                for (name, n) in LEVELS.iter().zip(counts) {
                    let _ = write!(json, ",\"{name}\":{n}");
                }
                let _ = write!(json, ",\"total\":{}}}", counts.iter().sum::<u64>());
                buf.extend_from_slice(json.as_bytes());
            });
        }
        Ok(())
    }

    fn save(&self) -> Vec<u8> {
        let mut out = String::new();
        for (service, counts) in &self.counts {
            out.push_str(service);
            for n in counts {
                let _ = write!(out, " {n}");
            }
            out.push('\n');
        }
        out.into_bytes()
    }

    fn restore(&mut self, state: &[u8]) -> Result<()> {
        let text = std::str::from_utf8(state).map_err(Error::msg)?;
        let mut counts = BTreeMap::new();
        for line in text.lines() {
            let mut words = line.split(' ');
            let service = words.next().ok_or("empty state line")?;
            let mut c = [0u64; 6];
            for slot in &mut c {
                *slot = words
                    .next()
                    .ok_or("short state line")?
                    .parse()
                    .map_err(Error::msg)?;
            }
            counts.insert(service.to_owned(), c);
        }
        self.counts = counts;
        Ok(())
    }
}

export_runtime!(LogStats);

#[cfg(test)]
mod tests {
    use super::*;
    use viewtape_guest::{testing::Harness, Output};

    #[test]
    fn counts_by_level_and_deletes_retired_services() {
        let mut h = Harness::<LogStats>::new(b"")
            .unwrap()
            .declare_views(&[VIEW]);
        let out = h
            .batch(b"api ERROR boom\napi info ok\nweb warn slow\napi INFO again\n")
            .unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[0],
            Output::Update {
                view: VIEW.into(),
                key: "api".into(),
                payload: br#"{"service":"api","error":1,"warn":0,"info":2,"debug":0,"trace":0,"other":0,"total":3}"#.to_vec(),
            }
        );
        let out = h.batch(b"web retired\n").unwrap();
        assert_eq!(
            out,
            vec![Output::Delete {
                view: VIEW.into(),
                key: "web".into()
            }]
        );
        assert_eq!(h.runtime().counts("web"), None);
        let state = h.save();
        h.restore(&state).unwrap();
        assert_eq!(h.runtime().counts("api"), Some([1, 0, 2, 0, 0, 0]));
    }

    #[test]
    fn the_declared_schema_names_every_published_field() {
        let mut h = Harness::<LogStats>::new(b"")
            .unwrap()
            .declare_views(&[VIEW]);
        let schema: serde_json::Value =
            serde_json::from_str(h.schemas().get(VIEW).unwrap()).unwrap();
        let Output::Update { payload, .. } = &h.batch(b"api warn x\n").unwrap()[0] else {
            panic!("an update");
        };
        let published: serde_json::Value = serde_json::from_slice(payload).unwrap();
        let fields: Vec<&String> = published.as_object().unwrap().keys().collect();
        let required: Vec<&str> = schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        let mut sorted = required.clone();
        sorted.sort_unstable();
        assert_eq!(fields, sorted, "serde_json sorts keys");
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["properties"]["total"]["type"], "integer");
    }

    #[test]
    fn bad_service_name_rejects_the_batch() {
        let mut h = Harness::<LogStats>::new(b"")
            .unwrap()
            .declare_views(&[VIEW]);
        let err = h
            .batch("ok info x\nbad/name info y\n".as_bytes())
            .unwrap_err();
        assert!(err.message().starts_with("line 2:"));
        assert_eq!(h.runtime().counts("ok"), None);
    }
}
