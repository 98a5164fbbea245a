//! Marks: an account's running sum every [`MARK_LEGS`] legs, kept by the legs projection
//! (`ledger_entries`), so that a balance at any point of the log costs one lookup plus at most
//! [`MARK_LEGS`] legs, however long the account's history (`crate::at`).
//!
//! - `balance_runs_g{n}`: per (tenant, account, currency) the number of legs and their sum so
//!   far, which tells the batch where the next mark falls;
//! - `balance_marks_g{n}`: at every [`MARK_LEGS`]-th leg of an account, in log order, that leg's
//!   place (`xact`, `position`, `leg`) and the sum of the account's legs up to and including it.
//!
//! Both change with the legs, in the projection's transaction, and a rebuild makes them again;
//! `verify_marks` checks every mark and run against the legs, and the legs' sums against the
//! log's entries.

use std::collections::HashMap;

use asiento_domain::{Amount, Balance};
use asiento_eventstore::{Cursor, Database, EventStore, Tx};
use asiento_projector::snapshot::Snapshot;
use asiento_projector::{on_db, on_snapshot};

use crate::decode::balance as balance_of;
use crate::projection::LegRow;
use crate::BalanceError;
use crate::ENTRIES_NAME;

/// Legs between two marks of one account: a read in the past adds at most this many.
pub const MARK_LEGS: i64 = 128;

/// The divisor a sum of legs is read in two halves by (`sums_through`).
const SPLIT: i64 = 1 << 32;

/// The tables of marks and runs, created with the legs' (per backend: the sums are `NUMERIC` on
/// PostgreSQL and decimal `TEXT` on SQLite, as the balances are).
pub(crate) fn ddl(g: i64, postgres: bool) -> Vec<String> {
    let (int, sum, rowid, sum_check) = if postgres {
        ("BIGINT", "NUMERIC", "", "")
    } else {
        (
            "INTEGER",
            "TEXT",
            " WITHOUT ROWID",
            " CHECK (typeof(balance_minor) = 'text')",
        )
    };
    vec![
        format!(
            "CREATE TABLE balance_runs_g{g} (
                tenant        TEXT  NOT NULL,
                account       TEXT  NOT NULL,
                currency      TEXT  NOT NULL,
                legs          {int} NOT NULL,
                balance_minor {sum} NOT NULL{sum_check},
                PRIMARY KEY (tenant, account, currency)){rowid}"
        ),
        format!(
            "CREATE TABLE balance_marks_g{g} (
                tenant        TEXT  NOT NULL,
                account       TEXT  NOT NULL,
                currency      TEXT  NOT NULL,
                xact          {int} NOT NULL,
                position      {int} NOT NULL,
                leg           INTEGER NOT NULL,
                legs          {int} NOT NULL,
                balance_minor {sum} NOT NULL{sum_check},
                PRIMARY KEY (tenant, account, currency, xact, position, leg)){rowid}"
        ),
    ]
}

/// An account's legs so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Run {
    legs: i64,
    balance: Balance,
}

type Key = (String, String, String);

/// A mark to insert.
struct Mark {
    key: Key,
    xact: i64,
    position: i64,
    leg: i32,
    legs: i64,
    balance: Balance,
}

fn overflow(position: i64) -> sqlx::Error {
    sqlx::Error::Decode(format!("an account's running sum overflows i128 at {position}").into())
}

/// Advances the runs of the accounts `legs` (a batch's, in log order) touch and inserts the
/// marks they pass.
pub(crate) async fn write(tx: &mut Tx, g: i64, legs: &[LegRow]) -> Result<(), sqlx::Error> {
    if legs.is_empty() {
        return Ok(());
    }
    let mut keys: Vec<Key> = Vec::new();
    let mut runs: HashMap<Key, Run> = HashMap::new();
    for l in legs {
        let key = (l.tenant.clone(), l.account.clone(), l.currency.clone());
        if !runs.contains_key(&key) {
            runs.insert(key.clone(), Run::default());
            keys.push(key);
        }
    }
    for (key, run) in load(tx, g, &keys).await? {
        runs.insert(key, run);
    }
    let mut marks = Vec::new();
    for l in legs {
        let key = (l.tenant.clone(), l.account.clone(), l.currency.clone());
        let run = runs.entry(key.clone()).or_default();
        run.legs += 1;
        run.balance = run
            .balance
            .checked_add(Amount::new(l.amount_minor))
            .map_err(|_| overflow(l.cursor.position()))?;
        if run.legs % MARK_LEGS == 0 {
            marks.push(Mark {
                key,
                xact: l.cursor.xact(),
                position: l.cursor.position(),
                leg: l.leg,
                legs: run.legs,
                balance: run.balance,
            });
        }
    }
    store(tx, g, &keys, &runs, &marks).await
}

