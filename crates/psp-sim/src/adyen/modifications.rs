//! Captures, refunds and cancels, all asynchronous as Adyen's are: each answers 201 `received`
//! with its own pspReference (`PaymentCaptureResponse`, `PaymentRefundResponse`,
//! `PaymentCancelResponse`, `StandalonePaymentCancelResponse`), and its outcome comes only by
//! notification, `modification_delay_ms` later.
//!
//! A capture or refund the charge model takes becomes one of its pending operations, decided
//! on its timer (CAPTURE / REFUND, success `"true"`, or `"false"` when the payment no longer
//! allows it); one it refuses at once (a capture above what is authorised or of a payment
//! captured already, a refund above what is captured) is told by a CAPTURE / REFUND with
//! success `"false"` and its reason, and changes nothing. A cancel is decided when its time
//! comes: CANCELLATION (or TECHNICAL_CANCEL for a cancel by reference), success `"false"` when
//! the payment was captured or refused meanwhile.
//!
//! A payment pspReference this merchant account does not have is a 422 `167`.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use chrono::Utc;
use serde_json::{Map, Value};

use super::book::{Aftermath, ModificationKind, ModificationRecord, PaymentRecord};
use super::later::Later;
use super::payments::amount_of;
use super::{check_fields, decoded, merchant_account, reply, text, write_call, AdyenError};
use crate::state::{
    CaptureRequest, LaterAction, RefundRequest, Reply, SimError, SimState, CHARGES_MAX,
};
use crate::Simulator;
use asiento_psp::adyen::wire::{Amount, ModificationResponse, STATUS_RECEIVED};
use asiento_psp::provider::{ChargeStatus, OperationAnswer};

/// The properties of Checkout v71's modification requests.
const CAPTURE_FIELDS: &[&str] = &[
    "amount",
    "applicationInfo",
    "enhancedSchemeData",
    "lineItems",
    "merchantAccount",
    "platformChargebackLogic",
    "reference",
    "splits",
    "subMerchants",
];
const REFUND_FIELDS: &[&str] = &[
    "amount",
    "applicationInfo",
    "capturePspReference",
    "enhancedSchemeData",
    "lineItems",
    "merchantAccount",
    "merchantRefundReason",
    "reference",
    "splits",
    "store",
];
const CANCEL_FIELDS: &[&str] = &[
    "applicationInfo",
    "enhancedSchemeData",
    "merchantAccount",
    "reference",
];
const STANDALONE_CANCEL_FIELDS: &[&str] = &[
    "applicationInfo",
    "enhancedSchemeData",
    "merchantAccount",
    "paymentReference",
    "reference",
];
/// `PaymentRefundRequest.merchantRefundReason`.
const REFUND_REASONS: &[&str] = &["FRAUD", "CUSTOMER REQUEST", "RETURN", "DUPLICATE", "OTHER"];

/// Modifications kept at most (the simulator keeps everything in memory).
pub const MODIFICATIONS_MAX: usize = 4 * CHARGES_MAX;

/// A modification request as read.
pub(super) struct Asked {
    merchant_account: String,
    amount: Option<Amount>,
    reference: Option<String>,
    payment_reference: Option<String>,
    refund_reason: Option<String>,
}

fn reference_of(object: &Map<String, Value>) -> Result<Option<String>, AdyenError> {
    let reference = text(object, "reference")?;
    if reference
        .as_ref()
        .is_some_and(|r| r.chars().count() > super::payments::REFERENCE_LEN_MAX)
    {
        return Err(AdyenError::invalid(
            "reference",
            &format!("at most {} characters", super::payments::REFERENCE_LEN_MAX),
        ));
    }
    Ok(reference)
}

fn read_with_amount(
    object: Map<String, Value>,
    fields: &[&str],
    schema: &str,
) -> Result<Asked, AdyenError> {
    check_fields(&object, fields, schema)?;
    let merchant_account = merchant_account(&object)?;
    let amount =
        amount_of(&object)?.ok_or_else(|| AdyenError::validation("100", "No amount specified"))?;
    let refund_reason = text(&object, "merchantRefundReason")?;
    if let Some(reason) = &refund_reason {
        if !REFUND_REASONS.contains(&reason.as_str()) {
            return Err(AdyenError::invalid(
                "merchantRefundReason",
                &format!("one of {}", REFUND_REASONS.join(", ")),
            ));
        }
    }
    Ok(Asked {
        merchant_account,
        amount: Some(amount),
        reference: reference_of(&object)?,
        payment_reference: None,
        refund_reason,
    })
}

