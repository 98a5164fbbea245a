//! The debit guard: one small aggregate per (tenant, account, currency) for every client
//! account (see [`crate::account`]), holding its balance and its policy.
//!
//! Balances are derived from entries, but a projection lags and two
//! transfers decided at once could each see enough money. So every entry that
//! touches a guarded account also appends to that account's guard stream,
//! with the guard's version as the exact expected version, in the same atomic
//! append as the entry. Two concurrent debits cannot both win: the second
//! append conflicts, is re-decided against the new balance, and is refused if
//! the money is gone. A declaration of the account's policy
//! ([`AccountDeclared`]) is appended to the same stream, so a transfer decided
//! against the old policy conflicts with it too. Each guard event carries the
//! balance and the declared policy after it, so the app needs to read only the
//! last one ([`DebitGuard::from_last`]).
//!
//! A guard also counts what holds reserve on its account: a leg on the account's
//! `pending_debits:` or `pending_credits:` account ([`crate::account::PendingSide`]) changes the
//! guard of the account it reserves for ([`guard_changes`]). The policy is checked against the
//! available balance ([`AccountPolicy::available`]), so a hold takes the money out of reach of
//! every later command, and its post or void (which only gives back) is never refused for funds.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::account::{AccountName, PendingSide};
use crate::entry::JournalEntry;
use crate::ids::{EntryId, TenantId};
use crate::money::{Amount, AmountError, Currency};
use crate::policy::AccountPolicy;
use crate::stream::guard_stream;

/// Who moves the money, which decides whether a policy refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Asked of us (a transfer): may be refused with `InsufficientFunds` or `AccountFrozen`.
    Command,
    /// Already done by the provider (a refund, a lost dispute): always
    /// recorded; an account taken past its overdraft policy is flagged for review.
    ProviderFact,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardRejection {
    #[error("{account} has {balance} {currency}, cannot be debited {debit}")]
    InsufficientFunds {
        account: AccountName,
        currency: Currency,
        balance: Amount,
        debit: Amount,
    },
    #[error("{account} is frozen in {currency}")]
    AccountFrozen {
        account: AccountName,
        currency: Currency,
    },
    #[error("{account} is a system account: only the system's own postings touch it")]
    AccountReserved { account: AccountName },
    /// The caller did not load the guard of an account the entry touches:
    /// a bug in the caller, reported as a value rather than a panic.
    #[error("guard state of {account} {currency} was not provided")]
    MissingGuard {
        account: AccountName,
        currency: Currency,
    },
    #[error("balance arithmetic overflowed")]
    AmountOverflow,
}

impl GuardRejection {
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            GuardRejection::InsufficientFunds { .. } => "insufficient_funds",
            GuardRejection::AccountFrozen { .. } => "account_frozen",
            GuardRejection::AccountReserved { .. } => "account_reserved",
            GuardRejection::MissingGuard { .. } => "missing_guard",
            GuardRejection::AmountOverflow => "amount_overflow",
        }
    }
}

impl From<AmountError> for GuardRejection {
    fn from(_: AmountError) -> Self {
        GuardRejection::AmountOverflow
    }
}

/// Which guard: the stream is `account-{tenant}:{account}:{currency}`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GuardKey {
    pub tenant: TenantId,
    pub account: AccountName,
    pub currency: Currency,
}

impl GuardKey {
    #[must_use]
    pub fn stream(&self) -> String {
        guard_stream(&self.tenant, &self.account, self.currency)
    }
}

/// A guard's state: its stream version (0 = no stream yet), the posted balance, what holds
/// reserve, and the declared policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DebitGuard {
    pub version: u64,
    pub balance: Amount,
    /// Reserved to leave the account by open holds (never negative).
    pub pending_debits: Amount,
    /// Reserved to reach the account by open holds (never negative).
    pub pending_credits: Amount,
    /// The balance went past its overdraft policy through a provider fact at some point.
    pub flagged: bool,
    /// The policy declared for the account; None: the one its name implies.
    pub declared: Option<AccountPolicy>,
}