async fn load(tx: &mut Tx, g: i64, keys: &[Key]) -> Result<Vec<(Key, Run)>, sqlx::Error> {
    type Row = (String, String, String, i64, String);
    let select = format!(
        "SELECT tenant, account, currency, legs, CAST(balance_minor AS TEXT) FROM balance_runs_g{g} \
         WHERE tenant = $1 AND account = $2 AND currency = $3"
    );
    let rows: Vec<Row> = match tx {
        Tx::Postgres(t) => {
            let column = |i: usize| -> Vec<&str> {
                keys.iter()
                    .map(|k| match i {
                        0 => k.0.as_str(),
                        1 => k.1.as_str(),
                        _ => k.2.as_str(),
                    })
                    .collect()
            };
            sqlx::query_as(&select.replace(
                "tenant = $1 AND account = $2 AND currency = $3",
                "(tenant, account, currency) IN \
                 (SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[]))",
            ))
            .bind(column(0))
            .bind(column(1))
            .bind(column(2))
            .fetch_all(&mut **t)
            .await?
        }
        Tx::Sqlite(t) => {
            let mut rows = Vec::new();
            for (tenant, account, currency) in keys {
                rows.extend(
                    sqlx::query_as::<_, Row>(&select)
                        .bind(tenant)
                        .bind(account)
                        .bind(currency)
                        .fetch_optional(&mut **t)
                        .await?,
                );
            }
            rows
        }
    };
    rows.into_iter()
        .map(|(tenant, account, currency, legs, balance)| {
            Ok((
                (tenant, account, currency),
                Run {
                    legs,
                    balance: balance_of(&balance)?,
                },
            ))
        })
        .collect()
}

async fn store(
    tx: &mut Tx,
    g: i64,
    keys: &[Key],
    runs: &HashMap<Key, Run>,
    marks: &[Mark],
) -> Result<(), sqlx::Error> {
    let run_of = |key: &Key| runs.get(key).copied().unwrap_or_default();
    match tx {
        Tx::Postgres(t) => {
            sqlx::query(&format!(
                "INSERT INTO balance_runs_g{g} (tenant, account, currency, legs, balance_minor)
                 SELECT t, a, c, n, s::numeric
                 FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int8[], $5::text[])
                     AS u(t, a, c, n, s)
                 ON CONFLICT (tenant, account, currency) DO UPDATE
                 SET legs = excluded.legs, balance_minor = excluded.balance_minor"
            ))
            .bind(keys.iter().map(|k| k.0.as_str()).collect::<Vec<_>>())
            .bind(keys.iter().map(|k| k.1.as_str()).collect::<Vec<_>>())
            .bind(keys.iter().map(|k| k.2.as_str()).collect::<Vec<_>>())
            .bind(keys.iter().map(|k| run_of(k).legs).collect::<Vec<_>>())
            .bind(
                keys.iter()
                    .map(|k| run_of(k).balance.to_string())
                    .collect::<Vec<_>>(),
            )
            .execute(&mut **t)
            .await?;
            if !marks.is_empty() {
                sqlx::query(&format!(
                    "INSERT INTO balance_marks_g{g}
                         (tenant, account, currency, xact, position, leg, legs, balance_minor)
                     SELECT t, a, c, x, p, l, n, s::numeric
                     FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[],
                                 $6::int4[], $7::int8[], $8::text[]) AS u(t, a, c, x, p, l, n, s)"
                ))
                .bind(marks.iter().map(|m| m.key.0.as_str()).collect::<Vec<_>>())
                .bind(marks.iter().map(|m| m.key.1.as_str()).collect::<Vec<_>>())
                .bind(marks.iter().map(|m| m.key.2.as_str()).collect::<Vec<_>>())
                .bind(marks.iter().map(|m| m.xact).collect::<Vec<_>>())
                .bind(marks.iter().map(|m| m.position).collect::<Vec<_>>())
                .bind(marks.iter().map(|m| m.leg).collect::<Vec<_>>())
                .bind(marks.iter().map(|m| m.legs).collect::<Vec<_>>())
                .bind(
                    marks
                        .iter()
                        .map(|m| m.balance.to_string())
                        .collect::<Vec<_>>(),
                )
                .execute(&mut **t)
                .await?;
            }
        }
        Tx::Sqlite(t) => {
            let upsert = format!(
                "INSERT INTO balance_runs_g{g} (tenant, account, currency, legs, balance_minor)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (tenant, account, currency) DO UPDATE
                 SET legs = excluded.legs, balance_minor = excluded.balance_minor"
            );
            for key in keys {
                let run = run_of(key);
                sqlx::query(&upsert)
                    .bind(&key.0)
                    .bind(&key.1)
                    .bind(&key.2)
                    .bind(run.legs)
                    .bind(run.balance.to_string())
                    .execute(&mut **t)
                    .await?;
            }
            let insert = format!(
                "INSERT INTO balance_marks_g{g}
                     (tenant, account, currency, xact, position, leg, legs, balance_minor)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
            );
            for m in marks {
                sqlx::query(&insert)
                    .bind(&m.key.0)
                    .bind(&m.key.1)
                    .bind(&m.key.2)
                    .bind(m.xact)
                    .bind(m.position)
                    .bind(m.leg)
                    .bind(m.legs)
                    .bind(m.balance.to_string())
                    .execute(&mut **t)
                    .await?;
            }
        }
    }
    Ok(())
}

