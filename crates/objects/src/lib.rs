//! The objects of API.md as JSON: a payment, a transfer or hold, an exception, a balance monitor.
//!
//! One rendering of each, so that what a reply, a read and a merchant event say of an object
//! cannot drift apart: the API's replies and reads call these, and the merchant events
//! projection renders the object as it stood at each event with the same functions.

use asiento_domain::exception::ExceptionRecord;
use asiento_domain::{transfer::TransferRecord, Operation, PaymentRecord, PaymentStatus};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};

/// A time as every object shows it: RFC 3339 in UTC, milliseconds.
#[must_use]
pub fn time(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// One operation of a payment as API.md shows it in `operations`.
#[must_use]
pub fn operation_json(op: &Operation) -> Value {
    json!({
        "kind": op.kind.as_str(),
        "sequence": op.sequence,
        "amount_minor": op.amount.minor(),
        "state": op.state.as_str(),
        "provider_id": op.provider_id,
        "reason": op.reason,
        "provider_requests": op.requests.iter().map(|request| json!({
            "id": request.id,
            "replayed": request.replayed,
        })).collect::<Vec<_>>(),
        "requested_at": time(&op.requested_at),
        "updated_at": time(&op.updated_at),
    })
}

/// The payment object of API.md at `position`. `next_action` is present only while
/// `requires_action` (the domain clears it on every other state; this is the second check where
/// it is read).
#[must_use]
pub fn payment_json(payment: &PaymentRecord, position: i64) -> Value {
    payment_listing(payment, position, &payment.operations)
}

/// The payment object at `position` listing `operations` of it (a merchant event lists the
/// latest ones only).
#[must_use]
pub fn payment_listing(payment: &PaymentRecord, position: i64, operations: &[Operation]) -> Value {
    let next_action = match (&payment.next_action, payment.status) {
        (Some(action), PaymentStatus::RequiresAction) => {
            serde_json::to_value(action).unwrap_or(Value::Null)
        }
        _ => Value::Null,
    };
    json!({
        "id": payment.id.to_string(),
        "status": payment.status.as_str(),
        "amount_minor": payment.amount.minor(),
        "currency": payment.currency.code(),
        "customer": payment.customer.as_str(),
        "provider": payment.provider.as_str(),
        "provider_charge_id": payment.provider_charge_id,
        "capture": payment.capture_mode,
        "captured_minor": payment.captured.minor(),
        "refunded_minor": payment.refunded.minor(),
        "fee_minor": payment.fee_net().map(|fee| fee.minor()).unwrap_or(payment.fee.minor()),
        "provider_fees": payment.provider_fees.iter().map(|fee| json!({
            "transaction_id": fee.transaction_id,
            "fee_minor": fee.fee.minor(),
        })).collect::<Vec<_>>(),
        "description": payment.description,
        "metadata": payment.metadata,
        "failure_reason": payment.failure_reason,
        "needs_review": payment.needs_review(),
        "created_at": time(&payment.created_at),
        "updated_at": time(&payment.updated_at),
        "next_action": next_action,
        "operations": operations.iter().map(operation_json).collect::<Vec<_>>(),
        "position": position,
    })
}

/// A transfer or hold at `position`: `status` is `posted` for a transfer, `pending` → `posted` |
/// `voided` | `expired` for a hold, with what moved (`posted_amount_minor`) and the entry that
/// ended it.
#[must_use]
pub fn transfer_json(transfer: &TransferRecord, position: i64) -> Value {
    let requested = &transfer.requested;
    let settled = transfer.settled.as_ref();
    json!({
        "id": requested.transfer_id.to_string(),
        "from": requested.from.as_str(),
        "to": requested.to.as_str(),
        "amount_minor": requested.amount_minor.minor(),
        "currency": requested.currency.code(),
        "description": requested.description,
        "pending": requested.pending,
        "status": transfer.status().as_str(),
        "posted_amount_minor": transfer.posted_amount().minor(),
        "expires_at": requested.expires_at.as_ref().map(time),
        "entry_id": transfer.entry_id.map(|id| id.to_string()),
        "settled_entry_id": settled.and_then(|s| s.entry_id).map(|id| id.to_string()),
        "settled_at": settled.map(|s| time(&s.at)),
        "created_at": time(&requested.at),
        "position": position,
    })
}

/// A reconciliation exception's fields, from its record (merchant events) or its read row (the
/// exceptions list), so both render through [`exception_object`].
#[derive(Debug, Clone, Copy)]
pub struct ExceptionFields<'a> {
    pub id: &'a str,
    pub payment_id: Option<&'a str>,
    pub kind: &'a str,
    pub local: &'a Value,
    pub provider_state: &'a Value,
    pub provider_name: &'a str,
    pub charge_id: Option<&'a str>,
    pub difference: &'a Value,
    pub resolution: &'a str,
    pub status: &'a str,
    pub note: Option<&'a str>,
    pub recorded_ms: i64,
    pub resolved_ms: Option<i64>,
}

