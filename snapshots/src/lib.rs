//! The viewtape snapshot file (see `DESIGN.md` §7). Not built yet.
#![deny(missing_docs)]
