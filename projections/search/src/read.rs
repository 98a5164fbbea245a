//! The read side: a tenant's payments that a term names, and read-your-writes waits.

use asiento_domain::TenantId;
use asiento_eventstore::{Database, EventStore};
use asiento_projector::{on_db, WaitError, READ_WAIT_MS_MAX};

use crate::projection::VIEW;
use crate::terms::{normalize, Kind};
use crate::{Match, SearchError, NAME};

/// The most payments one search answers.
pub const FIND_LIMIT_MAX: i64 = 50;

/// The tenant's payments that `term` names exactly (after trimming), newest first (creation
/// time, then id), each once, at most `limit` (clamped to 1..=[`FIND_LIMIT_MAX`]). Another
/// tenant's payments are never found. A payment named in several ways is reported by the first
/// of them in [`Kind`]'s order (its id before an Idempotency-Key before its metadata …).
#[tracing::instrument(skip(db))]
pub async fn find(
    db: &Database,
    tenant: &TenantId,
    term: &str,
    limit: i64,
) -> Result<Vec<Match>, SearchError> {
    let Some(term) = normalize(term) else {
        return Ok(Vec::new());
    };
    let limit = limit.clamp(1, FIND_LIMIT_MAX);
    // A payment has at most one row per kind for a term, so this many rows hold the first
    // `limit` payments whole.
    let kinds = i64::try_from(Kind::ALL.len()).unwrap_or(i64::MAX);
    let rows_max = limit.saturating_mul(kinds);
    let statement = format!(
        "SELECT payment_id, kind FROM {VIEW} WHERE tenant = $1 AND term = $2 \
         ORDER BY created_ms DESC, payment_id DESC LIMIT $3"
    );
    let rows: Vec<(String, String)> = on_db!(db, pool => {
        sqlx::query_as(&statement)
            .bind(tenant.as_str())
            .bind(term)
            .bind(rows_max)
            .fetch_all(pool)
            .await?
    });
    let mut found: Vec<(String, Option<Kind>, String)> = Vec::new();
    for (payment_id, kind) in rows {
        let parsed = Kind::parse(&kind);
        match found.last_mut() {
            // Rows of one payment are adjacent in this order: keep the preferred kind.
            Some((last, best, name)) if *last == payment_id => {
                let better = match (parsed, *best) {
                    (Some(new), Some(old)) => new < old,
                    (Some(_), None) => true,
                    (None, _) => false,
                };
                if better {
                    *best = parsed;
                    *name = kind;
                }
            }
            _ => found.push((payment_id, parsed, kind)),
        }
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    Ok(found
        .into_iter()
        .take(limit)
        .map(|(payment_id, _, kind)| Match { payment_id, kind })
        .collect())
}

/// Waits (at most [`READ_WAIT_MS_MAX`]) until the search index has applied the event at
/// `position` (a command's `position`).
#[tracing::instrument(skip(db, store))]
pub async fn wait_for_position(
    db: &Database,
    store: &dyn EventStore,
    position: i64,
) -> Result<(), SearchError> {
    match asiento_projector::wait_for_position(db, store, NAME, position, READ_WAIT_MS_MAX).await {
        Ok(_) => Ok(()),
        Err(WaitError::Lagging { waited_ms, .. }) => {
            Err(SearchError::ProjectionLagging { waited_ms })
        }
        Err(WaitError::NotInstalled { .. }) => Err(SearchError::NotInstalled),
        Err(WaitError::Store(e)) => Err(e.into()),
        Err(WaitError::Database(e)) => Err(e.into()),
    }
}
