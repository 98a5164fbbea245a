//! Stripe's objects in the port's terms: a PaymentIntent is our charge (its id is the charge id
//! the ledger records), a Refund is a refund operation, and a capture or cancel, which Stripe
//! answers with the PaymentIntent itself, is an operation named after it.
//!
//! Our own ids travel in metadata: `asiento_payment_id` (the payment, our reference),
//! `asiento_psp_key` (the key the PaymentIntent or refund was created with), and
//! `asiento_capture_key` (the key of the last capture asked), so that an object read back by id
//! can be checked against the payment it is for.

use chrono::{DateTime, Utc};

use super::wire::{self, BalanceTransaction, IntentStatus, PaymentIntent, Refund, RefundStatus};
use crate::provider::{
    Charge, ChargeStatus, Dispute, DisputeStatus, NextAction, Operation, OperationKind,
    OperationStatus, ProviderError, ProviderFee,
};

pub const METADATA_PAYMENT_ID: &str = "asiento_payment_id";
pub const METADATA_PSP_KEY: &str = "asiento_psp_key";
pub const METADATA_CAPTURE_KEY: &str = "asiento_capture_key";

/// The suffix of a capture's operation id: `pi_…/capture`.
const CAPTURE_SUFFIX: &str = "/capture";
/// The suffix of a cancel's operation id: `pi_…/cancel`.
const CANCEL_SUFFIX: &str = "/cancel";

pub(crate) fn time(unix: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(unix, 0).unwrap_or(DateTime::UNIX_EPOCH)
}

