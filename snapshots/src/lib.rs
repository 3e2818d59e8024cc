//! The viewtape snapshot file (`DESIGN.md` §7): the durable form of the server — the tape with
//! its epoch, each runtime's state and checkpoint — as one self-validating file.
//!
//! Contents:
//! - `header.rs` — the fixed header: [`SnapshotHeader`], [`SnapshotMeta`], [`MAGIC`].
//! - `codec.rs` — whole snapshots in memory: [`encode`], [`verify`], [`decode`],
//!   [`decode_borrowed`].
//! - `dir.rs` — a directory of snapshot files: [`SnapshotDir`] (atomic write, list, load with
//!   fallback, retention, consuming exact snapshots), [`read_header`], [`verify_file`],
//!   [`load_file`].
//! - `error.rs` — [`FormatError`] (bytes) and [`SnapshotError`] (files).
//! - [`history`] — the data directory's identity, which every snapshot and log segment carries:
//!   a file of another history is refused, never adopted.
//! - [`log`] — the log's segment files (`DESIGN.md` §8): framing, checksums, torn-tail repair,
//!   and a writer with group commit.
//!
//! The format is generic over the body: any `T: Serialize` / `T: DeserializeOwned`. The server
//! passes the journal dump, runtime states, checkpoints and module hashes in one serde struct.
//!
//! ## Format
//!
//! A file is a 52-byte header followed by a MessagePack body:
//!
//! | bytes | field |
//! |---|---|
//! | `0..8` | magic [`MAGIC`] (`\x89VTSNAP\n`) |
//! | `8..10` | format version, `u16` LE ([`FORMAT_VERSION`] = 2) |
//! | `10..12` | flags, `u16` LE: bit 0 [`FLAG_EXACT`]; other bits must be zero |
//! | `12..20` | created-at, unix ms, `u64` LE |
//! | `20..28` | body length, `u64` LE |
//! | `28..32` | CRC-32C of the body |
//! | `32..48` | the history id of the data directory that wrote it ([`history`]), zeros for none |
//! | `48..52` | CRC-32C of header bytes `0..48` |
//!
//! Version 1 files (a 36-byte header without the history id, its checksum at `32..36`) are
//! still read; a directory with a history accepts them only as files it held before it had
//! one ([`history`]).
//!
//! Magic and version keep their positions in every future version, so an old build can always
//! say "written by a newer viewtape" instead of "corrupt". CRC-32C (hardware-accelerated, the
//! checksum of iSCSI, ext4 and RocksDB) detects every error burst of up to 32 bits, so any single
//! flipped byte — in the header or the body — is always caught.
//!
//! The body is MessagePack via `rmp_serde::encode::write_named`: structs are maps keyed by field
//! name, so later versions may add fields (`#[serde(default)]`) and still read older files.
//!
//! **Byte payloads must be `bytes::Bytes` or `#[serde(with = "serde_bytes")]`.** A plain
//! `Vec<u8>` or `[u8]` field is encoded as an array of integers, one MessagePack value per byte:
//! on the bench body (100-byte frames) encode fell from 1.19 to 0.40 GB/s, decode from 0.82 to
//! 0.26 GB/s, and the file grew 1.38×; the gap widens with larger frames. See
//! `docs/benchmarks-history.md`.
//!
//! ## Atomic writes
//!
//! [`SnapshotDir::write`] writes a hidden temp file (`.tmp-snap-….vtsnap`) in the same directory,
//! fsyncs it, renames it to its final name and fsyncs the directory. A crash at any moment
//! leaves either no new snapshot or a complete, durable one; at worst a hidden temp file, which
//! listing and loading ignore ([`SnapshotDir::remove_temp_files`] clears them at start).
//!
//! File names sort by time and write sequence:
//! `snap-<unix_ms:016>-<seq:010>-<exact|periodic|manual|consumed>.vtsnap` (`manual`: a periodic
//! one an operator asked for). The writer keeps both numbers non-decreasing (even if the clock
//! steps back), so newest-first is descending `(ms, seq)`.
//!
//! ## Validation
//!
//! Nothing is returned from a load until every check passed: magic, version, header checksum,
//! flags, body length against the file size, body checksum, then the body decode, and — in a
//! directory with a history ([`SnapshotDir::with_history`]) — that the file is of that history.
//! Each failure is its own [`FormatError`] variant (`Short`, `ForeignMagic`,
//! `UnsupportedVersion`, `HeaderChecksum`, `UnknownFlags`, `Truncated`, `TrailingBytes`,
//! `BodyChecksum`, `ForeignHistory`, `Body`),
//! wrapped in [`SnapshotError::Invalid`] whose message names the file and the reason.
//! [`SnapshotDir::load_newest_valid`] walks newest → oldest and returns the first snapshot that
//! passes, plus every file it passed over and why, so the server can log "fell back to X because
//! Y". [`read_header`] checks just the header and file size, for cheap listings.
//!
//! ## Retention
//!
//! [`SnapshotDir::prune`] keeps the newest exact snapshot plus the newest N (default
//! [`DEFAULT_KEEP_PERIODIC`] = 5) periodic, manual or consumed ones, and removes older valid
//! snapshots.
//! A file that fails validation is **never** deleted: it is kept for inspection and does not count
//! towards N. `write` does not prune; the server calls `prune` after each write.
//!
//! ## Exact snapshots vouch for one life
//!
//! An exact snapshot with epoch E says "offsets of E were issued up to here, and not beyond".
//! A server that restores it and adopts E goes on issuing offsets of E beyond the snapshot's
//! heads. If that server then crashes before writing a newer snapshot, the file still says
//! "not beyond" — and is no longer true. Adopting E from it a second time would give the
//! same cursor two different meanings.
//!
//! So an exact snapshot is a baton that can be used **once**: adopting it consumes it.
//! [`SnapshotDir::consume_exact`] renames `…-exact.vtsnap` to `…-consumed.vtsnap` and fsyncs
//! the directory; a consumed file still loads (state, guest states, checkpoints) but only as
//! periodic, so its epoch is never adopted again. The rename is atomic and durable before the
//! call returns, and it is the only thing that makes a file adoptable-exact to no longer be
//! so. A file is adoptable only when its *name* says `exact` **and** its header carries
//! [`FLAG_EXACT`] ([`SnapshotInfo::is_exact`]); any disagreement loads as periodic.
//!
//! The server's start-up sequence, which [`SnapshotDir::load_for_start`] performs in one call:
//!
//! 1. load the newest valid snapshot;
//! 2. if it is exact, [`SnapshotDir::consume_exact`] it — **before** issuing any offset or
//!    accepting any connection;
//! 3. adopt E only if step 2 returned `Ok`; otherwise (periodic, or the rename/fsync failed)
//!    hydrate the state with a fresh epoch.
//!
//! Why this is enough, for any sequence of graceful stops, crashes (kill -9 anywhere) and
//! restarts: offsets of E past an exact snapshot's heads are issued only by a life that adopted
//! that very file, and each file is adopted at most once. A crash before step 2 completes issued
//! nothing yet, so adopting E on the next start is still sound. A crash after it leaves the file
//! consumed, so the next start takes a fresh epoch (clients get a reset). A graceful stop of the
//! adopting life writes a *new* exact snapshot (the next baton) with E and its later heads.
//! Periodic snapshots never carry E forward. Operators must not rename files by hand.
#![deny(missing_docs)]

mod codec;
mod dir;
mod error;
mod header;
pub mod history;
pub mod log;
mod position;
mod seq;

pub use codec::{decode, decode_borrowed, encode, encode_in_history, encode_with_capacity, verify};
pub use dir::{
    load_file, read_header, verify_file, Loaded, NewestValid, PruneReport, Skipped, SnapshotDir,
    SnapshotEntry, SnapshotInfo, SnapshotKind, StartupRestore, DEFAULT_KEEP_PERIODIC,
    FOREIGN_SUFFIX,
};
pub use error::{FormatError, SnapshotError};
pub use header::{SnapshotHeader, SnapshotMeta, FLAG_EXACT, FORMAT_VERSION, HEADER_LEN, MAGIC};
pub use seq::SnapshotSeq;
