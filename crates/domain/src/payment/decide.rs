//! `decide`: the payment's rules. Each command is checked against the
//! transition table first, then against the amounts; events are built on a
//! draft copy of the state so that a decision emitting several events (an
//! implied capture followed by a refund) sees the effect of each.

use chrono::{DateTime, Utc};

use super::table::{rule, Outcome};
use super::*;
use crate::account::{AccountName, PendingSide};
use crate::entry::JournalEntry;
use crate::fee::{fee, FeeSchedule};
use crate::ids::{
    psp_authorization_cancel_key, psp_cancel_key, psp_capture_key, psp_charge_key, psp_refund_key,
    EntryId,
};
use crate::money::AmountLimit;

/// Decides what a command means for a payment. `Ok(vec![])` means there is
/// nothing new to record (a repeated fact, a repeated request).
pub fn decide(
    payment: &Payment,
    command: PaymentCommand,
) -> Result<Vec<PaymentEvent>, PaymentRejection> {
    let Some(record) = payment.record.as_ref() else {
        return match command {
            PaymentCommand::Create(create) => decide_create(create),
            _ => Err(PaymentRejection::NotFound),
        };
    };
    if let PaymentCommand::Provider { fact, .. } = &command {
        check_fact(fact)?;
    }
    let input = command.input();
    let from = record.status;
    match rule(Some(from), input).outcome {
        Outcome::Reject => return Err(PaymentRejection::InvalidTransition { from, input }),
        Outcome::Ignore => return Ok(Vec::new()),
        Outcome::Apply | Outcome::Flag => {}
    }
    let at = command.at();
    let mut draft = Draft {
        record: record.clone(),
        events: Vec::new(),
        released: Amount::ZERO,
    };
    match command {
        PaymentCommand::Create(_) => {
            return Err(PaymentRejection::InvalidTransition { from, input })
        }
        PaymentCommand::RequestCapture { amount, at } => request_capture(&mut draft, amount, at)?,
        PaymentCommand::RequestRefund { amount, at } => request_refund(&mut draft, amount, at)?,
        PaymentCommand::RequestCancel { at } => request_cancel(&mut draft, at),
        PaymentCommand::Expire { at } => {
            draft.push(PaymentEvent::PaymentExpired(PaymentExpired { at }))
        }
        PaymentCommand::FlagForReview { note, at } => {
            check_text("note", &note)?;
            draft.flag(ReviewReason::Manual, note, at);
        }
        PaymentCommand::Provider { fact, fees, at } => {
            if rule(Some(from), input).outcome == Outcome::Flag {
                if let Some(detail) = contradiction(&draft.record, &fact) {
                    draft.flag(ReviewReason::ContradictingFact, detail, at);
                }
            } else {
                apply_fact(&mut draft, fact, fees, at)?;
            }
        }
    }
    draft.release_authorization(at)?;
    Ok(draft.events)
}

/// The events decided so far, and the record as they leave it.
struct Draft {
    record: PaymentRecord,
    events: Vec<PaymentEvent>,
    /// What a held authorization reserved, once these events took the payment out of
    /// `authorized`: its release is posted last.
    released: Amount,
}

impl Draft {
    fn push(&mut self, event: PaymentEvent) {
        let held = self.record.authorization_held;
        apply(&mut self.record, &event);
        if !held.is_zero() && self.record.authorization_held.is_zero() {
            self.released = held;
        }
        self.events.push(event);
    }

    /// The authorization's hold: a pending credit of `amount` to the customer, from the
    /// provider's clearing account (docs/ledger.md, `ChargeAuthorized`).
    fn hold_legs(&self, amount: Amount) -> Result<Vec<(AccountName, Amount)>, PaymentRejection> {
        Ok(vec![
            (self.customer().pending(PendingSide::Credits), amount),
            (
                self.clearing().pending(PendingSide::Debits),
                amount.checked_neg()?,
            ),
        ])
    }

    /// Posts the release of the authorization's hold when these events took the payment out of
    /// `authorized` (captured, failed, disputed): whatever the capture, the hold ends whole.
    fn release_authorization(&mut self, at: DateTime<Utc>) -> Result<(), PaymentRejection> {
        if self.released.is_zero() {
            return Ok(());
        }
        let legs = self.hold_legs(self.released.checked_neg()?)?;
        self.released = Amount::ZERO;
        self.post("authorization:released", legs, at)
    }

    /// Flags once: the same reason with the same detail is already on record
    /// when a fact arrives twice, and then nothing is added.
    fn flag(&mut self, reason: ReviewReason, detail: String, at: DateTime<Utc>) {
        let known = self
            .record
            .flags
            .iter()
            .any(|f| f.reason == reason && f.detail == detail);
        if !known {
            self.push(PaymentEvent::FlaggedForReview(FlaggedForReview {
                reason,
                detail,
                at,
            }));
        }
    }

    fn post(
        &mut self,
        cause: &str,
        legs: Vec<(AccountName, Amount)>,
        at: DateTime<Utc>,
    ) -> Result<(), PaymentRejection> {
        let id = EntryId::derived(&format!("{}:{cause}", self.record.id));
        let entry = JournalEntry::in_one_currency(
            id,
            self.record.tenant.clone(),
            self.record.currency,
            legs,
        )
        .map_err(|e| PaymentRejection::InvalidEntry(e.to_string()))?;
        self.push(PaymentEvent::EntryPosted(EntryPosted {
            entry,
            at,
            transfer: None,
        }));
        Ok(())
    }

    /// The provider received `op` and decides it later.
    fn received(&mut self, op: &Operation, provider_id: Option<String>, at: DateTime<Utc>) {
        self.push(PaymentEvent::OperationReceived(OperationReceived {
            kind: op.kind,
            sequence: op.sequence,
            provider_id,
            at,
        }));
    }

    /// The provider refused `op`: what it reserved is free again.
    fn refused(&mut self, op: &Operation, reason: String, at: DateTime<Utc>) {
        self.push(PaymentEvent::OperationRefused(OperationRefused {
            kind: op.kind,
            sequence: op.sequence,
            reason,
            at,
        }));
    }

    fn customer(&self) -> AccountName {
        AccountName::customer_available(&self.record.customer)
    }

    fn clearing(&self) -> AccountName {
        AccountName::psp_clearing(&self.record.provider)
    }

