//! The worker that voids holds nobody posted or voided before their `expires_at`.
//!
//! The open holds with an expiry are kept from the log itself (`hold_expiries`, one cursor), as
//! the reconciler's watch lists are, so that expiry depends on no read model's lag or rebuild: a
//! hold enters at the event carrying its request (its `EntryPosted`, or a `TransferRequested` in
//! logs written before) and leaves at its `HoldPosted` or `HoldVoided`. Each round catches up,
//! then voids the due holds, most overdue first, through [`LedgerFlow::expire_hold`]: the
//! transfer's stream version makes an expiry racing a client's post or void lose or win whole, so
//! several workers may run at once.

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
        "EntryPosted" | "TransferRequested" => {
            let decoded =
                TransferEvent::decode_raw(&event.event_type, event.schema, event.data.raw())?;
            let requested = match decoded {
                TransferEvent::TransferRequested(requested) => Some(requested),
                TransferEvent::EntryPosted(posted) => posted.transfer,
                _ => None,
            };
            match requested {
                Some(requested) if requested.pending => {
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

/// Holds whose `expires_at` is at or before `now_ms`, most overdue first, but those of `paused`
/// tenants.
async fn due(
    database: &Database,
    now_ms: i64,
    paused: &[TenantId],
) -> Result<Vec<(String, String)>, ExpiryError> {
    // Placeholders numbered in the order they appear (SQLite numbers `$N` by first appearance).
    let skipped: Vec<String> = (0..paused.len()).map(|i| format!("${}", i + 2)).collect();
    let skipped = if skipped.is_empty() {
        String::new()
    } else {
        format!(" and tenant not in ({})", skipped.join(", "))
    };
    let sql = format!(
        "select transfer_id, tenant from hold_expiries where expires_ms <= $1{skipped} \
         order by expires_ms limit ${}",
        paused.len() + 2
    );
    let rows = match database {
        Database::Postgres(pool) => {
            let mut query = sqlx::query_as(&sql).bind(now_ms);
            for tenant in paused {
                query = query.bind(tenant.as_str());
            }
            query.bind(EXPIRIES_PER_ROUND_MAX).fetch_all(pool).await?
        }
        Database::Sqlite(pool) => {
            let mut query = sqlx::query_as(&sql).bind(now_ms);
            for tenant in paused {
                query = query.bind(tenant.as_str());
            }
            query.bind(EXPIRIES_PER_ROUND_MAX).fetch_all(pool).await?
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

/// One round: catch up with the log, then void every due hold but those of `paused` tenants
/// (moving to another cell: nothing writes for them). Returns how many it voided.
pub async fn expire_due(ledger: &LedgerFlow, paused: &[TenantId]) -> Result<u64, ExpiryError> {
    catch_up(&ledger.database, ledger.store.as_ref()).await?;
    let now_ms = ledger.clock.now().timestamp_millis();
    let mut expired = 0;
    for (transfer, tenant) in due(&ledger.database, now_ms, paused).await? {
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
            // Not due yet, or its accounts too busy this round: the next round tries again.
            HoldExpiry::NotDue | HoldExpiry::Contended => {}
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
    paused: Vec<TenantId>,
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
        match expire_due(&ledger, &paused).await {
            Ok(0) => {}
            Ok(count) => tracing::info!(count, "expired holds voided"),
            Err(error) => tracing::warn!(%error, "hold expiry round failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use asiento_domain::transfer::{decide, Transfer};
    use asiento_domain::{AccountName, Amount, Currency, RequestTransfer};
    use asiento_eventstore::{Cursor, Metadata};
    use chrono::{TimeZone, Utc};
    use uuid::Uuid;

    use super::*;

    fn recorded(stream_id: &str, event: &TransferEvent) -> RecordedEvent {
        RecordedEvent {
            position: 1,
            cursor: Cursor::default(),
            stream_id: stream_id.to_owned(),
            version: 1,
            event_id: Uuid::nil(),
            event_type: event.event_type().to_owned(),
            schema: event.schema_version(),
            data: event.encode().unwrap().into(),
            metadata: Metadata::default(),
            recorded_at: Utc::now(),
        }
    }

    fn watched(change: Option<Change>) -> Option<(String, i64)> {
        match change {
            Some(Change::Watch {
                tenant, expires_ms, ..
            }) => Some((tenant, expires_ms)),
            _ => None,
        }
    }

    #[test]
    fn a_hold_is_watched_from_the_event_that_carries_its_request_in_either_form() {
        let id = TransferId::from_uuid(Uuid::now_v7());
        let stream = asiento_domain::transfer_stream(id);
        let expires_at = Utc.timestamp_millis_opt(1_800_000_000_000).unwrap();
        let hold = |pending: bool| RequestTransfer {
            id,
            tenant: TenantId::parse("acme").unwrap(),
            from: AccountName::parse("customer:1:available").unwrap(),
            to: AccountName::parse("merchant:1").unwrap(),
            amount: Amount::new(500),
            currency: Currency::parse("USD").unwrap(),
            description: None,
            pending,
            expires_at: pending.then_some(expires_at),
            at: Utc.timestamp_millis_opt(1_700_000_000_000).unwrap(),
        };
        let events = decide(&Transfer::default(), hold(true)).unwrap();
        let [TransferEvent::EntryPosted(posted)] = events.as_slice() else {
            panic!("not one entry: {events:?}")
        };
        let expected = Some(("acme".to_owned(), expires_at.timestamp_millis()));
        assert_eq!(
            watched(change_of(&recorded(&stream, &events[0])).unwrap()),
            expected
        );
        // As logs written before hold it: the request, then an entry that does not carry it.
        let request = TransferEvent::TransferRequested(posted.transfer.clone().unwrap());
        let entry = TransferEvent::EntryPosted(asiento_domain::payment::EntryPosted {
            transfer: None,
            ..posted.clone()
        });
        assert_eq!(
            watched(change_of(&recorded(&stream, &request)).unwrap()),
            expected
        );
        assert_eq!(
            watched(change_of(&recorded(&stream, &entry)).unwrap()),
            None
        );
        // A plain transfer is never watched.
        let plain = decide(&Transfer::default(), hold(false)).unwrap();
        assert_eq!(
            watched(change_of(&recorded(&stream, &plain[0])).unwrap()),
            None
        );
    }
}
