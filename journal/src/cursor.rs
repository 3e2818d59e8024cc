//! Cursors: `(epoch, offset)`, the position a client has seen up to.

use std::fmt;
use std::str::FromStr;

use crate::epoch::JournalEpoch;
use crate::offset::ViewOffset;

/// "I have seen every record of this view up to and including `offset`, in
/// `epoch`". Offset `0` means nothing yet.
///
/// The text form (the SSE `id:`) is `<epoch>-<offset>`: 16 lowercase hex
/// digits, a dash, and the offset in decimal without leading zeros, e.g.
/// `00f3a9c1d2e4b5a6-42`. [`FromStr`] accepts exactly the texts [`Display`]
/// produces: no empty text, no sign, no leading zero, no overflow, no
/// trailing bytes.
///
/// [`Display`]: fmt::Display
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Cursor {
    epoch: JournalEpoch,
    offset: ViewOffset,
}

impl Cursor {
    /// A cursor at `offset` of `epoch`.
    pub fn new(epoch: JournalEpoch, offset: ViewOffset) -> Self {
        Self { epoch, offset }
    }

    /// The epoch this cursor belongs to.
    pub fn epoch(&self) -> JournalEpoch {
        self.epoch
    }

    /// The last offset seen.
    pub fn offset(&self) -> ViewOffset {
        self.offset
    }

    /// The text form, on the stack: what [`Display`](fmt::Display) writes, for a frame built
    /// per event without an allocation or the formatting machinery.
    pub fn text(&self) -> CursorText {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut bytes = [0u8; CursorText::MAX];
        let bits = self.epoch.to_bits();
        for (i, digit) in bytes[..16].iter_mut().enumerate() {
            *digit = HEX[((bits >> (60 - 4 * i)) & 0xf) as usize];
        }
        bytes[16] = b'-';
        let mut digits = [0u8; 20];
        let (mut offset, mut n) = (self.offset.get(), 0);
        loop {
            digits[n] = b'0' + (offset % 10) as u8;
            (offset, n) = (offset / 10, n + 1);
            if offset == 0 {
                break;
            }
        }
        for (to, from) in bytes[17..17 + n].iter_mut().zip(digits[..n].iter().rev()) {
            *to = *from;
        }
        CursorText {
            bytes,
            len: 17 + n as u8,
        }
    }
}

/// A cursor's text form, held on the stack ([`Cursor::text`]).
#[derive(Clone, Copy, Debug)]
pub struct CursorText {
    bytes: [u8; Self::MAX],
    len: u8,
}

impl CursorText {
    /// The longest text: 16 hex digits, a dash, and the 20 digits of `u64::MAX`.
    const MAX: usize = 37;

    /// The text's bytes (ASCII).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // Only ASCII digits, lowercase hex and a dash are ever written.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text().as_str())
    }
}

/// Why a text is not a [`Cursor`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CursorParseError {
    /// The text is not `<16 hex digits>-<offset>`.
    #[error("a cursor looks like `00f3a9c1d2e4b5a6-42`")]
    Shape,
    /// The epoch part is not 16 lowercase hex digits.
    #[error("the cursor's epoch is not 16 lowercase hex digits")]
    Epoch,
    /// The offset part is empty, has a sign or leading zero, or is not decimal.
    #[error("the cursor's offset is not a canonical decimal number")]
    Offset,
    /// The offset does not fit in 64 bits.
    #[error("the cursor's offset overflows 64 bits")]
    Overflow,
}

impl FromStr for Cursor {
    type Err = CursorParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (epoch, offset) = text.split_once('-').ok_or(CursorParseError::Shape)?;
        let epoch: JournalEpoch = epoch.parse().map_err(|_| CursorParseError::Epoch)?;
        let canonical = !offset.is_empty()
            && offset.bytes().all(|b| b.is_ascii_digit())
            && (offset == "0" || !offset.starts_with('0'));
        if !canonical {
            return Err(CursorParseError::Offset);
        }
        let offset = offset.parse().map_err(|_| CursorParseError::Overflow)?;
        Ok(Self {
            epoch,
            offset: ViewOffset::new(offset),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn display_is_short_and_sse_safe() {
        let cursor = Cursor::new(JournalEpoch::from_bits(u64::MAX), ViewOffset::new(u64::MAX));
        let text = cursor.to_string();
        assert_eq!(text, "ffffffffffffffff-18446744073709551615");
        assert!(text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    }

    #[test]
    fn rejects_what_display_cannot_produce() {
        let cases = [
            ("", CursorParseError::Shape),
            ("00abcdef01234567", CursorParseError::Shape),
            ("00abcdef01234567-", CursorParseError::Offset),
            ("00abcdef01234567-01", CursorParseError::Offset),
            ("00abcdef01234567-+1", CursorParseError::Offset),
            ("00abcdef01234567-1 ", CursorParseError::Offset),
            ("00abcdef01234567-1-2", CursorParseError::Offset),
            (
                "00abcdef01234567-18446744073709551616",
                CursorParseError::Overflow,
            ),
            ("00ABCDEF01234567-1", CursorParseError::Epoch),
            ("abc-1", CursorParseError::Epoch),
            ("-1", CursorParseError::Epoch),
        ];
        for (text, expected) in cases {
            assert_eq!(text.parse::<Cursor>(), Err(expected), "{text:?}");
        }
    }

    proptest! {
        #[test]
        fn round_trips(bits: u64, offset: u64) {
            let cursor = Cursor::new(JournalEpoch::from_bits(bits), ViewOffset::new(offset));
            prop_assert_eq!(cursor.to_string().parse::<Cursor>(), Ok(cursor));
        }

        #[test]
        fn text_is_hex_epoch_dash_decimal_offset(bits: u64, offset: u64) {
            let cursor = Cursor::new(JournalEpoch::from_bits(bits), ViewOffset::new(offset));
            let text = cursor.text();
            prop_assert_eq!(text.as_str(), format!("{bits:016x}-{offset}"));
        }

        #[test]
        fn accepts_only_its_own_output(text in "\\PC{0,40}|[0-9a-f]{16}-[0-9]{0,22}") {
            if let Ok(cursor) = text.parse::<Cursor>() {
                prop_assert_eq!(cursor.to_string(), text);
            }
        }
    }
}
