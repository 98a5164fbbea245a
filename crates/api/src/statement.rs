//! `GET /v1/accounts/{account}/statement`: an account's statement for a period (opening
//! balance, every leg in log order with the balance after it, closing balance), as JSON pages or,
//! with `Accept: text/csv`, the whole period as one CSV streamed page by page (the server's
//! memory stays flat however long the period).

use std::collections::HashMap;

use asiento_balances::{Point, Statement, StatementQuery, ENTRIES_LIMIT_MAX};
use axum::{
    extract::{Path, State},
    http::HeaderMap,
    response::{IntoResponse, Response},
    Json,
};
use chrono::{DateTime, Utc};
use serde_json::json;

use crate::auth::AuthenticatedTenant;
use crate::csv::{field, wants_csv};
use crate::ledger::{account, balance_problem, currency, known_position, params, position, Params};
use crate::problem::Problem;
use crate::reads::{Needs, ReadSide, Reads};
use crate::AppState;

/// Lines per JSON page when the client names no limit, and per read while streaming CSV.
pub const STATEMENT_LIMIT_DEFAULT: usize = 100;
/// The CSV's columns, in order (docs/API.md).
pub const CSV_COLUMNS: &str =
    "kind,account,currency,entry_id,position,recorded_at,amount_minor,balance_minor,source,description";

pub(crate) fn time(
    params: &HashMap<String, String>,
    name: &str,
) -> Result<Option<DateTime<Utc>>, Problem> {
    params
        .get(name)
        .map(|raw| {
            DateTime::parse_from_rfc3339(raw)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|error| {
                    Problem::bad_request(
                        "invalid_query",
                        format!("{name} must be an RFC 3339 time ({error}), got {raw:?}"),
                    )
                })
        })
        .transpose()
}

