//! The transfer aggregate: a merchant moving money between two accounts of
//! one currency with a two-leg entry, or reserving it first (a hold, `pending`; posted or
//! voided later by [`crate::hold`]).
//!
//! A hold's entry moves the amount from `pending_debits:{from}` to `pending_credits:{to}`
//! ([`crate::account::PendingSide`]): the posted balances are untouched, and the debit guards
//! count the reservation against what `from` may still spend.
//!
//! A transfer is a command between two client accounts (a system account is
//! `account_reserved`), so a debit past an account's overdraft policy, or a
//! posting to a frozen account, is refused; that check needs the guards'
//! states, which live in other streams, hence [`decide_with_guards`]: the transfer's events
//! and the guard appends come out of one decision and go into one atomic
//! append.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::account::{AccountName, PendingSide};
use crate::entry::{EntryError, JournalEntry};
use crate::guard::{decide_entry, DebitGuard, GuardAppend, GuardKey, GuardRejection, Origin};
use crate::hold::{HoldPosted, HoldSettled, HoldVoided};
use crate::ids::{EntryId, TenantId, TransferId};
use crate::money::{Amount, AmountLimit, AmountLimitError, Currency};
use crate::payment::{EntryPosted, DESCRIPTION_CHARS_MAX};

/// A merchant's transfer request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestTransfer {
    pub id: TransferId,
    pub tenant: TenantId,
    pub from: AccountName,
    pub to: AccountName,
    pub amount: Amount,
    pub currency: Currency,
    pub description: Option<String>,
    /// A hold: reserve now, post or void later.
    pub pending: bool,
    /// When the worker voids a hold nobody posted or voided.
    pub expires_at: Option<DateTime<Utc>>,
    pub at: DateTime<Utc>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// A transfer's request. A transfer's stream starts with the `EntryPosted` that carries it; logs
/// written before start with it as an event of its own, followed by that `EntryPosted`, and both
/// fold into the same [`Transfer`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransferRequested {
    pub transfer_id: TransferId,
    pub tenant: TenantId,
    pub from: AccountName,
    pub to: AccountName,
    pub amount_minor: Amount,
    pub currency: Currency,
    pub description: Option<String>,
    /// A hold (absent for a plain transfer, as in events written before holds existed).
    #[serde(default, skip_serializing_if = "is_false")]
    pub pending: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    pub at: DateTime<Utc>,
}

crate::event::event_family! {
    /// Events of a `transfer-…` stream.
    TransferEvent {
        TransferRequested = 1,
        EntryPosted = 1,
        HoldPosted = 1,
        HoldVoided = 1,
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransferRecord {
    pub requested: TransferRequested,
    /// The transfer's entry, or the hold's.
    pub entry_id: Option<EntryId>,
    /// How a hold ended, once it did.
    pub settled: Option<HoldSettled>,
}

/// Where a transfer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferStatus {
    /// Moved (a plain transfer, or a hold posted).
    Posted,
    /// A hold, reserved and open.
    Pending,
    /// A hold released by a client.
    Voided,
    /// A hold released by the worker after `expires_at`.
    Expired,
}

impl TransferStatus {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            TransferStatus::Posted => "posted",
            TransferStatus::Pending => "pending",
            TransferStatus::Voided => "voided",
            TransferStatus::Expired => "expired",
        }
    }
}

impl TransferRecord {
    #[must_use]
    pub fn status(&self) -> TransferStatus {
        match &self.settled {
            _ if !self.requested.pending => TransferStatus::Posted,
            None => TransferStatus::Pending,
            Some(settled) => settled.outcome.status(),
        }
    }

    /// What moved between the posted balances: the whole amount of a transfer, the posted part
    /// of a hold, nothing yet or ever for an open or released hold.
    #[must_use]
    pub fn posted_amount(&self) -> Amount {
        match &self.settled {
            _ if !self.requested.pending => self.requested.amount_minor,
            Some(settled) => settled.outcome.posted_amount(),
            None => Amount::ZERO,
        }
    }
}

/// The aggregate; serialisable so that a read model can keep it folded between batches.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Transfer {
    pub version: u64,
    pub record: Option<TransferRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferRejection {
    #[error("amount must be positive")]
    AmountMustBePositive,
    #[error(transparent)]
    AmountTooLarge(#[from] AmountLimitError),
    #[error("a transfer needs two different accounts")]
    AccountsMustBeDifferent,
    #[error("description is longer than {DESCRIPTION_CHARS_MAX} characters")]
    DescriptionTooLong,
    #[error("transfer {0} already exists with different details")]
    TransferAlreadyExists(TransferId),
    #[error("expires_at is only for a hold (pending: true)")]
    ExpiryWithoutHold,
    #[error("expires_at must be in the future")]
    ExpiryInThePast,
    #[error(transparent)]
    Guard(#[from] GuardRejection),
    #[error("posting rule produced an invalid entry: {0}")]
    InvalidEntry(String),
}

impl TransferRejection {
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            TransferRejection::AmountMustBePositive => "amount_must_be_positive",
            TransferRejection::AmountTooLarge(_) => "amount_too_large",
            TransferRejection::AccountsMustBeDifferent => "accounts_must_be_different",
            TransferRejection::DescriptionTooLong => "description_too_long",
            TransferRejection::TransferAlreadyExists(_) => "transfer_already_exists",
            TransferRejection::ExpiryWithoutHold => "expires_at_without_hold",
            TransferRejection::ExpiryInThePast => "expires_at_in_the_past",
            TransferRejection::Guard(rejection) => rejection.code(),
            TransferRejection::InvalidEntry(_) => "invalid_entry",
        }
    }
}