/// A reconciliation exception as `GET /v1/reconciliation/exceptions` lists it.
#[must_use]
pub fn exception_object(e: &ExceptionFields<'_>) -> Value {
    json!({
        "id": e.id,
        "payment_id": e.payment_id,
        "kind": e.kind,
        "local": e.local,
        "provider": e.provider_state,
        "provider_name": e.provider_name,
        "charge_id": e.charge_id,
        "difference": e.difference,
        "resolution": e.resolution,
        "status": e.status,
        "note": e.note,
        "recorded_at_ms": e.recorded_ms,
        "resolved_at_ms": e.resolved_ms,
    })
}

/// [`exception_object`] of an exception as its stream leaves it.
#[must_use]
pub fn exception_json(exception: &ExceptionRecord) -> Value {
    let recorded = &exception.recorded;
    let id = recorded.exception_id.to_string();
    let payment_id = recorded.payment_id.map(|id| id.to_string());
    let provider_name = recorded.provider.to_string();
    exception_object(&ExceptionFields {
        id: &id,
        payment_id: payment_id.as_deref(),
        kind: recorded.kind.as_str(),
        local: &recorded.local,
        provider_state: &recorded.provider_state,
        provider_name: &provider_name,
        charge_id: recorded.charge_id.as_deref(),
        difference: &recorded.difference,
        resolution: recorded.resolution.as_str(),
        status: exception.status.as_str(),
        note: exception.note.as_deref(),
        recorded_ms: recorded.at.timestamp_millis(),
        resolved_ms: exception.resolved_at.map(|at| at.timestamp_millis()),
    })
}

/// A balance monitor (`GET /v1/balance_monitors/{id}`, and the monitor a crossing names).
#[must_use]
pub fn monitor_json(
    created: &asiento_domain::monitor::MonitorCreated,
    deleted_at: Option<&DateTime<Utc>>,
) -> Value {
    json!({
        "id": created.monitor_id,
        "object": "balance_monitor",
        "account": created.account.as_str(),
        "currency": created.currency.code(),
        "field": created.threshold.field.as_str(),
        "condition": created.threshold.condition.as_str(),
        "amount_minor": created.threshold.amount_minor.minor(),
        "description": created.description,
        "status": if deleted_at.is_some() { "deleted" } else { "active" },
        "created_at": time(&created.at),
        "deleted_at": deleted_at.map(time),
    })
}

/// An account's balance figures as the balance object names them, under its normal balance.
#[must_use]
pub fn balances_json(
    balances: &asiento_domain::monitor::Balances,
    normal: asiento_domain::NormalBalance,
) -> Value {
    json!({
        "balance_minor": balances.posted,
        "pending_debits_minor": balances.pending_debits,
        "pending_credits_minor": balances.pending_credits,
        "available_minor": balances.available(normal).ok(),
    })
}
