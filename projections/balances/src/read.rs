//! The read side of balances: exact balance reads, account legs and journal entries.

use std::time::{Duration, Instant};

use asiento_domain::account::PendingSide;
use asiento_domain::{AccountName, Amount, Balance};
use asiento_eventstore::{Cursor, Database, EventStore};
use asiento_projector::{on_db, wait_for_position, WaitError, READ_WAIT_MS_MAX};
use chrono::{DateTime, Utc};

use crate::decode::{balance as balance_of, entry_posted};
use crate::{
    AccountBalance, AccountLeg, BalanceError, JournalEntryView, LegView, ENTRIES_NAME, NAME,
};

/// Events after the snapshot a balance read is willing to add up itself. Past this the
/// projector is far behind (or stopped) and the read answers `projection_lagging` rather than
/// scanning an unbounded part of the log.
pub const TAIL_EVENTS_MAX: usize = 100_000;
/// Events per log read while adding up the tail.
const TAIL_PAGE_EVENTS: usize = 1_000;
/// Legs per page of `entries`, at most.
pub const ENTRIES_LIMIT_MAX: usize = 1_000;
/// How often a read waiting for `min_position` looks again.
const WAIT_POLL_MS: u64 = 20;

/// The balance of (tenant, account, currency) and what holds reserve on it (the balances of its
/// two pending accounts): the snapshot plus every leg after it. See the crate docs.
/// `min_position`: wait (at most [`READ_WAIT_MS_MAX`]) until the event at that position is
/// included.
#[tracing::instrument(skip(db, store))]
pub async fn read_balance(
    db: &Database,
    store: &dyn EventStore,
    tenant: &str,
    account: &AccountName,
    currency: &str,
    min_position: Option<i64>,
) -> Result<AccountBalance, BalanceError> {
    let started = Instant::now();
    let names = [
        account.clone(),
        account.pending(PendingSide::Debits),
        account.pending(PendingSide::Credits),
    ]
    .map(String::from);
    let (mut reached, mut balances) = snapshot(db, tenant, &names, currency).await?;
    let mut tail_events = 0usize;
    let mut target: Option<Cursor> = None;
    loop {
        // Everything the log can serve after `reached`.
        loop {
            let page = store.read_all(reached, TAIL_PAGE_EVENTS).await?;
            for event in &page {
                let Some(posted) = entry_posted(event)? else {
                    continue;
                };
                if posted.tenant != tenant {
                    continue;
                }
                for leg in posted.legs.iter().filter(|l| l.currency == currency) {
                    let Some(slot) = names.iter().position(|name| *name == leg.account) else {
                        continue;
                    };
                    balances[slot] = balances[slot]
                        .checked_add(Amount::new(leg.amount_minor))
                        .map_err(|_| asiento_projector::ProjectionError::Malformed {
                            position: event.position,
                            reason: "a balance overflows i128".to_owned(),
                        })?;
                }
            }
            tail_events += page.len();
            if let Some(last) = page.last() {
                reached = last.cursor;
            }
            if page.len() < TAIL_PAGE_EVENTS {
                break;
            }
            if tail_events >= TAIL_EVENTS_MAX {
                return Err(BalanceError::ProjectionLagging {
                    waited_ms: elapsed_ms(started),
                });
            }
        }
        let Some(position) = min_position.filter(|p| *p > 0) else {
            break;
        };
        if target.is_none() {
            target = store.cursor_of_position(position).await?;
        }
        if target.is_some_and(|t| reached >= t) {
            break;
        }
        let waited_ms = elapsed_ms(started);
        if waited_ms >= READ_WAIT_MS_MAX {
            return Err(BalanceError::ProjectionLagging { waited_ms });
        }
        tokio::time::sleep(Duration::from_millis(WAIT_POLL_MS)).await;
    }
    AccountBalance::of_sums(balances, reached.position())
}

/// The snapshot row and the checkpoint it is exact at, read in ONE statement so that they agree
/// even while a batch or a rebuild swap commits.
async fn snapshot(
    db: &Database,
    tenant: &str,
    accounts: &[String; 3],
    currency: &str,
) -> Result<(Cursor, [Balance; 3]), BalanceError> {
    type Row = (i64, i64, Option<String>, Option<String>, Option<String>);
    let row: Option<Row> = on_db!(db, pool => {
        sqlx::query_as(
            "SELECT p.checkpoint_xact, p.checkpoint_position, CAST(b.balance_minor AS TEXT), \
                    CAST(d.balance_minor AS TEXT), CAST(c.balance_minor AS TEXT) \
             FROM projections p \
             LEFT JOIN balances b ON b.tenant = $2 AND b.account = $3 AND b.currency = $4 \
             LEFT JOIN balances d ON d.tenant = $2 AND d.account = $5 AND d.currency = $4 \
             LEFT JOIN balances c ON c.tenant = $2 AND c.account = $6 AND c.currency = $4 \
             WHERE p.name = $1",
        )
        .bind(NAME)
        .bind(tenant)
        .bind(&accounts[0])
        .bind(currency)
        .bind(&accounts[1])
        .bind(&accounts[2])
        .fetch_optional(pool)
        .await?
    });
    let (x, p, balance, debits, credits) = row.ok_or(BalanceError::NotInstalled)?;
    let mut balances = [Balance::ZERO; 3];
    for (slot, text) in balances.iter_mut().zip([balance, debits, credits]) {
        if let Some(text) = text {
            *slot = balance_of(&text)?;
        }
    }
    Ok((Cursor::new(x, p), balances))
}

