//! The simulator's Adyen dialect (`psp-sim --dialect adyen`): the same charge model, faults and
//! truth routes, answering at Adyen's Checkout v71 paths in Adyen's wire format
//! (`asiento_psp::adyen::wire`), with Adyen's idempotency and its standard notifications, so that
//! asiento's Adyen adapter and webhook receiver can be tested against it. Its answers and
//! notifications are checked against Adyen's published OpenAPI schemas in
//! `tests/adyen_dialect.rs`.
//!
//! What it does:
//! - `POST /v71/payments` ([`payments`]): the outcome comes from Adyen's test triggers in
//!   `paymentMethod.holderName`, or from `paymentMethod.storedPaymentMethodId` naming one of the
//!   simulator's own test methods (`pm_card_ok`, `pm_card_declined`, `pm_card_timeout`,
//!   `pm_card_slow`, `pm_redirect`, and `pm_capture_fails`, `pm_refund_fails` for late failures). A refusal is an HTTP 200 with `resultCode: "Refused"`.
//!   Capture is automatic unless `additionalData.manualCapture` is `"true"`.
//! - `POST /v71/payments/{pspReference}/captures`, `/refunds`, `/cancels` and `POST
//!   /v71/cancels` (by our reference) ([`modifications`]): each answers 201 `received` with its
//!   own pspReference; the outcome comes only by notification, `modification_delay_ms` later.
//! - Notifications ([`notifications`]): every change is an item of Adyen's
//!   `NotificationRequest`, each signed on its own with the HMAC key (`hmacSignature`); the
//!   dispatcher batches the items ready at once (at most [`BATCH_ITEMS_MAX`] items and
//!   [`BATCH_BYTES_MAX`] bytes a batch) and sends them with basic auth.
//! - Idempotency ([`idempotency`]) as Adyen documents it: `Idempotency-Key` (at most 64
//!   characters) on every write, the first answer replayed byte for byte, the key echoed in
//!   `idempotency-key`, 422 `704` with `transient-error: true` while the key's first request
//!   still runs, keys kept for the simulator's life.
//! - Reports ([`reports`], [`downloads`]): the daily Payment accounting report and Settlement
//!   details batches, generated from the items it sends, served behind the report user's basic
//!   auth and announced by REPORT_AVAILABLE.
//! - Auth: any non-empty `X-API-Key`, else 401; every body names a non-empty `merchantAccount`.
//!   A body field that Adyen's schema does not have is a 422 `702`, as Adyen answers it.
//!
//! What it does not do: there is no lookup of any kind (no GET of a payment, by pspReference,
//! by reference or by key: a GET on `/v71/payments/…` is a 404 or 405, as at Adyen); no
//! `/payments/details`, `/reversals`, sessions or payment links; `captureDelayHours` above 0 is
//! captured at once;
//! and the dialect is served standalone only (the mounted simulator speaks the simulator's own
//! protocol).

mod book;
mod downloads;
mod idempotency;
mod later;
mod modifications;
mod notifications;
mod payments;
mod reports;

use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{Map, Value};

pub(crate) use book::AdyenBook;
pub(crate) use downloads::control_routes;
pub(crate) use later::{run_later, Later};
pub(crate) use notifications::{batches, notifications};
pub(crate) use reports::journal;

use super::routes::{provider_call, REPLAYED_HEADER};
use super::state::{Reply, SimError, SimState};
use super::Simulator;
use asiento_psp::adyen::wire::{ServiceError, TRANSIENT_ERROR_HEADER};

/// The header of Adyen's API key.
pub const API_KEY_HEADER: &str = "X-API-Key";
/// Notification items per batch at most.
pub const BATCH_ITEMS_MAX: usize = 100;
/// Bytes per batch at most: well under asiento's webhook body limit (64 KiB), which 100 dispute
/// items (each with its reason code, status and defence period) would pass.
pub const BATCH_BYTES_MAX: usize = 48 * 1024;

