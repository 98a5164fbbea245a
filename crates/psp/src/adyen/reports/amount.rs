//! The one conversion of a report's decimal amount (major units, `"12.34"`) into minor units by
//! the currency's exponent (`asiento_domain::Currency`, the one table of exponents). Nothing is
//! rounded: a value with more decimals than its currency has is refused, because a report that
//! says `10.005` EUR is not one the ledger can post. No floats are involved.

use asiento_domain::Currency;

/// Why a report amount is not an amount.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error("unknown currency {0:?}")]
    CurrencyUnknown(String),
    #[error("{text:?} is not a decimal number")]
    NotANumber { text: String },
    #[error("{text:?} has more decimals than {currency} has ({exponent})")]
    TooManyDecimals {
        text: String,
        currency: String,
        exponent: u8,
    },
    #[error("{text:?} does not fit in minor units")]
    TooLarge { text: String },
}

/// The currency's exponent, refusing a code the ledger does not know.
pub fn exponent_of(currency: &str) -> Result<u8, AmountError> {
    Currency::parse(currency)
        .map(|currency| currency.exponent())
        .map_err(|_| AmountError::CurrencyUnknown(currency.to_owned()))
}

/// `text` (an optional sign, digits, an optional `.` and decimals; empty is zero, as a report
/// leaves a column empty when it does not apply) in minor units of `currency`.
pub fn minor_units(text: &str, currency: &str) -> Result<i64, AmountError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(0);
    }
    let exponent = exponent_of(currency)?;
    let not_a_number = || AmountError::NotANumber {
        text: text.to_owned(),
    };
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (whole, decimals) = digits.split_once('.').unwrap_or((digits, ""));
    let all_digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && decimals.is_empty()) || !all_digits(whole) || !all_digits(decimals) {
        return Err(not_a_number());
    }
    if decimals.len() > usize::from(exponent) {
        // Trailing zeros beyond the exponent say nothing more: `10.500` JPY is not 10.5 yen,
        // but `10.00` KWD-with-3 is fine and `100.000` EUR is 100 euros.
        if decimals[usize::from(exponent)..].bytes().any(|b| b != b'0') {
            return Err(AmountError::TooManyDecimals {
                text: text.to_owned(),
                currency: currency.to_owned(),
                exponent,
            });
        }
    }
    let too_large = || AmountError::TooLarge {
        text: text.to_owned(),
    };
    let mut minor: i64 = 0;
    let padded = decimals
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(usize::from(exponent));
    for digit in whole.bytes().chain(padded) {
        minor = minor
            .checked_mul(10)
            .and_then(|value| value.checked_add(i64::from(digit - b'0')))
            .ok_or_else(too_large)?;
    }
    Ok(if negative { -minor } else { minor })
}

/// `minor` units of `currency` as a report writes them (`-12.34`): the inverse of
/// [`minor_units`], for the simulator's reports.
pub fn major_units(minor: i64, currency: &str) -> Result<String, AmountError> {
    let exponent = usize::from(exponent_of(currency)?);
    let digits = minor.unsigned_abs().to_string();
    let sign = if minor < 0 { "-" } else { "" };
    if exponent == 0 {
        return Ok(format!("{sign}{digits}"));
    }
    let padded = format!("{digits:0>width$}", width = exponent + 1);
    let (whole, decimals) = padded.split_at(padded.len() - exponent);
    Ok(format!("{sign}{whole}.{decimals}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn check(text: &str, currency: &str, expected: Result<i64, &str>) {
        let got = minor_units(text, currency).map_err(|error| match error {
            AmountError::CurrencyUnknown(_) => "currency",
            AmountError::NotANumber { .. } => "nan",
            AmountError::TooManyDecimals { .. } => "decimals",
            AmountError::TooLarge { .. } => "large",
        });
        assert_eq!(got, expected, "{text:?} {currency}");
    }

    #[test]
    fn amounts_are_converted_by_the_currency_s_exponent_and_never_rounded() {
        for (text, currency, expected) in [
            ("12.34", "EUR", Ok(1234)),
            ("12.3", "EUR", Ok(1230)),
            ("12", "EUR", Ok(1200)),
            ("-0.01", "EUR", Ok(-1)),
            ("+5.00", "USD", Ok(500)),
            ("", "EUR", Ok(0)),
            ("  7.10 ", "EUR", Ok(710)),
            (".5", "EUR", Ok(50)),
            ("100.000", "EUR", Ok(10_000)),
            ("1500", "JPY", Ok(1500)),
            ("1500.0", "JPY", Ok(1500)),
            ("1500.5", "JPY", Err("decimals")),
            ("1.234", "KWD", Ok(1234)),
            ("1.2345", "KWD", Err("decimals")),
            ("12.345", "EUR", Err("decimals")),
            ("10.005", "EUR", Err("decimals")),
            ("1,000.00", "EUR", Err("nan")),
            ("1e3", "EUR", Err("nan")),
            ("-", "EUR", Err("nan")),
            (".", "EUR", Err("nan")),
            ("1.2.3", "EUR", Err("nan")),
            ("12.00", "XXX", Err("currency")),
            ("12.00", "eur", Err("currency")),
            ("92233720368547758.07", "EUR", Ok(i64::MAX)),
            ("92233720368547758.08", "EUR", Err("large")),
        ] {
            check(text, currency, expected);
        }
    }

    #[test]
    fn written_amounts_read_back_as_the_same_minor_units() {
        for (minor, currency, text) in [
            (1234, "EUR", "12.34"),
            (-1, "EUR", "-0.01"),
            (0, "EUR", "0.00"),
            (1500, "JPY", "1500"),
            (1234, "KWD", "1.234"),
            (i64::MIN, "EUR", "-92233720368547758.08"),
        ] {
            assert_eq!(major_units(minor, currency).unwrap(), text);
            if minor != i64::MIN {
                assert_eq!(minor_units(text, currency).unwrap(), minor);
            }
        }
    }
}
