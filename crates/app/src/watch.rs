//! The reconciler's two watch lists, kept from the log itself (one cursor), so that the sweep
//! depends on no read model's lag or rebuild:
//!
//! - **payments** whose charge may need a provider lookup: a payment enters at
//!   `PaymentIntended` and leaves at the first fact that settles its charge;
//! - **operations** (captures, refunds) sent to the provider and not yet answered for good: one
//!   enters at its request and leaves at its success or refusal.
//!
//! Both are visited in rotation: each row carries the time it is next due (`next_check_ms`), the
//! sweep takes the most overdue first and pushes each row it visits into the future. So rows that
//! never resolve (a redirect the customer abandoned, a provider that never answers) cannot keep
//! newer ones from being looked at, however many there are.

use asiento_domain::{OperationKind, PaymentEvent, PaymentId, StreamKind};
use asiento_eventstore::{Database, EventStore, RecordedEvent, StoreError, Tx};

use crate::log::LogError;
use crate::log_cursor::{self, execute, Bind};

/// Log events read per batch while catching up.
pub const WATCH_EVENTS_PER_BATCH_MAX: usize = 1_000;

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("watch list query failed: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Log(#[from] LogError),
}

impl From<StoreError> for WatchError {
    fn from(error: StoreError) -> Self {
        WatchError::Log(LogError::Store(error))
    }
}

/// One watched operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedOperation {
    pub payment: PaymentId,
    pub kind: OperationKind,
    pub sequence: u32,
    pub requested_ms: i64,
}

/// What one log event changes in the watch lists.
enum Change {
    WatchPayment {
        id: String,
        created_ms: i64,
    },
    UnwatchPayment {
        id: String,
    },
    WatchOperation {
        id: String,
        kind: OperationKind,
        sequence: u32,
        requested_ms: i64,
    },
    UnwatchOperation {
        id: String,
        kind: OperationKind,
        sequence: Option<u32>,
    },
}

fn sqlite(sql: &str) -> String {
    sql.replace('$', "?")
}

fn kind_text(kind: OperationKind) -> &'static str {
    kind.as_str()
}

fn parse_kind(text: &str) -> Option<OperationKind> {
    match text {
        "capture" => Some(OperationKind::Capture),
        "refund" => Some(OperationKind::Refund),
        "cancel" => Some(OperationKind::Cancel),
        _ => None,
    }
}

fn decode(event: &RecordedEvent) -> Result<PaymentEvent, LogError> {
    PaymentEvent::decode_raw(&event.event_type, event.schema, event.data.raw())
        .map_err(LogError::Decode)
}

/// The watch-list changes an event stands for. Only the few event types that matter are
/// decoded.
fn changes_of(event: &RecordedEvent) -> Result<Vec<Change>, LogError> {
    let Some(StreamKind::Payment(payment)) = StreamKind::parse(&event.stream_id) else {
        return Ok(Vec::new());
    };
    let id = payment.to_string();
    let change = match event.event_type.as_str() {
        "PaymentIntended" => Some(Change::WatchPayment {
            id,
            created_ms: decode(event)?.at().timestamp_millis(),
        }),
        "ChargeAuthorized" | "PaymentExpired" | "DisputeOpened" | "DisputeClosed"
        | "ChargeFailed" => Some(Change::UnwatchPayment { id }),
        // A capture settles the charge and ends every capture asked for.
        "ChargeCaptured" => {
            return Ok(vec![
                Change::UnwatchPayment { id: id.clone() },
                Change::UnwatchOperation {
                    id,
                    kind: OperationKind::Capture,
                    sequence: None,
                },
            ]);
        }
        "RefundSettled" | "CaptureRequested" | "RefundRequested" | "CancelRequested"
        | "CancelSucceeded" | "OperationRefused" => {
            match decode(event)? {
                PaymentEvent::CaptureRequested(e) => Some(Change::WatchOperation {
                    id,
                    kind: OperationKind::Capture,
                    sequence: e.sequence,
                    requested_ms: e.at.timestamp_millis(),
                }),
                PaymentEvent::RefundRequested(e) => Some(Change::WatchOperation {
                    id,
                    kind: OperationKind::Refund,
                    sequence: e.sequence,
                    requested_ms: e.at.timestamp_millis(),
                }),
                PaymentEvent::CancelRequested(e) => Some(Change::WatchOperation {
                    id,
                    kind: OperationKind::Cancel,
                    sequence: e.sequence,
                    requested_ms: e.at.timestamp_millis(),
                }),
                PaymentEvent::CancelSucceeded(e) => Some(Change::UnwatchOperation {
                    id,
                    kind: OperationKind::Cancel,
                    sequence: Some(e.sequence),
                }),
                PaymentEvent::OperationRefused(e) => Some(Change::UnwatchOperation {
                    id,
                    kind: e.kind,
                    sequence: Some(e.sequence),
                }),
                // A refund settles the charge too. One settled under its own name ends; a
                // cumulative settlement names none, and the sweep finds out which refunds it
                // covered.
                PaymentEvent::RefundSettled(e) => {
                    let mut changes = vec![Change::UnwatchPayment { id: id.clone() }];
                    if let Some(sequence) = e.sequence {
                        changes.push(Change::UnwatchOperation {
                            id,
                            kind: OperationKind::Refund,
                            sequence: Some(sequence),
                        });
                    }
                    return Ok(changes);
                }
                _ => None,
            }
        }
        _ => None,
    };
    Ok(change.into_iter().collect())
}

