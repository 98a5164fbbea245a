//! The account listing (`GET /v1/accounts?prefix=`): every account of a tenant that has a balance
//! row (a posting, a reservation or a declaration), with its balance, what holds reserve on it and the policy in
//! force, read from the projected tables in one statement. Pending accounts are not listed on
//! their own: their balances show on the account they reserve for.

use asiento_domain::account::{PENDING_CREDITS_ROOT, PENDING_DEBITS_ROOT};
use asiento_domain::{AccountName, AccountPolicy, Balance};
use asiento_eventstore::Database;
use asiento_projector::on_db;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::decode::balance as balance_of;
use crate::{BalanceError, NAME};

/// Accounts per page, at most.
pub const ACCOUNTS_LIMIT_MAX: usize = 1_000;

/// One account and currency: its balance and what it allows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccountView {
    pub account: String,
    pub currency: String,
    /// The posted balance.
    pub balance_minor: Balance,
    pub pending_debits_minor: Balance,
    pub pending_credits_minor: Balance,
    /// What a command may still draw on under the policy ([`AccountPolicy::available`]).
    pub available_minor: Balance,
    /// The declared policy, or the one the name implies when `declared` is false.
    #[serde(flatten)]
    pub policy: AccountPolicy,
    pub declared: bool,
    pub declared_at: Option<DateTime<Utc>>,
    pub metadata: Map<String, Value>,
}

/// A page of accounts, and the projection position it is exact at.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountPage {
    pub accounts: Vec<AccountView>,
    pub as_of_position: i64,
}

/// Which accounts to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountQuery {
    pub tenant: String,
    /// Names starting with this (`""`: all).
    pub prefix: String,
    pub currency: Option<String>,
    /// The (account, currency) the previous page ended with.
    pub after: Option<(String, String)>,
    pub limit: usize,
}

#[derive(sqlx::FromRow)]
struct Row {
    checkpoint: Option<i64>,
    account: String,
    currency: String,
    balance: String,
    pending_debits: Option<String>,
    pending_credits: Option<String>,
    policy: Option<String>,
    metadata: Option<String>,
    declared_at: Option<DateTime<Utc>>,
}

/// The accounts matching `query`, in (account, currency) order.
pub async fn list_accounts(
    db: &Database,
    query: &AccountQuery,
) -> Result<AccountPage, BalanceError> {
    let limit = i64::try_from(query.limit.clamp(1, ACCOUNTS_LIMIT_MAX)).unwrap_or(1);
    let currency_clause = if query.currency.is_some() {
        "AND b.currency = $8"
    } else {
        ""
    };
    // The checkpoint comes from the same statement, so it agrees with the rows even while a
    // batch commits; the prefix is compared with substr, which no name character can escape.
    let debits_chars = PENDING_DEBITS_ROOT.len() + 1;
    let credits_chars = PENDING_CREDITS_ROOT.len() + 1;
    let sql = format!(
        "SELECT (SELECT checkpoint_position FROM projections WHERE name = $1) AS checkpoint,
                b.account, b.currency, CAST(b.balance_minor AS TEXT) AS balance,
                CAST(d.balance_minor AS TEXT) AS pending_debits,
                CAST(c.balance_minor AS TEXT) AS pending_credits,
                a.policy, a.metadata, a.declared_at
         FROM balances b
         LEFT JOIN account_policies a
           ON a.tenant = b.tenant AND a.account = b.account AND a.currency = b.currency
         LEFT JOIN balances d ON d.tenant = b.tenant
           AND d.account = '{PENDING_DEBITS_ROOT}:' || b.account AND d.currency = b.currency
         LEFT JOIN balances c ON c.tenant = b.tenant
           AND c.account = '{PENDING_CREDITS_ROOT}:' || b.account AND c.currency = b.currency
         WHERE b.tenant = $2 AND substr(b.account, 1, $3) = $4
           AND (b.account > $5 OR (b.account = $5 AND b.currency > $6)) {currency_clause}
           AND substr(b.account, 1, {debits_chars}) <> '{PENDING_DEBITS_ROOT}:'
           AND substr(b.account, 1, {credits_chars}) <> '{PENDING_CREDITS_ROOT}:'
         ORDER BY b.account, b.currency
         LIMIT $7"
    );
    // An i32: PostgreSQL's substr takes integer lengths.
    let prefix_chars = i32::try_from(query.prefix.chars().count()).unwrap_or(i32::MAX);
    let (after_account, after_currency) = query.after.clone().unwrap_or_default();
    let rows: Vec<Row> = on_db!(db, pool => {
        sqlx::query_as(&sql)
            .bind(NAME)
            .bind(&query.tenant)
            .bind(prefix_chars)
            .bind(&query.prefix)
            .bind(&after_account)
            .bind(&after_currency)
            .bind(limit)
            .bind(query.currency.as_deref().unwrap_or_default())
            .fetch_all(pool)
            .await?
    });
    let as_of_position = match rows.first() {
        Some(row) => row.checkpoint.ok_or(BalanceError::NotInstalled)?,
        None => checkpoint(db).await?,
    };
    let accounts = rows
        .into_iter()
        .map(view)
        .collect::<Result<_, sqlx::Error>>()?;
    Ok(AccountPage {
        accounts,
        as_of_position,
    })
}

fn view(row: Row) -> Result<AccountView, sqlx::Error> {
    let Row {
        account,
        currency,
        balance,
        pending_debits,
        pending_credits,
        policy,
        metadata,
        declared_at,
        ..
    } = row;
    let corrupt = |what: &str, error: &dyn std::fmt::Display| {
        sqlx::Error::Decode(format!("{what} of {account}: {error}").into())
    };
    let declared = policy.is_some();
    let policy: AccountPolicy = match policy {
        Some(text) => serde_json::from_str(&text).map_err(|e| corrupt("policy", &e))?,
        None => {
            AccountPolicy::implied(&AccountName::parse(&account).map_err(|e| corrupt("name", &e))?)
        }
    };
    let metadata = match metadata {
        Some(text) => serde_json::from_str(&text).map_err(|e| corrupt("metadata", &e))?,
        None => Map::new(),
    };
    let balance = balance_of(&balance)?;
    let pending = |text: Option<String>| {
        text.as_deref()
            .map(balance_of)
            .transpose()
            .map(Option::unwrap_or_default)
    };
    // Money reserved to leave sits as a negative balance on `pending_debits:`.
    let pending_debits = pending(pending_debits)?
        .checked_neg()
        .map_err(|e| corrupt("pending debits", &e))?;
    let pending_credits = pending(pending_credits)?;
    let available = policy
        .available(balance, pending_debits, pending_credits)
        .map_err(|e| corrupt("available balance", &e))?;
    Ok(AccountView {
        balance_minor: balance,
        pending_debits_minor: pending_debits,
        pending_credits_minor: pending_credits,
        available_minor: available,
        account,
        currency,
        policy,
        declared,
        declared_at,
        metadata,
    })
}

async fn checkpoint(db: &Database) -> Result<i64, BalanceError> {
    let checkpoint: Option<i64> = on_db!(db, pool => {
        sqlx::query_scalar("SELECT checkpoint_position FROM projections WHERE name = $1")
            .bind(NAME)
            .fetch_optional(pool)
            .await?
    });
    checkpoint.ok_or(BalanceError::NotInstalled)
}
