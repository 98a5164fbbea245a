//! The one reading of Adyen's answers and notifications in the port's terms (docs/adyen-wire.md §1, §4,
//! §6): a `/payments` answer's `resultCode` as a charge outcome, a modification's `received` as
//! a pending operation, and each notification item as what it says of one charge, one operation
//! or one dispute.
//!
//! A notification carries no state of the payment beyond its own change, so an item about a
//! modification or a dispute becomes an event without a charge, naming the payment by the
//! reference we sent (`merchantReference`: our payment id for the payment and its disputes, the
//! modification's PSP key for a capture, refund or cancel).

use chrono::{DateTime, Utc};

use super::wire::{
    NotificationItem, PaymentResponse, ResultCode, CAPTURE_DELAY_HOURS, DISPUTE_STATUS,
};
use crate::event::{AuthorizationEnd, ChargeDispute, EventData, EventType, WebhookEvent};
use crate::provider::{
    Charge, ChargeOutcome, ChargeStatus, CreateCharge, Dispute, DisputeStatus, NextAction,
    Operation, OperationKind, OperationStatus,
};

/// Why a `/payments` answer that is not a refusal left the outcome open.
const UNDECIDED: &str =
    "Adyen has not decided the payment yet; its AUTHORISATION notification will";

/// What a `/payments` answer to `req` means.
pub fn payment_outcome(
    req: &CreateCharge,
    answer: &PaymentResponse,
    now: DateTime<Utc>,
) -> ChargeOutcome {
    let Some(psp_reference) = answer.psp_reference.clone() else {
        return ChargeOutcome::Unknown {
            reason: "Adyen answered /payments without a pspReference".to_owned(),
        };
    };
    let authorised_minor = answer
        .amount
        .as_ref()
        .map_or(req.amount_minor, |amount| amount.value);
    let mut charge = Charge {
        id: psp_reference,
        status: ChargeStatus::Failed,
        amount_minor: req.amount_minor,
        currency: req.currency.to_ascii_uppercase(),
        amount_captured: 0,
        amount_refunded: 0,
        reference: answer
            .merchant_reference
            .clone()
            .or_else(|| req.reference.clone()),
        idempotency_key: req.idempotency_key.clone(),
        payment_method: req.payment_method.clone(),
        capture: req.capture,
        failure_code: None,
        next_action: None,
        dispute: None,
        metadata: req.metadata.clone(),
        provider_fees: Vec::new(),
        created: now,
        updated: now,
    };
    let refused = |mut charge: Charge, fallback: &str| {
        charge.failure_code = Some(
            answer
                .refusal_reason
                .clone()
                .unwrap_or_else(|| fallback.to_owned()),
        );
        ChargeOutcome::Declined(charge)
    };
    match answer.result_code {
        // A partial authorisation holds less than asked: read as the amount it holds, which the
        // ledger does not take for the payment's (a person decides).
        Some(ResultCode::Authorised | ResultCode::PartiallyAuthorised) => {
            charge.amount_minor = authorised_minor;
            if req.capture {
                charge.status = ChargeStatus::Succeeded;
                charge.amount_captured = authorised_minor;
                ChargeOutcome::Succeeded(charge)
            } else {
                charge.status = ChargeStatus::RequiresCapture;
                ChargeOutcome::Authorized(charge)
            }
        }
        Some(ResultCode::Refused) => refused(charge, "refused"),
        Some(ResultCode::Error) => refused(charge, "error"),
        Some(ResultCode::Cancelled) => refused(charge, "canceled"),
        Some(
            ResultCode::RedirectShopper
            | ResultCode::IdentifyShopper
            | ResultCode::ChallengeShopper
            | ResultCode::PresentToShopper,
        ) => match answer.action.as_ref().and_then(|action| action.url.clone()) {
            Some(redirect_url) => {
                charge.status = ChargeStatus::RequiresAction;
                charge.next_action = Some(NextAction {
                    kind: "redirect".to_owned(),
                    redirect_url,
                });
                ChargeOutcome::RequiresAction(charge)
            }
            // A native action (3-D Secure 2 in the shopper's browser) has no URL to hand on.
            None => ChargeOutcome::Unknown {
                reason: format!(
                    "Adyen asks for an action without a redirect URL ({:?}); {UNDECIDED}",
                    answer.action.as_ref().map(|action| action.kind.as_str())
                ),
            },
        },
        Some(
            ResultCode::Pending
            | ResultCode::Received
            | ResultCode::AuthenticationFinished
            | ResultCode::AuthenticationNotRequired
            | ResultCode::Success
            | ResultCode::Other,
        )
        | None => ChargeOutcome::Unknown {
            reason: format!("resultCode {:?}: {UNDECIDED}", answer.result_code),
        },
    }
}

