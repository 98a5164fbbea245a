//! The writer judged batch by batch against a sequential model, on both backends.
//!
//! Each batch is generated against the log as it stands (`generate`), handed to the writer as
//! concurrent requests hand their steps (all queued before the writer runs, so one batch), and
//! every outcome is checked against the model of the same steps applied one at a time, in batch
//! order, to the log as it stood (`model`, `check`): a step is written only if the model writes
//! it; a rebased fact's guard events are what the model decides from the state the written steps
//! leave; the log, the keys and the inbox are the model's after every batch; and every balance a
//! guard records is the sum of the changes written before it; and every guard state the writer
//! remembers (what the flows decide on) is one the log held.
//!
//! `ASIENTO_WRITE_MODEL_BATCHES` sets the number of batches per backend (10,000 by default;
//! `scripts/chaos` runs many more), `ASIENTO_WRITE_MODEL_SEED` the seed (a failure prints it).
#![allow(clippy::unwrap_used)]

mod check;
#[path = "../common/mod.rs"]
mod common;
mod generate;
mod model;
mod step;

use asiento_app::commit::Writer;
use asiento_domain::guard::GuardEvent;
use common::{Backend, TestDatabase};

/// Batches on one case's streams and keys before the next case starts afresh (streams stay
/// short, so reading them back after every batch stays cheap).
const BATCHES_PER_CASE: u64 = 25;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|value| {
            value
                .parse()
                .unwrap_or_else(|_| panic!("{name}: not a number"))
        })
        .unwrap_or(default)
}

async fn batches_equal_their_steps_one_at_a_time(backend: Backend) {
    let batches = setting("ASIENTO_WRITE_MODEL_BATCHES", 10_000);
    let seed = setting("ASIENTO_WRITE_MODEL_SEED", 47);
    eprintln!("write model on {backend:?}: {batches} batches, seed {seed}");
    let db = TestDatabase::open(backend).await;
    let database = without_commit_flush(&db).await;
    let store = database.event_store();
    let writer = Writer::new(store.clone());
    let mut generator = generate::Generator::new(seed);
    let mut tally = check::Tally::default();
    let mut steps_total = 0;
    let mut remembered = 0;
    for n_case in 0..batches.div_ceil(BATCHES_PER_CASE) {
        let pool = generate::Pool::new(n_case);
        let case = check::Case {
            database: &database,
            store: &store,
            prefix: pool.prefix(),
        };
        let mut model = model::Model::default();
        for n in 0..BATCHES_PER_CASE.min(batches - n_case * BATCHES_PER_CASE) {
            let steps = generator.batch(&pool, &model);
            steps_total += steps.len();
            // On one thread every step is queued before the writer runs: one batch.
            let outcomes =
                futures::future::join_all(steps.iter().map(|step| writer.commit(step.step())))
                    .await;
            let context = format!("seed {seed}, case {n_case}, batch {n}");
            check::batch(&case, &mut model, &steps, outcomes, &mut tally, &context).await;
            remembered += assert_memory_held_by_log(&writer, &pool, &model, &context);
        }
        for key in pool.guards() {
            assert_balances_add_up(&store, &key.stream()).await;
        }
    }
    eprintln!(
        "write model on {backend:?}: {steps_total} steps, {tally:?}, {remembered} guard states remembered"
    );
    // A run that exercised nothing proves nothing.
    for (what, count) in [
        ("written", tally.written),
        ("rebased", tally.rebased),
        ("not fresh", tally.not_fresh),
        ("conflict", tally.conflict),
        ("lease lost", tally.lease_lost),
        ("remembered", remembered),
    ] {
        assert!(
            count > 0 || batches < 1_000,
            "no step was {what}: {tally:?}"
        );
    }
    drop(writer);
    if let asiento_eventstore::Database::Postgres(pool) = &database {
        pool.close().await;
    }
    db.finish().await;
}

/// The test's database, on PostgreSQL with connections that do not wait for each commit's flush
/// (`synchronous_commit = off`: what a commit makes visible and what it refuses are the same;
/// only a server crash could lose the last commits, and this test crashes nothing). Ten thousand
/// batches, many of them written step by step, would otherwise spend most of their time waiting
/// for the disk.
async fn without_commit_flush(db: &TestDatabase) -> asiento_eventstore::Database {
    if db.backend != Backend::Postgres {
        return db.database().clone();
    }
    let url = &db.url;
    if let asiento_eventstore::Database::Postgres(pool) = db.database() {
        sqlx::query(
            "do $$ begin execute format('alter database %I set synchronous_commit = off', \
             current_database()); end $$",
        )
        .execute(pool)
        .await
        .unwrap();
    }
    asiento_eventstore::Database::connect(url).await.unwrap()
}

/// The writer's guard memory, which the flows decide on, holds only states the log held: each
/// state it remembers is the model's state of that guard at that version. How many it remembers.
fn assert_memory_held_by_log(
    writer: &Writer,
    pool: &generate::Pool,
    model: &model::Model,
    context: &str,
) -> u64 {
    let mut remembered = 0;
    for key in pool.guards() {
        let Some(state) = writer.guards().remembered(key) else {
            continue;
        };
        let stream = key.stream();
        assert!(
            state.version <= model.version(&stream),
            "{context}: {stream} remembered at {}, beyond the log's {}",
            state.version,
            model.version(&stream)
        );
        assert_eq!(
            state,
            model.guard_at(&stream, state.version),
            "{context}: {stream} remembered in a state the log never held"
        );
        remembered += 1;
    }
    remembered
}

/// Every balance the guard records is the sum of the changes written up to it.
async fn assert_balances_add_up(store: &asiento_app::log::Store, stream: &str) {
    let events = store.read_stream(stream, 0, 10_000).await.unwrap();
    let mut balance = 0;
    for event in &events {
        if let GuardEvent::BalanceChanged(change) =
            GuardEvent::decode_raw(&event.event_type, event.schema, event.data.raw()).unwrap()
        {
            balance += change.delta_minor.minor();
            assert_eq!(
                change.balance_minor.minor(),
                balance,
                "{stream} at {}",
                event.version
            );
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn batches_equal_their_steps_one_at_a_time_sqlite() {
    batches_equal_their_steps_one_at_a_time(Backend::Sqlite).await;
}

#[tokio::test(flavor = "current_thread")]
async fn batches_equal_their_steps_one_at_a_time_postgres() {
    batches_equal_their_steps_one_at_a_time(Backend::Postgres).await;
}
