//! A tenant's webhook endpoints (docs/API.md "Webhook endpoints"): `POST/GET
//! /v1/webhook_endpoints`, `GET/DELETE /v1/webhook_endpoints/{id}`, `POST …/{id}/rotate_secret`,
//! `POST …/{id}/enable`, `GET …/{id}/deliveries` and `POST …/{id}/deliveries/{delivery}/retry`.
//!
//! Another tenant's endpoint answers exactly like one that does not exist (404). A URL the
//! policy refuses is 422 `webhook_url_refused` and nothing is stored.

use asiento_outbound::endpoints::{self, PREVIOUS_SECRET_S_MAX};
use asiento_outbound::{deliveries, OutboundError};
use axum::{
    extract::{Path, State},
    http::{HeaderMap, Method, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde_json::{json, Value};

use crate::auth::AuthenticatedTenant;
use crate::body::{Fields, JsonObject};
use crate::commands::{idempotent, tenant_id};
use crate::problem::Problem;
use crate::AppState;

fn not_found() -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        "webhook_endpoint_not_found",
        "webhook endpoint not found",
    )
}

fn problem(error: OutboundError) -> Problem {
    match error {
        OutboundError::UrlRefused(refused) => Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "webhook_url_refused",
            refused.to_string(),
        ),
        OutboundError::Invalid(detail) => Problem::bad_request("invalid_field", detail),
        OutboundError::NotFound => not_found(),
        other => Problem::server(&other),
    }
}

