//! Property test of the log's promise: through any sequence of acknowledged batches from two
//! runtimes, snapshots, graceful stops, crashes (everything dropped, no snapshot) — with a torn
//! write of an unacknowledged record left at the end of the log, or with a batch that was made
//! durable but never answered — and restarts through the server's own start-up
//! ([`crate::serve::start::start`]), the epoch never changes, every cursor ever served names one frame
//! only, every acknowledged batch is in the tape after every restart, and each runtime runs the
//! module last deployed to it (modules deployed without a restart are replayed where they took
//! over).
//!
//! The guests count their batches and publish the count, so a replay that ran on the wrong
//! guest state would produce another digest and fail closed (a fresh epoch), which the test
//! catches.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;

use crate::config::Config;
use crate::host::guests;
use crate::serve::start::{start, Started};

const RUNTIMES: [&str; 2] = ["a", "b"];
const VIEWS: [&str; 2] = ["v0", "v1"];

#[derive(Clone, Debug)]
enum Op {
    /// An acknowledged batch of `n` events from runtime `rt` into `view`.
    Ingest { rt: usize, view: usize, n: usize },
    /// A periodic snapshot.
    Snapshot,
    /// Graceful stop (exact snapshot), then a restart.
    Graceful,
    /// kill -9, then a restart; with `torn`, that many bytes of a record that was being written
    /// are left at the end of the newest segment.
    Crash { torn: Option<usize> },
    /// A batch made durable and committed, but the process dies before anyone sees it.
    DurableThenCrash { rt: usize, view: usize },
    /// A new build of the guest deployed to runtime `rt` without a restart.
    Deploy { rt: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..2usize, 0..2usize, 1..5usize).prop_map(|(rt, view, n)| Op::Ingest { rt, view, n }),
        1 => Just(Op::Snapshot),
        1 => Just(Op::Graceful),
        2 => proptest::option::of(1..60usize).prop_map(|torn| Op::Crash { torn }),
        1 => (0..2usize, 0..2usize).prop_map(|(rt, view)| Op::DurableThenCrash { rt, view }),
        1 => (0..2usize).prop_map(|rt| Op::Deploy { rt }),
    ]
}

/// The data dir, the running server, and everything ever seen.
struct World {
    config: Config,
    dir: tempfile::TempDir,
    server: Option<Started>,
    /// `(view, offset)` → the frame served under it (one epoch for the whole run).
    served: BTreeMap<(String, viewtape_journal::ViewOffset), Bytes>,
    epoch: Option<String>,
    next_payload: u64,
    /// The module each runtime should run: the configured one, or the last deployed.
    modules: BTreeMap<&'static str, crate::host::ModuleFingerprint>,
    deploys: u64,
}

