//! Reconciliation exceptions: a difference between our ledger and a provider's truth, recorded as
//! events so that every finding and every resolution is audited like any other fact.
//!
//! One stream per exception (`exception-exc_…`). The id is derived from what was found (provider,
//! charge, kind and a fingerprint of the difference), so that a sweep run twice over the same
//! difference finds the exception it recorded the first time instead of recording a second one.
//!
//! An exception is `auto` when the sweep fixed it through the payment flow (it is recorded already
//! resolved, in the same transaction as the fix) and `manual` when it needs a person, who resolves
//! it with a note. As everywhere in this crate, rejections are values and time comes in as an
//! argument.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::ids::{IdError, PaymentId, ProviderName, TenantId};

/// The longest resolution note, in characters.
pub const NOTE_CHARS_MAX: usize = 2_048;

/// An exception, and the name of its stream (`exception-exc_…`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExceptionId(Uuid);

/// Namespace for [`ExceptionId::derived`]: a fixed random uuid, so derived exception ids never
/// collide with ids derived for another purpose (entry ids have their own namespace).
const EXCEPTION_ID_NAMESPACE: Uuid = Uuid::from_u128(0x8f3e_61a2_47c9_4d05_b1e8_2c7a_90d4_f613);

impl ExceptionId {
    pub const PREFIX: &'static str = "exc_";

    #[must_use]
    pub const fn from_uuid(uuid: Uuid) -> Self {
        ExceptionId(uuid)
    }

    #[must_use]
    pub const fn as_uuid(&self) -> Uuid {
        self.0
    }

    /// The id of the exception `kind` about `charge_id` at `provider`, for a difference whose
    /// fingerprint is `fingerprint` (the provider's amount, its cumulative refund…): the same
    /// finding always gets the same id.
    #[must_use]
    pub fn derived(
        provider: &ProviderName,
        charge_id: &str,
        kind: ExceptionKind,
        fingerprint: &str,
    ) -> Self {
        // Parts are separated by a character none of them can contain unescaped (provider names
        // are segments; charge ids and fingerprints come from the provider, so '\n' is escaped).
        let cause = format!(
            "{provider}\n{}\n{}\n{}",
            charge_id.replace('\n', "\\n"),
            kind.as_str(),
            fingerprint.replace('\n', "\\n")
        );
        ExceptionId(Uuid::new_v5(&EXCEPTION_ID_NAMESPACE, cause.as_bytes()))
    }

    pub fn parse(value: &str) -> Result<Self, IdError> {
        let bare = value.strip_prefix(Self::PREFIX).unwrap_or(value);
        Uuid::try_parse(bare)
            .map(ExceptionId)
            .map_err(|_| IdError::Malformed {
                kind: "exception id",
                prefix: Self::PREFIX,
                value: value.to_owned(),
            })
    }
}

impl fmt::Display for ExceptionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", Self::PREFIX, self.0.simple())
    }
}

impl fmt::Debug for ExceptionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for ExceptionId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ExceptionId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = String::deserialize(deserializer)?;
        ExceptionId::parse(&value).map_err(serde::de::Error::custom)
    }
}

/// What kind of difference was found. `docs/reconciliation.md` has the table: how each is
/// detected, whether the sweep fixes it, and what it applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExceptionKind {
    /// Captured at the provider, pending, requiring action or authorized here (auto: the capture
    /// is applied).
    CapturedAtProvider,
    /// Authorized at the provider, pending or requiring action here (auto: applied).
    AuthorizedAtProvider,
    /// Refunded at the provider beyond what we recorded: a refund made in the provider's
    /// dashboard (auto: the refund and its entry are posted).
    RefundedOutOfBand,
    /// Failed at the provider, pending or requiring action here (auto: applied).
    FailedAtProvider,
    /// The provider holds another amount than we do (manual).
    AmountMismatch,
    /// The provider holds another currency than we do (manual).
    CurrencyMismatch,
    /// A charge in the provider's report that names no payment of ours (manual).
    UnknownCharge,
    /// A webhook for a payment we do not know, dead-lettered by the worker (manual).
    UnknownPaymentEvent,
    /// Captured here, failed at the provider (manual: money we booked may not exist).
    CapturedHereFailedAtProvider,
    /// Anything that fits no expected state: never guessed at (manual).
    Ambiguous,
    /// Disputed (or the dispute closed) at the provider beyond what we recorded: every webhook
    /// of it was lost (auto: the dispute, and a lost one's entry, are posted).
    DisputedAtProvider,
    /// A capture or refund the provider has not answered for good by its deadline, and that
    /// cannot be safely sent again (manual).
    OperationUnresolved,
    /// A refund of ours that settled and that the provider has since failed, whose webhook was
    /// lost: found when the report shows less refunded than we do (auto: the reversal and its
    /// entry are posted).
    RefundReversedAtProvider,
    /// A fee the provider reports for one of its balance transactions that we have not posted:
    /// the read that carried it was lost (auto: the fee and its entry are posted).
    ProviderFeeUnposted,
    /// The provider reports another fee for a balance transaction than the one we posted
    /// (manual).
    ProviderFeeMismatch,
    /// A payout paid out money of no payment of ours (a balance transaction naming no charge,
    /// or a charge naming no payment of this provider): that part is posted nowhere (manual).
    PayoutUnattributed,
    /// One of the provider's movements of a charge's money (a balance transaction: a capture, a
    /// refund or its failure, a dispute's withdrawal or reinstatement) disagrees with what we
    /// posted for it, though the totals agree (manual).
    BalanceTransactionMismatch,
}

