//! Ledger reads from the balances read model: an account's balance (exact even while the projector
//! lags: snapshot plus the entries after it; `min_position` for read-your-writes), its legs, and
//! one journal entry.

use std::collections::HashMap;

use asiento_app::log;
use asiento_balances::BalanceError;
use asiento_domain::{AccountName, AccountPolicy, Balance, Currency, GuardKey};
use axum::{
    extract::{rejection::QueryRejection, Path, Query, State},
    http::StatusCode,
    Json,
};
use serde_json::{json, Value};

use crate::auth::AuthenticatedTenant;
use crate::problem::Problem;
use crate::reads::Needs;
use crate::AppState;

/// Legs per page when the client names no limit.
pub const ENTRIES_LIMIT_DEFAULT: usize = 100;

pub(crate) type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

pub(crate) fn params(query: Params) -> Result<HashMap<String, String>, Problem> {
    query
        .map(|Query(map)| map)
        .map_err(|rejection| Problem::bad_request("invalid_query", rejection.body_text()))
}

pub(crate) fn account(raw: &str) -> Result<AccountName, Problem> {
    AccountName::parse(raw)
        .map_err(|error| Problem::bad_request("invalid_account", error.to_string()))
}

pub(crate) fn currency(params: &HashMap<String, String>) -> Result<Currency, Problem> {
    let raw = params
        .get("currency")
        .ok_or_else(|| Problem::bad_request("missing_field", "currency is required"))?;
    Currency::parse(raw)
        .map_err(|error| Problem::bad_request("unknown_currency", error.to_string()))
}

/// A non-negative integer query parameter.
pub(crate) fn position(
    params: &HashMap<String, String>,
    name: &str,
) -> Result<Option<i64>, Problem> {
    match params.get(name) {
        None => Ok(None),
        Some(raw) => raw
            .parse::<i64>()
            .ok()
            .filter(|value| *value >= 0)
            .map(Some)
            .ok_or_else(|| {
                Problem::bad_request(
                    "invalid_query",
                    format!("{name} must be a non-negative integer"),
                )
            }),
    }
}

/// A `min_position` must name an event the log has: waiting for one it never had would hold the
/// request for the whole wait and end in a 503 that no retry can fix. 0 names no event: it means
/// "nothing written yet" (a client that has not written anything, or an empty log), which every
/// read already includes, so it never waits and is never unknown.
pub(crate) async fn known_position(state: &AppState, position: Option<i64>) -> Result<(), Problem> {
    let Some(position) = position.filter(|position| *position > 0) else {
        return Ok(());
    };
    match state.payments.store().cursor_of_position(position).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(Problem::bad_request(
            "unknown_position",
            format!("no event at position {position}: pass a position a command returned"),
        )),
        Err(error) => Err(Problem::server(&error)),
    }
}

pub(crate) fn balance_problem(error: BalanceError) -> Problem {
    match error {
        BalanceError::ProjectionLagging { waited_ms } => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "projection_lagging",
            format!("the balances read model did not reach the position in {waited_ms} ms; retry"),
        )
        .with_retry_after(1),
        BalanceError::UnknownPosition { position } => Problem::bad_request(
            "unknown_position",
            format!("no event at position {position}"),
        ),
        BalanceError::InvalidCursor => {
            Problem::bad_request("invalid_query", "after: not a cursor a page gave out")
        }
        other => Problem::server(&other),
    }
}

