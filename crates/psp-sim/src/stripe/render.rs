//! The Stripe dialect's answers: the simulator's charges and operations rendered as Stripe's
//! PaymentIntent, Charge, Refund and Dispute objects (balance transactions in [`balance`]) with
//! every field of Stripe's
//! published fixtures (`tests/fixtures/stripe/fixtures3.json`), its error envelope, and its
//! event objects.

use std::collections::BTreeMap;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::balance;
use super::book::{intent_id_of, IntentRecord};
use crate::state::SimError;
use asiento_psp::provider::{
    Charge, ChargeStatus, DisputeStatus, Operation, OperationKind, OperationStatus,
};
use asiento_psp::stripe::wire::API_VERSION;

/// Stripe's `Stripe-Should-Retry` answer header.
pub const SHOULD_RETRY_HEADER: &str = "Stripe-Should-Retry";

/// A refusal as Stripe answers it: `{"error": {type, code, message, param, …}}`. Boxed: it
/// travels in every `Result` of the dialect.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StripeError(Box<ErrorDetail>);

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ErrorDetail {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: Option<&'static str>,
    pub decline_code: Option<&'static str>,
    pub message: String,
    pub param: Option<String>,
    /// A decline carries the PaymentIntent it was made on.
    pub payment_intent: Option<Value>,
    pub charge: Option<String>,
    pub should_retry: Option<bool>,
}

impl StripeError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> StripeError {
        StripeError(Box::new(ErrorDetail {
            status,
            kind,
            code: None,
            decline_code: None,
            message: message.into(),
            param: None,
            payment_intent: None,
            charge: None,
            should_retry: None,
        }))
    }

    pub fn status(&self) -> StatusCode {
        self.0.status
    }

    pub(crate) fn with_status(mut self, status: StatusCode) -> StripeError {
        self.0.status = status;
        self
    }

    fn with_retry(mut self, retry: bool) -> StripeError {
        self.0.should_retry = Some(retry);
        self
    }

    pub fn invalid(message: impl Into<String>) -> StripeError {
        StripeError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn invalid_param(param: &str, message: impl Into<String>) -> StripeError {
        let mut error = StripeError::invalid(message);
        error.0.param = Some(param.to_owned());
        error
    }

    pub fn missing(param: &str) -> StripeError {
        StripeError::invalid_param(param, format!("Missing required param: {param}."))
            .with_code("parameter_missing")
    }

    pub fn not_found(object: &str, id: &str) -> StripeError {
        StripeError::invalid_param("id", format!("No such {object}: '{id}'"))
            .with_code("resource_missing")
            .with_status(StatusCode::NOT_FOUND)
    }

    pub fn unexpected_state(message: impl Into<String>) -> StripeError {
        StripeError::invalid(message).with_code("payment_intent_unexpected_state")
    }

    pub fn unauthorized(message: impl Into<String>) -> StripeError {
        StripeError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
    }

    pub fn no_route(method: &str, path: &str) -> StripeError {
        StripeError::invalid(format!("Unrecognized request URL ({method}: {path})."))
            .with_status(StatusCode::NOT_FOUND)
    }

    /// A declined confirmation: 402 `card_error`, with the PaymentIntent, which exists.
    pub fn declined(intent: Value, charge_id: &str) -> StripeError {
        let mut error = StripeError::new(
            StatusCode::PAYMENT_REQUIRED,
            "card_error",
            "Your card was declined.",
        )
        .with_code("card_declined");
        error.0.decline_code = Some("generic_decline");
        error.0.payment_intent = Some(intent);
        error.0.charge = Some(charge_id.to_owned());
        error
    }

    pub fn with_code(mut self, code: &'static str) -> StripeError {
        self.0.code = Some(code);
        self
    }

    pub fn body(&self) -> Value {
        let detail = &self.0;
        let mut error = json!({
            "type": detail.kind,
            "message": detail.message,
        });
        let fields = [
            ("code", detail.code.map(Value::from)),
            ("decline_code", detail.decline_code.map(Value::from)),
            ("param", detail.param.clone().map(Value::from)),
            ("payment_intent", detail.payment_intent.clone()),
            ("charge", detail.charge.clone().map(Value::from)),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                error[name] = value;
            }
        }
        if detail.kind == "card_error" {
            error["doc_url"] = json!("https://stripe.com/docs/error-codes/card-declined");
        }
        json!({ "error": error })
    }
}