impl DebitGuard {
    /// The state from the stream's last event alone: every event carries the
    /// balance and the declared policy after it. (`flagged` is only known by a full replay.)
    #[must_use]
    pub fn from_last(version: u64, last: &GuardEvent) -> DebitGuard {
        let (balance, pending, declared) = match last {
            GuardEvent::BalanceChanged(e) => (e.balance_minor, e.pending, e.policy),
            GuardEvent::OverdraftFlagged(e) => (e.balance_minor, e.pending, e.policy),
            GuardEvent::AccountDeclared(e) => (e.balance_minor, e.pending, Some(e.policy)),
        };
        DebitGuard {
            version,
            balance,
            pending_debits: pending.pending_debits_minor,
            pending_credits: pending.pending_credits_minor,
            flagged: matches!(last, GuardEvent::OverdraftFlagged(_)),
            declared,
        }
    }

    /// What holds reserve, as the events carry it.
    #[must_use]
    pub fn pending(&self) -> Pending {
        Pending {
            pending_debits_minor: self.pending_debits,
            pending_credits_minor: self.pending_credits,
        }
    }

    /// The balance a command may still draw on under `account`'s policy.
    pub fn available(&self, account: &AccountName) -> Result<Amount, AmountError> {
        self.policy(account)
            .available(
                self.balance.into(),
                self.pending_debits.into(),
                self.pending_credits.into(),
            )?
            .to_amount()
    }

    /// The policy in force for `account`: the declared one, or the one its name implies.
    #[must_use]
    pub fn policy(&self, account: &AccountName) -> AccountPolicy {
        self.declared
            .unwrap_or_else(|| AccountPolicy::implied(account))
    }
}

fn is_zero(amount: &Amount) -> bool {
    amount.is_zero()
}

/// What open holds reserve on the account, after an event (absent from the JSON while zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Pending {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pending_debits_minor: Amount,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pending_credits_minor: Amount,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BalanceChanged {
    pub entry_id: EntryId,
    /// The change of the posted balance.
    pub delta_minor: Amount,
    /// The balance after this change.
    pub balance_minor: Amount,
    /// The change of what holds reserve (absent while zero).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pending_debits_delta_minor: Amount,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pending_credits_delta_minor: Amount,
    /// What holds reserve after this change.
    #[serde(flatten)]
    pub pending: Pending,
    pub at: DateTime<Utc>,
    /// The declared policy, carried along so that the last event tells the whole state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<AccountPolicy>,
}

/// A provider fact took the account past its overdraft policy; someone must look at it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverdraftFlagged {
    pub entry_id: EntryId,
    pub balance_minor: Amount,
    #[serde(flatten)]
    pub pending: Pending,
    pub at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<AccountPolicy>,
}

/// A client declared the account's policy for this currency (`POST /v1/accounts`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccountDeclared {
    pub policy: AccountPolicy,
    pub metadata: Map<String, Value>,
    /// The balance and what holds reserve, unchanged by a declaration.
    pub balance_minor: Amount,
    #[serde(flatten)]
    pub pending: Pending,
    pub at: DateTime<Utc>,
}

crate::event::event_family! {
    /// Events of an `account-…` guard stream.
    GuardEvent {
        BalanceChanged = 1,
        OverdraftFlagged = 1,
        AccountDeclared = 1,
    }
}

#[must_use]
pub fn evolve(guard: DebitGuard, event: &GuardEvent) -> DebitGuard {
    let next = DebitGuard::from_last(guard.version + 1, event);
    DebitGuard {
        flagged: guard.flagged || next.flagged,
        ..next
    }
}

/// What to append to one guard stream, expecting exactly `expected_version`
/// (0 means the stream must not exist yet).
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct GuardAppend {
    pub key: GuardKey,
    pub expected_version: u64,
    pub events: Vec<GuardEvent>,
}

/// What one entry changes on one guard: its posted balance and what holds reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GuardChange {
    pub posted: Amount,
    pub pending_debits: Amount,
    pub pending_credits: Amount,
}

impl GuardChange {
    #[must_use]
    pub fn is_zero(&self) -> bool {
        self.posted.is_zero() && self.pending_debits.is_zero() && self.pending_credits.is_zero()
    }

