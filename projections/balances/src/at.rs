//! Balances at a point of the past, and account statements, from the legs and their marks
//! (`crate::marks`): exact, never from a snapshot, at the cost of one statement for an account
//! and its pending accounts (for each, its nearest mark and at most `MARK_LEGS` legs after it;
//! a position's place in log order comes from the spans, `crate::spans`, in the same statement).
//!
//! A point is a log position (the balance after every event up to and including it), a time
//! (the balance right after the tenant's last journal entry recorded at or before that time,
//! legs taken in log order), or both (the last such entry up to that position). On PostgreSQL
//! an event's time is its transaction's start, so two entries may commit in one order and carry
//! times in the other; a time always names the state after one entry, a state the ledger was
//! in, the same for every account of the tenant, never a mix of two.

use asiento_domain::account::PendingSide;
use asiento_domain::{AccountName, Amount, Balance};
use asiento_eventstore::{Cursor, Database, EventStore};
use asiento_projector::on_db;
use chrono::{DateTime, Utc};

use crate::marks::{sums_through, Through};
use crate::read::wait;
use crate::{AccountBalance, BalanceError, ENTRIES_LIMIT_MAX, ENTRIES_NAME};

/// Where in the past a balance is read: after the event at `position`, after the tenant's last
/// journal entry recorded at or before `time`, or, with both, the last such entry up to
/// `position`. With neither, now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Point {
    pub position: Option<i64>,
    pub time: Option<DateTime<Utc>>,
}

/// The account's (tenant, account, currency) key as the queries bind it.
type Key<'a> = (&'a str, &'a str, &'a str);

/// The cursor of the tenant's last journal entry, up to `upto`, recorded before `time`
/// (`inclusive`: at or before), by the time recorded and then log order.
async fn last_entry_before(
    db: &Database,
    tenant: &str,
    time: DateTime<Utc>,
    inclusive: bool,
    upto: Cursor,
) -> Result<Option<Cursor>, BalanceError> {
    let op = if inclusive { "<=" } else { "<" };
    let sql = format!(
        "SELECT xact, position FROM journal_entries \
         WHERE tenant = $1 AND recorded_at {op} $2 AND (xact, position) <= ($3, $4) \
         ORDER BY recorded_at DESC, xact DESC, position DESC LIMIT 1"
    );
    let row: Option<(i64, i64)> = on_db!(db, pool => {
        sqlx::query_as(&sql)
            .bind(tenant)
            .bind(time)
            .bind(upto.xact())
            .bind(upto.position())
            .fetch_optional(pool)
            .await?
    });
    Ok(row.map(|(xact, position)| Cursor::new(xact, position)))
}

/// Where a point names for `tenant` is: the position (its place in log order found with the
/// sums), or its last entry recorded by the time up to it; the legs projection's checkpoint
/// (once it includes the log's head) for neither.
async fn resolve(
    db: &Database,
    store: &dyn EventStore,
    tenant: &str,
    point: Point,
    inclusive: bool,
) -> Result<Through, BalanceError> {
    let upto = match point.position {
        // A time is read from the journal's index by time: it must hold the position first.
        Some(position) if point.time.is_some() => {
            wait(db, store, position).await?;
            cursor_at(store, position).await?
        }
        Some(position) => return Ok(Through::Position(position)),
        None => {
            wait_for_head(db, store).await?;
            asiento_projector::checkpoint(db, ENTRIES_NAME)
                .await?
                .ok_or(BalanceError::NotInstalled)?
                .cursor
        }
    };
    let Some(time) = point.time else {
        return Ok(Through::Cursor(upto));
    };
    Ok(Through::Cursor(
        last_entry_before(db, tenant, time, inclusive, upto)
            .await?
            .unwrap_or(Cursor::START),
    ))
}

/// Waits until the legs projection includes every event the log had when the read began.
async fn wait_for_head(db: &Database, store: &dyn EventStore) -> Result<(), BalanceError> {
    let head = store.head().await?;
    if head.position() > 0 {
        wait(db, store, head.position()).await?;
    }
    Ok(())
}

/// The cursor of the event at `position`; 0 names the point before every event.
async fn cursor_at(store: &dyn EventStore, position: i64) -> Result<Cursor, BalanceError> {
    if position == 0 {
        return Ok(Cursor::START);
    }
    store
        .cursor_of_position(position)
        .await?
        .ok_or(BalanceError::UnknownPosition { position })
}