#[derive(sqlx::FromRow)]
struct LegRow {
    entry_id: String,
    amount_minor: i64,
    xact: i64,
    position: i64,
    leg: i32,
    recorded_at: DateTime<Utc>,
}

/// The legs on (tenant, account, currency), oldest first (commit order), after the leg at
/// position `after`, at most `limit` of them (clamped to [`ENTRIES_LIMIT_MAX`]) except that a
/// page never splits the legs of one entry on the account. `min_position`: wait until the
/// projection includes that event.
#[tracing::instrument(skip(db, store))]
#[allow(clippy::too_many_arguments)] // the HTTP query's parameters, one for one
pub async fn entries(
    db: &Database,
    store: &dyn EventStore,
    tenant: &str,
    account: &str,
    currency: &str,
    after: Option<i64>,
    limit: usize,
    min_position: Option<i64>,
) -> Result<Vec<AccountLeg>, BalanceError> {
    if let Some(position) = min_position {
        wait(db, store, position).await?;
    }
    let after = match after {
        None | Some(0) => Cursor::START,
        Some(position) => store
            .cursor_of_position(position)
            .await?
            .ok_or(BalanceError::UnknownPosition { position })?,
    };
    let limit = i64::try_from(limit.clamp(1, ENTRIES_LIMIT_MAX)).unwrap_or(1);
    const COLUMNS: &str = "entry_id, amount_minor, xact, position, leg, recorded_at";
    let page: Vec<LegRow> = on_db!(db, pool => {
        sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM balance_legs \
             WHERE tenant = $1 AND account = $2 AND currency = $3 AND (xact, position) > ($4, $5) \
             ORDER BY xact, position, leg LIMIT $6"
        ))
        .bind(tenant)
        .bind(account)
        .bind(currency)
        .bind(after.xact())
        .bind(after.position())
        .bind(limit)
        .fetch_all(pool)
        .await?
    });
    let mut legs = page;
    // The next page starts after the last position, so the rest of that entry's legs on this
    // account (at most one entry's worth) belong on this page.
    if legs.len() as i64 == limit {
        if let Some(last) = legs.last() {
            let (x, p, leg) = (last.xact, last.position, last.leg);
            let rest: Vec<LegRow> = on_db!(db, pool => {
                sqlx::query_as(&format!(
                    "SELECT {COLUMNS} FROM balance_legs \
                     WHERE tenant = $1 AND account = $2 AND currency = $3 \
                       AND xact = $4 AND position = $5 AND leg > $6 ORDER BY leg"
                ))
                .bind(tenant)
                .bind(account)
                .bind(currency)
                .bind(x)
                .bind(p)
                .bind(leg)
                .fetch_all(pool)
                .await?
            });
            legs.extend(rest);
        }
    }
    Ok(legs
        .into_iter()
        .map(|l| AccountLeg {
            entry_id: l.entry_id,
            amount_minor: l.amount_minor,
            position: l.position,
            recorded_at: l.recorded_at,
        })
        .collect())
}

#[derive(sqlx::FromRow)]
struct EntryRow {
    entry_id: String,
    tenant: String,
    position: i64,
    reverses: Option<String>,
    legs: sqlx::types::Json<Vec<LegView>>,
    recorded_at: DateTime<Utc>,
    source: String,
    description: Option<String>,
}

/// One journal entry of `tenant` with all its legs; None if the tenant has no such entry (or
/// the projector has not reached it: pass `min_position` to wait for it).
#[tracing::instrument(skip(db, store))]
pub async fn journal_entry(
    db: &Database,
    store: &dyn EventStore,
    tenant: &str,
    entry_id: &str,
    min_position: Option<i64>,
) -> Result<Option<JournalEntryView>, BalanceError> {
    if let Some(position) = min_position {
        wait(db, store, position).await?;
    }
    let row: Option<EntryRow> = on_db!(db, pool => {
        sqlx::query_as(
            "SELECT entry_id, tenant, position, reverses, legs, recorded_at, source, description \
             FROM journal_entries WHERE tenant = $1 AND entry_id = $2",
        )
        .bind(tenant)
        .bind(entry_id)
        .fetch_optional(pool)
        .await?
    });
    Ok(row.map(|r| JournalEntryView {
        entry_id: r.entry_id,
        tenant: r.tenant,
        position: r.position,
        reverses: r.reverses,
        legs: r.legs.0,
        recorded_at: r.recorded_at,
        source: r.source,
        description: r.description,
    }))
}

pub(crate) async fn wait(
    db: &Database,
    store: &dyn EventStore,
    position: i64,
) -> Result<(), BalanceError> {
    // Legs and journal entries come from their own projection.
    match wait_for_position(db, store, ENTRIES_NAME, position, READ_WAIT_MS_MAX).await {
        Ok(_) => Ok(()),
        Err(WaitError::Lagging { waited_ms, .. }) => {
            Err(BalanceError::ProjectionLagging { waited_ms })
        }
        Err(WaitError::NotInstalled { .. }) => Err(BalanceError::NotInstalled),
        Err(WaitError::Store(e)) => Err(e.into()),
        Err(WaitError::Database(e)) => Err(e.into()),
    }
}

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}
