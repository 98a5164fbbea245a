//! The write routes (ⓘ in API.md): every one needs an `Idempotency-Key`, is answered from the
//! key's record when the key was seen before, and otherwise parses its body into domain types and
//! hands it to a use case of `asiento_app`.

use asiento_app::idempotency::{
    canonical_body_hash, IdempotencyKey, KeyError, Scope, StoredResponse,
};
use asiento_app::ledger::NewTransfer;
use asiento_app::payments::{FlowError, Idempotent, NewPayment};
use asiento_app::reply::Answer;
use asiento_domain::{
    CaptureMode, CustomerId, HoldAction, PaymentId, ProviderName, TenantId, TransferId,
};
use axum::{
    extract::{Path, State},
    http::{header, HeaderMap, HeaderValue, Method, StatusCode},
    response::{IntoResponse, Response},
};
use serde_json::{Map, Value};

use crate::auth::AuthenticatedTenant;
use crate::body::{Fields, JsonObject};
use crate::problem::{Problem, PROBLEM_CONTENT_TYPE};
use crate::{request_id, AppState};

/// The header API.md names.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
/// Set on every answer replayed from an idempotency record.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// The longest payment method name a client may send.
pub const PAYMENT_METHOD_CHARS_MAX: usize = 128;

/// Reads and validates the `Idempotency-Key` header, and fingerprints the body.
pub(crate) fn idempotent(
    headers: &HeaderMap,
    tenant: &TenantId,
    method: &Method,
    route: String,
    body: &Map<String, Value>,
) -> Result<Idempotent, Problem> {
    let raw = headers.get(IDEMPOTENCY_KEY_HEADER).ok_or_else(|| {
        Problem::bad_request(
            "idempotency_key_missing",
            "this route needs an Idempotency-Key header",
        )
    })?;
    let text = raw
        .to_str()
        .map_err(|_| key_problem(&KeyError::NotPrintableAscii))?;
    let key = IdempotencyKey::parse(text).map_err(|error| key_problem(&error))?;
    Ok(Idempotent {
        scope: Scope {
            tenant: tenant.to_string(),
            method: method.as_str().to_owned(),
            route,
        },
        key,
        body: canonical_body_hash(&Value::Object(body.clone())),
        correlation_id: request_id(headers),
    })
}

fn key_problem(error: &KeyError) -> Problem {
    Problem::bad_request("idempotency_key_invalid", error.to_string())
}

pub(crate) fn tenant_id(tenant: &AuthenticatedTenant) -> Result<TenantId, Problem> {
    TenantId::parse(&tenant.0).map_err(|error| Problem::internal(&error))
}

/// Turns a use case's answer into the HTTP response; replays carry `Idempotent-Replayed: true`.
pub fn answer_response(answer: Result<Answer, FlowError>) -> Response {
    match answer {
        Ok(Answer::Done(stored)) => stored_response(stored, false),
        Ok(Answer::Replayed(stored)) => stored_response(stored, true),
        Ok(Answer::InProgress { retry_after_s }) => Problem::new(
            StatusCode::CONFLICT,
            "idempotency_request_in_progress",
            "a request with this Idempotency-Key is still being processed",
        )
        .with_retry_after(retry_after_s)
        .into_response(),
        Ok(Answer::KeyReused) => Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            "this Idempotency-Key was used with a different request body",
        )
        .into_response(),
        // Nothing was written and the key is free: the same request may be sent again.
        Err(error @ FlowError::Contended(_)) => {
            tracing::warn!(%error, "a ledger command gave up on busy accounts");
            Problem::new(
                StatusCode::CONFLICT,
                "account_busy",
                "other requests kept changing these accounts while this one was decided; \
                 nothing was done; retry with the same Idempotency-Key",
            )
            .with_retry_after(1)
            .into_response()
        }
        Err(error) => Problem::server(&error).into_response(),
    }
}