/// The sums of `accounts` up to `through`, in their order, once the legs projection includes
/// it, and the place in log order they are read up to: read with the projection's checkpoint,
/// and read again after waiting when it does not include it yet. A position no span holds yet is
/// looked up in the log (which says whether it ever had it) before the sums are read again.
async fn sums_at(
    db: &Database,
    store: &dyn EventStore,
    key: (&str, &[&str], &str),
    mut through: Through,
) -> Result<(Vec<Balance>, Cursor), BalanceError> {
    let (tenant, accounts, currency) = key;
    if matches!(
        through,
        Through::Cursor(Cursor::START) | Through::Position(0)
    ) {
        return Ok((vec![Balance::ZERO; accounts.len()], Cursor::START));
    }
    // At most: the spans without the position, then the checkpoint short of it, then the sums.
    for _ in 0..3 {
        let read = sums_through(db, tenant, accounts, currency, through).await?;
        let checkpoint = read.checkpoint.ok_or(BalanceError::NotInstalled)?;
        through = match (read.through, through) {
            (Some(point), _) if checkpoint >= point => return Ok((read.sums, point)),
            (Some(point), _) => {
                wait(db, store, point.position()).await?;
                Through::Cursor(point)
            }
            (None, Through::Position(position)) => {
                Through::Cursor(cursor_at(store, position).await?)
            }
            (None, Through::Cursor(cursor)) => {
                unreachable!("the sums through a known place ({cursor:?}) always name it")
            }
        };
    }
    Err(BalanceError::ProjectionLagging {
        waited_ms: asiento_projector::READ_WAIT_MS_MAX,
    })
}

/// The sum of one account up to `through`, and the place in log order it is read up to.
async fn sum_at(
    db: &Database,
    store: &dyn EventStore,
    key: Key<'_>,
    through: Through,
) -> Result<(Balance, Cursor), BalanceError> {
    let (sums, point) = sums_at(db, store, (key.0, &[key.1], key.2), through).await?;
    Ok((sums.first().copied().unwrap_or(Balance::ZERO), point))
}

/// The balance of (tenant, account, currency) and what holds reserved on it at `point`.
/// `as_of_position` is the position of the event it is read after (0: before any).
pub async fn balance_at(
    db: &Database,
    store: &dyn EventStore,
    tenant: &str,
    account: &AccountName,
    currency: &str,
    point: Point,
) -> Result<AccountBalance, BalanceError> {
    let names = [
        account.clone(),
        account.pending(PendingSide::Debits),
        account.pending(PendingSide::Credits),
    ]
    .map(String::from);
    let through = resolve(db, store, tenant, point, true).await?;
    let accounts: Vec<&str> = names.iter().map(String::as_str).collect();
    let (sums, cursor) = sums_at(db, store, (tenant, &accounts, currency), through).await?;
    let sums: [Balance; 3] = sums
        .try_into()
        .unwrap_or_else(|_| unreachable!("one sum per account asked for"));
    AccountBalance::of_sums(sums, cursor.position())
}

/// Which statement, and which page of its lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatementQuery {
    pub tenant: String,
    pub account: String,
    pub currency: String,
    /// The period starts after the tenant's last entry recorded before; None: at the start.
    pub from: Option<DateTime<Utc>>,
    /// Where the period ends: after the tenant's last entry recorded before `to.time`, up to
    /// `to.position` (what the pages after the first pass, so that every page reads the same
    /// period however the log grows meanwhile); neither: now.
    pub to: Point,
    /// The page after this line's position (`next_after`); None for the first page.
    pub after: Option<i64>,
    /// Lines per page, 1..=[`ENTRIES_LIMIT_MAX`].
    pub limit: usize,
}

/// One line of a statement: a leg on the account and the balance after it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StatementLine {
    pub entry_id: String,
    pub position: i64,
    pub recorded_at: DateTime<Utc>,
    pub amount_minor: i64,
    /// The posted balance after this leg.
    pub balance_minor: Balance,
    /// The stream whose event posted the entry: `payment-pay_…`, `transfer-tr_…`, `payout-…`.
    pub source: Option<String>,
    /// What the merchant wrote of the transfer the entry posts, if anything.
    pub description: Option<String>,
}

/// A page of a statement: the period's opening and closing posted balances (the same on every
/// page) and its lines after the query's `after`, in log order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    pub opening_balance_minor: Balance,
    pub closing_balance_minor: Balance,
    /// The position of the event the opening balance is read after (0: before any).
    pub opening_position: i64,
    /// The position of the event the closing balance is read after.
    pub closing_position: i64,
    pub lines: Vec<StatementLine>,
    /// The `after` of the next page; None on the last.
    pub next_after: Option<i64>,
}