    fn disputed(&self) -> AccountName {
        AccountName::psp_disputed(&self.record.provider)
    }
}

fn decide_create(create: CreatePayment) -> Result<Vec<PaymentEvent>, PaymentRejection> {
    if !create.amount.is_positive() {
        return Err(PaymentRejection::AmountMustBePositive);
    }
    AmountLimit::CEILING.check(create.amount)?;
    if let Some(description) = &create.description {
        if description.chars().count() > DESCRIPTION_CHARS_MAX {
            return Err(PaymentRejection::DescriptionTooLong);
        }
    }
    if !metadata_fits(&create.metadata) {
        return Err(PaymentRejection::MetadataTooLarge);
    }
    Ok(vec![PaymentEvent::PaymentIntended(PaymentIntended {
        payment_id: create.id,
        tenant: create.tenant,
        amount_minor: create.amount,
        currency: create.currency,
        customer: create.customer,
        provider: create.provider,
        capture: create.capture_mode,
        description: create.description,
        metadata: create.metadata,
        psp_key: psp_charge_key(create.id),
        payment_method: create.payment_method,
        at: create.at,
    })])
}

fn request_capture(
    draft: &mut Draft,
    amount: Option<Amount>,
    at: DateTime<Utc>,
) -> Result<(), PaymentRejection> {
    let authorized = draft.record.authorized;
    let requested = amount.unwrap_or(authorized);
    if !requested.is_positive() {
        return Err(PaymentRejection::AmountMustBePositive);
    }
    if requested > authorized {
        return Err(PaymentRejection::CaptureExceedsAuthorized {
            requested,
            authorized,
        });
    }
    match draft.record.open_capture().map(|op| op.amount) {
        Some(previous) if previous == requested => Ok(()),
        Some(previous) => Err(PaymentRejection::CaptureAlreadyRequested {
            requested: previous,
        }),
        None => {
            let sequence = draft
                .record
                .operations_of(OperationKind::Capture)
                .saturating_add(1);
            let psp_key = psp_capture_key(draft.record.id, sequence);
            draft.push(PaymentEvent::CaptureRequested(CaptureRequested {
                sequence,
                amount_minor: requested,
                psp_key,
                at,
            }));
            Ok(())
        }
    }
}

fn request_refund(
    draft: &mut Draft,
    amount: Amount,
    at: DateTime<Utc>,
) -> Result<(), PaymentRejection> {
    if !amount.is_positive() {
        return Err(PaymentRejection::AmountMustBePositive);
    }
    let committed = draft.record.refund_committed()?;
    let refundable = draft.record.captured.checked_sub(committed)?;
    if amount > refundable {
        return Err(PaymentRejection::RefundExceedsCaptured {
            requested: amount,
            refundable,
        });
    }
    let sequence = draft
        .record
        .operations_of(OperationKind::Refund)
        .saturating_add(1);
    let psp_key = psp_refund_key(draft.record.id, sequence);
    draft.push(PaymentEvent::RefundRequested(RefundRequested {
        sequence,
        amount_minor: amount,
        requested_total_minor: committed.checked_add(amount)?,
        psp_key,
        at,
    }));
    Ok(())
}

/// Records the merchant's cancel of the authorization, unless one is already awaiting the
/// provider (then the request is that one's).
fn request_cancel(draft: &mut Draft, at: DateTime<Utc>) {
    if draft.record.open_cancel().is_some() {
        return;
    }
    let sequence = draft
        .record
        .operations_of(OperationKind::Cancel)
        .saturating_add(1);
    draft.push(PaymentEvent::CancelRequested(CancelRequested {
        sequence,
        amount_minor: draft.record.authorized,
        psp_key: psp_authorization_cancel_key(draft.record.id, sequence),
        at,
    }));
}

fn check_text(field: &'static str, text: &str) -> Result<(), PaymentRejection> {
    if text.is_empty() || text.chars().count() > TEXT_CHARS_MAX {
        return Err(PaymentRejection::InvalidText { field });
    }
    Ok(())
}

/// Rejects malformed facts: these come from our own parsing of the
/// provider's answer, so they are bugs or garbage, not facts.
fn check_fact(fact: &ProviderFact) -> Result<(), PaymentRejection> {
    let positive = |amount: Amount| {
        if amount.is_positive() {
            Ok(())
        } else {
            Err(PaymentRejection::AmountMustBePositive)
        }
    };
    match fact {
        ProviderFact::Authorized { charge_id, amount }
        | ProviderFact::Captured { charge_id, amount } => {
            check_text("charge_id", charge_id)?;
            positive(*amount)
        }
        ProviderFact::Failed { charge_id, reason } => {
            if let Some(charge_id) = charge_id {
                check_text("charge_id", charge_id)?;
            }
            check_text("reason", reason)
        }
        ProviderFact::AuthorizationEnded { charge_id, reason } => {
            check_text("charge_id", charge_id)?;
            check_text("reason", reason)
        }
        ProviderFact::ActionRequired {
            charge_id,
            redirect_url,
        } => {
            check_text("charge_id", charge_id)?;
            check_text("redirect_url", redirect_url)
        }
        ProviderFact::Refunded {
            charge_id,
            amount_refunded,
            ..
        } => {
            check_text("charge_id", charge_id)?;
            if amount_refunded.is_negative() {
                return Err(PaymentRejection::AmountMustBePositive);
            }
            Ok(())
        }
        ProviderFact::DisputeOpened {
            charge_id,
            dispute_id,
            amount,
        }
        | ProviderFact::DisputeClosed {
            charge_id,
            dispute_id,
            amount,
            ..
        } => {
            check_text("charge_id", charge_id)?;
            check_text("dispute_id", dispute_id)?;
            positive(*amount)
        }
        ProviderFact::Operation {
            kind,
            charge_id,
            psp_key,
            provider_id,
            amount,
            outcome,
            request,
        } => {
            check_text("charge_id", charge_id)?;
            check_text("psp_key", psp_key)?;
            if let Some(provider_id) = provider_id {
                check_text("provider_id", provider_id)?;
            }
            if let Some(request) = request {
                check_text("request_id", &request.id)?;
            }
            if let OperationOutcome::Failed { reason } | OperationOutcome::Reversed { reason } =
                outcome
            {
                check_text("reason", reason)?;
            }
            // A cancel moves what is left of the authorization, which a provider may not say.
            if *kind == OperationKind::Cancel && !amount.is_negative() {
                return Ok(());
            }
            positive(*amount)
        }
        ProviderFact::ProviderFeeCharged {
            charge_id,
            transaction_id,
            fee,
        } => {
            check_text("charge_id", charge_id)?;
            check_text("transaction_id", transaction_id)?;
            AmountLimit::CEILING.check(Amount::new(fee.minor().saturating_abs()))?;
            Ok(())
        }
    }
}

