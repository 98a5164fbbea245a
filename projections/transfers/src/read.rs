//! The read side: the filtered list with keyset pages, and read-your-writes waits.

use asiento_domain::{AccountName, TenantId, TransferId, TransferStatus};
use asiento_eventstore::{Database, EventStore};
use asiento_projector::keyset::{bound_ns, Keyset};
use asiento_projector::{on_db, WaitError, READ_WAIT_MS_MAX};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;

use crate::projection::VIEW;
use crate::{parse_status, ListError, Page, TransferRow, NAME};

/// The most transfers one page may hold.
pub const LIST_LIMIT_MAX: u32 = 100;
/// The page size when the client names none.
pub const LIST_LIMIT_DEFAULT: u32 = 50;

/// `GET /v1/transfers` filters, each optional; they combine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferFilter {
    /// Transfers that leave or reach this account.
    pub account: Option<AccountName>,
    pub status: Option<TransferStatus>,
    /// Requested at or after.
    pub created_gte: Option<DateTime<Utc>>,
    /// Requested strictly before.
    pub created_lt: Option<DateTime<Utc>>,
    /// 1..=[`LIST_LIMIT_MAX`].
    pub limit: u32,
    /// The `next_cursor` of the previous page; None for the first (newest) page.
    pub cursor: Option<String>,
}

impl Default for TransferFilter {
    fn default() -> Self {
        TransferFilter {
            account: None,
            status: None,
            created_gte: None,
            created_lt: None,
            limit: LIST_LIMIT_DEFAULT,
            cursor: None,
        }
    }
}

/// The columns a [`TransferRow`] is read from; never `history`, which only the projector reads.
pub(crate) const COLUMNS: &str =
    "transfer_id, tenant, from_account, to_account, status, created_ns, version, position, object";

#[derive(sqlx::FromRow)]
pub(crate) struct Row {
    transfer_id: String,
    tenant: String,
    from_account: String,
    to_account: String,
    status: String,
    created_ns: i64,
    version: i64,
    position: i64,
    object: Json<Value>,
}

impl Row {
    pub(crate) fn into_transfer(self) -> Result<TransferRow, ListError> {
        let corrupt = |reason: &str| ListError::CorruptRow {
            transfer_id: self.transfer_id.clone(),
            reason: reason.to_owned(),
        };
        let status = parse_status(&self.status).ok_or_else(|| corrupt("unknown status"))?;
        let version = u64::try_from(self.version).map_err(|_| corrupt("negative version"))?;
        Ok(TransferRow {
            id: self.transfer_id,
            tenant: self.tenant,
            from: self.from_account,
            to: self.to_account,
            status,
            created_at: DateTime::from_timestamp_nanos(self.created_ns),
            object: self.object.0,
            version,
            position: self.position,
        })
    }
}

/// A bind parameter of a query assembled from the filters that are present.
enum Param {
    Text(String),
    Int(i64),
}

/// The tenant's transfers, newest first (requested at, then id, descending), filtered; at most
/// `filter.limit`.
#[tracing::instrument(skip(db))]
pub async fn list_transfers(
    db: &Database,
    tenant: &TenantId,
    filter: TransferFilter,
) -> Result<Page, ListError> {
    if !(1..=LIST_LIMIT_MAX).contains(&filter.limit) {
        return Err(ListError::LimitOutOfRange {
            limit: filter.limit,
        });
    }
    let after = filter
        .cursor
        .as_deref()
        .map(|cursor| Keyset::decode(cursor).ok_or(ListError::InvalidCursor))
        .transpose()?;
    let mut sql = format!("SELECT {COLUMNS} FROM {VIEW} WHERE tenant = $1");
    let mut params = vec![Param::Text(tenant.as_str().to_owned())];
    if let Some(account) = &filter.account {
        // Each side has its index; the planner combines them.
        params.push(Param::Text(account.as_str().to_owned()));
        params.push(Param::Text(account.as_str().to_owned()));
        sql.push_str(&format!(
            " AND (from_account = ${} OR to_account = ${})",
            params.len() - 1,
            params.len()
        ));
    }
    if let Some(status) = filter.status {
        params.push(Param::Text(status.as_str().to_owned()));
        sql.push_str(&format!(" AND status = ${}", params.len()));
    }
    if let Some(gte) = filter.created_gte {
        params.push(Param::Int(bound_ns(gte)));
        sql.push_str(&format!(" AND created_ns >= ${}", params.len()));
    }
    if let Some(lt) = filter.created_lt {
        params.push(Param::Int(bound_ns(lt)));
        sql.push_str(&format!(" AND created_ns < ${}", params.len()));
    }
    if let Some(after) = after {
        params.push(Param::Int(after.created_ns));
        params.push(Param::Text(TransferId::from_uuid(after.id).to_string()));
        sql.push_str(&format!(
            " AND (created_ns, transfer_id) < (${}, ${})",
            params.len() - 1,
            params.len()
        ));
    }
    // One more than the page: whether it exists says if there is a next page.
    params.push(Param::Int(i64::from(filter.limit) + 1));
    sql.push_str(&format!(
        " ORDER BY created_ns DESC, transfer_id DESC LIMIT ${}",
        params.len()
    ));
    let rows: Vec<Row> = on_db!(db, pool => {
        let mut query = sqlx::query_as(&sql);
        for param in &params {
            query = match param {
                Param::Text(text) => query.bind(text.as_str()),
                Param::Int(int) => query.bind(*int),
            };
        }
        query.fetch_all(pool).await?
    });
    let limit = usize::try_from(filter.limit).unwrap_or(usize::MAX);
    let more = rows.len() > limit;
    let data = rows
        .into_iter()
        .take(limit)
        .map(Row::into_transfer)
        .collect::<Result<Vec<_>, _>>()?;
    let next_cursor = match data.last() {
        Some(last) if more => {
            let id = TransferId::parse(&last.id).map_err(|_| ListError::CorruptRow {
                transfer_id: last.id.clone(),
                reason: "malformed id".to_owned(),
            })?;
            Some(
                Keyset {
                    created_ns: bound_ns(last.created_at),
                    id: id.as_uuid(),
                }
                .encode(),
            )
        }
        _ => None,
    };
    Ok(Page { data, next_cursor })
}

/// Waits (at most [`READ_WAIT_MS_MAX`]) until the transfers projection has applied the event at
/// `position` (a command's `position`, passed back as `min_position`).
#[tracing::instrument(skip(db, store))]
pub async fn wait_for_position(
    db: &Database,
    store: &dyn EventStore,
    position: i64,
) -> Result<(), ListError> {
    match asiento_projector::wait_for_position(db, store, NAME, position, READ_WAIT_MS_MAX).await {
        Ok(_) => Ok(()),
        Err(WaitError::Lagging { waited_ms, .. }) => {
            Err(ListError::ProjectionLagging { waited_ms })
        }
        Err(WaitError::NotInstalled { .. }) => Err(ListError::NotInstalled),
        Err(WaitError::Store(e)) => Err(e.into()),
        Err(WaitError::Database(e)) => Err(e.into()),
    }
}
