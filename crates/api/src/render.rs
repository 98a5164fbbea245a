//! How replies look over HTTP: the payment and transfer objects of API.md, and every business
//! rejection mapped once to a status and a stable `code`. The bytes made here are also what the
//! idempotency record stores, so a replay is byte-identical to the first answer.

use asiento_app::idempotency::StoredResponse;
use asiento_app::reply::{PaymentCommandKind, Rejected, Render, Reply};
use asiento_domain::{
    transfer::TransferRecord, GuardRejection, PaymentRecord, PaymentRejection, PaymentStatus,
    TransferRejection,
};
use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::problem::Problem;

/// The JSON renderer of API.md.
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonRender;

impl Render for JsonRender {
    fn render(&self, reply: &Reply<'_>) -> StoredResponse {
        match reply {
            Reply::Payment {
                kind,
                payment,
                position,
            } => StoredResponse {
                status: payment_status_code(*kind, payment).as_u16(),
                body: to_bytes(&payment_json(payment, *position)),
            },
            Reply::Transfer { transfer, position } => StoredResponse {
                status: StatusCode::CREATED.as_u16(),
                body: to_bytes(&transfer_json(transfer, *position)),
            },
            Reply::Rejected(rejected) => {
                let problem = rejection_problem(rejected);
                StoredResponse {
                    status: problem.status,
                    body: problem.body_bytes(),
                }
            }
        }
    }
}

fn to_bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec())
}

/// 202 while the provider's answer to this request is still unknown; otherwise what the command
/// did: 201 for a created payment or refund, 200 for a capture.
fn payment_status_code(kind: PaymentCommandKind, payment: &PaymentRecord) -> StatusCode {
    let waiting_on_provider = match kind {
        PaymentCommandKind::Create => payment.status == PaymentStatus::Pending,
        PaymentCommandKind::Capture => payment.open_capture().is_some(),
        PaymentCommandKind::Refund => payment
            .refund_committed()
            .is_ok_and(|committed| committed > payment.refunded),
        PaymentCommandKind::Read => false,
    };
    if waiting_on_provider {
        return StatusCode::ACCEPTED;
    }
    match kind {
        PaymentCommandKind::Create | PaymentCommandKind::Refund => StatusCode::CREATED,
        PaymentCommandKind::Capture | PaymentCommandKind::Read => StatusCode::OK,
    }
}

/// The payment object of API.md. `next_action` is present only while `requires_action` (the
/// domain clears it on every other state; this is the second check where it is read).
pub fn payment_json(payment: &PaymentRecord, position: i64) -> Value {
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
        "capture": payment.capture_mode,
        "captured_minor": payment.captured.minor(),
        "refunded_minor": payment.refunded.minor(),
        "fee_minor": payment.fee_net().map(|fee| fee.minor()).unwrap_or(payment.fee.minor()),
        "description": payment.description,
        "metadata": payment.metadata,
        "failure_reason": payment.failure_reason,
        "needs_review": payment.needs_review(),
        "created_at": payment.created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "updated_at": payment.updated_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "next_action": next_action,
        "position": position,
    })
}

pub fn transfer_json(transfer: &TransferRecord, position: i64) -> Value {
    let requested = &transfer.requested;
    json!({
        "id": requested.transfer_id.to_string(),
        "from": requested.from.as_str(),
        "to": requested.to.as_str(),
        "amount_minor": requested.amount_minor.minor(),
        "currency": requested.currency.code(),
        "description": requested.description,
        "entry_id": transfer.entry_id.map(|id| id.to_string()),
        "created_at": requested.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "position": position,
    })
}

/// Every business rejection, mapped once: 404 for what the tenant cannot see, 409 for a transition
/// the state machine forbids, 422 for a rule about amounts, 400 for a malformed request.
pub fn rejection_problem(rejected: &Rejected) -> Problem {
    match rejected {
        Rejected::Payment(rejection) => {
            let status = match rejection {
                PaymentRejection::NotFound => StatusCode::NOT_FOUND,
                PaymentRejection::InvalidTransition { .. }
                | PaymentRejection::CaptureAlreadyRequested { .. } => StatusCode::CONFLICT,
                PaymentRejection::CaptureExceedsAuthorized { .. }
                | PaymentRejection::RefundExceedsCaptured { .. }
                | PaymentRejection::AmountOverflow => StatusCode::UNPROCESSABLE_ENTITY,
                PaymentRejection::AmountMustBePositive
                | PaymentRejection::DescriptionTooLong
                | PaymentRejection::MetadataTooLarge
                | PaymentRejection::InvalidText { .. } => StatusCode::BAD_REQUEST,
                PaymentRejection::InvalidEntry(_) => return Problem::internal(rejection),
            };
            Problem::new(status, rejection.code(), rejection.to_string())
        }
        Rejected::Transfer(TransferRejection::Guard(rejection)) | Rejected::Guard(rejection) => {
            guard_problem(rejection)
        }
        Rejected::Transfer(rejection) => {
            let status = match rejection {
                TransferRejection::AmountMustBePositive
                | TransferRejection::AccountsMustBeDifferent
                | TransferRejection::DescriptionTooLong => StatusCode::BAD_REQUEST,
                TransferRejection::TransferAlreadyExists(_) => StatusCode::CONFLICT,
                TransferRejection::Guard(_) | TransferRejection::InvalidEntry(_) => {
                    return Problem::internal(rejection)
                }
            };
            Problem::new(status, rejection.code(), rejection.to_string())
        }
    }
}

fn guard_problem(rejection: &GuardRejection) -> Problem {
    match rejection {
        GuardRejection::InsufficientFunds { .. } | GuardRejection::AmountOverflow => Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            rejection.code(),
            rejection.to_string(),
        ),
        GuardRejection::MissingGuard { .. } => Problem::internal(rejection),
    }
}
