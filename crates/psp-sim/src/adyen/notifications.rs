//! The Adyen dialect's notifications: each change of the charge model told as the standard
//! notification items an Adyen account sends for it, each signed on its own
//! (`additionalData.hmacSignature`, `asiento_psp::adyen::hmac::sign_item`), and the batch
//! (`NotificationRequest`) the dispatcher wraps the items ready at one moment in. Every value is
//! a string, as Adyen's are (`success`, `live`); `eventDate` is ISO 8601 with an offset.
//!
//! | change | items |
//! |---|---|
//! | authorised (automatic capture included: no CAPTURE follows) | AUTHORISATION `true` |
//! | refused, or a redirect that failed | AUTHORISATION `false`, `reason` |
//! | a capture / refund decided | CAPTURE / REFUND, `true`, or `false` with `reason` |
//! | a succeeded capture / refund that fails later | CAPTURE_FAILED / REFUND_FAILED |
//! | a cancel decided (by the dialect's timer) | CANCELLATION / TECHNICAL_CANCEL |
//! | a refund outside the API | REFUND `true` under a pspReference of its own |
//! | a dispute opened | NOTIFICATION_OF_CHARGEBACK (`Unresponded`; no money moves) |
//! | a dispute lost | CHARGEBACK (`Lost`: the money is withdrawn) |
//! | a dispute won | CHARGEBACK (`Pending`), then CHARGEBACK_REVERSED (`Won`: it comes back) |
//! | a won dispute lost after all | SECOND_CHARGEBACK (`Lost`) |
//!
//! A modification's item carries its own pspReference, the payment's as `originalReference`,
//! and the modification request's `reference` as `merchantReference` (the payment's when the
//! request had none); a dispute's carry the dispute's pspReference and the payment's reference
//! (and the payment's pspReference as `originalReference`, except on CHARGEBACK_REVERSED and
//! SECOND_CHARGEBACK when the run asks for Adyen's examples' shape). AUTHORISATION items have no
//! `originalReference`.

use std::collections::BTreeMap;

use axum::body::Bytes;
use chrono::{DateTime, Duration, SecondsFormat, Utc};

use super::book::{Aftermath, ModificationKind, ModificationRecord, PaymentRecord};
use super::later::Later;
use super::payments::REFUSED;
use super::{BATCH_BYTES_MAX, BATCH_ITEMS_MAX};
use crate::state::{LaterAction, Outgoing, SimState, CAPTURE_REVERSAL_REASON, REVERSAL_REASON};
use asiento_psp::adyen::hmac::sign_item;
use asiento_psp::adyen::wire::{
    Amount, NotificationItem, CAPTURE_DELAY_HOURS, DISPUTE_STATUS, HMAC_SIGNATURE,
};
use asiento_psp::event::{EventType, WebhookEvent};
use asiento_psp::provider::{Charge, DisputeStatus, OperationKind, OperationStatus};

/// What a batch adds around its items: `{"live":"false","notificationItems":[` and `]}`.
const BATCH_ENVELOPE_BYTES: usize = 39;
/// What a batch adds around each item: `{"NotificationRequestItem":`, `}` and a comma.
const BATCH_ITEM_WRAPPER_BYTES: usize = 29;

/// The payment method every card payment of the dialect is.
pub const PAYMENT_METHOD: &str = "visa";
/// A dispute's defence period, as its NOTIFICATION_OF_CHARGEBACK says it.
pub const DEFENCE_PERIOD_DAYS: i64 = 14;

/// Adyen's ISO 8601 with an offset: `2021-01-01T01:00:00+00:00`.
fn event_date(date: DateTime<Utc>) -> String {
    date.fixed_offset()
        .to_rfc3339_opts(SecondsFormat::Secs, false)
}

/// One item before it is signed.
struct Item {
    event_code: &'static str,
    psp_reference: String,
    original_reference: Option<String>,
    merchant_account: String,
    merchant_reference: String,
    amount: Amount,
    success: bool,
    reason: Option<String>,
    additional_data: BTreeMap<String, String>,
    date: DateTime<Utc>,
}

