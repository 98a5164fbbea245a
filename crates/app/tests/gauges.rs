//! The gauges' counts against both backends: exceptions open by kind and resolution (resolved
//! ones not counted), keys in flight and those stuck past their lease (completed ones not
//! counted), pending provider operations by age band.
#![allow(clippy::unwrap_used)]

mod common;

use asiento_app::gauges::{count, Counts};
use asiento_eventstore::Database;
use common::{Backend, TestDatabase};

const NOW_MS: i64 = 1_764_000_000_000;

async fn execute(database: &Database, sql: &str) {
    match database {
        Database::Postgres(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
        Database::Sqlite(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
    }
    .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

fn exception(id: &str, kind: &str, resolution: &str, status: &str) -> String {
    format!(
        "insert into reconciliation_exceptions (id, tenant, payment_id, provider, charge_id, kind, \
         resolution, status, local, provider_state, difference, note, recorded_ms, resolved_ms, \
         version) values ('{id}', 'acme', null, 'sim', null, '{kind}', '{resolution}', \
         '{status}', '{{}}', '{{}}', '{{}}', null, 0, null, 1)"
    )
}

fn key(key: &str, state: &str, lease_expires_ms: i64, backend: Backend) -> String {
    let (hash, response) = match backend {
        Backend::Postgres => ("'\\x00'::bytea", "'\\x00'::bytea"),
        Backend::Sqlite => ("x'00'", "x'00'"),
    };
    let (status, body, completed) = if state == "completed" {
        ("200", response, "1")
    } else {
        ("null", "null", "null")
    };
    format!(
        "insert into idempotency_keys (tenant, method, route, key, body_sha256, resource_id, \
         state, lease_owner, lease_expires_ms, response_status, response_body, created_ms, \
         completed_ms) values ('acme', 'POST', '/v1/payments', '{key}', {hash}, 'pay_x', \
         '{state}', '00000000-0000-0000-0000-000000000001', {lease_expires_ms}, {status}, {body}, \
         0, {completed})"
    )
}

fn operation(sequence: i64, age_ms: i64) -> String {
    format!(
        "insert into reconciliation_operations (payment_id, kind, sequence, requested_ms, \
         next_check_ms) values ('pay_x', 'refund', {sequence}, {}, 0)",
        NOW_MS - age_ms
    )
}

async fn gauges_count_what_is_open_now(backend: Backend) {
    let test = TestDatabase::open(backend).await;
    let db = test.database();
    assert_eq!(count(db, NOW_MS).await.unwrap(), Counts::default());
    for statement in [
        exception("exc_1", "amount_mismatch", "manual", "open"),
        exception("exc_2", "amount_mismatch", "manual", "open"),
        exception("exc_3", "amount_mismatch", "manual", "resolved"),
        exception("exc_4", "refunded_out_of_band", "auto", "open"),
        key("fresh", "in_flight", NOW_MS + 30_000, backend),
        key("stuck", "in_flight", NOW_MS - 1, backend),
        key("done", "completed", NOW_MS - 1, backend),
        operation(1, 0),
        operation(2, 59_999),
        operation(3, 60_000),
        operation(4, 3_600_000),
        operation(5, 86_400_001),
    ] {
        execute(db, &statement).await;
    }
    let counts = count(db, NOW_MS).await.unwrap();
    assert_eq!(
        counts,
        Counts {
            exceptions_open: vec![
                ("amount_mismatch".to_owned(), "manual".to_owned(), 2),
                ("refunded_out_of_band".to_owned(), "auto".to_owned(), 1),
            ],
            keys_in_flight: 2,
            keys_stuck: 1,
            operations_by_age: [2, 1, 0, 1, 1],
        }
    );
    test.finish().await;
}

#[tokio::test]
async fn gauges_count_what_is_open_now_sqlite() {
    gauges_count_what_is_open_now(Backend::Sqlite).await;
}

#[tokio::test]
async fn gauges_count_what_is_open_now_postgres() {
    gauges_count_what_is_open_now(Backend::Postgres).await;
}
