//! Typed errors of the host: one enum for loading a guest, one for running it.

use std::time::Duration;

use super::ModuleFingerprint;

/// A boxed source error (wasmtime's `Error` is not a `std::error::Error` itself).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a guest module was refused at load.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The bytes are not WebAssembly at all (a text file, an executable, an archive).
    #[error(
        "not a WebAssembly module (it does not start with `\\0asm`): give the .wasm a guest's \
         build writes (cargo build --target wasm32-unknown-unknown), or a JavaScript module's \
         source"
    )]
    NotWasm,
    /// JavaScript source that does not compile.
    #[error("the JavaScript module does not compile: {message}")]
    JsSyntax {
        /// The engine's message: the error and its `guest.js:LINE:COLUMN`.
        message: String,
    },
    /// The JavaScript engine failed while checking a module (it ran out of fuel or memory on
    /// a huge source, or the server's embedded engine is broken).
    #[error("the JavaScript engine failed to check the module: {0}")]
    JsEngine(String),
    /// WebAssembly, but not a core module: a component (or a binary version this host does not
    /// read).
    #[error(
        "a WebAssembly component, not a core module: build the guest for \
         wasm32-unknown-unknown (not a wasip2 or component target)"
    )]
    NotModule,
    /// The bytes are not a valid WebAssembly module, or wasmtime could not compile them.
    #[error("guest module failed to compile: {0}")]
    Compile(#[source] BoxError),
    /// The module was built for another ABI version.
    #[error(
        "guest was built for viewtape ABI version {found}, this server speaks version {expected}; \
         rebuild the guest against a matching viewtape-guest"
    )]
    AbiVersion {
        /// The version the guest's marker export names.
        found: String,
        /// The version this host speaks.
        expected: u32,
    },
    /// A required export is missing.
    #[error("not a viewtape guest: missing export `{name}` (is `viewtape_guest::export_runtime!` used?)")]
    MissingExport {
        /// The export's name.
        name: &'static str,
    },
    /// An export has the wrong kind or signature.
    #[error("guest export `{name}` has the wrong type: expected {expected}")]
    ExportType {
        /// The export's name.
        name: &'static str,
        /// What the ABI requires.
        expected: &'static str,
    },
    /// The module imports something the host does not provide (e.g. WASI).
    #[error(
        "guest imports what the host does not provide (only `viewtape` imports exist; no WASI)"
    )]
    Link(#[source] BoxError),
    /// The engine could not be created.
    #[error("failed to create the wasm engine")]
    Engine(#[source] BoxError),
}

impl LoadError {
    /// What a deployer is told: the server's own words; the compiler's and the linker's text
    /// (the engine's internals) stays in the server's log, which has the full [`Display`] text.
    ///
    /// [`Display`]: std::fmt::Display
    pub fn public_message(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Self::Compile(_) => {
                "the module is not WebAssembly this server compiles (the server log says why)"
                    .into()
            }
            Self::Engine(_) => "the wasm engine failed (the server log says why)".into(),
            Self::JsEngine(_) => {
                "the JavaScript engine failed to check the module (the server log says why)".into()
            }
            Self::NotWasm
            | Self::JsSyntax { .. }
            | Self::NotModule
            | Self::AbiVersion { .. }
            | Self::MissingExport { .. }
            | Self::ExportType { .. }
            | Self::Link(_) => self.to_string().into(),
        }
    }
}