impl From<SimError> for StripeError {
    fn from(error: SimError) -> StripeError {
        let message = error.to_string();
        match error {
            SimError::IdempotencyKeyReused => StripeError::new(
                StatusCode::BAD_REQUEST,
                "idempotency_error",
                "Keys for idempotent requests can only be used with the same parameters they \
                 were first used with. Try using a key other than the one you used if you meant \
                 to execute a different request.",
            ),
            SimError::IdempotencyKeyInUse => StripeError::invalid(
                "There is currently another in-progress request using this Idempotent Key (that \
                 probably means you submitted twice, and the other request is still going \
                 through). Please retry your request at a later time.",
            )
            .with_code("idempotency_key_in_use")
            .with_status(StatusCode::CONFLICT)
            .with_retry(true),
            SimError::IdempotencyKeyMissing | SimError::IdempotencyKeyInvalid => {
                StripeError::invalid(message).with_code("idempotency_key_invalid")
            }
            SimError::AmountMustBePositive => StripeError::invalid_param(
                "amount",
                "This value must be greater than or equal to 1.",
            )
            .with_code("amount_too_small"),
            SimError::CaptureExceedsAuthorized => StripeError::invalid_param(
                "amount_to_capture",
                "The amount to capture must be at most the amount capturable.",
            )
            .with_code("amount_too_large"),
            SimError::RefundExceedsCaptured => StripeError::invalid_param(
                "amount",
                "Refund amount is greater than unrefunded amount on charge.",
            )
            .with_code("amount_too_large"),
            SimError::ChargeNotRefundable => {
                StripeError::invalid(message).with_code("charge_not_refundable")
            }
            SimError::ChargeDisputed => StripeError::invalid(
                "This charge has an open dispute and cannot be refunded until it is closed.",
            )
            .with_code("charge_disputed"),
            SimError::ChargeNotCapturable(_)
            | SimError::ChargeNotCancelable(_)
            | SimError::CapturePending
            | SimError::ChargeNotAwaitingAction => StripeError::unexpected_state(message),
            SimError::ChargeNotFound => StripeError::not_found("payment_intent", "unknown"),
            SimError::OperationNotFound => StripeError::not_found("refund", "unknown"),
            SimError::Unreachable | SimError::CapacityExhausted => {
                StripeError::new(StatusCode::SERVICE_UNAVAILABLE, "api_error", message)
                    .with_retry(true)
            }
            SimError::Simulated => StripeError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "api_error",
                "An unknown error occurred",
            ),
            SimError::NoSuchRoute => StripeError::no_route("GET", "unknown"),
            SimError::InvalidRequest(_)
            | SimError::CurrencyInvalid
            | SimError::PaymentMethodUnknown(_)
            | SimError::DisputeNotOpen
            | SimError::OperationNotFailable(_)
            | SimError::WindowInvalid => StripeError::invalid(message),
        }
    }
}

impl IntoResponse for StripeError {
    fn into_response(self) -> Response {
        let mut response = (self.0.status, axum::Json(self.body())).into_response();
        if let Some(retry) = self.0.should_retry {
            response.headers_mut().insert(
                SHOULD_RETRY_HEADER,
                HeaderValue::from_static(if retry { "true" } else { "false" }),
            );
        }
        response
    }
}

/// Which linked objects an answer embeds (`expand[]=latest_charge.balance_transaction`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Expand {
    paths: Vec<String>,
}

impl Expand {
    /// The paths a route may expand; any other is refused as Stripe refuses it.
    pub fn new(paths: Vec<String>, allowed: &[&str]) -> Result<Expand, StripeError> {
        for path in &paths {
            if !allowed.contains(&path.as_str()) {
                return Err(StripeError::invalid_param(
                    "expand",
                    format!("This property cannot be expanded ({path})."),
                ));
            }
        }
        Ok(Expand { paths })
    }

    pub(crate) fn has(&self, field: &str) -> bool {
        self.paths.iter().any(|path| {
            path == field
                || path
                    .strip_prefix(field)
                    .is_some_and(|rest| rest.starts_with('.'))
        })
    }

    /// What is asked under `field` (`latest_charge.balance_transaction` → `balance_transaction`).
    fn under(&self, field: &str) -> Expand {
        let prefix = format!("{field}.");
        Expand {
            paths: self
                .paths
                .iter()
                .filter_map(|path| path.strip_prefix(&prefix).map(str::to_owned))
                .collect(),
        }
    }
}