fn read_cancel(object: Map<String, Value>) -> Result<Asked, AdyenError> {
    check_fields(&object, CANCEL_FIELDS, "PaymentCancelRequest")?;
    Ok(Asked {
        merchant_account: merchant_account(&object)?,
        amount: None,
        reference: reference_of(&object)?,
        payment_reference: None,
        refund_reason: None,
    })
}

fn read_standalone_cancel(object: Map<String, Value>) -> Result<Asked, AdyenError> {
    check_fields(
        &object,
        STANDALONE_CANCEL_FIELDS,
        "StandalonePaymentCancelRequest",
    )?;
    let merchant_account = merchant_account(&object)?;
    let payment_reference = text(&object, "paymentReference")?
        .filter(|reference| !reference.trim().is_empty())
        .ok_or_else(|| AdyenError::missing("paymentReference"))?;
    Ok(Asked {
        merchant_account,
        amount: None,
        reference: reference_of(&object)?,
        payment_reference: Some(payment_reference),
        refund_reason: None,
    })
}

/// The payment a modification names, if this merchant account has it.
fn payment_of(
    state: &SimState,
    psp_reference: &str,
    merchant_account: &str,
) -> Result<PaymentRecord, AdyenError> {
    state
        .adyen
        .payment(psp_reference)
        .filter(|payment| payment.merchant_account == merchant_account)
        .cloned()
        .ok_or_else(AdyenError::original_reference_required)
}

/// Why the charge model refused a modification, as the notification's `reason` says it.
pub(super) fn refusal_reason(error: &SimError) -> String {
    match error {
        SimError::ChargeNotCapturable(ChargeStatus::Succeeded)
        | SimError::ChargeNotCancelable(ChargeStatus::Succeeded) => "Transaction already captured",
        SimError::ChargeNotCapturable(_) | SimError::ChargeNotCancelable(_) => {
            "Transaction is not authorised"
        }
        SimError::CaptureExceedsAuthorized => "Requested amount exceeds the authorised amount",
        SimError::CapturePending => "A capture of this payment is still pending",
        SimError::ChargeNotRefundable => "Transaction hasn't been captured",
        SimError::RefundExceedsCaptured => "Insufficient balance on payment",
        SimError::ChargeDisputed => "Transaction is disputed",
        other => return other.to_string(),
    }
    .to_owned()
}

fn received(record: &ModificationRecord, refund_reason: Option<String>) -> ModificationResponse {
    ModificationResponse {
        merchant_account: record.merchant_account.clone(),
        psp_reference: record.psp_reference.clone(),
        status: STATUS_RECEIVED.to_owned(),
        payment_psp_reference: match record.kind {
            ModificationKind::TechnicalCancel => None,
            _ => record.payment.clone(),
        },
        payment_reference: record.payment_reference.clone(),
        amount: record.amount.clone(),
        reference: record.reference.clone(),
        merchant_refund_reason: refund_reason,
    }
}

fn check_capacity(state: &SimState) -> Result<(), AdyenError> {
    if state.adyen.modifications_len() >= MODIFICATIONS_MAX {
        return Err(SimError::CapacityExhausted.into());
    }
    Ok(())
}

