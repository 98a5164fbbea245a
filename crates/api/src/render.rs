//! How replies look over HTTP: the payment, transfer and account objects of API.md, and every business
//! rejection mapped once to a status and a stable `code`. The bytes made here are also what the
//! idempotency record stores, so a replay is byte-identical to the first answer.

use asiento_app::idempotency::StoredResponse;
use asiento_app::reply::{NextActionIn, PaymentCommandKind, Rejected, Render, Reply};
use asiento_balances::AccountView;
use asiento_domain::guard::{AccountDeclared, GuardKey};
use asiento_domain::{
    Balance, GuardRejection, HoldRejection, OperationKind, OperationState, PaymentId,
    PaymentRecord, PaymentRejection, PaymentStatus, TransferRejection,
};
use axum::http::StatusCode;
use serde_json::Value;

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
            } => match refused_operation(*kind, payment) {
                Some(problem) => StoredResponse {
                    status: problem.status,
                    body: problem.body_bytes(),
                },
                None => StoredResponse {
                    status: payment_status_code(*kind, payment).as_u16(),
                    body: to_bytes(&payment_json(payment, *position)),
                },
            },
            Reply::Transfer {
                transfer,
                created,
                position,
            } => StoredResponse {
                status: if *created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                }
                .as_u16(),
                body: to_bytes(&transfer_json(transfer, *position)),
            },
            Reply::TransferBatch {
                transfers,
                position,
            } => StoredResponse {
                status: StatusCode::CREATED.as_u16(),
                body: to_bytes(&serde_json::json!({
                    "object": "transfer_batch",
                    "data": transfers.iter().map(batch_member).collect::<Vec<_>>(),
                    "position": position,
                })),
            },
            Reply::Account {
                key,
                declared,
                created,
                position,
            } => StoredResponse {
                status: if *created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                }
                .as_u16(),
                body: account_bytes(key, declared, *position),
            },
            Reply::Monitor {
                created,
                deleted_at,
                position,
            } => StoredResponse {
                status: StatusCode::CREATED.as_u16(),
                body: to_bytes(&monitor_object(created, *deleted_at, *position)),
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

    /// Looks at the payment object's own `next_action` only (metadata may hold a key of that
    /// name). The answer without it is the same object with `next_action: null`, as it renders
    /// for a payment with none: the body was written by serde_json from a `Value`, so parsing
    /// and writing it again gives the same bytes everywhere else.
    fn next_action_in(&self, stored: &StoredResponse) -> Option<NextActionIn> {
        let Ok(Value::Object(mut object)) = serde_json::from_slice::<Value>(&stored.body) else {
            return None;
        };
        if object.get("next_action").is_none_or(Value::is_null) {
            return None;
        }
        let payment = PaymentId::parse(object.get("id")?.as_str()?).ok()?;
        object.insert("next_action".to_owned(), Value::Null);
        Some(NextActionIn {
            payment,
            without: StoredResponse {
                status: stored.status,
                body: to_bytes(&Value::Object(object)),
            },
        })
    }
}

/// A transfer of a batch's answer: the transfer object without its own `position`. The answer
/// names the batch's position once, so that the writer can write it into the stored answer in
/// the group commit's statement (`asiento_app::commit::Respond` finds the position's text in
/// exactly one place, or takes a slower path).
fn batch_member(transfer: &asiento_domain::transfer::TransferRecord) -> Value {
    let mut object = transfer_json(transfer, 0);
    if let Some(fields) = object.as_object_mut() {
        fields.remove("position");
    }
    object
}

/// A balance monitor as its routes answer it: the object and the position of its last event.
pub(crate) fn monitor_object(
    created: &asiento_domain::monitor::MonitorCreated,
    deleted_at: Option<&chrono::DateTime<chrono::Utc>>,
    position: i64,
) -> Value {
    let mut object = asiento_objects::monitor_json(created, deleted_at);
    object["position"] = Value::from(position);
    object
}

fn to_bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec())
}

/// A capture, refund or cancel the provider refused answers as a problem: nothing moved, and
/// what the request reserved is free again (the amount is refundable, another capture or cancel
/// may be asked for).
fn refused_operation(kind: PaymentCommandKind, payment: &PaymentRecord) -> Option<Problem> {
    let (op_kind, sequence, code) = match kind {
        PaymentCommandKind::Capture { sequence } => {
            (OperationKind::Capture, sequence, "capture_refused")
        }
        PaymentCommandKind::Refund { sequence } => {
            (OperationKind::Refund, sequence, "refund_refused")
        }
        PaymentCommandKind::Cancel { sequence } => {
            (OperationKind::Cancel, sequence, "cancel_refused")
        }
        PaymentCommandKind::Create | PaymentCommandKind::Read => return None,
    };
    let op = payment.operation(op_kind, sequence)?;
    (op.state == OperationState::Refused).then(|| {
        let reason = op.reason.as_deref().unwrap_or("refused");
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            code,
            format!(
                "the provider refused the {} ({reason}); nothing moved",
                op_kind.as_str()
            ),
        )
    })
}

