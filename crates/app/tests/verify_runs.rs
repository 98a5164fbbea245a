//! The checker's runs, stored, on both backends: `last_run` reads back exactly what the newest
//! completed run found (every listed violation and the omitted counts), serve's scheduled runs
//! store theirs too, only the newest 100 are kept, and a run that could not run stores nothing.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use asiento_app::clock::{Clock, ManualClock};
use asiento_app::invariants::{
    last_run, record, Check, Checker, ExtraCheck, ExtraFuture, InvariantError, Report,
    RunViolation, VerifyRun, Violation, RUNS_KEPT_MAX, VIOLATIONS_PER_CHECK_MAX,
};
use asiento_eventstore::Database;

mod common;

use common::{Backend, TestDatabase};

const STARTED_MS: i64 = 1_764_000_000_000;

/// A read-model check that finds what the test tells it to: `count` snapshot violations, or
/// that it cannot run.
struct Finds {
    count: usize,
    fails: bool,
}

impl ExtraCheck for Finds {
    fn check(&self) -> Check {
        Check::Snapshot
    }

    fn violations<'a>(&'a self, _database: &'a Database) -> ExtraFuture<'a> {
        Box::pin(async move {
            if self.fails {
                return Err("the read model is not installed".to_owned());
            }
            Ok((0..self.count)
                .map(|i| Violation {
                    check: Check::Snapshot,
                    subject: format!("acme:customer:{i}:EUR"),
                    detail: format!("snapshot says {i}, the entries say 0 \"quoted\" é"),
                })
                .collect())
        })
    }
}

fn checker(database: &Database, clock: Arc<dyn Clock>, count: usize, fails: bool) -> Checker {
    Checker::new(database.clone(), clock).with(Arc::new(Finds { count, fails }))
}

async fn rows(database: &Database) -> (i64, i64, i64) {
    let sql = "select count(*), coalesce(min(id), 0), coalesce(max(id), 0) from verify_runs";
    match database {
        Database::Postgres(pool) => sqlx::query_as(sql).fetch_one(pool).await.unwrap(),
        Database::Sqlite(pool) => sqlx::query_as(sql).fetch_one(pool).await.unwrap(),
    }
}