/// A capture or refund: the charge model's pending operation, or a refusal told later.
fn capture_or_refund(
    state: &mut SimState,
    key: &str,
    kind: ModificationKind,
    payment_psp: &str,
    asked: Asked,
) -> Result<Reply, AdyenError> {
    check_capacity(state)?;
    let payment = payment_of(state, payment_psp, &asked.merchant_account)?;
    let amount = asked
        .amount
        .clone()
        .ok_or_else(|| AdyenError::validation("100", "No amount specified"))?;
    if amount.currency != payment.amount.currency {
        return Err(AdyenError::validation(
            "138",
            "Unsupported currency specified",
        ));
    }
    let psp_reference = state.adyen.new_psp_reference();
    let now = Utc::now();
    let made = match kind {
        ModificationKind::Capture => state.capture(
            key,
            payment_psp,
            &CaptureRequest {
                amount_minor: Some(amount.value),
            },
            now,
        ),
        _ => state.refund(
            key,
            &RefundRequest {
                charge: payment_psp.to_owned(),
                amount_minor: amount.value,
            },
            now,
        ),
    };
    let mut record = ModificationRecord {
        psp_reference: psp_reference.clone(),
        kind,
        payment: Some(payment_psp.to_owned()),
        merchant_account: asked.merchant_account,
        reference: asked.reference,
        payment_reference: None,
        amount: Some(amount),
        operation_id: None,
        refusal: None,
    };
    match made {
        Ok(made) => {
            let answer: OperationAnswer = decoded(&made);
            let fails_later = matches!(
                (kind, payment.aftermath),
                (ModificationKind::Capture, Aftermath::CaptureFails)
                    | (ModificationKind::Refund, Aftermath::RefundFails)
            );
            if fails_later {
                state.set_reverses(&answer.operation.id, true);
            }
            record.operation_id = Some(answer.operation.id);
        }
        Err(SimError::ChargeNotFound) => return Err(AdyenError::original_reference_required()),
        Err(error) if error.status().is_server_error() => return Err(error.into()),
        Err(error) => {
            record.refusal = Some(refusal_reason(&error));
            let delay = state.modification_delay_ms();
            state.schedule(delay, &psp_reference, LaterAction::Adyen(Later::Refuse));
        }
    }
    let answer = received(&record, asked.refund_reason);
    state.adyen.insert_modification(record);
    Ok(reply(StatusCode::CREATED, &answer))
}

/// A cancel, of a payment (`payment`) or by our reference: decided when its time comes.
fn schedule_cancel(
    state: &mut SimState,
    kind: ModificationKind,
    payment: Option<String>,
    asked: Asked,
) -> Result<Reply, AdyenError> {
    check_capacity(state)?;
    let psp_reference = state.adyen.new_psp_reference();
    let record = ModificationRecord {
        psp_reference: psp_reference.clone(),
        kind,
        payment,
        merchant_account: asked.merchant_account,
        reference: asked.reference,
        payment_reference: asked.payment_reference,
        amount: None,
        operation_id: None,
        refusal: None,
    };
    let answer = received(&record, None);
    state.adyen.insert_modification(record);
    let delay = state.modification_delay_ms();
    state.schedule(delay, &psp_reference, LaterAction::Adyen(Later::Cancel));
    Ok(reply(StatusCode::CREATED, &answer))
}

pub(super) async fn capture(
    State(sim): State<Simulator>,
    Path(psp_reference): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let read = |object| read_with_amount(object, CAPTURE_FIELDS, "PaymentCaptureRequest");
    write_call(&sim, &headers, &body, read, |state, key, asked| {
        capture_or_refund(state, key, ModificationKind::Capture, &psp_reference, asked)
    })
    .await
}

pub(super) async fn refund(
    State(sim): State<Simulator>,
    Path(psp_reference): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let read = |object| read_with_amount(object, REFUND_FIELDS, "PaymentRefundRequest");
    write_call(&sim, &headers, &body, read, |state, key, asked| {
        capture_or_refund(state, key, ModificationKind::Refund, &psp_reference, asked)
    })
    .await
}

pub(super) async fn cancel(
    State(sim): State<Simulator>,
    Path(psp_reference): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    write_call(&sim, &headers, &body, read_cancel, |state, _key, asked| {
        payment_of(state, &psp_reference, &asked.merchant_account)?;
        schedule_cancel(
            state,
            ModificationKind::Cancel,
            Some(psp_reference.clone()),
            asked,
        )
    })
    .await
}

/// `POST /cancels`: the latest payment of the merchant account made under `paymentReference`
/// is cancelled; when there is none, the TECHNICAL_CANCEL says so (success `"false"`).
pub(super) async fn cancel_by_reference(
    State(sim): State<Simulator>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    write_call(
        &sim,
        &headers,
        &body,
        read_standalone_cancel,
        |state, _key, asked| {
            let payment = asked.payment_reference.as_deref().and_then(|reference| {
                state
                    .adyen
                    .payment_by_reference(&asked.merchant_account, reference)
                    .map(str::to_owned)
            });
            schedule_cancel(state, ModificationKind::TechnicalCancel, payment, asked)
        },
    )
    .await
}