/// For a fact arriving where the table says it contradicts the history:
/// `None` when it only repeats what is already recorded (a capture of the
/// amount already captured, a refund total already reached), otherwise what
/// to tell the reviewer.
fn contradiction(record: &PaymentRecord, fact: &ProviderFact) -> Option<String> {
    let status = record.status;
    match fact {
        ProviderFact::Captured { amount, .. } if *amount == record.captured => None,
        ProviderFact::Captured { amount, .. } => Some(format!(
            "captured {amount} while {status} (captured {})",
            record.captured
        )),
        ProviderFact::Authorized { amount, .. } => {
            Some(format!("authorized {amount} while {status}"))
        }
        ProviderFact::Failed { reason, .. } => Some(format!("failed ({reason}) while {status}")),
        // The table never flags it; were it to, this is what the reviewer reads.
        ProviderFact::AuthorizationEnded { reason, .. } => {
            Some(format!("authorization ended ({reason}) while {status}"))
        }
        ProviderFact::ActionRequired { .. } => None,
        ProviderFact::Refunded {
            amount_refunded,
            current,
            ..
        } if *amount_refunded <= refund_baseline(record, *current) => None,
        ProviderFact::Refunded {
            amount_refunded, ..
        } => Some(format!(
            "refunded total {amount_refunded} while {status} (refunded {} of {})",
            record.refunded, record.captured
        )),
        ProviderFact::DisputeOpened { dispute_id, .. }
        | ProviderFact::DisputeClosed {
            dispute_id,
            outcome: _,
            ..
        } if known_dispute(record, dispute_id, fact) => None,
        ProviderFact::DisputeOpened { dispute_id, .. } => {
            Some(format!("dispute {dispute_id} opened while {status}"))
        }
        ProviderFact::DisputeClosed {
            dispute_id,
            outcome,
            ..
        } => Some(format!(
            "dispute {dispute_id} closed {outcome:?} while {status}"
        )),
        ProviderFact::Operation {
            kind,
            psp_key,
            outcome,
            ..
        } => match record.operation_by_key(psp_key) {
            // A repeat of what the operation already says.
            Some(op) if outcome_is_recorded(op.state, outcome) => None,
            _ => Some(format!(
                "{} {psp_key} {} while {status}",
                kind.as_str(),
                outcome_text(outcome)
            )),
        },
        ProviderFact::ProviderFeeCharged {
            transaction_id,
            fee,
            ..
        } if fee.is_zero() || record.provider_fee(transaction_id).is_some() => None,
        ProviderFact::ProviderFeeCharged {
            transaction_id,
            fee,
            ..
        } => Some(format!(
            "provider fee {fee} for {transaction_id} while {status}"
        )),
    }
}

fn outcome_text(outcome: &OperationOutcome) -> String {
    match outcome {
        OperationOutcome::Pending => "pending".to_owned(),
        OperationOutcome::Succeeded => "succeeded".to_owned(),
        OperationOutcome::Failed { reason } => format!("failed ({reason})"),
        OperationOutcome::Reversed { reason } => format!("reversed ({reason})"),
    }
}

/// The operation's state already reflects this outcome (a late or repeated answer).
fn outcome_is_recorded(state: OperationState, outcome: &OperationOutcome) -> bool {
    match outcome {
        OperationOutcome::Pending => state != OperationState::Requested,
        // A failure is final at the provider: a success after it is the earlier state, late.
        OperationOutcome::Succeeded => matches!(
            state,
            OperationState::Succeeded | OperationState::Reversed | OperationState::Refused
        ),
        OperationOutcome::Failed { .. } => {
            matches!(state, OperationState::Refused | OperationState::Reversed)
        }
        OperationOutcome::Reversed { .. } => state == OperationState::Reversed,
    }
}

/// The dispute fact tells a stage the recorded dispute has reached or passed: it repeats what
/// the record says, or arrives late (a CHARGEBACK after the CHARGEBACK_REVERSED that followed it).
fn known_dispute(record: &PaymentRecord, dispute_id: &str, fact: &ProviderFact) -> bool {
    let Some(dispute) = record.dispute.as_ref().filter(|d| d.id == dispute_id) else {
        return false;
    };
    match fact {
        ProviderFact::DisputeClosed {
            outcome,
            reinstated,
            ..
        } => DisputeStage::closed(*outcome, *reinstated) <= dispute.stage(),
        _ => true,
    }
}

fn charge_mismatch(record: &PaymentRecord, charge_id: &str) -> Option<String> {
    match &record.provider_charge_id {
        Some(known) if known != charge_id => Some(format!(
            "fact about charge {charge_id}, payment is charge {known}"
        )),
        _ => None,
    }
}