/// The item signed with the dialect's key and encoded once, so that every copy of it is the
/// same bytes.
fn encode(state: &SimState, item: Item) -> Outgoing {
    let mut encoded = NotificationItem {
        psp_reference: item.psp_reference,
        original_reference: item.original_reference,
        merchant_account_code: item.merchant_account,
        merchant_reference: item.merchant_reference,
        amount: item.amount,
        event_code: item.event_code.to_owned(),
        success: item.success.to_string(),
        event_date: event_date(item.date),
        payment_method: Some(PAYMENT_METHOD.to_owned()),
        reason: item.reason,
        additional_data: item.additional_data,
    };
    if let Some(key) = state.adyen.hmac_key() {
        let signature = sign_item(key, &encoded);
        encoded
            .additional_data
            .insert(HMAC_SIGNATURE.to_owned(), signature);
    }
    Outgoing {
        event_id: encoded.dedup_id(),
        body: Bytes::from(
            serde_json::to_vec(&encoded).expect("a notification item always serializes"),
        ),
    }
}

/// REPORT_AVAILABLE: the report's file name as `pspReference`, its download URL as `reason`.
pub(super) fn report_available(
    state: &SimState,
    merchant_account: &str,
    file: &str,
    url: String,
    date: DateTime<Utc>,
) -> Outgoing {
    encode(
        state,
        Item {
            event_code: "REPORT_AVAILABLE",
            psp_reference: file.to_owned(),
            original_reference: None,
            merchant_account: merchant_account.to_owned(),
            merchant_reference: String::new(),
            amount: Amount {
                currency: "EUR".to_owned(),
                value: 0,
            },
            success: true,
            reason: Some(url),
            additional_data: BTreeMap::new(),
            date,
        },
    )
}

/// `{"live":"false","notificationItems":[{"NotificationRequestItem":…},…]}` around items
/// encoded by [`notifications`], byte for byte as they were encoded. The batch is not signed:
/// only its items are.
pub(crate) fn batch(items: &[&[u8]]) -> Bytes {
    let mut body = br#"{"live":"false","notificationItems":["#.to_vec();
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        body.extend_from_slice(br#"{"NotificationRequestItem":"#);
        body.extend_from_slice(item);
        body.push(b'}');
    }
    body.extend_from_slice(b"]}");
    Bytes::from(body)
}

/// The batches `items` leave in, in order: at most [`BATCH_ITEMS_MAX`] items and
/// [`BATCH_BYTES_MAX`] bytes each (an item larger than that alone leaves alone), so that a
/// receiver with a body limit (asiento's is 64 KiB) takes every batch the dialect sends.
pub(crate) fn batches(items: &[Outgoing]) -> Vec<Outgoing> {
    let mut batches = Vec::new();
    let mut start = 0;
    while start < items.len() {
        let mut end = start;
        let mut bytes = BATCH_ENVELOPE_BYTES;
        while end < items.len() && end - start < BATCH_ITEMS_MAX {
            let next = items[end].body.len() + BATCH_ITEM_WRAPPER_BYTES;
            if end > start && bytes + next > BATCH_BYTES_MAX {
                break;
            }
            bytes += next;
            end += 1;
        }
        let chunk = &items[start..end];
        let bodies: Vec<&[u8]> = chunk.iter().map(|item| item.body.as_ref()).collect();
        let ids: Vec<&str> = chunk.iter().map(|item| item.event_id.as_str()).collect();
        batches.push(Outgoing {
            event_id: ids.join(","),
            body: batch(&bodies),
        });
        start = end;
    }
    batches
}

fn authorisation(
    state: &SimState,
    payment: &PaymentRecord,
    success: bool,
    reason: Option<String>,
    date: DateTime<Utc>,
) -> Outgoing {
    let mut additional_data = BTreeMap::new();
    if let Some(hours) = payment.capture_delay_hours {
        additional_data.insert(CAPTURE_DELAY_HOURS.to_owned(), hours.to_string());
    }
    encode(
        state,
        Item {
            event_code: "AUTHORISATION",
            psp_reference: payment.psp_reference.clone(),
            original_reference: None,
            merchant_account: payment.merchant_account.clone(),
            merchant_reference: payment.reference.clone(),
            amount: payment.amount.clone(),
            success,
            reason,
            additional_data,
            date,
        },
    )
}

