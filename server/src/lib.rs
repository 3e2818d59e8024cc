//! The viewtape server. Not built yet.
#![deny(missing_docs)]