fn apply_fact(
    draft: &mut Draft,
    fact: ProviderFact,
    fees: FeeSchedule,
    at: DateTime<Utc>,
) -> Result<(), PaymentRejection> {
    let charge_id = match &fact {
        ProviderFact::Failed { charge_id, .. } => charge_id.clone(),
        ProviderFact::AuthorizationEnded { charge_id, .. }
        | ProviderFact::Authorized { charge_id, .. }
        | ProviderFact::Captured { charge_id, .. }
        | ProviderFact::ActionRequired { charge_id, .. }
        | ProviderFact::Refunded { charge_id, .. }
        | ProviderFact::DisputeOpened { charge_id, .. }
        | ProviderFact::DisputeClosed { charge_id, .. }
        | ProviderFact::Operation { charge_id, .. }
        | ProviderFact::ProviderFeeCharged { charge_id, .. } => Some(charge_id.clone()),
    };
    if let Some(detail) = charge_id.and_then(|id| charge_mismatch(&draft.record, &id)) {
        draft.flag(ReviewReason::ChargeMismatch, detail, at);
        return Ok(());
    }
    match fact {
        ProviderFact::ActionRequired {
            charge_id,
            redirect_url,
        } => {
            let same = draft.record.next_action
                == Some(NextAction::Redirect {
                    redirect_url: redirect_url.clone(),
                });
            if !same {
                draft.push(PaymentEvent::ActionRequired(ActionRequired {
                    charge_id,
                    redirect_url,
                    at,
                }));
            }
        }
        ProviderFact::Authorized { charge_id, amount } => {
            if amount > draft.record.amount {
                let detail = format!(
                    "authorized {amount} beyond the payment's {}",
                    draft.record.amount
                );
                draft.flag(ReviewReason::ContradictingFact, detail, at);
            } else {
                draft.push(PaymentEvent::ChargeAuthorized(ChargeAuthorized {
                    charge_id,
                    amount_minor: amount,
                    held: true,
                    at,
                }));
                let legs = draft.hold_legs(amount)?;
                draft.post("authorization", legs, at)?;
            }
        }
        ProviderFact::Captured { charge_id, amount } => {
            let limit = capturable(&draft.record);
            if amount > limit {
                let detail = format!(
                    "captured {amount} beyond the {limit} capturable while {}",
                    draft.record.status
                );
                draft.flag(ReviewReason::ContradictingFact, detail, at);
            } else {
                capture(draft, charge_id, amount, fees, false, at)?;
            }
        }
        ProviderFact::Failed { charge_id, reason } => {
            if draft.record.status == PaymentStatus::Authorized {
                end_authorization(draft, charge_id, reason, at);
            } else {
                draft.push(PaymentEvent::ChargeFailed(ChargeFailed {
                    charge_id,
                    reason,
                    at,
                }));
            }
        }
        ProviderFact::AuthorizationEnded { charge_id, reason } => {
            authorization_ended(draft, charge_id, reason, at);
        }
        ProviderFact::Refunded {
            charge_id,
            amount_refunded,
            current,
        } => {
            // A cumulative total read now counts what is refunded now; a snapshot may predate a
            // reversal and still count the reversed refund, so only what exceeds everything we
            // ever settled is new.
            if amount_refunded <= refund_baseline(&draft.record, current) {
                return Ok(());
            }
            if !implied_capture(draft, &charge_id, amount_refunded, fees, at)? {
                return Ok(());
            }
            let baseline = refund_baseline(&draft.record, current);
            let new_total = draft
                .record
                .refunded
                .checked_add(amount_refunded.checked_sub(baseline)?)?;
            if new_total > draft.record.captured {
                let detail = format!(
                    "refunded total {amount_refunded} beyond the captured {}",
                    draft.record.captured
                );
                draft.flag(ReviewReason::ContradictingFact, detail, at);
                return Ok(());
            }
            if !current && !open_refunds_explain(&draft.record, new_total, at) {
                return Ok(());
            }
            let settled = SettledRefund {
                charge_id,
                sequence: None,
                refund_id: None,
            };
            settle_refund(draft, settled, new_total, at)?;
        }
        ProviderFact::DisputeOpened {
            charge_id,
            dispute_id,
            amount,
        } => {
            if known_dispute(
                &draft.record,
                &dispute_id,
                &ProviderFact::DisputeOpened {
                    charge_id: charge_id.clone(),
                    dispute_id: dispute_id.clone(),
                    amount,
                },
            ) {
                return Ok(());
            }
            if implied_capture(draft, &charge_id, Amount::ZERO, fees, at)? {
                open_dispute(draft, dispute_id, amount, at)?;
            }
        }
        ProviderFact::DisputeClosed {
            charge_id,
            dispute_id,
            amount,
            outcome,
            reinstated,
        } => {
            let told = DisputeStage::closed(outcome, reinstated);
            close_dispute(draft, charge_id, dispute_id, amount, told, fees, at)?;
        }
        ProviderFact::Operation {
            kind,
            charge_id,
            psp_key,
            provider_id,
            amount,
            outcome,
            request,
        } => {
            // A reversal is the success and then the failure: an operation still open takes the
            // success first, so that the failure undoes what it did; one already decided takes
            // only what it lacks (the success then repeats a recorded state).
            let outcomes = match outcome {
                OperationOutcome::Reversed { reason } => {
                    vec![
                        OperationOutcome::Succeeded,
                        OperationOutcome::Failed { reason },
                    ]
                }
                outcome => vec![outcome],
            };
            for outcome in outcomes {
                let reported = ReportedOperation {
                    charge_id: charge_id.clone(),
                    psp_key: psp_key.clone(),
                    provider_id: provider_id.clone(),
                    amount,
                    outcome,
                    request: request.clone(),
                };
                match kind {
                    OperationKind::Capture => capture_outcome(draft, reported, fees, at)?,
                    OperationKind::Refund => refund_outcome(draft, reported, at)?,
                    OperationKind::Cancel => cancel_outcome(draft, reported, at),
                }
            }
        }
        ProviderFact::ProviderFeeCharged {
            transaction_id,
            fee,
            ..
        } => provider_fee(draft, transaction_id, fee, at)?,
    }
    Ok(())
}

/// The provider ended what was left of the authorization. Before any capture was asked for, or
/// once the one asked for was refused, the payment fails (is canceled, when the merchant asked
/// for that). While a capture is open, its outcome decides (the provider took it before the end,
/// or refuses it): the end is recorded and the payment stays `authorized`, so that a success
/// captures as if the end had come after it (then it ended only the uncaptured remainder, which
/// changes nothing) and a refusal fails (or cancels) the payment.
fn authorization_ended(draft: &mut Draft, charge_id: String, reason: String, at: DateTime<Utc>) {
    let status = draft.record.status;
    if status == PaymentStatus::Authorized && draft.record.open_capture().is_some() {
        cancel_done(draft, at);
        if draft.record.authorization_ended.is_none() {
            draft.push(PaymentEvent::AuthorizationEnded(AuthorizationEnded {
                charge_id,
                reason,
                at,
            }));
        }
        return;
    }
    end_authorization(draft, Some(charge_id), reason, at);
}

/// The authorization ended while the merchant's cancel awaited the provider: that is the
/// cancel's outcome (Adyen tells it by the CANCELLATION alone), so the cancel is done.
fn cancel_done(draft: &mut Draft, at: DateTime<Utc>) {
    if let Some(op) = draft.record.open_cancel().cloned() {
        draft.push(PaymentEvent::CancelSucceeded(CancelSucceeded {
            sequence: op.sequence,
            provider_id: None,
            at,
        }));
    }
}

