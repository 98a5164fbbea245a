//! Journal entries: the only way money moves in the ledger.
//!
//! A [`JournalEntry`] cannot exist unless it has at least two legs, no zero
//! leg, and sums to zero per currency: the constructor and the deserializer
//! both go through [`JournalEntry::new`]. Entries are never changed; a
//! correction is a new entry built by [`JournalEntry::reversal`] that names
//! the entry it reverses.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::account::AccountName;
use crate::ids::{EntryId, TenantId};
use crate::money::{Amount, AmountError, Currency};

/// Entries are a handful of legs; anything larger is a bug upstream.
pub const LEGS_MAX: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("a journal entry needs at least two legs, got {0}")]
    TooFewLegs(usize),
    #[error("a journal entry has at most {LEGS_MAX} legs, got {0}")]
    TooManyLegs(usize),
    #[error("leg on {account} is zero")]
    ZeroLeg { account: AccountName },
    #[error("legs in {currency} sum to {sum}, not zero")]
    Unbalanced { currency: Currency, sum: Amount },
    #[error(transparent)]
    Amount(#[from] AmountError),
}

/// One line of an entry: positive on the account money reaches, negative on
/// the account it leaves (the sign convention of API.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leg {
    pub account: AccountName,
    pub currency: Currency,
    #[serde(rename = "amount_minor")]
    pub amount: Amount,
}

impl Leg {
    #[must_use]
    pub fn new(account: AccountName, currency: Currency, amount: Amount) -> Self {
        Leg {
            account,
            currency,
            amount,
        }
    }
}

/// A balanced set of legs. Fields are private so that a value of this type
/// is proof of the zero-sum rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawEntry", into = "RawEntry")]
pub struct JournalEntry {
    id: EntryId,
    tenant: TenantId,
    legs: Vec<Leg>,
    reverses: Option<EntryId>,
}

impl JournalEntry {
    pub fn new(
        id: EntryId,
        tenant: TenantId,
        legs: Vec<Leg>,
        reverses: Option<EntryId>,
    ) -> Result<Self, EntryError> {
        if legs.len() < 2 {
            return Err(EntryError::TooFewLegs(legs.len()));
        }
        if legs.len() > LEGS_MAX {
            return Err(EntryError::TooManyLegs(legs.len()));
        }
        let mut sums: BTreeMap<Currency, Amount> = BTreeMap::new();
        for leg in &legs {
            if leg.amount.is_zero() {
                return Err(EntryError::ZeroLeg {
                    account: leg.account.clone(),
                });
            }
            let sum = sums.entry(leg.currency).or_default();
            *sum = sum.checked_add(leg.amount)?;
        }
        if let Some((currency, sum)) = sums.into_iter().find(|(_, sum)| !sum.is_zero()) {
            return Err(EntryError::Unbalanced { currency, sum });
        }
        Ok(JournalEntry {
            id,
            tenant,
            legs,
            reverses,
        })
    }

    /// Builds legs from `(account, amount)` pairs in one currency, dropping
    /// zero amounts: a posting rule may compute a zero share (a fee of 0) and
    /// a zero leg says nothing.
    pub fn in_one_currency(
        id: EntryId,
        tenant: TenantId,
        currency: Currency,
        amounts: impl IntoIterator<Item = (AccountName, Amount)>,
    ) -> Result<Self, EntryError> {
        let legs = amounts
            .into_iter()
            .filter(|(_, amount)| !amount.is_zero())
            .map(|(account, amount)| Leg::new(account, currency, amount))
            .collect();
        JournalEntry::new(id, tenant, legs, None)
    }

    /// The correcting entry: every leg negated, naming this entry.
    pub fn reversal(&self, id: EntryId) -> Result<Self, EntryError> {
        let legs = self
            .legs
            .iter()
            .map(|leg| {
                Ok(Leg::new(
                    leg.account.clone(),
                    leg.currency,
                    leg.amount.checked_neg()?,
                ))
            })
            .collect::<Result<Vec<_>, AmountError>>()?;
        JournalEntry::new(id, self.tenant.clone(), legs, Some(self.id))
    }

    #[must_use]
    pub fn id(&self) -> EntryId {
        self.id
    }

    #[must_use]
    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    #[must_use]
    pub fn legs(&self) -> &[Leg] {
        &self.legs
    }

    #[must_use]
    pub fn reverses(&self) -> Option<EntryId> {
        self.reverses
    }