/// A modification Adyen has `received` and decides later.
pub fn received(
    kind: OperationKind,
    payment: &str,
    psp_reference: String,
    idempotency_key: &str,
    amount_minor: i64,
    currency: &str,
    now: DateTime<Utc>,
) -> Operation {
    Operation {
        id: psp_reference,
        kind,
        charge: payment.to_owned(),
        idempotency_key: idempotency_key.to_owned(),
        amount_minor,
        currency: currency.to_ascii_uppercase(),
        status: OperationStatus::Pending,
        failure_reason: None,
        created: now,
        updated: now,
    }
}

/// What one verified notification item says, as an event of the port; `None` for an event code
/// the ledger does not use (informational dispute stages, reports, other products), which is
/// acknowledged and ignored.
pub fn item_event(item: &NotificationItem) -> Option<WebhookEvent> {
    let at = event_time(&item.event_date);
    let success = item.succeeded();
    let reason = || {
        item.reason
            .clone()
            .filter(|reason| !reason.is_empty())
            .unwrap_or_else(|| item.event_code.to_ascii_lowercase())
    };
    let (kind, data) = match item.event_code.as_str() {
        "AUTHORISATION" => {
            let charge = authorisation_charge(item, at, reason);
            let kind = match charge.status {
                ChargeStatus::Succeeded => EventType::ChargeSucceeded,
                ChargeStatus::RequiresCapture => EventType::ChargeAuthorized,
                _ => EventType::ChargeFailed,
            };
            (kind, EventData::of_charge(charge, None))
        }
        // A cancel (by the payment's pspReference, or of what our reference made) or an expiry
        // ends what is left of the authorisation; it does not say whether a capture came first
        // (a partial capture's remainder expires too), so it is the authorisation's end, not a
        // failed charge. EXPIRE names the payment by its own pspReference, as Adyen's example.
        code @ ("CANCELLATION" | "TECHNICAL_CANCEL" | "EXPIRE") if success => {
            let charge = match code {
                "EXPIRE" => item
                    .original_reference
                    .clone()
                    .unwrap_or_else(|| item.psp_reference.clone()),
                _ => item.original_reference.clone()?,
            };
            let reason = if code == "EXPIRE" {
                "expired"
            } else {
                "canceled"
            };
            let data = EventData {
                charge: None,
                operation: None,
                dispute: None,
                authorization_end: Some(AuthorizationEnd {
                    charge,
                    reason: reason.to_owned(),
                }),
                reference: Some(item.merchant_reference.clone()),
            };
            (EventType::ChargeFailed, data)
        }
        // A cancel refused (the payment was captured or refused meanwhile): the outcome of the
        // cancel sent under our key, which the item's merchantReference names.
        "CANCELLATION" => {
            let operation = Operation {
                id: item.psp_reference.clone(),
                kind: OperationKind::Cancel,
                charge: item.original_reference.clone()?,
                idempotency_key: item.merchant_reference.clone(),
                amount_minor: item.amount.value,
                currency: item.amount.currency.clone(),
                status: OperationStatus::Failed,
                failure_reason: Some(reason()),
                created: at,
                updated: at,
            };
            let data = EventData {
                charge: None,
                operation: Some(operation),
                dispute: None,
                authorization_end: None,
                reference: Some(item.merchant_reference.clone()),
            };
            (EventType::OperationUpdated, data)
        }
        code
        @ ("CAPTURE" | "CAPTURE_FAILED" | "REFUND" | "REFUND_FAILED" | "REFUNDED_REVERSED") => {
            let kind = if code.starts_with("CAPTURE") {
                OperationKind::Capture
            } else {
                OperationKind::Refund
            };
            // A late failure reverses an operation that succeeded, whatever `success` says of its
            // own delivery, and it may arrive before the success it reverses (Adyen does not
            // order notifications, docs/adyen-wire.md §4): so it is a reversal, never a refusal.
            // One whose `success` is "false" says the failure did not happen: nothing to apply.
            let status = match (code, success) {
                ("CAPTURE" | "REFUND", true) => OperationStatus::Succeeded,
                ("CAPTURE" | "REFUND", false) => OperationStatus::Failed,
                (_, true) => OperationStatus::Reversed,
                (_, false) => return None,
            };
            let operation = Operation {
                id: item.psp_reference.clone(),
                kind,
                charge: item.original_reference.clone()?,
                idempotency_key: item.merchant_reference.clone(),
                amount_minor: item.amount.value,
                currency: item.amount.currency.clone(),
                status,
                failure_reason: matches!(
                    status,
                    OperationStatus::Failed | OperationStatus::Reversed
                )
                .then(reason),
                created: at,
                updated: at,
            };
            let data = EventData {
                charge: None,
                operation: Some(operation),
                dispute: None,
                authorization_end: None,
                reference: Some(item.merchant_reference.clone()),
            };
            (EventType::OperationUpdated, data)
        }
        code @ ("CHARGEBACK"
        | "CHARGEBACK_REVERSED"
        | "SECOND_CHARGEBACK"
        | "PREARBITRATION_WON"
        | "PREARBITRATION_LOST") => {
            let status = dispute_status(
                code,
                item.additional_data.get(DISPUTE_STATUS).map(String::as_str),
            );
            let dispute = Dispute {
                status,
                amount_minor: item.amount.value,
                created: at,
                closed: (status != DisputeStatus::Open).then_some(at),
                id: Some(item.psp_reference.clone()),
                reinstated: matches!(code, "SECOND_CHARGEBACK" | "PREARBITRATION_LOST"),
            };
            let kind = if status == DisputeStatus::Open {
                EventType::ChargeDisputeCreated
            } else {
                EventType::ChargeDisputeClosed
            };
            // The later items of a dispute may carry no `originalReference` (Adyen's examples of
            // CHARGEBACK_REVERSED and SECOND_CHARGEBACK do not): the dispute is named by its
            // pspReference and the payment by our reference, whose charge it is.
            let data = EventData {
                charge: None,
                operation: None,
                dispute: Some(ChargeDispute {
                    charge: item.original_reference.clone(),
                    dispute,
                }),
                authorization_end: None,
                reference: Some(item.merchant_reference.clone()),
            };
            (kind, data)
        }
        _ => return None,
    };
    Some(WebhookEvent {
        id: item.dedup_id(),
        kind,
        created: at.timestamp(),
        data,
    })
}