/// Where sums are read up to: a known place in log order, or a position whose place the
/// statement reads from the spans (`crate::spans`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Through {
    Cursor(Cursor),
    Position(i64),
}

/// What [`sums_through`] read.
#[derive(Debug)]
pub(crate) struct Sums {
    /// One per account asked for, in their order.
    pub sums: Vec<Balance>,
    /// The projection's checkpoint (None: not installed): the sums are exact if it includes
    /// `through`.
    pub checkpoint: Option<Cursor>,
    /// The place the sums are read up to; None when no span holds the position asked for (the
    /// projection has not applied it, or the log never had it): then the sums mean nothing.
    pub through: Option<Cursor>,
}

/// The sums of `accounts`' legs (of one tenant and currency) up to and including the event
/// `through` names: for each, its nearest mark at or before it plus the legs after the mark (at
/// most [`MARK_LEGS`]), all in one statement with the projection's checkpoint, which says whether
/// the sums include the point, and the point's place in log order. Reads through the views,
/// which a rebuild swaps in one transaction.
pub(crate) async fn sums_through(
    db: &Database,
    tenant: &str,
    accounts: &[&str],
    currency: &str,
    through: Through,
) -> Result<Sums, sqlx::Error> {
    let n = accounts.len();
    assert!(n > 0, "the sums of no account were asked for");
    let (known_xact, position) = match through {
        Through::Cursor(cursor) => (Some(cursor.xact()), cursor.position()),
        Through::Position(position) => (None, position),
    };
    // Placeholders are numbered in the order they first appear (SQLite numbers them so): the
    // point's xact (NULL: from the spans) and position, the tenant, the first account, the
    // currency, the other accounts, then the bounds.
    let account_param = |k: usize| if k == 0 { 4 } else { 5 + k };
    let (min_xact, min_leg, limit, name) = (n + 5, n + 6, n + 7, n + 8);
    let mut sql = format!(
        "WITH pt AS (SELECT COALESCE($1, {}) AS xact)",
        crate::spans::xact_of("$2")
    );
    for k in 0..n {
        sql.push_str(&format!(
            ", m{k} AS (SELECT xact, position, leg, balance_minor FROM balance_marks \
             WHERE tenant = $3 AND account = ${a} AND currency = $5 \
               AND (xact, position) <= ((SELECT xact FROM pt), $2) \
             ORDER BY xact DESC, position DESC, leg DESC LIMIT 1)",
            a = account_param(k)
        ));
    }
    for k in 0..n {
        if k > 0 {
            sql.push_str(" UNION ALL");
        }
        // The mark (part 0), then the sum of the legs after it up to the point (part 1), of at
        // most a mark's worth of legs in index order: a range scan that its limit ends,
        // whatever the planner knows of the table. The sum comes in two halves, the amounts'
        // multiples of 2^32 and their remainders, each far inside i64 for `MARK_LEGS` legs
        // (SQLite's integer SUM refuses to overflow; it is exact in i128 once put together).
        sql.push_str(&format!(
            " SELECT {k}, 0, 0, 0, CAST(balance_minor AS TEXT) FROM m{k} \
             UNION ALL \
             SELECT {k}, 1, CAST(COALESCE(SUM(amount_minor / {SPLIT}), 0) AS BIGINT), \
                    CAST(COALESCE(SUM(amount_minor % {SPLIT}), 0) AS BIGINT), '' FROM ( \
               SELECT xact, position, leg, amount_minor FROM balance_legs \
               WHERE tenant = $3 AND account = ${a} AND currency = $5 \
                 AND (xact, position, leg) > ( \
                   COALESCE((SELECT xact FROM m{k}), ${min_xact}), \
                   COALESCE((SELECT position FROM m{k}), ${min_xact}), \
                   COALESCE((SELECT leg FROM m{k}), ${min_leg})) \
               ORDER BY xact, position, leg LIMIT ${limit}) AS after_m{k} \
             WHERE (xact, position) <= ((SELECT xact FROM pt), $2)",
            a = account_param(k)
        ));
    }
    // The checkpoint (part 2) and the point's xact (part 3) come with the sums, so that they are
    // known to include the point.
    sql.push_str(&format!(
        " UNION ALL SELECT 0, 2, checkpoint_xact, checkpoint_position, '' FROM projections \
         WHERE name = ${name} \
         UNION ALL SELECT 0, 3, xact, 0, '' FROM pt WHERE xact IS NOT NULL"
    ));
    let rows: Vec<(i32, i32, i64, i64, String)> = on_db!(db, pool => {
        let mut query = sqlx::query_as(&sql)
            .bind(known_xact)
            .bind(position)
            .bind(tenant)
            .bind(accounts[0])
            .bind(currency);
        for account in &accounts[1..] {
            query = query.bind(*account);
        }
        query
            .bind(i64::MIN)
            .bind(i32::MIN)
            .bind(MARK_LEGS)
            .bind(ENTRIES_NAME)
            .fetch_all(pool)
            .await?
    });
    let (mut marks, mut legs) = (vec![Balance::ZERO; n], vec![0i128; n]);
    let (mut checkpoint, mut point) = (None, None);
    for (k, part, x, p, value) in rows {
        let k = usize::try_from(k).map_err(|_| overflow(position))?;
        match part {
            0 => marks[k] = balance_of(&value)?,
            1 => legs[k] = i128::from(x) * i128::from(SPLIT) + i128::from(p),
            2 => checkpoint = Some(Cursor::new(x, p)),
            _ => point = Some(Cursor::new(x, position)),
        }
    }
    let sums = marks
        .into_iter()
        .zip(legs)
        .map(|(mark, legs)| {
            mark.checked_sum(Balance::new(legs))
                .map_err(|_| overflow(position))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Sums {
        sums,
        checkpoint,
        through: point,
    })
}

/// A mark or run that disagrees with the legs: a bug or a hand edit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkMismatch {
    pub tenant: String,
    pub account: String,
    pub currency: String,
    /// Which row, and what it says against what the legs say.
    pub detail: String,
}