    /// The net change per (account, currency). An account can appear in
    /// several legs; guards and balances care only about the net.
    pub fn net_changes(&self) -> Result<BTreeMap<(AccountName, Currency), Amount>, AmountError> {
        let mut net: BTreeMap<(AccountName, Currency), Amount> = BTreeMap::new();
        for leg in &self.legs {
            let sum = net.entry((leg.account.clone(), leg.currency)).or_default();
            *sum = sum.checked_add(leg.amount)?;
        }
        Ok(net)
    }
}

#[derive(Serialize, Deserialize)]
struct RawEntry {
    id: EntryId,
    tenant: TenantId,
    legs: Vec<Leg>,
    reverses: Option<EntryId>,
}

impl TryFrom<RawEntry> for JournalEntry {
    type Error = EntryError;
    fn try_from(raw: RawEntry) -> Result<Self, Self::Error> {
        JournalEntry::new(raw.id, raw.tenant, raw.legs, raw.reverses)
    }
}

impl From<JournalEntry> for RawEntry {
    fn from(entry: JournalEntry) -> Self {
        RawEntry {
            id: entry.id,
            tenant: entry.tenant,
            legs: entry.legs,
            reverses: entry.reverses,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usd() -> Currency {
        Currency::parse("USD").unwrap()
    }

    fn leg(account: &str, currency: &str, amount: i64) -> Leg {
        Leg::new(
            AccountName::parse(account).unwrap(),
            Currency::parse(currency).unwrap(),
            Amount::new(amount),
        )
    }

    fn entry(legs: Vec<Leg>) -> Result<JournalEntry, EntryError> {
        JournalEntry::new(
            EntryId::derived("t"),
            TenantId::parse("t").unwrap(),
            legs,
            None,
        )
    }

    #[test]
    fn balanced_entries_are_accepted() {
        let e = entry(vec![
            leg("psp:sim:clearing", "USD", -10_000),
            leg("customer:42:available", "USD", 9_700),
            leg("revenue:fees", "USD", 300),
        ])
        .unwrap();
        assert_eq!(e.legs().len(), 3);
    }

    #[test]
    fn malformed_entries_cannot_be_constructed() {
        assert_eq!(entry(vec![]), Err(EntryError::TooFewLegs(0)));
        assert_eq!(
            entry(vec![leg("a", "USD", 0)]),
            Err(EntryError::TooFewLegs(1))
        );
        assert!(matches!(
            entry(vec![
                leg("a", "USD", 5),
                leg("b", "USD", 0),
                leg("c", "USD", -5)
            ]),
            Err(EntryError::ZeroLeg { .. })
        ));
        assert_eq!(
            entry(vec![leg("a", "USD", 5), leg("b", "USD", -4)]),
            Err(EntryError::Unbalanced {
                currency: usd(),
                sum: Amount::new(1)
            })
        );
        // Balanced in total but not per currency.
        assert!(matches!(
            entry(vec![leg("a", "USD", 5), leg("b", "EUR", -5)]),
            Err(EntryError::Unbalanced { .. })
        ));
        assert_eq!(
            entry(vec![
                leg("a", "USD", i64::MAX),
                leg("b", "USD", 1),
                leg("c", "USD", i64::MIN)
            ]),
            Err(EntryError::Amount(AmountError::Overflow))
        );
        assert!(matches!(
            entry((0..65).map(|_| leg("a", "USD", 1)).collect()),
            Err(EntryError::TooManyLegs(65))
        ));
    }

    #[test]
    fn deserializing_an_unbalanced_entry_fails() {
        let json = serde_json::json!({
            "id": EntryId::derived("x"), "tenant": "t", "reverses": null,
            "legs": [
                {"account": "a", "currency": "USD", "amount_minor": 5},
                {"account": "b", "currency": "USD", "amount_minor": -4}
            ]
        });
        assert!(serde_json::from_value::<JournalEntry>(json).is_err());
    }

    #[test]
    fn a_reversal_negates_every_leg_and_names_the_original() {
        let original = entry(vec![leg("a", "USD", 7), leg("b", "USD", -7)]).unwrap();
        let reversal = original.reversal(EntryId::derived("r")).unwrap();
        assert_eq!(reversal.reverses(), Some(original.id()));
        assert_eq!(reversal.legs(), &[leg("a", "USD", -7), leg("b", "USD", 7)]);
    }

    #[test]
    fn net_changes_merge_legs_of_one_account() {
        let e = entry(vec![
            leg("a", "USD", 7),
            leg("a", "USD", 3),
            leg("b", "USD", -10),
        ])
        .unwrap();
        let net = e.net_changes().unwrap();
        assert_eq!(
            net[&(AccountName::parse("a").unwrap(), usd())],
            Amount::new(10)
        );
    }
}