/// The PaymentIntent expansions the dialect serves.
pub(crate) const INTENT_EXPANSIONS: &[&str] = &[
    "latest_charge",
    "latest_charge.balance_transaction",
    "payment_method",
];

/// The Charge expansions the dialect serves.
pub(crate) const CHARGE_EXPANSIONS: &[&str] = &["balance_transaction", "payment_intent"];

pub(crate) fn intent_status(record: &IntentRecord, charge: Option<&Charge>) -> &'static str {
    match charge {
        None if record.canceled.is_some() => "canceled",
        None if record.payment_method.is_some() => "requires_confirmation",
        None => "requires_payment_method",
        Some(charge) => match charge.status {
            ChargeStatus::Succeeded => "succeeded",
            ChargeStatus::RequiresCapture => "requires_capture",
            ChargeStatus::RequiresAction => "requires_action",
            ChargeStatus::Failed if charge.failure_code.as_deref() == Some("canceled") => {
                "canceled"
            }
            ChargeStatus::Failed => "requires_payment_method",
        },
    }
}

fn last_payment_error(charge: &Charge, record: &IntentRecord) -> Value {
    match charge.failure_code.as_deref() {
        Some("card_declined") => json!({
            "type": "card_error",
            "code": "card_declined",
            "decline_code": "generic_decline",
            "message": "Your card was declined.",
            "charge": charge.id,
            "doc_url": "https://stripe.com/docs/error-codes/card-declined",
            "payment_method": {"id": record.payment_method, "object": "payment_method"},
        }),
        Some("authentication_failed") => json!({
            "type": "card_error",
            "code": "payment_intent_authentication_failure",
            "message": "The provided PaymentMethod has failed authentication.",
            "doc_url": "https://stripe.com/docs/error-codes/payment-intent-authentication-failure",
            "payment_method": {"id": record.payment_method, "object": "payment_method"},
        }),
        _ => Value::Null,
    }
}

/// A PaymentIntent: its record, and its charge once confirmed.
pub(crate) fn intent(
    record: &IntentRecord,
    charge: Option<&Charge>,
    refunds: &[Operation],
    fee_bps: u32,
    expand: &Expand,
) -> Value {
    let status = intent_status(record, charge);
    let amount_capturable = match charge {
        Some(charge) if charge.status == ChargeStatus::RequiresCapture => charge.amount_minor,
        _ => 0,
    };
    let amount_received = charge.map_or(0, |charge| charge.amount_captured);
    let latest_charge = match charge {
        None => Value::Null,
        Some(charge) if expand.has("latest_charge") => self::charge(
            charge,
            record,
            refunds,
            fee_bps,
            &expand.under("latest_charge"),
        ),
        Some(charge) => json!(charge.id),
    };
    let next_action = match charge.and_then(|charge| charge.next_action.as_ref()) {
        Some(action) if status == "requires_action" => json!({
            "type": "redirect_to_url",
            "redirect_to_url": {"url": action.redirect_url, "return_url": record.return_url},
        }),
        _ => Value::Null,
    };
    let last_payment_error = match charge {
        Some(charge) if status == "requires_payment_method" => last_payment_error(charge, record),
        _ => Value::Null,
    };
    let (canceled_at, cancellation_reason) = match (status, record.canceled) {
        ("canceled", Some((at, reason))) => (json!(at), json!(reason)),
        ("canceled", None) => (
            json!(charge.map_or(record.created, |charge| charge.updated.timestamp())),
            json!("automatic"),
        ),
        _ => (Value::Null, Value::Null),
    };
    let payment_method = match &record.payment_method {
        Some(id) if expand.has("payment_method") => payment_method(id, record.created),
        Some(id) => json!(id),
        None => Value::Null,
    };
    let automatic = record.payment_method_types.is_empty();
    let types = if automatic {
        vec!["card".to_owned()]
    } else {
        record.payment_method_types.clone()
    };
    json!({
        "id": record.id,
        "object": "payment_intent",
        "amount": record.amount,
        "amount_capturable": amount_capturable,
        "amount_details": {"tip": {}},
        "amount_received": amount_received,
        "application": null,
        "application_fee_amount": null,
        "automatic_payment_methods": if automatic {
            json!({"allow_redirects": "always", "enabled": true})
        } else {
            Value::Null
        },
        "canceled_at": canceled_at,
        "cancellation_reason": cancellation_reason,
        "capture_method": record.capture_method,
        "client_secret": format!("{}_secret_{}", record.id, &record.id[3..].chars().rev().collect::<String>()),
        "confirmation_method": "automatic",
        "created": record.created,
        "currency": record.currency,
        "customer": null,
        "customer_account": null,
        "description": record.description,
        "excluded_payment_method_types": null,
        "last_payment_error": last_payment_error,
        "latest_charge": latest_charge,
        "livemode": false,
        "managed_payments": null,
        "metadata": record.metadata,
        "next_action": next_action,
        "on_behalf_of": null,
        "payment_method": payment_method,
        "payment_method_configuration_details": null,
        "payment_method_options": {"card": {"installments": null, "mandate_options": null, "network": null, "request_three_d_secure": "automatic"}},
        "payment_method_types": types,
        "processing": null,
        "receipt_email": null,
        "review": null,
        "setup_future_usage": null,
        "shipping": null,
        "source": null,
        "statement_descriptor": null,
        "statement_descriptor_suffix": null,
        "status": status,
        "transfer_data": null,
        "transfer_group": null,
    })
}

