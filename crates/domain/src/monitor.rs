//! Balance monitors: a tenant's standing question "tell me when this account's balance crosses
//! this line" (a customer's available balance below zero, a merchant's pending debits above a
//! limit), so that support and risk teams hear of it instead of polling.
//!
//! A monitor is a stream of its own (`balance_monitor-{bm_…}`): created once, deleted once. It
//! watches one field of one (account, currency) of its tenant. Whether an entry makes it fire is
//! decided here, purely: a monitor fires when an entry takes its field from not matching the
//! condition to matching it ([`Tracked::post`]), once per crossing; crossing back arms it
//! again. The merchant events projection asks in log order and tells
//! `balance.threshold_crossed`, so a rebuild finds the same crossings.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::account::AccountName;
use crate::guard::GuardRejection;
use crate::ids::TenantId;
use crate::money::{Amount, AmountError, Balance, Currency};
use crate::policy::{AccountPolicy, NormalBalance, Overdraft};

/// The longest description a monitor may have, in characters.
pub const DESCRIPTION_CHARS_MAX: usize = 500;

/// Whether `text` is a monitor id: `bm_` and 32 lowercase hex digits.
#[must_use]
pub fn is_monitor_id(text: &str) -> bool {
    text.strip_prefix("bm_").is_some_and(|hex| {
        hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Which figure of an account's balance a monitor watches (the names of the balance object).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BalanceField {
    /// What a command may still draw on under the account's policy.
    Available,
    /// The posted balance.
    Posted,
    /// What holds reserve to leave the account.
    PendingDebits,
    /// What holds reserve to reach the account.
    PendingCredits,
}

impl BalanceField {
    pub const ALL: [BalanceField; 4] = [
        BalanceField::Available,
        BalanceField::Posted,
        BalanceField::PendingDebits,
        BalanceField::PendingCredits,
    ];

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            BalanceField::Available => "available",
            BalanceField::Posted => "posted",
            BalanceField::PendingDebits => "pending_debits",
            BalanceField::PendingCredits => "pending_credits",
        }
    }

    #[must_use]
    pub fn parse(text: &str) -> Option<BalanceField> {
        BalanceField::ALL.into_iter().find(|f| f.as_str() == text)
    }
}

/// How the watched figure is compared with the monitor's amount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    Lt,
    Lte,
    Gt,
    Gte,
}

impl Condition {
    pub const ALL: [Condition; 4] = [Condition::Lt, Condition::Lte, Condition::Gt, Condition::Gte];

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Condition::Lt => "lt",
            Condition::Lte => "lte",
            Condition::Gt => "gt",
            Condition::Gte => "gte",
        }
    }

    #[must_use]
    pub fn parse(text: &str) -> Option<Condition> {
        Condition::ALL.into_iter().find(|c| c.as_str() == text)
    }

    /// Whether `value` stands in this relation to `threshold`.
    #[must_use]
    pub fn holds(self, value: Balance, threshold: Balance) -> bool {
        match self {
            Condition::Lt => value < threshold,
            Condition::Lte => value <= threshold,
            Condition::Gt => value > threshold,
            Condition::Gte => value >= threshold,
        }
    }
}

/// An account's balance as the API shows it: the posted balance and what holds reserve on it
/// (the balances of its two pending accounts, debits shown positive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Balances {
    pub posted: Balance,
    pub pending_debits: Balance,
    pub pending_credits: Balance,
}

impl Balances {
    /// The figure `field` names, under an account of `normal` balance.
    pub fn field(
        &self,
        field: BalanceField,
        normal: NormalBalance,
    ) -> Result<Balance, AmountError> {
        match field {
            BalanceField::Posted => Ok(self.posted),
            BalanceField::PendingDebits => Ok(self.pending_debits),
            BalanceField::PendingCredits => Ok(self.pending_credits),
            BalanceField::Available => self.available(normal),
        }
    }

    /// What a command may still draw on ([`AccountPolicy::available`]).
    pub fn available(&self, normal: NormalBalance) -> Result<Balance, AmountError> {
        AccountPolicy {
            normal_balance: normal,
            overdraft: Overdraft::Allowed,
            frozen: false,
        }
        .available(self.posted, self.pending_debits, self.pending_credits)
    }

