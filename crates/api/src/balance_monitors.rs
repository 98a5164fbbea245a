//! `/v1/balance_monitors`: a tenant's balance monitors (`asiento_domain::monitor`). Creating one
//! is a command under an Idempotency-Key; deleting one is idempotent by nature; one monitor is
//! read from its own stream (never stale), the list from the merchant events projection, which
//! also decides when a monitor fires (`balance.threshold_crossed` in the events feed).

use std::collections::HashMap;

use asiento_app::ledger::{MonitorState, NewMonitor};
use asiento_domain::monitor::{
    is_monitor_id, BalanceField, Condition, Threshold, DESCRIPTION_CHARS_MAX,
};
use asiento_domain::{AccountName, Currency};
use asiento_merchant_events::{
    FeedError, MonitorQuery, MONITORS_LIMIT_MAX, MONITORS_PER_TENANT_MAX,
};
use axum::{
    extract::{rejection::QueryRejection, Path, Query, State},
    http::{HeaderMap, Method, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde_json::{json, Value};

use crate::auth::AuthenticatedTenant;
use crate::body::{Fields, JsonObject};
use crate::commands::{answer_response, idempotent, tenant_id};
use crate::problem::Problem;
use crate::reads::Needs;
use crate::render::monitor_object;
use crate::AppState;

/// Monitors per page when the client names no limit.
pub const MONITORS_LIMIT_DEFAULT: u32 = 50;

fn not_found() -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        "balance_monitor_not_found",
        "balance monitor not found",
    )
}

fn monitor_id(id: &str) -> Result<&str, Problem> {
    if is_monitor_id(id) {
        Ok(id)
    } else {
        Err(Problem::bad_request(
            "invalid_id",
            format!("{id:?} is not a balance monitor id (bm_ and 32 hex digits)"),
        ))
    }
}

fn one_of<T: Copy>(
    fields: &Fields<'_>,
    name: &str,
    parse: fn(&str) -> Option<T>,
    names: &[&str],
) -> Result<T, Problem> {
    let raw = fields.string(name)?;
    parse(raw).ok_or_else(|| {
        Problem::bad_request(
            "invalid_field",
            format!("{name} must be one of {}, got {raw:?}", names.join(", ")),
        )
    })
}

/// `POST /v1/balance_monitors`
#[utoipa::path(
    post, path = "/v1/balance_monitors", tag = "ledger", operation_id = "create_balance_monitor",
    params(("Idempotency-Key" = String, Header, description = "1-255 printable ASCII characters; scoped by tenant, method and route")),
    request_body = crate::openapi::CreateBalanceMonitor,
    responses(
        (status = 201, description = "The monitor: from now on, each entry that takes the field from not matching the condition to matching it tells balance.threshold_crossed", body = crate::openapi::BalanceMonitor),
        (status = 422, description = "account_reserved (a system account), amount_too_large (the limit), balance_monitors_limit (100 active per tenant), or the key was reused", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn create(
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
        "/v1/balance_monitors".to_owned(),
        &body,
    )?;
    let fields = Fields(&body);
    fields.only(&[
        "account",
        "currency",
        "field",
        "condition",
        "amount_minor",
        "description",
    ])?;
    let fields_names = BalanceField::ALL.map(BalanceField::as_str);
    let condition_names = Condition::ALL.map(Condition::as_str);
    let new = NewMonitor {
        tenant,
        account: fields.account("account")?,
        currency: fields.currency("currency")?,
        threshold: Threshold {
            field: one_of(&fields, "field", BalanceField::parse, &fields_names)?,
            condition: one_of(&fields, "condition", Condition::parse, &condition_names)?,
            amount_minor: fields.signed_amount("amount_minor", state.amount_limit)?,
        },
        description: fields.optional_text("description", DESCRIPTION_CHARS_MAX)?,
    };
    let active = asiento_merchant_events::active_monitors(&state.database, new.tenant.as_str())
        .await
        .map_err(|error| Problem::server(&error))?;
    if active >= MONITORS_PER_TENANT_MAX {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "balance_monitors_limit",
            format!("a tenant may have at most {MONITORS_PER_TENANT_MAX} active balance monitors"),
        ));
    }
    Ok(answer_response(
        state.ledger.create_monitor(&request, new).await,
    ))
}

fn state_json(state: &MonitorState) -> Value {
    monitor_object(&state.created, state.deleted_at.as_ref(), state.position)
}

