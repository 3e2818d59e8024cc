//! Saved state as the host stores it: a header naming the state format's version
//! ([`Runtime::STATE_VERSION`]), then the bytes [`Runtime::save`] returned. Restoring state of
//! another version goes through [`Runtime::migrate`] first. The export glue and the test harness
//! both use these two functions, so a test sees exactly what the host stores.

use crate::{Error, Result, Runtime};

/// The first bytes of versioned state. State without them was saved before versions existed and
/// counts as version 0.
const MAGIC: [u8; 4] = *b"\xffVTS";

/// `rt`'s state with its version header.
pub(crate) fn save<R: Runtime>(rt: &R) -> Vec<u8> {
    let state = rt.save();
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + state.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&R::STATE_VERSION.to_le_bytes());
    out.extend_from_slice(&state);
    out
}

/// Restores `stored` into `rt`, migrating it first if another version saved it.
pub(crate) fn restore<R: Runtime>(rt: &mut R, stored: &[u8]) -> Result<()> {
    let (version, state) = match stored.strip_prefix(&MAGIC) {
        Some(rest) => {
            let (version, state) = rest
                .split_first_chunk::<4>()
                .ok_or_else(|| Error::msg("saved state is cut short in its version header"))?;
            (u32::from_le_bytes(*version), state)
        }
        None => (0, stored),
    };
    if version == R::STATE_VERSION {
        return rt.restore(state);
    }
    let migrated = R::migrate(version, state).map_err(|error| {
        Error::msg(format!(
            "state of version {version} cannot become version {}: {error}",
            R::STATE_VERSION
        ))
    })?;
    rt.restore(&migrated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Context;

    /// Version 2 keeps `count` as 8 bytes; version 1 kept it as text.
    struct Counter(u64);

    impl Runtime for Counter {
        const STATE_VERSION: u32 = 2;

        fn init(_: &[u8]) -> Result<Self> {
            Ok(Self(0))
        }
        fn on_batch(&mut self, _: &[u8], _: &mut Context) -> Result<()> {
            self.0 += 1;
            Ok(())
        }
        fn save(&self) -> Vec<u8> {
            self.0.to_le_bytes().to_vec()
        }
        fn restore(&mut self, state: &[u8]) -> Result<()> {
            let bytes = state.try_into().map_err(|_| Error::msg("not 8 bytes"))?;
            self.0 = u64::from_le_bytes(bytes);
            Ok(())
        }
        fn migrate(from: u32, state: &[u8]) -> Result<Vec<u8>> {
            match from {
                0 | 1 => {
                    let text = std::str::from_utf8(state).map_err(Error::msg)?;
                    let n: u64 = text.trim().parse().map_err(Error::msg)?;
                    Ok(n.to_le_bytes().to_vec())
                }
                other => Err(Error::msg(format!("unknown version {other}"))),
            }
        }
    }

    #[test]
    fn state_round_trips_with_its_version_and_older_versions_migrate() {
        let mut rt = Counter(41);
        let stored = save(&rt);
        assert_eq!(&stored[..4], b"\xffVTS");
        assert_eq!(&stored[4..8], &2u32.to_le_bytes());
        rt.0 = 0;
        restore(&mut rt, &stored).unwrap();
        assert_eq!(rt.0, 41);

        // Saved before versions existed (version 0), and by version 1.
        restore(&mut rt, b"7").unwrap();
        assert_eq!(rt.0, 7);
        let mut v1 = b"\xffVTS".to_vec();
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(b"9");
        restore(&mut rt, &v1).unwrap();
        assert_eq!(rt.0, 9);

        // A version this build does not know, and a cut header, are refused with the reason.
        let mut v3 = b"\xffVTS".to_vec();
        v3.extend_from_slice(&3u32.to_le_bytes());
        let err = restore(&mut rt, &v3).unwrap_err();
        assert!(
            err.message().contains("version 3 cannot become version 2"),
            "{err}"
        );
        assert!(restore(&mut rt, b"\xffVTS\x01").is_err());
    }
}
