//! `GET /v1/journal?from=&to=`: every journal entry of a period with its legs, as JSON pages or,
//! with `Accept: text/csv`, the whole period as one CSV streamed page by page (a row per leg;
//! the server's memory stays flat however long the period).

use asiento_balances::{JournalCursor, JournalPage, JournalQuery, JOURNAL_LIMIT_MAX};
use axum::{
    extract::State,
    http::HeaderMap,
    response::{IntoResponse, Response},
    Json,
};
use serde_json::json;

use crate::auth::AuthenticatedTenant;
use crate::csv::{field, wants_csv};
use crate::ledger::{balance_problem, params, position, Params};
use crate::problem::Problem;
use crate::reads::{Needs, ReadSide};
use crate::statement::time;
use crate::AppState;

/// Entries per JSON page when the client names no limit.
pub const JOURNAL_LIMIT_DEFAULT: usize = 100;
/// The CSV's columns, in order (docs/API.md): one row per leg.
pub const CSV_COLUMNS: &str =
    "entry_id,position,recorded_at,reverses,account,currency,amount_minor";

/// `GET /v1/journal?from=&to=&after=&limit=`
#[utoipa::path(
    get, path = "/v1/journal", tag = "ledger", operation_id = "list_journal",
    params(
        ("from" = Option<String>, Query, description = "RFC 3339: entries recorded at or after"),
        ("to" = Option<String>, Query, description = "RFC 3339: entries recorded before"),
        ("after" = Option<String>, Query, description = "next_after of the previous page"),
        ("limit" = Option<u32>, Query, description = "Entries per page, 1 to 1000, default 100 (JSON)"),
    ),
    responses(
        (status = 200, description = "A page of the period's entries by time recorded, then log order (JSON), or the whole period as CSV with `Accept: text/csv`", body = crate::openapi::JournalList),
        (status = 400, description = "Invalid time, cursor or limit", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 503, description = "projection_lagging", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn list(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    headers: HeaderMap,
    query: Params,
) -> Result<Response, Problem> {
    let params = params(query)?;
    let limit = match position(&params, "limit")? {
        None => JOURNAL_LIMIT_DEFAULT,
        Some(limit) => usize::try_from(limit)
            .ok()
            .filter(|limit| (1..=JOURNAL_LIMIT_MAX).contains(limit))
            .ok_or_else(|| {
                Problem::bad_request(
                    "invalid_query",
                    format!("limit must be 1 to {JOURNAL_LIMIT_MAX}"),
                )
            })?,
    };
    let query = JournalQuery {
        tenant: tenant.0.clone(),
        from: time(&params, "from")?,
        to: time(&params, "to")?,
        after: params
            .get("after")
            .map(|raw| JournalCursor::parse(raw))
            .transpose()
            .map_err(balance_problem)?,
        limit,
    };
    let csv = wants_csv(&headers);
    let query = if csv {
        JournalQuery {
            after: None,
            limit: crate::csv::CSV_PAGE_ROWS,
            ..query
        }
    } else {
        query
    };
    let (side, page) = state
        .reads
        .read(
            Needs::Projection(asiento_balances::ENTRIES_NAME),
            None,
            |side| {
                let query = &query;
                async move {
                    let page =
                        asiento_balances::journal(&side.database, side.store.as_ref(), query)
                            .await?;
                    Ok::<_, asiento_balances::BalanceError>((side, page))
                }
            },
        )
        .await
        .map_err(balance_problem)?;
    if csv {
        return Ok(csv_response(side, query, page));
    }
    Ok(Json(json!({
        "object": "list",
        "data": page.entries,
        "next_after": page.next.map(|cursor| cursor.encode()),
    }))
    .into_response())
}

fn rows(page: &JournalPage) -> String {
    let mut out = String::new();
    for entry in &page.entries {
        let (position, recorded_at) = (
            entry.position.to_string(),
            asiento_objects::time(&entry.recorded_at),
        );
        let reverses = entry.reverses.as_deref().unwrap_or_default();
        for leg in &entry.legs {
            out.push_str(&format!(
                "{},{position},{recorded_at},{},{},{},{}\r\n",
                field(&entry.entry_id),
                field(reverses),
                field(&leg.account),
                field(&leg.currency),
                leg.amount_minor
            ));
        }
    }
    out
}

/// The period as CSV: the header, then a row per leg, page after page.
fn csv_response(side: ReadSide, query: JournalQuery, first: JournalPage) -> Response {
    let head = format!("{CSV_COLUMNS}\r\n{}", rows(&first));
    crate::csv::streamed("journal.csv", head, first.next, None, move |after| {
        let side = side.clone();
        let query = JournalQuery {
            after: Some(after),
            ..query.clone()
        };
        async move {
            let page =
                asiento_balances::journal(&side.database, side.store.as_ref(), &query).await?;
            Ok::<_, asiento_balances::BalanceError>((rows(&page), page.next))
        }
    })
}