    /// Only gives back: nothing posted, no reservation made (a hold's void).
    fn only_releases(&self) -> bool {
        self.posted.is_zero()
            && !self.pending_debits.is_positive()
            && !self.pending_credits.is_positive()
    }
}

/// The guarded account behind a leg's account, and on which side of it the leg counts: the
/// account itself (None) or one of its pending accounts.
fn guarded_account(account: &AccountName) -> Option<(AccountName, Option<PendingSide>)> {
    match account.pending_of() {
        Some((side, of)) => of.is_guarded().then_some((of, Some(side))),
        None => account.is_guarded().then(|| (account.clone(), None)),
    }
}

/// Every guard an entry touches, with the net change on each: a leg on a client account changes
/// its posted balance; a leg on `pending_debits:{a}` changes `a`'s pending debits by its negation
/// (money reserved to leave is a negative leg there), one on `pending_credits:{a}` its pending
/// credits.
pub fn guard_changes(entry: &JournalEntry) -> Result<BTreeMap<GuardKey, GuardChange>, AmountError> {
    let mut changes: BTreeMap<GuardKey, GuardChange> = BTreeMap::new();
    for ((account, currency), delta) in entry.net_changes()? {
        let Some((account, side)) = guarded_account(&account) else {
            continue;
        };
        let key = GuardKey {
            tenant: entry.tenant().clone(),
            account,
            currency,
        };
        let change = changes.entry(key).or_default();
        match side {
            None => change.posted = change.posted.checked_add(delta)?,
            Some(PendingSide::Debits) => {
                change.pending_debits = change.pending_debits.checked_sub(delta)?;
            }
            Some(PendingSide::Credits) => {
                change.pending_credits = change.pending_credits.checked_add(delta)?;
            }
        }
    }
    Ok(changes)
}

