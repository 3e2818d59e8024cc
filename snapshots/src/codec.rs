//! Encoding and decoding whole snapshots in memory: header, checksum, MessagePack body.
//!
//! Generic over the body so this crate does not fix what a snapshot holds; the server passes
//! its own serde type (journal dump, runtime states, checkpoints, module hashes).

use crate::error::FormatError;
use crate::header::{SnapshotHeader, SnapshotMeta, HEADER_LEN};
use crate::history::HistoryId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Encodes `body` as a complete snapshot file: header, then the MessagePack body.
///
/// The body is written with [`rmp_serde::encode::write_named`] (structs as maps keyed by field
/// name) so later versions can add fields with `#[serde(default)]` and still read older files.
/// Byte payloads in the body must be `bytes::Bytes` or `#[serde(with = "serde_bytes")]`;
/// a plain `Vec<u8>` is encoded as an array of integers: ~3× slower and 1.4× larger on 100-byte
/// frames, worse for larger ones (`docs/benchmarks-history.md`).
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
    encode_in_history(body, meta, None, capacity_hint)
}

/// Like [`encode_with_capacity`], stamping the header with the data directory's `history`
/// (what [`crate::SnapshotDir::write`] does for a directory that has one).
///
/// # Errors
/// As [`encode`].
pub fn encode_in_history<T: Serialize + ?Sized>(
    body: &T,
    meta: &SnapshotMeta,
    history: Option<HistoryId>,
    capacity_hint: usize,
) -> Result<Vec<u8>, FormatError> {
    let mut out = Vec::with_capacity(capacity_hint.max(HEADER_LEN + 64));
    out.resize(HEADER_LEN, 0);
    rmp_serde::encode::write_named(&mut out, body).map_err(FormatError::Encode)?;
    let body_bytes = &out[HEADER_LEN..];
    let header = SnapshotHeader::new(
        meta,
        history,
        body_bytes.len() as u64,
        crc32c::crc32c(body_bytes),
    );
    out[..HEADER_LEN].copy_from_slice(&header.to_bytes());
    Ok(out)
}

/// Validates a whole snapshot without decoding its body: header, body length, body checksum.
///
/// # Errors
/// Any [`FormatError`] but `Body` and `Encode`.
pub fn verify(bytes: &[u8]) -> Result<SnapshotHeader, FormatError> {
    let header = SnapshotHeader::parse(bytes)?;
    let body = &bytes[header.len()..];
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
    decode_borrowed(bytes)
}

