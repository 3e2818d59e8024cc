//! The fingerprint that names a guest module's exact bytes.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// Names the exact bytes of a guest module: `sha256:<hex>` of them (of a JavaScript module, of
/// its source, not of the engine that runs it). A guest's saved state and
/// a logged batch mean something only to the module with this fingerprint.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ModuleFingerprint(String);

impl ModuleFingerprint {
    /// The fingerprint of `wasm`.
    pub fn of(wasm: &[u8]) -> Self {
        let digest = Sha256::digest(wasm);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        Self(format!("sha256:{hex}"))
    }

    /// Reads `sha256:<64 lowercase hex>`; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let hex = text.strip_prefix("sha256:")?;
        let valid = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        valid.then(|| Self(text.to_owned()))
    }
}

impl fmt::Display for ModuleFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