/// A modification's outcome (`success` of CAPTURE, REFUND, CANCELLATION, TECHNICAL_CANCEL).
pub(super) fn modification_item(
    state: &SimState,
    record: &ModificationRecord,
    success: bool,
    reason: Option<String>,
    date: DateTime<Utc>,
) -> Outgoing {
    modification_event(
        state,
        record,
        record.kind.event_code(),
        success,
        reason,
        date,
    )
}

fn modification_event(
    state: &SimState,
    record: &ModificationRecord,
    event_code: &'static str,
    success: bool,
    reason: Option<String>,
    date: DateTime<Utc>,
) -> Outgoing {
    let payment = record
        .payment
        .as_deref()
        .and_then(|psp| state.adyen.payment(psp));
    let merchant_reference = record
        .reference
        .clone()
        .or_else(|| payment.map(|payment| payment.reference.clone()))
        .or_else(|| record.payment_reference.clone())
        .unwrap_or_default();
    let amount = record
        .amount
        .clone()
        .or_else(|| payment.map(|payment| payment.amount.clone()))
        // A cancel by a reference no payment has: Adyen knows no amount either.
        .unwrap_or(Amount {
            currency: "EUR".to_owned(),
            value: 0,
        });
    encode(
        state,
        Item {
            event_code,
            psp_reference: record.psp_reference.clone(),
            original_reference: record.payment.clone(),
            merchant_account: record.merchant_account.clone(),
            merchant_reference,
            amount,
            success,
            reason,
            additional_data: BTreeMap::new(),
            date,
        },
    )
}

/// A dispute's item, with its status and reason code. Its CHARGEBACK_REVERSED and
/// SECOND_CHARGEBACK leave `originalReference` out when the run asks for Adyen's examples'
/// shape (`dispute_items_as_adyen_examples`).
fn dispute_item(
    state: &mut SimState,
    payment: &PaymentRecord,
    charge: &Charge,
    event_code: &'static str,
    status: &str,
    date: DateTime<Utc>,
) -> Outgoing {
    let psp_reference = state.adyen.dispute_of(&charge.id).psp_reference.clone();
    let mut additional_data = BTreeMap::from([
        (DISPUTE_STATUS.to_owned(), status.to_owned()),
        (
            "chargebackReasonCode".to_owned(),
            payment.chargeback_reason_code.clone(),
        ),
    ]);
    if event_code == "NOTIFICATION_OF_CHARGEBACK" {
        additional_data.insert("defendable".to_owned(), "true".to_owned());
        additional_data.insert(
            "defensePeriodEndsAt".to_owned(),
            event_date(date + Duration::days(DEFENCE_PERIOD_DAYS)),
        );
    }
    let amount = charge
        .dispute
        .as_ref()
        .map_or(payment.amount.value, |dispute| dispute.amount_minor);
    let unreferenced = state.faults.dispute_items_as_adyen_examples
        && matches!(event_code, "CHARGEBACK_REVERSED" | "SECOND_CHARGEBACK");
    encode(
        state,
        Item {
            event_code,
            psp_reference,
            original_reference: (!unreferenced).then(|| payment.psp_reference.clone()),
            merchant_account: payment.merchant_account.clone(),
            merchant_reference: payment.reference.clone(),
            amount: Amount {
                currency: payment.amount.currency.clone(),
                value: amount,
            },
            success: true,
            reason: None,
            additional_data,
            date,
        },
    )
}

/// Opens the dispute a `Chargeback…` trigger asked for, once the payment is captured.
fn dispute_after_capture(state: &mut SimState, payment: &PaymentRecord) {
    if matches!(payment.aftermath, Aftermath::Dispute(_)) {
        let delay = state.modification_delay_ms();
        state.schedule(
            delay,
            &payment.psp_reference,
            LaterAction::Adyen(Later::OpenDispute),
        );
    }
}

