//! Run a [`Runtime`] natively, the way the host runs it, so guest logic is unit-testable
//! without WebAssembly.

use crate::context::{decode, Output};
use crate::{Context, Error, Level, Result, Runtime};

/// Drives a runtime like the host does: `init`, then batches; a failed batch publishes nothing
/// and rolls the runtime back to its state after the last good batch (the host does this by
/// re-instantiating the guest from its last saved state).
///
/// ```
/// # use viewtape_guest::{Context, Result, Runtime, testing::Harness, Output};
/// struct Echo;
/// impl Runtime for Echo {
///     fn init(_: &[u8]) -> Result<Self> { Ok(Echo) }
///     fn on_batch(&mut self, input: &[u8], ctx: &mut Context) -> Result<()> {
///         ctx.publish("echo", "last", input);
///         Ok(())
///     }
///     fn save(&self) -> Vec<u8> { Vec::new() }
///     fn restore(&mut self, _: &[u8]) -> Result<()> { Ok(()) }
/// }
/// let mut h = Harness::<Echo>::new(b"")?;
/// let out = h.batch(b"hi")?;
/// assert_eq!(out, vec![Output::Update { view: "echo".into(), key: "last".into(), payload: b"hi".to_vec() }]);
/// # Ok::<(), viewtape_guest::Error>(())
/// ```
#[derive(Debug)]
pub struct Harness<R> {
    config: Vec<u8>,
    runtime: R,
    last_good: Vec<u8>,
    /// The views the runtime declares; `None` checks names only.
    views: Option<Vec<String>>,
    max_event: usize,
    max_batch: usize,
    logs: Vec<(Level, String)>,
    time_ms: u64,
}

/// The host's default event payload limit (`[runtime.limits] max_event`).
pub const DEFAULT_MAX_EVENT: usize = 1 << 20;
/// The host's default batch limit (`[runtime.limits] max_batch`).
pub const DEFAULT_MAX_BATCH: usize = 4 << 20;

impl<R: Runtime> Harness<R> {
    /// Creates the runtime from `config`, with the host's default limits.
    ///
    /// # Errors
    /// The error `Runtime::init` returns.
    pub fn new(config: &[u8]) -> Result<Self> {
        let runtime = R::init(config)?;
        let last_good = crate::state::save(&runtime);
        Ok(Self {
            config: config.to_vec(),
            runtime,
            last_good,
            views: None,
            max_event: DEFAULT_MAX_EVENT,
            max_batch: DEFAULT_MAX_BATCH,
            logs: Vec::new(),
            time_ms: 0,
        })
    }

    /// Sets the ingest time of the batches that follow ([`Context::batch_time_ms`]), in Unix
    /// milliseconds (default 0): `harness.at(1_700_000_000_000).batch(input)`.
    pub fn at(&mut self, time_ms: u64) -> &mut Self {
        self.time_ms = time_ms;
        self
    }

    /// Refuses, like the host, batches that publish to a view not in `views` (the runtime's
    /// `views =` in the server's config).
    #[must_use]
    pub fn declare_views(mut self, views: &[&str]) -> Self {
        self.views = Some(views.iter().map(|v| (*v).to_owned()).collect());
        self
    }

    /// Sets the limits the server's config gives (`max_event`, `max_batch`, in bytes).
    #[must_use]
    pub fn limits(mut self, max_event: usize, max_batch: usize) -> Self {
        self.max_event = max_event;
        self.max_batch = max_batch;
        self
    }

    /// Runs one batch and returns what it emitted, in order. What the guest logged is in
    /// [`Harness::logs`] afterwards.
    ///
    /// # Errors
    /// What the host would refuse, with the host's reasons: the error `on_batch` returned, a
    /// batch or event over the limits, an invalid or undeclared view. The runtime is then
    /// rolled back to its state after the last good batch.
    pub fn batch(&mut self, input: &[u8]) -> Result<Vec<Output>> {
        if input.len() > self.max_batch {
            return Err(Error::msg(format!(
                "batch of {} bytes exceeds the limit of {} bytes ([runtime.limits] max_batch)",
                input.len(),
                self.max_batch
            )));
        }
        let mut ctx = Context::default();
        crate::export::NATIVE_BATCH_TIME.with(|time| time.set(self.time_ms));
        let ran = self.runtime.on_batch(input, &mut ctx);
        self.logs = ctx.logs().to_vec();
        let result = ran
            .and_then(|()| decode(&ctx.into_buffer()).map_err(Error::msg))
            .and_then(|out| {
                out.iter().try_for_each(|o| self.check(o))?;
                Ok(out)
            });
        match result {
            Ok(out) => {
                self.last_good = crate::state::save(&self.runtime);
                Ok(out)
            }
            Err(err) => {
                self.runtime = R::init(&self.config)?;
                crate::state::restore(&mut self.runtime, &self.last_good)?;
                Err(err)
            }
        }
    }

