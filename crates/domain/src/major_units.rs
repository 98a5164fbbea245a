//! The one conversion between minor units and the decimal text people read and type
//! (`"12.34"` USD is 1234 cents), by the currency's exponent ([`Currency::exponent`], the one table
//! of exponents). Nothing is rounded: text with more decimals than its currency has is refused
//! (`10.005` EUR is not an amount), and no float is involved. The console shows and reads money
//! through it, the CLI prints it, and the Adyen reports (which state amounts in major units) are
//! read and written with it.

use crate::money::Currency;

/// Why a decimal text is not an amount of its currency.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MajorUnitsError {
    #[error("{text:?} is not a decimal number")]
    NotANumber { text: String },
    #[error("{text:?} has more decimals than {currency} has ({exponent})")]
    TooManyDecimals {
        text: String,
        currency: Currency,
        exponent: u8,
    },
    #[error("{text:?} does not fit in minor units")]
    TooLarge { text: String },
}

/// `text` (an optional sign, digits, an optional `.` and decimals; surrounding blanks ignored) in
/// minor units of `currency`. Grouping (`1,000`), exponents and empty text are refused.
pub fn parse_major(text: &str, currency: Currency) -> Result<i64, MajorUnitsError> {
    let text = text.trim();
    let exponent = currency.exponent();
    let not_a_number = || MajorUnitsError::NotANumber {
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
        // but `100.000` EUR is 100 euros.
        if decimals[usize::from(exponent)..].bytes().any(|b| b != b'0') {
            return Err(MajorUnitsError::TooManyDecimals {
                text: text.to_owned(),
                currency,
                exponent,
            });
        }
    }
    let too_large = || MajorUnitsError::TooLarge {
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

/// `minor` units of `currency` as decimal text (`-12.34`, `1500` JPY, `1.234` KWD): the inverse
/// of [`parse_major`]. Takes an `i128` so that a [`crate::Balance`] prints as it is.
#[must_use]
pub fn format_major(minor: i128, currency: Currency) -> String {
    let exponent = usize::from(currency.exponent());
    let digits = minor.unsigned_abs().to_string();
    let sign = if minor < 0 { "-" } else { "" };
    if exponent == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = exponent + 1);
    let (whole, decimals) = padded.split_at(padded.len() - exponent);
    format!("{sign}{whole}.{decimals}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    fn currency(code: &str) -> Currency {
        Currency::parse(code).unwrap()
    }

    fn check(text: &str, code: &str, expected: Result<i64, &str>) {
        let got = parse_major(text, currency(code)).map_err(|error| match error {
            MajorUnitsError::NotANumber { .. } => "nan",
            MajorUnitsError::TooManyDecimals { .. } => "decimals",
            MajorUnitsError::TooLarge { .. } => "large",
        });
        assert_eq!(got, expected, "{text:?} {code}");
    }

    #[test]
    fn amounts_are_converted_by_the_currency_s_exponent_and_never_rounded() {
        for (text, code, expected) in [
            ("12.34", "EUR", Ok(1234)),
            ("12.3", "EUR", Ok(1230)),
            ("12", "EUR", Ok(1200)),
            ("-0.01", "EUR", Ok(-1)),
            ("+5.00", "USD", Ok(500)),
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
            ("", "EUR", Err("nan")),
            ("1,000.00", "EUR", Err("nan")),
            ("1e3", "EUR", Err("nan")),
            ("-", "EUR", Err("nan")),
            (".", "EUR", Err("nan")),
            ("1.2.3", "EUR", Err("nan")),
            ("١٢", "EUR", Err("nan")),
            ("92233720368547758.07", "EUR", Ok(i64::MAX)),
            ("92233720368547758.08", "EUR", Err("large")),
        ] {
            check(text, code, expected);
        }
    }

    #[test]
    fn written_amounts_read_back_as_the_same_minor_units() {
        for (minor, code, text) in [
            (1234, "EUR", "12.34"),
            (-1, "EUR", "-0.01"),
            (0, "EUR", "0.00"),
            (1500, "JPY", "1500"),
            (1234, "KWD", "1.234"),
            (i128::from(i64::MIN), "EUR", "-92233720368547758.08"),
        ] {
            assert_eq!(format_major(minor, currency(code)), text);
            if minor != i128::from(i64::MIN) {
                assert_eq!(
                    i128::from(parse_major(text, currency(code)).unwrap()),
                    minor
                );
            }
        }
    }

    proptest! {
        #[test]
        fn every_amount_reads_back_from_its_text(
            minor in (i64::MIN + 1)..=i64::MAX,
            code in prop::sample::select(vec!["USD", "JPY", "KWD", "EUR", "CLF"]),
        ) {
            let currency = currency(code);
            let text = format_major(i128::from(minor), currency);
            prop_assert_eq!(parse_major(&text, currency), Ok(minor));
        }
    }
}