/// Like [`decode`], for bodies that borrow from `bytes` (`&str`, `#[serde(borrow)] &[u8]`):
/// no allocation per string or frame, so about 2× faster on the bench body. Useful to inspect
/// a snapshot (counts, sizes) without building the server's state.
///
/// # Errors
/// As [`decode`].
pub fn decode_borrowed<'a, T: Deserialize<'a>>(
    bytes: &'a [u8],
) -> Result<(SnapshotHeader, T), FormatError> {
    let header = verify(bytes)?;
    let body =
        rmp_serde::from_slice(&bytes[header.len()..]).map_err(|source| FormatError::Body {
            type_name: std::any::type_name::<T>(),
            source,
        })?;
    Ok((header, body))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::header::{FORMAT_VERSION, MAGIC};
    use proptest::prelude::*;
    use serde::Deserialize;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Rec {
        offset: u64,
        key: String,
        #[serde(with = "serde_bytes")]
        frame: Vec<u8>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Body {
        epoch: String,
        records: Vec<Rec>,
    }

    fn body() -> Body {
        Body {
            epoch: "e-1234".into(),
            records: (1..=50)
                .map(|i| Rec {
                    offset: i,
                    key: format!("k{}", i % 7),
                    frame: vec![i as u8; 100],
                })
                .collect(),
        }
    }

    fn meta(exact: bool) -> SnapshotMeta {
        SnapshotMeta {
            exact,
            created_at_ms: 1_764_409_200_123,
            manual: false,
        }
    }

    /// Recomputes the header checksum after a deliberate header edit.
    fn reseal(bytes: &mut [u8]) {
        let crc = crc32c::crc32c(&bytes[..48]);
        bytes[48..52].copy_from_slice(&crc.to_le_bytes());
    }

    /// The same snapshot in format version 1: no history id, a 36-byte header.
    pub(crate) fn as_version_1(bytes: &[u8]) -> Vec<u8> {
        let mut v1 = bytes[..32].to_vec();
        v1[8..10].copy_from_slice(&1u16.to_le_bytes());
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_le_bytes());
        v1.extend_from_slice(&bytes[HEADER_LEN..]);
        v1
    }

    #[test]
    fn version_1_files_are_still_read_and_the_history_id_is_kept() -> TestResult {
        let history = HistoryId::random();
        let bytes = encode_in_history(&body(), &meta(true), Some(history), 0)?;
        let (header, decoded): (_, Body) = decode(&bytes)?;
        assert_eq!((header.history(), decoded), (Some(history), body()));
        let v1 = as_version_1(&bytes);
        let (header, decoded): (_, Body) = decode(&v1)?;
        assert_eq!(decoded, body());
        assert_eq!((header.version(), header.history()), (1, None));
        assert!(header.is_exact());
        assert_eq!(header.file_len(), v1.len() as u64);
        assert_eq!(
            decode::<Body>(&encode(&body(), &meta(false))?)?.0.history(),
            None
        );
        Ok(())
    }

    #[test]
    fn round_trip_keeps_body_and_header() -> TestResult {
        for exact in [true, false] {
            let bytes = encode(&body(), &meta(exact))?;
            let (header, decoded): (_, Body) = decode(&bytes)?;
            assert_eq!(decoded, body());
            assert_eq!(header.is_exact(), exact);
            assert_eq!(header.version(), FORMAT_VERSION);
            assert_eq!(header.created_at_ms(), 1_764_409_200_123);
            assert_eq!(header.file_len(), bytes.len() as u64);
            assert_eq!(&bytes[..8], &MAGIC);
        }
        Ok(())
    }

    #[test]
    fn bodies_are_named_maps_so_fields_can_be_added() -> TestResult {
        #[derive(Deserialize)]
        struct BodyV2 {
            epoch: String,
            #[serde(default)]
            added_later: Option<u32>,
        }
        let bytes = encode(&body(), &meta(false))?;
        let (_, v2): (_, BodyV2) = decode(&bytes)?;
        assert_eq!(v2.epoch, "e-1234");
        assert_eq!(v2.added_later, None);
        Ok(())
    }

    #[test]
    fn short_files_are_refused() -> TestResult {
        let bytes = encode(&body(), &meta(true))?;
        for len in [0, 1, 7, 8, 9, 10, 20, HEADER_LEN - 1] {
            let err = decode::<Body>(&bytes[..len]).err().ok_or("accepted")?;
            assert!(matches!(err, FormatError::Short { .. }), "len {len}: {err}");
            assert!(err.to_string().contains("short file"));
        }
        Ok(())
    }

    #[test]
    fn truncated_and_overlong_bodies_are_refused() -> TestResult {
        let bytes = encode(&body(), &meta(true))?;
        for len in [HEADER_LEN, HEADER_LEN + 1, bytes.len() - 1] {
            let err = decode::<Body>(&bytes[..len]).err().ok_or("accepted")?;
            assert!(
                matches!(err, FormatError::Truncated { .. }),
                "len {len}: {err}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        let err = decode::<Body>(&longer).err().ok_or("accepted")?;
        assert!(matches!(err, FormatError::TrailingBytes { .. }), "{err}");
        Ok(())
    }

    #[test]
    fn every_flipped_body_byte_is_refused() -> TestResult {
        let bytes = encode(&body(), &meta(false))?;
        for at in HEADER_LEN..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x01;
            let err = decode::<Body>(&bad).err().ok_or("accepted")?;
            assert!(
                matches!(err, FormatError::BodyChecksum { .. }),
                "at {at}: {err}"
            );
        }
        Ok(())
    }

    #[test]
    fn every_flipped_header_byte_is_refused() -> TestResult {
        let bytes = encode(&body(), &meta(true))?;
        for at in 0..HEADER_LEN {
            for mask in [0x01u8, 0x80, 0xff] {
                let mut bad = bytes.clone();
                bad[at] ^= mask;
                let err = decode::<Body>(&bad).err().ok_or("accepted")?;
                let expected = match at {
                    0..8 => matches!(err, FormatError::ForeignMagic { .. }),
                    8..10 => matches!(err, FormatError::UnsupportedVersion { .. }),
                    _ => matches!(err, FormatError::HeaderChecksum { .. }),
                };
                assert!(expected, "byte {at} ^ {mask:#x}: {err}");
            }
        }
        Ok(())
    }

    #[test]
    fn foreign_files_are_refused() {
        for foreign in [
            &b"PK\x03\x04 a zip file, not a snapshot......................"[..],
            b"{}",
        ] {
            let err = decode::<Body>(foreign).err();
            assert!(
                matches!(err, Some(FormatError::ForeignMagic { .. })),
                "{err:?}"
            );
        }
    }

    #[test]
    fn future_and_zero_versions_are_refused() -> TestResult {
        let mut bytes = encode(&body(), &meta(true))?;
        for version in [0u16, FORMAT_VERSION + 1, u16::MAX] {
            bytes[8..10].copy_from_slice(&version.to_le_bytes());
            reseal(&mut bytes);
            let err = decode::<Body>(&bytes).err().ok_or("accepted")?;
            assert!(
                matches!(err, FormatError::UnsupportedVersion { found, .. } if found == version),
                "{err}"
            );
        }
        let err = decode::<Body>(&bytes).err().ok_or("accepted")?;
        assert!(err.to_string().contains("newer viewtape"), "{err}");
        Ok(())
    }

    #[test]
    fn unknown_flags_are_refused() -> TestResult {
        let mut bytes = encode(&body(), &meta(true))?;
        bytes[10..12].copy_from_slice(&0x8001u16.to_le_bytes());
        reseal(&mut bytes);
        let err = decode::<Body>(&bytes).err().ok_or("accepted")?;
        assert!(
            matches!(err, FormatError::UnknownFlags { flags: 0x8001 }),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn a_body_of_another_type_is_refused() -> TestResult {
        let bytes = encode(&vec![1u32, 2, 3], &meta(false))?;
        let err = decode::<Body>(&bytes).err().ok_or("accepted")?;
        assert!(matches!(err, FormatError::Body { .. }), "{err}");
        assert!(err.to_string().contains("Body"), "{err}");
        assert!(verify(&bytes).is_ok(), "the bytes themselves are intact");
        Ok(())
    }

    fn arb_body() -> impl Strategy<Value = Body> {
        let rec = (
            any::<u64>(),
            "[a-z0-9]{0,12}",
            proptest::collection::vec(any::<u8>(), 0..64),
        )
            .prop_map(|(offset, key, frame)| Rec { offset, key, frame });
        ("[a-z0-9-]{0,16}", proptest::collection::vec(rec, 0..20))
            .prop_map(|(epoch, records)| Body { epoch, records })
    }

    proptest! {
        /// Any byte flips give either the identical body or a typed error, never a panic or
        /// a different body; a single flipped byte is always caught (CRC-32C).
        #[test]
        fn flipped_bytes_never_decode_to_something_else(
            body in arb_body(),
            exact in any::<bool>(),
            flips in proptest::collection::vec((any::<proptest::sample::Index>(), 1u8..=255), 1..4),
        ) {
            let bytes = encode(&body, &SnapshotMeta { exact, created_at_ms: 42, manual: false })
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut bad = bytes.clone();
            let len = bad.len();
            for (at, mask) in &flips {
                bad[at.index(len)] ^= mask;
            }
            match decode::<Body>(&bad) {
                Ok((header, decoded)) => {
                    prop_assert_eq!(&bad, &bytes, "flips cancelled out, else must be refused");
                    prop_assert_eq!(decoded, body);
                    prop_assert_eq!(header.is_exact(), exact);
                }
                Err(err) => prop_assert!(err.is_invalid_snapshot(), "{}", err),
            }
        }

        #[test]
        fn any_truncation_is_refused(body in arb_body(), cut in any::<proptest::sample::Index>()) {
            let bytes = encode(&body, &SnapshotMeta { exact: true, created_at_ms: 1, manual: false })
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let len = cut.index(bytes.len());
            prop_assert!(decode::<Body>(&bytes[..len]).is_err());
        }
    }
}
