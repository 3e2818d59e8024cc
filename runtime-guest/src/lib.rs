//! The viewtape guest SDK (see `DESIGN.md` §6). Not built yet.
#![deny(missing_docs)]