/// Adyen's routes; any other path is a 404 `ServiceError`, and another method on these a 405.
pub(super) fn routes() -> Router<Simulator> {
    Router::new()
        .route("/v71/payments", post(payments::create))
        .route(
            "/v71/payments/{psp_reference}/captures",
            post(modifications::capture),
        )
        .route(
            "/v71/payments/{psp_reference}/refunds",
            post(modifications::refund),
        )
        .route(
            "/v71/payments/{psp_reference}/cancels",
            post(modifications::cancel),
        )
        .route("/v71/cancels", post(modifications::cancel_by_reference))
        .route(
            "/reports/download/MerchantAccount/{merchant}/{file}",
            axum::routing::get(downloads::download),
        )
        .fallback(no_route)
}

async fn no_route(_method: Method, _uri: Uri) -> Response {
    AdyenError {
        status: StatusCode::NOT_FOUND,
        code: "000",
        message: "HTTP Status Response - Not Found".to_owned(),
        kind: "validation",
        transient: false,
    }
    .into_response()
}

/// An answer that is not a success: Adyen's `ServiceError`, with `transient-error: true` when
/// the same request is worth sending again later under the same key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AdyenError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// `errorType`: `validation`, `security`, `internal`.
    pub kind: &'static str,
    pub transient: bool,
}

impl AdyenError {
    /// A 422 of the request's content.
    pub fn validation(code: &'static str, message: impl Into<String>) -> AdyenError {
        AdyenError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code,
            message: message.into(),
            kind: "validation",
            transient: false,
        }
    }

    /// A required field the body lacks (Adyen's structure error).
    pub fn missing(field: &str) -> AdyenError {
        AdyenError::validation("702", format!("Required field '{field}' is not provided."))
    }

    /// A field of the wrong type.
    pub fn invalid(field: &str, expected: &str) -> AdyenError {
        AdyenError::validation("702", format!("The field '{field}' must be {expected}."))
    }

    /// A modification of a payment this merchant account does not have.
    pub fn original_reference_required() -> AdyenError {
        AdyenError::validation("167", "Original pspReference required for this operation")
    }

    fn unauthorized() -> AdyenError {
        AdyenError {
            status: StatusCode::UNAUTHORIZED,
            code: "000",
            message: "HTTP Status Response - Unauthorized".to_owned(),
            kind: "security",
            transient: false,
        }
    }

    pub fn service_error(&self) -> ServiceError {
        ServiceError {
            status: Some(i64::from(self.status.as_u16())),
            error_code: Some(self.code.to_owned()),
            message: Some(self.message.clone()),
            error_type: Some(self.kind.to_owned()),
            ..ServiceError::default()
        }
    }

    pub fn body(&self) -> axum::body::Bytes {
        axum::body::Bytes::from(
            serde_json::to_vec(&self.service_error()).expect("a ServiceError always serializes"),
        )
    }
}

impl From<SimError> for AdyenError {
    fn from(error: SimError) -> AdyenError {
        match error {
            SimError::IdempotencyKeyInUse => AdyenError {
                transient: true,
                ..AdyenError::validation(
                    asiento_psp::adyen::wire::ERROR_KEY_IN_PROGRESS,
                    "request already processed or in progress",
                )
            },
            SimError::Unreachable | SimError::CapacityExhausted => AdyenError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: "000",
                message: error.to_string(),
                kind: "internal",
                transient: true,
            },
            SimError::Simulated => AdyenError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                code: "000",
                message: "An internal error occurred".to_owned(),
                kind: "internal",
                transient: false,
            },
            SimError::ChargeNotFound => AdyenError::original_reference_required(),
            other => AdyenError::validation("702", other.to_string()),
        }
    }
}

impl IntoResponse for AdyenError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            self.body(),
        )
            .into_response();
        if self.transient {
            response
                .headers_mut()
                .insert(TRANSIENT_ERROR_HEADER, HeaderValue::from_static("true"));
        }
        response
    }
}

/// Any non-empty `X-API-Key`.
fn authorize(headers: &HeaderMap) -> Result<(), AdyenError> {
    let given = headers
        .get(API_KEY_HEADER)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|key| !key.trim().is_empty());
    if given {
        Ok(())
    } else {
        Err(AdyenError::unauthorized())
    }
}

/// The body as a JSON object.
fn object_of(body: &[u8]) -> Result<Map<String, Value>, AdyenError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(AdyenError::validation(
            "702",
            "The request body must be a JSON object.",
        )),
        Err(error) => Err(AdyenError::validation(
            "702",
            format!("Unable to parse the request body: {error}"),
        )),
    }
}

