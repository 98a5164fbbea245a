//! The cursor of a list read model's keyset pages: the last row's (creation time, id), newest
//! first. The next page starts strictly after it, so rows created meanwhile never shift a page
//! (no duplicates, no gaps), unlike an offset.

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// A time as a filter bound in Unix nanoseconds (the lists' stored form): a time outside the
/// representable range (1677..2262) lies before or after every stored row, which is what
/// clamping to the extremes says.
#[must_use]
pub fn bound_ns(at: DateTime<Utc>) -> i64 {
    at.timestamp_nanos_opt().unwrap_or(if at.timestamp() < 0 {
        i64::MIN
    } else {
        i64::MAX
    })
}

/// Hex digits of a cursor: 16 for the creation time, 32 for the id's uuid.
const CURSOR_HEX_CHARS: usize = 48;

/// Where a page ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keyset {
    /// The row's creation time, Unix nanoseconds.
    pub created_ns: i64,
    pub id: Uuid,
}

impl Keyset {
    /// Opaque to clients: fixed-width hex, so any edit is either rejected or names another
    /// point in the same order (never another tenant's data: every query is tenant-scoped).
    #[must_use]
    pub fn encode(self) -> String {
        // The bits of the i64, so that times before 1970 survive the round trip.
        format!(
            "{:016x}{}",
            u64::from_ne_bytes(self.created_ns.to_ne_bytes()),
            self.id.simple()
        )
    }

    /// The keyset a cursor names; `None` for text no [`Keyset::encode`] gave out.
    #[must_use]
    pub fn decode(cursor: &str) -> Option<Keyset> {
        if cursor.len() != CURSOR_HEX_CHARS || !cursor.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let (created, id) = cursor.split_at(16);
        let created = u64::from_str_radix(created, 16).ok()?;
        Some(Keyset {
            created_ns: i64::from_ne_bytes(created.to_ne_bytes()),
            id: Uuid::try_parse(id).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_anything_else_is_invalid() {
        let id = Uuid::from_u128(0xabc);
        for created_ns in [0, 1, -1, i64::MIN, i64::MAX, 1_764_000_000_123_456_789] {
            let keyset = Keyset { created_ns, id };
            let encoded = keyset.encode();
            assert_eq!(encoded.len(), CURSOR_HEX_CHARS);
            assert_eq!(Keyset::decode(&encoded), Some(keyset), "{created_ns}");
        }
        let good = Keyset { created_ns: 5, id }.encode();
        let bad = [
            String::new(),
            "zz".repeat(24),
            good[1..].to_owned(),
            format!("{good}0"),
            format!("{}é", &good[..46]),
            "pay_".repeat(12),
        ];
        for cursor in bad {
            assert_eq!(Keyset::decode(&cursor), None, "{cursor:?}");
        }
    }
}
