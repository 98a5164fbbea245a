//! The Stripe dialect's webhooks: each change of the simulator's charge model announced as the
//! Stripe events a Stripe account sends for it (a captured card payment is both
//! `payment_intent.succeeded` and `charge.succeeded`), each with its own `evt_` id and the
//! object as it stood.

use std::collections::BTreeMap;

use serde_json::Value;

use super::book::intent_id_of;
use super::render::{self, Expand};
use crate::event::{EventType, WebhookEvent};
use crate::provider::{OperationKind, OperationStatus};
use crate::sim::state::{Outgoing, SimState};

/// The Stripe events one change of the charge model stands for.
pub(crate) fn events(event: &WebhookEvent, state: &SimState) -> Vec<Outgoing> {
    let charge = &event.data.charge;
    let Some(record) = state.stripe.get(&intent_id_of(&charge.id)) else {
        // A charge without a PaymentIntent was not made through this dialect.
        return Vec::new();
    };
    let refunds = super::refunds_of(state, &charge.id);
    let fee_bps = state.fee_bps();
    let intent = || render::intent(record, Some(charge), &refunds, fee_bps, &Expand::default());
    let charge_object = || render::charge(charge, record, &refunds, fee_bps, &Expand::default());
    let confirm_key = Some(charge.idempotency_key.as_str());
    let mut out: Vec<(&str, Value, Option<&str>)> = Vec::new();
    match event.kind {
        EventType::ChargeSucceeded => {
            out.push(("payment_intent.succeeded", intent(), confirm_key));
            out.push(("charge.succeeded", charge_object(), confirm_key));
        }
        EventType::ChargeAuthorized => {
            out.push((
                "payment_intent.amount_capturable_updated",
                intent(),
                confirm_key,
            ));
            out.push(("charge.succeeded", charge_object(), confirm_key));
        }
        EventType::ChargeCaptured => {
            out.push(("payment_intent.succeeded", intent(), None));
            out.push(("charge.captured", charge_object(), None));
        }
        EventType::ChargeFailed if charge.failure_code.as_deref() == Some("canceled") => {
            out.push(("payment_intent.canceled", intent(), None));
        }
        EventType::ChargeFailed => {
            out.push(("payment_intent.payment_failed", intent(), confirm_key));
            out.push(("charge.failed", charge_object(), confirm_key));
        }
        EventType::ChargeRefunded => out.push(("charge.refunded", charge_object(), None)),
        EventType::ChargeDisputeCreated | EventType::ChargeDisputeClosed => {
            let kind = match event.kind {
                EventType::ChargeDisputeCreated => "charge.dispute.created",
                _ => "charge.dispute.closed",
            };
            if let Some(dispute) = render::dispute(charge) {
                out.push((kind, dispute, None));
            }
        }
        EventType::OperationUpdated => {
            let Some(operation) = event.data.operation.as_ref() else {
                return Vec::new();
            };
            let key = Some(operation.idempotency_key.as_str());
            match (operation.kind, operation.status) {
                (OperationKind::Refund, status) => {
                    let metadata: BTreeMap<String, String> =
                        state.stripe.refund_metadata(&operation.id);
                    let refund = render::refund(operation, &metadata);
                    out.push(("refund.updated", refund.clone(), key));
                    match status {
                        OperationStatus::Failed => out.push(("refund.failed", refund, key)),
                        OperationStatus::Succeeded => {
                            out.push(("charge.refunded", charge_object(), key))
                        }
                        OperationStatus::Pending => {}
                    }
                }
                (OperationKind::Capture, OperationStatus::Succeeded) => {
                    out.push(("payment_intent.succeeded", intent(), key));
                    out.push(("charge.captured", charge_object(), key));
                }
                (OperationKind::Capture | OperationKind::Cancel, _) => {}
            }
        }
        EventType::Unknown => {}
    }
    out.into_iter()
        .enumerate()
        .map(|(index, (kind, object, key))| {
            let id = format!("{}{index}", event.id);
            let body = render::event(&id, kind, event.created, object, key);
            Outgoing {
                event_id: id,
                body: serde_json::to_vec(&body)
                    .expect("a JSON value always serializes")
                    .into(),
            }
        })
        .collect()
}
