//! Property tests that drive several modules together.
//!
//! | file | job |
//! |---|---|
//! | `log.rs` | the log: every acknowledged batch survives any stop, crash and restart; every cursor names one frame |
//! | `snapshot.rs` | snapshots: no sequence of snapshots, stops, crashes and restores gives one cursor two frames |

mod log;
mod snapshot;