/// `GET /v1/balance_monitors/{id}`
#[utoipa::path(
    get, path = "/v1/balance_monitors/{id}", tag = "ledger", operation_id = "get_balance_monitor",
    params(("id" = String, Path, description = "bm_…")),
    responses(
        (status = 200, description = "The monitor, from its own stream", body = crate::openapi::BalanceMonitor),
        (status = 400, description = "invalid_id", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 404, description = "balance_monitor_not_found", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn get(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    let tenant = tenant_id(&tenant)?;
    let found = state
        .ledger
        .monitor(&tenant, monitor_id(&id)?)
        .await
        .map_err(|error| Problem::server(&error))?
        .ok_or_else(not_found)?;
    Ok(Json(state_json(&found)).into_response())
}

/// `DELETE /v1/balance_monitors/{id}`
#[utoipa::path(
    delete, path = "/v1/balance_monitors/{id}", tag = "ledger", operation_id = "delete_balance_monitor",
    params(("id" = String, Path, description = "bm_…")),
    responses(
        (status = 200, description = "Deleted (or deleted before): it watches no more", body = crate::openapi::BalanceMonitor),
        (status = 400, description = "invalid_id", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 404, description = "balance_monitor_not_found", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn delete(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    let tenant = tenant_id(&tenant)?;
    let deleted = state.ledger.delete_monitor(&tenant, monitor_id(&id)?).await;
    match deleted {
        Ok(Some(found)) => Ok(Json(state_json(&found)).into_response()),
        Ok(None) => Err(not_found()),
        Err(error) => Ok(answer_response(Err(error))),
    }
}

type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

/// `GET /v1/balance_monitors?account=&currency=&include_deleted=&after=&limit=&min_position=`
#[utoipa::path(
    get, path = "/v1/balance_monitors", tag = "ledger", operation_id = "list_balance_monitors",
    params(
        ("account" = Option<String>, Query, description = "Only this account's monitors"),
        ("currency" = Option<String>, Query, description = "Only the monitors in this currency"),
        ("include_deleted" = Option<bool>, Query, description = "Deleted monitors too"),
        ("after" = Option<String>, Query, description = "next_after of the previous page"),
        ("limit" = Option<u32>, Query, description = "1 to 100, default 50"),
        ("min_position" = Option<i64>, Query, description = "Wait (up to 5 s) until the list reflects this position"),
    ),
    responses(
        (status = 200, description = "The tenant's monitors in id order, each with `matching` as of the projection's checkpoint", body = crate::openapi::BalanceMonitorList),
        (status = 503, description = "projection_lagging: min_position not reached in 5 s", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn list(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    query: Params,
) -> Result<Json<Value>, Problem> {
    let Query(params) =
        query.map_err(|rejection| Problem::bad_request("invalid_query", rejection.body_text()))?;
    let invalid = |detail: String| Problem::bad_request("invalid_query", detail);
    let account = params
        .get("account")
        .map(|raw| {
            AccountName::parse(raw)
                .map(|account| account.as_str().to_owned())
                .map_err(|error| Problem::bad_request("invalid_account", error.to_string()))
        })
        .transpose()?;
    let currency = params
        .get("currency")
        .map(|raw| {
            Currency::parse(raw)
                .map(|currency| currency.code().to_owned())
                .map_err(|error| Problem::bad_request("unknown_currency", error.to_string()))
        })
        .transpose()?;
    let include_deleted = match params.get("include_deleted").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(invalid(format!(
                "include_deleted must be true or false, got {other:?}"
            )))
        }
    };
    let after = params
        .get("after")
        .map(|id| monitor_id(id).map(str::to_owned))
        .transpose()?;
    let limit = match params.get("limit") {
        None => MONITORS_LIMIT_DEFAULT,
        Some(raw) => raw
            .parse::<u32>()
            .ok()
            .filter(|limit| (1..=MONITORS_LIMIT_MAX).contains(limit))
            .ok_or_else(|| invalid(format!("limit must be 1 to {MONITORS_LIMIT_MAX}")))?,
    };
    let min_position = crate::ledger::position(&params, "min_position")?;
    crate::ledger::known_position(&state, min_position).await?;
    let query = &MonitorQuery {
        tenant: tenant.0.clone(),
        account,
        currency,
        include_deleted,
        after,
        limit,
        min_position,
    };
    let page = state
        .reads
        .read(
            Needs::Projection(asiento_merchant_events::NAME),
            min_position,
            |side| async move {
                asiento_merchant_events::list_monitors(&side.database, side.store.as_ref(), query)
                    .await
            },
        )
        .await
        .map_err(|error| match error {
        FeedError::Lagging { waited_ms } => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "projection_lagging",
            format!("the merchant events read model did not reach the position in {waited_ms} ms; retry"),
        )
        .with_retry_after(1),
        other => Problem::server(&other),
    })?;
    Ok(Json(json!({
        "object": "list",
        "data": page.data,
        "next_after": page.next_after,
    })))
}