/// Nothing was or will be captured of the authorization: the payment is canceled when the
/// merchant asked for that, otherwise it failed with `reason`.
fn end_authorization(
    draft: &mut Draft,
    charge_id: Option<String>,
    reason: String,
    at: DateTime<Utc>,
) {
    cancel_done(draft, at);
    if draft.record.cancel_asked() {
        draft.push(PaymentEvent::PaymentCanceled(PaymentCanceled { at }));
    } else {
        draft.push(PaymentEvent::ChargeFailed(ChargeFailed {
            charge_id,
            reason,
            at,
        }));
    }
}

/// The provider kept `fee` for one balance transaction: the clearing account comes up by it (the
/// provider owes us that much less) and the provider's expense account takes it. Posted once per
/// transaction; a different fee reported later for the same one is for a person to look at (the
/// table flags a fee on a payment that moved no money).
fn provider_fee(
    draft: &mut Draft,
    transaction_id: String,
    fee: Amount,
    at: DateTime<Utc>,
) -> Result<(), PaymentRejection> {
    if let Some(posted) = draft.record.provider_fee(&transaction_id) {
        if posted != fee {
            let detail =
                format!("provider fee {fee} for {transaction_id}, {posted} already posted for it");
            draft.flag(ReviewReason::ContradictingFact, detail, at);
        }
        return Ok(());
    }
    if fee.is_zero() {
        return Ok(());
    }
    draft.push(PaymentEvent::ProviderFeeCharged(ProviderFeeCharged {
        transaction_id: transaction_id.clone(),
        fee_minor: fee,
        at,
    }));
    let expense = AccountName::provider_fees(&draft.record.provider);
    let legs = vec![(draft.clearing(), fee), (expense, fee.checked_neg()?)];
    draft.post(&format!("provider_fee:{transaction_id}"), legs, at)
}

/// An operation outcome, taken apart.
struct ReportedOperation {
    charge_id: String,
    psp_key: String,
    provider_id: Option<String>,
    amount: Amount,
    outcome: OperationOutcome,
    request: Option<ProviderRequest>,
}

/// Records the provider's request that answered `op`, once per request, before what it said.
fn answered(
    draft: &mut Draft,
    op: &Operation,
    request: Option<&ProviderRequest>,
    at: DateTime<Utc>,
) {
    let Some(request) = request else {
        return;
    };
    if op.requests.iter().any(|known| known.id == request.id) {
        return;
    }
    draft.push(PaymentEvent::OperationAnswered(OperationAnswered {
        kind: op.kind,
        sequence: op.sequence,
        request_id: request.id.clone(),
        replayed: request.replayed,
        at,
    }));
}

/// The operation a reported outcome is about, if it is ours and its amount is the one we asked
/// for; otherwise the reviewer is told (once) and `None` comes back.
fn reported_operation(
    draft: &mut Draft,
    kind: OperationKind,
    reported: &ReportedOperation,
    at: DateTime<Utc>,
) -> Option<Operation> {
    let detail = match draft.record.operation_by_key(&reported.psp_key) {
        // A cancel's amount is what the provider had left, which it may not say.
        Some(op)
            if op.kind == kind
                && (op.amount == reported.amount || kind == OperationKind::Cancel) =>
        {
            return Some(op.clone())
        }
        Some(op) => format!(
            "{} {} reported for {} {}, we asked {} {}",
            kind.as_str(),
            reported.psp_key,
            reported.amount,
            outcome_text(&reported.outcome),
            op.kind.as_str(),
            op.amount
        ),
        None => format!(
            "{} {} {} that we never asked for",
            kind.as_str(),
            reported.psp_key,
            outcome_text(&reported.outcome)
        ),
    };
    draft.flag(ReviewReason::ContradictingFact, detail, at);
    None
}

fn capture_outcome(
    draft: &mut Draft,
    reported: ReportedOperation,
    fees: FeeSchedule,
    at: DateTime<Utc>,
) -> Result<(), PaymentRejection> {
    let Some(op) = reported_operation(draft, OperationKind::Capture, &reported, at) else {
        return Ok(());
    };
    answered(draft, &op, reported.request.as_ref(), at);
    match (op.state, reported.outcome) {
        (OperationState::Requested, OperationOutcome::Pending) => {
            draft.received(&op, reported.provider_id, at);
        }
        (OperationState::Requested | OperationState::Pending, OperationOutcome::Succeeded)
            if draft.record.status == PaymentStatus::Authorized =>
        {
            capture(draft, reported.charge_id, op.amount, fees, false, at)?;
        }
        (
            OperationState::Requested | OperationState::Pending,
            OperationOutcome::Failed { reason },
        ) => {
            draft.refused(&op, reason, at);
            // The authorization ended while this capture was open: nothing is left to capture.
            if let Some(ended) = draft.record.authorization_ended.clone() {
                let charge_id = draft.record.provider_charge_id.clone();
                end_authorization(draft, charge_id, ended, at);
            }
        }
        // A cancel won, and yet the provider says it captured.
        (OperationState::Requested | OperationState::Pending, OperationOutcome::Succeeded)
            if draft.record.status == PaymentStatus::Canceled =>
        {
            let detail = format!("capture {} succeeded after the cancel", op.psp_key);
            draft.flag(ReviewReason::ContradictingFact, detail, at);
        }
        (OperationState::Succeeded, OperationOutcome::Failed { reason })
            if draft.record.status == PaymentStatus::Captured
                && draft.record.captured == op.amount =>
        {
            reverse_capture(draft, &op, reason, at)?;
        }
        // Refunded or disputed since: what the failure takes back is not ours to guess.
        (OperationState::Succeeded, OperationOutcome::Failed { reason }) => {
            let detail = format!(
                "capture {} failed ({reason}) after it succeeded, with the payment {}",
                op.psp_key,
                draft.record.status.as_str()
            );
            draft.flag(ReviewReason::ContradictingFact, detail, at);
        }
        // Late or repeated: already recorded. A provider's failure is final, so a success that
        // arrives after it is the earlier state delivered late.
        _ => {}
    }
    Ok(())
}

