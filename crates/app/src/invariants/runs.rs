//! The checker's completed runs, stored (`verify_runs`, migration 0070): what the last check
//! found, for someone who was not watching the logs when it ran (the console's health page).
//!
//! Every completed run inserts one row, serve's scheduled ones and `asiento verify` alike; a run
//! whose checks could not run stores nothing (it found nothing). The insert deletes all but the
//! newest [`RUNS_KEPT_MAX`] rows in its own transaction, so the table never grows. The newest
//! row is the one with the highest id: the database numbers rows in the order they are written,
//! whatever the clocks of the processes that ran the checks say.

use std::collections::BTreeMap;

use asiento_eventstore::{Database, Tx};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{InvariantError, Report};

/// Rows kept; older ones are deleted by the insert that makes them older.
pub const RUNS_KEPT_MAX: i64 = 100;

/// One violation as a run stored it: the check by its name (`Check::as_str`), so that a run
/// stored by other code reads back whatever checks this code knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunViolation {
    pub check: String,
    pub subject: String,
    pub detail: String,
}

/// One completed run of every check, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyRun {
    pub id: i64,
    /// When the run began and ended, Unix milliseconds on the clock of the process that ran it.
    pub started_ms: i64,
    pub finished_ms: i64,
    pub events_checked: u64,
    pub streams_checked: u64,
    /// Events after the sealer's cursor at the time: not covered by the hash chain yet.
    pub unsealed: u64,
    /// No violation at all, listed or omitted.
    pub ok: bool,
    /// Every violation the run listed (at most `VIOLATIONS_PER_CHECK_MAX` per check).
    pub violations: Vec<RunViolation>,
    /// Per check name, the violations beyond those listed.
    pub omitted: BTreeMap<String, usize>,
}

/// The `violations` column: JSON text, `{"violations": [{check, subject, detail} …],
/// "omitted": {check: count …}}`.
#[derive(Debug, Deserialize)]
struct Findings {
    violations: Vec<RunViolation>,
    omitted: BTreeMap<String, usize>,
}

fn stored_count(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// Stores a completed run (see the module docs); returns its id.
pub async fn record(
    database: &Database,
    report: &Report,
    started_ms: i64,
    finished_ms: i64,
) -> Result<i64, InvariantError> {
    let violations: Vec<RunViolation> = report
        .violations
        .iter()
        .map(|v| RunViolation {
            check: v.check.as_str().to_owned(),
            subject: v.subject.clone(),
            detail: v.detail.clone(),
        })
        .collect();
    let omitted: BTreeMap<&str, usize> = report
        .omitted
        .iter()
        .map(|(check, count)| (check.as_str(), *count))
        .collect();
    let findings = json!({"violations": violations, "omitted": omitted}).to_string();
    let ok = report.violations.is_empty() && report.omitted.is_empty();
    let insert = "insert into verify_runs (started_ms, finished_ms, events_checked, \
                  streams_checked, unsealed, ok, violations) \
                  values ($1, $2, $3, $4, $5, $6, $7) returning id";
    // The 101st newest and everything older; none while fewer are kept.
    let prune = "delete from verify_runs where id <= \
                 (select id from verify_runs order by id desc limit 1 offset $1)";
    let mut tx = database.begin().await?;
    macro_rules! write_run {
        ($conn:expr) => {{
            let id: i64 = sqlx::query_scalar(insert)
                .bind(started_ms)
                .bind(finished_ms)
                .bind(stored_count(report.events_checked))
                .bind(stored_count(report.streams_checked))
                .bind(stored_count(report.unsealed))
                .bind(ok)
                .bind(&findings)
                .fetch_one(&mut *$conn)
                .await?;
            sqlx::query(prune)
                .bind(RUNS_KEPT_MAX)
                .execute(&mut *$conn)
                .await?;
            id
        }};
    }
    let id = match &mut tx {
        Tx::Postgres(t) => write_run!(&mut **t),
        Tx::Sqlite(t) => write_run!(&mut **t),
    };
    tx.commit().await?;
    Ok(id)
}

/// A row as stored.
type Row = (i64, i64, i64, i64, i64, i64, bool, String);

/// The newest stored run; None if no run completed on this database yet.
pub async fn last_run(database: &Database) -> Result<Option<VerifyRun>, InvariantError> {
    let select = "select id, started_ms, finished_ms, events_checked, streams_checked, unsealed, \
                  ok, violations from verify_runs order by id desc limit 1";
    let row: Option<Row> = match database {
        Database::Postgres(pool) => sqlx::query_as(select).fetch_optional(pool).await?,
        Database::Sqlite(pool) => sqlx::query_as(select).fetch_optional(pool).await?,
    };
    row.map(decode).transpose()
}

fn decode(row: Row) -> Result<VerifyRun, InvariantError> {
    let (id, started_ms, finished_ms, events, streams, unsealed, ok, findings) = row;
    let corrupt = |reason: String| InvariantError::CorruptRun { id, reason };
    let count = |name: &str, value: i64| {
        u64::try_from(value).map_err(|_| corrupt(format!("{name} is negative: {value}")))
    };
    let Findings {
        violations,
        omitted,
    } = serde_json::from_str(&findings).map_err(|e| corrupt(format!("violations: {e}")))?;
    Ok(VerifyRun {
        id,
        started_ms,
        finished_ms,
        events_checked: count("events_checked", events)?,
        streams_checked: count("streams_checked", streams)?,
        unsealed: count("unsealed", unsealed)?,
        ok,
        violations,
        omitted,
    })
}