/// The guards an entry touches, so the caller knows which to load.
#[must_use]
pub fn guarded_keys(entry: &JournalEntry) -> Vec<GuardKey> {
    let mut keys: Vec<GuardKey> = entry
        .legs()
        .iter()
        .filter_map(|leg| {
            let (account, _) = guarded_account(&leg.account)?;
            Some(GuardKey {
                tenant: entry.tenant().clone(),
                account,
                currency: leg.currency,
            })
        })
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// Decides the guard events of an entry, given the state of every guard it touches. A command
/// that would take a guarded account past its overdraft policy, or touches a frozen one, is
/// refused; a provider fact is recorded, and flagged when it breaches the policy.
pub fn decide_entry(
    entry: &JournalEntry,
    origin: Origin,
    guards: &BTreeMap<GuardKey, DebitGuard>,
    at: DateTime<Utc>,
) -> Result<Vec<GuardAppend>, GuardRejection> {
    let mut appends = Vec::new();
    for (key, change) in guard_changes(entry)? {
        if change.is_zero() {
            continue;
        }
        let Some(guard) = guards.get(&key) else {
            return Err(GuardRejection::MissingGuard {
                account: key.account,
                currency: key.currency,
            });
        };
        let events = change_events(guard, &key, entry.id(), change, origin, at)?;
        appends.push(GuardAppend {
            key,
            expected_version: guard.version,
            events,
        });
    }
    Ok(appends)
}

/// The events of one net `change` on the guard of `key` in state `guard`: refused for a command
/// that takes the available balance past the account's policy or touches a frozen one (except to
/// release a reservation); recorded (and flagged when it breaches) for a provider fact.
fn change_events(
    guard: &DebitGuard,
    key: &GuardKey,
    entry_id: EntryId,
    change: GuardChange,
    origin: Origin,
    at: DateTime<Utc>,
) -> Result<Vec<GuardEvent>, GuardRejection> {
    let policy = guard.policy(&key.account);
    if policy.frozen && origin == Origin::Command && !change.only_releases() {
        return Err(GuardRejection::AccountFrozen {
            account: key.account.clone(),
            currency: key.currency,
        });
    }
    let after = DebitGuard {
        balance: guard.balance.checked_add(change.posted)?,
        pending_debits: guard.pending_debits.checked_add(change.pending_debits)?,
        pending_credits: guard.pending_credits.checked_add(change.pending_credits)?,
        ..*guard
    };
    // A release decided on a guard read after another ending of the same hold committed takes
    // a pending amount below zero here. It is never appended: the hold's stream was read before
    // that ending, so the append conflicts and the ending is decided again (and refused).
    let available = guard.available(&key.account)?;
    let available_delta = after.available(&key.account)?.checked_sub(available)?;
    let breached = policy.breached_by(available, available_delta)?;
    if breached && origin == Origin::Command {
        return Err(GuardRejection::InsufficientFunds {
            account: key.account.clone(),
            currency: key.currency,
            balance: available,
            debit: available_delta.checked_neg()?,
        });
    }
    let pending = after.pending();
    let mut events = vec![GuardEvent::BalanceChanged(BalanceChanged {
        entry_id,
        delta_minor: change.posted,
        balance_minor: after.balance,
        pending_debits_delta_minor: change.pending_debits,
        pending_credits_delta_minor: change.pending_credits,
        pending,
        at,
        policy: guard.declared,
    })];
    if breached {
        events.push(GuardEvent::OverdraftFlagged(OverdraftFlagged {
            entry_id,
            balance_minor: after.balance,
            pending,
            at,
            policy: guard.declared,
        }));
    }
    Ok(events)
}

/// A provider fact's guard events, decided against some state, decided again against `onto`:
/// the same changes, with the balances after them and the overdraft flags recomputed (a provider
/// fact is never refused, so nothing else can differ). This is how one group-commit batch carries
/// several provider facts on one account: each is rebased onto the state the previous one leaves.
/// None when the events are not only balance changes (a declaration is a command's).
#[must_use]
pub fn rebase_fact(
    key: &GuardKey,
    onto: DebitGuard,
    events: &[GuardEvent],
) -> Option<Vec<GuardEvent>> {
    let mut state = onto;
    let mut rebased = Vec::with_capacity(events.len());
    for event in events {
        match event {
            GuardEvent::BalanceChanged(change) => {
                let delta = GuardChange {
                    posted: change.delta_minor,
                    pending_debits: change.pending_debits_delta_minor,
                    pending_credits: change.pending_credits_delta_minor,
                };
                let step = change_events(
                    &state,
                    key,
                    change.entry_id,
                    delta,
                    Origin::ProviderFact,
                    change.at,
                )
                .ok()?;
                for event in step {
                    state = evolve(state, &event);
                    rebased.push(event);
                }
            }
            // Recomputed with the change it follows.
            GuardEvent::OverdraftFlagged(_) => {}
            GuardEvent::AccountDeclared(_) => return None,
        }
    }
    Some(rebased)
}

/// A declaration of `key`'s policy, appended to its guard stream at the version `guard` was read
/// at. System accounts take none.
pub fn declare(
    key: GuardKey,
    guard: &DebitGuard,
    policy: AccountPolicy,
    metadata: Map<String, Value>,
    at: DateTime<Utc>,
) -> Result<GuardAppend, GuardRejection> {
    if key.account.is_system() {
        return Err(GuardRejection::AccountReserved {
            account: key.account,
        });
    }
    Ok(GuardAppend {
        expected_version: guard.version,
        events: vec![GuardEvent::AccountDeclared(AccountDeclared {
            policy,
            metadata,
            balance_minor: guard.balance,
            pending: guard.pending(),
            at,
        })],
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::Leg;

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(1_764_000_000, 0).unwrap()
    }

    fn tenant() -> TenantId {
        TenantId::parse("t").unwrap()
    }

    fn usd() -> Currency {
        Currency::parse("USD").unwrap()
    }

    fn entry(legs: &[(&str, i64)]) -> JournalEntry {
        let legs = legs
            .iter()
            .map(|(a, n)| Leg::new(AccountName::parse(a).unwrap(), usd(), Amount::new(*n)))
            .collect();
        JournalEntry::new(EntryId::derived("e"), tenant(), legs, None).unwrap()
    }

    fn key(account: &str) -> GuardKey {
        GuardKey {
            tenant: tenant(),
            account: AccountName::parse(account).unwrap(),
            currency: usd(),
        }
    }

    fn guards(states: &[(&str, u64, i64)]) -> BTreeMap<GuardKey, DebitGuard> {
        states
            .iter()
            .map(|(a, v, b)| {
                (
                    key(a),
                    DebitGuard {
                        version: *v,
                        balance: Amount::new(*b),
                        ..DebitGuard::default()
                    },
                )
            })
            .collect()
    }

    #[test]
    fn client_accounts_are_guarded_system_accounts_are_not() {
        let e = entry(&[
            ("customer:1:available", -5),
            ("merchant:2", 5),
            ("revenue:fees", 1),
            ("psp:sim:clearing", -1),
        ]);
        assert_eq!(
            guarded_keys(&e),
            vec![key("customer:1:available"), key("merchant:2")]
        );
    }

    #[test]
    fn a_declared_policy_replaces_the_implied_one_and_travels_with_the_balance() {
        let policy = AccountPolicy {
            normal_balance: crate::policy::NormalBalance::Credit,
            overdraft: crate::policy::Overdraft::Limit {
                limit_minor: Amount::new(100),
            },
            frozen: false,
        };
        let merchant = key("merchant:2");
        let declared = declare(
            merchant.clone(),
            &DebitGuard::default(),
            policy,
            Map::new(),
            at(),
        )
        .unwrap();
        assert_eq!(declared.expected_version, 0);
        let guard = declared.events.iter().fold(DebitGuard::default(), evolve);
        assert_eq!(guard.policy(&merchant.account), policy);
        let states = BTreeMap::from([(merchant.clone(), guard)]);
        let over = entry(&[("merchant:2", -101), ("psp:sim:clearing", 101)]);
        assert_eq!(
            decide_entry(&over, Origin::Command, &states, at())
                .unwrap_err()
                .code(),
            "insufficient_funds"
        );
        let within = entry(&[("merchant:2", -100), ("psp:sim:clearing", 100)]);
        let appends = decide_entry(&within, Origin::Command, &states, at()).unwrap();
        let last = appends[0].events.last().unwrap();
        let after = DebitGuard::from_last(2, last);
        assert_eq!(
            (after.balance, after.declared),
            (Amount::new(-100), Some(policy))
        );

        let frozen = AccountPolicy {
            frozen: true,
            ..policy
        };
        let states = BTreeMap::from([(
            merchant.clone(),
            DebitGuard {
                declared: Some(frozen),
                ..guard
            },
        )]);
        let credit = entry(&[("merchant:2", 5), ("psp:sim:clearing", -5)]);
        assert_eq!(
            decide_entry(&credit, Origin::Command, &states, at())
                .unwrap_err()
                .code(),
            "account_frozen"
        );
        assert!(decide_entry(&credit, Origin::ProviderFact, &states, at()).is_ok());
        assert_eq!(
            declare(
                key("revenue:fees"),
                &DebitGuard::default(),
                policy,
                Map::new(),
                at()
            )
            .unwrap_err()
            .code(),
            "account_reserved"
        );
    }

    #[test]
    fn a_command_cannot_take_a_customer_below_zero() {
        let e = entry(&[
            ("customer:1:available", -500),
            ("customer:2:available", 500),
        ]);
        let states = guards(&[
            ("customer:1:available", 3, 499),
            ("customer:2:available", 0, 0),
        ]);
        assert_eq!(
            decide_entry(&e, Origin::Command, &states, at()),
            Err(GuardRejection::InsufficientFunds {
                account: AccountName::parse("customer:1:available").unwrap(),
                currency: usd(),
                balance: Amount::new(499),
                debit: Amount::new(500),
            })
        );
        let states = guards(&[
            ("customer:1:available", 3, 500),
            ("customer:2:available", 0, 0),
        ]);
        let appends = decide_entry(&e, Origin::Command, &states, at()).unwrap();
        assert_eq!(appends.len(), 2);
        assert_eq!(appends[0].expected_version, 3);
        assert_eq!(
            appends[0].key.stream(),
            "account-t:customer:1:available:USD"
        );
        assert_eq!(
            appends[0].events,
            vec![GuardEvent::BalanceChanged(BalanceChanged {
                entry_id: e.id(),
                delta_minor: Amount::new(-500),
                balance_minor: Amount::ZERO,
                pending_debits_delta_minor: Amount::ZERO,
                pending_credits_delta_minor: Amount::ZERO,
                pending: Pending::default(),
                at: at(),
                policy: None,
            })]
        );
        assert_eq!(appends[1].expected_version, 0);
    }

    #[test]
    fn a_provider_fact_is_recorded_below_zero_and_flagged() {
        let e = entry(&[("customer:1:available", -500), ("psp:sim:clearing", 500)]);
        let states = guards(&[("customer:1:available", 1, 100)]);
        let appends = decide_entry(&e, Origin::ProviderFact, &states, at()).unwrap();
        assert_eq!(appends.len(), 1);
        let guard = appends[0]
            .events
            .iter()
            .fold(states[&key("customer:1:available")], evolve);
        assert_eq!(guard.balance, Amount::new(-400));
        assert!(guard.flagged);
        assert_eq!(guard.version, 3);
        let last = appends[0].events.last().unwrap();
        assert_eq!(DebitGuard::from_last(3, last), guard);
    }

    #[test]
    fn a_fact_rebased_onto_a_later_state_recomputes_balances_and_flags() {
        let customer = key("customer:1:available");
        let refund = entry(&[("customer:1:available", -300), ("psp:sim:clearing", 300)]);
        let read = guards(&[("customer:1:available", 4, 500)]);
        let decided = decide_entry(&refund, Origin::ProviderFact, &read, at()).unwrap();
        assert_eq!(decided[0].events.len(), 1, "no overdraft against 500");
        // Another fact in the same batch took the balance to 100 first.
        let onto = DebitGuard {
            version: 5,
            balance: Amount::new(100),
            ..DebitGuard::default()
        };
        let rebased = rebase_fact(&customer, onto, &decided[0].events).unwrap();
        let after = rebased.iter().fold(onto, evolve);
        assert_eq!(
            (after.balance, after.flagged, after.version),
            (Amount::new(-200), true, 7)
        );
        // Rebased onto the state it was decided against, it is the same events.
        assert_eq!(
            rebase_fact(&customer, read[&customer], &decided[0].events).unwrap(),
            decided[0].events
        );
        let declared = declare(
            customer.clone(),
            &onto,
            AccountPolicy::implied(&customer.account),
            Map::new(),
            at(),
        )
        .unwrap();
        assert_eq!(rebase_fact(&customer, onto, &declared.events), None);
    }

    #[test]
    fn a_hold_reserves_against_the_available_balance_and_its_release_is_never_refused() {
        let customer = key("customer:1:available");
        let merchant = key("merchant:2");
        let states = guards(&[("customer:1:available", 1, 100), ("merchant:2", 0, 0)]);
        let hold = |amount: i64| {
            entry(&[
                ("pending_debits:customer:1:available", -amount),
                ("pending_credits:merchant:2", amount),
            ])
        };
        let changes = guard_changes(&hold(60)).unwrap();
        assert_eq!(
            changes[&customer],
            GuardChange {
                pending_debits: Amount::new(60),
                ..GuardChange::default()
            }
        );
        assert_eq!(changes[&merchant].pending_credits, Amount::new(60));
        assert_eq!(
            guarded_keys(&hold(60)),
            vec![customer.clone(), merchant.clone()]
        );
        assert_eq!(
            decide_entry(&hold(101), Origin::Command, &states, at())
                .unwrap_err()
                .code(),
            "insufficient_funds"
        );
        let apply = |states: &BTreeMap<GuardKey, DebitGuard>, appends: Vec<GuardAppend>| {
            let mut states = states.clone();
            for append in appends {
                let state = states[&append.key];
                let after = append.events.iter().fold(state, evolve);
                let last = append.events.last().unwrap();
                assert_eq!(DebitGuard::from_last(after.version, last), after);
                states.insert(append.key, after);
            }
            states
        };
        let held = apply(
            &states,
            decide_entry(&hold(60), Origin::Command, &states, at()).unwrap(),
        );
        let c = held[&customer];
        assert_eq!(
            (c.balance, c.pending_debits),
            (Amount::new(100), Amount::new(60))
        );
        assert_eq!(c.available(&customer.account).unwrap(), Amount::new(40));
        // The reservation is out of reach of the next command.
        let spend =
            |amount: i64| entry(&[("customer:1:available", -amount), ("merchant:2", amount)]);
        assert_eq!(
            decide_entry(&spend(41), Origin::Command, &held, at())
                .unwrap_err()
                .code(),
            "insufficient_funds"
        );
        assert!(decide_entry(&spend(40), Origin::Command, &held, at()).is_ok());
        // Posting part of it: the reservation released, the part moved.
        let post = entry(&[
            ("pending_debits:customer:1:available", 60),
            ("pending_credits:merchant:2", -60),
            ("customer:1:available", -45),
            ("merchant:2", 45),
        ]);
        // Even frozen and after the rest was spent, a release that gives back is decided.
        let frozen = AccountPolicy {
            frozen: true,
            ..AccountPolicy::implied(&customer.account)
        };
        let mut frozen_states = held.clone();
        frozen_states.insert(
            customer.clone(),
            DebitGuard {
                declared: Some(frozen),
                ..held[&customer]
            },
        );
        let void = entry(&[
            ("pending_debits:customer:1:available", 60),
            ("pending_credits:merchant:2", -60),
        ]);
        assert!(decide_entry(&void, Origin::Command, &frozen_states, at()).is_ok());
        assert_eq!(
            decide_entry(&post, Origin::Command, &frozen_states, at())
                .unwrap_err()
                .code(),
            "account_frozen"
        );
        let posted = apply(
            &held,
            decide_entry(&post, Origin::Command, &held, at()).unwrap(),
        );
        let (c, m) = (posted[&customer], posted[&merchant]);
        assert_eq!(
            (c.balance, c.pending_debits, m.balance, m.pending_credits),
            (Amount::new(55), Amount::ZERO, Amount::new(45), Amount::ZERO)
        );
    }

    #[test]
    fn a_debit_normal_account_counts_pending_credits_against_it() {
        let policy = AccountPolicy {
            normal_balance: crate::policy::NormalBalance::Debit,
            overdraft: crate::policy::Overdraft::Forbidden,
            frozen: false,
        };
        let states = BTreeMap::from([
            (
                key("loan:1"),
                DebitGuard {
                    version: 1,
                    balance: Amount::new(-100),
                    declared: Some(policy),
                    ..DebitGuard::default()
                },
            ),
            (key("merchant:2"), DebitGuard::default()),
        ]);
        let hold = |amount: i64| {
            entry(&[
                ("pending_debits:merchant:2", -amount),
                ("pending_credits:loan:1", amount),
            ])
        };
        assert!(decide_entry(&hold(100), Origin::Command, &states, at()).is_ok());
        assert_eq!(
            decide_entry(&hold(101), Origin::Command, &states, at())
                .unwrap_err()
                .code(),
            "insufficient_funds"
        );
    }

    #[test]
    fn a_missing_guard_is_an_error_not_a_panic() {
        let e = entry(&[("customer:1:available", 5), ("psp:sim:clearing", -5)]);
        assert!(matches!(
            decide_entry(&e, Origin::ProviderFact, &BTreeMap::new(), at()),
            Err(GuardRejection::MissingGuard { .. })
        ));
    }

    #[test]
    fn credits_to_an_overdrawn_account_are_accepted() {
        let e = entry(&[("customer:1:available", 5), ("psp:sim:clearing", -5)]);
        let states = guards(&[("customer:1:available", 2, -50)]);
        let appends = decide_entry(&e, Origin::Command, &states, at()).unwrap();
        assert_eq!(appends[0].events.len(), 1);
    }
}