/// The outcome of a cancel we asked for. Its success ends the authorization: with nothing
/// captured the payment is canceled; with a capture still open the end waits for that capture's
/// outcome (as any end of the authorization does); once a capture won, only the cancel is marked.
/// A refusal leaves the payment as it is, and the merchant may ask again.
fn cancel_outcome(draft: &mut Draft, reported: ReportedOperation, at: DateTime<Utc>) {
    // The stale sweep's cancel of an abandoned charge is no operation of the payment's: its
    // effect is the charge's, which the charge's own facts tell.
    if reported.psp_key == psp_cancel_key(draft.record.id) {
        return;
    }
    let Some(op) = reported_operation(draft, OperationKind::Cancel, &reported, at) else {
        return;
    };
    answered(draft, &op, reported.request.as_ref(), at);
    match (op.state, reported.outcome) {
        (OperationState::Requested, OperationOutcome::Pending) => {
            draft.received(&op, reported.provider_id, at);
        }
        (OperationState::Requested | OperationState::Pending, OperationOutcome::Succeeded) => {
            draft.push(PaymentEvent::CancelSucceeded(CancelSucceeded {
                sequence: op.sequence,
                provider_id: reported.provider_id,
                at,
            }));
            if draft.record.status == PaymentStatus::Authorized {
                authorization_ended(draft, reported.charge_id, "canceled".to_owned(), at);
            }
        }
        (
            OperationState::Requested | OperationState::Pending,
            OperationOutcome::Failed { reason },
        ) => draft.refused(&op, reason, at),
        // Late or repeated; a cancel "reversed" after it succeeded ended the authorization all
        // the same.
        _ => {}
    }
}

fn refund_outcome(
    draft: &mut Draft,
    reported: ReportedOperation,
    at: DateTime<Utc>,
) -> Result<(), PaymentRejection> {
    let Some(op) = reported_operation(draft, OperationKind::Refund, &reported, at) else {
        return Ok(());
    };
    answered(draft, &op, reported.request.as_ref(), at);
    match (op.state, reported.outcome) {
        (OperationState::Requested, OperationOutcome::Pending) => {
            draft.received(&op, reported.provider_id, at);
        }
        (OperationState::Requested | OperationState::Pending, OperationOutcome::Succeeded) => {
            // What settled refunds account for after this one; a cumulative report may already
            // have settled it without naming it, and then only the operation is marked.
            let accounted = draft.record.operations_refunded.checked_add(op.amount)?;
            let already = draft.record.refund_settled_ever();
            let new_total = draft
                .record
                .refunded
                .checked_add(accounted.checked_sub(already)?.max(Amount::ZERO))?;
            if new_total > draft.record.captured {
                let detail = format!(
                    "refund {} of {} beyond the captured {} (refunded {})",
                    op.psp_key, op.amount, draft.record.captured, draft.record.refunded
                );
                draft.flag(ReviewReason::ContradictingFact, detail, at);
                return Ok(());
            }
            let settled = SettledRefund {
                charge_id: reported.charge_id,
                sequence: Some(op.sequence),
                refund_id: reported.provider_id,
            };
            settle_refund(draft, settled, new_total, at)?;
        }
        (
            OperationState::Requested | OperationState::Pending,
            OperationOutcome::Failed { reason },
        ) => {
            draft.refused(&op, reason, at);
        }
        // A refund given a cumulative report's settlement and then failed is reversed like any
        // other: if the report had counted a refund made elsewhere instead, the next total read
        // now settles that again.
        (OperationState::Succeeded, OperationOutcome::Failed { reason }) => {
            reverse_refund(draft, &op, reason, at)?;
        }
        // Settled by a cumulative total that named no refund: the answer names it.
        (OperationState::Succeeded, OperationOutcome::Succeeded) if op.provider_id.is_none() => {
            if let Some(provider_id) = reported.provider_id {
                draft.push(PaymentEvent::OperationIdentified(OperationIdentified {
                    kind: op.kind,
                    sequence: op.sequence,
                    provider_id,
                    at,
                }));
            }
        }
        // Late or repeated: already recorded. A provider's failure is final, so a success that
        // arrives after it (a refund that succeeded and then failed, its events delivered out of
        // order) is the earlier state, late; and a reversed refund did succeed once. So every
        // later state reflects what an earlier one did, as the webhook worker relies on.
        _ => {}
    }
    Ok(())
}

/// What a cumulative refund total is compared with: what is refunded now for a total read now;
/// for a snapshot, which may predate a failure, every refund ever settled (reversed ones too)
/// and every refund of ours the provider failed (a snapshot taken while it still counted one
/// is not news). A snapshot is so conservative; a total read now corrects it.
fn refund_baseline(record: &PaymentRecord, current: bool) -> Amount {
    if current {
        return record.refunded;
    }
    record
        .operations
        .iter()
        .filter(|op| op.kind == OperationKind::Refund && op.state == OperationState::Refused)
        .fold(record.refund_settled_ever(), |total, op| {
            total.checked_add(op.amount).unwrap_or(total)
        })
}

/// Whether a snapshot that leaves the refunded total at `new_total` may settle it while refunds of
/// ours are open: only when what it settles is wholly the open refunds it would be attributed to
/// ([`PaymentRecord::attribute_settled_refunds`]). A snapshot compared with every refund ever
/// settled also counts, once one of them is reversed, a total that no longer includes it: the
/// excess is then no refund at all (7,636 of an open refund less a reversed 545), and settling it
/// would refund what nobody asked for. The open refunds' own outcomes, and totals read now, settle
/// what such a snapshot leaves. With no refund of ours open, the excess is a refund made elsewhere.
fn open_refunds_explain(record: &PaymentRecord, new_total: Amount, at: DateTime<Utc>) -> bool {
    let open = |record: &PaymentRecord| -> Amount {
        record
            .operations
            .iter()
            .filter(|op| op.kind == OperationKind::Refund && op.state.is_open())
            .fold(Amount::ZERO, |total, op| {
                total.checked_add(op.amount).unwrap_or(SATURATED)
            })
    };
    let open_before = open(record);
    if open_before.is_zero() {
        return true;
    }
    let mut settled = record.clone();
    settled.refunded = new_total;
    settled.attribute_settled_refunds(at);
    let attributed = open_before.checked_sub(open(&settled)).ok();
    attributed == new_total.checked_sub(record.refunded).ok()
}

