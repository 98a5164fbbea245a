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
//! - **Pending accounts** (`pending_debits:{account}`, `pending_credits:{account}`) hold what
//!   holds reserve on `{account}` (see [`crate::transfer`]): a hold's entry moves money between
//!   the pending accounts of its two sides, its post or void moves it back. They are system
//!   accounts too; their name is the account's with one more segment, so it may have
//!   [`SEGMENTS_MAX`] + 1 segments.

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
/// The first segment of the account holding what holds reserve to leave an account.
pub const PENDING_DEBITS_ROOT: &str = "pending_debits";
/// The first segment of the account holding what holds reserve to reach an account.
pub const PENDING_CREDITS_ROOT: &str = "pending_credits";

/// Which of an account's two pending accounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PendingSide {
    /// Money reserved to leave the account (the source of a hold).
    Debits,
    /// Money reserved to reach the account (the destination of a hold).
    Credits,
}

impl PendingSide {
    fn root(self) -> &'static str {
        match self {
            PendingSide::Debits => PENDING_DEBITS_ROOT,
            PendingSide::Credits => PENDING_CREDITS_ROOT,
        }
    }
}

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
        // A pending account is its account's name behind one more segment.
        let of = [PENDING_DEBITS_ROOT, PENDING_CREDITS_ROOT]
            .iter()
            .find_map(|root| name.strip_prefix(root)?.strip_prefix(':'));
        if let Some(of) = of {
            let nested = [PENDING_DEBITS_ROOT, PENDING_CREDITS_ROOT]
                .contains(&of.split(':').next().unwrap_or_default());
            return if nested {
                Err(AccountError::Invalid(name.to_owned()))
            } else {
                AccountName::check(of).map_err(|_| AccountError::Invalid(name.to_owned()))
            };
        }
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

    /// One of the system's own accounts (a pending account included), which no client command
    /// may name.
    #[must_use]
    pub fn is_system(&self) -> bool {
        let root = self.root();
        SYSTEM_ROOTS.contains(&root) || [PENDING_DEBITS_ROOT, PENDING_CREDITS_ROOT].contains(&root)
    }

    /// The pending account of this account on `side`.
    #[must_use]
    pub fn pending(&self, side: PendingSide) -> Self {
        AccountName(format!("{}:{}", side.root(), self.0))
    }

    /// For a pending account: which side, and the account it holds reservations of.
    #[must_use]
    pub fn pending_of(&self) -> Option<(PendingSide, AccountName)> {
        [PendingSide::Debits, PendingSide::Credits]
            .into_iter()
            .find_map(|side| {
                let of = self.0.strip_prefix(side.root())?.strip_prefix(':')?;
                Some((side, AccountName(of.to_owned())))
            })
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

    /// `psp:{provider}:disputed`: what the provider withdrew for disputes still open (negative
    /// while it holds it).
    #[must_use]
    pub fn psp_disputed(provider: &ProviderName) -> Self {
        AccountName(format!("psp:{provider}:disputed"))
    }

    /// `expense:provider_fees:{provider}`: the fees the provider keeps out of what it owes us.
    #[must_use]
    pub fn provider_fees(provider: &ProviderName) -> Self {
        AccountName(format!("expense:provider_fees:{provider}"))
    }

    /// `bank:{provider}:payouts`: what the provider paid out into our bank account.
    #[must_use]
    pub fn provider_payouts(provider: &ProviderName) -> Self {
        AccountName(format!("bank:{provider}:payouts"))
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
    fn pending_accounts_are_system_accounts_one_segment_deeper() {
        let deepest = AccountName::parse(&["a"; SEGMENTS_MAX].join(":")).unwrap();
        for side in [PendingSide::Debits, PendingSide::Credits] {
            let pending = deepest.pending(side);
            assert_eq!(AccountName::parse(pending.as_str()).unwrap(), pending);
            assert_eq!(pending.pending_of(), Some((side, deepest.clone())));
            assert!(pending.is_system() && !pending.is_guarded());
        }
        assert_eq!(deepest.pending_of(), None);
        for invalid in [
            "pending_debits:",
            "pending_debits:A",
            "pending_credits:pending_debits:a",
            "pending_debits:pending_debits:a",
        ] {
            assert!(AccountName::parse(invalid).is_err(), "{invalid:?} accepted");
        }
        let root = AccountName::parse("pending_debits").unwrap();
        assert!(root.pending_of().is_none() && root.is_system());
        assert!(!AccountName::parse("pending_debitsx:a").unwrap().is_system());
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
