//! Ending a hold: a transfer requested with `pending: true` is posted (whole or in part; the rest
//! is released), voided by a client, or expired by the worker once `expires_at` has passed.
//!
//! Each ending is its own zero-sum entry, appended to the transfer's stream: nothing is changed
//! in place. A post moves the reservation back off the pending accounts and the posted amount
//! between the two accounts; a void or an expiry only moves the reservation back. The transfer's
//! stream version decides races: of a post and a void of one hold decided at once, the second
//! append conflicts, is decided again, and finds the hold ended.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::account::PendingSide;
use crate::entry::{EntryError, JournalEntry};
use crate::guard::{DebitGuard, GuardKey, GuardRejection};
use crate::ids::{EntryId, TenantId, TransferId};
use crate::money::Amount;
use crate::payment::EntryPosted;
use crate::transfer::{command_guards, Transfer, TransferDecision, TransferEvent, TransferStatus};

/// Why a hold was released without being posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VoidReason {
    /// A client voided it.
    Voided,
    /// Nobody posted or voided it before `expires_at`.
    Expired,
}

/// The hold was posted: `amount_minor` moved, the rest of the reservation was released.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HoldPosted {
    pub amount_minor: Amount,
    pub at: DateTime<Utc>,
}

/// The hold was released whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HoldVoided {
    pub reason: VoidReason,
    pub at: DateTime<Utc>,
}

/// How a hold ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HoldOutcome {
    Posted { amount: Amount },
    Released(VoidReason),
}

impl HoldOutcome {
    /// The status of the transfer it leaves.
    #[must_use]
    pub fn status(self) -> TransferStatus {
        match self {
            HoldOutcome::Posted { .. } => TransferStatus::Posted,
            HoldOutcome::Released(VoidReason::Voided) => TransferStatus::Voided,
            HoldOutcome::Released(VoidReason::Expired) => TransferStatus::Expired,
        }
    }

    /// What moved between the posted balances.
    #[must_use]
    pub fn posted_amount(self) -> Amount {
        match self {
            HoldOutcome::Posted { amount } => amount,
            HoldOutcome::Released(_) => Amount::ZERO,
        }
    }
}

/// A hold's ending, as the transfer record keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HoldSettled {
    pub outcome: HoldOutcome,
    /// The ending's entry, once folded in.
    pub entry_id: Option<EntryId>,
    pub at: DateTime<Utc>,
}

impl HoldSettled {
    pub(crate) fn posted(event: &HoldPosted) -> Self {
        HoldSettled {
            outcome: HoldOutcome::Posted {
                amount: event.amount_minor,
            },
            entry_id: None,
            at: event.at,
        }
    }

    pub(crate) fn voided(event: &HoldVoided) -> Self {
        HoldSettled {
            outcome: HoldOutcome::Released(event.reason),
            entry_id: None,
            at: event.at,
        }
    }
}

/// What to do with a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldAction {
    /// Post `amount` (None: all of it) and release the rest.
    Post { amount: Option<Amount> },
    /// Release it (a client).
    Void,
    /// Release it because `expires_at` has passed (the worker).
    Expire,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SettleHold {
    pub id: TransferId,
    pub tenant: TenantId,
    pub action: HoldAction,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HoldRejection {
    #[error("no transfer {0}")]
    NotFound(TransferId),
    #[error("transfer {0} is not a hold: it was posted when requested")]
    NotAHold(TransferId),
    #[error("hold {id} is already {}", outcome.status().as_str())]
    Ended {
        id: TransferId,
        outcome: HoldOutcome,
    },
    #[error("hold {0} expired: it can only be voided, by the worker")]
    Expired(TransferId),
    #[error("hold {0} has not expired")]
    NotDue(TransferId),
    #[error("amount must be positive")]
    AmountMustBePositive,
    #[error("cannot post {asked} of a hold of {held}")]
    ExceedsHold { held: Amount, asked: Amount },
    #[error(transparent)]
    Guard(#[from] GuardRejection),
    #[error("posting rule produced an invalid entry: {0}")]
    InvalidEntry(String),
}

impl HoldRejection {
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            HoldRejection::NotFound(_) => "transfer_not_found",
            HoldRejection::NotAHold(_) => "not_a_hold",
            HoldRejection::Ended { outcome, .. } => match outcome {
                HoldOutcome::Posted { .. } => "hold_posted",
                HoldOutcome::Released(VoidReason::Voided) => "hold_voided",
                HoldOutcome::Released(VoidReason::Expired) => "hold_expired",
            },
            HoldRejection::Expired(_) => "hold_expired",
            HoldRejection::NotDue(_) => "hold_not_due",
            HoldRejection::AmountMustBePositive => "amount_must_be_positive",
            HoldRejection::ExceedsHold { .. } => "amount_exceeds_hold",
            HoldRejection::Guard(rejection) => rejection.code(),
            HoldRejection::InvalidEntry(_) => "invalid_entry",
        }
    }
}

impl From<EntryError> for HoldRejection {
    fn from(e: EntryError) -> Self {
        HoldRejection::InvalidEntry(e.to_string())
    }
}

