//! Tenant cells: which PostgreSQL cluster a payment lives in, read off its id.
//!
//! A deployment split into cells mints every payment id in the cell of its tenant with the cell's
//! number in it, so that a provider's webhook, which names only our payment id or a provider key
//! derived from it (`psp_…`), can be routed to that cell without asking any database. The id
//! stays a time-ordered uuid: the cell replaces the 12 bits of a version 7 uuid that follow its
//! version (`rand_a`, the high end of the generator's per-millisecond counter, whose low end and
//! the random bits after it keep ids unique), and the version becomes 8 ("custom"), which no
//! id minted outside a cell has. An id without a cell (version 7, minted before the deployment
//! had cells) belongs to the directory's home cell.

use std::fmt;

use uuid::Uuid;

use crate::ids::payment_of_psp_key;
use crate::PaymentId;

/// The largest cell number: the 12 bits of `rand_a`.
pub const CELL_NUMBER_MAX: u16 = 0x0FFF;

/// A cell's number, 1 to [`CELL_NUMBER_MAX`]; 0 is never a cell, so that an all-zero field reads
/// as "none".
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CellNumber(u16);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a cell number is 1 to {CELL_NUMBER_MAX}, got {0}")]
pub struct CellNumberError(pub u64);

impl CellNumber {
    pub fn new(number: u64) -> Result<CellNumber, CellNumberError> {
        match u16::try_from(number) {
            Ok(small) if (1..=CELL_NUMBER_MAX).contains(&small) => Ok(CellNumber(small)),
            _ => Err(CellNumberError(number)),
        }
    }

    #[must_use]
    pub const fn get(self) -> u16 {
        self.0
    }

    /// `minted` (a version 7 uuid) marked as minted in this cell: version 8, the cell in the 12
    /// bits after the version; the timestamp and the bits after them kept.
    #[must_use]
    pub fn stamp(self, minted: Uuid) -> Uuid {
        let mut bytes = *minted.as_bytes();
        let [high, low] = self.0.to_be_bytes();
        bytes[6] = 0x80 | (high & 0x0F);
        bytes[7] = low;
        Uuid::from_bytes(bytes)
    }

    /// The cell a uuid was stamped with; `None` for any uuid not minted in a cell.
    #[must_use]
    pub fn of(uuid: Uuid) -> Option<CellNumber> {
        if uuid.get_version_num() != 8 {
            return None;
        }
        let bytes = uuid.as_bytes();
        let number = u16::from_be_bytes([bytes[6] & 0x0F, bytes[7]]);
        CellNumber::new(u64::from(number)).ok()
    }

    /// The cell a provider's reference to one of our payments names: a payment id (`pay_…`) or a
    /// provider key derived from one (`psp_…_refund_2`). `None` for text that is neither, and for
    /// an id minted outside a cell.
    #[must_use]
    pub fn of_reference(reference: &str) -> Option<CellNumber> {
        payment_of_reference(reference).and_then(|payment| CellNumber::of(payment.as_uuid()))
    }
}

/// The payment a provider's reference names: our payment id, or a provider key derived from one.
#[must_use]
pub fn payment_of_reference(reference: &str) -> Option<PaymentId> {
    let reference = reference.trim();
    PaymentId::parse(reference)
        .ok()
        .or_else(|| payment_of_psp_key(reference))
}

impl fmt::Display for CellNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::{psp_charge_key, psp_refund_key};

    #[test]
    fn a_stamped_id_names_its_cell_in_every_form_a_provider_sends_back() {
        for number in [1, 2, 255, 256, 4095] {
            let cell = CellNumber::new(number).unwrap();
            let minted = Uuid::now_v7();
            let id = PaymentId::from_uuid(cell.stamp(minted));
            assert_eq!(CellNumber::of(id.as_uuid()), Some(cell));
            assert_eq!(id.as_uuid().get_version_num(), 8);
            // The time order survives: the first 48 bits are the mint's.
            assert_eq!(id.as_uuid().as_bytes()[..6], minted.as_bytes()[..6]);
            assert_eq!(id.as_uuid().as_bytes()[8..], minted.as_bytes()[8..]);
            for reference in [
                id.to_string(),
                psp_charge_key(id),
                psp_refund_key(id, 3),
                format!(" {id} "),
            ] {
                assert_eq!(
                    CellNumber::of_reference(&reference),
                    Some(cell),
                    "{reference}"
                );
            }
        }
    }

    #[test]
    fn ids_minted_outside_a_cell_and_other_text_name_no_cell() {
        let unstamped = PaymentId::from_uuid(Uuid::now_v7());
        for reference in [
            unstamped.to_string(),
            psp_charge_key(unstamped),
            String::new(),
            "pay_nope".to_owned(),
            "8a3b…".to_owned(),
        ] {
            assert_eq!(CellNumber::of_reference(&reference), None, "{reference}");
        }
        assert_eq!(CellNumber::of(Uuid::new_v4()), None);
        // A version 8 uuid whose cell bits are zero names no cell.
        let zero = Uuid::from_u128(0x0190_0000_0000_8000_8000_0000_0000_0001);
        assert_eq!(CellNumber::of(zero), None);
    }

    #[test]
    fn cell_numbers_are_bounded() {
        assert!(CellNumber::new(0).is_err());
        assert!(CellNumber::new(4096).is_err());
        assert!(CellNumber::new(u64::MAX).is_err());
        assert_eq!(CellNumber::new(4095).unwrap().get(), 4095);
    }
}
