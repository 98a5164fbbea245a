//! `GET /v1/reconciliation/exceptions?status=open|resolved&limit=` and
//! `POST /v1/reconciliation/exceptions/{id}/resolve` `{"note": "…"}`.
//!
//! A tenant sees and resolves only its own exceptions: another tenant's id (or one of the platform
//! scope, which names no payment of ours) answers 404, never 403. Resolving is recorded as an
//! `ExceptionResolved` event; resolving twice is 409 `exception_already_resolved`.

use asiento_app::exceptions::{self, ExceptionError, ExceptionView, Scope, EXCEPTIONS_PAGE_MAX};
use asiento_domain::exception::{ExceptionRejection, ExceptionStatus, NOTE_CHARS_MAX};
use asiento_domain::{ExceptionId, TenantId};
use axum::{
    extract::{Path, Query, State},
    http::StatusCode,
    Json,
};
use serde::Deserialize;
use serde_json::Value;

use crate::auth::AuthenticatedTenant;
use crate::body::{Fields, JsonObject};
use crate::problem::Problem;
use crate::AppState;

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    pub status: Option<String>,
    pub limit: Option<i64>,
}

/// The JSON of API.md: `{"id", "payment_id", "kind", "local", "provider", "difference",
/// "resolution", "status"}`, plus the note and times.
pub fn render(view: &ExceptionView) -> Value {
    asiento_objects::exception_object(&asiento_objects::ExceptionFields {
        id: &view.id,
        payment_id: view.payment_id.as_deref(),
        kind: &view.kind,
        local: &view.local,
        provider_state: &view.provider_state,
        provider_name: &view.provider,
        charge_id: view.charge_id.as_deref(),
        difference: &view.difference,
        resolution: &view.resolution,
        status: &view.status,
        note: view.note.as_deref(),
        recorded_ms: view.recorded_ms,
        resolved_ms: view.resolved_ms,
    })
}

fn scope(tenant: &AuthenticatedTenant) -> Result<Scope, Problem> {
    TenantId::parse(&tenant.0)
        .map(Scope::Tenant)
        .map_err(|error| Problem::internal(&error))
}

fn not_found() -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        "exception_not_found",
        "exception not found",
    )
}

fn problem(error: ExceptionError) -> Problem {
    match error {
        ExceptionError::Rejected(ExceptionRejection::NotFound) => not_found(),
        ExceptionError::Rejected(rejection @ ExceptionRejection::AlreadyResolved) => Problem::new(
            StatusCode::CONFLICT,
            rejection.code(),
            rejection.to_string(),
        ),
        ExceptionError::Rejected(rejection @ ExceptionRejection::NoteInvalid) => {
            Problem::bad_request(rejection.code(), rejection.to_string())
        }
        other => Problem::server(&other),
    }
}

/// `GET /v1/reconciliation/exceptions`
#[utoipa::path(
    get, path = "/v1/reconciliation/exceptions", tag = "reconciliation", operation_id = "list_exceptions",
    params(
        ("status" = Option<String>, Query, description = "open or resolved"),
        ("limit" = Option<u32>, Query, description = "1 to 500"),
    ),
    responses(
        (status = 200, description = "The tenant's reconciliation exceptions", body = Vec<crate::openapi::ReconciliationException>),
        (status = 400, description = "Invalid query", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn list(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, Problem> {
    let status = match query.status.as_deref() {
        None => None,
        Some(raw) => Some(ExceptionStatus::parse(raw).ok_or_else(|| {
            Problem::bad_request("invalid_status", "status must be open or resolved")
        })?),
    };
    let limit = query.limit.unwrap_or(EXCEPTIONS_PAGE_MAX);
    if !(1..=EXCEPTIONS_PAGE_MAX).contains(&limit) {
        return Err(Problem::bad_request(
            "invalid_limit",
            format!("limit must be between 1 and {EXCEPTIONS_PAGE_MAX}"),
        ));
    }
    let listed = exceptions::list(&state.database, &scope(&tenant)?, status, limit)
        .await
        .map_err(problem)?;
    Ok(Json(Value::Array(listed.iter().map(render).collect())))
}

/// `POST /v1/reconciliation/exceptions/{id}/resolve`
#[utoipa::path(
    post, path = "/v1/reconciliation/exceptions/{id}/resolve", tag = "reconciliation", operation_id = "resolve_exception",
    params(("id" = String, Path, description = "exc_…")),
    request_body = crate::openapi::ResolveRequest,
    responses(
        (status = 200, description = "Resolved", body = crate::openapi::ReconciliationException),
        (status = 400, description = "note_invalid", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 404, description = "exception_not_found", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 409, description = "exception_already_resolved", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn resolve(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(raw_id): Path<String>,
    JsonObject(body): JsonObject,
) -> Result<Json<Value>, Problem> {
    // A malformed id names no exception: 404, like an unknown one.
    let id = ExceptionId::parse(&raw_id).map_err(|_| not_found())?;
    let fields = Fields(&body);
    fields.only(&["note"])?;
    let note = fields
        .optional_text("note", NOTE_CHARS_MAX)?
        .ok_or_else(|| Problem::bad_request("note_invalid", "note is required"))?;
    let view = exceptions::resolve(
        &state.database,
        state.payments.store().as_ref(),
        &scope(&tenant)?,
        id,
        note,
        state.payments.clock().now(),
    )
    .await
    .map_err(problem)?;
    Ok(Json(render(&view)))
}
