//! The Stripe dialect's payouts: the account's balance paid out to its bank account on demand
//! (`POST /sim/payouts`, as Stripe's automatic payout schedule would), each covering every
//! balance transaction not yet paid out, per currency, for their net. `payout.paid` announces
//! one; `POST /sim/payouts/{id}/fail` fails one after it was paid ("some payouts that fail
//! might initially show as `paid`, then change to `failed`"), which puts its money back in the
//! balance (a `payout_failure` transaction the next payout covers) and sends `payout.failed`.
//!
//! Served as Stripe serves them: `GET /v1/payouts` (created window, `status`, cursors),
//! `GET /v1/payouts/{id}`, and `GET /v1/balance_transactions?payout=po_…`.

use std::collections::{BTreeMap, HashSet};

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use chrono::Utc;
use serde_json::{json, Value};

use super::balance::{self, BalanceTransaction};
use super::book::PayoutRecord;
use super::listing::Listing;
use super::params::Params;
use super::render::{self, StripeError};
use super::{read_call, read_object};
use crate::state::{new_id, Outgoing, SimState};
use crate::Simulator;

/// Days from a payout until its money reaches the bank.
const ARRIVAL_AFTER_S: i64 = 2 * 24 * 60 * 60;

/// The control routes, nested under `/sim`.
pub(crate) fn control_routes() -> Router<Simulator> {
    Router::new()
        .route("/payouts", post(pay_out))
        .route("/payouts/{id}/fail", post(fail_payout))
}

/// Stripe's `payout` object.
pub(crate) fn render(payout: &PayoutRecord) -> Value {
    let id = payout.id.trim_start_matches("po_");
    let (status, failure_code, failure_message, failure_transaction) = match payout.failed {
        Some(_) => (
            "failed",
            json!("account_closed"),
            json!("The bank account has been closed."),
            json!(format!("txn_f{id}")),
        ),
        None => ("paid", Value::Null, Value::Null, Value::Null),
    };
    json!({
        "id": payout.id,
        "object": "payout",
        "amount": payout.amount,
        "application_fee": null,
        "application_fee_amount": null,
        "arrival_date": payout.created + ARRIVAL_AFTER_S,
        "automatic": true,
        "balance_transaction": format!("txn_{id}"),
        "created": payout.created,
        "currency": payout.currency,
        "description": "STRIPE PAYOUT",
        "destination": "ba_asiento_simulator",
        "failure_balance_transaction": failure_transaction,
        "failure_code": failure_code,
        "failure_message": failure_message,
        "livemode": false,
        "metadata": {},
        "method": "standard",
        "original_payout": null,
        "payout_method": null,
        "reconciliation_status": "completed",
        "reversed_by": null,
        "source_type": "card",
        "statement_descriptor": null,
        "status": status,
        "trace_id": {"status": "supported", "value": null},
        "type": "bank_account",
    })
}

fn outgoing(kind: &str, payout: &PayoutRecord, created: i64) -> Outgoing {
    let event_id = new_id("evt");
    let body = render::event(&event_id, kind, created, render(payout), None);
    Outgoing {
        event_id,
        body: serde_json::to_vec(&body)
            .expect("a JSON value always serializes")
            .into(),
    }
}

/// Pays out every balance transaction no payout covered yet, one payout per currency whose net
/// is positive (a negative balance stays for later movements to cover).
fn pay_out_all(state: &mut SimState, now: i64) -> Vec<PayoutRecord> {
    let all = balance::all(state);
    let paid: HashSet<&str> = state
        .stripe
        .payouts()
        .iter()
        .flat_map(|payout| payout.transactions.iter().map(String::as_str))
        .collect();
    let mut due: BTreeMap<&str, Vec<&BalanceTransaction>> = BTreeMap::new();
    for txn in all.iter().rev() {
        if txn.kind != "payout" && !paid.contains(txn.id.as_str()) {
            due.entry(txn.currency.as_str()).or_default().push(txn);
        }
    }
    let mut made = Vec::new();
    for (currency, transactions) in due {
        let amount: i64 = transactions.iter().map(|txn| txn.net()).sum();
        if amount <= 0 {
            continue;
        }
        made.push(PayoutRecord {
            id: new_id("po"),
            amount,
            currency: currency.to_owned(),
            created: now,
            failed: None,
            transactions: transactions.iter().map(|txn| txn.id.clone()).collect(),
        });
    }
    for payout in &made {
        state.stripe.add_payout(payout.clone());
    }
    let events = made
        .iter()
        .flat_map(|payout| {
            [
                outgoing("payout.created", payout, now),
                outgoing("payout.paid", payout, now),
            ]
        })
        .collect();
    state.send(events);
    made
}

async fn pay_out(State(sim): State<Simulator>) -> Response {
    let now = Utc::now().timestamp();
    let made = pay_out_all(&mut sim.state(), now);
    let data: Vec<Value> = made.iter().map(render).collect();
    axum::Json(json!({"data": data})).into_response()
}

async fn fail_payout(State(sim): State<Simulator>, Path(id): Path<String>) -> Response {
    let now = Utc::now().timestamp();
    let mut state = sim.state();
    let Some(payout) = state.stripe.payout_mut(&id) else {
        return StripeError::not_found("payout", &id).into_response();
    };
    if payout.failed.is_some() {
        return StripeError::invalid(format!("Payout {id} has already failed."))
            .with_status(StatusCode::CONFLICT)
            .into_response();
    }
    // A failure is at or after the payout: Stripe's times are seconds, both may fall in one.
    payout.failed = Some(now.max(payout.created));
    let failed = payout.clone();
    state.send(vec![outgoing("payout.failed", &failed, now)]);
    axum::Json(render(&failed)).into_response()
}

/// Payouts, newest first, by `created` window and `status`.
pub(crate) async fn list_payouts(
    State(sim): State<Simulator>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let read = |params: &mut Params| {
        let listing = Listing::read(params)?;
        let status = params.text("status")?;
        Ok((listing, status))
    };
    read_call(&sim, &headers, query, read, |state, (listing, status)| {
        let payouts: Vec<&PayoutRecord> = state
            .stripe
            .payouts()
            .iter()
            .rev()
            .filter(|payout| listing.created(payout.created))
            .filter(|payout| {
                let is = if payout.failed.is_some() {
                    "failed"
                } else {
                    "paid"
                };
                status.as_deref().is_none_or(|status| status == is)
            })
            .collect();
        listing.answer("/v1/payouts", &payouts, |payout| payout.id.as_str(), render)
    })
    .await
}

pub(crate) async fn get_payout(
    State(sim): State<Simulator>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    read_object(&sim, &headers, query, |state| {
        state
            .stripe
            .payouts()
            .iter()
            .find(|payout| payout.id == id)
            .map(render)
            .ok_or_else(|| StripeError::not_found("payout", &id))
    })
    .await
}
