//! `GET /v1/balance_monitors`: a tenant's monitors, as of the projection's checkpoint, with
//! whether each matches its condition now.

use asiento_domain::monitor::MonitorCreated;
use asiento_eventstore::{Database, EventStore};
use asiento_projector::{on_db, wait_for_position, WaitError, READ_WAIT_MS_MAX};
use serde_json::Value;

use super::store::MONITORS_VIEW;
use crate::FeedError;

/// The most monitors one page may hold.
pub const MONITORS_LIMIT_MAX: u32 = 100;
/// The most active monitors a tenant may have: each entry of an account is judged against its
/// monitors, so their number is bounded like every other thing a client makes.
pub const MONITORS_PER_TENANT_MAX: i64 = 100;

/// How many active monitors the tenant has, as of the projection's checkpoint.
pub async fn active_monitors(db: &Database, tenant: &str) -> Result<i64, FeedError> {
    let sql =
        format!("SELECT COUNT(*) FROM {MONITORS_VIEW} WHERE tenant = $1 AND deleted_at IS NULL");
    Ok(on_db!(db, pool => sqlx::query_scalar(&sql).bind(tenant).fetch_one(pool).await?))
}

/// Whose monitors, on which account, from where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorQuery {
    pub tenant: String,
    /// Only the monitors of this account.
    pub account: Option<String>,
    /// Only the monitors in this currency.
    pub currency: Option<String>,
    /// Deleted monitors too.
    pub include_deleted: bool,
    /// The page after this monitor id.
    pub after: Option<String>,
    pub limit: u32,
    /// Wait (at most [`READ_WAIT_MS_MAX`]) until the list reflects the event at this position.
    pub min_position: Option<i64>,
}

/// A page of monitor objects and the id to pass as `after` for the next one.
#[derive(Debug, Clone, PartialEq)]
pub struct MonitorPage {
    pub data: Vec<Value>,
    pub next_after: Option<String>,
}

/// The tenant's monitors in id order, each with `matching`: whether its condition holds as of
/// the projection's checkpoint.
pub async fn list_monitors(
    db: &Database,
    store: &dyn EventStore,
    query: &MonitorQuery,
) -> Result<MonitorPage, FeedError> {
    if let Some(position) = query.min_position {
        match wait_for_position(db, store, crate::NAME, position, READ_WAIT_MS_MAX).await {
            Ok(_) => {}
            Err(WaitError::Lagging { waited_ms, .. }) => {
                return Err(FeedError::Lagging { waited_ms })
            }
            Err(WaitError::NotInstalled { .. }) => return Err(FeedError::NotInstalled),
            Err(WaitError::Store(error)) => return Err(error.into()),
            Err(WaitError::Database(error)) => return Err(error.into()),
        }
    }
    let limit = query.limit.clamp(1, MONITORS_LIMIT_MAX);
    let mut sql = format!(
        "SELECT created, deleted_at, matching FROM {MONITORS_VIEW} \
         WHERE tenant = $1 AND monitor_id > $2"
    );
    // Placeholders numbered in the order they appear (SQLite numbers them so).
    let mut next = 3;
    for (column, value) in [("account", &query.account), ("currency", &query.currency)] {
        if value.is_some() {
            sql.push_str(&format!(" AND {column} = ${next}"));
            next += 1;
        }
    }
    if !query.include_deleted {
        sql.push_str(" AND deleted_at IS NULL");
    }
    sql.push_str(&format!(" ORDER BY monitor_id LIMIT ${next}"));
    let after = query.after.clone().unwrap_or_default();
    let rows: Vec<(String, Option<String>, bool)> = on_db!(db, pool => {
        let mut q = sqlx::query_as(&sql).bind(&query.tenant).bind(&after);
        for value in [&query.account, &query.currency].into_iter().flatten() {
            q = q.bind(value);
        }
        q.bind(i64::from(limit) + 1).fetch_all(pool).await?
    });
    let more = rows.len() > limit as usize;
    let mut data = Vec::with_capacity(rows.len().min(limit as usize));
    for (created, deleted_at, matching) in rows.into_iter().take(limit as usize) {
        let created: MonitorCreated = serde_json::from_str(&created)
            .map_err(|e| sqlx::Error::Decode(format!("a stored monitor: {e}").into()))?;
        let deleted_at = deleted_at
            .as_deref()
            .map(chrono::DateTime::parse_from_rfc3339)
            .transpose()
            .map_err(|e| sqlx::Error::Decode(format!("a stored time: {e}").into()))?
            .map(|t| t.with_timezone(&chrono::Utc));
        let mut object = asiento_objects::monitor_json(&created, deleted_at.as_ref());
        object["matching"] = Value::Bool(matching);
        data.push(object);
    }
    let next_after = more
        .then(|| {
            data.last()
                .and_then(|o| o["id"].as_str().map(str::to_owned))
        })
        .flatten();
    Ok(MonitorPage { data, next_after })
}
