//! What is open right now, as gauges an on-call engineer alerts on: reconciliation exceptions
//! open by kind and resolution, idempotency keys in flight (and stuck past their lease), and
//! provider operations not yet answered for good by age band.
//!
//! Counted from the tables that hold them, on a timer in every worker process (not only the one
//! holding the sweep's lease), so each process's `/metrics` says the current state of the one
//! database they share.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use asiento_eventstore::Database;

use crate::clock::Clock;

/// The age bands of pending provider operations: label, and the age (ms) the band starts at.
pub const OPERATION_AGE_BANDS: [(&str, i64); 5] = [
    ("lt_1m", 0),
    ("1m_10m", 60_000),
    ("10m_1h", 600_000),
    ("1h_1d", 3_600_000),
    ("gt_1d", 86_400_000),
];

/// One count of everything the gauges show.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Counts {
    /// (kind, resolution, open exceptions).
    pub exceptions_open: Vec<(String, String, i64)>,
    pub keys_in_flight: i64,
    /// In flight past their lease: what the reconciler's stuck-key sweep resumes.
    pub keys_stuck: i64,
    /// Pending operations per band of [`OPERATION_AGE_BANDS`], in its order.
    pub operations_by_age: [i64; 5],
}

/// What the three statements answer: open exceptions per (kind, resolution); keys in flight
/// and stuck; each pending operation's request time.
type Counted = (Vec<(String, String, i64)>, (i64, i64), Vec<i64>);

/// Counts everything at `now_ms`.
pub async fn count(database: &Database, now_ms: i64) -> Result<Counts, sqlx::Error> {
    let exceptions = "select kind, resolution, count(*) from reconciliation_exceptions \
                      where status = 'open' group by kind, resolution order by kind, resolution";
    let keys =
        "select count(*), coalesce(sum(case when lease_expires_ms < $1 then 1 else 0 end), 0) \
                from idempotency_keys where state = 'in_flight'";
    let operations = "select requested_ms from reconciliation_operations";
    let (exceptions_open, (keys_in_flight, keys_stuck), requested): Counted = match database {
        Database::Postgres(pool) => (
            sqlx::query_as(exceptions).fetch_all(pool).await?,
            sqlx::query_as(keys).bind(now_ms).fetch_one(pool).await?,
            sqlx::query_scalar(operations).fetch_all(pool).await?,
        ),
        Database::Sqlite(pool) => (
            sqlx::query_as(exceptions).fetch_all(pool).await?,
            sqlx::query_as(&keys.replace("$1", "?"))
                .bind(now_ms)
                .fetch_one(pool)
                .await?,
            sqlx::query_scalar(operations).fetch_all(pool).await?,
        ),
    };
    let mut operations_by_age = [0; 5];
    for requested_ms in requested {
        let age = now_ms.saturating_sub(requested_ms);
        let band = OPERATION_AGE_BANDS
            .iter()
            .rposition(|(_, from)| age >= *from)
            .unwrap_or(0);
        operations_by_age[band] += 1;
    }
    Ok(Counts {
        exceptions_open,
        keys_in_flight,
        keys_stuck,
        operations_by_age,
    })
}

/// Sets the gauges to `counts`; an exception kind open before and not now goes to 0.
fn publish(counts: &Counts, shown_before: &mut BTreeSet<(String, String)>) {
    let mut shown = BTreeSet::new();
    for (kind, resolution, open) in &counts.exceptions_open {
        metrics::gauge!(
            "asiento_reconciliation_exceptions_open",
            "kind" => kind.clone(),
            "resolution" => resolution.clone(),
        )
        .set(*open as f64);
        shown.insert((kind.clone(), resolution.clone()));
    }
    for (kind, resolution) in shown_before.difference(&shown) {
        metrics::gauge!(
            "asiento_reconciliation_exceptions_open",
            "kind" => kind.clone(),
            "resolution" => resolution.clone(),
        )
        .set(0.0);
    }
    *shown_before = shown;
    metrics::gauge!("asiento_idempotency_keys_in_flight", "state" => "in_flight")
        .set(counts.keys_in_flight as f64);
    metrics::gauge!("asiento_idempotency_keys_in_flight", "state" => "stuck")
        .set(counts.keys_stuck as f64);
    for ((band, _), pending) in OPERATION_AGE_BANDS.iter().zip(counts.operations_by_age) {
        metrics::gauge!("asiento_provider_operations_pending", "age" => *band).set(pending as f64);
    }
}

/// Counts and publishes every `interval` until `shutdown`.
pub async fn run(
    database: Database,
    clock: Arc<dyn Clock>,
    interval: Duration,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shown = BTreeSet::new();
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            _ = tick.tick() => {}
        }
        match count(&database, clock.now().timestamp_millis()).await {
            Ok(counts) => publish(&counts, &mut shown),
            Err(error) => tracing::warn!(%error, "counting the gauges failed; retrying"),
        }
    }
}
