//! The journal of a period (`GET /v1/journal`): every entry of a tenant recorded in
//! [`from`, `to`), ordered by the time it was recorded and then by log order, in keyset pages
//! (`JournalCursor`), so that an export of any length reads one page at a time.
//!
//! An entry's time is its event's: on PostgreSQL its transaction's start, so an entry can commit
//! a moment after entries recorded later than it. A period that ends a few seconds in the past
//! is complete; one that ends now may still gain entries.

use asiento_eventstore::{Database, EventStore};
use asiento_projector::on_db;
use chrono::{DateTime, Utc};

use crate::read::wait;
use crate::{BalanceError, JournalEntryView, LegView};

/// The most entries one page may hold.
pub const JOURNAL_LIMIT_MAX: usize = 1_000;

/// The index a period's pages read (created with the entries' table).
pub(crate) fn ddl(g: i64) -> String {
    format!(
        "CREATE INDEX journal_entries_g{g}_by_time \
         ON journal_entries_g{g} (tenant, recorded_at, xact, position)"
    )
}

/// The bounds of a period left open: times every backend stores.
fn earliest() -> DateTime<Utc> {
    DateTime::from_timestamp(-62_135_596_800, 0).unwrap_or_default() // 0001-01-01T00:00:00Z
}

fn latest() -> DateTime<Utc> {
    DateTime::from_timestamp(253_402_300_799, 0).unwrap_or_default() // 9999-12-31T23:59:59Z
}

/// Where a page of the journal ends: the last entry's time and log place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalCursor {
    recorded_at: DateTime<Utc>,
    xact: i64,
    position: i64,
}

impl JournalCursor {
    /// Opaque to clients: `<nanoseconds since 1970>.<xact>.<position>`.
    #[must_use]
    pub fn encode(&self) -> String {
        let nanos = self.recorded_at.timestamp_nanos_opt().unwrap_or(i64::MAX);
        format!("{nanos}.{}.{}", self.xact, self.position)
    }

    /// A cursor a page gave out; anything else is [`BalanceError::InvalidCursor`].
    pub fn parse(text: &str) -> Result<JournalCursor, BalanceError> {
        let mut parts = text.split('.').map(str::parse::<i64>);
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(Ok(nanos)), Some(Ok(xact)), Some(Ok(position)), None) => Ok(JournalCursor {
                recorded_at: DateTime::from_timestamp_nanos(nanos),
                xact,
                position,
            }),
            _ => Err(BalanceError::InvalidCursor),
        }
    }
}

/// Whose journal, which period, which page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalQuery {
    pub tenant: String,
    /// Entries recorded at or after; None: from the first.
    pub from: Option<DateTime<Utc>>,
    /// Entries recorded before; None: up to now.
    pub to: Option<DateTime<Utc>>,
    pub after: Option<JournalCursor>,
    /// 1..=[`JOURNAL_LIMIT_MAX`].
    pub limit: usize,
}

/// A page of the journal and the cursor of the next one (None on the last).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalPage {
    pub entries: Vec<JournalEntryView>,
    pub next: Option<JournalCursor>,
}

#[derive(sqlx::FromRow)]
struct Row {
    entry_id: String,
    tenant: String,
    xact: i64,
    position: i64,
    reverses: Option<String>,
    legs: sqlx::types::Json<Vec<LegView>>,
    recorded_at: DateTime<Utc>,
    source: String,
    description: Option<String>,
}

/// A page of the tenant's journal for the query's period, once the legs projection includes
/// every event the log had when the read began.
pub async fn journal(
    db: &Database,
    store: &dyn EventStore,
    query: &JournalQuery,
) -> Result<JournalPage, BalanceError> {
    let head = store.head().await?;
    if head.position() > 0 {
        wait(db, store, head.position()).await?;
    }
    let from = query.from.unwrap_or_else(earliest);
    let to = query.to.unwrap_or_else(latest);
    let after = query.after.unwrap_or(JournalCursor {
        recorded_at: earliest(),
        xact: i64::MIN,
        position: i64::MIN,
    });
    let limit = query.limit.clamp(1, JOURNAL_LIMIT_MAX);
    let rows: Vec<Row> = on_db!(db, pool => {
        sqlx::query_as(
            "SELECT entry_id, tenant, xact, position, reverses, legs, recorded_at, source, \
                    description \
             FROM journal_entries \
             WHERE tenant = $1 AND recorded_at >= $2 AND recorded_at < $3 \
               AND (recorded_at, xact, position) > ($4, $5, $6) \
             ORDER BY recorded_at, xact, position LIMIT $7",
        )
        .bind(&query.tenant)
        .bind(from)
        .bind(to)
        .bind(after.recorded_at)
        .bind(after.xact)
        .bind(after.position)
        .bind(i64::try_from(limit).unwrap_or(1))
        .fetch_all(pool)
        .await?
    });
    let next = (rows.len() == limit)
        .then(|| rows.last())
        .flatten()
        .map(|last| JournalCursor {
            recorded_at: last.recorded_at,
            xact: last.xact,
            position: last.position,
        });
    Ok(JournalPage {
        entries: rows
            .into_iter()
            .map(|r| JournalEntryView {
                entry_id: r.entry_id,
                tenant: r.tenant,
                position: r.position,
                reverses: r.reverses,
                legs: r.legs.0,
                recorded_at: r.recorded_at,
                source: r.source,
                description: r.description,
            })
            .collect(),
        next,
    })
}