/// Legs per read while checking.
const VERIFY_PAGE_LEGS: i64 = 10_000;

/// Checks every mark and run against the legs, the journal's entries against the legs (each
/// account's count and sum of legs), and each account's legs against the log: their sum equals
/// the sum of the account's legs in the journal entries the log holds up to the projection's
/// checkpoint (a leg or an entry lost, doubled or edited is named). The checkpoint, the marks,
/// the runs and the pages of legs (memory: the marks and runs, not the legs) are read in one
/// [`Snapshot`], so batches committing meanwhile change none of them.
pub async fn verify_marks(
    db: &Database,
    store: &dyn EventStore,
) -> Result<Vec<MarkMismatch>, BalanceError> {
    let mut snapshot = Snapshot::begin(db).await?;
    let upto = snapshot
        .checkpoint(ENTRIES_NAME)
        .await?
        .unwrap_or(Cursor::START);
    let (mut found, totals) = check_once(&mut snapshot).await?;
    snapshot.end().await?;
    let (_, logged) = crate::recompute_all(store, Some(upto)).await?;
    found.extend(legs_against_log(totals, logged));
    Ok(found)
}

fn legs_against_log(
    totals: HashMap<Key, Run>,
    mut logged: std::collections::BTreeMap<crate::BalanceKey, Balance>,
) -> Vec<MarkMismatch> {
    let mut mismatches = Vec::new();
    for ((tenant, account, currency), run) in totals {
        let key = crate::BalanceKey {
            tenant,
            account,
            currency,
        };
        let log = logged.remove(&key).unwrap_or_default();
        if log != run.balance {
            mismatches.push(MarkMismatch {
                detail: format!(
                    "its {} legs sum to {}, the log's entries give it {log}",
                    run.legs, run.balance
                ),
                tenant: key.tenant,
                account: key.account,
                currency: key.currency,
            });
        }
    }
    for (key, log) in logged {
        if log != Balance::default() {
            mismatches.push(MarkMismatch {
                detail: format!("no legs, the log's entries give it {log}"),
                tenant: key.tenant,
                account: key.account,
                currency: key.currency,
            });
        }
    }
    mismatches
}

