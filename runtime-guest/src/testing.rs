//! Run a [`Runtime`] natively, the way the host runs it, so guest logic is unit-testable
//! without WebAssembly.

use crate::context::{decode, Output};
use crate::{Context, Error, Result, Runtime};

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
}

impl<R: Runtime> Harness<R> {
    /// Creates the runtime from `config`.
    ///
    /// # Errors
    /// The error `Runtime::init` returns.
    pub fn new(config: &[u8]) -> Result<Self> {
        let runtime = R::init(config)?;
        let last_good = runtime.save();
        Ok(Self {
            config: config.to_vec(),
            runtime,
            last_good,
        })
    }

    /// Runs one batch and returns what it emitted, in order.
    ///
    /// # Errors
    /// The error `on_batch` returned (the runtime is then rolled back), or an error if the
    /// runtime emitted something the host would refuse (an invalid view name).
    pub fn batch(&mut self, input: &[u8]) -> Result<Vec<Output>> {
        let mut ctx = Context::default();
        let result = self
            .runtime
            .on_batch(input, &mut ctx)
            .and_then(|()| decode(&ctx.into_buffer()).map_err(Error::msg))
            .and_then(|out| {
                for o in &out {
                    if let Output::Update { view, .. } | Output::Delete { view, .. } = o {
                        if !crate::abi::is_valid_view(view.as_bytes()) {
                            return Err(Error::msg(format!("invalid view name {view:?}")));
                        }
                    }
                }
                Ok(out)
            });
        match result {
            Ok(out) => {
                self.last_good = self.runtime.save();
                Ok(out)
            }
            Err(err) => {
                self.runtime = R::init(&self.config)?;
                self.runtime.restore(&self.last_good)?;
                Err(err)
            }
        }
    }

    /// The runtime's saved state, as the host would store it.
    pub fn save(&self) -> Vec<u8> {
        self.runtime.save()
    }

    /// Replaces the runtime with a fresh one restored from `state`.
    ///
    /// # Errors
    /// The error `init` or `restore` returned.
    pub fn restore(&mut self, state: &[u8]) -> Result<()> {
        let mut runtime = R::init(&self.config)?;
        runtime.restore(state)?;
        self.runtime = runtime;
        self.last_good = state.to_vec();
        Ok(())
    }

    /// The runtime itself, for assertions on its state.
    pub fn runtime(&self) -> &R {
        &self.runtime
    }
}
