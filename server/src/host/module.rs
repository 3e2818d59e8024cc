//! A compiled, checked and pre-linked guest module: WebAssembly, or JavaScript run by the
//! embedded engine (`js.rs`).

use std::sync::Arc;

use viewtape_guest::abi;
use wasmtime::{ExternType, InstancePre, Module, ValType};

use super::engine::HostState;
use super::{GuestEngine, GuestError, LoadError, ModuleFingerprint};

/// A guest module: compiled once, checked against the ABI, pre-linked. Cheap to clone; every
/// runtime running this guest instantiates from it.
#[derive(Clone)]
pub struct GuestModule {
    engine: GuestEngine,
    /// `None` for a module whose bytes cannot be had ([`GuestModule::unavailable`]).
    pre: Option<Arc<InstancePre<HostState>>>,
    fingerprint: ModuleFingerprint,
    kind: ModuleKind,
}

/// What the bytes of a [`GuestModule`] were.
#[derive(Clone)]
enum ModuleKind {
    /// A WebAssembly guest: `pre` is its own module.
    Wasm,
    /// JavaScript: `pre` is the engine's, shared; the source goes into every instance's init.
    JavaScript {
        /// The module's source (UTF-8, checked to compile).
        source: Arc<[u8]>,
    },
    /// Bytes this node cannot have (missing or damaged, with no copy anywhere): a runtime on
    /// it is halted and never instantiates it.
    Unavailable,
}

impl std::fmt::Debug for GuestModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestModule").finish_non_exhaustive()
    }
}

/// The first bytes of every WebAssembly binary.
const WASM_MAGIC: &[u8; 4] = b"\0asm";

/// The first eight bytes of a WebAssembly core module: the magic, then version 1. A component
/// has the same magic and another version (and layer).
const MODULE_PREAMBLE: &[u8; 8] = b"\0asm\x01\0\0\0";

/// Function exports of ABI v1: (name, params, has an i32 result).
const FUNCS: [(&str, usize, &str); 5] = [
    (abi::EXPORT_INPUT, 1, "func (i32) -> i32"),
    (abi::EXPORT_INIT, 1, "func (i32) -> i32"),
    (abi::EXPORT_RESTORE, 1, "func (i32) -> i32"),
    (abi::EXPORT_ON_BATCH, 1, "func (i32) -> i32"),
    (abi::EXPORT_SAVE, 0, "func () -> i32"),
];

impl GuestModule {
    /// Compiles `wasm` (binary) and checks it is a guest of this ABI version.
    ///
    /// Bytes that are not WebAssembly but text are a JavaScript module (`js.rs`): compiled by
    /// the embedded engine, [`LoadError::JsSyntax`] when they do not compile.
    ///
    /// # Errors
    /// [`LoadError::NotWasm`] for bytes that are neither, [`LoadError::NotModule`] for a
    /// component (WebAssembly, not a core module), [`LoadError::Compile`] for bytes that are
    /// not a valid module, [`LoadError::AbiVersion`]
    /// for a guest built against another ABI, [`LoadError::MissingExport`] /
    /// [`LoadError::ExportType`] for a module that is not a guest, [`LoadError::Link`] for one
    /// that imports what the host lacks.
    pub fn new(engine: &GuestEngine, wasm: &[u8]) -> Result<Self, LoadError> {
        // Told apart before wasmtime sees them, which would answer with its parser's message
        // and the bytes it found.
        if !wasm.starts_with(WASM_MAGIC) {
            if !super::js::is_source(wasm) {
                return Err(LoadError::NotWasm);
            }
            let pre = engine.js_engine()?;
            super::js::check_syntax(engine, &pre, wasm)?;
            return Ok(Self {
                engine: engine.clone(),
                pre: Some(pre),
                fingerprint: ModuleFingerprint::of(wasm),
                kind: ModuleKind::JavaScript {
                    source: Arc::from(wasm),
                },
            });
        }
        if !wasm.starts_with(MODULE_PREAMBLE) {
            return Err(LoadError::NotModule);
        }
        let fingerprint = ModuleFingerprint::of(wasm);
        let pre = match engine.recent(&fingerprint) {
            Some(pre) => pre,
            None => {
                let module = Module::new(engine.engine(), wasm)
                    .map_err(|e| LoadError::Compile(e.into_boxed_dyn_error()))?;
                check_abi(&module)?;
                let pre = engine
                    .linker()
                    .instantiate_pre(&module)
                    .map_err(|e| LoadError::Link(e.into_boxed_dyn_error()))?;
                let pre = Arc::new(pre);
                engine.remember(fingerprint.clone(), Arc::clone(&pre));
                pre
            }
        };
        Ok(Self {
            engine: engine.clone(),
            pre: Some(pre),
            fingerprint,
            kind: ModuleKind::Wasm,
        })
    }