async fn exec(database: &Database, sql: &str) {
    match database {
        Database::Postgres(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
        Database::Sqlite(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
    }
    .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// What `last_run` must say of a run that returned `report` between the two times.
fn expected(id: i64, report: &Report, started_ms: i64, finished_ms: i64) -> VerifyRun {
    VerifyRun {
        id,
        started_ms,
        finished_ms,
        events_checked: report.events_checked,
        streams_checked: report.streams_checked,
        unsealed: report.unsealed,
        ok: report.violations.is_empty() && report.omitted.is_empty(),
        violations: report
            .violations
            .iter()
            .map(|v| RunViolation {
                check: v.check.as_str().to_owned(),
                subject: v.subject.clone(),
                detail: v.detail.clone(),
            })
            .collect(),
        omitted: report
            .omitted
            .iter()
            .map(|(check, count)| (check.as_str().to_owned(), *count))
            .collect(),
    }
}

async fn the_last_run_reads_back_what_it_found(backend: Backend) {
    let db = TestDatabase::open(backend).await;
    let database = db.database();
    let clock = Arc::new(ManualClock::at_ms(STARTED_MS));
    assert_eq!(last_run(database).await.unwrap(), None);

    // A clean run.
    let clean = checker(database, clock.clone(), 0, false)
        .check_and_record()
        .await
        .unwrap();
    assert!(clean.is_ok());
    let run = last_run(database).await.unwrap().unwrap();
    assert_eq!(run, expected(run.id, &clean, STARTED_MS, STARTED_MS));
    assert!(run.ok && run.violations.is_empty() && run.omitted.is_empty());

    // A run with more violations of one check than are listed.
    clock.advance_ms(60_000);
    let extra = 3;
    let found = checker(
        database,
        clock.clone(),
        VIOLATIONS_PER_CHECK_MAX + extra,
        false,
    )
    .check_and_record()
    .await
    .unwrap();
    let newest = last_run(database).await.unwrap().unwrap();
    assert!(newest.id > run.id);
    let at = STARTED_MS + 60_000;
    assert_eq!(newest, expected(newest.id, &found, at, at));
    assert!(!newest.ok);
    assert_eq!(newest.violations.len(), VIOLATIONS_PER_CHECK_MAX);
    assert_eq!(newest.omitted.get("snapshot"), Some(&extra));
    assert_eq!(newest.violations[7].check, "snapshot");
    assert_eq!(newest.violations[7].subject, "acme:customer:7:EUR");
    assert_eq!(
        newest.violations[7].detail,
        "snapshot says 7, the entries say 0 \"quoted\" é"
    );

    // A run whose checks could not run stores nothing.
    clock.advance_ms(60_000);
    let failed = checker(database, clock.clone(), 0, true)
        .check_and_record()
        .await;
    assert!(
        matches!(failed, Err(InvariantError::Extra { .. })),
        "{failed:?}"
    );
    assert_eq!(last_run(database).await.unwrap(), Some(newest.clone()));
    assert_eq!(rows(database).await.0, 2);

    // A hand-edited row is an error, not a wrong answer.
    exec(
        database,
        &format!(
            "update verify_runs set violations = 'not json' where id = {}",
            newest.id
        ),
    )
    .await;
    let corrupt = last_run(database).await;
    assert!(
        matches!(corrupt, Err(InvariantError::CorruptRun { id, .. }) if id == newest.id),
        "{corrupt:?}"
    );
    db.finish().await;
}

async fn only_the_newest_runs_are_kept(backend: Backend) {
    let db = TestDatabase::open(backend).await;
    let database = db.database();
    let report = Report::default();
    let mut ids = Vec::new();
    let runs = 105;
    for i in 0..runs {
        ids.push(
            record(database, &report, STARTED_MS + i, STARTED_MS + i + 1)
                .await
                .unwrap(),
        );
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    let kept = usize::try_from(RUNS_KEPT_MAX).unwrap();
    let newest_kept = &ids[ids.len() - kept..];
    assert_eq!(
        rows(database).await,
        (RUNS_KEPT_MAX, newest_kept[0], *ids.last().unwrap())
    );
    let run = last_run(database).await.unwrap().unwrap();
    assert_eq!(run.id, *ids.last().unwrap());
    assert_eq!(
        (run.started_ms, run.finished_ms),
        (STARTED_MS + runs - 1, STARTED_MS + runs)
    );
    db.finish().await;
}

async fn scheduled_runs_are_stored(backend: Backend) {
    let db = TestDatabase::open(backend).await;
    let database = db.database().clone();
    let clock = Arc::new(ManualClock::at_ms(STARTED_MS));
    let scheduled = checker(&database, clock, 2, false);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        scheduled
            .run(Duration::from_millis(10), async move {
                let _ = stopped.await;
            })
            .await;
    });
    let started = Instant::now();
    while rows(&database).await.0 < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the scheduled checker stored no runs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    running.await.unwrap();
    let run = last_run(&database).await.unwrap().unwrap();
    assert!(!run.ok);
    assert_eq!(run.violations.len(), 2);
    assert_eq!(run.started_ms, STARTED_MS);
    db.finish().await;
}

#[tokio::test]
async fn the_last_run_reads_back_what_it_found_sqlite() {
    the_last_run_reads_back_what_it_found(Backend::Sqlite).await;
}

#[tokio::test]
async fn the_last_run_reads_back_what_it_found_postgres() {
    the_last_run_reads_back_what_it_found(Backend::Postgres).await;
}

#[tokio::test]
async fn only_the_newest_runs_are_kept_sqlite() {
    only_the_newest_runs_are_kept(Backend::Sqlite).await;
}

#[tokio::test]
async fn only_the_newest_runs_are_kept_postgres() {
    only_the_newest_runs_are_kept(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_runs_are_stored_sqlite() {
    scheduled_runs_are_stored(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_runs_are_stored_postgres() {
    scheduled_runs_are_stored(Backend::Postgres).await;
}