/// The most a capture fact may capture: the authorization once there is
/// one, the payment's amount before.
fn capturable(record: &PaymentRecord) -> Amount {
    if record.status == PaymentStatus::Authorized {
        record.authorized
    } else {
        record.amount
    }
}

/// Refunds and disputes exist only for captured charges, so one arriving
/// before the capture fact implies it (the authorization's amount, or the
/// payment's). Returns `false` (after flagging) when even that cannot cover
/// `needed`.
fn implied_capture(
    draft: &mut Draft,
    charge_id: &str,
    needed: Amount,
    fees: FeeSchedule,
    at: DateTime<Utc>,
) -> Result<bool, PaymentRejection> {
    if !draft.record.status.is_before_capture() {
        return Ok(true);
    }
    let amount = capturable(&draft.record);
    if needed > amount {
        let detail =
            format!("refunded total {needed} before capture, beyond the capturable {amount}");
        draft.flag(ReviewReason::ContradictingFact, detail, at);
        return Ok(false);
    }
    capture(draft, charge_id.to_owned(), amount, fees, true, at)?;
    Ok(true)
}

/// Capture posting: clearing −amount, customer +(amount − fee), fees +fee.
fn capture(
    draft: &mut Draft,
    charge_id: String,
    amount: Amount,
    fees: FeeSchedule,
    implied: bool,
    at: DateTime<Utc>,
) -> Result<(), PaymentRejection> {
    let fee_minor = fee(amount, fees).map_err(|_| PaymentRejection::AmountOverflow)?;
    draft.push(PaymentEvent::ChargeCaptured(ChargeCaptured {
        charge_id,
        amount_minor: amount,
        fee_minor,
        fees,
        implied,
        at,
    }));
    let legs = vec![
        (draft.clearing(), amount.checked_neg()?),
        (draft.customer(), amount.checked_sub(fee_minor)?),
        (AccountName::revenue_fees(), fee_minor),
    ];
    draft.post("capture", legs, at)
}

/// A capture that succeeded and then failed at the provider, before anything was refunded or
/// disputed: the capture's posting is mirrored (clearing back up, the customer's share and the
/// fee taken back) and the payment fails.
fn reverse_capture(
    draft: &mut Draft,
    op: &Operation,
    reason: String,
    at: DateTime<Utc>,
) -> Result<(), PaymentRejection> {
    let fee_minor = draft.record.fee;
    draft.push(PaymentEvent::CaptureReversed(CaptureReversed {
        sequence: op.sequence,
        amount_minor: op.amount,
        fee_minor,
        reason,
        at,
    }));
    let legs = vec![
        (draft.clearing(), op.amount),
        (draft.customer(), fee_minor.checked_sub(op.amount)?),
        (AccountName::revenue_fees(), fee_minor.checked_neg()?),
    ];
    draft.post(&format!("capture:op:{}:reversed", op.sequence), legs, at)
}

/// Refund posting for the newly refunded `delta`, giving back the fee share
/// telescopically: after a cumulative refund `r`, the fee reversed in total
/// is `min(fee(r), fee charged)`, so the only rounding stays in `fee`, a full
/// refund gives back exactly the fee, and the customer never pays more than
/// what the refund takes from their credit.
fn settle_refund(
    draft: &mut Draft,
    settled: SettledRefund,
    refunded_total: Amount,
    at: DateTime<Utc>,
) -> Result<(), PaymentRejection> {
    let record = &draft.record;
    let delta = refunded_total.checked_sub(record.refunded)?;
    let fee_delta = fee_reversed_at(record, refunded_total)?
        .checked_sub(record.fee_reversed)?
        .max(Amount::ZERO);
    // Every refund ever settled only grows, so it names each cumulative settlement once, even
    // after a reversal brought the refunded total back to a value it had before.
    let ever = record.refund_settled_ever().checked_add(delta)?;
    let sequence = settled.sequence;
    draft.push(PaymentEvent::RefundSettled(RefundSettled {
        sequence,
        refund_id: settled.refund_id,
        charge_id: settled.charge_id,
        amount_minor: delta,
        refunded_total_minor: refunded_total,
        fee_reversed_minor: fee_delta,
        at,
    }));
    if delta.is_zero() {
        // A cumulative report settled this refund already; the event only marks its operation.
        return Ok(());
    }
    let cause = match sequence {
        Some(sequence) => format!("refund:op:{sequence}"),
        None => format!("refund:{ever}"),
    };
    post_refund_legs(draft, delta, fee_delta, &cause, at)
}

/// A refund that settled and then failed at the provider: the refunded total goes back down by
/// its amount, the fee share it gave back is taken again (the same telescoping rule, so the only
/// rounding stays in `fee`), and the entry mirrors the refund's.
fn reverse_refund(
    draft: &mut Draft,
    op: &Operation,
    reason: String,
    at: DateTime<Utc>,
) -> Result<(), PaymentRejection> {
    let record = &draft.record;
    let Ok(refunded_total) = record.refunded.checked_sub(op.amount) else {
        return Err(PaymentRejection::AmountOverflow);
    };
    if refunded_total.is_negative() {
        let detail = format!(
            "refund {} of {} reversed while only {} is refunded",
            op.psp_key, op.amount, record.refunded
        );
        draft.flag(ReviewReason::ContradictingFact, detail, at);
        return Ok(());
    }
    let fee_restored = record
        .fee_reversed
        .checked_sub(fee_reversed_at(record, refunded_total)?)?
        .max(Amount::ZERO);
    draft.push(PaymentEvent::RefundReversed(RefundReversed {
        sequence: op.sequence,
        amount_minor: op.amount,
        refunded_total_minor: refunded_total,
        fee_restored_minor: fee_restored,
        reason,
        at,
    }));
    let delta = op.amount.checked_neg()?;
    let fee_delta = fee_restored.checked_neg()?;
    post_refund_legs(
        draft,
        delta,
        fee_delta,
        &format!("refund:op:{}:reversed", op.sequence),
        at,
    )
}

/// The fee share given back in total once `refunded_total` is refunded: `min(fee(r), fee)`.
fn fee_reversed_at(
    record: &PaymentRecord,
    refunded_total: Amount,
) -> Result<Amount, PaymentRejection> {
    let schedule = record.fee_schedule.unwrap_or_default();
    Ok(fee(refunded_total, schedule)
        .map_err(|_| PaymentRejection::AmountOverflow)?
        .min(record.fee))
}