/// Where a dispute stands after one of its money events (docs/adyen-wire.md §6). A CHARGEBACK withdraws
/// the money; it is final when `disputeStatus` says the merchant lost or gave up, and a won
/// status or a reversal gives it back. A SECOND_CHARGEBACK or a lost pre-arbitration follows a
/// reversal and withdraws the money again, whatever its `disputeStatus` says.
fn dispute_status(code: &str, status: Option<&str>) -> DisputeStatus {
    match (code, status) {
        ("SECOND_CHARGEBACK" | "PREARBITRATION_LOST", _) => DisputeStatus::Lost,
        ("CHARGEBACK_REVERSED" | "PREARBITRATION_WON", _) | (_, Some("Won")) => DisputeStatus::Won,
        (_, Some("Lost" | "Accepted" | "Expired")) => DisputeStatus::Lost,
        _ => DisputeStatus::Open,
    }
}

/// The charge an AUTHORISATION item stands for. The item does not say how the payment captures;
/// the adapter asks for automatic capture with `captureDelayHours`, which Adyen echoes.
fn authorisation_charge(
    item: &NotificationItem,
    at: DateTime<Utc>,
    reason: impl Fn() -> String,
) -> Charge {
    let mut charge = bare_charge(item, item.psp_reference.clone(), at);
    charge.reference = Some(item.merchant_reference.clone());
    let automatic = item
        .additional_data
        .get(CAPTURE_DELAY_HOURS)
        .is_some_and(|hours| hours.trim() == "0");
    charge.capture = automatic;
    if !item.succeeded() {
        charge.status = ChargeStatus::Failed;
        charge.failure_code = Some(reason());
    } else if automatic {
        charge.status = ChargeStatus::Succeeded;
        charge.amount_captured = item.amount.value;
    } else {
        charge.status = ChargeStatus::RequiresCapture;
    }
    charge
}