    /// After a leg of `amount` on the account itself or on one of its pending accounts.
    pub fn post(self, on: LegTarget, amount: Amount) -> Result<Balances, AmountError> {
        let mut after = self;
        match on {
            LegTarget::Posted => after.posted = after.posted.checked_add(amount)?,
            // Money reserved to leave sits as a negative balance on `pending_debits:`.
            LegTarget::PendingDebits => {
                after.pending_debits = after.pending_debits.checked_add(amount.checked_neg()?)?;
            }
            LegTarget::PendingCredits => {
                after.pending_credits = after.pending_credits.checked_add(amount)?;
            }
        }
        Ok(after)
    }
}

/// Which part of an account's balance a leg moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegTarget {
    Posted,
    PendingDebits,
    PendingCredits,
}

/// The client account a leg's balance belongs to, and which part of it; None for a leg on a
/// system account (no monitor watches one).
#[must_use]
pub fn leg_owner(account: &AccountName) -> Option<(AccountName, LegTarget)> {
    use crate::account::PendingSide;
    let (owner, target) = match account.pending_of() {
        Some((PendingSide::Debits, owner)) => (owner, LegTarget::PendingDebits),
        Some((PendingSide::Credits, owner)) => (owner, LegTarget::PendingCredits),
        None => (account.clone(), LegTarget::Posted),
    };
    (!owner.is_system()).then_some((owner, target))
}

/// What a monitor watches and when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Threshold {
    pub field: BalanceField,
    pub condition: Condition,
    pub amount_minor: Amount,
}

impl Threshold {
    /// Whether `balances` match, under an account of `normal` balance.
    pub fn matches(&self, balances: &Balances, normal: NormalBalance) -> Result<bool, AmountError> {
        Ok(self.condition.holds(
            balances.field(self.field, normal)?,
            self.amount_minor.into(),
        ))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MonitorCreated {
    pub monitor_id: String,
    pub tenant: TenantId,
    pub account: AccountName,
    pub currency: Currency,
    pub threshold: Threshold,
    pub description: Option<String>,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MonitorDeleted {
    pub monitor_id: String,
    pub tenant: TenantId,
    pub at: DateTime<Utc>,
}

crate::event::event_family! {
    /// Events of a `balance_monitor-…` stream.
    MonitorEvent {
        MonitorCreated = 1,
        MonitorDeleted = 1,
    }
}

/// A monitor folded from its stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Monitor {
    pub version: u64,
    pub created: Option<MonitorCreated>,
    pub deleted_at: Option<DateTime<Utc>>,
}

impl Monitor {
    /// Whether it still watches.
    #[must_use]
    pub fn is_active(&self) -> bool {
        self.created.is_some() && self.deleted_at.is_none()
    }
}

#[must_use]
pub fn evolve(mut monitor: Monitor, event: &MonitorEvent) -> Monitor {
    monitor.version += 1;
    match event {
        MonitorEvent::MonitorCreated(e) => monitor.created = Some(e.clone()),
        MonitorEvent::MonitorDeleted(e) => monitor.deleted_at = Some(e.at),
    }
    monitor
}

/// A new monitor on a client account; a system account is refused (`account_reserved`).
pub fn create(created: MonitorCreated) -> Result<MonitorCreated, GuardRejection> {
    if created.account.is_system() {
        return Err(GuardRejection::AccountReserved {
            account: created.account,
        });
    }
    Ok(created)
}

/// The deletion of an active monitor; None once it is deleted (deleting again changes nothing).
#[must_use]
pub fn delete(monitor: &Monitor, at: DateTime<Utc>) -> Option<MonitorDeleted> {
    let created = monitor.created.as_ref()?;
    monitor.deleted_at.is_none().then(|| MonitorDeleted {
        monitor_id: created.monitor_id.clone(),
        tenant: created.tenant.clone(),
        at,
    })
}

/// One (tenant, account, currency) as the monitors see it: its balances, its normal balance and
/// whether each of its monitors matches now.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Tracked {
    pub balances: Balances,
    /// As declared; the implied one (credit) when None.
    pub declared_normal: Option<NormalBalance>,
}

/// A monitor's standing: whether its condition held after the last change it saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub threshold: Threshold,
    pub matching: bool,
}

impl Tracked {
    #[must_use]
    pub fn normal(&self) -> NormalBalance {
        self.declared_normal.unwrap_or(NormalBalance::Credit)
    }

    /// A monitor created now: whether it matches already (a balance that matches at creation
    /// has not crossed; the next crossing is the next time it comes to match).
    pub fn watch(&self, threshold: Threshold) -> Result<Standing, AmountError> {
        Ok(Standing {
            threshold,
            matching: threshold.matches(&self.balances, self.normal())?,
        })
    }