/// The events ending the hold `transfer` as `command` asks: `HoldPosted` or `HoldVoided`, then
/// the entry (the reservation moved back, and for a post the posted amount moved).
pub fn decide(
    transfer: &Transfer,
    command: &SettleHold,
) -> Result<Vec<TransferEvent>, HoldRejection> {
    let record = transfer
        .record
        .as_ref()
        .filter(|record| record.requested.tenant == command.tenant)
        .ok_or(HoldRejection::NotFound(command.id))?;
    let requested = &record.requested;
    if !requested.pending {
        return Err(HoldRejection::NotAHold(command.id));
    }
    if let Some(settled) = &record.settled {
        return Err(HoldRejection::Ended {
            id: command.id,
            outcome: settled.outcome,
        });
    }
    let due = requested
        .expires_at
        .is_some_and(|expires_at| command.at >= expires_at);
    let held = requested.amount_minor;
    let release = [
        (requested.from.pending(PendingSide::Debits), held),
        (
            requested.to.pending(PendingSide::Credits),
            held.checked_neg()
                .map_err(|_| HoldRejection::AmountMustBePositive)?,
        ),
    ];
    let (event, suffix, posted) = match command.action {
        HoldAction::Post { .. } if due => return Err(HoldRejection::Expired(command.id)),
        HoldAction::Post { amount } => {
            let amount = amount.unwrap_or(held);
            if !amount.is_positive() {
                return Err(HoldRejection::AmountMustBePositive);
            }
            if amount > held {
                return Err(HoldRejection::ExceedsHold {
                    held,
                    asked: amount,
                });
            }
            let event = TransferEvent::HoldPosted(HoldPosted {
                amount_minor: amount,
                at: command.at,
            });
            (event, "post", amount)
        }
        HoldAction::Expire if !due => return Err(HoldRejection::NotDue(command.id)),
        HoldAction::Void | HoldAction::Expire => {
            let reason = if command.action == HoldAction::Void {
                VoidReason::Voided
            } else {
                VoidReason::Expired
            };
            let event = TransferEvent::HoldVoided(HoldVoided {
                reason,
                at: command.at,
            });
            (event, "void", Amount::ZERO)
        }
    };
    let moved = [
        (
            requested.from.clone(),
            posted
                .checked_neg()
                .map_err(|_| HoldRejection::AmountMustBePositive)?,
        ),
        (requested.to.clone(), posted),
    ];
    let entry = JournalEntry::in_one_currency(
        EntryId::derived(&format!("{}:{suffix}", requested.transfer_id)),
        requested.tenant.clone(),
        requested.currency,
        release.into_iter().chain(moved),
    )?;
    Ok(vec![
        event,
        TransferEvent::EntryPosted(EntryPosted {
            entry,
            at: command.at,
            transfer: None,
        }),
    ])
}