/// `GET /v1/accounts/{account}/statement?currency=USD&from=&to=&to_position=&after=&limit=`
#[utoipa::path(
    get, path = "/v1/accounts/{account}/statement", tag = "ledger", operation_id = "get_statement",
    params(
        ("account" = String, Path, description = "segment(:segment)*"),
        ("currency" = String, Query),
        ("from" = Option<String>, Query, description = "RFC 3339: the period starts after the tenant's last entry recorded before it (absent: at the start)"),
        ("to" = Option<String>, Query, description = "RFC 3339: the period ends after the tenant's last entry recorded before it (absent: now)"),
        ("to_position" = Option<i64>, Query, description = "The period ends at the latest after the event at this position (pass a page's `closing_position` with `after`)"),
        ("after" = Option<i64>, Query, description = "next_after of the previous page"),
        ("limit" = Option<u32>, Query, description = "Lines per page, 1 to 1000, default 100 (JSON)"),
    ),
    responses(
        (status = 200, description = "A page of the statement (JSON), or the whole period as CSV with `Accept: text/csv`", body = crate::openapi::AccountStatement),
        (status = 400, description = "Invalid account, currency, time or position", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 503, description = "projection_lagging", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn statement(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(raw_account): Path<String>,
    headers: HeaderMap,
    query: Params,
) -> Result<Response, Problem> {
    let params = params(query)?;
    let account = account(&raw_account)?;
    let currency = currency(&params)?;
    let invalid = |detail: &str| Problem::bad_request("invalid_query", detail.to_owned());
    let to = Point {
        position: position(&params, "to_position")?,
        time: time(&params, "to")?,
    };
    known_position(&state, to.position).await?;
    let limit = match position(&params, "limit")? {
        None => STATEMENT_LIMIT_DEFAULT,
        Some(limit) => usize::try_from(limit)
            .ok()
            .filter(|limit| (1..=ENTRIES_LIMIT_MAX).contains(limit))
            .ok_or_else(|| invalid(&format!("limit must be 1 to {ENTRIES_LIMIT_MAX}")))?,
    };
    let query = StatementQuery {
        tenant: tenant.0.clone(),
        account: account.as_str().to_owned(),
        currency: currency.code().to_owned(),
        from: time(&params, "from")?,
        to,
        after: position(&params, "after")?,
        limit,
    };
    if wants_csv(&headers) {
        return csv(&state.reads, query).await.map_err(balance_problem);
    }
    let (_, first) = read_statement(&state.reads, &query)
        .await
        .map_err(balance_problem)?;
    Ok(Json(json!({
        "object": "statement",
        "account": account.as_str(),
        "currency": currency.code(),
        "opening_balance_minor": first.opening_balance_minor,
        "opening_position": first.opening_position,
        "closing_balance_minor": first.closing_balance_minor,
        "closing_position": first.closing_position,
        "data": first.lines,
        "next_after": first.next_after,
    }))
    .into_response())
}

fn csv_row(query: &StatementQuery, cells: [&str; 8]) -> String {
    let [kind, entry_id, position, recorded_at, amount, balance, source, description] = cells;
    format!(
        "{kind},{},{},{},{position},{recorded_at},{amount},{balance},{},{}\r\n",
        field(&query.account),
        field(&query.currency),
        field(entry_id),
        field(source),
        field(description),
    )
}

fn lines_csv(query: &StatementQuery, page: &Statement) -> String {
    let mut out = String::new();
    for line in &page.lines {
        out.push_str(&csv_row(
            query,
            [
                "leg",
                &line.entry_id,
                &line.position.to_string(),
                &asiento_objects::time(&line.recorded_at),
                &line.amount_minor.to_string(),
                &line.balance_minor.to_string(),
                line.source.as_deref().unwrap_or_default(),
                line.description.as_deref().unwrap_or_default(),
            ],
        ));
    }
    out
}

/// The whole period of `query` as CSV (the API's `Accept: text/csv` and the console's
/// download): the header, an `opening` row, a `leg` row per leg, a `closing` row, read page by
/// page with the period's end pinned to the first page's. A body without its `closing` row was
/// cut short by an error (logged) and must not be used. An error before the first byte is
/// returned.
pub async fn csv(
    reads: &Reads,
    query: StatementQuery,
) -> Result<Response, asiento_balances::BalanceError> {
    let query = StatementQuery {
        after: None,
        limit: crate::csv::CSV_PAGE_ROWS,
        ..query
    };
    let (side, first) = read_statement(reads, &query).await?;
    Ok(csv_response(side, query, first))
}

/// A page of the statement, from a standby that has its end (`to_position`) or the primary, and
/// the database it came from.
async fn read_statement(
    reads: &Reads,
    query: &StatementQuery,
) -> Result<(ReadSide, Statement), asiento_balances::BalanceError> {
    reads
        .read(
            Needs::Projection(asiento_balances::ENTRIES_NAME),
            query.to.position,
            |side| async move {
                let page =
                    asiento_balances::statement(&side.database, side.store.as_ref(), query).await?;
                Ok((side, page))
            },
        )
        .await
}

fn csv_response(side: ReadSide, query: StatementQuery, first: Statement) -> Response {
    let filename = format!(
        "statement-{}-{}.csv",
        query.account.replace(':', "_"),
        query.currency
    );
    let pinned = StatementQuery {
        to: Point {
            position: Some(first.closing_position),
            time: None,
        },
        ..query
    };
    let mut head = format!("{CSV_COLUMNS}\r\n");
    head.push_str(&csv_row(
        &pinned,
        [
            "opening",
            "",
            &first.opening_position.to_string(),
            "",
            "",
            &first.opening_balance_minor.to_string(),
            "",
            "",
        ],
    ));
    head.push_str(&lines_csv(&pinned, &first));
    let closing = csv_row(
        &pinned,
        [
            "closing",
            "",
            &first.closing_position.to_string(),
            "",
            "",
            &first.closing_balance_minor.to_string(),
            "",
            "",
        ],
    );
    crate::csv::streamed(
        &filename,
        head,
        first.next_after,
        Some(closing),
        move |after| {
            let side = side.clone();
            let query = StatementQuery {
                after: Some(after),
                ..pinned.clone()
            };
            async move {
                let page = asiento_balances::statement(&side.database, side.store.as_ref(), &query)
                    .await?;
                Ok::<_, asiento_balances::BalanceError>((lines_csv(&query, &page), page.next_after))
            }
        },
    )
}