    /// An entry's legs on this account posted: for each standing whether it fired (went from
    /// not matching to matching); the standings are updated in place. An entry is judged whole,
    /// so legs that cancel out within it fire nothing.
    pub fn post(
        &mut self,
        legs: &[(LegTarget, Amount)],
        standings: &mut [Standing],
    ) -> Result<Vec<bool>, AmountError> {
        for (on, amount) in legs {
            self.balances = self.balances.post(*on, *amount)?;
        }
        self.restand(standings)
    }

    /// The account's normal balance declared: the standings follow without firing (no entry
    /// moved money).
    pub fn declare(
        &mut self,
        normal: NormalBalance,
        standings: &mut [Standing],
    ) -> Result<(), AmountError> {
        self.declared_normal = Some(normal);
        self.restand(standings).map(|_| ())
    }

    fn restand(&self, standings: &mut [Standing]) -> Result<Vec<bool>, AmountError> {
        let normal = self.normal();
        standings
            .iter_mut()
            .map(|standing| {
                let now = standing.threshold.matches(&self.balances, normal)?;
                let fired = now && !standing.matching;
                standing.matching = now;
                Ok(fired)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn threshold(field: BalanceField, condition: Condition, amount: i64) -> Threshold {
        Threshold {
            field,
            condition,
            amount_minor: Amount::new(amount),
        }
    }

    #[test]
    fn monitor_ids_are_bm_and_32_hex_digits() {
        assert!(is_monitor_id("bm_0123456789abcdef0123456789abcdef"));
        assert!(!is_monitor_id("bm_0123456789ABCDEF0123456789abcdef"));
        assert!(!is_monitor_id("we_0123456789abcdef0123456789abcdef"));
    }

    #[test]
    fn a_monitor_fires_once_per_crossing_and_again_after_crossing_back() {
        let mut tracked = Tracked::default();
        let mut standings = [tracked
            .watch(threshold(BalanceField::Posted, Condition::Lt, 0))
            .unwrap()];
        let mut post = |amount: i64| {
            tracked
                .post(&[(LegTarget::Posted, Amount::new(amount))], &mut standings)
                .unwrap()[0]
        };
        assert!(!post(100));
        assert!(post(-150), "100 to -50 crosses below zero");
        assert!(!post(-10), "still below: no second event");
        assert!(!post(60), "back to 0: not below, armed again");
        assert!(post(-1), "below again");
    }

    #[test]
    fn a_balance_that_matches_at_creation_has_not_crossed() {
        let mut tracked = Tracked::default();
        tracked
            .post(&[(LegTarget::Posted, Amount::new(-5))], &mut [])
            .unwrap();
        let mut standings = [tracked
            .watch(threshold(BalanceField::Posted, Condition::Lte, 0))
            .unwrap()];
        assert!(standings[0].matching);
        assert_eq!(
            tracked
                .post(&[(LegTarget::Posted, Amount::new(-5))], &mut standings)
                .unwrap(),
            [false]
        );
    }

    #[test]
    fn holds_move_pending_and_available_but_not_posted() {
        let mut tracked = Tracked::default();
        let mut standings = [
            tracked
                .watch(threshold(BalanceField::Available, Condition::Lt, 50))
                .unwrap(),
            tracked
                .watch(threshold(BalanceField::PendingDebits, Condition::Gte, 70))
                .unwrap(),
            tracked
                .watch(threshold(BalanceField::Posted, Condition::Lt, 100))
                .unwrap(),
        ];
        assert_eq!(standings.map(|s| s.matching), [true, false, true]);
        tracked
            .post(&[(LegTarget::Posted, Amount::new(100))], &mut standings)
            .unwrap();
        // A hold of 70 leaving the account: `pending_debits:` goes to -70.
        let fired = tracked
            .post(
                &[(LegTarget::PendingDebits, Amount::new(-70))],
                &mut standings,
            )
            .unwrap();
        assert_eq!(fired, [true, true, false]);
        assert_eq!(tracked.balances.pending_debits, Balance::new(70));
        assert_eq!(
            tracked.balances.available(NormalBalance::Credit).unwrap(),
            Balance::new(30)
        );
    }

    #[test]
    fn legs_belong_to_the_client_account_they_reserve_for() {
        let account = AccountName::parse("merchant:acme").unwrap();
        let pending = account.pending(crate::account::PendingSide::Credits);
        assert_eq!(
            leg_owner(&pending),
            Some((account.clone(), LegTarget::PendingCredits))
        );
        assert_eq!(leg_owner(&account), Some((account, LegTarget::Posted)));
        assert_eq!(leg_owner(&AccountName::revenue_fees()), None);
    }
}