/// Refuses a field `schema` (the name of Adyen's request schema) does not have.
fn check_fields(
    object: &Map<String, Value>,
    allowed: &[&str],
    schema: &str,
) -> Result<(), AdyenError> {
    let unknown: Vec<&str> = object
        .keys()
        .map(String::as_str)
        .filter(|field| !allowed.contains(field))
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(AdyenError::validation(
            "702",
            format!(
                "Structure of {schema} contains the following unknown fields: [{}]",
                unknown.join(", ")
            ),
        ))
    }
}

/// The body's `merchantAccount`: required, non-empty.
fn merchant_account(object: &Map<String, Value>) -> Result<String, AdyenError> {
    match object.get("merchantAccount") {
        None | Some(Value::Null) => Err(AdyenError::missing("merchantAccount")),
        Some(Value::String(account)) if !account.trim().is_empty() => Ok(account.clone()),
        Some(_) => Err(AdyenError::invalid("merchantAccount", "a non-empty string")),
    }
}

/// An optional string field.
fn text(object: &Map<String, Value>, field: &str) -> Result<Option<String>, AdyenError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(value)) => Ok(Some(value.clone())),
        Some(_) => Err(AdyenError::invalid(field, "a string")),
    }
}

/// A write: authorized, its body read by `read` (a refusal there is never stored), keyed, then
/// through the simulator's faults and Adyen's idempotency layer.
async fn write_call<P>(
    sim: &Simulator,
    headers: &HeaderMap,
    body: &[u8],
    read: impl FnOnce(Map<String, Value>) -> Result<P, AdyenError>,
    op: impl FnOnce(&mut SimState, &str, P) -> Result<Reply, AdyenError>,
) -> Response {
    let echoed = idempotency::echoed_key(headers);
    let checked = authorize(headers).and_then(|()| {
        let key = idempotency::request_key(headers)?;
        let object = object_of(body)?;
        Ok((key, read(object)?))
    });
    let (key, params) = match checked {
        Ok(checked) => checked,
        Err(error) => return stamp(error.into_response(), echoed.as_deref()),
    };
    let response = provider_call(sim, Some(key.clone()), |state| {
        idempotency::stored_write(state, &key, |state| op(state, &key, params))
    })
    .await;
    stamp(response, echoed.as_deref())
}

/// Adds what every Adyen answer has: the key echoed; never the simulator's own replay marker.
fn stamp(mut response: Response, key: Option<&str>) -> Response {
    let headers = response.headers_mut();
    headers.remove(REPLAYED_HEADER);
    if let Some(value) = key.and_then(|key| HeaderValue::from_str(key).ok()) {
        headers.insert(idempotency::ECHO_HEADER, value);
    }
    response
}

/// An answer of the dialect's own.
fn reply(status: StatusCode, value: &impl serde::Serialize) -> Reply {
    Reply {
        status,
        body: axum::body::Bytes::from(
            serde_json::to_vec(value).expect("the dialect's answers always serialize"),
        ),
        replayed: false,
        delay: super::state::AnswerDelay::None,
    }
}

/// Reads the simulator's own JSON answer back.
fn decoded<T: serde::de::DeserializeOwned>(reply: &Reply) -> T {
    serde_json::from_slice(&reply.body).expect("the simulator decodes what it encoded")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_adyen_s_service_error() {
        let unauthorized = AdyenError::unauthorized();
        assert_eq!(
            String::from_utf8(unauthorized.body().to_vec()).unwrap(),
            r#"{"status":401,"errorCode":"000","message":"HTTP Status Response - Unauthorized","errorType":"security"}"#
        );
        let in_use = AdyenError::from(SimError::IdempotencyKeyInUse);
        assert_eq!(
            String::from_utf8(in_use.body().to_vec()).unwrap(),
            r#"{"status":422,"errorCode":"704","message":"request already processed or in progress","errorType":"validation"}"#
        );
        assert!(in_use.transient);
        let mut object = Map::new();
        object.insert("merchantAccount".into(), Value::from(""));
        assert_eq!(merchant_account(&object).unwrap_err().code, "702");
        object.insert("typo".into(), Value::from(1));
        let refused = check_fields(&object, &["merchantAccount"], "PaymentCancelRequest");
        assert!(refused.unwrap_err().message.contains("[typo]"));
    }
}