impl ExceptionKind {
    pub const ALL: [ExceptionKind; 17] = [
        ExceptionKind::CapturedAtProvider,
        ExceptionKind::AuthorizedAtProvider,
        ExceptionKind::RefundedOutOfBand,
        ExceptionKind::FailedAtProvider,
        ExceptionKind::AmountMismatch,
        ExceptionKind::CurrencyMismatch,
        ExceptionKind::UnknownCharge,
        ExceptionKind::UnknownPaymentEvent,
        ExceptionKind::CapturedHereFailedAtProvider,
        ExceptionKind::Ambiguous,
        ExceptionKind::DisputedAtProvider,
        ExceptionKind::OperationUnresolved,
        ExceptionKind::RefundReversedAtProvider,
        ExceptionKind::ProviderFeeUnposted,
        ExceptionKind::ProviderFeeMismatch,
        ExceptionKind::PayoutUnattributed,
        ExceptionKind::BalanceTransactionMismatch,
    ];

    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            ExceptionKind::CapturedAtProvider => "captured_at_provider",
            ExceptionKind::AuthorizedAtProvider => "authorized_at_provider",
            ExceptionKind::RefundedOutOfBand => "refunded_out_of_band",
            ExceptionKind::FailedAtProvider => "failed_at_provider",
            ExceptionKind::AmountMismatch => "amount_mismatch",
            ExceptionKind::CurrencyMismatch => "currency_mismatch",
            ExceptionKind::UnknownCharge => "unknown_charge",
            ExceptionKind::UnknownPaymentEvent => "unknown_payment_event",
            ExceptionKind::CapturedHereFailedAtProvider => "captured_here_failed_at_provider",
            ExceptionKind::Ambiguous => "ambiguous",
            ExceptionKind::DisputedAtProvider => "disputed_at_provider",
            ExceptionKind::OperationUnresolved => "operation_unresolved",
            ExceptionKind::RefundReversedAtProvider => "refund_reversed_at_provider",
            ExceptionKind::ProviderFeeUnposted => "provider_fee_unposted",
            ExceptionKind::ProviderFeeMismatch => "provider_fee_mismatch",
            ExceptionKind::PayoutUnattributed => "payout_unattributed",
            ExceptionKind::BalanceTransactionMismatch => "balance_transaction_mismatch",
        }
    }

    #[must_use]
    pub fn parse(text: &str) -> Option<ExceptionKind> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == text)
    }

    /// Whether the sweep may fix this kind itself through the payment flow.
    #[must_use]
    pub const fn is_auto_fixable(self) -> bool {
        matches!(
            self,
            ExceptionKind::CapturedAtProvider
                | ExceptionKind::AuthorizedAtProvider
                | ExceptionKind::RefundedOutOfBand
                | ExceptionKind::FailedAtProvider
                | ExceptionKind::DisputedAtProvider
                | ExceptionKind::RefundReversedAtProvider
                | ExceptionKind::ProviderFeeUnposted
        )
    }
}

impl fmt::Display for ExceptionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who resolves an exception: the sweep (`auto`) or a person (`manual`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    Auto,
    Manual,
}

impl Resolution {
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Resolution::Auto => "auto",
            Resolution::Manual => "manual",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExceptionStatus {
    Open,
    Resolved,
}

impl ExceptionStatus {
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            ExceptionStatus::Open => "open",
            ExceptionStatus::Resolved => "resolved",
        }
    }

    #[must_use]
    pub fn parse(text: &str) -> Option<ExceptionStatus> {
        match text {
            "open" => Some(ExceptionStatus::Open),
            "resolved" => Some(ExceptionStatus::Resolved),
            _ => None,
        }
    }
}