type Totals = HashMap<Key, Run>;

async fn check_once(snapshot: &mut Snapshot) -> Result<(Vec<MarkMismatch>, Totals), sqlx::Error> {
    type Leg = (String, String, String, i64, i64, i32, i64);
    type MarkRow = (String, String, String, i64, i64, i32, i64, String);
    type RunRow = (String, String, String, i64, String);
    let (marks, runs): (Vec<MarkRow>, Vec<RunRow>) = on_snapshot!(&mut *snapshot, conn => {
        let marks = sqlx::query_as(
            "SELECT tenant, account, currency, xact, position, leg, legs, \
             CAST(balance_minor AS TEXT) FROM balance_marks \
             ORDER BY tenant, account, currency, xact, position, leg",
        )
        .fetch_all(&mut *conn)
        .await?;
        let runs = sqlx::query_as(
            "SELECT tenant, account, currency, legs, CAST(balance_minor AS TEXT) FROM balance_runs",
        )
        .fetch_all(&mut *conn)
        .await?;
        (marks, runs)
    });
    let mut expected_marks: Vec<MarkRow> = Vec::new();
    let mut totals: HashMap<Key, Run> = HashMap::new();
    let mut after: Leg = (
        String::new(),
        String::new(),
        String::new(),
        i64::MIN,
        i64::MIN,
        i32::MIN,
        0,
    );
    loop {
        let page: Vec<Leg> = on_snapshot!(&mut *snapshot, conn => {
            sqlx::query_as(
                "SELECT tenant, account, currency, xact, position, leg, amount_minor \
                 FROM balance_legs \
                 WHERE (tenant, account, currency, xact, position, leg) > ($1, $2, $3, $4, $5, $6) \
                 ORDER BY tenant, account, currency, xact, position, leg LIMIT $7",
            )
            .bind(&after.0)
            .bind(&after.1)
            .bind(&after.2)
            .bind(after.3)
            .bind(after.4)
            .bind(after.5)
            .bind(VERIFY_PAGE_LEGS)
            .fetch_all(&mut *conn)
            .await?
        });
        let full = page.len() as i64 == VERIFY_PAGE_LEGS;
        for leg in page {
            let key = (leg.0.clone(), leg.1.clone(), leg.2.clone());
            let run = totals.entry(key.clone()).or_default();
            run.legs += 1;
            run.balance = run
                .balance
                .checked_add(Amount::new(leg.6))
                .map_err(|_| overflow(leg.4))?;
            if run.legs % MARK_LEGS == 0 {
                expected_marks.push((
                    key.0,
                    key.1,
                    key.2,
                    leg.3,
                    leg.4,
                    leg.5,
                    run.legs,
                    run.balance.to_string(),
                ));
            }
            after = leg;
        }
        if !full {
            break;
        }
    }
    let mismatch = |key: &Key, detail: String| MarkMismatch {
        tenant: key.0.clone(),
        account: key.1.clone(),
        currency: key.2.clone(),
        detail,
    };
    let mut mismatches = Vec::new();
    let stored: Vec<MarkRow> = marks
        .into_iter()
        .map(|m| {
            let balance = balance_of(&m.7).map_or(m.7, |b| b.to_string());
            (m.0, m.1, m.2, m.3, m.4, m.5, m.6, balance)
        })
        .collect();
    if stored != expected_marks {
        for row in stored.iter().filter(|m| !expected_marks.contains(m)) {
            let key = (row.0.clone(), row.1.clone(), row.2.clone());
            mismatches.push(mismatch(
                &key,
                format!("stored mark {row:?} is not the legs'"),
            ));
        }
        for row in expected_marks.iter().filter(|m| !stored.contains(m)) {
            let key = (row.0.clone(), row.1.clone(), row.2.clone());
            mismatches.push(mismatch(&key, format!("mark {row:?} is missing")));
        }
    }
    let mut stored_runs: HashMap<Key, Run> = HashMap::new();
    for (tenant, account, currency, legs, balance) in runs {
        stored_runs.insert(
            (tenant, account, currency),
            Run {
                legs,
                balance: balance_of(&balance)?,
            },
        );
    }
    for (key, total) in &totals {
        let stored = stored_runs.remove(key);
        if stored != Some(*total) {
            mismatches.push(mismatch(
                key,
                format!("run {stored:?}, the legs give {total:?}"),
            ));
        }
    }
    for (key, run) in stored_runs {
        mismatches.push(mismatch(
            &key,
            format!("run {run:?} of an account without legs"),
        ));
    }
    let mut journal = journal_totals(snapshot).await?;
    for (key, total) in &totals {
        let listed = journal.remove(key).unwrap_or_default();
        if listed != *total {
            mismatches.push(mismatch(
                key,
                format!("the journal's entries give {listed:?}, the legs {total:?}"),
            ));
        }
    }
    for (key, listed) in journal {
        mismatches.push(mismatch(
            &key,
            format!("the journal's entries give {listed:?} to an account without legs"),
        ));
    }
    Ok((mismatches, totals))
}

