//! Money as integers: an [`Amount`] is a count of a currency's minor unit
//! and a [`Currency`] is an ISO 4217 code that knows its minor-unit exponent.
//!
//! There is no float anywhere in this module on purpose: every amount that
//! crosses the API is already in minor units, and every operation that could
//! overflow says so instead of wrapping.
//!
//! Amounts are bounded: a command carries at most its deployment's
//! [`AmountLimit`] (10^15 minor units unless configured, at most
//! [`AMOUNT_MAX_CEILING`]), and a sum of amounts is a [`Balance`] in `i128`.
//! With every amount at most 10^18, a balance would need more than 10^20
//! postings to overflow, so no sequence of accepted commands can stop a
//! projection that adds them up.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Arithmetic on amounts failed instead of wrapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error("amount arithmetic overflowed i64")]
    Overflow,
}

/// A signed count of minor units (cents for USD, yen for JPY, fils for KWD).
///
/// Signed because journal legs are signed; rules that need a positive amount
/// check it where the rule lives and reject with a named reason.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Amount(i64);

impl Amount {
    pub const ZERO: Amount = Amount(0);

    #[must_use]
    pub const fn new(minor: i64) -> Self {
        Amount(minor)
    }

    #[must_use]
    pub const fn minor(self) -> i64 {
        self.0
    }

    pub fn checked_add(self, other: Amount) -> Result<Amount, AmountError> {
        self.0
            .checked_add(other.0)
            .map(Amount)
            .ok_or(AmountError::Overflow)
    }

    pub fn checked_sub(self, other: Amount) -> Result<Amount, AmountError> {
        self.0
            .checked_sub(other.0)
            .map(Amount)
            .ok_or(AmountError::Overflow)
    }

    /// `-i64::MIN` does not exist, so even negation is checked.
    pub fn checked_neg(self) -> Result<Amount, AmountError> {
        self.0
            .checked_neg()
            .map(Amount)
            .ok_or(AmountError::Overflow)
    }

    #[must_use]
    pub const fn is_positive(self) -> bool {
        self.0 > 0
    }

    #[must_use]
    pub const fn is_negative(self) -> bool {
        self.0 < 0
    }

    #[must_use]
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The default [`AmountLimit`]: 10^15 minor units (ten trillion dollars in cents).
pub const AMOUNT_MAX_DEFAULT: i64 = 1_000_000_000_000_000;
/// The largest limit a deployment may configure (10^18): below `i64::MAX` with room, so that
/// a few amounts added in `i64` (an entry's legs, a payment's captures) stay exact.
pub const AMOUNT_MAX_CEILING: i64 = 1_000_000_000_000_000_000;

/// An amount was larger than the deployment accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AmountLimitError {
    #[error("{amount} minor units is more than the largest amount accepted ({max})")]
    TooLarge { amount: Amount, max: Amount },
    #[error("the amount limit must be 1 to {AMOUNT_MAX_CEILING} minor units, got {0}")]
    InvalidLimit(i64),
}

/// The largest amount one command may carry, checked at the edge before anything is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmountLimit(Amount);

impl AmountLimit {
    pub const DEFAULT: AmountLimit = AmountLimit(Amount(AMOUNT_MAX_DEFAULT));
    pub const CEILING: AmountLimit = AmountLimit(Amount(AMOUNT_MAX_CEILING));

    /// A limit of 1 to [`AMOUNT_MAX_CEILING`] minor units.
    pub fn new(max_minor: i64) -> Result<Self, AmountLimitError> {
        if (1..=AMOUNT_MAX_CEILING).contains(&max_minor) {
            Ok(AmountLimit(Amount(max_minor)))
        } else {
            Err(AmountLimitError::InvalidLimit(max_minor))
        }
    }

    #[must_use]
    pub const fn max(self) -> Amount {
        self.0
    }

    /// `amount` itself when it is within the limit.
    pub fn check(self, amount: Amount) -> Result<Amount, AmountLimitError> {
        if amount.0 <= self.0 .0 {
            Ok(amount)
        } else {
            Err(AmountLimitError::TooLarge {
                amount,
                max: self.0,
            })
        }
    }
}