/// `GET /v1/accounts/{account}/balance?currency=USD[&min_position=N]`
#[utoipa::path(
    get, path = "/v1/accounts/{account}/balance", tag = "ledger", operation_id = "get_balance",
    params(
        ("account" = String, Path, description = "segment(:segment)*"),
        ("currency" = String, Query),
        ("min_position" = Option<i64>, Query, description = "Wait (up to 5 s) until the balance includes this position"),
        ("at_position" = Option<i64>, Query, description = "The balance after the event at this position"),
        ("at" = Option<String>, Query, description = "RFC 3339: the balance right after the tenant's last journal entry recorded at or before this time (with at_position: up to that position)"),
    ),
    responses(
        (status = 200, description = "Now: the snapshot plus the entries after it, exact even while the projector lags; in the past (`at`, `at_position`): from the legs and their marks", body = crate::openapi::Balance),
        (status = 400, description = "Invalid account, currency or position", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 503, description = "projection_lagging", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn balance(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(raw_account): Path<String>,
    query: Params,
) -> Result<Json<BalanceBody>, Problem> {
    let params = params(query)?;
    let account = account(&raw_account)?;
    let currency = currency(&params)?;
    let min_position = position(&params, "min_position")?;
    known_position(&state, min_position).await?;
    let point = asiento_balances::Point {
        position: position(&params, "at_position")?,
        time: crate::statement::time(&params, "at")?,
    };
    known_position(&state, point.position).await?;
    let (tenant_id, account_name) = (tenant.0.as_str(), &account);
    // Now: the snapshot and the log after it. In the past: the legs and their marks, waiting for
    // the point, which a known `min_position` precedes or needs no wait for.
    let now = point == asiento_balances::Point::default();
    let (needs, needs_position) = if now {
        (Needs::Log, min_position)
    } else {
        (
            Needs::Projection(asiento_balances::ENTRIES_NAME),
            point.position,
        )
    };
    let balance = state
        .reads
        .read(needs, needs_position, |side| async move {
            if now {
                asiento_balances::read_balance(
                    &side.database,
                    side.store.as_ref(),
                    tenant_id,
                    account_name,
                    currency.code(),
                    min_position,
                )
                .await
            } else {
                asiento_balances::balance_at(
                    &side.database,
                    side.store.as_ref(),
                    tenant_id,
                    account_name,
                    currency.code(),
                    point,
                )
                .await
            }
        })
        .await
        .map_err(balance_problem)?;
    // The policy in force decides which reservations count against the balance: the declared
    // one, from the account's guard (the log, never stale), or the one its name implies. A
    // balance of the past is shown under the policy in force now.
    let policy = if account.is_guarded() {
        let key = GuardKey {
            tenant: crate::commands::tenant_id(&tenant)?,
            account: account.clone(),
            currency,
        };
        log::load_guard(state.ledger.store().as_ref(), &key)
            .await
            .map_err(|error| Problem::server(&error))?
            .policy(&account)
    } else {
        AccountPolicy::implied(&account)
    };
    let available = policy
        .available(
            balance.balance_minor,
            balance.pending_debits_minor,
            balance.pending_credits_minor,
        )
        .map_err(|error| Problem::server(&error))?;
    Ok(Json(BalanceBody {
        account,
        currency,
        balance_minor: balance.balance_minor,
        pending_debits_minor: balance.pending_debits_minor,
        pending_credits_minor: balance.pending_credits_minor,
        available_minor: available,
        as_of_position: balance.as_of_position,
    }))
}

/// The balance route's body, serialized straight to bytes: a balance can exceed i64, which a
/// `serde_json::Value` cannot hold.
#[derive(serde::Serialize)]
pub struct BalanceBody {
    account: AccountName,
    currency: Currency,
    /// The posted balance.
    balance_minor: Balance,
    pending_debits_minor: Balance,
    pending_credits_minor: Balance,
    available_minor: Balance,
    as_of_position: i64,
}

/// `GET /v1/accounts/{account}/entries?currency=USD&after=POS&limit=100`
#[utoipa::path(
    get, path = "/v1/accounts/{account}/entries", tag = "ledger", operation_id = "list_account_entries",
    params(
        ("account" = String, Path),
        ("currency" = String, Query),
        ("after" = Option<i64>, Query, description = "next_after of the previous page"),
        ("limit" = Option<u32>, Query, description = "1 to 1000, default 100"),
        ("min_position" = Option<i64>, Query),
    ),
    responses(
        (status = 200, description = "The account's legs, oldest first", body = crate::openapi::AccountEntries),
        (status = 400, description = "Invalid query", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 503, description = "projection_lagging", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn entries(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(raw_account): Path<String>,
    query: Params,
) -> Result<Json<Value>, Problem> {
    let params = params(query)?;
    let account = account(&raw_account)?;
    let currency = currency(&params)?;
    let after = position(&params, "after")?;
    let min_position = position(&params, "min_position")?;
    known_position(&state, min_position).await?;
    let limit = match position(&params, "limit")? {
        None => ENTRIES_LIMIT_DEFAULT,
        Some(limit) => usize::try_from(limit)
            .ok()
            .filter(|limit| (1..=asiento_balances::ENTRIES_LIMIT_MAX).contains(limit))
            .ok_or_else(|| {
                Problem::bad_request(
                    "invalid_query",
                    format!("limit must be 1 to {}", asiento_balances::ENTRIES_LIMIT_MAX),
                )
            })?,
    };
    let (tenant_id, account_name) = (tenant.0.as_str(), account.as_str());
    let legs = state
        .reads
        .read(
            Needs::Projection(asiento_balances::ENTRIES_NAME),
            min_position,
            |side| async move {
                asiento_balances::entries(
                    &side.database,
                    side.store.as_ref(),
                    tenant_id,
                    account_name,
                    currency.code(),
                    after,
                    limit,
                    min_position,
                )
                .await
            },
        )
        .await
        .map_err(balance_problem)?;
    let next_after = if legs.len() == limit {
        legs.last().map(|leg| leg.position)
    } else {
        None
    };
    Ok(Json(json!({
        "account": account.as_str(),
        "currency": currency.code(),
        "data": legs,
        "next_after": next_after,
    })))
}

/// `GET /v1/journal/{entry_id}[?min_position=N]`
#[utoipa::path(
    get, path = "/v1/journal/{entry_id}", tag = "ledger", operation_id = "get_journal_entry",
    params(("entry_id" = String, Path, description = "je_…"), ("min_position" = Option<i64>, Query)),
    responses(
        (status = 200, description = "One journal entry with all its legs", body = crate::openapi::JournalEntry),
        (status = 404, description = "No such entry for this tenant", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 503, description = "projection_lagging", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn journal_entry(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    Path(entry_id): Path<String>,
    query: Params,
) -> Result<Json<Value>, Problem> {
    let params = params(query)?;
    let min_position = position(&params, "min_position")?;
    known_position(&state, min_position).await?;
    let not_found = || {
        Problem::new(
            StatusCode::NOT_FOUND,
            "entry_not_found",
            "journal entry not found",
        )
    };
    let entry_id = asiento_domain::EntryId::parse(&entry_id).map_err(|_| not_found())?;
    let (tenant_id, entry_id) = (tenant.0.as_str(), &entry_id.to_string());
    let entry = state
        .reads
        .find(
            Needs::Projection(asiento_balances::ENTRIES_NAME),
            min_position,
            |side| async move {
                asiento_balances::journal_entry(
                    &side.database,
                    side.store.as_ref(),
                    tenant_id,
                    entry_id,
                    min_position,
                )
                .await
            },
        )
        .await
        .map_err(balance_problem)?
        .ok_or_else(not_found)?;
    Ok(Json(
        serde_json::to_value(entry).map_err(|error| Problem::internal(&error))?,
    ))
}