/// What an operation id names at Stripe.
#[derive(Debug, PartialEq, Eq)]
pub enum OperationRef<'a> {
    Refund(&'a str),
    Capture(&'a str),
    Cancel(&'a str),
}

impl<'a> OperationRef<'a> {
    pub fn parse(id: &'a str) -> Option<OperationRef<'a>> {
        if let Some(intent) = id.strip_suffix(CAPTURE_SUFFIX) {
            Some(OperationRef::Capture(intent))
        } else if let Some(intent) = id.strip_suffix(CANCEL_SUFFIX) {
            Some(OperationRef::Cancel(intent))
        } else if id.starts_with("re_") {
            Some(OperationRef::Refund(id))
        } else {
            None
        }
    }
}

/// The charge a PaymentIntent stands for, or why it stands for no outcome yet (created and not
/// confirmed, or processing): asked again later, never read as "none".
pub fn charge_of(intent: &PaymentIntent) -> Result<Charge, ProviderError> {
    let status = match intent.status {
        IntentStatus::Succeeded => ChargeStatus::Succeeded,
        IntentStatus::RequiresCapture => ChargeStatus::RequiresCapture,
        IntentStatus::RequiresAction => ChargeStatus::RequiresAction,
        IntentStatus::Canceled => ChargeStatus::Failed,
        IntentStatus::RequiresPaymentMethod if intent.last_payment_error.is_some() => {
            ChargeStatus::Failed
        }
        other => {
            return Err(ProviderError::Unknown {
                reason: format!("PaymentIntent {} is {other:?}: no outcome yet", intent.id),
            })
        }
    };
    let failure_code = match (status, &intent.last_payment_error) {
        (ChargeStatus::Failed, _) if intent.status == IntentStatus::Canceled => {
            Some("canceled".to_owned())
        }
        (ChargeStatus::Failed, Some(error)) => error
            .decline_code
            .clone()
            .or_else(|| error.code.clone())
            .or_else(|| Some("declined".to_owned())),
        _ => None,
    };
    let next_action = intent
        .next_action
        .as_ref()
        .filter(|_| status == ChargeStatus::RequiresAction)
        .map(|action| NextAction {
            kind: "redirect".to_owned(),
            redirect_url: action
                .redirect_to_url
                .as_ref()
                .and_then(|redirect| redirect.url.clone())
                .unwrap_or_default(),
        });
    let latest = intent
        .latest_charge
        .as_ref()
        .and_then(|charge| charge.object());
    Ok(Charge {
        id: intent.id.clone(),
        status,
        amount_minor: intent.amount,
        currency: intent.currency.to_ascii_uppercase(),
        amount_captured: intent.amount_received,
        amount_refunded: latest.map_or(0, |charge| charge.amount_refunded),
        reference: intent.metadata.get(METADATA_PAYMENT_ID).cloned(),
        idempotency_key: intent
            .metadata
            .get(METADATA_PSP_KEY)
            .cloned()
            .unwrap_or_default(),
        payment_method: intent
            .payment_method
            .as_ref()
            .map(|method| method.id().to_owned())
            .unwrap_or_default(),
        capture: intent.capture_method != super::wire::CaptureMethod::Manual,
        failure_code,
        next_action,
        dispute: None,
        metadata: intent.metadata.clone(),
        provider_fees: latest
            .and_then(|charge| charge.balance_transaction.as_ref())
            .and_then(|txn| txn.object())
            .and_then(provider_fee)
            .into_iter()
            .collect(),
        created: time(intent.created),
        updated: time(intent.created),
    })
}

/// The fee Stripe kept on a balance transaction (read only when the transaction is expanded:
/// its id alone says nothing of the fee); `None` for a transaction without one.
pub fn provider_fee(txn: &BalanceTransaction) -> Option<ProviderFee> {
    (txn.fee != 0).then(|| ProviderFee {
        transaction_id: txn.id.clone(),
        fee_minor: txn.fee,
    })
}

/// The fees of a dispute's balance transactions (the withdrawal's dispute fee, and any fee a
/// reinstatement gives back).
pub fn dispute_fees(dispute: &wire::Dispute) -> impl Iterator<Item = ProviderFee> + '_ {
    dispute.balance_transactions.iter().filter_map(provider_fee)
}

/// A Stripe dispute in the port's terms: open while Stripe waits for evidence or reviews it,
/// won when the money stays with us (`won`, an inquiry's `warning_closed`, `prevented`), lost
/// when it is gone. Its creation time names it, so every read of one dispute says the same.
pub fn dispute_of(dispute: &wire::Dispute) -> Dispute {
    let status = match dispute.status.as_str() {
        "won" | "warning_closed" | "prevented" => DisputeStatus::Won,
        "lost" => DisputeStatus::Lost,
        _ => DisputeStatus::Open,
    };
    Dispute {
        status,
        amount_minor: dispute.amount,
        created: time(dispute.created),
        closed: None,
        // Named by charge and creation time, as every dispute posted from Stripe has been.
        id: None,
        reinstated: false,
    }
}

/// Whether the PaymentIntent's charge (expanded) is disputed.
pub fn disputed(intent: &PaymentIntent) -> bool {
    intent
        .latest_charge
        .as_ref()
        .and_then(|charge| charge.object())
        .is_some_and(|charge| charge.disputed)
}

/// A refund as a refund operation; `key` is the one it was asked with when known from the
/// answer, else what its metadata says.
pub fn refund_operation(refund: &Refund, key: Option<&str>) -> Operation {
    let (status, failure_reason) = match refund.status {
        RefundStatus::Pending | RefundStatus::RequiresAction => (OperationStatus::Pending, None),
        RefundStatus::Succeeded => (OperationStatus::Succeeded, None),
        RefundStatus::Failed | RefundStatus::Canceled | RefundStatus::Other => (
            OperationStatus::Failed,
            refund
                .failure_reason
                .clone()
                .or_else(|| Some(format!("{:?}", refund.status).to_ascii_lowercase())),
        ),
    };
    Operation {
        id: refund.id.clone(),
        kind: OperationKind::Refund,
        charge: refund
            .payment_intent
            .as_ref()
            .map(|intent| intent.id().to_owned())
            .unwrap_or_default(),
        idempotency_key: key
            .map(str::to_owned)
            .or_else(|| refund.metadata.get(METADATA_PSP_KEY).cloned())
            .unwrap_or_default(),
        amount_minor: refund.amount,
        currency: refund.currency.to_ascii_uppercase(),
        status,
        failure_reason,
        created: time(refund.created),
        updated: time(refund.created),
    }
}

/// A capture as Stripe answers it: the PaymentIntent after it. `processing` is pending, for the
/// amount asked (`asked`, when the answer is to our request) or else what is capturable.
pub fn capture_operation(
    intent: &PaymentIntent,
    key: Option<&str>,
    asked: Option<i64>,
) -> Operation {
    let status = match intent.status {
        IntentStatus::Succeeded => OperationStatus::Succeeded,
        IntentStatus::Processing | IntentStatus::RequiresCapture => OperationStatus::Pending,
        _ => OperationStatus::Failed,
    };
    let amount_minor = match status {
        OperationStatus::Succeeded => intent.amount_received,
        _ => asked.unwrap_or(if intent.amount_capturable > 0 {
            intent.amount_capturable
        } else {
            intent.amount
        }),
    };
    Operation {
        id: format!("{}{CAPTURE_SUFFIX}", intent.id),
        kind: OperationKind::Capture,
        charge: intent.id.clone(),
        idempotency_key: key
            .map(str::to_owned)
            .or_else(|| intent.metadata.get(METADATA_CAPTURE_KEY).cloned())
            .unwrap_or_default(),
        amount_minor,
        currency: intent.currency.to_ascii_uppercase(),
        failure_reason: (status == OperationStatus::Failed)
            .then(|| format!("payment_intent_{:?}", intent.status).to_ascii_lowercase()),
        status,
        created: time(intent.created),
        updated: time(intent.created),
    }
}

/// A cancel as Stripe answers it: the PaymentIntent after it.
pub fn cancel_operation(intent: &PaymentIntent, key: &str) -> Operation {
    let status = match intent.status {
        IntentStatus::Canceled => OperationStatus::Succeeded,
        _ => OperationStatus::Failed,
    };
    Operation {
        id: format!("{}{CANCEL_SUFFIX}", intent.id),
        kind: OperationKind::Cancel,
        charge: intent.id.clone(),
        idempotency_key: key.to_owned(),
        amount_minor: intent.amount - intent.amount_received,
        currency: intent.currency.to_ascii_uppercase(),
        failure_reason: (status == OperationStatus::Failed).then(|| "not_canceled".to_owned()),
        status,
        created: time(intent.created),
        updated: time(intent.created),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disputes_are_open_until_won_or_lost() {
        let dispute = |status: &str| wire::Dispute {
            id: "dp_1".into(),
            amount: 500,
            currency: "usd".into(),
            charge: wire::Expandable::Id("ch_1".into()),
            payment_intent: None,
            status: status.into(),
            balance_transactions: Vec::new(),
            created: 1_700_000_000,
        };
        for (status, expected) in [
            ("warning_needs_response", DisputeStatus::Open),
            ("needs_response", DisputeStatus::Open),
            ("under_review", DisputeStatus::Open),
            ("won", DisputeStatus::Won),
            ("warning_closed", DisputeStatus::Won),
            ("prevented", DisputeStatus::Won),
            ("lost", DisputeStatus::Lost),
        ] {
            let read = dispute_of(&dispute(status));
            assert_eq!(
                (read.status, read.amount_minor),
                (expected, 500),
                "{status}"
            );
            assert_eq!(read.created.timestamp(), 1_700_000_000);
        }
    }

    #[test]
    fn operation_ids_name_what_they_are_at_stripe() {
        assert_eq!(
            OperationRef::parse("re_1"),
            Some(OperationRef::Refund("re_1"))
        );
        assert_eq!(
            OperationRef::parse("pi_1/capture"),
            Some(OperationRef::Capture("pi_1"))
        );
        assert_eq!(
            OperationRef::parse("pi_1/cancel"),
            Some(OperationRef::Cancel("pi_1"))
        );
        assert_eq!(OperationRef::parse("cap_1"), None);
    }
}
