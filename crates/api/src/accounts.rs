//! `POST /v1/accounts` (declare an account's policy for one currency) and `GET /v1/accounts`
//! (list a tenant's accounts with their balances and policies).

use std::collections::HashMap;

use asiento_app::ledger::AccountDeclaration;
use asiento_balances::{AccountQuery, AccountView, ACCOUNTS_LIMIT_MAX};
use asiento_domain::account::is_valid_segment;
use asiento_domain::payment::{metadata_fits, METADATA_BYTES_MAX, METADATA_KEYS_MAX};
use asiento_domain::{AccountPolicy, Currency, NormalBalance, Overdraft};
use axum::{
    extract::{rejection::QueryRejection, Query, State},
    http::{HeaderMap, Method},
    response::Response,
    Json,
};
use serde_json::{Map, Value};

use crate::auth::AuthenticatedTenant;
use crate::body::{Fields, JsonObject};
use crate::commands::{answer_response, idempotent, tenant_id};
use crate::problem::Problem;
use crate::AppState;

/// Accounts per page when the client names no limit.
pub const ACCOUNTS_LIMIT_DEFAULT: usize = 100;

/// `POST /v1/accounts`
#[utoipa::path(
    post, path = "/v1/accounts", tag = "ledger", operation_id = "declare_account",
    params(("Idempotency-Key" = String, Header, description = "1-255 printable ASCII characters; scoped by tenant, method and route")),
    request_body = crate::openapi::DeclareAccountRequest,
    responses(
        (status = 201, description = "The account's first declaration in this currency", body = crate::openapi::Account),
        (status = 200, description = "A later declaration: it replaces the policy and metadata", body = crate::openapi::Account),
        (status = 400, description = "Invalid body, account or key", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 409, description = "The key's first request is still in flight, or account_busy (nothing done; retry with the same key after Retry-After)", body = crate::openapi::ProblemDetails, content_type = "application/problem+json"),
        (status = 422, description = "account_reserved (a system account), amount_too_large (the limit), or the key was reused", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn declare(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    method: Method,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, Problem> {
    let tenant = tenant_id(&tenant)?;
    let request = idempotent(&headers, &tenant, &method, "/v1/accounts".to_owned(), &body)?;
    let fields = Fields(&body);
    fields.only(&[
        "account",
        "currency",
        "normal_balance",
        "overdraft",
        "frozen",
        "metadata",
    ])?;
    let account = fields.account("account")?;
    let implied = AccountPolicy::implied(&account);
    let normal_balance = match fields.optional_string("normal_balance")? {
        None | Some("credit") => NormalBalance::Credit,
        Some("debit") => NormalBalance::Debit,
        Some(other) => {
            return Err(Problem::bad_request(
                "invalid_field",
                format!("normal_balance must be \"credit\" or \"debit\", got {other:?}"),
            ))
        }
    };
    let overdraft = match fields.optional_object("overdraft")? {
        None => implied.overdraft,
        Some(object) => overdraft(&object, &state)?,
    };
    let frozen = fields.flag("frozen")?;
    let metadata = fields.optional_object("metadata")?.unwrap_or_default();
    check_metadata(&metadata)?;
    let declaration = AccountDeclaration {
        tenant,
        account,
        currency: fields.currency("currency")?,
        policy: AccountPolicy {
            normal_balance,
            overdraft,
            frozen,
        },
        metadata,
    };
    Ok(answer_response(
        state.ledger.declare_account(&request, declaration).await,
    ))
}

/// `{"policy": "forbidden" | "allowed"}` or `{"policy": "limit", "limit_minor": N}`.
fn overdraft(object: &Map<String, Value>, state: &AppState) -> Result<Overdraft, Problem> {
    let fields = Fields(object);
    match fields.string("policy")? {
        "forbidden" => fields.only(&["policy"]).map(|()| Overdraft::Forbidden),
        "allowed" => fields.only(&["policy"]).map(|()| Overdraft::Allowed),
        "limit" => {
            fields.only(&["policy", "limit_minor"])?;
            Ok(Overdraft::Limit {
                limit_minor: fields.positive_amount("limit_minor", state.amount_limit)?,
            })
        }
        other => Err(Problem::bad_request(
            "invalid_field",
            format!(
                "overdraft.policy must be \"forbidden\", \"allowed\" or \"limit\", got {other:?}"
            ),
        )),
    }
}

fn check_metadata(metadata: &Map<String, Value>) -> Result<(), Problem> {
    if !metadata_fits(metadata) {
        return Err(Problem::bad_request(
            "metadata_too_large",
            format!(
                "metadata has more than {METADATA_KEYS_MAX} keys or {METADATA_BYTES_MAX} bytes"
            ),
        ));
    }
    Ok(())
}

type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

/// One page of `GET /v1/accounts`, serialized straight to bytes (balances may exceed i64).
#[derive(serde::Serialize)]
pub struct AccountList {
    data: Vec<AccountView>,
    /// The `after` of the next page (`account:CUR`), or null on the last one.
    next_after: Option<String>,
    as_of_position: i64,
}

/// `GET /v1/accounts?prefix=merchant:&currency=USD&after=merchant:a:USD&limit=100`
#[utoipa::path(
    get, path = "/v1/accounts", tag = "ledger", operation_id = "list_accounts",
    params(
        ("prefix" = Option<String>, Query, description = "Account names starting with this"),
        ("currency" = Option<String>, Query),
        ("after" = Option<String>, Query, description = "next_after of the previous page"),
        ("limit" = Option<u32>, Query, description = "1 to 1000, default 100"),
    ),
    responses(
        (status = 200, description = "Accounts with a posting or a declaration, in name order, as of the projection's checkpoint", body = crate::openapi::AccountList),
        (status = 400, description = "Invalid query", body = crate::openapi::ProblemDetails, content_type = "application/problem+json")
    )
)]
pub async fn list(
    State(state): State<AppState>,
    tenant: AuthenticatedTenant,
    query: Params,
) -> Result<Json<AccountList>, Problem> {
    let Query(params) =
        query.map_err(|rejection| Problem::bad_request("invalid_query", rejection.body_text()))?;
    let invalid = |detail: String| Problem::bad_request("invalid_query", detail);
    let prefix = params.get("prefix").cloned().unwrap_or_default();
    if !is_name_prefix(&prefix) {
        return Err(invalid(format!(
            "prefix {prefix:?} is not the beginning of an account name"
        )));
    }
    let currency = match params.get("currency") {
        None => None,
        Some(raw) => Some(
            Currency::parse(raw)
                .map_err(|error| Problem::bad_request("unknown_currency", error.to_string()))?,
        ),
    };
    let after = match params.get("after") {
        None => None,
        Some(raw) => Some(
            raw.rsplit_once(':')
                .filter(|(account, currency)| {
                    asiento_domain::AccountName::parse(account).is_ok()
                        && Currency::parse(currency).is_ok()
                })
                .map(|(account, currency)| (account.to_owned(), currency.to_owned()))
                .ok_or_else(|| invalid("after must be the next_after of a page".to_owned()))?,
        ),
    };
    let limit = match params.get("limit") {
        None => ACCOUNTS_LIMIT_DEFAULT,
        Some(raw) => raw
            .parse::<usize>()
            .ok()
            .filter(|limit| (1..=ACCOUNTS_LIMIT_MAX).contains(limit))
            .ok_or_else(|| invalid(format!("limit must be 1 to {ACCOUNTS_LIMIT_MAX}")))?,
    };
    let query = &AccountQuery {
        tenant: tenant.0.clone(),
        prefix,
        currency: currency.map(|c| c.code().to_owned()),
        after,
        limit,
    };
    let page = state
        .reads
        .read(
            crate::reads::Needs::Projection(asiento_balances::NAME),
            None,
            |side| async move { asiento_balances::list_accounts(&side.database, query).await },
        )
        .await
        .map_err(|error| Problem::server(&error))?;
    let next_after = (page.accounts.len() == limit)
        .then(|| page.accounts.last())
        .flatten()
        .map(|last| format!("{}:{}", last.account, last.currency));
    Ok(Json(AccountList {
        data: page.accounts,
        next_after,
        as_of_position: page.as_of_position,
    }))
}

/// Whether `prefix` can begin an account name: whole segments joined by ':', the last one
/// possibly cut short or empty after a trailing ':'.
fn is_name_prefix(prefix: &str) -> bool {
    if prefix.is_empty() {
        return true;
    }
    let segments: Vec<&str> = prefix.split(':').collect();
    let (last, whole) = segments.split_last().unwrap_or((&"", &[]));
    segments.len() <= asiento_domain::account::SEGMENTS_MAX
        && whole.iter().all(|segment| is_valid_segment(segment))
        && (last.is_empty() || is_valid_segment(last))
}

#[cfg(test)]
mod tests {
    use super::is_name_prefix;

    #[test]
    fn prefixes_are_beginnings_of_account_names() {
        for good in ["", "merchant", "merchant:", "merchant:a", "customer:42:av"] {
            assert!(is_name_prefix(good), "{good:?}");
        }
        for bad in [":", "a::", "Merchant", "a b", "a:%", "a:_%"] {
            assert!(!is_name_prefix(bad), "{bad:?}");
        }
    }
}
