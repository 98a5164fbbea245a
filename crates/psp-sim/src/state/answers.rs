//! What the simulated provider answers: its refusals ([`SimError`], each with an HTTP status and
//! a stable code), the requests of its own protocol and their limits, and its replies.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use asiento_psp::provider::{ChargeStatus, OperationStatus};

/// Why a reversed refund failed, as card networks say it.
pub const REVERSAL_REASON: &str = "expired_or_canceled_card";
/// Why a capture that succeeded failed afterwards (the Adyen dialect's `capture failed`).
pub const CAPTURE_REVERSAL_REASON: &str = "capture_failed";
/// Why an operation failed by `POST /sim/operations/{id}/fail` failed.
pub const FAILED_ON_DEMAND_REASON: &str = "failed_on_demand";

/// The simulator refuses new charges beyond this many (it keeps everything
/// in memory).
pub const CHARGES_MAX: usize = 1_000_000;
/// `GET /sim/events` keeps the most recent events only.
pub const EVENTS_RECORDED_MAX: usize = 10_000;
/// Stripe's limits on metadata, so a client that passes here passes there.
pub const METADATA_KEYS_MAX: usize = 50;
pub const METADATA_KEY_LEN_MAX: usize = 40;
pub const METADATA_VALUE_LEN_MAX: usize = 500;
pub const REFERENCE_LEN_MAX: usize = 255;
pub const IDEMPOTENCY_KEY_LEN_MAX: usize = 255;

/// The payment methods and what they do.
pub const PM_CARD_OK: &str = "pm_card_ok";
pub const PM_CARD_DECLINED: &str = "pm_card_declined";
pub const PM_CARD_TIMEOUT: &str = "pm_card_timeout";
pub const PM_REDIRECT: &str = "pm_redirect";
pub const PM_CARD_SLOW: &str = "pm_card_slow";

/// A request the simulator refuses, with its HTTP status and stable code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error("the Idempotency-Key header is required")]
    IdempotencyKeyMissing,
    #[error("the Idempotency-Key must be 1-{IDEMPOTENCY_KEY_LEN_MAX} printable ASCII characters")]
    IdempotencyKeyInvalid,
    #[error("this Idempotency-Key was used with a different request")]
    IdempotencyKeyReused,
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("amount_minor must be positive")]
    AmountMustBePositive,
    #[error("currency must be a three-letter upper-case code")]
    CurrencyInvalid,
    #[error("unknown payment method {0:?}")]
    PaymentMethodUnknown(String),
    #[error("no such charge")]
    ChargeNotFound,
    #[error("the charge is {0:?}, not requires_capture")]
    ChargeNotCapturable(ChargeStatus),
    #[error("the capture exceeds the authorized amount")]
    CaptureExceedsAuthorized,
    #[error("the charge has nothing captured to refund")]
    ChargeNotRefundable,
    #[error("the refund exceeds the captured amount minus what was refunded")]
    RefundExceedsCaptured,
    #[error("the charge has a dispute")]
    ChargeDisputed,
    #[error("the charge is not waiting for a customer action")]
    ChargeNotAwaitingAction,
    #[error("the charge has no open dispute")]
    DisputeNotOpen,
    #[error("the charge is {0:?}; only an authorisation or a charge waiting for the customer can be canceled")]
    ChargeNotCancelable(ChargeStatus),
    #[error("a capture of this charge is still pending")]
    CapturePending,
    #[error("no such operation")]
    OperationNotFound,
    #[error("the operation is {0:?}; only a pending operation or a succeeded refund can fail")]
    OperationNotFailable(OperationStatus),
    #[error("a request with this Idempotency-Key is still running; retry later")]
    IdempotencyKeyInUse,
    #[error("the provider is unreachable")]
    Unreachable,
    /// A route this provider does not have (`lookup_disabled`): a bare 404
    /// with no code, as a web server answers.
    #[error("not found")]
    NoSuchRoute,
    #[error("`from` must be before `to`")]
    WindowInvalid,
    #[error("the simulator holds {CHARGES_MAX} charges already")]
    CapacityExhausted,
    #[error("simulated provider error")]
    Simulated,
}