/// The watch lists' cursor table.
const CURSOR_TABLE: &str = "reconciliation_watch_cursor";

/// Brings both watch lists up to the log.
pub async fn catch_up(database: &Database, store: &dyn EventStore) -> Result<(), WatchError> {
    let mut from = log_cursor::read(database, CURSOR_TABLE).await?;
    loop {
        let events = store.read_all(from, WATCH_EVENTS_PER_BATCH_MAX).await?;
        let Some(last) = events.last() else {
            return Ok(());
        };
        let next = last.cursor;
        let mut changes = Vec::new();
        for event in &events {
            changes.extend(changes_of(event)?);
        }
        let mut tx = database.begin().await?;
        for change in &changes {
            apply(&mut tx, change).await?;
        }
        log_cursor::write(&mut tx, CURSOR_TABLE, next).await?;
        tx.commit().await?;
        from = next;
        if events.len() < WATCH_EVENTS_PER_BATCH_MAX {
            return Ok(());
        }
    }
}

async fn apply(tx: &mut Tx, change: &Change) -> Result<(), sqlx::Error> {
    match change {
        Change::WatchPayment { id, created_ms } => {
            let sql = "insert into reconciliation_watch (payment_id, created_ms, next_check_ms) \
                       values ($1, $2, 0) on conflict (payment_id) do nothing";
            execute(tx, sql, &[Bind::Text(id), Bind::Int(*created_ms)]).await
        }
        Change::UnwatchPayment { id } => {
            let sql = "delete from reconciliation_watch where payment_id = $1";
            execute(tx, sql, &[Bind::Text(id)]).await
        }
        Change::WatchOperation {
            id,
            kind,
            sequence,
            requested_ms,
        } => {
            let sql = "insert into reconciliation_operations \
                       (payment_id, kind, sequence, requested_ms, next_check_ms) \
                       values ($1, $2, $3, $4, $4) \
                       on conflict (payment_id, kind, sequence) do nothing";
            let binds = [
                Bind::Text(id),
                Bind::Text(kind_text(*kind)),
                Bind::Int(i64::from(*sequence)),
                Bind::Int(*requested_ms),
            ];
            execute(tx, sql, &binds).await
        }
        Change::UnwatchOperation {
            id,
            kind,
            sequence: Some(sequence),
        } => {
            let sql = "delete from reconciliation_operations \
                       where payment_id = $1 and kind = $2 and sequence = $3";
            let binds = [
                Bind::Text(id),
                Bind::Text(kind_text(*kind)),
                Bind::Int(i64::from(*sequence)),
            ];
            execute(tx, sql, &binds).await
        }
        Change::UnwatchOperation {
            id,
            kind,
            sequence: None,
        } => {
            let sql = "delete from reconciliation_operations where payment_id = $1 and kind = $2";
            execute(tx, sql, &[Bind::Text(id), Bind::Text(kind_text(*kind))]).await
        }
    }
}

