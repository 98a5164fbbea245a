//! Read routes served from the log itself (the payment's own stream), so they are never stale:
//! a payment read right after a webhook finished it shows the finished state, and `next_action`
//! can never outlive `requires_action`.

use asiento_app::log;
use asiento_app::reply::{PaymentCommandKind, Render as _, Reply};
use asiento_domain::TenantId;
use axum::{
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use serde_json::json;

use crate::auth::AuthenticatedTenant;
use crate::commands::payment_id;
use crate::problem::Problem;
use crate::render::JsonRender;
use crate::AppState;

fn not_found() -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        "payment_not_found",
        "payment not found",
    )
}

/// `GET /v1/payments/{id}`
pub async fn get_payment(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(raw_id): Path<String>,
) -> Result<Response, Problem> {
    let id = payment_id(&raw_id)?;
    let loaded = log::load_payment(state.payments.store.as_ref(), id)
        .await
        .map_err(|error| Problem::internal(&error))?;
    let record = visible(&loaded.aggregate.record, &tenant)?;
    let stored = JsonRender.render(&Reply::Payment {
        kind: PaymentCommandKind::Read,
        payment: record,
        position: loaded.last_position().unwrap_or(0),
    });
    Ok((
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        stored.body,
    )
        .into_response())
}

/// `GET /v1/payments/{id}/events`: the payment's history, oldest first.
pub async fn payment_events(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(raw_id): Path<String>,
) -> Result<Response, Problem> {
    let id = payment_id(&raw_id)?;
    let loaded = log::load_payment(state.payments.store.as_ref(), id)
        .await
        .map_err(|error| Problem::internal(&error))?;
    visible(&loaded.aggregate.record, &tenant)?;
    let events: Vec<_> = loaded
        .events
        .iter()
        .map(|(recorded, event)| {
            json!({
                "position": recorded.position,
                "version": recorded.version,
                "type": recorded.event_type,
                "recorded_at": recorded.recorded_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                "data": event.encode().unwrap_or_else(|_| recorded.data.clone()),
            })
        })
        .collect();
    Ok(Json(events).into_response())
}

/// Another tenant's payment answers exactly like one that does not exist.
fn visible<'a>(
    record: &'a Option<asiento_domain::PaymentRecord>,
    tenant: &AuthenticatedTenant,
) -> Result<&'a asiento_domain::PaymentRecord, Problem> {
    let tenant = TenantId::parse(&tenant.0).map_err(|_| not_found())?;
    match record {
        Some(record) if record.tenant == tenant => Ok(record),
        _ => Err(not_found()),
    }
}