impl SimError {
    pub fn status(&self) -> StatusCode {
        match self {
            SimError::IdempotencyKeyMissing
            | SimError::IdempotencyKeyInvalid
            | SimError::InvalidRequest(_)
            | SimError::AmountMustBePositive
            | SimError::CurrencyInvalid
            | SimError::PaymentMethodUnknown(_)
            | SimError::WindowInvalid => StatusCode::BAD_REQUEST,
            SimError::ChargeNotFound | SimError::OperationNotFound | SimError::NoSuchRoute => {
                StatusCode::NOT_FOUND
            }
            // 400, as Stripe's `charge_already_captured`: 409 is kept for a
            // key in use, which a client retries.
            SimError::ChargeNotCapturable(_)
            | SimError::ChargeNotRefundable
            | SimError::ChargeDisputed
            | SimError::ChargeNotAwaitingAction
            | SimError::DisputeNotOpen
            | SimError::ChargeNotCancelable(_)
            | SimError::CapturePending
            | SimError::OperationNotFailable(_) => StatusCode::BAD_REQUEST,
            SimError::IdempotencyKeyInUse => StatusCode::CONFLICT,
            SimError::Unreachable => StatusCode::SERVICE_UNAVAILABLE,
            SimError::IdempotencyKeyReused
            | SimError::CaptureExceedsAuthorized
            | SimError::RefundExceedsCaptured => StatusCode::UNPROCESSABLE_ENTITY,
            SimError::CapacityExhausted => StatusCode::SERVICE_UNAVAILABLE,
            SimError::Simulated => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable code; `None` for a bare 404 of a route that does not
    /// exist, whose body carries none.
    pub fn code(&self) -> Option<&'static str> {
        Some(match self {
            SimError::IdempotencyKeyMissing => "idempotency_key_missing",
            SimError::IdempotencyKeyInvalid => "idempotency_key_invalid",
            SimError::IdempotencyKeyReused => "idempotency_key_reused",
            SimError::InvalidRequest(_) => "invalid_request",
            SimError::AmountMustBePositive => "amount_must_be_positive",
            SimError::CurrencyInvalid => "currency_invalid",
            SimError::PaymentMethodUnknown(_) => "payment_method_unknown",
            SimError::ChargeNotFound => asiento_psp::client::CODE_RESOURCE_MISSING,
            SimError::ChargeNotCapturable(_) => "charge_not_capturable",
            SimError::CaptureExceedsAuthorized => "capture_exceeds_authorized",
            SimError::ChargeNotRefundable => "charge_not_refundable",
            SimError::RefundExceedsCaptured => "refund_exceeds_captured",
            SimError::ChargeDisputed => "charge_disputed",
            SimError::ChargeNotAwaitingAction => "charge_not_awaiting_action",
            SimError::DisputeNotOpen => "dispute_not_open",
            SimError::WindowInvalid => "window_invalid",
            SimError::CapacityExhausted => "capacity_exhausted",
            SimError::Simulated => "simulated_error",
            SimError::ChargeNotCancelable(_) => "charge_not_cancelable",
            SimError::CapturePending => "capture_pending",
            SimError::OperationNotFound => asiento_psp::client::CODE_RESOURCE_MISSING,
            SimError::OperationNotFailable(_) => "operation_not_failable",
            SimError::IdempotencyKeyInUse => "idempotency_key_in_use",
            SimError::Unreachable => "provider_unreachable",
            SimError::NoSuchRoute => return None,
        })
    }

    /// Stripe's error families: the caller's fault or the provider's.
    pub fn kind(&self) -> &'static str {
        if self.status().is_server_error() {
            "api_error"
        } else {
            "invalid_request_error"
        }
    }
}

/// `POST /v1/charges`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateChargeRequest {
    pub amount_minor: i64,
    pub currency: String,
    pub payment_method: String,
    #[serde(default = "default_true")]
    pub capture: bool,
    #[serde(default)]
    pub reference: Option<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

fn default_true() -> bool {
    true
}

/// `POST /v1/charges/{id}/capture`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureRequest {
    #[serde(default)]
    pub amount_minor: Option<i64>,
}

/// `POST /v1/charges/{id}/cancel`: no parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {}

/// `POST /v1/refunds`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefundRequest {
    pub charge: String,
    pub amount_minor: i64,
}

/// How the answer to a successful call is held back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AnswerDelay {
    None,
    /// `pm_card_slow`: `slow_ms`.
    Slow,
    /// `pm_card_timeout`: `hang_ms`, longer than any client waits.
    Hang,
}

/// A successful answer, ready to be sent.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: StatusCode,
    pub body: Bytes,
    pub replayed: bool,
    pub delay: AnswerDelay,
}

impl Reply {
    pub(super) fn json(value: &impl Serialize) -> Reply {
        Reply {
            status: StatusCode::OK,
            body: to_bytes(value),
            replayed: false,
            delay: AnswerDelay::None,
        }
    }
}

pub(super) fn to_bytes(value: &impl Serialize) -> Bytes {
    // Our own plain structs always serialize.
    Bytes::from(serde_json::to_vec(value).expect("simulator objects always serialize"))
}

pub(super) fn check_create(req: &CreateChargeRequest) -> Result<(), SimError> {
    if req.amount_minor <= 0 {
        return Err(SimError::AmountMustBePositive);
    }
    let currency_ok =
        req.currency.len() == 3 && req.currency.bytes().all(|b| b.is_ascii_uppercase());
    if !currency_ok {
        return Err(SimError::CurrencyInvalid);
    }
    if ![
        PM_CARD_OK,
        PM_CARD_DECLINED,
        PM_CARD_TIMEOUT,
        PM_REDIRECT,
        PM_CARD_SLOW,
    ]
    .contains(&req.payment_method.as_str())
    {
        return Err(SimError::PaymentMethodUnknown(req.payment_method.clone()));
    }
    if req
        .reference
        .as_ref()
        .is_some_and(|r| r.len() > REFERENCE_LEN_MAX)
    {
        return Err(SimError::InvalidRequest(format!(
            "reference is longer than {REFERENCE_LEN_MAX}"
        )));
    }
    let metadata_ok = req.metadata.len() <= METADATA_KEYS_MAX
        && req
            .metadata
            .iter()
            .all(|(k, v)| k.len() <= METADATA_KEY_LEN_MAX && v.len() <= METADATA_VALUE_LEN_MAX);
    if !metadata_ok {
        return Err(SimError::InvalidRequest(format!(
            "metadata allows {METADATA_KEYS_MAX} keys of {METADATA_KEY_LEN_MAX} and values of {METADATA_VALUE_LEN_MAX} characters"
        )));
    }
    Ok(())
}
