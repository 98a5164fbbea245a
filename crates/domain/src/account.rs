//! Account names and the rules that hang off their first segment.
//!
//! Names are `segment(:segment)*` with segments `[a-z0-9_-]{1,64}`. The first
//! segment decides two things:
//!
//! - **System accounts** (`psp:…`, `revenue:…`, `expense:…`, `bank:…`) are the
//!   system's own: only postings the system makes (captures, fees, refunds,
//!   payouts) touch them, never a client's transfer or declaration.
//! - **Client accounts** (every other) have a debit guard, so that their
//!   policy ([`crate::policy`]) holds under concurrent commands. A
//!   `customer:…` account's implied policy forbids overdrafts.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::ids::{CustomerId, ProviderName};

/// The longest segment of an account name, in characters.
pub const SEGMENT_CHARS_MAX: usize = 64;
/// The most segments an account name may have; names are paths, not essays.
pub const SEGMENTS_MAX: usize = 8;

/// The first segment of customers' accounts, which a command may not overdraw unless declared
/// otherwise.
pub const CUSTOMER_ROOT: &str = "customer";
/// The first segments of the system's own accounts.
pub const SYSTEM_ROOTS: [&str; 4] = ["psp", "revenue", "expense", "bank"];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccountError {
    #[error(
        "account name {0:?} must be segment(:segment)* with at most {SEGMENTS_MAX} segments of 1 to {SEGMENT_CHARS_MAX} characters from a-z, 0-9, '_' and '-'"
    )]
    Invalid(String),
}

/// `[a-z0-9_-]{1,64}`.
#[must_use]
pub fn is_valid_segment(segment: &str) -> bool {
    !segment.is_empty()
        && segment.len() <= SEGMENT_CHARS_MAX
        && segment
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// A validated account name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AccountName(String);

impl AccountName {
    pub fn parse(name: &str) -> Result<Self, AccountError> {
        AccountName::check(name)?;
        Ok(AccountName(name.to_owned()))
    }

    fn check(name: &str) -> Result<(), AccountError> {
        let segments = name.split(':');
        let mut count = 0;
        for segment in segments {
            count += 1;
            if count > SEGMENTS_MAX || !is_valid_segment(segment) {
                return Err(AccountError::Invalid(name.to_owned()));
            }
        }
        Ok(())
    }

    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn root(&self) -> &str {
        self.0.split(':').next().unwrap_or_default()
    }

    /// A `customer:…` account.
    #[must_use]
    pub fn is_customer(&self) -> bool {
        self.root() == CUSTOMER_ROOT
    }

    /// One of the system's own accounts, which no client command may name.
    #[must_use]
    pub fn is_system(&self) -> bool {
        SYSTEM_ROOTS.contains(&self.root())
    }

    /// Whether postings to this account go through its debit guard: every client account.
    #[must_use]
    pub fn is_guarded(&self) -> bool {
        !self.is_system()
    }

    /// `customer:{id}:available`: where a customer's captured money lands.
    #[must_use]
    pub fn customer_available(customer: &CustomerId) -> Self {
        AccountName(format!("{CUSTOMER_ROOT}:{customer}:available"))
    }

    /// `psp:{provider}:clearing`: negative while the provider owes us money.
    #[must_use]
    pub fn psp_clearing(provider: &ProviderName) -> Self {
        AccountName(format!("psp:{provider}:clearing"))
    }

    /// `revenue:fees`: the platform's fees.
    #[must_use]
    pub fn revenue_fees() -> Self {
        AccountName("revenue:fees".to_owned())
    }
}

impl fmt::Display for AccountName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for AccountName {
    type Err = AccountError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AccountName::parse(s)
    }
}

impl TryFrom<String> for AccountName {
    type Error = AccountError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        AccountName::check(&value)?;
        Ok(AccountName(value))
    }
}

impl From<AccountName> for String {
    fn from(value: AccountName) -> String {
        value.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names() {
        for name in [
            "customer:42:available",
            "revenue:fees",
            "psp:sim:clearing",
            "a",
            "a-b_c:9",
        ] {
            assert!(AccountName::parse(name).is_ok(), "{name}");
        }
        assert!(AccountName::parse(&format!("a:{}", "x".repeat(64))).is_ok());
    }

    #[test]
    fn invalid_names() {
        let long = format!("a:{}", "x".repeat(65));
        let deep = ["a"; 9].join(":");
        for name in [
            "",
            ":",
            "a:",
            ":a",
            "a::b",
            "Customer:1",
            "a b",
            "a/b",
            "é",
            long.as_str(),
            deep.as_str(),
        ] {
            assert!(AccountName::parse(name).is_err(), "{name:?} accepted");
        }
    }

    #[test]
    fn the_first_segment_decides_customer_system_and_guarded() {
        let parse = |name| AccountName::parse(name).unwrap();
        assert!(parse("customer:42:available").is_customer());
        assert!(parse("customer").is_customer());
        assert!(!parse("customers:42").is_customer());
        for system in [
            "psp:sim:clearing",
            "revenue:fees",
            "expense:provider_fees:stripe",
            "bank:stripe:payouts",
            "bank",
        ] {
            assert!(parse(system).is_system(), "{system}");
            assert!(!parse(system).is_guarded(), "{system}");
        }
        assert!(AccountName::revenue_fees().is_system());
        for client in [
            "customer:1:available",
            "merchant:7",
            "banks:1",
            "psps",
            "expenses:x",
        ] {
            assert!(!parse(client).is_system(), "{client}");
            assert!(parse(client).is_guarded(), "{client}");
        }
    }

    #[test]
    fn well_known_accounts_are_valid_names() {
        let customer = CustomerId::parse("42").unwrap();
        let provider = ProviderName::parse("sim").unwrap();
        for account in [
            AccountName::customer_available(&customer),
            AccountName::psp_clearing(&provider),
            AccountName::revenue_fees(),
        ] {
            assert_eq!(AccountName::parse(account.as_str()).unwrap(), account);
        }
    }
}
