//! `GET /v1/transfers`: the tenant's transfers and holds, newest first, from the transfers read
//! model: a customer's open holds (`account=…&status=pending`), a merchant's incoming transfers,
//! a period's transfers.

use asiento_domain::{AccountName, TenantId};
use asiento_transfer_list::{ListError, TransferFilter};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::auth::AuthenticatedTenant;
use crate::ledger::{params, position, Params};
use crate::problem::Problem;
use crate::reads::Needs;
use crate::statement::time;
use crate::AppState;

/// `GET /v1/transfers?account=&status=&created_gte=&created_lt=&limit=50&cursor=[&min_position=N]`
#[utoipa::path(
    get, path = "/v1/transfers", tag = "ledger", operation_id = "list_transfers",
    params(
        ("account" = Option<String>, Query, description = "Only transfers that leave or reach this account"),
        ("status" = Option<String>, Query, description = "pending, posted, voided or expired"),
        ("created_gte" = Option<String>, Query, description = "Requested at or after (RFC 3339)"),
        ("created_lt" = Option<String>, Query, description = "Requested before (RFC 3339)"),
        ("limit" = Option<u32>, Query, description = "1 to 100, default 50"),
        ("cursor" = Option<String>, Query, description = "next_cursor of the previous page"),
        ("min_position" = Option<i64>, Query, description = "Wait (up to 5 s) until the list includes this position"),
    ),
    responses(
        (status = 200, description = "The tenant's transfers, newest first", body = crate::openapi::TransferList),
        (status = 400, description = "Invalid query", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 503, description = "projection_lagging", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn list(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    query: Params,
) -> Result<Response, Problem> {
    let params = params(query)?;
    let tenant = TenantId::parse(&tenant.0).map_err(|error| Problem::internal(&error))?;
    let invalid = |name: &str, detail: String| {
        Problem::bad_request("invalid_query", format!("{name}: {detail}"))
    };
    let account = params
        .get("account")
        .map(|raw| AccountName::parse(raw).map_err(|error| invalid("account", error.to_string())))
        .transpose()?;
    let status = params
        .get("status")
        .map(|raw| {
            asiento_transfer_list::parse_status(raw)
                .ok_or_else(|| invalid("status", format!("unknown status {raw:?}")))
        })
        .transpose()?;
    let limit = params
        .get("limit")
        .map(|raw| {
            raw.parse::<u32>()
                .map_err(|error| invalid("limit", error.to_string()))
        })
        .transpose()?
        .unwrap_or(asiento_transfer_list::LIST_LIMIT_DEFAULT);
    let min_position = position(&params, "min_position")?;
    let filter = TransferFilter {
        account,
        status,
        created_gte: time(&params, "created_gte")?,
        created_lt: time(&params, "created_lt")?,
        limit,
        cursor: params.get("cursor").cloned(),
    };
    crate::ledger::known_position(&state, min_position).await?;
    let (tenant, filter) = (&tenant, &filter);
    let page = state
        .reads
        .read(
            Needs::Projection(asiento_transfer_list::NAME),
            min_position,
            |side| async move {
                if let Some(position) = min_position {
                    asiento_transfer_list::wait_for_position(
                        &side.database,
                        side.store.as_ref(),
                        position,
                    )
                    .await?;
                }
                asiento_transfer_list::list_transfers(&side.database, tenant, filter.clone()).await
            },
        )
        .await
        .map_err(problem)?;
    let data: Vec<&serde_json::Value> = page.data.iter().map(|row| &row.object).collect();
    Ok(Json(json!({"data": data, "next_cursor": page.next_cursor})).into_response())
}

fn problem(error: ListError) -> Problem {
    match error {
        ListError::InvalidCursor | ListError::LimitOutOfRange { .. } => {
            Problem::bad_request("invalid_query", error.to_string())
        }
        ListError::ProjectionLagging { .. } => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "projection_lagging",
            error.to_string(),
        )
        .with_retry_after(1),
        other => Problem::server(&other),
    }
}