/// A charge with the item's amount and nothing else known.
fn bare_charge(item: &NotificationItem, id: String, at: DateTime<Utc>) -> Charge {
    Charge {
        id,
        status: ChargeStatus::Failed,
        amount_minor: item.amount.value,
        currency: item.amount.currency.clone(),
        amount_captured: 0,
        amount_refunded: 0,
        reference: None,
        idempotency_key: String::new(),
        payment_method: item.payment_method.clone().unwrap_or_default(),
        capture: false,
        failure_code: None,
        next_action: None,
        dispute: None,
        metadata: Default::default(),
        provider_fees: Vec::new(),
        created: at,
        updated: at,
    }
}

/// `eventDate` (ISO 8601 with an offset); the epoch when unreadable, which only the event's
/// informative time shows.
fn event_time(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .map(|at| at.with_timezone(&Utc))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::adyen::wire::Amount;

    fn item(code: &str, success: bool) -> NotificationItem {
        NotificationItem {
            psp_reference: "MODIFICATION0001".into(),
            original_reference: Some("PAYMENT000000001".into()),
            merchant_account_code: "Acme".into(),
            merchant_reference: "psp_0190000000007000800000000000000a_refund_1".into(),
            amount: Amount {
                currency: "EUR".into(),
                value: 500,
            },
            event_code: code.into(),
            success: if success { "true" } else { "false" }.into(),
            event_date: "2026-12-01T10:00:00+01:00".into(),
            payment_method: Some("visa".into()),
            reason: None,
            additional_data: Default::default(),
        }
    }

    #[test]
    fn modifications_are_operations_and_late_failures_fail_them() {
        for (code, success, expected) in [
            ("REFUND", true, Some(OperationStatus::Succeeded)),
            ("REFUND", false, Some(OperationStatus::Failed)),
            ("REFUND_FAILED", true, Some(OperationStatus::Reversed)),
            ("REFUNDED_REVERSED", true, Some(OperationStatus::Reversed)),
            ("REFUND_FAILED", false, None),
            ("CAPTURE", true, Some(OperationStatus::Succeeded)),
            ("CAPTURE_FAILED", true, Some(OperationStatus::Reversed)),
        ] {
            let event = item_event(&item(code, success));
            let status = event
                .as_ref()
                .and_then(|event| event.data.operation.as_ref())
                .map(|op| op.status);
            assert_eq!(status, expected, "{code} {success}");
            if let Some(event) = event {
                assert_eq!(event.kind, EventType::OperationUpdated);
                assert!(event.data.charge.is_none());
                assert_eq!(
                    event.data.payment_ref(),
                    Some("psp_0190000000007000800000000000000a_refund_1")
                );
                let op = event.data.operation.unwrap();
                assert_eq!(
                    (op.charge.as_str(), op.amount_minor),
                    ("PAYMENT000000001", 500)
                );
                assert_eq!(event.created, 1_796_115_600);
            }
        }
    }

    #[test]
    fn authorisations_say_how_the_payment_captures() {
        let mut authorised = item("AUTHORISATION", true);
        authorised.psp_reference = "PAYMENT000000001".into();
        authorised.original_reference = None;
        authorised.merchant_reference = "pay_x".into();
        let charge = |item: &NotificationItem| item_event(item).unwrap().data.charge.unwrap();
        assert_eq!(charge(&authorised).status, ChargeStatus::RequiresCapture);
        authorised
            .additional_data
            .insert(CAPTURE_DELAY_HOURS.into(), "0".into());
        let captured = charge(&authorised);
        assert_eq!(
            (captured.status, captured.amount_captured),
            (ChargeStatus::Succeeded, 500)
        );
        assert_eq!(captured.reference.as_deref(), Some("pay_x"));
        let mut refused = authorised.clone();
        refused.success = "false".into();
        refused.reason = Some("Refused".into());
        let refused = charge(&refused);
        assert_eq!(refused.status, ChargeStatus::Failed);
        assert_eq!(refused.failure_code.as_deref(), Some("Refused"));
    }

    #[test]
    fn chargebacks_are_disputes_named_by_their_own_reference() {
        let dispute = |code: &str, status: Option<&str>| {
            let mut item = item(code, true);
            item.psp_reference = "DISPUTE000000001".into();
            if let Some(status) = status {
                item.additional_data
                    .insert(DISPUTE_STATUS.into(), status.into());
            }
            item_event(&item).map(|event| event.data.dispute.unwrap())
        };
        let opened = dispute("CHARGEBACK", Some("Undefended")).unwrap();
        assert_eq!(opened.charge.as_deref(), Some("PAYMENT000000001"));
        assert_eq!(opened.dispute.status, DisputeStatus::Open);
        assert_eq!(opened.dispute.id.as_deref(), Some("DISPUTE000000001"));
        for (code, status, expected) in [
            ("CHARGEBACK", Some("Lost"), DisputeStatus::Lost),
            ("CHARGEBACK", Some("Accepted"), DisputeStatus::Lost),
            ("CHARGEBACK", None, DisputeStatus::Open),
            ("CHARGEBACK_REVERSED", Some("Pending"), DisputeStatus::Won),
            ("SECOND_CHARGEBACK", None, DisputeStatus::Lost),
        ] {
            assert_eq!(
                dispute(code, status).unwrap().dispute.status,
                expected,
                "{code}"
            );
        }
        assert!(dispute("NOTIFICATION_OF_CHARGEBACK", None).is_none());
        assert!(dispute("REPORT_AVAILABLE", None).is_none());
        // A second loss follows a reversal, whatever its status says.
        for code in ["SECOND_CHARGEBACK", "PREARBITRATION_LOST"] {
            let again = dispute(code, Some("Won")).unwrap().dispute;
            assert_eq!(
                (again.status, again.reinstated),
                (DisputeStatus::Lost, true)
            );
        }
        assert!(
            !dispute("CHARGEBACK", Some("Lost"))
                .unwrap()
                .dispute
                .reinstated
        );
    }

    /// Adyen's examples of the later items of a dispute carry no `originalReference`: the
    /// dispute is read by its pspReference, and the payment by our reference.
    #[test]
    fn a_dispute_item_without_its_original_reference_names_the_payment_by_our_reference() {
        for code in ["CHARGEBACK_REVERSED", "SECOND_CHARGEBACK"] {
            let mut unreferenced = item(code, true);
            unreferenced.psp_reference = "DISPUTE000000001".into();
            unreferenced.original_reference = None;
            unreferenced.merchant_reference = "pay_01900000000070008000000000000042".into();
            let event = item_event(&unreferenced).expect("read, not dropped");
            assert_eq!(event.kind, EventType::ChargeDisputeClosed);
            assert_eq!(
                event.data.payment_ref(),
                Some("pay_01900000000070008000000000000042")
            );
            let disputed = event.data.dispute.unwrap();
            assert_eq!(disputed.charge, None);
            assert_eq!(disputed.dispute.id.as_deref(), Some("DISPUTE000000001"));
        }
    }

    /// An expiry or a cancel ends what is left of the authorisation; it says nothing of a
    /// capture before it, so it is no failed charge.
    #[test]
    fn expiries_and_cancels_end_the_authorisation() {
        let mut expired = item("EXPIRE", true);
        expired.psp_reference = "PAYMENT000000001".into();
        expired.original_reference = None;
        expired.merchant_reference = "pay_x".into();
        let event = item_event(&expired).unwrap();
        assert!(event.data.charge.is_none());
        assert_eq!(
            event.data.authorization_end,
            Some(AuthorizationEnd {
                charge: "PAYMENT000000001".into(),
                reason: "expired".into()
            })
        );
        assert_eq!(event.data.payment_ref(), Some("pay_x"));
        for code in ["CANCELLATION", "TECHNICAL_CANCEL"] {
            let event = item_event(&item(code, true)).unwrap();
            assert_eq!(
                event
                    .data
                    .authorization_end
                    .map(|end| (end.charge, end.reason)),
                Some(("PAYMENT000000001".to_owned(), "canceled".to_owned()))
            );
        }
        assert!(item_event(&item("TECHNICAL_CANCEL", false)).is_none());
        assert!(item_event(&item("EXPIRE", false)).is_none());
        // A refused cancel is the outcome of the cancel sent under the item's merchantReference.
        let mut refused = item("CANCELLATION", false);
        refused.merchant_reference = "psp_x_cancel_1".into();
        let operation = item_event(&refused).unwrap().data.operation.unwrap();
        assert_eq!(
            (
                operation.kind,
                operation.status,
                operation.idempotency_key.as_str(),
                operation.charge.as_str()
            ),
            (
                OperationKind::Cancel,
                OperationStatus::Failed,
                "psp_x_cancel_1",
                "PAYMENT000000001"
            )
        );
    }
}
