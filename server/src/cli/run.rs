//! `viewtape run GUEST.wasm` (or `GUEST.js`): a guest module, in the real host with the real limits, over
//! recorded input — batch by batch, as the server would run it, without a server.
//!
//! Input is read from a reader (stdin), split into batches of `batch_lines` lines. Every
//! outcome is one NDJSON line on the writer (stdout):
//!
//! ```text
//! {"batch":1,"update":{"view":"prices","key":"ACME","value":{…}}}
//! {"batch":1,"delete":{"view":"prices","key":"ACME"}}
//! {"batch":2,"gap":"ticker seq jumped from 3 to 9: 5 tick(s) missing"}
//! {"batch":3,"error":"runtime `run`: guest rejected the batch: line 2, column 1: …"}
//! {"state_bytes":12}
//! ```
//!
//! A failed batch is handled as the server handles it: nothing of it counts, and the guest is
//! re-instantiated from its state after the last good batch; the run goes on, and its [`Ran`]
//! counts the failed batches (`viewtape run` then exits 1). The guest's log lines go to stderr
//! (`RUST_LOG=debug` shows them all). `--save-state FILE` writes the final state, which
//! `--state FILE` reads back.

use std::io::{BufRead, Write};

use std::sync::Arc;

use bytes::Bytes;

use crate::host::{EngineConfig, EventKind, GuestEngine, GuestEvent, GuestModule, Limits};
use crate::hub::frame;
use crate::log::unix_ms_now;
use crate::runtime::guest::{Fit, GuestSlot, SlotError, Typing};

/// How to run.
#[derive(Debug)]
pub struct RunOptions {
    /// The module's bytes.
    pub wasm: Vec<u8>,
    /// The bytes handed to the guest's `init`.
    pub config: Vec<u8>,
    /// A saved state to start from.
    pub state: Option<Vec<u8>>,
    /// Input lines per batch.
    pub batch_lines: usize,
    /// The ingest time of every batch (Unix ms); `None`: the clock when it runs.
    pub batch_time: Option<u64>,
    /// The limits, as `[runtime.limits]` would give them.
    pub limits: Limits,
}

/// What a run did.
#[derive(Debug)]
pub struct Ran {
    /// The final saved state.
    pub state: Bytes,
    /// Batches run.
    pub batches: u64,
    /// Batches that failed (each reported on the output); none counted.
    pub failed: u64,
}

/// Runs the guest over `input`, writing NDJSON to `out`; returns the final saved state and how
/// many batches failed.
///
/// # Errors
/// The module does not load or its `init`/`restore` fails, or reading or writing fails. A
/// failed batch is reported on `out` and counted in [`Ran::failed`], not returned.
pub async fn run(
    options: RunOptions,
    input: impl BufRead,
    out: &mut impl Write,
) -> anyhow::Result<Ran> {
    let engine = GuestEngine::new(EngineConfig {
        pooled_instances: 0,
        cache_dir: crate::host::cache_dir(crate::host::user_cache_dir),
        ..EngineConfig::default()
    })?;
    let module = GuestModule::new(&engine, &options.wasm)?;
    let mut last_good = options.state.map(Bytes::from).unwrap_or_default();
    let slot = GuestSlot::new(
        module,
        Arc::from("run"),
        options.limits,
        Bytes::from(options.config),
        Typing::default(),
        Some(&last_good[..]),
        Arc::default(),
    )
    .await?;
    let mut lines = input.lines();
    let mut batch_number = 0u64;
    let mut failed = 0u64;
    loop {
        let mut batch = String::new();
        for _ in 0..options.batch_lines.max(1) {
            match lines.next() {
                Some(line) => {
                    batch.push_str(&line?);
                    batch.push('\n');
                }
                None => break,
            }
        }
        if batch.is_empty() {
            break;
        }
        batch_number += 1;
        match slot
            .run(
                batch.as_bytes(),
                options.batch_time.unwrap_or_else(unix_ms_now),
                &mut last_good,
                Fit::Check,
            )
            .await
        {
            Ok(output) => {
                for reason in &output.gaps {
                    emit(
                        out,
                        serde_json::json!({ "batch": batch_number, "gap": reason }),
                    )?;
                }
                for event in &output.events {
                    let line = match event.kind {
                        EventKind::Update => serde_json::json!({ "batch": batch_number, "update": {
                            "view": &*event.view,
                            "key": event.key,
                            "value": value(event),
                        }}),
                        EventKind::Delete => serde_json::json!({ "batch": batch_number, "delete": {
                            "view": &*event.view,
                            "key": event.key,
                        }}),
                    };
                    emit(out, line)?;
                }
            }
            Err(SlotError::Failed(error)) => {
                failed += 1;
                emit(
                    out,
                    serde_json::json!({ "batch": batch_number, "error": error.to_string() }),
                )?;
            }
            Err(SlotError::Unavailable(error)) => return Err(error.into()),
        }
    }
    // Without a state (none given, nothing ran): the one the guest's `init` made.
    let state = match last_good.is_empty() {
        true => slot.saved(&last_good).await?,
        false => last_good,
    };
    emit(out, serde_json::json!({ "state_bytes": state.len() }))?;
    Ok(Ran {
        state,
        batches: batch_number,
        failed,
    })
}