/// What a command did, as its status: 202 while the provider's answer to this request's own
/// operation is still unknown or pending (for a cancel, also while a capture sent before it may
/// still win); otherwise 201 for a created payment or refund, 200 for a capture or cancel.
fn payment_status_code(kind: PaymentCommandKind, payment: &PaymentRecord) -> StatusCode {
    let open = |kind: OperationKind, sequence: u32| {
        payment
            .operation(kind, sequence)
            .is_none_or(|op| op.state.is_open())
    };
    let waiting_on_provider = match kind {
        PaymentCommandKind::Create => payment.status == PaymentStatus::Pending,
        PaymentCommandKind::Capture { sequence } => open(OperationKind::Capture, sequence),
        PaymentCommandKind::Refund { sequence } => open(OperationKind::Refund, sequence),
        PaymentCommandKind::Cancel { sequence } => {
            open(OperationKind::Cancel, sequence)
                || payment.authorization_ended.is_some() && payment.cancel_asked()
        }
        PaymentCommandKind::Read => false,
    };
    if waiting_on_provider {
        return StatusCode::ACCEPTED;
    }
    match kind {
        PaymentCommandKind::Create | PaymentCommandKind::Refund { .. } => StatusCode::CREATED,
        PaymentCommandKind::Capture { .. }
        | PaymentCommandKind::Cancel { .. }
        | PaymentCommandKind::Read => StatusCode::OK,
    }
}

pub use asiento_objects::{payment_json, transfer_json};

/// A declaration's answer: the account as `GET /v1/accounts` lists it, and the position written.
fn account_bytes(key: &GuardKey, declared: &AccountDeclared, position: i64) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Declared {
        #[serde(flatten)]
        account: AccountView,
        position: i64,
    }
    let balance = Balance::from(declared.balance_minor);
    let pending_debits = Balance::from(declared.pending.pending_debits_minor);
    let pending_credits = Balance::from(declared.pending.pending_credits_minor);
    let available = declared
        .policy
        .available(balance, pending_debits, pending_credits)
        .expect("three i64 amounts add up in an i128");
    let answer = Declared {
        account: AccountView {
            account: key.account.as_str().to_owned(),
            currency: key.currency.code().to_owned(),
            balance_minor: balance,
            pending_debits_minor: pending_debits,
            pending_credits_minor: pending_credits,
            available_minor: available,
            policy: declared.policy,
            declared: true,
            declared_at: Some(declared.at),
            metadata: declared.metadata.clone(),
        },
        position,
    };
    serde_json::to_vec(&answer).unwrap_or_else(|_| b"{}".to_vec())
}