/// The items one change of the charge model stands for. Run for every change, webhooks or
/// not: the test triggers that follow a capture are started here.
pub(crate) fn notifications(event: &WebhookEvent, state: &mut SimState) -> Vec<Outgoing> {
    let Some(charge) = &event.data.charge else {
        return Vec::new();
    };
    let Some(payment) = state.adyen.payment(&charge.id).cloned() else {
        // A charge this dialect did not make.
        return Vec::new();
    };
    let date = DateTime::from_timestamp(event.created, 0).unwrap_or_else(Utc::now);
    match event.kind {
        EventType::ChargeSucceeded | EventType::ChargeAuthorized => {
            let item = authorisation(state, &payment, true, None, date);
            if event.kind == EventType::ChargeSucceeded {
                dispute_after_capture(state, &payment);
            }
            vec![item]
        }
        // A cancel's item is the dialect's own (`Later::Cancel`).
        EventType::ChargeFailed if charge.failure_code.as_deref() == Some("canceled") => Vec::new(),
        EventType::ChargeFailed => {
            let reason = if charge.failure_code.as_deref() == Some("authentication_failed") {
                "3D Not Authenticated"
            } else {
                payment.refusal.unwrap_or(REFUSED).reason
            };
            vec![authorisation(
                state,
                &payment,
                false,
                Some(reason.to_owned()),
                date,
            )]
        }
        // Every capture of the dialect is asynchronous: decided captures are operations.
        EventType::ChargeCaptured | EventType::Unknown => Vec::new(),
        EventType::ChargeRefunded => refunded_out_of_band(state, &payment, charge, date),
        EventType::ChargeDisputeCreated => vec![dispute_item(
            state,
            &payment,
            charge,
            "NOTIFICATION_OF_CHARGEBACK",
            "Unresponded",
            date,
        )],
        EventType::ChargeDisputeClosed => {
            let status = charge.dispute.as_ref().map(|dispute| dispute.status);
            let reversed = state.adyen.dispute_of(&charge.id).reversed;
            match status {
                Some(DisputeStatus::Won) => {
                    state.adyen.dispute_of(&charge.id).reversed = true;
                    vec![
                        dispute_item(state, &payment, charge, "CHARGEBACK", "Pending", date),
                        dispute_item(state, &payment, charge, "CHARGEBACK_REVERSED", "Won", date),
                    ]
                }
                Some(DisputeStatus::Lost) if reversed => vec![dispute_item(
                    state,
                    &payment,
                    charge,
                    "SECOND_CHARGEBACK",
                    "Lost",
                    date,
                )],
                Some(DisputeStatus::Lost) => vec![dispute_item(
                    state,
                    &payment,
                    charge,
                    "CHARGEBACK",
                    "Lost",
                    date,
                )],
                Some(DisputeStatus::Open) | None => Vec::new(),
            }
        }
        EventType::OperationUpdated => operation_items(state, event, &payment, date),
    }
}

/// A decided capture or refund, or one that failed after it succeeded.
fn operation_items(
    state: &mut SimState,
    event: &WebhookEvent,
    payment: &PaymentRecord,
    date: DateTime<Utc>,
) -> Vec<Outgoing> {
    let Some(operation) = &event.data.operation else {
        return Vec::new();
    };
    let Some(record) = state
        .adyen
        .modification_of_operation(&operation.id)
        .cloned()
    else {
        return Vec::new();
    };
    let reason = operation.failure_reason.clone();
    match (operation.kind, operation.status) {
        (OperationKind::Cancel, _) | (_, OperationStatus::Pending) => Vec::new(),
        (OperationKind::Capture, OperationStatus::Succeeded) => {
            let item = modification_item(state, &record, true, None, date);
            dispute_after_capture(state, payment);
            vec![item]
        }
        (OperationKind::Refund, OperationStatus::Succeeded) => {
            vec![modification_item(state, &record, true, None, date)]
        }
        (OperationKind::Capture, OperationStatus::Failed)
            if reason.as_deref() == Some(CAPTURE_REVERSAL_REASON) =>
        {
            vec![modification_event(
                state,
                &record,
                "CAPTURE_FAILED",
                true,
                reason,
                date,
            )]
        }
        (OperationKind::Refund, OperationStatus::Failed)
            if reason.as_deref() == Some(REVERSAL_REASON) =>
        {
            vec![modification_event(
                state,
                &record,
                "REFUND_FAILED",
                true,
                reason,
                date,
            )]
        }
        (
            OperationKind::Capture | OperationKind::Refund,
            OperationStatus::Failed | OperationStatus::Reversed,
        ) => {
            vec![modification_item(state, &record, false, reason, date)]
        }
    }
}