/// The posting of a change `delta` of the refunded total with the fee share `fee_delta` given
/// back: clearing +delta, customer (fee_delta − delta), fees −fee_delta. A reversal is the same
/// posting with both negative.
fn post_refund_legs(
    draft: &mut Draft,
    delta: Amount,
    fee_delta: Amount,
    cause: &str,
    at: DateTime<Utc>,
) -> Result<(), PaymentRejection> {
    let legs = vec![
        (draft.clearing(), delta),
        (draft.customer(), fee_delta.checked_sub(delta)?),
        (AccountName::revenue_fees(), fee_delta.checked_neg()?),
    ];
    draft.post(cause, legs, at)
}

/// Which refund a settlement is: one of our operations, or a cumulative report.
struct SettledRefund {
    charge_id: String,
    sequence: Option<u32>,
    refund_id: Option<String>,
}

fn open_dispute(
    draft: &mut Draft,
    dispute_id: String,
    amount: Amount,
    at: DateTime<Utc>,
) -> Result<(), PaymentRejection> {
    let open = draft.record.captured.checked_sub(draft.record.refunded)?;
    let detail =
        format!("dispute {dispute_id} of {amount} beyond the {open} captured and not refunded");
    draft.push(PaymentEvent::DisputeOpened(DisputeOpened {
        dispute_id: dispute_id.clone(),
        amount_minor: amount,
        at,
    }));
    // The provider withdraws the disputed amount as the dispute opens (Stripe's `adjustment`
    // balance transaction): it no longer owes it to us, and holds it until the outcome.
    let legs = vec![
        (draft.clearing(), amount),
        (draft.disputed(), amount.checked_neg()?),
    ];
    draft.post(&format!("dispute:{dispute_id}:withdrawn"), legs, at)?;
    if amount > open {
        draft.flag(ReviewReason::ContradictingFact, detail, at);
    }
    Ok(())
}

fn close_dispute(
    draft: &mut Draft,
    charge_id: String,
    dispute_id: String,
    amount: Amount,
    told: DisputeStage,
    fees: FeeSchedule,
    at: DateTime<Utc>,
) -> Result<(), PaymentRejection> {
    let known = draft
        .record
        .dispute
        .as_ref()
        .is_some_and(|d| d.id == dispute_id);
    if known {
        return advance_dispute(draft, &dispute_id, told, at);
    }
    if draft.record.status == PaymentStatus::Disputed {
        let detail = format!(
            "dispute {dispute_id} closed {} while another dispute is on record",
            told.as_str()
        );
        draft.flag(ReviewReason::ContradictingFact, detail, at);
        return Ok(());
    }
    // The close arrived before its open: it stands for both.
    if implied_capture(draft, &charge_id, Amount::ZERO, fees, at)? {
        open_dispute(draft, dispute_id.clone(), amount, at)?;
        advance_dispute(draft, &dispute_id, told, at)?;
    }
    Ok(())
}

/// Moves the recorded dispute on to the stage `told`, through every stage between (a second
/// chargeback told first also wins the dispute before it loses it again), each with its posting.
/// A stage the dispute has reached or passed is a late or repeated report: nothing.
fn advance_dispute(
    draft: &mut Draft,
    dispute_id: &str,
    told: DisputeStage,
    at: DateTime<Utc>,
) -> Result<(), PaymentRejection> {
    while let Some(dispute) = draft.record.dispute.clone() {
        let next = match dispute.stage() {
            stage if stage >= told => return Ok(()),
            DisputeStage::Open if told == DisputeStage::Lost => DisputeStage::Lost,
            DisputeStage::Open | DisputeStage::Lost => DisputeStage::Won,
            DisputeStage::Won | DisputeStage::LostAgain => DisputeStage::LostAgain,
        };
        settle_dispute(draft, dispute_id, &dispute, next, at)?;
    }
    Ok(())
}

/// Moves `dispute` one stage on, to `next`, and posts the money that moves:
/// - won while open: the withdrawal comes back to clearing (disputed +A, clearing −A);
/// - lost while open: the withdrawal was the customer's money (disputed +A, customer −A);
/// - won after a loss: the provider gives back what the loss took (customer +A, clearing −A);
/// - lost again after a win (a second chargeback): the provider withdraws the money again, and
///   it is the customer's (clearing +A, customer −A).
///
/// A dispute whose opening posted no withdrawal (an older log) posts a loss while open as
/// clearing +A, customer −A, and a win while open as nothing: either way the provider took the
/// money back out of what it owed us.
fn settle_dispute(
    draft: &mut Draft,
    dispute_id: &str,
    dispute: &Dispute,
    next: DisputeStage,
    at: DateTime<Utc>,
) -> Result<(), PaymentRejection> {
    let amount = dispute.amount;
    let outcome = match next {
        DisputeStage::Won => DisputeOutcome::Won,
        DisputeStage::Lost | DisputeStage::LostAgain => DisputeOutcome::Lost,
        DisputeStage::Open => return Ok(()),
    };
    draft.push(PaymentEvent::DisputeClosed(DisputeClosed {
        dispute_id: dispute_id.to_owned(),
        outcome,
        at,
    }));
    let (cause, legs) = match (dispute.stage(), next, dispute.withdrawn) {
        (DisputeStage::Open, DisputeStage::Won, false) => return Ok(()),
        (DisputeStage::Open, DisputeStage::Won, true) => (
            "reinstated",
            vec![
                (draft.disputed(), amount),
                (draft.clearing(), amount.checked_neg()?),
            ],
        ),
        (DisputeStage::Open, _, true) => (
            "lost",
            vec![
                (draft.disputed(), amount),
                (draft.customer(), amount.checked_neg()?),
            ],
        ),
        (DisputeStage::Open, _, false) => (
            "lost",
            vec![
                (draft.clearing(), amount),
                (draft.customer(), amount.checked_neg()?),
            ],
        ),
        (_, DisputeStage::Won, _) => (
            "reinstated",
            vec![
                (draft.customer(), amount),
                (draft.clearing(), amount.checked_neg()?),
            ],
        ),
        (_, _, _) => (
            "lost_again",
            vec![
                (draft.clearing(), amount),
                (draft.customer(), amount.checked_neg()?),
            ],
        ),
    };
    draft.post(&format!("dispute:{dispute_id}:{cause}"), legs, at)
}
