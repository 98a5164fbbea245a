//! Read routes served from the log itself (the payment's own stream), so they are never stale:
//! a payment read right after a webhook finished it shows the finished state, and `next_action`
//! can never outlive `requires_action`.

use asiento_app::log;
use asiento_app::reply::{PaymentCommandKind, Render as _, Reply};
use asiento_domain::{PaymentEvent, TenantId};
use axum::{
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use serde_json::json;

use crate::auth::AuthenticatedTenant;
use crate::commands::{payment_id, transfer_id, transfer_not_found};
use crate::problem::Problem;
use crate::reads::Needs;
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
#[utoipa::path(
    get, path = "/v1/payments/{id}", tag = "payments", operation_id = "get_payment",
    params(("id" = String, Path, description = "pay_…")),
    responses(
        (status = 200, description = "The payment, from its own stream (never stale)", body = crate::openapi::Payment),
        (status = 404, description = "No such payment for this tenant", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn get_payment(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(raw_id): Path<String>,
) -> Result<Response, Problem> {
    let id = payment_id(&raw_id)?;
    let loaded = log::load_payment(state.payments.store().as_ref(), id)
        .await
        .map_err(|error| Problem::server(&error))?;
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

/// `GET /v1/transfers/{id}`: a transfer or hold, from its own stream.
#[utoipa::path(
    get, path = "/v1/transfers/{id}", tag = "ledger", operation_id = "get_transfer",
    params(("id" = String, Path, description = "tr_…")),
    responses(
        (status = 200, description = "The transfer, from its own stream (never stale)", body = crate::openapi::Transfer),
        (status = 404, description = "transfer_not_found", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn get_transfer(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(raw_id): Path<String>,
) -> Result<Response, Problem> {
    let id = transfer_id(&raw_id)?;
    let loaded = log::load_transfer(state.ledger.store().as_ref(), id)
        .await
        .map_err(|error| Problem::server(&error))?;
    let record = loaded
        .aggregate
        .record
        .as_ref()
        .filter(|record| record.requested.tenant.as_str() == tenant.0)
        .ok_or_else(transfer_not_found)?;
    let body = crate::render::transfer_json(record, loaded.last_position().unwrap_or(0));
    Ok((StatusCode::OK, Json(body)).into_response())
}

/// `GET /v1/payments/{id}/events`: the payment's history, oldest first.
#[utoipa::path(
    get, path = "/v1/payments/{id}/events", tag = "payments", operation_id = "list_payment_events",
    params(("id" = String, Path, description = "pay_…")),
    responses(
        (status = 200, description = "Its event history, oldest first; redirect URLs and review details read \"[redacted]\"", body = Vec<crate::openapi::PaymentEventView>),
        (status = 404, description = "No such payment for this tenant", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn payment_events(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(raw_id): Path<String>,
) -> Result<Response, Problem> {
    let id = payment_id(&raw_id)?;
    let loaded = log::load_payment(state.payments.store().as_ref(), id)
        .await
        .map_err(|error| Problem::server(&error))?;
    visible(&loaded.aggregate.record, &tenant)?;
    let events: Vec<_> = loaded
        .events
        .iter()
        .map(|(recorded, event)| {
            let mut data = event
                .encode()
                .unwrap_or_else(|_| recorded.data.value().clone());
            redact(event, &mut data);
            json!({
                "position": recorded.position,
                "version": recorded.version,
                "type": recorded.event_type,
                "recorded_at": recorded.recorded_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                "data": data,
            })
        })
        .collect();
    Ok(Json(events).into_response())
}

/// What the events view shows in place of a field it withholds.
pub const REDACTED: &str = "[redacted]";

/// The fields of an event's data that the events view withholds (API.md):
/// - `ActionRequired.redirect_url`: whoever holds it can act on the payment; the payment object
///   hands it out while the payment is `requires_action` and the history never does.
/// - `FlaggedForReview.detail`: written from internal error text (a dead-lettered webhook's last
///   error) and from provider payloads; the review `reason` stays.
///
/// Everything else is shown. `ChargeFailed.reason` stays: it is the payment object's
/// `failure_reason` (the provider's failure code, or a fixed phrase of ours), never a raw error
/// message; so do `AuthorizationEnded.reason` (the failure reason it may become),
/// `OperationRefused.reason`, `RefundReversed.reason` and `CaptureReversed.reason`,
/// which are the provider's refusal or failure code. The match names every event, so that a new one is a decision, not a leak.
fn withheld(event: &PaymentEvent) -> &'static [&'static str] {
    match event {
        PaymentEvent::ActionRequired(_) => &["redirect_url"],
        PaymentEvent::FlaggedForReview(_) => &["detail"],
        PaymentEvent::PaymentIntended(_)
        | PaymentEvent::ChargeRequested(_)
        | PaymentEvent::ChargeAuthorized(_)
        | PaymentEvent::CaptureRequested(_)
        | PaymentEvent::ChargeCaptured(_)
        | PaymentEvent::ChargeFailed(_)
        | PaymentEvent::AuthorizationEnded(_)
        | PaymentEvent::PaymentExpired(_)
        | PaymentEvent::CancelRequested(_)
        | PaymentEvent::CancelSucceeded(_)
        | PaymentEvent::PaymentCanceled(_)
        | PaymentEvent::RefundRequested(_)
        | PaymentEvent::RefundSettled(_)
        | PaymentEvent::OperationReceived(_)
        | PaymentEvent::OperationAnswered(_)
        | PaymentEvent::OperationIdentified(_)
        | PaymentEvent::OperationRefused(_)
        | PaymentEvent::RefundReversed(_)
        | PaymentEvent::CaptureReversed(_)
        | PaymentEvent::DisputeOpened(_)
        | PaymentEvent::DisputeClosed(_)
        | PaymentEvent::ProviderFeeCharged(_)
        | PaymentEvent::EntryPosted(_) => &[],
    }
}

/// Replaces the withheld fields of `data` (the event's JSON, however it was obtained) with
/// [`REDACTED`]; a field that is absent or null stays as it is.
pub fn redact(event: &PaymentEvent, data: &mut serde_json::Value) {
    let Some(object) = data.as_object_mut() else {
        return;
    };
    for field in withheld(event) {
        if let Some(value) = object.get_mut(*field).filter(|value| !value.is_null()) {
            *value = serde_json::Value::String(REDACTED.to_owned());
        }
    }
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

/// `GET /v1/payments?status=&customer=&provider=&created_gte=&created_lt=&updated_gte=&updated_lt=&amount_gte=&amount_lte=&metadata[key]=&limit=50&cursor=[&min_position=N]`:
/// the tenant's payments, newest first, from the payments read model; with `Accept: text/csv`,
/// every payment the filters match, streamed.
#[utoipa::path(
    get, path = "/v1/payments", tag = "payments", operation_id = "list_payments",
    params(
        ("status" = Option<String>, Query, description = "Only payments in this status"),
        ("customer" = Option<String>, Query),
        ("provider" = Option<String>, Query, description = "Only payments through this provider (its configured name)"),
        ("created_gte" = Option<String>, Query, description = "RFC 3339"),
        ("created_lt" = Option<String>, Query, description = "RFC 3339"),
        ("updated_gte" = Option<String>, Query, description = "Last changed at or after (RFC 3339)"),
        ("updated_lt" = Option<String>, Query, description = "Last changed before (RFC 3339)"),
        ("amount_gte" = Option<i64>, Query, description = "The amount asked for, at least (minor units)"),
        ("amount_lte" = Option<i64>, Query, description = "The amount asked for, at most (minor units)"),
        ("metadata" = Option<std::collections::HashMap<String, String>>, Query, style = DeepObject, explode, description = "metadata[key]=value: the payment's metadata holds key with exactly this string value (up to 10 keys, all must match)"),
        ("limit" = Option<u32>, Query, description = "1 to 100, default 50 (JSON only)"),
        ("cursor" = Option<String>, Query, description = "next_cursor of the previous page"),
        ("min_position" = Option<i64>, Query, description = "Wait (up to 5 s) until the list includes this position"),
    ),
    responses(
        (status = 200, description = "The tenant's payments, newest first (JSON), or every payment the filters match as CSV with `Accept: text/csv`", body = crate::openapi::PaymentList),
        (status = 400, description = "Invalid query", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 503, description = "projection_lagging", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn list_payments(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    headers: axum::http::HeaderMap,
    query: Result<
        axum::extract::Query<std::collections::HashMap<String, String>>,
        axum::extract::rejection::QueryRejection,
    >,
) -> Result<Response, Problem> {
    use asiento_payments_view::ViewError;
    let axum::extract::Query(params) =
        query.map_err(|rejection| Problem::bad_request("invalid_query", rejection.body_text()))?;
    let tenant = TenantId::parse(&tenant.0).map_err(|error| Problem::internal(&error))?;
    let filter = payment_filter(&params)?;
    let min_position = crate::ledger::position(&params, "min_position")?;
    let view_problem = |error: ViewError| match error {
        ViewError::InvalidCursor
        | ViewError::LimitOutOfRange { .. }
        | ViewError::TooManyMetadataFilters { .. } => {
            Problem::bad_request("invalid_query", error.to_string())
        }
        ViewError::ProjectionLagging { .. } => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "projection_lagging",
            error.to_string(),
        )
        .with_retry_after(1),
        other => Problem::server(&other),
    };
    crate::ledger::known_position(&state, min_position).await?;
    let csv = crate::csv::wants_csv(&headers);
    let (tenant, filter) = (&tenant, &filter);
    let (side, page) = state
        .reads
        .read(
            Needs::Projection(asiento_payments_view::NAME),
            min_position,
            |side| async move {
                if let Some(position) = min_position {
                    asiento_payments_view::wait_for_position(
                        &side.database,
                        side.store.as_ref(),
                        position,
                    )
                    .await?;
                }
                let page = if csv {
                    asiento_payments_view::export_page(&side.database, tenant, filter.clone())
                        .await?
                } else {
                    asiento_payments_view::list_payments(&side.database, tenant, filter.clone())
                        .await?
                };
                Ok::<_, ViewError>((side, page))
            },
        )
        .await
        .map_err(view_problem)?;
    if csv {
        return Ok(crate::payment_export::csv_response(
            side,
            tenant.clone(),
            filter.clone(),
            page,
        ));
    }
    Ok(Json(json!({"data": page.data, "next_cursor": page.next_cursor})).into_response())
}

/// The list's filters from its query, each checked (400 `invalid_query` naming the parameter).
fn payment_filter(
    params: &std::collections::HashMap<String, String>,
) -> Result<asiento_payments_view::PaymentFilter, Problem> {
    let invalid = |name: &str, detail: String| {
        Problem::bad_request("invalid_query", format!("{name}: {detail}"))
    };
    let time = |name: &str| crate::statement::time(params, name);
    let amount = |name: &str| crate::ledger::position(params, name);
    let status = params
        .get("status")
        .map(|raw| {
            asiento_domain::PaymentStatus::ALL
                .into_iter()
                .find(|status| status.as_str() == raw)
                .ok_or_else(|| invalid("status", format!("unknown status {raw:?}")))
        })
        .transpose()?;
    let customer = params
        .get("customer")
        .map(|raw| {
            asiento_domain::CustomerId::parse(raw)
                .map_err(|error| invalid("customer", error.to_string()))
        })
        .transpose()?;
    let provider = params
        .get("provider")
        .map(|raw| {
            asiento_domain::ProviderName::parse(raw)
                .map(|name| name.as_str().to_owned())
                .map_err(|error| invalid("provider", error.to_string()))
        })
        .transpose()?;
    let limit = params
        .get("limit")
        .map(|raw| {
            raw.parse::<u32>()
                .map_err(|error| invalid("limit", error.to_string()))
        })
        .transpose()?
        .unwrap_or(asiento_payments_view::LIST_LIMIT_DEFAULT);
    let mut metadata = Vec::new();
    for (name, value) in params {
        let Some(key) = name
            .strip_prefix("metadata[")
            .and_then(|rest| rest.strip_suffix(']'))
        else {
            continue;
        };
        if key.is_empty() || key.chars().count() > METADATA_FILTER_KEY_CHARS_MAX {
            return Err(invalid(
                name,
                format!("a metadata key has 1 to {METADATA_FILTER_KEY_CHARS_MAX} characters"),
            ));
        }
        // No stored text holds U+0000 (PostgreSQL's cannot), so such a filter matches nothing;
        // it is refused rather than sent to a database that would fail on it.
        if key.contains('\0') || value.contains('\0') {
            return Err(invalid(name, "holds U+0000 (NUL)".to_owned()));
        }
        metadata.push((key.to_owned(), value.clone()));
    }
    // One order whatever the query's: the same filters are the same statement.
    metadata.sort();
    Ok(asiento_payments_view::PaymentFilter {
        status,
        customer,
        provider,
        created_gte: time("created_gte")?,
        created_lt: time("created_lt")?,
        updated_gte: time("updated_gte")?,
        updated_lt: time("updated_lt")?,
        amount_gte: amount("amount_gte")?,
        amount_lte: amount("amount_lte")?,
        metadata,
        limit,
        cursor: params.get("cursor").cloned(),
    })
}

/// The longest metadata key a list filter names, in characters.
const METADATA_FILTER_KEY_CHARS_MAX: usize = 255;

#[cfg(test)]
mod tests {
    use asiento_domain::payment::{ActionRequired, ChargeFailed, FlaggedForReview, ReviewReason};
    use asiento_domain::PaymentEvent;

    use super::{redact, REDACTED};

    fn shown(event: &PaymentEvent) -> serde_json::Value {
        let mut data = event.encode().expect("encodes");
        redact(event, &mut data);
        data
    }

    #[test]
    fn redirect_urls_and_review_details_are_withheld() {
        let at = chrono::DateTime::from_timestamp(1_764_000_000, 0).expect("a time");
        let action = shown(&PaymentEvent::ActionRequired(ActionRequired {
            charge_id: "ch_1".to_owned(),
            redirect_url: "https://psp.example/3ds/ch_1?token=secret".to_owned(),
            at,
        }));
        assert_eq!(action["redirect_url"], REDACTED);
        assert_eq!(action["charge_id"], "ch_1");
        let flag = shown(&PaymentEvent::FlaggedForReview(FlaggedForReview {
            reason: ReviewReason::Manual,
            detail: "webhook sim/evt_1 dead-lettered after 8 attempts: database error: \
                     connection refused (10.0.0.7:5432)"
                .to_owned(),
            at,
        }));
        assert_eq!(flag["detail"], REDACTED);
        assert_eq!(flag["reason"], "manual");
        // The failure reason is the payment object's `failure_reason`: shown.
        let failed = shown(&PaymentEvent::ChargeFailed(ChargeFailed {
            charge_id: Some("ch_1".to_owned()),
            reason: "card_declined".to_owned(),
            at,
        }));
        assert_eq!(failed["reason"], "card_declined");
    }
}
