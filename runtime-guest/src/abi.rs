//! The constants of the guest ABI, shared by the SDK and the host. See `ABI.md` in this crate.

/// The ABI version this SDK speaks. The host refuses a guest built for another one.
pub const ABI_VERSION: u32 = 1;

/// Prefix of the version-marker export; the full name is `viewtape_abi_v{ABI_VERSION}`.
pub const ABI_MARKER_PREFIX: &str = "viewtape_abi_v";

/// The version-marker export of this ABI version.
pub const ABI_MARKER: &str = "viewtape_abi_v1";

/// Guest export: `(len) -> ptr` of an input buffer of at least `len` bytes.
pub const EXPORT_INPUT: &str = "viewtape_input";
/// Guest export: `(len) -> status`, create the runtime from `input[..len]`.
pub const EXPORT_INIT: &str = "viewtape_init";
/// Guest export: `(len) -> status`, restore state from `input[..len]`.
pub const EXPORT_RESTORE: &str = "viewtape_restore";
/// Guest export: `(len) -> status`, process the batch `input[..len]`.
pub const EXPORT_ON_BATCH: &str = "viewtape_on_batch";
/// Guest export: `() -> status`, reply with the saved state.
pub const EXPORT_SAVE: &str = "viewtape_save";
/// Guest export: the linear memory.
pub const EXPORT_MEMORY: &str = "memory";

/// Module name of the host imports.
pub const IMPORT_MODULE: &str = "viewtape";
/// Host import: `(ptr, len)`, the output of the current call.
pub const IMPORT_REPLY: &str = "reply";
/// Host import: `(ptr, len)`, the error message of the current call.
pub const IMPORT_ERROR: &str = "error";
/// Host import: `(level, ptr, len)`, a log line.
pub const IMPORT_LOG: &str = "log";
/// Host import: `() -> i64`, the current batch's ingest time as the log holds it (Unix
/// milliseconds); `0` outside `viewtape_on_batch`.
pub const IMPORT_BATCH_TIME: &str = "batch_time";

/// Status returned by an export on success.
pub const STATUS_OK: i32 = 0;
/// Status returned by an export when the guest reported an error through `error`.
pub const STATUS_ERROR: i32 = -1;

/// Output-record tag: an update `(view, key, payload)`.
pub const TAG_UPDATE: u8 = 1;
/// Output-record tag: a delete `(view, key)`.
pub const TAG_DELETE: u8 = 2;
/// Output-record tag: a gap `(reason)`.
pub const TAG_GAP: u8 = 3;

/// Longest view name, in bytes (`DESIGN.md` §3).
pub const MAX_VIEW_LEN: usize = 128;

/// Whether `view` is a valid view name: 1–128 bytes of `[A-Za-z0-9._-]`.
pub fn is_valid_view(view: &[u8]) -> bool {
    !view.is_empty()
        && view.len() <= MAX_VIEW_LEN
        && view
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// First bytes of the JS engine guest's init input (`ABI.md`, "JavaScript guests").
pub const JS_INIT_MAGIC: &[u8; 4] = b"VTJS";
/// JS init mode: compile, evaluate and run the module's `init(config)`.
pub const JS_MODE_RUN: u8 = 0;
/// JS init mode: compile the module only (a syntax check; nothing runs).
pub const JS_MODE_CHECK: u8 = 1;

/// The JS engine guest's init input: [`JS_INIT_MAGIC`], `mode`, the source's length (`u32`,
/// little-endian), the source, then the runtime's config to the end.
pub fn js_init_input(mode: u8, source: &[u8], config: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + source.len() + config.len());
    out.extend_from_slice(JS_INIT_MAGIC);
    out.push(mode);
    out.extend_from_slice(&(source.len() as u32).to_le_bytes());
    out.extend_from_slice(source);
    out.extend_from_slice(config);
    out
}