fn payment_method(id: &str, created: i64) -> Value {
    json!({
        "id": id,
        "object": "payment_method",
        "type": "card",
        "card": {"brand": "visa", "last4": "4242", "exp_month": 12, "exp_year": 2034, "country": "US", "funding": "credit"},
        "billing_details": {"address": null, "email": null, "name": null, "phone": null},
        "created": created,
        "customer": null,
        "livemode": false,
        "metadata": {},
    })
}

/// The Charge of a confirmed PaymentIntent.
pub(crate) fn charge(
    charge: &Charge,
    record: &IntentRecord,
    refunds: &[Operation],
    fee_bps: u32,
    expand: &Expand,
) -> Value {
    let captured = charge.amount_captured > 0;
    let failed = charge.status == ChargeStatus::Failed && charge.amount_captured == 0;
    let status = match charge.status {
        ChargeStatus::Failed if failed => "failed",
        ChargeStatus::RequiresAction => "pending",
        _ => "succeeded",
    };
    let balance_transaction = match balance::of_capture(charge, fee_bps) {
        None => Value::Null,
        Some(txn) if expand.has("balance_transaction") => txn.render(),
        Some(txn) => json!(txn.id),
    };
    let payment_intent = if expand.has("payment_intent") {
        intent(record, Some(charge), refunds, fee_bps, &Expand::default())
    } else {
        json!(intent_id_of(&charge.id))
    };
    let (failure_code, failure_message) = match charge.failure_code.as_deref() {
        Some("card_declined") if failed => {
            (json!("card_declined"), json!("Your card was declined."))
        }
        _ => (Value::Null, Value::Null),
    };
    let refund_objects: Vec<Value> = refunds
        .iter()
        .rev()
        .map(|operation| refund(operation, &BTreeMap::new()))
        .collect();
    let outcome_type = if failed {
        "issuer_declined"
    } else {
        "authorized"
    };
    json!({
        "id": charge.id,
        "object": "charge",
        "amount": charge.amount_minor,
        "amount_captured": charge.amount_captured,
        "amount_refunded": charge.amount_refunded,
        "application": null,
        "application_fee": null,
        "application_fee_amount": null,
        "balance_transaction": balance_transaction,
        "billing_details": {"address": {"city": null, "country": null, "line1": null, "line2": null, "postal_code": null, "state": null}, "email": null, "name": null, "phone": null, "tax_id": null},
        "calculated_statement_descriptor": "ASIENTO",
        "captured": captured,
        "created": charge.created.timestamp(),
        "currency": charge.currency.to_ascii_lowercase(),
        "customer": null,
        "description": record.description,
        "disputed": charge.dispute.is_some(),
        "failure_balance_transaction": null,
        "failure_code": failure_code,
        "failure_message": failure_message,
        "fraud_details": {},
        "livemode": false,
        "metadata": charge.metadata,
        "on_behalf_of": null,
        "outcome": {"advice_code": null, "network_advice_code": null, "network_decline_code": null, "network_status": if failed { "declined_by_network" } else { "approved_by_network" }, "reason": if failed { json!("generic_decline") } else { Value::Null }, "risk_level": "normal", "seller_message": if failed { "The bank did not return any further details with this decline." } else { "Payment complete." }, "type": outcome_type},
        "paid": !failed,
        "payment_intent": payment_intent,
        "payment_method": record.payment_method,
        "payment_method_details": {"card": {"brand": "visa", "country": "US", "exp_month": 12, "exp_year": 2034, "funding": "credit", "last4": "4242", "network": "visa"}, "type": "card"},
        "receipt_email": null,
        "receipt_number": null,
        "receipt_url": null,
        "refunded": captured && charge.amount_refunded == charge.amount_captured,
        "refunds": {"object": "list", "data": refund_objects, "has_more": false, "url": format!("/v1/charges/{}/refunds", charge.id)},
        "review": null,
        "shipping": null,
        "source": null,
        "source_transfer": null,
        "statement_descriptor": null,
        "statement_descriptor_suffix": null,
        "status": status,
        "transfer_data": null,
        "transfer_group": null,
    })
}

