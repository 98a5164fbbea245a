//! The read side: the feed after a cursor, and one event by id.

use asiento_eventstore::Database;
use asiento_projector::on_db;

use crate::projection::VIEW;
use crate::{EventKind, FeedError};

/// The most events one page may hold.
pub const PAGE_LIMIT_MAX: u32 = 100;
/// The page size when the client names none.
pub const PAGE_LIMIT_DEFAULT: u32 = 50;

/// One merchant event as the feed stores it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct FeedEvent {
    /// Its place in the feed: the cursor after it is this number.
    pub seq: i64,
    pub event_id: String,
    pub tenant: String,
    pub event_type: String,
    pub position: i64,
    /// The event object's JSON, exactly as the feed and every delivery send it.
    pub body: String,
}

impl FeedEvent {
    /// The cursor a reader passes to read what follows this event.
    #[must_use]
    pub fn cursor(&self) -> String {
        self.seq.to_string()
    }
}

/// A reader's place in the feed: before every event, or after one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FeedCursor(i64);

impl FeedCursor {
    pub const START: FeedCursor = FeedCursor(0);

    /// The cursor after an event's `seq`.
    #[must_use]
    pub fn after(seq: i64) -> FeedCursor {
        FeedCursor(seq)
    }

    /// A cursor a client sent back: the decimal text [`FeedEvent::cursor`] gave it.
    pub fn parse(text: &str) -> Result<FeedCursor, FeedError> {
        match text.parse::<i64>() {
            Ok(seq) if seq >= 0 && text.bytes().all(|b| b.is_ascii_digit()) => Ok(FeedCursor(seq)),
            _ => Err(FeedError::InvalidCursor),
        }
    }

    #[must_use]
    pub fn seq(self) -> i64 {
        self.0
    }
}

/// Whose events, from where, of which types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedQuery {
    /// One tenant's events; None for every tenant's (the webhook dispatcher).
    pub tenant: Option<String>,
    pub after: FeedCursor,
    /// Only these types; empty for every type.
    pub types: Vec<EventKind>,
    pub limit: u32,
}

/// The events after the query's cursor, in the feed's order (the log's), at most `limit`.
///
/// Gap-free: the one runner of the projection writes rows in `seq` order, each batch with its
/// checkpoint, so a reader never sees a row whose predecessors are not yet visible.
pub async fn read_after(db: &Database, query: &FeedQuery) -> Result<Vec<FeedEvent>, FeedError> {
    let limit = i64::from(query.limit.clamp(1, 10 * PAGE_LIMIT_MAX));
    let types: Vec<&str> = query.types.iter().map(|kind| kind.as_str()).collect();
    let mut sql = format!(
        "SELECT seq, event_id, tenant, event_type, position, body FROM {VIEW} WHERE seq > $1"
    );
    let mut next = 2;
    if query.tenant.is_some() {
        sql.push_str(&format!(" AND tenant = ${next}"));
        next += 1;
    }
    if !types.is_empty() {
        let list: Vec<String> = (0..types.len()).map(|i| format!("${}", next + i)).collect();
        sql.push_str(&format!(" AND event_type IN ({})", list.join(", ")));
        next += types.len();
    }
    sql.push_str(&format!(" ORDER BY seq LIMIT ${next}"));
    let rows = on_db!(db, pool => {
        let mut q = sqlx::query_as::<_, FeedEvent>(&sql).bind(query.after.seq());
        if let Some(tenant) = &query.tenant {
            q = q.bind(tenant);
        }
        for kind in &types {
            q = q.bind(*kind);
        }
        q.bind(limit).fetch_all(pool).await?
    });
    Ok(rows)
}

/// One of the tenant's events by its id; None for an id it has not (or another tenant's).
pub async fn read_one(
    db: &Database,
    tenant: &str,
    event_id: &str,
) -> Result<Option<FeedEvent>, FeedError> {
    let sql = format!(
        "SELECT seq, event_id, tenant, event_type, position, body FROM {VIEW} \
         WHERE event_id = $1 AND tenant = $2"
    );
    let row = on_db!(db, pool => {
        sqlx::query_as::<_, FeedEvent>(&sql)
            .bind(event_id)
            .bind(tenant)
            .fetch_optional(pool)
            .await?
    });
    Ok(row)
}