/// A payload as clients see it: the value of the frame the server would send.
fn value(event: &GuestEvent) -> serde_json::Value {
    frame::event(None, event)
        .value_json()
        .and_then(|value| serde_json::from_slice(&value).ok())
        .unwrap_or_default()
}

fn emit(out: &mut impl Write, line: serde_json::Value) -> std::io::Result<()> {
    writeln!(out, "{line}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::guests;

    async fn ticker(input: &str, state: Option<Vec<u8>>) -> (Vec<serde_json::Value>, Ran) {
        run_lines(guests::TICKER_WASM, b"", input, state).await
    }

    async fn run_lines(
        wasm: &[u8],
        config: &[u8],
        input: &str,
        state: Option<Vec<u8>>,
    ) -> (Vec<serde_json::Value>, Ran) {
        let options = RunOptions {
            wasm: wasm.to_vec(),
            config: config.to_vec(),
            state,
            batch_lines: 2,
            batch_time: None,
            limits: Limits::default(),
        };
        let mut out = Vec::new();
        let ran = run(options, input.as_bytes(), &mut out).await.unwrap();
        let lines = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (lines, ran)
    }

    #[tokio::test]
    async fn runs_batch_by_batch_reports_errors_and_rolls_back_like_the_server() {
        let input =
            "{\"symbol\":\"A\",\"price\":1,\"seq\":1}\n{\"symbol\":\"B\",\"price\":2,\"seq\":2}\n\
                     {\"symbol\":\"A\",\"price\":3,\"seq\":3}\nnope\n\
                     {\"symbol\":\"A\",\"price\":4,\"seq\":6}\n";
        let (lines, ran) = ticker(input, None).await;
        // Three batches of two lines; the second failed, and the run went on.
        assert_eq!((ran.batches, ran.failed), (3, 1));
        let state = ran.state;
        assert_eq!(lines[0]["update"]["key"], "A");
        assert_eq!(lines[1]["update"]["value"]["price"], 2.0);
        assert_eq!(lines[2]["batch"], 2);
        assert!(
            lines[2]["error"].as_str().unwrap().contains("line 2"),
            "{lines:?}"
        );
        // Batch 2 rolled back: seq 3 never counted, so 6 is a jump from 2.
        assert!(
            lines[3]["gap"].as_str().unwrap().contains("from 2 to 6"),
            "{lines:?}"
        );
        assert_eq!(lines[4]["update"]["value"]["seq"], 6);
        assert_eq!(crate::host::guests::saved_state(&state), b"6");
        // Starting from the saved state: a redelivery is skipped.
        let (lines, _) = ticker(
            "{\"symbol\":\"A\",\"price\":4,\"seq\":6}\n",
            Some(state.to_vec()),
        )
        .await;
        assert_eq!(lines, [serde_json::json!({ "state_bytes": state.len() })]);
    }

    #[tokio::test]
    async fn values_are_checked_against_the_guests_schemas_as_the_server_checks_them() {
        let config = br#"schema counts {"type":"integer","minimum":0}"#;
        // Batches of two lines: the second publishes a value below the minimum.
        let input = "publish counts a 1\npublish counts a 2\n\
                     publish counts b 5\npublish counts b -1\n\
                     publish counts c 3\n";
        let lines = run_lines(guests::MISBEHAVE_WASM, config, input, None)
            .await
            .0;
        assert_eq!(lines[1]["update"]["value"], 2);
        assert_eq!(lines[2]["batch"], 2);
        let error = lines[2]["error"].as_str().unwrap();
        assert!(
            error.contains("\"b\"") && error.contains("counts") && error.contains("minimum"),
            "{error}"
        );
        // The refused batch published nothing (not even b = 5); the next one runs.
        assert_eq!(lines[3]["update"]["key"], "c");
    }
}
