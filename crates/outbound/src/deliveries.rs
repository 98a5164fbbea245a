//! An endpoint's deliveries as the API lists them, each with its attempts, and a delivery sent
//! again now on a person's request.

use asiento_eventstore::Database;
use serde_json::{json, Value};

use crate::endpoints::on_db;
use crate::OutboundError;

/// Deliveries per page.
pub const DELIVERIES_PAGE: i64 = 100;

type DeliveryRow = (String, String, i64, String, i64, Option<i64>, i64, i64);
type AttemptRow = (String, i64, i64, i64, Option<i64>, Option<String>);

fn time(ms: i64) -> Value {
    chrono::DateTime::from_timestamp_millis(ms)
        .map_or(Value::Null, |at| Value::from(asiento_objects::time(&at)))
}

/// The endpoint's most recent deliveries (newest event first), with every attempt.
pub async fn list(db: &Database, endpoint: &str) -> Result<Vec<Value>, OutboundError> {
    let deliveries: Vec<DeliveryRow> = on_db!(db, pool => sqlx::query_as(
        "select id, event_id, seq, status, attempts, last_status, next_attempt_ms, created_ms \
         from webhook_deliveries where endpoint_id = $1 order by seq desc limit $2",
    )
    .bind(endpoint)
    .bind(DELIVERIES_PAGE)
    .fetch_all(pool)
    .await?);
    let attempts: Vec<AttemptRow> = on_db!(db, pool => sqlx::query_as(
        "select a.delivery_id, a.attempt, a.at_ms, a.latency_ms, a.response_status, a.error \
         from webhook_delivery_attempts a join webhook_deliveries d on d.id = a.delivery_id \
         where d.endpoint_id = $1 order by a.delivery_id, a.attempt",
    )
    .bind(endpoint)
    .fetch_all(pool)
    .await?);
    Ok(deliveries
        .into_iter()
        .map(
            |(id, event_id, seq, status, count, last_status, next_ms, created_ms)| {
                let tried: Vec<Value> = attempts
                    .iter()
                    .filter(|a| a.0 == id)
                    .map(|(_, attempt, at_ms, latency_ms, response_status, error)| {
                        json!({
                            "attempt": attempt,
                            "at": time(*at_ms),
                            "latency_ms": latency_ms,
                            "response_status": response_status,
                            "error": error,
                        })
                    })
                    .collect();
                json!({
                    "id": id,
                    "object": "webhook_delivery",
                    "event_id": event_id,
                    "event_seq": seq,
                    "status": status,
                    "attempt_count": count,
                    "last_response_status": last_status,
                    "next_attempt_at": (status == "pending").then(|| time(next_ms)),
                    "created_at": time(created_ms),
                    "attempts": tried,
                })
            },
        )
        .collect())
}

/// Sends the delivery again now (also one given up on); false when the endpoint has none by
/// that id.
pub async fn retry(
    db: &Database,
    endpoint: &str,
    delivery: &str,
    now_ms: i64,
) -> Result<bool, OutboundError> {
    let changed = on_db!(db, pool => sqlx::query(
        "update webhook_deliveries set \
           first_attempt_ms = case when status = 'pending' then first_attempt_ms else null end, \
           status = 'pending', next_attempt_ms = $3 \
         where id = $1 and endpoint_id = $2",
    )
    .bind(delivery)
    .bind(endpoint)
    .bind(now_ms)
    .execute(pool)
    .await?
    .rows_affected());
    Ok(changed == 1)
}
