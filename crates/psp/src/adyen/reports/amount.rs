//! A report's decimal amount (major units, `"12.34"`) in minor units, through the ledger's one
//! conversion (`asiento_domain::parse_major`). Nothing is rounded: a value with more decimals than
//! its currency has is refused, because a report that says `10.005` EUR is not one the ledger can
//! post. A report leaves a column empty when it does not apply: that is zero here.

use asiento_domain::{Currency, MajorUnitsError};

/// Why a report amount is not an amount.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error("unknown currency {0:?}")]
    CurrencyUnknown(String),
    #[error(transparent)]
    Text(#[from] MajorUnitsError),
}

fn currency_of(code: &str) -> Result<Currency, AmountError> {
    Currency::parse(code).map_err(|_| AmountError::CurrencyUnknown(code.to_owned()))
}

/// The currency's exponent, refusing a code the ledger does not know.
pub fn exponent_of(currency: &str) -> Result<u8, AmountError> {
    currency_of(currency).map(|currency| currency.exponent())
}

/// `text` in minor units of `currency`; empty is zero.
pub fn minor_units(text: &str, currency: &str) -> Result<i64, AmountError> {
    let currency = currency_of(currency)?;
    if text.trim().is_empty() {
        return Ok(0);
    }
    Ok(asiento_domain::parse_major(text, currency)?)
}

/// `minor` units of `currency` as a report writes them (`-12.34`), for the simulator's reports.
pub fn major_units(minor: i64, currency: &str) -> Result<String, AmountError> {
    Ok(asiento_domain::format_major(
        i128::from(minor),
        currency_of(currency)?,
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn an_empty_column_is_zero_and_an_unknown_currency_is_refused() {
        assert_eq!(minor_units("", "EUR"), Ok(0));
        assert_eq!(minor_units("  ", "EUR"), Ok(0));
        assert_eq!(minor_units("12.34", "EUR"), Ok(1234));
        assert!(matches!(
            minor_units("12.00", "eur"),
            Err(AmountError::CurrencyUnknown(_))
        ));
        assert!(matches!(
            minor_units("10.005", "EUR"),
            Err(AmountError::Text(MajorUnitsError::TooManyDecimals { .. }))
        ));
        assert_eq!(major_units(-1, "EUR").unwrap(), "-0.01");
    }
}