/// [`decide`], then the debit guards of both accounts (the guards of the ending's entry, see
/// [`crate::guard::guarded_keys`]). A release is never refused for funds; a post is refused on a
/// frozen account.
pub fn decide_with_guards(
    transfer: &Transfer,
    command: &SettleHold,
    guards: &BTreeMap<GuardKey, DebitGuard>,
) -> Result<TransferDecision, HoldRejection> {
    let events = decide(transfer, command)?;
    Ok(TransferDecision {
        guards: command_guards(&events, guards)?,
        events,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::AccountName;
    use crate::money::Currency;
    use crate::transfer::{self, evolve, RequestTransfer};

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_764_000_000 + seconds, 0).unwrap()
    }

    fn id() -> TransferId {
        TransferId::from_uuid(uuid::Uuid::from_u128(9))
    }

    fn tenant() -> TenantId {
        TenantId::parse("t").unwrap()
    }

    fn hold(amount: i64, expires_at: Option<DateTime<Utc>>) -> Transfer {
        let request = RequestTransfer {
            id: id(),
            tenant: tenant(),
            from: AccountName::parse("customer:1:available").unwrap(),
            to: AccountName::parse("merchant:2").unwrap(),
            amount: Amount::new(amount),
            currency: Currency::parse("USD").unwrap(),
            description: None,
            pending: true,
            expires_at,
            at: at(0),
        };
        transfer::decide(&Transfer::default(), request)
            .unwrap()
            .iter()
            .fold(Transfer::default(), evolve)
    }

    fn command(action: HoldAction, seconds: i64) -> SettleHold {
        SettleHold {
            id: id(),
            tenant: tenant(),
            action,
            at: at(seconds),
        }
    }

    fn legs(events: &[TransferEvent]) -> Vec<(String, i64)> {
        let Some(TransferEvent::EntryPosted(posted)) = events.last() else {
            panic!("no entry in {events:?}")
        };
        posted
            .entry
            .legs()
            .iter()
            .map(|leg| (leg.account.to_string(), leg.amount.minor()))
            .collect()
    }

    #[test]
    fn a_hold_reserves_on_the_pending_accounts_only() {
        let transfer = hold(100, None);
        let record = transfer.record.as_ref().unwrap();
        assert_eq!(record.status(), TransferStatus::Pending);
        assert_eq!(record.posted_amount(), Amount::ZERO);
        let request = RequestTransfer {
            id: id(),
            tenant: tenant(),
            from: AccountName::parse("customer:1:available").unwrap(),
            to: AccountName::parse("merchant:2").unwrap(),
            amount: Amount::new(100),
            currency: Currency::parse("USD").unwrap(),
            description: None,
            pending: true,
            expires_at: None,
            at: at(0),
        };
        let events = transfer::decide(&Transfer::default(), request.clone()).unwrap();
        assert_eq!(
            legs(&events),
            vec![
                ("pending_debits:customer:1:available".to_owned(), -100),
                ("pending_credits:merchant:2".to_owned(), 100)
            ]
        );
        let expiring = |pending, expires_at| RequestTransfer {
            pending,
            expires_at: Some(expires_at),
            ..request.clone()
        };
        assert_eq!(
            transfer::decide(&Transfer::default(), expiring(false, at(5)))
                .unwrap_err()
                .code(),
            "expires_at_without_hold"
        );
        assert_eq!(
            transfer::decide(&Transfer::default(), expiring(true, at(0)))
                .unwrap_err()
                .code(),
            "expires_at_in_the_past"
        );
    }

    #[test]
    fn a_partial_post_moves_the_part_and_releases_the_whole_reservation() {
        let transfer = hold(100, None);
        let events = decide(
            &transfer,
            &command(
                HoldAction::Post {
                    amount: Some(Amount::new(30)),
                },
                1,
            ),
        )
        .unwrap();
        assert_eq!(
            legs(&events),
            vec![
                ("pending_debits:customer:1:available".to_owned(), 100),
                ("pending_credits:merchant:2".to_owned(), -100),
                ("customer:1:available".to_owned(), -30),
                ("merchant:2".to_owned(), 30),
            ]
        );
        let posted = events.iter().fold(transfer, evolve);
        let record = posted.record.as_ref().unwrap();
        assert_eq!(record.status(), TransferStatus::Posted);
        assert_eq!(record.posted_amount(), Amount::new(30));
        assert!(record.settled.as_ref().unwrap().entry_id.is_some());
        assert_eq!(
            decide(&posted, &command(HoldAction::Void, 2))
                .unwrap_err()
                .code(),
            "hold_posted"
        );
    }

    #[test]
    fn a_void_releases_everything_and_ends_the_hold() {
        let transfer = hold(100, None);
        let events = decide(&transfer, &command(HoldAction::Void, 1)).unwrap();
        assert_eq!(
            legs(&events),
            vec![
                ("pending_debits:customer:1:available".to_owned(), 100),
                ("pending_credits:merchant:2".to_owned(), -100),
            ]
        );
        let voided = events.iter().fold(transfer, evolve);
        assert_eq!(
            voided.record.as_ref().unwrap().status(),
            TransferStatus::Voided
        );
        let post_all = command(HoldAction::Post { amount: None }, 2);
        assert_eq!(
            decide(&voided, &post_all).unwrap_err().code(),
            "hold_voided"
        );
    }

    #[test]
    fn posts_are_bounded_by_the_hold_and_by_its_expiry() {
        let transfer = hold(100, Some(at(60)));
        let post = |amount: i64, seconds| {
            command(
                HoldAction::Post {
                    amount: Some(Amount::new(amount)),
                },
                seconds,
            )
        };
        assert_eq!(
            decide(&transfer, &post(101, 1)).unwrap_err().code(),
            "amount_exceeds_hold"
        );
        assert_eq!(
            decide(&transfer, &post(0, 1)).unwrap_err().code(),
            "amount_must_be_positive"
        );
        assert!(decide(&transfer, &post(100, 59)).is_ok());
        assert_eq!(
            decide(&transfer, &post(100, 60)).unwrap_err().code(),
            "hold_expired"
        );
        assert_eq!(
            decide(&transfer, &command(HoldAction::Expire, 59))
                .unwrap_err()
                .code(),
            "hold_not_due"
        );
        let expired = decide(&transfer, &command(HoldAction::Expire, 60))
            .unwrap()
            .iter()
            .fold(transfer, evolve);
        assert_eq!(
            expired.record.as_ref().unwrap().status(),
            TransferStatus::Expired
        );
        assert_eq!(
            decide(&hold(100, None), &command(HoldAction::Expire, 1_000_000))
                .unwrap_err()
                .code(),
            "hold_not_due"
        );
    }

    #[test]
    fn only_the_tenants_own_holds_can_be_ended() {
        let transfer = hold(100, None);
        let other = SettleHold {
            tenant: TenantId::parse("other").unwrap(),
            ..command(HoldAction::Void, 1)
        };
        assert_eq!(
            decide(&transfer, &other).unwrap_err().code(),
            "transfer_not_found"
        );
        assert_eq!(
            decide(&Transfer::default(), &command(HoldAction::Void, 1))
                .unwrap_err()
                .code(),
            "transfer_not_found"
        );
    }
}
