//! The account listing (`GET /v1/accounts?prefix=`): every account of a tenant that has a balance
//! row (a posting or a declaration), with its balance and the policy in force, read from the
//! projected tables in one statement.

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
    pub balance_minor: Balance,
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

type Row = (
    Option<i64>,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<DateTime<Utc>>,
);

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
    let sql = format!(
        "SELECT (SELECT checkpoint_position FROM projections WHERE name = $1),
                b.account, b.currency, CAST(b.balance_minor AS TEXT),
                a.policy, a.metadata, a.declared_at
         FROM balances b
         LEFT JOIN account_policies a
           ON a.tenant = b.tenant AND a.account = b.account AND a.currency = b.currency
         WHERE b.tenant = $2 AND substr(b.account, 1, $3) = $4
           AND (b.account > $5 OR (b.account = $5 AND b.currency > $6)) {currency_clause}
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
        Some((checkpoint, ..)) => checkpoint.ok_or(BalanceError::NotInstalled)?,
        None => checkpoint(db).await?,
    };
    let accounts = rows
        .into_iter()
        .map(
            |(_, account, currency, balance, policy, metadata, declared_at)| {
                view(account, currency, &balance, policy, metadata, declared_at)
            },
        )
        .collect::<Result<_, sqlx::Error>>()?;
    Ok(AccountPage {
        accounts,
        as_of_position,
    })
}

fn view(
    account: String,
    currency: String,
    balance: &str,
    policy: Option<String>,
    metadata: Option<String>,
    declared_at: Option<DateTime<Utc>>,
) -> Result<AccountView, sqlx::Error> {
    let corrupt = |what: &str, error: &dyn std::fmt::Display| {
        sqlx::Error::Decode(format!("{what} of {account}: {error}").into())
    };
    let declared = policy.is_some();
    let policy = match policy {
        Some(text) => serde_json::from_str(&text).map_err(|e| corrupt("policy", &e))?,
        None => {
            AccountPolicy::implied(&AccountName::parse(&account).map_err(|e| corrupt("name", &e))?)
        }
    };
    let metadata = match metadata {
        Some(text) => serde_json::from_str(&text).map_err(|e| corrupt("metadata", &e))?,
        None => Map::new(),
    };
    Ok(AccountView {
        balance_minor: balance_of(balance)?,
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
