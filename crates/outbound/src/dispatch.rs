//! Turning the merchant events feed into deliveries: one row per (endpoint, event) for every
//! enabled endpoint of the event's tenant that subscribes to its type, written in one
//! transaction with the dispatcher's cursor, so an event is dispatched once even across crashes
//! and across worker processes (the cursor moves by compare-and-set). An endpoint receives the
//! events that follow its registration.

use std::collections::HashMap;

use asiento_eventstore::Database;
use asiento_merchant_events::{read_after, FeedCursor, FeedQuery};
use uuid::Uuid;

use crate::endpoints::{enabled, on_db, on_tx, Endpoint};
use crate::OutboundError;

/// Events turned into deliveries per round.
pub const DISPATCH_PAGE: u32 = 500;

/// Dispatches the next page of the feed; the number of events it covered.
pub async fn dispatch_round(db: &Database, now_ms: i64) -> Result<usize, OutboundError> {
    let cursor: i64 = on_db!(db, pool => sqlx::query_scalar(
        "select seq from webhook_dispatch where id = 1"
    )
    .fetch_one(pool)
    .await?);
    let events = read_after(
        db,
        &FeedQuery {
            tenant: None,
            after: FeedCursor::after(cursor),
            types: Vec::new(),
            limit: DISPATCH_PAGE,
        },
    )
    .await?;
    let Some(last) = events.last() else {
        return Ok(0);
    };
    let mut by_tenant: HashMap<String, Vec<Endpoint>> = HashMap::new();
    for endpoint in enabled(db).await? {
        by_tenant
            .entry(endpoint.tenant.clone())
            .or_default()
            .push(endpoint);
    }
    let mut tx = db.begin().await?;
    for event in &events {
        for endpoint in by_tenant.get(&event.tenant).into_iter().flatten() {
            if !endpoint.wants(&event.event_type) {
                continue;
            }
            on_tx!(&mut tx, conn => sqlx::query(
                "insert into webhook_deliveries (id, endpoint_id, tenant, event_id, seq, status, \
                 next_attempt_ms, created_ms) values ($1, $2, $3, $4, $5, 'pending', $6, $6) \
                 on conflict (endpoint_id, event_id) do nothing",
            )
            .bind(format!("wd_{}", Uuid::new_v4().simple()))
            .bind(&endpoint.id)
            .bind(&event.tenant)
            .bind(&event.event_id)
            .bind(event.seq)
            .bind(now_ms)
            .execute(conn)
            .await?
            .rows_affected());
        }
    }
    let moved = on_tx!(&mut tx, conn => sqlx::query(
        "update webhook_dispatch set seq = $2 where id = 1 and seq = $1"
    )
    .bind(cursor)
    .bind(last.seq)
    .execute(conn)
    .await?
    .rows_affected());
    if moved == 1 {
        tx.commit().await?;
        Ok(events.len())
    } else {
        // Another worker dispatched this page first.
        tx.rollback().await?;
        Ok(0)
    }
}