impl Default for AmountLimit {
    fn default() -> Self {
        AmountLimit::DEFAULT
    }
}

/// A sum of amounts: what an account holds. `i128`, so that it cannot overflow while every
/// amount added is bounded (see the module docs); serialized as a JSON integer.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Balance(i128);

impl Balance {
    pub const ZERO: Balance = Balance(0);

    #[must_use]
    pub const fn new(minor: i128) -> Self {
        Balance(minor)
    }

    #[must_use]
    pub const fn minor(self) -> i128 {
        self.0
    }

    pub fn checked_add(self, amount: Amount) -> Result<Balance, AmountError> {
        self.0
            .checked_add(i128::from(amount.0))
            .map(Balance)
            .ok_or(AmountError::Overflow)
    }

    pub fn checked_sum(self, other: Balance) -> Result<Balance, AmountError> {
        self.0
            .checked_add(other.0)
            .map(Balance)
            .ok_or(AmountError::Overflow)
    }

    pub fn checked_neg(self) -> Result<Balance, AmountError> {
        self.0
            .checked_neg()
            .map(Balance)
            .ok_or(AmountError::Overflow)
    }

    /// The balance as an amount, when it fits one.
    pub fn to_amount(self) -> Result<Amount, AmountError> {
        i64::try_from(self.0)
            .map(Amount)
            .map_err(|_| AmountError::Overflow)
    }
}

impl From<Amount> for Balance {
    fn from(amount: Amount) -> Self {
        Balance(i128::from(amount.0))
    }
}

impl fmt::Display for Balance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for Balance {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Balance)
    }
}

/// A currency code was not an ISO 4217 code we know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CurrencyError {
    #[error("unknown currency code {0:?} (expected an ISO 4217 code such as \"USD\")")]
    Unknown(String),
}

/// An ISO 4217 currency with its minor-unit exponent.
///
/// Only codes in [`CURRENCIES`] can be constructed, so holding a `Currency`
/// proves the code is known.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Currency {
    code: [u8; 3],
    exponent: u8,
}

impl Currency {
    /// Parses an upper-case ISO 4217 code. Lower case is rejected rather than
    /// normalised so that a stored code is always written one way.
    pub fn parse(code: &str) -> Result<Self, CurrencyError> {
        // CURRENCIES is sorted by code (a test checks), so this is a binary search: every leg
        // of every entry read from the log parses its currency.
        CURRENCIES
            .binary_search_by(|(known, _)| (*known).cmp(code))
            .ok()
            .and_then(|index| CURRENCIES.get(index))
            .and_then(|(known, exponent)| {
                let bytes: [u8; 3] = known.as_bytes().try_into().ok()?;
                Some(Currency {
                    code: bytes,
                    exponent: *exponent,
                })
            })
            .ok_or_else(|| CurrencyError::Unknown(code.to_owned()))
    }

    #[must_use]
    pub fn code(&self) -> &str {
        // Only ASCII codes from CURRENCIES are ever stored.
        std::str::from_utf8(&self.code).unwrap_or("???")
    }

    /// How many decimal digits the minor unit has: USD 2, JPY 0, KWD 3.
    #[must_use]
    pub const fn exponent(&self) -> u8 {
        self.exponent
    }
}

impl fmt::Debug for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.code())
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

impl FromStr for Currency {
    type Err = CurrencyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Currency::parse(s)
    }
}

impl Serialize for Currency {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.code())
    }
}

impl<'de> Deserialize<'de> for Currency {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Code;
        impl serde::de::Visitor<'_> for Code {
            type Value = Currency;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an ISO 4217 currency code")
            }
            fn visit_str<E: serde::de::Error>(self, code: &str) -> Result<Currency, E> {
                Currency::parse(code).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Code)
    }
}

