//! `GET /v1/events?after=&type=&limit=` and `GET /v1/events/{id}`: the tenant's merchant events,
//! from the merchant events read model, in the log's order.
//!
//! The page is built from each event's stored JSON text, so the feed and every webhook delivery
//! send an event as the same bytes.

use std::collections::HashMap;

use asiento_merchant_events::{
    read_after, read_one, EventKind, FeedCursor, FeedError, FeedQuery, PAGE_LIMIT_DEFAULT,
    PAGE_LIMIT_MAX,
};
use axum::{
    extract::{rejection::QueryRejection, Path, Query, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::auth::AuthenticatedTenant;
use crate::problem::Problem;
use crate::reads::Needs;
use crate::AppState;

fn invalid(name: &str, detail: impl std::fmt::Display) -> Problem {
    Problem::bad_request("invalid_query", format!("{name}: {detail}"))
}

fn feed_problem(error: FeedError) -> Problem {
    match error {
        FeedError::InvalidCursor => invalid("after", "not a cursor this feed gave out"),
        other => Problem::server(&other),
    }
}

/// `type=a,b` (or the parameter repeated as one comma list): every name must be an event type.
pub fn parse_types(raw: Option<&String>) -> Result<Vec<EventKind>, Problem> {
    let Some(raw) = raw else {
        return Ok(Vec::new());
    };
    raw.split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| {
            EventKind::parse(name).ok_or_else(|| invalid("type", format!("unknown type {name:?}")))
        })
        .collect()
}

#[derive(Serialize)]
struct Page<'a> {
    data: Vec<&'a RawValue>,
    /// Pass as `after` to read on; the same cursor again when the page is empty.
    next_cursor: String,
    has_more: bool,
}

fn json_response(body: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// `GET /v1/events`
#[utoipa::path(
    get, path = "/v1/events", tag = "events", operation_id = "list_events",
    params(
        ("after" = Option<String>, Query, description = "next_cursor of the previous page; absent for the first event"),
        ("type" = Option<String>, Query, description = "Only these types, comma-separated"),
        ("limit" = Option<u32>, Query, description = "1 to 100, default 50"),
    ),
    responses(
        (status = 200, description = "The tenant's events after the cursor, in log order", body = crate::openapi::EventPage),
        (status = 400, description = "invalid_query", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn list(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Response, Problem> {
    let Query(params) =
        query.map_err(|rejection| Problem::bad_request("invalid_query", rejection.body_text()))?;
    let after = params
        .get("after")
        .map(|raw| FeedCursor::parse(raw))
        .transpose()
        .map_err(feed_problem)?
        .unwrap_or(FeedCursor::START);
    let limit = match params.get("limit") {
        None => PAGE_LIMIT_DEFAULT,
        Some(raw) => raw
            .parse::<u32>()
            .ok()
            .filter(|limit| (1..=PAGE_LIMIT_MAX).contains(limit))
            .ok_or_else(|| invalid("limit", format!("must be 1 to {PAGE_LIMIT_MAX}")))?,
    };
    let query = FeedQuery {
        tenant: Some(tenant.0.clone()),
        after,
        types: parse_types(params.get("type"))?,
        // One more than the page, to know whether more follow.
        limit: limit + 1,
    };
    let query = &query;
    let mut events = state
        .reads
        .read(
            Needs::Projection(asiento_merchant_events::NAME),
            None,
            |side| async move { read_after(&side.database, query).await },
        )
        .await
        .map_err(feed_problem)?;
    let has_more = events.len() > limit as usize;
    events.truncate(limit as usize);
    let bodies = events
        .iter()
        .map(|event| RawValue::from_string(event.body.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| Problem::internal(&error))?;
    let page = Page {
        data: bodies.iter().map(AsRef::as_ref).collect(),
        next_cursor: events
            .last()
            .map_or_else(|| after.seq().to_string(), |event| event.cursor()),
        has_more,
    };
    let body = serde_json::to_vec(&page).map_err(|error| Problem::internal(&error))?;
    Ok(json_response(body))
}

/// `GET /v1/events/{id}`
#[utoipa::path(
    get, path = "/v1/events/{id}", tag = "events", operation_id = "get_event",
    params(("id" = String, Path, description = "evt_…")),
    responses(
        (status = 200, description = "The event", body = crate::openapi::MerchantEvent),
        (status = 404, description = "event_not_found", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn get(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    let not_found = || Problem::new(StatusCode::NOT_FOUND, "event_not_found", "event not found");
    if !crate::webhook_endpoints::well_formed(&id, "evt_") {
        return Err(not_found());
    }
    let (tenant, id) = (tenant.0.as_str(), id.as_str());
    let event = state
        .reads
        .find(
            Needs::Projection(asiento_merchant_events::NAME),
            None,
            |side| async move { read_one(&side.database, tenant, id).await },
        )
        .await
        .map_err(feed_problem)?
        .ok_or_else(not_found)?;
    Ok(json_response(event.body.into_bytes()))
}