fn stored_response(stored: StoredResponse, replayed: bool) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let content_type = if status.is_client_error() || status.is_server_error() {
        PROBLEM_CONTENT_TYPE
    } else {
        "application/json"
    };
    let mut response = (status, stored.body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if replayed {
        headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    }
    response
}

/// `POST /v1/payments`
#[utoipa::path(
    post, path = "/v1/payments", tag = "payments", operation_id = "create_payment",
    params(("Idempotency-Key" = String, Header, description = "1-255 printable ASCII characters; scoped by tenant, method and route")),
    request_body = crate::openapi::CreatePaymentRequest,
    responses(
        (status = 201, description = "The provider answered (captured, authorized, failed or requires action)", body = crate::openapi::Payment),
        (status = 202, description = "The provider's answer is unknown: pending until a webhook or the reconciler settles it", body = crate::openapi::Payment),
        (status = 400, description = "Invalid body or key", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 409, description = "The key's first request is still in flight", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 422, description = "The key was used with another body", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn create_payment(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    method: Method,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, Problem> {
    let tenant = tenant_id(&tenant)?;
    let request = idempotent(&headers, &tenant, &method, "/v1/payments".to_owned(), &body)?;
    let fields = Fields(&body);
    fields.only(&[
        "amount_minor",
        "currency",
        "customer",
        "provider",
        "payment_method",
        "capture",
        "description",
        "metadata",
    ])?;
    let provider = match fields.optional_string("provider")? {
        None => ProviderName::parse("sim").map_err(|error| Problem::internal(&error))?,
        Some(name) => ProviderName::parse(name)
            .ok()
            .filter(|name| state.payments.providers().get(name).is_some())
            .ok_or_else(|| {
                Problem::bad_request("unknown_provider", format!("no provider named {name:?}"))
            })?,
    };
    let capture_mode = match fields.optional_string("capture")? {
        None | Some("automatic") => CaptureMode::Automatic,
        Some("manual") => CaptureMode::Manual,
        Some(other) => {
            return Err(Problem::bad_request(
                "invalid_field",
                format!("capture must be \"automatic\" or \"manual\", got {other:?}"),
            ))
        }
    };
    let payment_method = fields.string("payment_method")?;
    if payment_method.is_empty() || payment_method.chars().count() > PAYMENT_METHOD_CHARS_MAX {
        return Err(Problem::bad_request(
            "invalid_field",
            format!("payment_method must be 1 to {PAYMENT_METHOD_CHARS_MAX} characters"),
        ));
    }
    let customer = CustomerId::parse(fields.string("customer")?)
        .map_err(|error| Problem::bad_request("invalid_customer", error.to_string()))?;
    let payment = NewPayment {
        tenant,
        amount: fields.positive_amount("amount_minor", state.amount_limit)?,
        currency: fields.currency("currency")?,
        customer,
        provider,
        payment_method: payment_method.to_owned(),
        capture_mode,
        description: fields.optional_string("description")?.map(str::to_owned),
        metadata: fields.optional_object("metadata")?.unwrap_or_default(),
    };
    Ok(answer_response(
        state.payments.create(&request, payment).await,
    ))
}

/// A payment id from the path; a malformed one names no payment the tenant can see.
pub fn payment_id(raw: &str) -> Result<PaymentId, Problem> {
    PaymentId::parse(raw).map_err(|_| {
        Problem::new(
            StatusCode::NOT_FOUND,
            "payment_not_found",
            "payment not found",
        )
    })
}

/// `POST /v1/payments/{id}/capture`
#[utoipa::path(
    post, path = "/v1/payments/{id}/capture", tag = "payments", operation_id = "capture_payment",
    params(("id" = String, Path, description = "pay_…"), ("Idempotency-Key" = String, Header, description = "1-255 printable ASCII characters; scoped by tenant, method and route")),
    request_body = crate::openapi::CaptureRequest,
    responses(
        (status = 200, description = "Captured", body = crate::openapi::Payment),
        (status = 202, description = "The provider's answer is unknown", body = crate::openapi::Payment),
        (status = 404, description = "No such payment for this tenant", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 409, description = "invalid_transition, or the key is in flight", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 422, description = "capture_exceeds_authorized, or the key was reused", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn capture_payment(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(raw_id): Path<String>,
    method: Method,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, Problem> {
    let tenant = tenant_id(&tenant)?;
    let id = payment_id(&raw_id)?;
    let route = format!("/v1/payments/{id}/capture");
    let request = idempotent(&headers, &tenant, &method, route, &body)?;
    let fields = Fields(&body);
    fields.only(&["amount_minor"])?;
    let amount = fields.optional_positive_amount("amount_minor", state.amount_limit)?;
    Ok(answer_response(
        state.payments.capture(&request, &tenant, id, amount).await,
    ))
}

/// `POST /v1/payments/{id}/cancel`
#[utoipa::path(
    post, path = "/v1/payments/{id}/cancel", tag = "payments", operation_id = "cancel_payment",
    params(("id" = String, Path, description = "pay_…"), ("Idempotency-Key" = String, Header, description = "1-255 printable ASCII characters; scoped by tenant, method and route")),
    request_body = crate::openapi::CancelRequest,
    responses(
        (status = 200, description = "Canceled: the authorization is released", body = crate::openapi::Payment),
        (status = 202, description = "The provider's answer is unknown or pending (or a capture sent before the cancel may still win): the reconciler drives it to an end", body = crate::openapi::Payment),
        (status = 404, description = "No such payment for this tenant", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 409, description = "invalid_transition (only an authorized payment can be canceled), or the key is in flight", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 422, description = "cancel_refused (the provider refused it; nothing changed), or the key was reused", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn cancel_payment(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(raw_id): Path<String>,
    method: Method,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, Problem> {
    let tenant = tenant_id(&tenant)?;
    let id = payment_id(&raw_id)?;
    let route = format!("/v1/payments/{id}/cancel");
    let request = idempotent(&headers, &tenant, &method, route, &body)?;
    Fields(&body).only(&[])?;
    Ok(answer_response(
        state.payments.cancel(&request, &tenant, id).await,
    ))
}

/// `POST /v1/payments/{id}/refunds`
#[utoipa::path(
    post, path = "/v1/payments/{id}/refunds", tag = "payments", operation_id = "refund_payment",
    params(("id" = String, Path, description = "pay_…"), ("Idempotency-Key" = String, Header, description = "1-255 printable ASCII characters; scoped by tenant, method and route")),
    request_body = crate::openapi::RefundRequest,
    responses(
        (status = 201, description = "Refunded", body = crate::openapi::Payment),
        (status = 202, description = "The provider's answer is unknown", body = crate::openapi::Payment),
        (status = 404, description = "No such payment for this tenant", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 409, description = "invalid_transition, or the key is in flight", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 422, description = "refund_exceeds_captured, or the key was reused", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn refund_payment(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(raw_id): Path<String>,
    method: Method,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, Problem> {
    let tenant = tenant_id(&tenant)?;
    let id = payment_id(&raw_id)?;
    let route = format!("/v1/payments/{id}/refunds");
    let request = idempotent(&headers, &tenant, &method, route, &body)?;
    let fields = Fields(&body);
    fields.only(&["amount_minor"])?;
    let amount = fields.positive_amount("amount_minor", state.amount_limit)?;
    Ok(answer_response(
        state.payments.refund(&request, &tenant, id, amount).await,
    ))
}

/// `POST /v1/transfers`
#[utoipa::path(
    post, path = "/v1/transfers", tag = "ledger", operation_id = "create_transfer",
    params(("Idempotency-Key" = String, Header, description = "1-255 printable ASCII characters; scoped by tenant, method and route")),
    request_body = crate::openapi::TransferRequest,
    responses(
        (status = 201, description = "Posted", body = crate::openapi::Transfer),
        (status = 400, description = "Invalid body, account or key", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 409, description = "The key's first request is still in flight, or account_busy (nothing done; retry with the same key after Retry-After)", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 422, description = "insufficient_funds, or the key was reused", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn create_transfer(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    method: Method,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, Problem> {
    let tenant = tenant_id(&tenant)?;
    let request = idempotent(
        &headers,
        &tenant,
        &method,
        "/v1/transfers".to_owned(),
        &body,
    )?;
    let transfer = new_transfer(&state, &tenant, &body)?;
    Ok(answer_response(
        state.ledger.transfer(&request, transfer).await,
    ))
}

/// A transfer's fields, as `POST /v1/transfers` takes them (and each of a batch's).
fn new_transfer(
    state: &AppState,
    tenant: &TenantId,
    body: &serde_json::Map<String, serde_json::Value>,
) -> Result<NewTransfer, Problem> {
    let fields = Fields(body);
    fields.only(&[
        "from",
        "to",
        "amount_minor",
        "currency",
        "description",
        "pending",
        "expires_at",
    ])?;
    Ok(NewTransfer {
        tenant: tenant.clone(),
        from: fields.account("from")?,
        to: fields.account("to")?,
        amount: fields.positive_amount("amount_minor", state.amount_limit)?,
        currency: fields.currency("currency")?,
        description: fields.optional_string("description")?.map(str::to_owned),
        pending: fields.flag("pending")?,
        expires_at: fields.optional_time("expires_at")?,
    })
}

/// `POST /v1/transfers/batch`
#[utoipa::path(
    post, path = "/v1/transfers/batch", tag = "ledger", operation_id = "create_transfer_batch",
    params(("Idempotency-Key" = String, Header, description = "1-255 printable ASCII characters; scoped by tenant, method and route")),
    request_body = crate::openapi::TransferBatchRequest,
    responses(
        (status = 201, description = "Every transfer written, in the batch's order", body = crate::openapi::TransferBatch),
        (status = 400, description = "Invalid body (a field of one transfer names its index: `transfers[3].amount_minor`), account or key", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 409, description = "The key's first request is still in flight, or account_busy (nothing done; retry with the same key after Retry-After)", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 422, description = "A transfer refused (insufficient_funds, account_frozen …; `index` names the first): nothing written; or the key was reused", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn create_transfer_batch(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    method: Method,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, Problem> {
    let tenant = tenant_id(&tenant)?;
    let request = idempotent(
        &headers,
        &tenant,
        &method,
        "/v1/transfers/batch".to_owned(),
        &body,
    )?;
    let fields = Fields(&body);
    fields.only(&["transfers"])?;
    let Some(serde_json::Value::Array(items)) = body.get("transfers") else {
        return Err(Problem::bad_request(
            "invalid_field",
            "transfers must be an array of transfers",
        ));
    };
    let max = asiento_domain::transfer_batch::BATCH_TRANSFERS_MAX;
    if items.is_empty() || items.len() > max {
        return Err(Problem::bad_request(
            "invalid_field",
            format!("transfers holds 1 to {max} transfers, not {}", items.len()),
        ));
    }
    let mut transfers = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let serde_json::Value::Object(item) = item else {
            return Err(Problem::bad_request(
                "invalid_field",
                format!("transfers[{index}] must be a JSON object"),
            ));
        };
        let transfer = new_transfer(&state, &tenant, item).map_err(|problem| Problem {
            detail: format!("transfers[{index}]: {}", problem.detail),
            index: u32::try_from(index).ok(),
            ..problem
        })?;
        transfers.push(transfer);
    }
    Ok(answer_response(
        state.ledger.transfer_batch(&request, transfers).await,
    ))
}

pub fn transfer_not_found() -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        "transfer_not_found",
        "transfer not found",
    )
}

pub fn transfer_id(raw: &str) -> Result<TransferId, Problem> {
    TransferId::parse(raw).map_err(|_| transfer_not_found())
}

/// `POST /v1/transfers/{id}/post`
#[utoipa::path(
    post, path = "/v1/transfers/{id}/post", tag = "ledger", operation_id = "post_hold",
    params(("id" = String, Path, description = "tr_…, a hold"), ("Idempotency-Key" = String, Header, description = "1-255 printable ASCII characters; scoped by tenant, method and route")),
    request_body = crate::openapi::PostHoldRequest,
    responses(
        (status = 200, description = "Posted: the amount moved, the rest of the hold released", body = crate::openapi::Transfer),
        (status = 404, description = "transfer_not_found", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 409, description = "not_a_hold, hold_posted, hold_voided, hold_expired, account_busy (nothing done; retry with the same key after Retry-After), or the key is in flight", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 422, description = "amount_exceeds_hold, account_frozen, or the key was reused", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn post_hold(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(raw_id): Path<String>,
    method: Method,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, Problem> {
    let request = HoldRequest {
        tenant,
        raw_id,
        method,
        headers,
        body,
    };
    end_hold(&state, request, "post", |fields| {
        fields.only(&["amount_minor"])?;
        let amount = fields.optional_positive_amount("amount_minor", state.amount_limit)?;
        Ok(HoldAction::Post { amount })
    })
    .await
}

/// `POST /v1/transfers/{id}/void`
#[utoipa::path(
    post, path = "/v1/transfers/{id}/void", tag = "ledger", operation_id = "void_hold",
    params(("id" = String, Path, description = "tr_…, a hold"), ("Idempotency-Key" = String, Header, description = "1-255 printable ASCII characters; scoped by tenant, method and route")),
    responses(
        (status = 200, description = "Voided: the whole hold released", body = crate::openapi::Transfer),
        (status = 404, description = "transfer_not_found", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 409, description = "not_a_hold, hold_posted, hold_voided, hold_expired, account_busy (nothing done; retry with the same key after Retry-After), or the key is in flight", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 422, description = "The key was reused", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn void_hold(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(raw_id): Path<String>,
    method: Method,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, Problem> {
    let request = HoldRequest {
        tenant,
        raw_id,
        method,
        headers,
        body,
    };
    end_hold(&state, request, "void", |fields| {
        fields.only(&[])?;
        Ok(HoldAction::Void)
    })
    .await
}

/// A request to end a hold, as its route received it.
struct HoldRequest {
    tenant: AuthenticatedTenant,
    raw_id: String,
    method: Method,
    headers: HeaderMap,
    body: Map<String, Value>,
}

/// `POST /v1/transfers/{id}/{verb}`: the key, then the body as `action` reads it.
async fn end_hold(
    state: &AppState,
    request: HoldRequest,
    verb: &str,
    action: impl FnOnce(&Fields<'_>) -> Result<HoldAction, Problem>,
) -> Result<Response, Problem> {
    let tenant = tenant_id(&request.tenant)?;
    let id = transfer_id(&request.raw_id)?;
    let idempotent = idempotent(
        &request.headers,
        &tenant,
        &request.method,
        format!("/v1/transfers/{id}/{verb}"),
        &request.body,
    )?;
    let action = action(&Fields(&request.body))?;
    Ok(answer_response(
        state
            .ledger
            .settle_hold(&idempotent, &tenant, id, action)
            .await,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_command_that_kept_losing_races_is_a_409_to_retry_never_a_500() {
        let response = answer_response(Err(FlowError::Contended("hold tr_x".into())));
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(
            response
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|value| value.to_str().ok()),
            Some("1")
        );
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("body");
        let problem: Value = serde_json::from_slice(&bytes).expect("problem json");
        assert_eq!(problem["code"], "account_busy");
    }
}