/// Why a call into a guest failed. After any of these the instance must not be reused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuestError {
    /// The guest returned an error (e.g. a malformed input line); its message says why.
    #[error("guest rejected the batch: {message}")]
    GuestRejected {
        /// The guest's message.
        message: String,
    },
    /// The guest trapped (a panic, an out-of-bounds access, `unreachable`, a stack overflow).
    #[error("{}", match message.as_deref().map(panic_parts) {
        Some((text, Some(location))) => format!("guest panicked: {text} (at {location}; {trap})"),
        Some((text, None)) => format!("guest panicked: {text} ({trap})"),
        None => format!("guest trapped: {trap}"),
    })]
    Trap {
        /// The trap as wasmtime describes it.
        trap: String,
        /// What the guest reported before trapping (its panic message), if anything.
        message: Option<String>,
    },
    /// The guest used its whole CPU budget: the same batch on the same state always does.
    #[error(
        "guest used up its CPU budget of {fuel} fuel on this call (raise [runtime.limits] fuel)"
    )]
    FuelExhausted {
        /// The budget.
        fuel: u64,
    },
    /// The guest ran past the wall-clock backstop and was interrupted: a fault (the machine
    /// was starved, or the CPU budget is set too high), not a verdict on the batch.
    #[error("guest exceeded the wall-clock limit of {limit:?} (raise [runtime.limits] batch_timeout, or lower fuel)")]
    Timeout {
        /// The limit.
        limit: Duration,
    },
    /// The guest tried to grow its memory past its limit.
    #[error("guest exceeded its memory limit of {} ([runtime.limits] memory)", human_bytes(*limit))]
    MemoryExceeded {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The guest emitted an event whose payload is over the limit.
    #[error("guest emitted an event of {size} bytes in view `{view}` (key {key:?}); the limit is {} ([runtime.limits] max_event)", human_bytes(*limit))]
    EventTooLarge {
        /// The event's view.
        view: String,
        /// The event's key.
        key: String,
        /// The payload size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The guest emitted an event whose key is over the limit (a key is bounded as a payload
    /// is: it is in every frame, record and snapshot of the event).
    #[error("guest emitted a key of {size} bytes in view `{view}` (starting {key:?}); the limit is {} ([runtime.limits] max_event)", human_bytes(*limit))]
    KeyTooLarge {
        /// The event's view.
        view: String,
        /// The start of the key.
        key: String,
        /// The key's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The guest refused its config (`init`) or its saved state (`restore`).
    #[error("the guest refused its {what}: {message}")]
    Refused {
        /// `config` or `saved state`.
        what: &'static str,
        /// The guest's message.
        message: String,
    },
    /// The guest published to a name that is not a view name.
    #[error("the guest published to {view:?}, which is not a view name: use 1-128 bytes of A-Z a-z 0-9 . _ -")]
    InvalidView {
        /// The name, lossily as UTF-8.
        view: String,
    },
    /// The guest published to a view its runtime does not declare.
    #[error("the guest published to view `{view}`, which its runtime does not declare (views = {declared:?} in its [[runtime]] config)")]
    UndeclaredView {
        /// The view.
        view: String,
        /// What the runtime declares.
        declared: Vec<String>,
    },
    /// The guest published a value that does not fit its view's schema.
    #[error("{0}")]
    SchemaViolation(#[from] crate::schema::Violation),
    /// The guest published a JSON value nested deeper than any view takes, typed or not.
    #[error("the value of key {key:?} in view `{view}` is nested deeper than {} arrays and objects, which no view takes", crate::schema::MAX_DEPTH)]
    TooDeep {
        /// The view.
        view: String,
        /// The key.
        key: String,
    },
    /// The guest published a JSON value with a string that escapes half a surrogate pair
    /// (`"\ud800"`): no Unicode text, which strict JSON readers refuse.
    #[error("the value of key {key:?} in view `{view}` holds a string with an unpaired surrogate (a \\ud800-\\udfff escape alone), which is not Unicode text and which JSON readers refuse")]
    LoneSurrogate {
        /// The view.
        view: String,
        /// The key.
        key: String,
    },
    /// The guest declared schemas the host cannot use.
    #[error("{0}")]
    Schema(#[from] crate::schema::SchemaError),
    /// The batch is over the size limit; the guest never saw it.
    #[error("batch of {size} bytes exceeds the limit of {} ([runtime.limits] max_batch)", human_bytes(*limit))]
    BatchTooLarge {
        /// The batch size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The guest broke the ABI (a malformed output buffer, an invalid view name, a pointer out
    /// of bounds).
    #[error("guest broke the ABI: {0}")]
    Protocol(String),
    /// The module's bytes cannot be had on this node ([`GuestModule::unavailable`](super::GuestModule::unavailable)).
    #[error("module {0} cannot be read on this node (missing or damaged, with no copy to repair it from)")]
    Unavailable(ModuleFingerprint),
    /// Creating the instance failed.
    #[error("failed to instantiate the guest: {0}")]
    Instantiate(#[source] BoxError),
    /// Every guest instance the server may run at once is in use: a bound of the server's
    /// (`[server] guest_instances`), not the guest's fault.
    #[error("all {limit} guest instances this server may run at once are in use (raise [server] guest_instances)")]
    InstancesUsedUp {
        /// The bound.
        limit: u32,
    },
}

/// A Rust panic message (`panicked at src/lib.rs:3:5:\nthe message`, its newline escaped as
/// all guest text is) as the message and, when it has one, the location: what the author wrote
/// comes first.
fn panic_parts(message: &str) -> (&str, Option<&str>) {
    match message
        .strip_prefix("panicked at ")
        .and_then(|rest| rest.split_once(":\\n"))
    {
        Some((location, text)) => (text, Some(location)),
        None => (message, None),
    }
}

/// `bytes` as the config writes sizes: `64 MiB`, `4 KiB`, or plain bytes.
fn human_bytes(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

impl GuestError {
    /// What the batch's sender and the operator's `/admin/runtimes` are told: the server's own
    /// words, and the guest's where the guest wrote them for its client (the message of an
    /// error it returned or a config or state it refused, as the SDK documents). A panic's
    /// message, its source location, the trap as wasmtime words it, an ABI breach's detail and
    /// an instantiation's cause stay in the server's log, which has the full [`Display`] text
    /// once: they name paths on the machine that built the guest, or the engine's internals.
    ///
    /// [`Display`]: std::fmt::Display
    pub fn public_message(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Self::Trap {
                message: Some(_), ..
            } => "the guest panicked (its message is in the server log)".into(),
            Self::Trap { message: None, .. } => {
                "the guest trapped (the server log says where)".into()
            }
            Self::Protocol(_) => {
                "the guest broke the viewtape ABI (the server log says how)".into()
            }
            Self::Instantiate(_) => {
                "the guest could not be instantiated (the server log says why)".into()
            }
            Self::GuestRejected { .. }
            | Self::FuelExhausted { .. }
            | Self::Timeout { .. }
            | Self::MemoryExceeded { .. }
            | Self::EventTooLarge { .. }
            | Self::KeyTooLarge { .. }
            | Self::Refused { .. }
            | Self::InvalidView { .. }
            | Self::UndeclaredView { .. }
            | Self::SchemaViolation(_)
            | Self::TooDeep { .. }
            | Self::LoneSurrogate { .. }
            | Self::Schema(_)
            | Self::InstancesUsedUp { .. }
            | Self::Unavailable(_)
            | Self::BatchTooLarge { .. } => self.to_string().into(),
        }
    }

    /// Whether the input itself was refused (the guest rejected it, it is too large, or it made
    /// the guest publish a value its view's schema does not allow, one nested too deep or one
    /// that is not Unicode text), as opposed to the guest failing.
    pub fn is_input_error(&self) -> bool {
        matches!(
            self,
            Self::GuestRejected { .. }
                | Self::BatchTooLarge { .. }
                | Self::SchemaViolation(_)
                | Self::TooDeep { .. }
                | Self::LoneSurrogate { .. }
        )
    }
}
