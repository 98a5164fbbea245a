//! The read side of payments: one payment, the filtered list with keyset pages, and
//! read-your-writes waits.

use asiento_domain::payment::NextAction;
use asiento_domain::{CustomerId, PaymentId, PaymentStatus, TenantId};
use asiento_eventstore::{Backend, Database, EventStore};
use asiento_projector::keyset::{bound_ns, Keyset};
use asiento_projector::{on_db, WaitError, READ_WAIT_MS_MAX};
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use sqlx::types::Json;

use crate::fold::from_ns;
use crate::{Page, PaymentRow, ViewError, NAME};

/// The most payments one page may hold (API.md `limit`).
pub const LIST_LIMIT_MAX: u32 = 100;
/// The page size when the client names none.
pub const LIST_LIMIT_DEFAULT: u32 = 50;
/// The most `metadata[key]=value` filters one list may combine.
pub const METADATA_FILTERS_MAX: usize = 10;
/// The rows of one page of an export ([`export_page`]): a fixed, small buffer whose
/// allocations stay under the allocator's mmap threshold, so that pages reuse the same heap.
pub const EXPORT_PAGE_ROWS: u32 = 250;

/// The view every read goes through (the active generation's table).
pub(crate) const VIEW: &str = "payments";
/// Every column a [`PaymentRow`] needs; never `state`, which only the projector and `verify` read.
pub(crate) const COLUMNS: &str =
    "payment_id, tenant, status, amount_minor, currency, customer, provider, \
     captured_minor, refunded_minor, fee_minor, created_ns, updated_ns, next_action, version, \
     position, description, metadata";

/// `GET /v1/payments` query parameters, validated except for `limit` and `cursor`, which
/// [`list_payments`] checks (both are 400s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentFilter {
    pub status: Option<PaymentStatus>,
    pub customer: Option<CustomerId>,
    /// The provider's name (`sim`, `stripe` …).
    pub provider: Option<String>,
    /// Created at or after.
    pub created_gte: Option<DateTime<Utc>>,
    /// Created strictly before.
    pub created_lt: Option<DateTime<Utc>>,
    /// Last changed at or after.
    pub updated_gte: Option<DateTime<Utc>>,
    /// Last changed strictly before.
    pub updated_lt: Option<DateTime<Utc>>,
    /// The amount asked for, at least.
    pub amount_gte: Option<i64>,
    /// The amount asked for, at most.
    pub amount_lte: Option<i64>,
    /// Each `(key, value)`: the payment's metadata holds `key` with exactly the string `value`
    /// (all of them; at most [`METADATA_FILTERS_MAX`]).
    pub metadata: Vec<(String, String)>,
    /// 1..=[`LIST_LIMIT_MAX`].
    pub limit: u32,
    /// The `next_cursor` of the previous page; None for the first (newest) page.
    pub cursor: Option<String>,
}