/// Each account's legs as the journal's entries (`journal_entries`, which the journal routes
/// read) list them: how many, and their sum. Read in pages by key.
async fn journal_totals(snapshot: &mut Snapshot) -> Result<Totals, sqlx::Error> {
    type Row = (String, String, sqlx::types::Json<Vec<crate::LegView>>);
    let mut totals = Totals::new();
    let mut after = (String::new(), String::new());
    loop {
        let page: Vec<Row> = on_snapshot!(&mut *snapshot, conn => {
            sqlx::query_as(
                "SELECT tenant, entry_id, legs FROM journal_entries \
                 WHERE (tenant, entry_id) > ($1, $2) ORDER BY tenant, entry_id LIMIT $3",
            )
            .bind(&after.0)
            .bind(&after.1)
            .bind(VERIFY_PAGE_LEGS)
            .fetch_all(&mut *conn)
            .await?
        });
        let full = page.len() as i64 == VERIFY_PAGE_LEGS;
        for (tenant, entry_id, legs) in page {
            for leg in legs.0 {
                let run = totals
                    .entry((tenant.clone(), leg.account, leg.currency))
                    .or_default();
                run.legs += 1;
                run.balance = run
                    .balance
                    .checked_add(Amount::new(leg.amount_minor))
                    .map_err(|_| {
                        sqlx::Error::Decode(
                            format!("the journal's legs overflow i128 at entry {entry_id}").into(),
                        )
                    })?;
            }
            after = (tenant, entry_id);
        }
        if !full {
            return Ok(totals);
        }
    }
}