async fn execute_alone(
    database: &Database,
    sql: &str,
    binds: &[Bind<'_>],
) -> Result<(), WatchError> {
    let mut tx = database.begin().await?;
    execute(&mut tx, sql, binds).await?;
    tx.commit().await?;
    Ok(())
}

/// Watched payments created at or before `created_before_ms` and due by `now_ms`, at most
/// `limit`: the most overdue first and, among rows equally due (never looked at yet), the newest
/// first, so a payment that just went stale is looked up in the next sweep however many rows
/// wait that nobody will finish.
pub async fn due_payments(
    database: &Database,
    created_before_ms: i64,
    now_ms: i64,
    limit: i64,
) -> Result<Vec<String>, WatchError> {
    let sql = "select payment_id from reconciliation_watch \
               where created_ms <= $1 and next_check_ms <= $2 \
               order by next_check_ms, created_ms desc limit $3";
    let ids: Vec<String> = match database {
        Database::Postgres(pool) => {
            sqlx::query_scalar(sql)
                .bind(created_before_ms)
                .bind(now_ms)
                .bind(limit)
                .fetch_all(pool)
                .await?
        }
        Database::Sqlite(pool) => {
            sqlx::query_scalar(&sqlite(sql))
                .bind(created_before_ms)
                .bind(now_ms)
                .bind(limit)
                .fetch_all(pool)
                .await?
        }
    };
    Ok(ids)
}

/// The payment is looked at again no earlier than `next_check_ms`.
pub async fn postpone_payment(
    database: &Database,
    id: PaymentId,
    next_check_ms: i64,
) -> Result<(), WatchError> {
    let sql = "update reconciliation_watch set next_check_ms = $2 where payment_id = $1";
    execute_alone(
        database,
        sql,
        &[Bind::Text(&id.to_string()), Bind::Int(next_check_ms)],
    )
    .await
}

pub async fn unwatch_payment(database: &Database, id: PaymentId) -> Result<(), WatchError> {
    let sql = "delete from reconciliation_watch where payment_id = $1";
    execute_alone(database, sql, &[Bind::Text(&id.to_string())]).await
}

/// Watched operations requested at or before `requested_before_ms` and due by `now_ms`, most
/// overdue first, at most `limit`.
pub async fn due_operations(
    database: &Database,
    requested_before_ms: i64,
    now_ms: i64,
    limit: i64,
) -> Result<Vec<WatchedOperation>, WatchError> {
    let sql = "select payment_id, kind, sequence, requested_ms from reconciliation_operations \
               where next_check_ms <= $1 and requested_ms <= $2 \
               order by next_check_ms limit $3";
    let rows: Vec<(String, String, i64, i64)> = match database {
        Database::Postgres(pool) => {
            // `sequence` is an integer column: read as i32 there.
            let rows: Vec<(String, String, i32, i64)> = sqlx::query_as(sql)
                .bind(now_ms)
                .bind(requested_before_ms)
                .bind(limit)
                .fetch_all(pool)
                .await?;
            rows.into_iter()
                .map(|(p, k, s, r)| (p, k, i64::from(s), r))
                .collect()
        }
        Database::Sqlite(pool) => {
            sqlx::query_as(&sqlite(sql))
                .bind(now_ms)
                .bind(requested_before_ms)
                .bind(limit)
                .fetch_all(pool)
                .await?
        }
    };
    let mut due = Vec::with_capacity(rows.len());
    for (payment, kind, sequence, requested_ms) in rows {
        let parsed = (
            PaymentId::parse(&payment).ok(),
            parse_kind(&kind),
            u32::try_from(sequence).ok(),
        );
        match parsed {
            (Some(payment), Some(kind), Some(sequence)) => due.push(WatchedOperation {
                payment,
                kind,
                sequence,
                requested_ms,
            }),
            _ => tracing::error!(%payment, %kind, sequence, "malformed watched operation"),
        }
    }
    Ok(due)
}

/// The operation is looked at again no earlier than `next_check_ms`.
pub async fn postpone_operation(
    database: &Database,
    op: &WatchedOperation,
    next_check_ms: i64,
) -> Result<(), WatchError> {
    let sql = "update reconciliation_operations set next_check_ms = $4 \
               where payment_id = $1 and kind = $2 and sequence = $3";
    let binds = [
        Bind::Text(&op.payment.to_string()),
        Bind::Text(kind_text(op.kind)),
        Bind::Int(i64::from(op.sequence)),
        Bind::Int(next_check_ms),
    ];
    execute_alone(database, sql, &binds).await
}

pub async fn unwatch_operation(
    database: &Database,
    op: &WatchedOperation,
) -> Result<(), WatchError> {
    let sql = "delete from reconciliation_operations \
               where payment_id = $1 and kind = $2 and sequence = $3";
    let binds = [
        Bind::Text(&op.payment.to_string()),
        Bind::Text(kind_text(op.kind)),
        Bind::Int(i64::from(op.sequence)),
    ];
    execute_alone(database, sql, &binds).await
}
