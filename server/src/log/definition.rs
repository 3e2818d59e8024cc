//! A runtime as data ([`Definition`]): what `PUT /admin/runtimes/{runtime}` takes, what a
//! `[[runtime]]` of the config declares, and what the log's define records and snapshots keep,
//! so that a restart and every node of a cluster run the same runtimes.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::host::{Limits, ModuleFingerprint};

/// Everything a runtime is made from but its state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Definition {
    /// The module it runs, kept by this fingerprint (a built-in's too).
    pub module: ModuleFingerprint,
    /// How the module was named: `builtin:<guest>`, or its fingerprint's text.
    pub module_name: String,
    /// The views it publishes to: names, or patterns (`chat.*`).
    pub views: Vec<String>,
    /// The text handed to the guest's `init`.
    pub config: String,
    /// JSON Schemas of some of its views, as JSON text, over what the guest declares.
    pub schemas: BTreeMap<String, String>,
    /// Its limits.
    pub limits: DefinedLimits,
    /// The digest of the config's `[[runtime]]` declaration that last declared it ([`Definition::digest`]),
    /// carried over by every change through the API: a start declares the config's runtime
    /// again only when the config's declaration differs from this one (`None`: no config
    /// declared it, or a record from an older viewtape).
    #[serde(default)]
    pub declared: Option<String>,
}

impl Definition {
    /// The bytes handed to the guest's `init`; see [`guest_config`].
    pub fn guest_config(&self) -> Vec<u8> {
        guest_config(&self.module_name, &self.views, &self.config)
    }

    /// This definition running `module`: a deploy changes a runtime's module and nothing else,
    /// so the definition names the build that runs (with the config the guest was given, which
    /// a built-in's name may have implied).
    pub fn running(&self, module: &ModuleFingerprint) -> Definition {
        if *module == self.module {
            return self.clone();
        }
        Definition {
            module: module.clone(),
            module_name: module.to_string(),
            config: String::from_utf8_lossy(&self.guest_config()).into_owned(),
            ..self.clone()
        }
    }

    /// What it declares, as a digest (`sha256:<hex>` of its JSON, `declared` left out): two
    /// declarations are the same exactly when their digests are.
    pub fn digest(&self) -> String {
        let json = serde_json::to_vec(&self.declaration()).unwrap_or_default();
        ModuleFingerprint::of(&json).to_string()
    }

    /// Whether it declares the same runtime as `other`, whoever declared either.
    pub fn same_as(&self, other: &Definition) -> bool {
        self.declaration() == other.declaration()
    }

    /// It, whoever declared it (`declared` left out).
    fn declaration(&self) -> Definition {
        Definition {
            declared: None,
            ..self.clone()
        }
    }
}

/// What the log holds of a runtime that a config declares, as far as declaring it goes.
#[derive(Clone, Copy, Debug)]
pub enum Logged<'a> {
    /// It runs as a config declares it, untouched by any define record.
    AsConfigured,
    /// A define record made it this.
    Defined(&'a Definition),
    /// It does not run: deleted by a record, or never seen; the config declaration that last
    /// declared it, if any ([`Definition::declared`]).
    Absent(Option<&'a str>),
}

/// What a start does with a config's `[[runtime]]` declaration: the log wins. The config
/// declares a runtime by a record only when the log never saw it, or when the declaration
/// changed since the start that last declared it; a change through the API stands until then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Declaring {
    /// Nothing to do: it runs as declared.
    Keep,
    /// Declared again by a record: new, or its declaration changed.
    Declare,
    /// Skipped: a change through the API since this declaration was last declared stands —
    /// another definition, or (`deleted`) a delete.
    Skip {
        /// The change was a delete.
        deleted: bool,
    },
}

impl Definition {
    /// What a start does with this declaration of a config's, given what the log holds of its
    /// runtime ([`Declaring`]).
    pub fn declaring(&self, logged: Logged<'_>) -> Declaring {
        let digest = self.digest();
        match logged {
            Logged::AsConfigured => Declaring::Keep,
            Logged::Defined(defined) if defined.declared.as_deref() == Some(digest.as_str()) => {
                if defined.same_as(self) {
                    Declaring::Keep
                } else {
                    Declaring::Skip { deleted: false }
                }
            }
            Logged::Absent(Some(declared)) if declared == digest => {
                Declaring::Skip { deleted: true }
            }
            Logged::Defined(_) | Logged::Absent(_) => Declaring::Declare,
        }
    }
}

impl std::fmt::Display for Declaring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Keep => "runs as declared",
            Self::Declare => "declared by a record at the next start (new, or its declaration changed)",
            Self::Skip { deleted: false } => "skipped: changed through the API since this declaration was last declared; the change stands until the declaration changes",
            Self::Skip { deleted: true } => "skipped: deleted through the API since this declaration was last declared; it stays deleted until the declaration changes",
        })
    }
}

/// The bytes handed to a guest's `init`: `config`, but for a `builtin:json` runtime of one view
/// without one, `{"view": VIEW}`, so that its lines may leave out the view.
pub fn guest_config(module_name: &str, views: &[String], config: &str) -> Vec<u8> {
    match (module_name, views) {
        ("builtin:json", [view]) if config.is_empty() => {
            serde_json::json!({ "view": view }).to_string().into_bytes()
        }
        _ => config.as_bytes().to_vec(),
    }
}

/// [`Limits`] as a record keeps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefinedLimits {
    /// Largest linear memory, in bytes.
    pub memory: u64,
    /// Fuel per call into the guest.
    pub fuel: u64,
    /// Wall-clock backstop per call, in milliseconds.
    pub batch_timeout_ms: u64,
    /// Largest batch, in bytes.
    pub max_batch: u64,
    /// Largest event payload, in bytes.
    pub max_event: u64,
}

impl From<&Limits> for DefinedLimits {
    fn from(limits: &Limits) -> Self {
        let bytes = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        Self {
            memory: bytes(limits.max_memory_bytes),
            fuel: limits.fuel,
            batch_timeout_ms: u64::try_from(limits.batch_timeout.as_millis()).unwrap_or(u64::MAX),
            max_batch: bytes(limits.max_batch_bytes),
            max_event: bytes(limits.max_event_bytes),
        }
    }
}

impl DefinedLimits {
    /// The host's limits.
    pub fn to_limits(self) -> Limits {
        let bytes = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Limits {
            max_memory_bytes: bytes(self.memory),
            fuel: self.fuel,
            batch_timeout: Duration::from_millis(self.batch_timeout_ms),
            max_batch_bytes: bytes(self.max_batch),
            max_event_bytes: bytes(self.max_event),
        }
    }
}

/// A runtime created or replaced: from this record's position on it runs `definition`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefineEntry {
    /// The runtime.
    pub runtime: String,
    /// What it is from here on.
    pub definition: Definition,
    /// When (wall clock, Unix milliseconds).
    pub at_ms: u64,
    /// Published to a cluster's stream before any node judged it: every node tries it at its
    /// position, and the verdict (the same on every node) decides. A local log's were judged
    /// before they were logged.
    pub pending: bool,
}

/// A runtime deleted: its ingest is gone and its views are retired from this record's
/// position on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetireEntry {
    /// The runtime.
    pub runtime: String,
    /// When (wall clock, Unix milliseconds).
    pub at_ms: u64,
}
