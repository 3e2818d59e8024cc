//! Encoding and decoding whole snapshots in memory: header, checksum, MessagePack body.
//!
//! Generic over the body so this crate does not fix what a snapshot holds; the server passes
//! its own serde type (journal dump, runtime states, checkpoints, module hashes).

use crate::error::FormatError;
use crate::header::{SnapshotHeader, SnapshotMeta, HEADER_LEN};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encodes `body` as a complete snapshot file: header, then the MessagePack body.
///
/// The body is written with [`rmp_serde::encode::write_named`] (structs as maps keyed by field
/// name) so later versions can add fields with `#[serde(default)]` and still read older files.
/// Byte payloads in the body must be `bytes::Bytes` or `#[serde(with = "serde_bytes")]`;
/// a plain `Vec<u8>` is encoded as an array of integers, ~10× slower and larger.
///
/// # Errors
/// [`FormatError::Encode`] when the body's `Serialize` impl fails.
///
/// # Example
/// ```
/// # fn main() -> Result<(), viewtape_snapshots::FormatError> {
/// use viewtape_snapshots::{decode, encode, SnapshotMeta};
/// let bytes = encode(&vec![1u32, 2, 3], &SnapshotMeta::periodic_now())?;
/// let (header, body): (_, Vec<u32>) = decode(&bytes)?;
/// assert!(!header.is_exact());
/// assert_eq!(body, [1, 2, 3]);
/// # Ok(()) }
/// ```
pub fn encode<T: Serialize + ?Sized>(
    body: &T,
    meta: &SnapshotMeta,
) -> Result<Vec<u8>, FormatError> {
    encode_with_capacity(body, meta, 0)
}

/// Like [`encode`], reserving `capacity_hint` bytes up front (a good hint avoids reallocating
/// and copying a large buffer while encoding).
///
/// # Errors
/// As [`encode`].
pub fn encode_with_capacity<T: Serialize + ?Sized>(
    body: &T,
    meta: &SnapshotMeta,
    capacity_hint: usize,
) -> Result<Vec<u8>, FormatError> {
    let mut out = Vec::with_capacity(capacity_hint.max(HEADER_LEN + 64));
    out.resize(HEADER_LEN, 0);
    rmp_serde::encode::write_named(&mut out, body).map_err(FormatError::Encode)?;
    let body_bytes = &out[HEADER_LEN..];
    let header = SnapshotHeader::new(meta, body_bytes.len() as u64, crc32c::crc32c(body_bytes));
    out[..HEADER_LEN].copy_from_slice(&header.to_bytes());
    Ok(out)
}

/// Validates a whole snapshot without decoding its body: header, body length, body checksum.
///
/// # Errors
/// Any [`FormatError`] but `Body` and `Encode`.
pub fn verify(bytes: &[u8]) -> Result<SnapshotHeader, FormatError> {
    let header = SnapshotHeader::parse(bytes)?;
    let body = &bytes[HEADER_LEN..];
    header.check_body_len(body.len() as u64)?;
    let computed = crc32c::crc32c(body);
    if computed != header.body_crc32c() {
        return Err(FormatError::BodyChecksum {
            stored: header.body_crc32c(),
            computed,
        });
    }
    Ok(header)
}

/// Validates a whole snapshot ([`verify`]) and decodes its body as `T`.
///
/// Nothing is returned unless every check passed, so a caller never acts on half a snapshot.
///
/// # Errors
/// Any [`FormatError`] but `Encode`; [`FormatError::Body`] when the intact body is not a `T`.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<(SnapshotHeader, T), FormatError> {
    let header = verify(bytes)?;
    let body = rmp_serde::from_slice(&bytes[HEADER_LEN..]).map_err(|source| FormatError::Body {
        type_name: std::any::type_name::<T>(),
        source,
    })?;
    Ok((header, body))
}
