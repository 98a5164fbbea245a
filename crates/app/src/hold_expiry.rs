//! The worker that voids holds nobody posted or voided before their `expires_at`.
//!
//! The open holds with an expiry are kept from the log itself (`hold_expiries`, one cursor), as
//! the reconciler's watch lists are, so that expiry depends on no read model's lag or rebuild: a
//! hold enters at its `TransferRequested` and leaves at its `HoldPosted` or `HoldVoided`. Each
//! round catches up, then voids the due holds, most overdue first, through
//! [`LedgerFlow::expire_hold`]: the transfer's stream version makes an expiry racing a client's
//! post or void lose or win whole, so several workers may run at once.

use std::time::Duration;

use asiento_domain::{StreamKind, TenantId, TransferEvent, TransferId};
use asiento_eventstore::{Database, EventStore, RecordedEvent, StoreError, Tx};

use crate::ledger::holds::HoldExpiry;
use crate::ledger::LedgerFlow;
use crate::log::LogError;
use crate::log_cursor::{self, execute, Bind};
use crate::payments::FlowError;

/// Log events read per batch while catching up.
pub const EXPIRY_EVENTS_PER_BATCH_MAX: usize = 1_000;
/// Holds voided per round, at most.
pub const EXPIRIES_PER_ROUND_MAX: i64 = 500;
/// How often the worker looks for due holds.
pub const EXPIRY_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ExpiryError {
    #[error("hold expiry query failed: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Flow(#[from] FlowError),
}

impl From<StoreError> for ExpiryError {
    fn from(error: StoreError) -> Self {
        ExpiryError::Log(LogError::Store(error))
    }
}

/// What one log event changes in the list.
enum Change {
    Watch {
        transfer: String,
        tenant: String,
        expires_ms: i64,
    },
    Unwatch {
        transfer: String,
    },
}

fn change_of(event: &RecordedEvent) -> Result<Option<Change>, LogError> {
    let Some(StreamKind::Transfer(id)) = StreamKind::parse(&event.stream_id) else {
        return Ok(None);
    };
    let transfer = id.to_string();
    Ok(match event.event_type.as_str() {
        "TransferRequested" => {
            let decoded =
                TransferEvent::decode_raw(&event.event_type, event.schema, event.data.raw())?;
            match decoded {
                TransferEvent::TransferRequested(requested) if requested.pending => {
                    requested.expires_at.map(|expires_at| Change::Watch {
                        transfer,
                        tenant: requested.tenant.to_string(),
                        expires_ms: expires_at.timestamp_millis(),
                    })
                }
                _ => None,
            }
        }
        "HoldPosted" | "HoldVoided" => Some(Change::Unwatch { transfer }),
        _ => None,
    })
}

/// The list's cursor table.
const CURSOR_TABLE: &str = "hold_expiry_cursor";

/// Brings the list up to the log.
pub async fn catch_up(database: &Database, store: &dyn EventStore) -> Result<(), ExpiryError> {
    let mut from = log_cursor::read(database, CURSOR_TABLE).await?;
    loop {
        let events = store.read_all(from, EXPIRY_EVENTS_PER_BATCH_MAX).await?;
        let Some(last) = events.last() else {
            return Ok(());
        };
        let next = last.cursor;
        let mut tx = database.begin().await?;
        for event in &events {
            if let Some(change) = change_of(event)? {
                apply(&mut tx, &change).await?;
            }
        }
        log_cursor::write(&mut tx, CURSOR_TABLE, next).await?;
        tx.commit().await?;
        from = next;
        if events.len() < EXPIRY_EVENTS_PER_BATCH_MAX {
            return Ok(());
        }
    }
}

async fn apply(tx: &mut Tx, change: &Change) -> Result<(), sqlx::Error> {
    match change {
        Change::Watch {
            transfer,
            tenant,
            expires_ms,
        } => {
            let sql = "insert into hold_expiries (transfer_id, tenant, expires_ms) \
                       values ($1, $2, $3) on conflict (transfer_id) do nothing";
            let binds = [
                Bind::Text(transfer),
                Bind::Text(tenant),
                Bind::Int(*expires_ms),
            ];
            execute(tx, sql, &binds).await
        }
        Change::Unwatch { transfer } => {
            let sql = "delete from hold_expiries where transfer_id = $1";
            execute(tx, sql, &[Bind::Text(transfer)]).await
        }
    }
}

/// Holds whose `expires_at` is at or before `now_ms`, most overdue first.
async fn due(database: &Database, now_ms: i64) -> Result<Vec<(String, String)>, ExpiryError> {
    let sql = "select transfer_id, tenant from hold_expiries where expires_ms <= $1 \
               order by expires_ms limit $2";
    let rows = match database {
        Database::Postgres(pool) => {
            sqlx::query_as(sql)
                .bind(now_ms)
                .bind(EXPIRIES_PER_ROUND_MAX)
                .fetch_all(pool)
                .await?
        }
        Database::Sqlite(pool) => {
            sqlx::query_as(sql)
                .bind(now_ms)
                .bind(EXPIRIES_PER_ROUND_MAX)
                .fetch_all(pool)
                .await?
        }
    };
    Ok(rows)
}

async fn forget(database: &Database, transfer: &str) -> Result<(), ExpiryError> {
    let mut tx = database.begin().await?;
    let sql = "delete from hold_expiries where transfer_id = $1";
    execute(&mut tx, sql, &[Bind::Text(transfer)]).await?;
    tx.commit().await?;
    Ok(())
}

/// One round: catch up with the log, then void every due hold. Returns how many it voided.
pub async fn expire_due(ledger: &LedgerFlow) -> Result<u64, ExpiryError> {
    catch_up(&ledger.database, ledger.store.as_ref()).await?;
    let now_ms = ledger.clock.now().timestamp_millis();
    let mut expired = 0;
    for (transfer, tenant) in due(&ledger.database, now_ms).await? {
        let (Ok(id), Ok(tenant_id)) = (transfer.parse::<TransferId>(), TenantId::parse(&tenant))
        else {
            // Written from a decoded event: unparsable means the row was changed by hand.
            tracing::error!(%transfer, %tenant, "unreadable hold expiry row; dropped");
            forget(&ledger.database, &transfer).await?;
            continue;
        };
        match ledger.expire_hold(&tenant_id, id).await? {
            HoldExpiry::Expired => expired += 1,
            // Its ending is in the log: the next catch-up removes the row, this saves a visit.
            HoldExpiry::AlreadyEnded => forget(&ledger.database, &transfer).await?,
            HoldExpiry::NotDue => {}
            HoldExpiry::Refused(rejection) => {
                tracing::error!(%transfer, %rejection, "a hold expiry row names no open hold; dropped");
                forget(&ledger.database, &transfer).await?;
            }
        }
    }
    Ok(expired)
}

/// Runs [`expire_due`] every `interval` until `shutdown`.
pub async fn run(
    ledger: LedgerFlow,
    interval: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            _ = tick.tick() => {}
        }
        match expire_due(&ledger).await {
            Ok(0) => {}
            Ok(count) => tracing::info!(count, "expired holds voided"),
            Err(error) => tracing::warn!(%error, "hold expiry round failed; retrying"),
        }
    }
}
