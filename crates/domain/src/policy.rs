//! What an account allows: its normal balance, how far a command may overdraw it, and whether
//! it is frozen.
//!
//! An account needs no declaration: it comes into being on its first posting with the policy its
//! name implies ([`AccountPolicy::implied`]): a `customer:…` account may never be overdrawn by a
//! command, any other client account may. A declaration (`POST /v1/accounts`) replaces that
//! policy for one (account, currency). The policy is kept in the account's debit guard stream,
//! so a declaration and a transfer deciding against the policy conflict like two transfers do.
//!
//! The sign convention is the ledger's: a leg is positive on the account money reaches. A
//! credit-normal account (money we hold for someone) is overdrawn below zero; a debit-normal one
//! (money owed to us, a source of funds) is overdrawn above zero.

use serde::{Deserialize, Serialize};

use crate::account::AccountName;
use crate::money::{Amount, AmountError, Balance};

/// Which side of zero an account's balance normally sits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormalBalance {
    /// Normally positive: credits (money reaching it) exceed debits.
    Credit,
    /// Normally negative: debits exceed credits.
    Debit,
}

/// How far a command may take an account past zero, on its normal side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "snake_case")]
pub enum Overdraft {
    /// Never past zero.
    Forbidden,
    /// Anywhere.
    Allowed,
    /// At most `limit_minor` past zero.
    Limit { limit_minor: Amount },
}

/// An account's rules for one currency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AccountPolicy {
    pub normal_balance: NormalBalance,
    pub overdraft: Overdraft,
    /// A frozen account takes no command postings, either way; provider facts (money the
    /// provider already moved) are still recorded.
    pub frozen: bool,
}

impl AccountPolicy {
    /// The policy of an account nobody declared: credit-normal, not frozen, and overdraft
    /// forbidden for `customer:…` accounts, allowed for every other.
    #[must_use]
    pub fn implied(account: &AccountName) -> AccountPolicy {
        AccountPolicy {
            normal_balance: NormalBalance::Credit,
            overdraft: if account.is_customer() {
                Overdraft::Forbidden
            } else {
                Overdraft::Allowed
            },
            frozen: false,
        }
    }

    /// `amount` seen from the normal side: as is for credit-normal, negated for debit-normal.
    fn normal_side(self, amount: Amount) -> Result<Amount, AmountError> {
        match self.normal_balance {
            NormalBalance::Credit => Ok(amount),
            NormalBalance::Debit => amount.checked_neg(),
        }
    }

    /// What a command may still move toward the wrong side, as a balance: the posted balance
    /// less what holds reserve against the normal side (pending debits of a credit-normal account,
    /// pending credits of a debit-normal one). Reservations toward the normal side count only
    /// once posted.
    pub fn available(
        self,
        posted: Balance,
        pending_debits: Balance,
        pending_credits: Balance,
    ) -> Result<Balance, AmountError> {
        match self.normal_balance {
            NormalBalance::Credit => posted.checked_sum(pending_debits.checked_neg()?),
            NormalBalance::Debit => posted.checked_sum(pending_credits),
        }
    }

    /// Whether moving `delta` from `before` takes the account past what its overdraft policy
    /// allows. Only a move toward the wrong side can: money coming back never breaches.
    pub fn breached_by(self, before: Amount, delta: Amount) -> Result<bool, AmountError> {
        let toward_wrong_side = self.normal_side(delta)?.is_negative();
        let after = self.normal_side(before.checked_add(delta)?)?;
        Ok(toward_wrong_side
            && match self.overdraft {
                Overdraft::Forbidden => after.is_negative(),
                Overdraft::Allowed => false,
                Overdraft::Limit { limit_minor } => after < limit_minor.checked_neg()?,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(name: &str) -> AccountName {
        AccountName::parse(name).unwrap()
    }

    #[test]
    fn implied_policies_forbid_overdrafts_only_for_customers() {
        let customer = AccountPolicy::implied(&account("customer:1:available"));
        assert_eq!(customer.overdraft, Overdraft::Forbidden);
        assert_eq!(customer.normal_balance, NormalBalance::Credit);
        assert_eq!(
            AccountPolicy::implied(&account("merchant:1")).overdraft,
            Overdraft::Allowed
        );
    }

    #[test]
    fn overdraft_policies_on_both_normal_sides() {
        let credit = |overdraft| AccountPolicy {
            normal_balance: NormalBalance::Credit,
            overdraft,
            frozen: false,
        };
        let a = Amount::new;
        let forbidden = credit(Overdraft::Forbidden);
        assert!(!forbidden.breached_by(a(100), a(-100)).unwrap());
        assert!(forbidden.breached_by(a(100), a(-101)).unwrap());
        // Money coming back to an overdrawn account is never refused.
        assert!(!forbidden.breached_by(a(-50), a(10)).unwrap());
        let limited = credit(Overdraft::Limit {
            limit_minor: a(500),
        });
        assert!(!limited.breached_by(a(0), a(-500)).unwrap());
        assert!(limited.breached_by(a(0), a(-501)).unwrap());
        assert!(!credit(Overdraft::Allowed)
            .breached_by(a(0), a(-i64::MAX))
            .unwrap());

        let debit = AccountPolicy {
            normal_balance: NormalBalance::Debit,
            overdraft: Overdraft::Forbidden,
            frozen: false,
        };
        // A debit-normal account sits below zero; crediting it past zero is the overdraft.
        assert!(!debit.breached_by(a(-100), a(100)).unwrap());
        assert!(debit.breached_by(a(-100), a(101)).unwrap());
        assert!(!debit.breached_by(a(0), a(-100)).unwrap());
    }

    #[test]
    fn policies_serialize_with_a_tag() {
        let policy = AccountPolicy {
            normal_balance: NormalBalance::Debit,
            overdraft: Overdraft::Limit {
                limit_minor: Amount::new(5),
            },
            frozen: true,
        };
        let json = serde_json::to_value(policy).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"normal_balance": "debit", "overdraft": {"policy": "limit", "limit_minor": 5}, "frozen": true})
        );
        assert_eq!(
            serde_json::from_value::<AccountPolicy>(json).unwrap(),
            policy
        );
    }
}