// ------------------------------------------------------------------ events

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExceptionRecorded {
    pub exception_id: ExceptionId,
    /// The payment's tenant; `None` for a charge or event that names no payment of ours (its
    /// tenant is unknown: such exceptions belong to the platform's operators).
    pub tenant: Option<TenantId>,
    pub payment_id: Option<PaymentId>,
    pub provider: ProviderName,
    pub charge_id: Option<String>,
    pub kind: ExceptionKind,
    /// Our side as it stood when the difference was found.
    pub local: Value,
    /// The provider's side, as it reported it.
    pub provider_state: Value,
    /// What differs (field by field, provider minus ours where it is an amount).
    pub difference: Value,
    pub resolution: Resolution,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExceptionResolved {
    pub note: String,
    pub at: DateTime<Utc>,
}

crate::event::event_family! {
    /// Events of an `exception-…` stream.
    ExceptionEvent {
        ExceptionRecorded = 1,
        ExceptionResolved = 1,
    }
}

// ------------------------------------------------------------------ aggregate

/// An exception as its stream leaves it. `record` is `None` until `ExceptionRecorded`.
/// Serialisable so that a read model can keep it folded between batches.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Exception {
    pub version: u64,
    pub record: Option<ExceptionRecord>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExceptionRecord {
    pub recorded: ExceptionRecorded,
    pub status: ExceptionStatus,
    pub note: Option<String>,
    pub resolved_at: Option<DateTime<Utc>>,
}

impl Exception {
    #[must_use]
    pub fn replay<'a>(events: impl IntoIterator<Item = &'a ExceptionEvent>) -> Exception {
        events.into_iter().fold(Exception::default(), evolve)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum ExceptionCommand {
    /// Records a finding; `Resolution::Auto` findings are resolved in the same decision with
    /// `auto_note`, because the sweep applied their fix in the same transaction.
    Record {
        recorded: Box<ExceptionRecorded>,
        auto_note: String,
    },
    Resolve {
        note: String,
        at: DateTime<Utc>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExceptionRejection {
    #[error("exception not found")]
    NotFound,
    #[error("the exception is already resolved")]
    AlreadyResolved,
    #[error("note is empty or longer than {NOTE_CHARS_MAX} characters")]
    NoteInvalid,
}

impl ExceptionRejection {
    /// The stable code the HTTP layer answers with.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            ExceptionRejection::NotFound => "exception_not_found",
            ExceptionRejection::AlreadyResolved => "exception_already_resolved",
            ExceptionRejection::NoteInvalid => "note_invalid",
        }
    }
}

fn check_note(note: &str) -> Result<(), ExceptionRejection> {
    if note.trim().is_empty() || note.chars().count() > NOTE_CHARS_MAX {
        return Err(ExceptionRejection::NoteInvalid);
    }
    Ok(())
}

/// Decides a command. Recording an exception that exists already is no decision at all
/// (`Ok(vec![])`): the same finding found again is the same exception.
pub fn decide(
    exception: &Exception,
    command: ExceptionCommand,
) -> Result<Vec<ExceptionEvent>, ExceptionRejection> {
    match (command, &exception.record) {
        (ExceptionCommand::Record { .. }, Some(_)) => Ok(Vec::new()),
        (
            ExceptionCommand::Record {
                recorded,
                auto_note,
            },
            None,
        ) => {
            let at = recorded.at;
            let auto = recorded.resolution == Resolution::Auto;
            let mut events = vec![ExceptionEvent::ExceptionRecorded(*recorded)];
            if auto {
                check_note(&auto_note)?;
                events.push(ExceptionEvent::ExceptionResolved(ExceptionResolved {
                    note: auto_note,
                    at,
                }));
            }
            Ok(events)
        }
        (ExceptionCommand::Resolve { .. }, None) => Err(ExceptionRejection::NotFound),
        (ExceptionCommand::Resolve { note, at }, Some(record)) => {
            if record.status == ExceptionStatus::Resolved {
                return Err(ExceptionRejection::AlreadyResolved);
            }
            check_note(&note)?;
            Ok(vec![ExceptionEvent::ExceptionResolved(ExceptionResolved {
                note,
                at,
            })])
        }
    }
}

/// Applies one recorded event. Never fails; an event that cannot apply (a resolution before the
/// record) is a bug in whoever appended it and is asserted in debug builds.
#[must_use]
pub fn evolve(mut exception: Exception, event: &ExceptionEvent) -> Exception {
    exception.version += 1;
    match event {
        ExceptionEvent::ExceptionRecorded(recorded) => {
            debug_assert!(exception.record.is_none(), "ExceptionRecorded twice");
            exception.record = Some(ExceptionRecord {
                recorded: recorded.clone(),
                status: ExceptionStatus::Open,
                note: None,
                resolved_at: None,
            });
        }
        ExceptionEvent::ExceptionResolved(resolved) => match exception.record.as_mut() {
            Some(record) => {
                record.status = ExceptionStatus::Resolved;
                record.note = Some(resolved.note.clone());
                record.resolved_at = Some(resolved.at);
            }
            None => debug_assert!(false, "ExceptionResolved before ExceptionRecorded"),
        },
    }
    exception
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone as _;
    use serde_json::json;

    fn at() -> DateTime<Utc> {
        Utc.timestamp_opt(1_764_000_000, 0).unwrap()
    }

    fn recorded(resolution: Resolution) -> ExceptionRecorded {
        let provider = ProviderName::parse("sim").unwrap();
        ExceptionRecorded {
            exception_id: ExceptionId::derived(&provider, "ch_1", ExceptionKind::Ambiguous, ""),
            tenant: None,
            payment_id: None,
            provider,
            charge_id: Some("ch_1".into()),
            kind: ExceptionKind::Ambiguous,
            local: json!(null),
            provider_state: json!({}),
            difference: json!({}),
            resolution,
            at: at(),
        }
    }

    fn record(resolution: Resolution) -> ExceptionCommand {
        ExceptionCommand::Record {
            recorded: Box::new(recorded(resolution)),
            auto_note: "applied by the sweep".into(),
        }
    }

    fn resolve(note: &str) -> ExceptionCommand {
        ExceptionCommand::Resolve {
            note: note.into(),
            at: at(),
        }
    }

    /// Runs commands in order, each against the state the previous ones left; returns each
    /// outcome as (event types, rejection code) and the final status.
    fn check(
        commands: Vec<ExceptionCommand>,
        expected: &[Result<&[&str], &str>],
        status: Option<ExceptionStatus>,
    ) {
        let mut exception = Exception::default();
        for (command, expected) in commands.into_iter().zip(expected) {
            match (decide(&exception, command), expected) {
                (Ok(events), Ok(types)) => {
                    let got: Vec<&str> = events.iter().map(ExceptionEvent::event_type).collect();
                    assert_eq!(&got, types);
                    exception = events.iter().fold(exception, evolve);
                }
                (Err(rejection), Err(code)) => assert_eq!(rejection.code(), *code),
                (got, want) => panic!("got {got:?}, wanted {want:?}"),
            }
        }
        assert_eq!(exception.record.map(|r| r.status), status);
    }

    #[test]
    fn the_rules_of_an_exception() {
        use ExceptionStatus::*;
        check(
            vec![record(Resolution::Manual)],
            &[Ok(&["ExceptionRecorded"])],
            Some(Open),
        );
        check(
            vec![record(Resolution::Auto)],
            &[Ok(&["ExceptionRecorded", "ExceptionResolved"])],
            Some(Resolved),
        );
        // The same finding twice is one exception.
        check(
            vec![record(Resolution::Manual), record(Resolution::Manual)],
            &[Ok(&["ExceptionRecorded"]), Ok(&[])],
            Some(Open),
        );
        check(
            vec![record(Resolution::Manual), resolve("refunded by hand")],
            &[Ok(&["ExceptionRecorded"]), Ok(&["ExceptionResolved"])],
            Some(Resolved),
        );
        check(
            vec![record(Resolution::Manual), resolve("ok"), resolve("again")],
            &[
                Ok(&["ExceptionRecorded"]),
                Ok(&["ExceptionResolved"]),
                Err("exception_already_resolved"),
            ],
            Some(Resolved),
        );
        check(
            vec![record(Resolution::Manual), resolve("  ")],
            &[Ok(&["ExceptionRecorded"]), Err("note_invalid")],
            Some(Open),
        );
        check(vec![resolve("x")], &[Err("exception_not_found")], None);
    }

    #[test]
    fn derived_ids_name_the_finding() {
        let sim = ProviderName::parse("sim").unwrap();
        let a = ExceptionId::derived(&sim, "ch_1", ExceptionKind::AmountMismatch, "9999");
        assert_eq!(
            a,
            ExceptionId::derived(&sim, "ch_1", ExceptionKind::AmountMismatch, "9999")
        );
        assert_ne!(
            a,
            ExceptionId::derived(&sim, "ch_1", ExceptionKind::AmountMismatch, "9998")
        );
        assert_ne!(
            a,
            ExceptionId::derived(&sim, "ch_2", ExceptionKind::AmountMismatch, "9999")
        );
        assert_eq!(ExceptionId::parse(&a.to_string()), Ok(a));
        assert!(ExceptionId::parse("exc_nope").is_err());
        for kind in ExceptionKind::ALL {
            assert_eq!(ExceptionKind::parse(kind.as_str()), Some(kind));
        }
    }
}
