//! The journal epoch: one continuous offset numbering.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Names one continuous offset numbering of a whole journal.
///
/// Opaque and unguessable: 64 bits from the operating system's randomness.
/// Its text form is exactly 16 lowercase hexadecimal digits. In
/// human-readable serde formats (JSON) it is that string, because JSON
/// numbers lose precision above 2^53; in binary formats it is a `u64`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct JournalEpoch(u64);

impl JournalEpoch {
    /// Takes a fresh random epoch.
    ///
    /// std's `RandomState` keys SipHash from the OS's randomness once per
    /// thread and perturbs the key for each instance; hashing nothing with it
    /// yields 64 unpredictable bits without another dependency.
    pub fn random() -> Self {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(0x7669_6577_7461_7065); // "viewtape": domain separation only
        Self(hasher.finish())
    }

    /// A fresh random epoch guaranteed to differ from `other`.
    pub fn random_other_than(other: Self) -> Self {
        loop {
            let epoch = Self::random();
            if epoch != other {
                return epoch;
            }
        }
    }

    /// The epoch's raw bits (for diagnostics and storage).
    pub fn to_bits(self) -> u64 {
        self.0
    }

    /// Rebuilds an epoch from bits returned by [`JournalEpoch::to_bits`].
    pub fn from_bits(bits: u64) -> Self {
        Self(bits)
    }
}

impl fmt::Display for JournalEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for JournalEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JournalEpoch({self})")
    }
}

/// Why a text is not a [`JournalEpoch`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an epoch is exactly 16 lowercase hex digits")]
pub struct EpochParseError;

impl FromStr for JournalEpoch {
    type Err = EpochParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let canonical = text.len() == 16
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !canonical {
            return Err(EpochParseError);
        }
        u64::from_str_radix(text, 16)
            .map(Self)
            .map_err(|_| EpochParseError)
    }
}

impl Serialize for JournalEpoch {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_str(self)
        } else {
            serializer.serialize_u64(self.0)
        }
    }
}

impl<'de> Deserialize<'de> for JournalEpoch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
            text.parse().map_err(serde::de::Error::custom)
        } else {
            u64::deserialize(deserializer).map(Self)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_random_and_distinct() {
        let epochs: std::collections::HashSet<_> =
            (0..1000).map(|_| JournalEpoch::random()).collect();
        assert_eq!(epochs.len(), 1000);
    }

    #[test]
    fn text_round_trips_and_rejects_non_canonical() {
        let epoch = JournalEpoch::from_bits(0x00ab_cdef_0123_4567);
        assert_eq!(epoch.to_string(), "00abcdef01234567");
        assert_eq!("00abcdef01234567".parse::<JournalEpoch>(), Ok(epoch));
        for bad in [
            "",
            "abc",
            "00ABCDEF01234567",
            "+0abcdef01234567",
            "00abcdef012345670",
            " 0abcdef01234567",
        ] {
            assert_eq!(bad.parse::<JournalEpoch>(), Err(EpochParseError), "{bad:?}");
        }
    }

    #[test]
    fn serde_is_a_string_in_json_and_a_number_in_msgpack() {
        let epoch = JournalEpoch::from_bits(u64::MAX - 3);
        let json = serde_json::to_string(&epoch).unwrap();
        assert_eq!(json, format!("\"{epoch}\""));
        assert_eq!(serde_json::from_str::<JournalEpoch>(&json).unwrap(), epoch);
        let packed = rmp_serde::to_vec(&epoch).unwrap();
        assert_eq!(packed.len(), 9, "a msgpack u64, not a string");
        assert_eq!(
            rmp_serde::from_slice::<JournalEpoch>(&packed).unwrap(),
            epoch
        );
    }
}