    /// What the host checks of each emitted event.
    fn check(&self, output: &Output) -> Result<()> {
        let (view, payload) = match output {
            Output::Update { view, payload, .. } => (view, payload.len()),
            Output::Delete { view, .. } => (view, 0),
            Output::Gap { .. } => return Ok(()),
        };
        if !crate::abi::is_valid_view(view.as_bytes()) {
            return Err(Error::msg(format!(
                "the guest published to {view:?}, which is not a view name: use 1-128 bytes of \
                 A-Z a-z 0-9 . _ -"
            )));
        }
        if let Some(views) = &self.views {
            if !views.contains(view) {
                return Err(Error::msg(format!(
                    "the guest published to view `{view}`, which its runtime does not declare \
                     (views = {views:?} in its [[runtime]] config)"
                )));
            }
        }
        if payload > self.max_event {
            return Err(Error::msg(format!(
                "the guest emitted an event of {payload} bytes in view `{view}`; the limit is {} \
                 bytes ([runtime.limits] max_event)",
                self.max_event
            )));
        }
        Ok(())
    }

    /// What the guest logged during the last batch, in order (on the server these lines go to
    /// its log, under the runtime's name; `RUST_LOG=info` shows them).
    pub fn logs(&self) -> &[(Level, String)] {
        &self.logs
    }

    /// The runtime's saved state, as the host would store it (with its version).
    pub fn save(&self) -> Vec<u8> {
        crate::state::save(&self.runtime)
    }

    /// Replaces the runtime with a fresh one restored from `state`.
    ///
    /// # Errors
    /// The error `init` or `restore` returned.
    pub fn restore(&mut self, state: &[u8]) -> Result<()> {
        let mut runtime = R::init(&self.config)?;
        crate::state::restore(&mut runtime, state)?;
        self.runtime = runtime;
        self.last_good = state.to_vec();
        Ok(())
    }

    /// The runtime itself, for assertions on its state.
    pub fn runtime(&self) -> &R {
        &self.runtime
    }

    /// The schemas the runtime declares, as the host reads them once it is made. The host
    /// validates published values against them; `viewtape run GUEST INPUT` checks a guest's
    /// output the same way, off the server.
    pub fn schemas(&self) -> crate::Schemas {
        self.runtime.schemas()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Publishes `view key payload` lines, logging each.
    struct Lines;

    impl Runtime for Lines {
        fn init(_: &[u8]) -> Result<Self> {
            Ok(Lines)
        }

        fn on_batch(&mut self, input: &[u8], ctx: &mut Context) -> Result<()> {
            for line in std::str::from_utf8(input).map_err(Error::msg)?.lines() {
                if line == "time" {
                    ctx.publish("clock", "now", ctx.batch_time_ms().to_string().as_bytes());
                    continue;
                }
                let mut words = line.splitn(3, ' ');
                let (view, key) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                ctx.log(Level::Info, &format!("publishing {key}"));
                ctx.publish(view, key, words.next().unwrap_or("").as_bytes());
            }
            Ok(())
        }

        fn save(&self) -> Vec<u8> {
            Vec::new()
        }

        fn restore(&mut self, _: &[u8]) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_harness_refuses_what_the_host_refuses_and_shows_the_logs() {
        let mut h = Harness::<Lines>::new(b"")
            .unwrap()
            .declare_views(&["prices"])
            .limits(10, 100);
        assert_eq!(h.batch(b"prices a 1").unwrap().len(), 1);
        assert_eq!(h.logs(), &[(Level::Info, "publishing a".to_owned())]);
        for (input, reason) in [
            (&b"pricez a 1"[..], "does not declare"),
            (b"bad/view a 1", "not a view name"),
            (b"prices a 12345678901", "max_event"),
            (&[b'x'; 101][..], "max_batch"),
        ] {
            let err = h.batch(input).unwrap_err();
            assert!(err.to_string().contains(reason), "{err}");
        }
    }

    #[test]
    fn a_batch_sees_the_ingest_time_the_harness_gives() {
        let mut h = Harness::<Lines>::new(b"").unwrap();
        let now = |h: &mut Harness<Lines>| match h.batch(b"time").unwrap().as_slice() {
            [Output::Update { payload, .. }] => String::from_utf8(payload.clone()).unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(now(&mut h), "0");
        h.at(1_700_000_000_123);
        assert_eq!(now(&mut h), "1700000000123");
    }
}
