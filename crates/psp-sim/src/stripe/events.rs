//! The Stripe dialect's webhooks: each change of the simulator's charge model announced as the
//! Stripe events a Stripe account sends for it (a captured card payment is both
//! `payment_intent.succeeded` and `charge.succeeded`), each with its own `evt_` id and the
//! object as it stood; and the same events listed as Stripe serves them (`GET /v1/events`, by
//! `type`, a `*` wildcard after a dot included, and `created` window; `GET /v1/events/{id}`),
//! delivered or not.

use std::collections::BTreeMap;

use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::Value;

use super::book::intent_id_of;
use super::listing::Listing;
use super::params::Params;
use super::render::{self, Expand, StripeError};
use super::{read_call, read_object};
use crate::state::{Outgoing, SimState};
use crate::Simulator;
use asiento_psp::event::{EventType, WebhookEvent};
use asiento_psp::provider::{OperationKind, OperationStatus};

/// The Stripe events one change of the charge model stands for.
pub(crate) fn events(event: &WebhookEvent, state: &SimState) -> Vec<Outgoing> {
    let Some(charge) = &event.data.charge else {
        return Vec::new();
    };
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
                        OperationStatus::Failed | OperationStatus::Reversed => {
                            out.push(("refund.failed", refund, key))
                        }
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

/// Every Stripe event the simulator's recorded changes made in the window stand for, newest
/// first (filtered before they are rendered: a page of a busy window renders no more).
fn all_events(state: &SimState, window: impl Fn(i64) -> bool) -> Vec<Value> {
    let mut all: Vec<Value> = state
        .events()
        .iter()
        .filter(|event| window(event.created))
        .flat_map(|event| events(event, state))
        .filter_map(|outgoing| serde_json::from_slice(&outgoing.body).ok())
        .collect();
    all.reverse();
    all
}

/// Whether an event of `kind` is of the type asked for: the same, or `group.*` for its group.
fn of_type(kind: &str, asked: &str) -> bool {
    match asked.strip_suffix('*') {
        Some(group) if group.ends_with('.') => kind.starts_with(group),
        _ => kind == asked,
    }
}

pub(crate) async fn list_events(
    State(sim): State<Simulator>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let read = |params: &mut Params| {
        let listing = Listing::read(params)?;
        let kind = params.text("type")?;
        Ok((listing, kind))
    };
    read_call(&sim, &headers, query, read, |state, (listing, kind)| {
        let all = all_events(state, |created| listing.created(created));
        let matching: Vec<&Value> = all
            .iter()
            .filter(|event| {
                kind.as_deref()
                    .is_none_or(|asked| of_type(event["type"].as_str().unwrap_or_default(), asked))
            })
            .collect();
        listing.answer(
            "/v1/events",
            &matching,
            |event| event["id"].as_str().unwrap_or_default(),
            Value::clone,
        )
    })
    .await
}

pub(crate) async fn get_event(
    State(sim): State<Simulator>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    read_object(&sim, &headers, query, |state| {
        all_events(state, |_| true)
            .into_iter()
            .find(|event| event["id"] == id.as_str())
            .ok_or_else(|| StripeError::not_found("event", &id))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::of_type;

    #[test]
    fn event_types_match_exactly_or_by_group() {
        assert!(of_type(
            "payment_intent.succeeded",
            "payment_intent.succeeded"
        ));
        assert!(of_type("payment_intent.succeeded", "payment_intent.*"));
        assert!(!of_type("charge.succeeded", "payment_intent.*"));
        assert!(!of_type("payment_intent.succeeded", "payment_intent"));
        assert!(!of_type("payment_intent.succeeded", "*"));
    }
}