/// Whether `raw` is `prefix` and a uuid's 32 lowercase hex digits, the only form the API gives
/// out (`we_…`, `wd_…`, `evt_…`). Anything else names nothing: it is answered 404 before it
/// reaches a query (PostgreSQL cannot even compare a text holding U+0000).
pub(crate) fn well_formed(raw: &str, prefix: &str) -> bool {
    raw.strip_prefix(prefix).is_some_and(|hex| {
        hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// An endpoint id from the path, or the 404 a malformed one answers.
fn endpoint_id(raw: &str) -> Result<&str, Problem> {
    if well_formed(raw, "we_") {
        Ok(raw)
    } else {
        Err(not_found())
    }
}

/// The tenant's endpoint, or the 404 another tenant's or an unknown one answers.
async fn found(
    state: &AppState,
    tenant: &AuthenticatedTenant,
    id: &str,
) -> Result<endpoints::Endpoint, Problem> {
    let id = endpoint_id(id)?;
    endpoints::find(&state.database, &tenant.0, id)
        .await
        .map_err(problem)?
        .ok_or_else(not_found)
}

fn answer(answer: asiento_app::reply::Answer) -> Response {
    crate::commands::answer_response(Ok(answer))
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// `POST /v1/webhook_endpoints`
#[utoipa::path(
    post, path = "/v1/webhook_endpoints", tag = "webhooks", operation_id = "create_webhook_endpoint",
    params(("Idempotency-Key" = String, Header, description = "1-255 printable ASCII characters")),
    request_body = crate::openapi::CreateWebhookEndpoint,
    responses(
        (status = 201, description = "The endpoint, with its signing secret (shown only here and on rotation)", body = crate::openapi::WebhookEndpoint),
        (status = 400, description = "invalid_field, idempotency_key_missing", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 422, description = "webhook_url_refused (scheme, address, name resolving to a private address), webhook_endpoints_limit", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn create(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    method: Method,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, Problem> {
    let tenant_id = tenant_id(&tenant)?;
    let request = idempotent(
        &headers,
        &tenant_id,
        &method,
        "/v1/webhook_endpoints".to_owned(),
        &body,
    )?;
    let fields = Fields(&body);
    fields.only(&["url", "enabled_events", "description"])?;
    let url = fields.string("url")?;
    let enabled_events = match body.get("enabled_events") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned))
            .collect::<Option<Vec<String>>>()
            .ok_or_else(|| {
                Problem::bad_request("invalid_field", "enabled_events must be a list of strings")
            })?,
        _ => {
            return Err(Problem::bad_request(
                "invalid_field",
                "enabled_events must be a list of event types, or [\"*\"]",
            ))
        }
    };
    let description = fields.optional_text("description", endpoints::DESCRIPTION_CHARS_MAX)?;
    let new = endpoints::check(&state.webhook_urls, url, enabled_events, description)
        .await
        .map_err(problem)?;
    let done = endpoints::create(&state.database, &tenant.0, &request, new, now_ms())
        .await
        .map_err(problem)?;
    Ok(answer(done))
}

/// `GET /v1/webhook_endpoints`
#[utoipa::path(
    get, path = "/v1/webhook_endpoints", tag = "webhooks", operation_id = "list_webhook_endpoints",
    responses((status = 200, description = "The tenant's endpoints, oldest first (no secrets)", body = crate::openapi::WebhookEndpointList))
)]
pub async fn list(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
) -> Result<Response, Problem> {
    let all = endpoints::list(&state.database, &tenant.0)
        .await
        .map_err(problem)?;
    let data: Vec<Value> = all.iter().map(|e| e.json(None)).collect();
    Ok(Json(json!({ "data": data })).into_response())
}

/// `GET /v1/webhook_endpoints/{id}`
#[utoipa::path(
    get, path = "/v1/webhook_endpoints/{id}", tag = "webhooks", operation_id = "get_webhook_endpoint",
    params(("id" = String, Path, description = "we_…")),
    responses(
        (status = 200, description = "The endpoint (no secret)", body = crate::openapi::WebhookEndpoint),
        (status = 404, description = "webhook_endpoint_not_found", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn get(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    let endpoint = found(&state, &tenant, &id).await?;
    Ok(Json(endpoint.json(None)).into_response())
}

/// `DELETE /v1/webhook_endpoints/{id}`
#[utoipa::path(
    delete, path = "/v1/webhook_endpoints/{id}", tag = "webhooks", operation_id = "delete_webhook_endpoint",
    params(("id" = String, Path, description = "we_…")),
    responses(
        (status = 200, description = "Deleted: nothing more is sent to it", body = Object),
        (status = 404, description = "webhook_endpoint_not_found", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn delete(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    endpoint_id(&id)?;
    if !endpoints::delete(&state.database, &tenant.0, &id)
        .await
        .map_err(problem)?
    {
        return Err(not_found());
    }
    Ok(Json(json!({"id": id, "object": "webhook_endpoint", "deleted": true})).into_response())
}

/// `POST /v1/webhook_endpoints/{id}/rotate_secret`
#[utoipa::path(
    post, path = "/v1/webhook_endpoints/{id}/rotate_secret", tag = "webhooks", operation_id = "rotate_webhook_endpoint_secret",
    params(
        ("id" = String, Path, description = "we_…"),
        ("Idempotency-Key" = String, Header, description = "1-255 printable ASCII characters")
    ),
    request_body = crate::openapi::RotateSecret,
    responses(
        (status = 200, description = "The endpoint with its new secret; the previous one stays valid for expire_previous_in_s", body = crate::openapi::WebhookEndpoint),
        (status = 404, description = "webhook_endpoint_not_found", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn rotate_secret(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    method: Method,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonObject(body): JsonObject,
) -> Result<Response, Problem> {
    let tenant_id = tenant_id(&tenant)?;
    endpoint_id(&id)?;
    let request = idempotent(
        &headers,
        &tenant_id,
        &method,
        format!("/v1/webhook_endpoints/{id}/rotate_secret"),
        &body,
    )?;
    Fields(&body).only(&["expire_previous_in_s"])?;
    // Null is absent, as for every other optional field.
    let previous_valid_s = match body.get("expire_previous_in_s").filter(|v| !v.is_null()) {
        None => 24 * 3_600,
        Some(value) => value
            .as_i64()
            .filter(|s| (0..=PREVIOUS_SECRET_S_MAX).contains(s))
            .ok_or_else(|| {
                Problem::bad_request(
                    "invalid_field",
                    format!("expire_previous_in_s must be 0 to {PREVIOUS_SECRET_S_MAX}"),
                )
            })?,
    };
    let done = endpoints::rotate(
        &state.database,
        &tenant.0,
        &id,
        &request,
        previous_valid_s,
        now_ms(),
    )
    .await
    .map_err(problem)?;
    Ok(answer(done))
}

/// `POST /v1/webhook_endpoints/{id}/enable`
#[utoipa::path(
    post, path = "/v1/webhook_endpoints/{id}/enable", tag = "webhooks", operation_id = "enable_webhook_endpoint",
    params(("id" = String, Path, description = "we_…")),
    responses(
        (status = 200, description = "Enabled again (a disabled endpoint's waiting deliveries go out)", body = crate::openapi::WebhookEndpoint),
        (status = 404, description = "webhook_endpoint_not_found", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn enable(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    endpoint_id(&id)?;
    let endpoint = endpoints::enable(&state.database, &tenant.0, &id)
        .await
        .map_err(problem)?
        .ok_or_else(not_found)?;
    Ok(Json(endpoint.json(None)).into_response())
}

/// `GET /v1/webhook_endpoints/{id}/deliveries`
#[utoipa::path(
    get, path = "/v1/webhook_endpoints/{id}/deliveries", tag = "webhooks", operation_id = "list_webhook_deliveries",
    params(("id" = String, Path, description = "we_…")),
    responses(
        (status = 200, description = "The most recent 100 deliveries, newest event first, each with every attempt", body = Object),
        (status = 404, description = "webhook_endpoint_not_found", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn list_deliveries(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    found(&state, &tenant, &id).await?;
    let data = deliveries::list(&state.database, &id)
        .await
        .map_err(problem)?;
    Ok(Json(json!({ "data": data })).into_response())
}

/// `POST /v1/webhook_endpoints/{id}/deliveries/{delivery_id}/retry`
#[utoipa::path(
    post, path = "/v1/webhook_endpoints/{id}/deliveries/{delivery_id}/retry", tag = "webhooks", operation_id = "retry_webhook_delivery",
    params(
        ("id" = String, Path, description = "we_…"),
        ("delivery_id" = String, Path, description = "wd_…")
    ),
    responses(
        (status = 202, description = "Sent again now (a given-up delivery too)", body = Object),
        (status = 404, description = "webhook_endpoint_not_found, webhook_delivery_not_found", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn retry_delivery(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path((id, delivery)): Path<(String, String)>,
) -> Result<Response, Problem> {
    found(&state, &tenant, &id).await?;
    let delivery_not_found = || {
        Problem::new(
            StatusCode::NOT_FOUND,
            "webhook_delivery_not_found",
            "webhook delivery not found",
        )
    };
    if !well_formed(&delivery, "wd_") {
        return Err(delivery_not_found());
    }
    if !deliveries::retry(&state.database, &id, &delivery, now_ms())
        .await
        .map_err(problem)?
    {
        return Err(delivery_not_found());
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"id": delivery, "status": "pending"})),
    )
        .into_response())
}