/// Every business rejection, mapped once: 404 for what the tenant cannot see, 409 for a transition
/// the state machine forbids, 422 for a rule about amounts, 400 for a malformed request.
pub fn rejection_problem(rejected: &Rejected) -> Problem {
    match rejected {
        Rejected::Batch { index, rejection } => {
            let problem = rejection_problem(rejection);
            let detail = format!("transfer {index} of the batch: {}", problem.detail);
            Problem {
                detail,
                index: u32::try_from(*index).ok(),
                ..problem
            }
        }
        Rejected::Payment(rejection) => {
            let status = match rejection {
                PaymentRejection::NotFound => StatusCode::NOT_FOUND,
                PaymentRejection::InvalidTransition { .. }
                | PaymentRejection::CaptureAlreadyRequested { .. } => StatusCode::CONFLICT,
                PaymentRejection::CaptureExceedsAuthorized { .. }
                | PaymentRejection::RefundExceedsCaptured { .. }
                | PaymentRejection::AmountOverflow
                | PaymentRejection::AmountTooLarge(_) => StatusCode::UNPROCESSABLE_ENTITY,
                PaymentRejection::AmountMustBePositive
                | PaymentRejection::DescriptionTooLong
                | PaymentRejection::MetadataTooLarge
                | PaymentRejection::InvalidText { .. } => StatusCode::BAD_REQUEST,
                PaymentRejection::InvalidEntry(_) => return Problem::internal(rejection),
            };
            Problem::new(status, rejection.code(), rejection.to_string())
        }
        Rejected::Transfer(TransferRejection::Guard(rejection))
        | Rejected::Hold(HoldRejection::Guard(rejection))
        | Rejected::Guard(rejection) => guard_problem(rejection),
        Rejected::Hold(rejection) => {
            let status = match rejection {
                HoldRejection::NotFound(_) => StatusCode::NOT_FOUND,
                HoldRejection::NotAHold(_)
                | HoldRejection::Ended { .. }
                | HoldRejection::Expired(_) => StatusCode::CONFLICT,
                HoldRejection::ExceedsHold { .. } => StatusCode::UNPROCESSABLE_ENTITY,
                HoldRejection::AmountMustBePositive => StatusCode::BAD_REQUEST,
                HoldRejection::NotDue(_)
                | HoldRejection::Guard(_)
                | HoldRejection::InvalidEntry(_) => return Problem::internal(rejection),
            };
            Problem::new(status, rejection.code(), rejection.to_string())
        }
        Rejected::Transfer(rejection) => {
            let status = match rejection {
                TransferRejection::AmountMustBePositive
                | TransferRejection::AccountsMustBeDifferent
                | TransferRejection::DescriptionTooLong => StatusCode::BAD_REQUEST,
                TransferRejection::TransferAlreadyExists(_) => StatusCode::CONFLICT,
                TransferRejection::AmountTooLarge(_)
                | TransferRejection::ExpiryWithoutHold
                | TransferRejection::ExpiryInThePast => StatusCode::UNPROCESSABLE_ENTITY,
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
        GuardRejection::InsufficientFunds { .. }
        | GuardRejection::AccountFrozen { .. }
        | GuardRejection::AccountReserved { .. }
        | GuardRejection::AmountOverflow => Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            rejection.code(),
            rejection.to_string(),
        ),
        GuardRejection::MissingGuard { .. } => Problem::internal(rejection),
    }
}

#[cfg(test)]
mod tests {
    use asiento_domain::{
        decide_payment, evolve_payment, Amount, CaptureMode, CreatePayment, Currency, CustomerId,
        FeeSchedule, Payment, PaymentCommand, PaymentId, PaymentRecord, ProviderFact, ProviderName,
        TenantId,
    };

    use super::*;

    fn requires_action() -> PaymentRecord {
        let at = chrono::DateTime::from_timestamp(1_764_000_000, 0).expect("a time");
        let decide = |payment: Payment, command| {
            decide_payment(&payment, command)
                .expect("decided")
                .iter()
                .fold(payment, evolve_payment)
        };
        let mut metadata = serde_json::Map::new();
        // A key of the same name inside metadata is the client's, not the payment's.
        metadata.insert("next_action".to_owned(), serde_json::json!("ship"));
        let created = decide(
            Payment::default(),
            PaymentCommand::Create(CreatePayment {
                id: PaymentId::from_uuid(uuid::Uuid::from_u128(7)),
                tenant: TenantId::parse("acme").expect("tenant"),
                amount: Amount::new(1_000),
                currency: Currency::parse("USD").expect("currency"),
                customer: CustomerId::parse("42").expect("customer"),
                provider: ProviderName::parse("sim").expect("provider"),
                capture_mode: CaptureMode::Automatic,
                description: None,
                metadata,
                payment_method: None,
                at,
            }),
        );
        let waiting = decide(
            created,
            PaymentCommand::Provider {
                fact: ProviderFact::ActionRequired {
                    charge_id: "ch_1".to_owned(),
                    redirect_url: "https://psp.example/3ds/ch_1".to_owned(),
                },
                fees: FeeSchedule::new(300, Amount::ZERO).expect("fees"),
                at,
            },
        );
        waiting.record.expect("a payment")
    }

    /// The answer without `next_action` is, byte for byte, the answer rendered with none; the
    /// payment is named by the answer's id.
    #[test]
    fn next_action_is_taken_out_and_nothing_else() {
        let record = requires_action();
        let reply = |payment| Reply::Payment {
            kind: PaymentCommandKind::Create,
            payment,
            position: 12,
        };
        let stored = JsonRender.render(&reply(&record));
        let found = JsonRender.next_action_in(&stored).expect("a next_action");
        assert_eq!(found.payment, record.id);
        let none = PaymentRecord {
            next_action: None,
            ..record.clone()
        };
        assert_eq!(
            String::from_utf8_lossy(&found.without.body),
            String::from_utf8_lossy(&JsonRender.render(&reply(&none)).body)
        );
        assert_eq!(found.without.status, stored.status);
        // Nothing to take out: a payment with none, a rejection, not JSON.
        let none = JsonRender.render(&reply(&none));
        assert_eq!(JsonRender.next_action_in(&none), None);
        let rejection = JsonRender.render(&Reply::Rejected(Rejected::Payment(
            PaymentRejection::NotFound,
        )));
        assert_eq!(JsonRender.next_action_in(&rejection), None);
        let garbage = StoredResponse {
            status: 201,
            body: b"not json".to_vec(),
        };
        assert_eq!(JsonRender.next_action_in(&garbage), None);
    }
}
