//! The group commit statement's connection (`EventStore::statement_connection`) plans a prepared
//! statement once: PostgreSQL would plan a statement over arrays anew for every execution, since
//! its plan for the arrays at hand always looks cheaper than the generic one.

// Everything in this file is test code; clippy.toml's unwrap allowance
// only reaches `#[test]` functions, not their helpers.
#![allow(clippy::unwrap_used)]

mod common;

use common::Harness;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_statement_connection_plans_a_statement_over_arrays_once() {
    let h = Harness::open(asiento_testkit::Backend::Postgres).await;
    let mut conn = h.store.statement_connection().await.unwrap().unwrap();
    // Batches of different sizes, more executions than PostgreSQL plans for each one by default
    // before it weighs the generic plan (five).
    for size in [1_i64, 7, 2, 30, 3, 1, 12, 4] {
        let sum: Option<i64> = sqlx::query_scalar(
            "SELECT sum(x)::int8 FROM unnest($1::int8[]) AS u(x) \
             WHERE x NOT IN (SELECT v FROM unnest($2::int8[]) AS w(v))",
        )
        .bind((1..=size).collect::<Vec<i64>>())
        .bind(vec![size])
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        assert_eq!(sum, Some(size * (size + 1) / 2 - size).filter(|_| size > 1));
    }
    let plans: (i64, i64) = sqlx::query_as(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements \
         WHERE statement LIKE 'SELECT sum(x)::int8 FROM unnest%'",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(plans, (8, 0), "(generic plans, custom plans)");
    conn.finished(&Ok::<(), sqlx::Error>(()), false);
    h.finish().await;
}