/// A refund: the simulator's refund operation.
pub(crate) fn refund(operation: &Operation, metadata: &BTreeMap<String, String>) -> Value {
    debug_assert_eq!(
        operation.kind,
        OperationKind::Refund,
        "only refunds render as refunds"
    );
    let status = match operation.status {
        OperationStatus::Pending => "pending",
        OperationStatus::Succeeded => "succeeded",
        OperationStatus::Failed | OperationStatus::Reversed => "failed",
    };
    let charge = json!(operation.charge);
    let payment_intent = json!(intent_id_of(&operation.charge));
    let moved = balance::of_refund(operation);
    let mut refund = json!({
        "id": operation.id,
        "object": "refund",
        "amount": operation.amount_minor,
        "balance_transaction": moved.first().map(|txn| txn.id.clone()),
        "charge": charge,
        "created": operation.created.timestamp(),
        "currency": operation.currency.to_ascii_lowercase(),
        "customer": null,
        "customer_account": null,
        "destination_details": {"card": {"reference_status": "pending", "reference_type": "acquirer_reference_number", "type": "refund"}, "type": "card"},
        "metadata": metadata,
        "payment_intent": payment_intent,
        "payment_method": null,
        "reason": null,
        "receipt_number": null,
        "source_transfer_reversal": null,
        "status": status,
        "transfer_reversal": null,
    });
    if operation.status == OperationStatus::Failed {
        refund["failure_reason"] = json!(operation.failure_reason.as_deref().unwrap_or("unknown"));
        refund["failure_balance_transaction"] = json!(moved.get(1).map(|txn| txn.id.clone()));
    }
    if operation.status == OperationStatus::Pending {
        refund["pending_reason"] = json!("processing");
    }
    refund
}

/// A dispute on a charge, as Stripe's `dispute` object.
pub(crate) fn dispute(charge: &Charge) -> Option<Value> {
    let dispute = charge.dispute.as_ref()?;
    let status = match dispute.status {
        DisputeStatus::Open => "needs_response",
        DisputeStatus::Won => "won",
        DisputeStatus::Lost => "lost",
    };
    let suffix = charge.id.strip_prefix("ch_").unwrap_or(&charge.id);
    Some(json!({
        "id": format!("dp_{suffix}"),
        "object": "dispute",
        "amount": dispute.amount_minor,
        "balance_transactions": balance::of_dispute(charge).iter().map(balance::BalanceTransaction::render).collect::<Vec<_>>(),
        "charge": charge.id,
        "created": dispute.created.timestamp(),
        "currency": charge.currency.to_ascii_lowercase(),
        "enhanced_eligibility_types": [],
        "evidence": {},
        "evidence_details": {"due_by": dispute.created.timestamp() + 7 * 24 * 60 * 60, "has_evidence": false, "past_due": false, "submission_count": 0, "enhanced_eligibility": {}},
        "is_charge_refundable": false,
        "livemode": false,
        "metadata": {},
        "payment_intent": intent_id_of(&charge.id),
        "payment_method_details": {"card": {"brand": "visa", "case_type": "chargeback", "network_reason_code": "10.4", "network": "visa"}, "type": "card"},
        "reason": "fraudulent",
        "status": status,
    }))
}

/// A list envelope.
pub(crate) fn list(url: &str, data: Vec<Value>, has_more: bool) -> Value {
    json!({"object": "list", "data": data, "has_more": has_more, "url": url})
}

/// An event object, as Stripe signs and sends it.
pub(crate) fn event(
    id: &str,
    kind: &str,
    created: i64,
    object: Value,
    idempotency_key: Option<&str>,
) -> Value {
    json!({
        "id": id,
        "object": "event",
        "api_version": API_VERSION,
        "created": created,
        "data": {"object": object},
        "livemode": false,
        "pending_webhooks": 1,
        "request": {"id": null, "idempotency_key": idempotency_key},
        "type": kind,
    })
}
