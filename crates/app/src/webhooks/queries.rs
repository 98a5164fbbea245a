//! Reads of the inbox for operators and the reconciler: its depth, its rows by status, and the
//! dead letters.

use asiento_eventstore::Database;

use super::{sqlite, DeadReason};

/// Rows of the inbox by status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InboxCounts {
    pub pending: i64,
    pub processed: i64,
    pub dead: i64,
}

/// Rows waiting to be processed, read from the pending rows' own index: the worker samples it
/// every second, so it must not scan the processed ones, which only ever grow.
pub async fn pending_count(database: &Database) -> Result<i64, sqlx::Error> {
    let sql = "select count(*) from webhook_inbox where status = 'pending'";
    match database {
        Database::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        Database::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
    }
}

/// The inbox's rows by status (a full count: for tools and tests, not for a loop).
pub async fn inbox_counts(database: &Database) -> Result<InboxCounts, sqlx::Error> {
    let sql = "select status, count(*) from webhook_inbox group by status";
    let rows: Vec<(String, i64)> = match database {
        Database::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await?,
        Database::Sqlite(pool) => sqlx::query_as(sql).fetch_all(pool).await?,
    };
    let mut counts = InboxCounts::default();
    for (status, count) in rows {
        match status.as_str() {
            "pending" => counts.pending = count,
            "processed" => counts.processed = count,
            _ => counts.dead += count,
        }
    }
    Ok(counts)
}

/// One dead-lettered event, as the reconciliation (or a person) reads it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DeadLetter {
    pub id: i64,
    pub provider: String,
    pub event_id: String,
    pub event_type: String,
    /// The charge's reference as sent (our payment id, when it is one).
    pub payment_ref: Option<String>,
    pub reason: String,
    pub last_error: Option<String>,
    pub attempts: i32,
    pub received_ms: i64,
    pub finished_ms: Option<i64>,
}

/// The most rows [`dead_letters`] returns in one call.
pub const DEAD_LETTERS_PAGE_MAX: i64 = 1_000;

/// Dead letters with `reason` (all when `None`), oldest first, after inbox id `after`.
pub async fn dead_letters(
    database: &Database,
    reason: Option<DeadReason>,
    after: i64,
    limit: i64,
) -> Result<Vec<DeadLetter>, sqlx::Error> {
    let sql = "select id, provider, event_id, event_type, payment_ref, dead_reason as reason, last_error, \
               attempts, received_ms, finished_ms from webhook_inbox \
               where status = 'dead' and ($1 is null or dead_reason = $1) and id > $2 \
               order by id limit $3";
    let reason = reason.map(DeadReason::as_str);
    let limit = limit.clamp(0, DEAD_LETTERS_PAGE_MAX);
    let rows: Vec<DeadLetter> = match database {
        Database::Postgres(pool) => {
            // PostgreSQL needs the parameter's type where it is only compared with null.
            let sql = sql.replace("$1 is null", "$1::text is null");
            sqlx::query_as(&sql)
                .bind(reason)
                .bind(after)
                .bind(limit)
                .fetch_all(pool)
                .await?
        }
        Database::Sqlite(pool) => {
            sqlx::query_as(&sqlite(sql))
                .bind(reason)
                .bind(after)
                .bind(limit)
                .fetch_all(pool)
                .await?
        }
    };
    Ok(rows)
}

/// One stored webhook event about a payment, as the console shows it (without its payload or
/// its last error, which can hold internal text).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct InboxEvent {
    pub id: i64,
    pub provider: String,
    pub event_id: String,
    pub event_type: String,
    /// pending, processed or dead.
    pub status: String,
    /// applied or ignored, once processed.
    pub outcome: Option<String>,
    pub dead_reason: Option<String>,
    pub attempts: i32,
    pub received_ms: i64,
    pub finished_ms: Option<i64>,
}

/// The most rows [`of_payment`] returns.
pub const PAYMENT_EVENTS_MAX: i64 = 100;

/// The webhook events whose charge named `payment_ref` (our payment id), oldest first. The inbox
/// keeps no index by payment (its hot path stays lean, migration 0051), so this reads the table:
/// a page a person opens, not a path requests take.
pub async fn of_payment(
    database: &Database,
    payment_ref: &str,
) -> Result<Vec<InboxEvent>, sqlx::Error> {
    let sql = "select id, provider, event_id, event_type, status, outcome, dead_reason, attempts, \
               received_ms, finished_ms from webhook_inbox where payment_ref = $1 \
               order by id limit $2";
    match database {
        Database::Postgres(pool) => {
            sqlx::query_as(sql)
                .bind(payment_ref)
                .bind(PAYMENT_EVENTS_MAX)
                .fetch_all(pool)
                .await
        }
        Database::Sqlite(pool) => {
            sqlx::query_as(&sqlite(sql))
                .bind(payment_ref)
                .bind(PAYMENT_EVENTS_MAX)
                .fetch_all(pool)
                .await
        }
    }
}