    /// Stands for module `fingerprint`, whose bytes this node cannot have: it names the module
    /// a halted runtime ran, and never runs.
    pub fn unavailable(engine: &GuestEngine, fingerprint: ModuleFingerprint) -> Self {
        Self {
            engine: engine.clone(),
            pre: None,
            fingerprint,
            kind: ModuleKind::Unavailable,
        }
    }

    /// Whether it stands for a module this node cannot have ([`GuestModule::unavailable`]).
    pub fn is_unavailable(&self) -> bool {
        self.pre.is_none()
    }

    /// `"wasm"`, `"js"`, or `"unavailable"` ([`GuestModule::unavailable`]): what kind of guest
    /// it is.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            ModuleKind::Wasm => "wasm",
            ModuleKind::JavaScript { .. } => "js",
            ModuleKind::Unavailable => "unavailable",
        }
    }

    /// The fingerprint of the bytes it was compiled from.
    pub fn fingerprint(&self) -> &ModuleFingerprint {
        &self.fingerprint
    }

    /// The engine it was compiled for.
    pub fn engine(&self) -> &GuestEngine {
        &self.engine
    }

    /// Whether it is a JavaScript module (run by the embedded engine).
    pub fn is_javascript(&self) -> bool {
        matches!(self.kind, ModuleKind::JavaScript { .. })
    }

    /// What its instances are made from.
    ///
    /// # Errors
    /// [`GuestError::Unavailable`]: its bytes cannot be had here.
    pub(crate) fn pre(&self) -> Result<&InstancePre<HostState>, GuestError> {
        self.pre
            .as_deref()
            .ok_or_else(|| GuestError::Unavailable(self.fingerprint.clone()))
    }

    /// What `init` is given for a runtime with `config`: the config itself, or for JavaScript,
    /// the source and the config framed for the engine.
    pub(crate) fn init_input<'a>(&self, config: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        match &self.kind {
            ModuleKind::Wasm | ModuleKind::Unavailable => config.into(),
            ModuleKind::JavaScript { source } => {
                abi::js_init_input(abi::JS_MODE_RUN, source, config).into()
            }
        }
    }
}

fn check_abi(module: &Module) -> Result<(), LoadError> {
    if module.get_export(abi::ABI_MARKER).is_none() {
        let other = module.exports().find_map(|e| {
            e.name()
                .strip_prefix(abi::ABI_MARKER_PREFIX)
                .map(str::to_owned)
        });
        return Err(match other {
            Some(found) => LoadError::AbiVersion {
                found,
                expected: abi::ABI_VERSION,
            },
            None => LoadError::MissingExport {
                name: abi::ABI_MARKER,
            },
        });
    }
    match module.get_export(abi::EXPORT_MEMORY) {
        None => {
            return Err(LoadError::MissingExport {
                name: abi::EXPORT_MEMORY,
            })
        }
        Some(ExternType::Memory(m)) if !m.is_64() && !m.is_shared() => {}
        Some(_) => {
            return Err(LoadError::ExportType {
                name: abi::EXPORT_MEMORY,
                expected: "a 32-bit, unshared memory",
            })
        }
    }
    for (name, params, expected) in FUNCS {
        let ty = match module.get_export(name) {
            None => return Err(LoadError::MissingExport { name }),
            Some(ExternType::Func(ty)) => ty,
            Some(_) => return Err(LoadError::ExportType { name, expected }),
        };
        let ok = ty.params().len() == params
            && ty.params().all(|p| matches!(p, ValType::I32))
            && ty.results().len() == 1
            && ty.results().all(|r| matches!(r, ValType::I32));
        if !ok {
            return Err(LoadError::ExportType { name, expected });
        }
    }
    Ok(())
}
