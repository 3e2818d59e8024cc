//! The batch context: what a runtime can do while it processes a batch.

use crate::abi;

/// Severity of a guest log line, forwarded to the host's `tracing` with the runtime's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Something failed.
    Error = 1,
    /// Something looks wrong.
    Warn = 2,
    /// Normal operation.
    Info = 3,
    /// Detail for debugging.
    Debug = 4,
    /// Very fine detail.
    Trace = 5,
}

/// What a runtime emitted during one batch, in order. Returned by
/// [`testing::Harness`](crate::testing::Harness) so guest logic can be unit-tested natively.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// `ctx.publish(view, key, payload)`.
    Update {
        /// The view.
        view: String,
        /// The key within the view.
        key: String,
        /// The payload bytes.
        payload: Vec<u8>,
    },
    /// `ctx.delete(view, key)`.
    Delete {
        /// The view.
        view: String,
        /// The key within the view.
        key: String,
    },
    /// `ctx.report_gap(reason)`.
    Gap {
        /// Why input was lost.
        reason: String,
    },
}

/// The context of one batch: publish, delete, report gaps, log.
///
/// Everything emitted through a `Context` is buffered and handed to the host in one piece when
/// [`Runtime::on_batch`](crate::Runtime::on_batch) returns `Ok`. If it returns `Err` (or
/// panics), nothing of the batch is published: a batch is all-or-nothing.
#[derive(Debug, Default)]
pub struct Context {
    out: Vec<u8>,
    logs: Vec<(Level, String)>,
}

impl Context {
    pub(crate) fn with_buffer(out: Vec<u8>) -> Self {
        Self {
            out,
            logs: Vec::new(),
        }
    }

    /// When the batch was ingested, as the log holds it (Unix milliseconds): the same on every
    /// node of a cluster and at every replay, so a runtime may use it where it would read a
    /// clock. (The ABI gives a guest no other time.) Natively, in tests, what
    /// [`testing::Harness::at`](crate::testing::Harness::at) set.
    pub fn batch_time_ms(&self) -> u64 {
        crate::export::host_batch_time()
    }

    pub(crate) fn into_buffer(self) -> Vec<u8> {
        self.out
    }

    /// Publishes `payload` as the new value of `key` in `view`.
    ///
    /// `view` must be 1–128 bytes of `[A-Za-z0-9._-]`; the host rejects the batch otherwise.
    pub fn publish(&mut self, view: &str, key: &str, payload: &[u8]) {
        self.publish_with(view, key, |buf| buf.extend_from_slice(payload));
    }

    /// Publishes a payload written in place by `write` (which appends to the given buffer).
    ///
    /// This saves a copy when the payload is serialized, e.g.
    /// `ctx.publish_with("prices", sym, |buf| serde_json::to_writer(buf, &price))`.
    pub fn publish_with<R>(
        &mut self,
        view: &str,
        key: &str,
        write: impl FnOnce(&mut Vec<u8>) -> R,
    ) -> R {
        self.out.push(abi::TAG_UPDATE);
        put(&mut self.out, view.as_bytes());
        put(&mut self.out, key.as_bytes());
        let len_at = self.out.len();
        self.out.extend_from_slice(&[0; 4]);
        let result = write(&mut self.out);
        let len = saturate(self.out.len() - len_at - 4);
        self.out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
        result
    }

    /// Deletes `key` from `view`: subscribers see a delete event for it.
    pub fn delete(&mut self, view: &str, key: &str) {
        self.out.push(abi::TAG_DELETE);
        put(&mut self.out, view.as_bytes());
        put(&mut self.out, key.as_bytes());
    }

    /// Reports that input was lost before this batch (e.g. a sequence number jumped).
    ///
    /// The host logs `reason` with the runtime's name and marks a gap on the journal, so
    /// clients whose cursor is from before it are told to reset instead of silently missing
    /// events. Gaps are committed before the batch's events.
    pub fn report_gap(&mut self, reason: &str) {
        self.out.push(abi::TAG_GAP);
        put(&mut self.out, reason.as_bytes());
    }

    /// Logs `msg` at `level` through the host's logger (immediately, even if the batch later
    /// fails).
    pub fn log(&mut self, level: Level, msg: &str) {
        crate::export::host_log(level, msg);
        if cfg!(not(target_arch = "wasm32")) {
            self.logs.push((level, msg.to_owned()));
        }
    }

    /// Log lines emitted so far (native builds only; empty on wasm where they go to the host).
    pub fn logs(&self) -> &[(Level, String)] {
        &self.logs
    }
}

fn saturate(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&saturate(bytes.len()).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Decodes an output buffer (see `ABI.md`). Used by the native test harness.
pub(crate) fn decode(mut buf: &[u8]) -> Result<Vec<Output>, &'static str> {
    fn take<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], &'static str> {
        let (len, rest) = buf.split_first_chunk::<4>().ok_or("truncated length")?;
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            return Err("truncated field");
        }
        let (field, rest) = rest.split_at(len);
        *buf = rest;
        Ok(field)
    }
    fn text(bytes: &[u8]) -> Result<String, &'static str> {
        String::from_utf8(bytes.to_vec()).map_err(|_| "not UTF-8")
    }
    let mut out = Vec::new();
    while let Some((&tag, rest)) = buf.split_first() {
        buf = rest;
        out.push(match tag {
            abi::TAG_UPDATE => Output::Update {
                view: text(take(&mut buf)?)?,
                key: text(take(&mut buf)?)?,
                payload: take(&mut buf)?.to_vec(),
            },
            abi::TAG_DELETE => Output::Delete {
                view: text(take(&mut buf)?)?,
                key: text(take(&mut buf)?)?,
            },
            abi::TAG_GAP => Output::Gap {
                reason: text(take(&mut buf)?)?,
            },
            _ => return Err("unknown tag"),
        });
    }
    Ok(out)
}