impl Default for PaymentFilter {
    fn default() -> Self {
        PaymentFilter {
            status: None,
            customer: None,
            provider: None,
            created_gte: None,
            created_lt: None,
            updated_gte: None,
            updated_lt: None,
            amount_gte: None,
            amount_lte: None,
            metadata: Vec::new(),
            limit: LIST_LIMIT_DEFAULT,
            cursor: None,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct Row {
    payment_id: String,
    tenant: String,
    status: String,
    amount_minor: i64,
    currency: String,
    customer: String,
    provider: String,
    captured_minor: i64,
    refunded_minor: i64,
    fee_minor: i64,
    created_ns: i64,
    updated_ns: i64,
    next_action: Option<Json<NextAction>>,
    version: i64,
    position: i64,
    description: Option<String>,
    metadata: Json<Map<String, Value>>,
}

impl Row {
    pub(crate) fn into_payment(self) -> Result<PaymentRow, ViewError> {
        let corrupt = |reason: &str| ViewError::CorruptRow {
            payment_id: self.payment_id.clone(),
            reason: reason.to_owned(),
        };
        let id = PaymentId::parse(&self.payment_id).map_err(|_| corrupt("malformed id"))?;
        let status = PaymentStatus::ALL
            .into_iter()
            .find(|s| s.as_str() == self.status)
            .ok_or_else(|| corrupt("unknown status"))?;
        let version = u64::try_from(self.version).map_err(|_| corrupt("negative version"))?;
        Ok(PaymentRow {
            id,
            tenant: self.tenant,
            status,
            amount_minor: self.amount_minor,
            currency: self.currency,
            customer: self.customer,
            provider: self.provider,
            captured_minor: self.captured_minor,
            refunded_minor: self.refunded_minor,
            fee_minor: self.fee_minor,
            description: self.description,
            metadata: self.metadata.0,
            created_at: from_ns(self.created_ns),
            updated_at: from_ns(self.updated_ns),
            next_action: self.next_action.map(|Json(a)| a),
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

/// The tenant's payments, newest first (created_at, then id, descending), filtered; at most
/// `filter.limit`. Pages by keyset: a payment created after the first page was read never
/// shifts later pages.
#[tracing::instrument(skip(db))]
pub async fn list_payments(
    db: &Database,
    tenant: &TenantId,
    filter: PaymentFilter,
) -> Result<Page, ViewError> {
    if !(1..=LIST_LIMIT_MAX).contains(&filter.limit) {
        return Err(ViewError::LimitOutOfRange {
            limit: filter.limit,
        });
    }
    page(db, tenant, filter).await
}

/// One page of an export of the tenant's payments (`GET /v1/payments` as CSV): the list's order,
/// filters and cursor, [`EXPORT_PAGE_ROWS`] at a time whatever `filter.limit` says.
#[tracing::instrument(skip(db))]
pub async fn export_page(
    db: &Database,
    tenant: &TenantId,
    filter: PaymentFilter,
) -> Result<Page, ViewError> {
    page(
        db,
        tenant,
        PaymentFilter {
            limit: EXPORT_PAGE_ROWS,
            ..filter
        },
    )
    .await
}

async fn page(db: &Database, tenant: &TenantId, filter: PaymentFilter) -> Result<Page, ViewError> {
    let after = filter
        .cursor
        .as_deref()
        .map(|cursor| Keyset::decode(cursor).ok_or(ViewError::InvalidCursor))
        .transpose()?;

    let mut sql = format!("SELECT {COLUMNS} FROM {VIEW} WHERE tenant = $1");
    let mut params = vec![Param::Text(tenant.as_str().to_owned())];
    if let Some(status) = filter.status {
        params.push(Param::Text(status.as_str().to_owned()));
        sql.push_str(&format!(" AND status = ${}", params.len()));
    }
    if let Some(customer) = &filter.customer {
        params.push(Param::Text(customer.as_str().to_owned()));
        sql.push_str(&format!(" AND customer = ${}", params.len()));
    }
    if let Some(provider) = &filter.provider {
        params.push(Param::Text(provider.clone()));
        sql.push_str(&format!(" AND provider = ${}", params.len()));
    }
    if let Some(gte) = filter.created_gte {
        params.push(Param::Int(bound_ns(gte)));
        sql.push_str(&format!(" AND created_ns >= ${}", params.len()));
    }
    if let Some(lt) = filter.created_lt {
        params.push(Param::Int(bound_ns(lt)));
        sql.push_str(&format!(" AND created_ns < ${}", params.len()));
    }
    if let Some(gte) = filter.updated_gte {
        params.push(Param::Int(bound_ns(gte)));
        sql.push_str(&format!(" AND updated_ns >= ${}", params.len()));
    }
    if let Some(lt) = filter.updated_lt {
        params.push(Param::Int(bound_ns(lt)));
        sql.push_str(&format!(" AND updated_ns < ${}", params.len()));
    }
    if let Some(gte) = filter.amount_gte {
        params.push(Param::Int(gte));
        sql.push_str(&format!(" AND amount_minor >= ${}", params.len()));
    }
    if let Some(lte) = filter.amount_lte {
        params.push(Param::Int(lte));
        sql.push_str(&format!(" AND amount_minor <= ${}", params.len()));
    }
    if filter.metadata.len() > METADATA_FILTERS_MAX {
        return Err(ViewError::TooManyMetadataFilters {
            count: filter.metadata.len(),
        });
    }
    for (key, value) in &filter.metadata {
        params.push(Param::Text(key.clone()));
        params.push(Param::Text(value.clone()));
        let (k, v) = (params.len() - 1, params.len());
        sql.push_str(&match db.backend() {
            Backend::Postgres => {
                format!(" AND metadata @> jsonb_build_object(${k}::text, ${v}::text)")
            }
            Backend::Sqlite => format!(
                " AND EXISTS (SELECT 1 FROM json_each({VIEW}.metadata) m \
                 WHERE m.key = ${k} AND m.type = 'text' AND m.value = ${v})"
            ),
        });
    }
    if let Some(after) = after {
        params.push(Param::Int(after.created_ns));
        params.push(Param::Text(PaymentId::from_uuid(after.id).to_string()));
        sql.push_str(&format!(
            " AND (created_ns, payment_id) < (${}, ${})",
            params.len() - 1,
            params.len()
        ));
    }
    // One more than the page: whether it exists says if there is a next page, so the last
    // page never hands out a cursor to an empty one.
    params.push(Param::Int(i64::from(filter.limit) + 1));
    sql.push_str(&format!(
        " ORDER BY created_ns DESC, payment_id DESC LIMIT ${}",
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
        .map(Row::into_payment)
        .collect::<Result<Vec<_>, _>>()?;
    let next_cursor = match data.last() {
        Some(last) if more => Some(
            Keyset {
                created_ns: last.created_at.timestamp_nanos_opt().unwrap_or(i64::MAX),
                id: last.id.as_uuid(),
            }
            .encode(),
        ),
        _ => None,
    };
    Ok(Page { data, next_cursor })
}

/// One payment of `tenant`; None if the tenant has no such payment (another tenant's id is
/// None too, so the API answers 404), or if the projector has not reached it yet (call
/// [`wait_for_position`] first for read-your-writes).
#[tracing::instrument(skip(db))]
pub async fn get_payment(
    db: &Database,
    tenant: &TenantId,
    id: PaymentId,
) -> Result<Option<PaymentRow>, ViewError> {
    let row: Option<Row> = on_db!(db, pool => {
        sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM {VIEW} WHERE payment_id = $1 AND tenant = $2"
        ))
        .bind(id.to_string())
        .bind(tenant.as_str())
        .fetch_optional(pool)
        .await?
    });
    row.map(Row::into_payment).transpose()
}

/// Waits (at most [`READ_WAIT_MS_MAX`]) until the payments projection has applied the event at
/// `position` (a command's `position`, passed back as `min_position`).
#[tracing::instrument(skip(db, store))]
pub async fn wait_for_position(
    db: &Database,
    store: &dyn EventStore,
    position: i64,
) -> Result<(), ViewError> {
    match asiento_projector::wait_for_position(db, store, NAME, position, READ_WAIT_MS_MAX).await {
        Ok(_) => Ok(()),
        Err(WaitError::Lagging { waited_ms, .. }) => {
            Err(ViewError::ProjectionLagging { waited_ms })
        }
        Err(WaitError::NotInstalled { .. }) => Err(ViewError::NotInstalled),
        Err(WaitError::Store(e)) => Err(e.into()),
        Err(WaitError::Database(e)) => Err(e.into()),
    }
}