/// The active ISO 4217 currencies that have a minor unit, with its exponent.
/// Funds, precious metals and testing codes (XAU, XDR, XTS…) are left out:
/// nobody pays with them.
#[rustfmt::skip]
pub const CURRENCIES: &[(&str, u8)] = &[
    ("AED", 2), ("AFN", 2), ("ALL", 2), ("AMD", 2), ("ANG", 2), ("AOA", 2),
    ("ARS", 2), ("AUD", 2), ("AWG", 2), ("AZN", 2), ("BAM", 2), ("BBD", 2),
    ("BDT", 2), ("BGN", 2), ("BHD", 3), ("BIF", 0), ("BMD", 2), ("BND", 2),
    ("BOB", 2), ("BRL", 2), ("BSD", 2), ("BTN", 2), ("BWP", 2), ("BYN", 2),
    ("BZD", 2), ("CAD", 2), ("CDF", 2), ("CHF", 2), ("CLF", 4), ("CLP", 0),
    ("CNY", 2), ("COP", 2), ("CRC", 2), ("CUP", 2), ("CVE", 2), ("CZK", 2),
    ("DJF", 0), ("DKK", 2), ("DOP", 2), ("DZD", 2), ("EGP", 2), ("ERN", 2),
    ("ETB", 2), ("EUR", 2), ("FJD", 2), ("FKP", 2), ("GBP", 2), ("GEL", 2),
    ("GHS", 2), ("GIP", 2), ("GMD", 2), ("GNF", 0), ("GTQ", 2), ("GYD", 2),
    ("HKD", 2), ("HNL", 2), ("HTG", 2), ("HUF", 2), ("IDR", 2), ("ILS", 2),
    ("INR", 2), ("IQD", 3), ("IRR", 2), ("ISK", 0), ("JMD", 2), ("JOD", 3),
    ("JPY", 0), ("KES", 2), ("KGS", 2), ("KHR", 2), ("KMF", 0), ("KPW", 2),
    ("KRW", 0), ("KWD", 3), ("KYD", 2), ("KZT", 2), ("LAK", 2), ("LBP", 2),
    ("LKR", 2), ("LRD", 2), ("LSL", 2), ("LYD", 3), ("MAD", 2), ("MDL", 2),
    ("MGA", 2), ("MKD", 2), ("MMK", 2), ("MNT", 2), ("MOP", 2), ("MRU", 2),
    ("MUR", 2), ("MVR", 2), ("MWK", 2), ("MXN", 2), ("MYR", 2), ("MZN", 2),
    ("NAD", 2), ("NGN", 2), ("NIO", 2), ("NOK", 2), ("NPR", 2), ("NZD", 2),
    ("OMR", 3), ("PAB", 2), ("PEN", 2), ("PGK", 2), ("PHP", 2), ("PKR", 2),
    ("PLN", 2), ("PYG", 0), ("QAR", 2), ("RON", 2), ("RSD", 2), ("RUB", 2),
    ("RWF", 0), ("SAR", 2), ("SBD", 2), ("SCR", 2), ("SDG", 2), ("SEK", 2),
    ("SGD", 2), ("SHP", 2), ("SLE", 2), ("SOS", 2), ("SRD", 2), ("SSP", 2),
    ("STN", 2), ("SVC", 2), ("SYP", 2), ("SZL", 2), ("THB", 2), ("TJS", 2),
    ("TMT", 2), ("TND", 3), ("TOP", 2), ("TRY", 2), ("TTD", 2), ("TWD", 2),
    ("TZS", 2), ("UAH", 2), ("UGX", 0), ("USD", 2), ("UYI", 0), ("UYU", 2),
    ("UYW", 4), ("UZS", 2), ("VES", 2), ("VND", 0), ("VUV", 0), ("WST", 2),
    ("XAF", 0), ("XCD", 2), ("XOF", 0), ("XPF", 0), ("YER", 2), ("ZAR", 2),
    ("ZMW", 2), ("ZWG", 2),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponents_of_well_known_currencies() {
        for (code, exponent) in [("USD", 2), ("EUR", 2), ("JPY", 0), ("KWD", 3), ("CLF", 4)] {
            assert_eq!(
                Currency::parse(code).unwrap().exponent(),
                exponent,
                "{code}"
            );
        }
    }

    #[test]
    fn unknown_and_malformed_codes_are_rejected() {
        for code in ["", "US", "usd", "USDD", "XXX", "ABC", "XAU", "US D"] {
            assert!(Currency::parse(code).is_err(), "{code:?} accepted");
        }
    }

    #[test]
    fn currency_table_has_no_duplicates_and_only_upper_case_codes() {
        let mut seen = std::collections::BTreeSet::new();
        for (code, _) in CURRENCIES {
            assert!(code.len() == 3 && code.bytes().all(|b| b.is_ascii_uppercase()));
            assert!(seen.insert(*code), "duplicate {code}");
        }
    }

    #[test]
    fn currency_table_is_sorted_so_every_code_is_found() {
        assert!(
            CURRENCIES.windows(2).all(|pair| pair[0].0 < pair[1].0),
            "CURRENCIES must stay sorted by code: parse searches it by halves"
        );
        for (code, exponent) in CURRENCIES {
            let parsed = Currency::parse(code).unwrap();
            assert_eq!((parsed.code(), parsed.exponent()), (*code, *exponent));
            let decoded: Currency = serde_json::from_value(serde_json::json!(code)).unwrap();
            assert_eq!(decoded, parsed);
        }
        assert!(serde_json::from_value::<Currency>(serde_json::json!("usd")).is_err());
        assert!(serde_json::from_value::<Currency>(serde_json::json!(840)).is_err());
    }

    #[test]
    fn currency_serializes_as_its_code() {
        let usd = Currency::parse("USD").unwrap();
        assert_eq!(serde_json::to_string(&usd).unwrap(), "\"USD\"");
        assert_eq!(serde_json::from_str::<Currency>("\"USD\"").unwrap(), usd);
        assert!(serde_json::from_str::<Currency>("\"ZZZ\"").is_err());
    }

    #[test]
    fn amount_arithmetic_overflows_into_an_error() {
        assert_eq!(
            Amount::new(i64::MAX).checked_add(Amount::new(1)),
            Err(AmountError::Overflow)
        );
        assert_eq!(
            Amount::new(i64::MIN).checked_sub(Amount::new(1)),
            Err(AmountError::Overflow)
        );
        assert_eq!(
            Amount::new(i64::MIN).checked_neg(),
            Err(AmountError::Overflow)
        );
        assert_eq!(
            Amount::new(2).checked_sub(Amount::new(5)),
            Ok(Amount::new(-3))
        );
    }

    #[test]
    fn amount_limits_refuse_what_is_above_them() {
        let limit = AmountLimit::default();
        assert_eq!(limit.max(), Amount::new(AMOUNT_MAX_DEFAULT));
        assert_eq!(
            limit.check(Amount::new(AMOUNT_MAX_DEFAULT)),
            Ok(Amount::new(AMOUNT_MAX_DEFAULT))
        );
        assert!(limit.check(Amount::new(AMOUNT_MAX_DEFAULT + 1)).is_err());
        assert!(limit.check(Amount::new(i64::MAX)).is_err());
        assert_eq!(
            AmountLimit::new(AMOUNT_MAX_CEILING),
            Ok(AmountLimit::CEILING)
        );
        for invalid in [0, -1, AMOUNT_MAX_CEILING + 1, i64::MAX] {
            assert_eq!(
                AmountLimit::new(invalid),
                Err(AmountLimitError::InvalidLimit(invalid))
            );
        }
    }

    #[test]
    fn balances_hold_sums_beyond_i64_as_json_integers() {
        let mut balance = Balance::ZERO;
        for _ in 0..3 {
            balance = balance.checked_add(Amount::new(i64::MAX)).unwrap();
        }
        assert_eq!(balance.minor(), 3 * i128::from(i64::MAX));
        let json = serde_json::to_string(&balance).unwrap();
        assert_eq!(json, "27670116110564327421");
        assert_eq!(serde_json::from_str::<Balance>(&json).unwrap(), balance);
        assert_eq!(json.parse::<Balance>().unwrap(), balance);
        assert!(Balance::new(i128::MAX).checked_add(Amount::new(1)).is_err());
    }

    #[test]
    fn amount_serializes_as_a_json_integer() {
        assert_eq!(serde_json::to_string(&Amount::new(10000)).unwrap(), "10000");
        assert!(serde_json::from_str::<Amount>("100.5").is_err());
        assert!(serde_json::from_str::<Amount>("\"100\"").is_err());
    }
}
