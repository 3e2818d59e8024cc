//! The viewtape server. Not built yet.
#![deny(missing_docs)]

pub mod host;
pub mod runtime;
pub mod source;