/// A refund made outside the API (the simulator's `refund_out_of_band`, Adyen's Customer
/// Area): a REFUND under a pspReference of its own, for what was refunded since the last.
fn refunded_out_of_band(
    state: &mut SimState,
    payment: &PaymentRecord,
    charge: &Charge,
    date: DateTime<Utc>,
) -> Vec<Outgoing> {
    let by_api: i64 = state
        .operations_of(&charge.id, OperationKind::Refund)
        .iter()
        .filter(|operation| operation.status == OperationStatus::Succeeded)
        .map(|operation| operation.amount_minor)
        .sum();
    let out_of_band = charge.amount_refunded - by_api;
    let increment = out_of_band - payment.refunded_out_of_band;
    if increment <= 0 {
        return Vec::new();
    }
    if let Some(record) = state.adyen.payment_mut(&charge.id) {
        record.refunded_out_of_band = out_of_band;
    }
    let record = ModificationRecord {
        psp_reference: state.adyen.new_psp_reference(),
        kind: ModificationKind::Refund,
        payment: Some(payment.psp_reference.clone()),
        merchant_account: payment.merchant_account.clone(),
        reference: None,
        payment_reference: None,
        amount: Some(Amount {
            currency: payment.amount.currency.clone(),
            value: increment,
        }),
        operation_id: None,
        refusal: None,
    };
    let item = modification_item(state, &record, true, None, date);
    state.adyen.insert_modification(record);
    vec![item]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_wraps_items_byte_for_byte_and_dates_carry_an_offset() {
        let body = batch(&[br#"{"a":1}"#, br#"{"b":2}"#]);
        assert_eq!(
            String::from_utf8(body.to_vec()).unwrap(),
            r#"{"live":"false","notificationItems":[{"NotificationRequestItem":{"a":1}},{"NotificationRequestItem":{"b":2}}]}"#
        );
        let date = DateTime::from_timestamp(1_609_459_200, 0).unwrap();
        assert_eq!(event_date(date), "2021-01-01T00:00:00+00:00");
    }

    #[test]
    fn batches_stay_under_their_item_and_byte_limits_in_order() {
        let item = |n: usize, len: usize| Outgoing {
            event_id: format!("e{n}"),
            body: Bytes::from(format!("{{\"n\":\"{}\"}}", "x".repeat(len))),
        };
        // A dispute item of the dialect is under 1 KiB; 150 of 900 bytes would be 135 KiB.
        let items: Vec<Outgoing> = (0..150).map(|n| item(n, 900)).collect();
        let sent = batches(&items);
        assert!(sent.len() > 1);
        let mut ids = Vec::new();
        for sent in &sent {
            assert!(sent.body.len() <= BATCH_BYTES_MAX, "{}", sent.body.len());
            let parsed: serde_json::Value = serde_json::from_slice(&sent.body).unwrap();
            let count = parsed["notificationItems"].as_array().unwrap().len();
            assert!(count <= BATCH_ITEMS_MAX);
            assert_eq!(sent.event_id.split(',').count(), count);
            ids.extend(sent.event_id.split(',').map(str::to_owned));
        }
        let expected: Vec<String> = (0..150).map(|n| format!("e{n}")).collect();
        assert_eq!(ids, expected);
        // Small items: only the item limit applies; one too large leaves alone.
        let small: Vec<Outgoing> = (0..250).map(|n| item(n, 10)).collect();
        let counts: Vec<usize> = batches(&small)
            .iter()
            .map(|sent| sent.event_id.split(',').count())
            .collect();
        assert_eq!(counts, [BATCH_ITEMS_MAX, BATCH_ITEMS_MAX, 50]);
        let huge = [item(0, BATCH_BYTES_MAX), item(1, 10)];
        assert_eq!(batches(&huge).len(), 2);
        assert_eq!(batches(&[]).len(), 0);
        // The envelope is what `batch` writes.
        let one = batches(&[item(0, 3)]);
        assert_eq!(
            one[0].body.len(),
            BATCH_ENVELOPE_BYTES + BATCH_ITEM_WRAPPER_BYTES - 1 + item(0, 3).body.len()
        );
    }
}
