//! The platform's fee on a provider's captured money: basis points plus a
//! fixed part, rounded half-up to the minor unit.
//!
//! [`fee`] is the only rounding in the codebase. Everything else that needs a
//! fee share (refunds reversing part of a fee) is expressed through it, so
//! that no second rounding rule can drift away from this one.

use serde::{Deserialize, Serialize};

use crate::money::{Amount, AmountError};

/// 100% in basis points: a fee above the whole amount makes no sense.
pub const FEE_BPS_MAX: u32 = 10_000;

/// The basis points in the default schedule (3%), per API.md.
pub const FEE_BPS_DEFAULT: u32 = 300;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeeError {
    #[error("fee basis points {bps} exceed {FEE_BPS_MAX}")]
    BpsTooLarge { bps: u32 },
    #[error("the fixed fee must not be negative")]
    FixedMustNotBeNegative,
    #[error("a fee is computed on a non-negative amount")]
    AmountMustNotBeNegative,
    #[error(transparent)]
    Amount(#[from] AmountError),
}

/// A provider's fee schedule. The app looks it up per provider and passes it
/// into the commands that capture, so the domain never reads configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawFeeSchedule", into = "RawFeeSchedule")]
pub struct FeeSchedule {
    bps: u32,
    fixed: Amount,
}

impl FeeSchedule {
    pub fn new(bps: u32, fixed: Amount) -> Result<Self, FeeError> {
        if bps > FEE_BPS_MAX {
            return Err(FeeError::BpsTooLarge { bps });
        }
        if fixed.is_negative() {
            return Err(FeeError::FixedMustNotBeNegative);
        }
        Ok(FeeSchedule { bps, fixed })
    }

    #[must_use]
    pub const fn bps(&self) -> u32 {
        self.bps
    }

    #[must_use]
    pub const fn fixed(&self) -> Amount {
        self.fixed
    }
}

impl Default for FeeSchedule {
    fn default() -> Self {
        FeeSchedule {
            bps: FEE_BPS_DEFAULT,
            fixed: Amount::ZERO,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct RawFeeSchedule {
    bps: u32,
    fixed_minor: Amount,
}

impl TryFrom<RawFeeSchedule> for FeeSchedule {
    type Error = FeeError;
    fn try_from(raw: RawFeeSchedule) -> Result<Self, Self::Error> {
        FeeSchedule::new(raw.bps, raw.fixed_minor)
    }
}

impl From<FeeSchedule> for RawFeeSchedule {
    fn from(s: FeeSchedule) -> Self {
        RawFeeSchedule {
            bps: s.bps,
            fixed_minor: s.fixed,
        }
    }
}

/// The fee on `amount`: `amount × bps / 10000` rounded half-up, plus the
/// fixed part, and never more than `amount` itself (a fixed fee larger than
/// a tiny payment would otherwise leave the customer owing us money for
/// being paid).
///
/// 3% of 10000 = 300; of 50 = 1.5 → 2; of 49 = 1.47 → 1.
pub fn fee(amount: Amount, schedule: FeeSchedule) -> Result<Amount, FeeError> {
    if amount.is_negative() {
        return Err(FeeError::AmountMustNotBeNegative);
    }
    // i128 so that i64::MAX × 10000 cannot overflow before the division.
    let scaled = i128::from(amount.minor()) * i128::from(schedule.bps);
    let denominator = i128::from(FEE_BPS_MAX);
    let rounded = (scaled + denominator / 2) / denominator;
    // rounded ≤ amount because bps ≤ 10000, so it fits back into i64.
    let proportional =
        Amount::new(i64::try_from(rounded).map_err(|_| FeeError::Amount(AmountError::Overflow))?);
    let total = proportional.checked_add(schedule.fixed)?;
    Ok(total.min(amount))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn three_percent() -> FeeSchedule {
        FeeSchedule::default()
    }

    #[test]
    fn three_percent_rounds_half_up() {
        for (amount, expected) in [
            (10_000, 300),
            (50, 2),
            (49, 1),
            (16, 0),
            (17, 1),
            (0, 0),
            (1, 0),
        ] {
            assert_eq!(
                fee(Amount::new(amount), three_percent()).unwrap(),
                Amount::new(expected),
                "3% of {amount}"
            );
        }
    }

    #[test]
    fn fixed_part_is_added_and_capped_at_the_amount() {
        let schedule = FeeSchedule::new(290, Amount::new(30)).unwrap();
        assert_eq!(
            fee(Amount::new(10_000), schedule).unwrap(),
            Amount::new(320)
        );
        assert_eq!(fee(Amount::new(20), schedule).unwrap(), Amount::new(20));
    }

    #[test]
    fn schedules_out_of_range_are_rejected() {
        assert_eq!(
            FeeSchedule::new(10_001, Amount::ZERO),
            Err(FeeError::BpsTooLarge { bps: 10_001 })
        );
        assert_eq!(
            FeeSchedule::new(1, Amount::new(-1)),
            Err(FeeError::FixedMustNotBeNegative)
        );
        assert!(serde_json::from_str::<FeeSchedule>(r#"{"bps":20000,"fixed_minor":0}"#).is_err());
        assert_eq!(
            serde_json::to_value(FeeSchedule::default()).unwrap(),
            serde_json::json!({"bps": 300, "fixed_minor": 0})
        );
    }

    #[test]
    fn negative_amounts_have_no_fee() {
        assert_eq!(
            fee(Amount::new(-1), three_percent()),
            Err(FeeError::AmountMustNotBeNegative)
        );
    }

    #[test]
    fn the_largest_amount_does_not_overflow() {
        let all = FeeSchedule::new(FEE_BPS_MAX, Amount::ZERO).unwrap();
        assert_eq!(
            fee(Amount::new(i64::MAX), all).unwrap(),
            Amount::new(i64::MAX)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn fee_is_monotone_and_bounded(a in 0i64..1_000_000_000_000, d in 0i64..1_000_000, bps in 0u32..=FEE_BPS_MAX, fixed in 0i64..1000) {
            let s = FeeSchedule::new(bps, Amount::new(fixed)).unwrap();
            let low = fee(Amount::new(a), s).unwrap();
            let high = fee(Amount::new(a + d), s).unwrap();
            prop_assert!(low <= high);
            prop_assert!(low.minor() <= a);
            // Growing the amount by d never grows the fee by more than d:
            // this is what keeps a refunded customer from going negative.
            prop_assert!(high.minor() - low.minor() <= d);
        }
    }
}