impl From<EntryError> for TransferRejection {
    fn from(e: EntryError) -> Self {
        TransferRejection::InvalidEntry(e.to_string())
    }
}

/// The transfer's own event: its `EntryPosted` (`from` −amount, `to` +amount; for a hold, on
/// their pending accounts), which carries the request it posts. A repeat of the same request
/// yields nothing; the insufficient-funds rule is applied by [`decide_with_guards`].
pub fn decide(
    transfer: &Transfer,
    request: RequestTransfer,
) -> Result<Vec<TransferEvent>, TransferRejection> {
    if !request.amount.is_positive() {
        return Err(TransferRejection::AmountMustBePositive);
    }
    AmountLimit::CEILING.check(request.amount)?;
    if request.from == request.to {
        return Err(TransferRejection::AccountsMustBeDifferent);
    }
    if let Some(system) = [&request.from, &request.to]
        .into_iter()
        .find(|account| account.is_system())
    {
        return Err(TransferRejection::Guard(GuardRejection::AccountReserved {
            account: system.clone(),
        }));
    }
    if let Some(description) = &request.description {
        if description.chars().count() > DESCRIPTION_CHARS_MAX {
            return Err(TransferRejection::DescriptionTooLong);
        }
    }
    match request.expires_at {
        Some(_) if !request.pending => return Err(TransferRejection::ExpiryWithoutHold),
        Some(expires_at) if expires_at <= request.at => {
            return Err(TransferRejection::ExpiryInThePast)
        }
        _ => {}
    }
    let requested = TransferRequested {
        transfer_id: request.id,
        tenant: request.tenant,
        from: request.from,
        to: request.to,
        amount_minor: request.amount,
        currency: request.currency,
        description: request.description,
        pending: request.pending,
        expires_at: request.expires_at,
        at: request.at,
    };
    if let Some(existing) = &transfer.record {
        return if existing.requested == requested {
            Ok(Vec::new())
        } else {
            Err(TransferRejection::TransferAlreadyExists(request.id))
        };
    }
    let (suffix, from, to) = if requested.pending {
        (
            "hold",
            requested.from.pending(PendingSide::Debits),
            requested.to.pending(PendingSide::Credits),
        )
    } else {
        ("transfer", requested.from.clone(), requested.to.clone())
    };
    let entry = JournalEntry::in_one_currency(
        EntryId::derived(&format!("{}:{suffix}", requested.transfer_id)),
        requested.tenant.clone(),
        requested.currency,
        [
            (
                from,
                requested
                    .amount_minor
                    .checked_neg()
                    .map_err(|_| TransferRejection::AmountMustBePositive)?,
            ),
            (to, requested.amount_minor),
        ],
    )?;
    Ok(vec![TransferEvent::EntryPosted(EntryPosted {
        entry,
        at: requested.at,
        transfer: Some(requested),
    })])
}

/// A full transfer decision: what to append to the transfer's stream and to
/// each guard stream, all in one atomic append.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct TransferDecision {
    pub events: Vec<TransferEvent>,
    pub guards: Vec<GuardAppend>,
}

/// [`decide`], then the debit guards of the entry's client accounts
/// (see [`crate::guard::guarded_keys`] for which states to load).
pub fn decide_with_guards(
    transfer: &Transfer,
    request: RequestTransfer,
    guards: &BTreeMap<GuardKey, DebitGuard>,
) -> Result<TransferDecision, TransferRejection> {
    let events = decide(transfer, request)?;
    Ok(TransferDecision {
        guards: command_guards(&events, guards)?,
        events,
    })
}

/// The guard appends of the entries among `events`, decided as a command's.
pub(crate) fn command_guards(
    events: &[TransferEvent],
    guards: &BTreeMap<GuardKey, DebitGuard>,
) -> Result<Vec<GuardAppend>, GuardRejection> {
    let mut appends = Vec::new();
    for event in events {
        if let TransferEvent::EntryPosted(posted) = event {
            appends.extend(decide_entry(
                &posted.entry,
                Origin::Command,
                guards,
                posted.at,
            )?);
        }
    }
    Ok(appends)
}