impl World {
    async fn new() -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let wasm = dir.path().join("misbehave.wasm");
        std::fs::write(&wasm, guests::MISBEHAVE_WASM).map_err(|e| e.to_string())?;
        let mut text = String::from("[log]\nsegment_bytes = \"4KiB\"\n");
        for rt in RUNTIMES {
            text.push_str(&format!(
                "[[runtime]]\nname = \"{rt}\"\nwasm = {:?}\nviews = [\"v0\", \"v1\", \"state\"]\n",
                wasm.display().to_string()
            ));
        }
        let config: Config = toml::from_str(&text).map_err(|e| e.to_string())?;
        let mut world = Self {
            config,
            dir,
            server: None,
            served: BTreeMap::new(),
            epoch: None,
            next_payload: 0,
            modules: RUNTIMES
                .iter()
                .map(|rt| {
                    (
                        *rt,
                        crate::host::ModuleFingerprint::of(guests::MISBEHAVE_WASM),
                    )
                })
                .collect(),
            deploys: 0,
        };
        world.start().await?;
        Ok(world)
    }

    fn data(&self) -> &Path {
        self.dir.path()
    }

    async fn start(&mut self) -> Result<(), String> {
        let started = start(&self.config, self.data())
            .await
            .map_err(|e| format!("start: {e:#}"))?;
        self.server = Some(started);
        for (rt, module) in &self.modules {
            let running = self
                .server()?
                .runtimes
                .get(rt)
                .ok_or("no runtime")?
                .handle
                .module();
            if running != *module {
                return Err(format!("{rt} runs {running}, not {module}, after a start"));
            }
        }
        self.check(true).await
    }

    fn server(&self) -> Result<&Started, String> {
        self.server.as_ref().ok_or_else(|| "not running".to_owned())
    }

    /// Drops the server as a crash would, and waits until its log writer has stopped (in a
    /// real crash the process is gone).
    async fn crash(&mut self) -> Result<(), String> {
        let Some(Started {
            hub,
            runtimes,
            log,
            snapshots,
            deployer,
            catalog,
            cluster,
        }) = self.server.take()
        else {
            return Err("not running".to_owned());
        };
        drop((hub, runtimes, snapshots, deployer, catalog, cluster));
        for _ in 0..2_000 {
            if Arc::strong_count(&log) == 1 {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Err("the runtimes did not stop".to_owned())
    }

    /// The batch text: `n` publishes with unique payloads, then the guest's count.
    fn batch(&mut self, view: usize, n: usize) -> Bytes {
        let mut text = String::new();
        for i in 0..n {
            self.next_payload += 1;
            text.push_str(&format!(
                "publish {} k{} {}\n",
                VIEWS[view],
                i % 3,
                self.next_payload
            ));
        }
        text.push_str("count\n");
        Bytes::from(text)
    }

    async fn ingest(&mut self, rt: usize, view: usize, n: usize) -> Result<(), String> {
        let input = self.batch(view, n);
        let handle = self
            .server()?
            .runtimes
            .get(RUNTIMES[rt])
            .ok_or("no runtime")?
            .handle
            .clone();
        let accepted = handle
            .ingest(input, None)
            .await
            .map_err(|e| e.to_string())?;
        if accepted.receipt.position.is_none() {
            return Err("a receipt without a log position".to_owned());
        }
        Ok(())
    }

    /// Reads every view's tape: the epoch is the first one, every cursor names the frame it
    /// named before, and — right after a start — every cursor ever served is still there.
    async fn check(&mut self, after_start: bool) -> Result<(), String> {
        let journal = Arc::clone(self.server()?.hub.journal());
        let epoch = journal.epoch().await.to_string();
        match &self.epoch {
            None => self.epoch = Some(epoch),
            Some(first) if *first == epoch => {}
            Some(first) => return Err(format!("the epoch changed from {first} to {epoch}")),
        }
        let mut present = BTreeMap::new();
        for view in VIEWS.iter().chain(&["state"]) {
            let records = match journal.replay_after(view, None).await {
                Ok(records) => records,
                Err(e) => return Err(format!("{view}: {e}")),
            };
            for record in records {
                present.insert((view.to_string(), record.offset), record.frame.clone());
            }
        }
        for (cursor, frame) in &present {
            if let Some(seen) = self.served.get(cursor) {
                if seen != frame.as_ref() {
                    return Err(format!("cursor {cursor:?} names two frames"));
                }
            }
        }
        if after_start {
            if let Some(missing) = self.served.keys().find(|c| !present.contains_key(*c)) {
                return Err(format!(
                    "{missing:?} was served, and is gone after a restart"
                ));
            }
        }
        for (cursor, frame) in present {
            self.served.entry(cursor).or_insert(frame.as_ref().clone());
        }
        Ok(())
    }

    /// Leaves the first `len` bytes of a record frame at the end of the newest segment: a write
    /// cut short by the crash.
    fn tear(&self, len: usize) -> Result<(), String> {
        let dir = self.data().join("log");
        let newest = std::fs::read_dir(&dir)
            .map_err(|e| e.to_string())?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "vtlog"))
            .max()
            .ok_or("no segment")?;
        let bytes = std::fs::read(&newest).map_err(|e| e.to_string())?;
        // The segment's first record stands in for the one being written: a prefix of a real
        // frame, never complete (a complete one would have been acknowledged).
        let record = bytes.get(48..).unwrap_or_default(); // after the segment header
        let record_len = record
            .get(..4)
            .map(|l| u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize + 16)
            .unwrap_or(0);
        let cut = len.min(record_len.saturating_sub(1)).min(record.len());
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&newest)
            .map_err(|e| e.to_string())?;
        file.write_all(&record[..cut]).map_err(|e| e.to_string())
    }

    async fn apply(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::Ingest { rt, view, n } => {
                self.ingest(*rt, *view, *n).await?;
                self.check(false).await
            }
            Op::Snapshot => {
                self.server()?
                    .snapshots
                    .write()
                    .await
                    .map_err(|e| e.to_string())?;
                self.check(false).await
            }
            Op::Graceful => {
                let (_, cut) = self
                    .server()?
                    .snapshots
                    .write_exact()
                    .await
                    .map_err(|e| e.to_string())?;
                drop(cut);
                self.crash().await?;
                self.start().await
            }
            Op::Crash { torn } => {
                self.crash().await?;
                if let Some(len) = torn {
                    self.tear(*len)?;
                }
                self.start().await
            }
            Op::Deploy { rt } => {
                // The same guest with a custom section naming the build: another module.
                self.deploys += 1;
                let mut wasm = guests::MISBEHAVE_WASM.to_vec();
                let name = b"build";
                let data = self.deploys.to_le_bytes();
                wasm.extend_from_slice(&[0, (1 + name.len() + data.len()) as u8, name.len() as u8]);
                wasm.extend_from_slice(name);
                wasm.extend_from_slice(&data);
                let deployed = self
                    .server()?
                    .deployer
                    .deploy(RUNTIMES[*rt], Bytes::from(wasm))
                    .await
                    .map_err(|e| e.to_string())?;
                if deployed.position.is_none() {
                    return Err("a deploy without a log position".to_owned());
                }
                self.modules.insert(RUNTIMES[*rt], deployed.module);
                self.check(false).await
            }
            Op::DurableThenCrash { rt, view } => {
                // Committed and durable, never observed: it must come back at the same
                // offsets it took, which no one has seen.
                self.ingest(*rt, *view, 2).await?;
                self.crash().await?;
                self.start().await
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn the_log_keeps_every_cursor_and_every_acknowledged_batch(
        ops in proptest::collection::vec(op(), 1..14),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let result: Result<(), String> = rt.block_on(async {
            let mut world = World::new().await?;
            for (i, op) in ops.iter().enumerate() {
                world.apply(op).await.map_err(|e| format!("step {i} {op:?}: {e}"))?;
            }
            world.crash().await
        });
        prop_assert!(result.is_ok(), "{}", result.unwrap_err());
    }
}