type LineRow = (
    String,
    i64,
    i64,
    i32,
    i64,
    DateTime<Utc>,
    Option<String>,
    Option<String>,
);

/// A statement line's columns: the leg, and its entry's source and description.
const LINE_COLUMNS: &str = "l.entry_id, l.xact, l.position, l.leg, l.amount_minor, l.recorded_at, \
     j.source, j.description FROM balance_legs l \
     LEFT JOIN journal_entries j ON j.tenant = l.tenant AND j.entry_id = l.entry_id";

/// A page of the account's statement: opening plus its lines equals closing, by construction
/// (the lines are exactly the account's legs between the two points, in log order).
pub async fn statement(
    db: &Database,
    store: &dyn EventStore,
    query: &StatementQuery,
) -> Result<Statement, BalanceError> {
    let key = (
        query.tenant.as_str(),
        query.account.as_str(),
        query.currency.as_str(),
    );
    // The closing sum first: it waits for the legs projection to include the closing point, so
    // that the opening point (read from the journal's index by time) and the lines are there.
    let closing_point = resolve(db, store, &query.tenant, query.to, false).await?;
    let (closing, closing_cursor) = sum_at(db, store, key, closing_point).await?;
    let opening_cursor = match query.from {
        None => Cursor::START,
        Some(from) => last_entry_before(db, &query.tenant, from, false, closing_cursor)
            .await?
            .unwrap_or(Cursor::START),
    };
    let page_start = match query.after {
        None | Some(0) => opening_cursor,
        Some(position) => store
            .cursor_of_position(position)
            .await?
            .ok_or(BalanceError::UnknownPosition { position })?
            .max(opening_cursor),
    };
    let (opening, _) = sum_at(db, store, key, Through::Cursor(opening_cursor)).await?;
    let limit = i64::try_from(query.limit.clamp(1, ENTRIES_LIMIT_MAX)).unwrap_or(1);
    let rows: Vec<LineRow> = on_db!(db, pool => {
        sqlx::query_as(&format!(
            "SELECT {LINE_COLUMNS} \
             WHERE l.tenant = $1 AND l.account = $2 AND l.currency = $3 \
               AND (l.xact, l.position) > ($4, $5) AND (l.xact, l.position) <= ($6, $7) \
             ORDER BY l.xact, l.position, l.leg LIMIT $8"
        ))
        .bind(key.0)
        .bind(key.1)
        .bind(key.2)
        .bind(page_start.xact())
        .bind(page_start.position())
        .bind(closing_cursor.xact())
        .bind(closing_cursor.position())
        .bind(limit)
        .fetch_all(pool)
        .await?
    });
    let mut rows = rows;
    // A page ends after a whole entry: the rest of the last entry's legs on this account
    // belong on it (the next page starts after its position).
    let full = rows.len() as i64 == limit;
    if full {
        if let Some(&(_, xact, position, leg, ..)) = rows.last() {
            let rest: Vec<LineRow> = on_db!(db, pool => {
                sqlx::query_as(&format!(
                    "SELECT {LINE_COLUMNS} \
                     WHERE l.tenant = $1 AND l.account = $2 AND l.currency = $3 \
                       AND l.xact = $4 AND l.position = $5 AND l.leg > $6 ORDER BY l.leg"
                ))
                .bind(key.0)
                .bind(key.1)
                .bind(key.2)
                .bind(xact)
                .bind(position)
                .bind(leg)
                .fetch_all(pool)
                .await?
            });
            rows.extend(rest);
        }
    }
    let mut running = if page_start == opening_cursor {
        opening
    } else {
        sum_at(db, store, key, Through::Cursor(page_start)).await?.0
    };
    let mut lines = Vec::with_capacity(rows.len());
    for (entry_id, _, position, _, amount_minor, recorded_at, source, description) in rows {
        running = running
            .checked_add(Amount::new(amount_minor))
            .map_err(|_| asiento_projector::ProjectionError::Malformed {
                position,
                reason: "a balance overflows i128".to_owned(),
            })?;
        lines.push(StatementLine {
            entry_id,
            position,
            recorded_at,
            amount_minor,
            balance_minor: running,
            source,
            description,
        });
    }
    let next_after = if full {
        lines.last().map(|line| line.position)
    } else {
        None
    };
    Ok(Statement {
        opening_balance_minor: opening,
        closing_balance_minor: closing,
        opening_position: opening_cursor.position(),
        closing_position: closing_cursor.position(),
        lines,
        next_after,
    })
}