#[must_use]
pub fn evolve(mut transfer: Transfer, event: &TransferEvent) -> Transfer {
    transfer.version += 1;
    match event {
        TransferEvent::TransferRequested(e) => {
            transfer.record = Some(TransferRecord {
                requested: e.clone(),
                entry_id: None,
                settled: None,
            });
        }
        TransferEvent::EntryPosted(EntryPosted {
            entry,
            transfer: Some(requested),
            ..
        }) => {
            transfer.record = Some(TransferRecord {
                requested: requested.clone(),
                entry_id: Some(entry.id()),
                settled: None,
            });
        }
        TransferEvent::EntryPosted(e) => {
            if let Some(record) = transfer.record.as_mut() {
                match record.settled.as_mut() {
                    Some(settled) => settled.entry_id = Some(e.entry.id()),
                    None => record.entry_id = Some(e.entry.id()),
                }
            }
        }
        TransferEvent::HoldPosted(e) => settle(&mut transfer, HoldSettled::posted(e)),
        TransferEvent::HoldVoided(e) => settle(&mut transfer, HoldSettled::voided(e)),
    }
    transfer
}

fn settle(transfer: &mut Transfer, settled: HoldSettled) {
    if let Some(record) = transfer.record.as_mut() {
        record.settled = Some(settled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::guarded_keys;

    fn request(from: &str, to: &str, amount: i64) -> RequestTransfer {
        RequestTransfer {
            id: TransferId::from_uuid(uuid::Uuid::from_u128(9)),
            tenant: TenantId::parse("t").unwrap(),
            from: AccountName::parse(from).unwrap(),
            to: AccountName::parse(to).unwrap(),
            amount: Amount::new(amount),
            currency: Currency::parse("USD").unwrap(),
            description: None,
            pending: false,
            expires_at: None,
            at: DateTime::from_timestamp(1_764_000_000, 0).unwrap(),
        }
    }

    #[test]
    fn rule_violations_are_named() {
        let t = Transfer::default();
        assert_eq!(
            decide(&t, request("a", "b", 0)),
            Err(TransferRejection::AmountMustBePositive)
        );
        assert_eq!(
            decide(&t, request("a", "b", -1)),
            Err(TransferRejection::AmountMustBePositive)
        );
        assert_eq!(
            decide(&t, request("a", "a", 5)),
            Err(TransferRejection::AccountsMustBeDifferent)
        );
        assert_eq!(
            TransferRejection::AccountsMustBeDifferent.code(),
            "accounts_must_be_different"
        );
    }

    #[test]
    fn a_transfer_posts_two_legs_and_repeats_are_idempotent() {
        let events = decide(&Transfer::default(), request("a", "b", 5)).unwrap();
        let [TransferEvent::EntryPosted(posted)] = events.as_slice() else {
            panic!("not one entry: {events:?}")
        };
        assert_eq!(posted.entry.legs().len(), 2);
        assert_eq!(
            posted
                .transfer
                .as_ref()
                .map(|requested| requested.amount_minor),
            Some(Amount::new(5)),
            "the entry carries the request it posts"
        );
        let t = events.iter().fold(Transfer::default(), evolve);
        assert_eq!(t.record.as_ref().unwrap().entry_id, Some(posted.entry.id()));
        assert_eq!(decide(&t, request("a", "b", 5)), Ok(vec![]));
        assert!(matches!(
            decide(&t, request("a", "b", 6)),
            Err(TransferRejection::TransferAlreadyExists(_))
        ));
    }

    #[test]
    fn a_transfer_written_as_a_request_then_its_entry_folds_the_same() {
        let events = decide(&Transfer::default(), request("a", "b", 5)).unwrap();
        let [TransferEvent::EntryPosted(posted)] = events.as_slice() else {
            panic!("not one entry: {events:?}")
        };
        let requested = posted.transfer.clone().unwrap();
        let older = [
            TransferEvent::TransferRequested(requested),
            TransferEvent::EntryPosted(EntryPosted {
                transfer: None,
                ..posted.clone()
            }),
        ];
        let (one, two) = (
            events.iter().fold(Transfer::default(), evolve),
            older.iter().fold(Transfer::default(), evolve),
        );
        assert_eq!(one.record, two.record);
        assert!(one.record.is_some());
        assert_eq!((one.version, two.version), (1, 2));
    }

    #[test]
    fn insufficient_funds_refuses_the_whole_transfer() {
        let r = request("customer:1:available", "customer:2:available", 500);
        let events = decide(&Transfer::default(), r.clone()).unwrap();
        let TransferEvent::EntryPosted(posted) = &events[0] else {
            panic!("no entry")
        };
        let keys = guarded_keys(&posted.entry);
        let mut guards: BTreeMap<GuardKey, DebitGuard> = keys
            .iter()
            .map(|k| (k.clone(), DebitGuard::default()))
            .collect();
        let refused = decide_with_guards(&Transfer::default(), r.clone(), &guards).unwrap_err();
        assert_eq!(refused.code(), "insufficient_funds");
        guards.insert(
            keys[0].clone(),
            DebitGuard {
                version: 4,
                balance: Amount::new(500),
                ..DebitGuard::default()
            },
        );
        let decision = decide_with_guards(&Transfer::default(), r, &guards).unwrap();
        assert_eq!(decision.guards.len(), 2);
        assert_eq!(decision.guards[0].expected_version, 4);
    }
}
