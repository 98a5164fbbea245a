//! The fee the simulated provider keeps on a charge: the provider's own rounding, not the ledger's.
//! A real provider rounds its fees as it likes and tells us the result; the ledger posts what it
//! is told and rounds only its own platform fee (`asiento_domain::fee`, the one rounding of ours).

/// `fee_bps` of `amount_minor`, rounded half up, without floats or overflow: what this simulated
/// provider keeps.
pub fn provider_fee_minor(amount_minor: i64, fee_bps: u32) -> i64 {
    let scaled = i128::from(amount_minor) * i128::from(fee_bps);
    let rounded = (scaled + 5_000).div_euclid(10_000);
    i64::try_from(rounded).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fee_rounds_half_up_in_minor_units() {
        // API.md's examples at 300 bps: 50 -> 1.5 -> 2, 49 -> 1.47 -> 1.
        assert_eq!(provider_fee_minor(50, 300), 2);
        assert_eq!(provider_fee_minor(49, 300), 1);
        assert_eq!(provider_fee_minor(10_000, 300), 300);
        assert_eq!(provider_fee_minor(10_000, 0), 0);
        assert_eq!(provider_fee_minor(i64::MAX, u32::MAX), i64::MAX);
    }
}
