//! Reconciliation and proof through the real binary, on SQLite and PostgreSQL: a dashboard refund
//! found by `asiento reconcile` and posted once, payments converging through the sweeper alone
//! when every webhook is lost, and an amount mismatch left open for a person, moving no money,
//! each against the simulator, its Stripe dialect (as a `stripe` provider, where nothing can be
//! looked up by our key) and its Adyen dialect (as an `adyen` provider, where nothing can be
//! looked up at all and the sweep reads the daily Payment accounting report as its report user);
//! and `asiento verify` passing on a healthy database and
//! naming what a hand-made corruption broke.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use asiento_eventstore::Database;
use common::rig::{Psp, Rig};
use common::{asiento, payment_body, verify, without_provider_fees, Backend, Server, TestDatabase};
use serde_json::json;

/// A refund made in the provider's dashboard is found by the next sweep, posted once and listed as
/// an auto-resolved exception; the sweep again changes nothing.
async fn dashboard_refund_is_found_and_posted_once_at(backend: Backend, psp: Psp) {
    let database = TestDatabase::new(backend).await;
    let rig = Rig::start(&database, psp, &[]).await;
    let client = rig.client();
    rig.drop_every_webhook().await;
    let payment = client
        .post("/v1/payments", "p-1", &rig.payment(10_000, "pm_card_ok"))
        .await
        .json();
    let id = payment["id"].as_str().unwrap();
    let charge = rig.charge_of(id).await;
    rig.sim(
        &format!(
            "/charges/{}/refund_out_of_band",
            charge["id"].as_str().unwrap()
        ),
        json!({"amount_minor": 4_000}),
    )
    .await;

    rig.reconcile(&database.url).await;
    let after = client.get(&format!("/v1/payments/{id}")).await.json();
    assert_eq!(
        (after["status"].as_str(), after["refunded_minor"].as_i64()),
        (Some("partially_refunded"), Some(4_000))
    );
    let resolved = client.exceptions("resolved").await;
    let refunds: Vec<_> = resolved
        .iter()
        .filter(|e| e["kind"] == "refunded_out_of_band")
        .collect();
    assert_eq!(refunds.len(), 1, "{resolved:?}");
    assert_eq!(
        (
            refunds[0]["resolution"].as_str(),
            refunds[0]["payment_id"].as_str()
        ),
        (Some("auto"), Some(id))
    );
    let entries = client.entries_of(id).await.len();
    // The capture and the refund; at Stripe also Stripe's fee on the capture.
    let expected = if psp == Psp::Stripe { 3 } else { 2 };
    assert_eq!(entries, expected, "capture + refund");

    rig.reconcile(&database.url).await;
    assert_eq!(
        client.entries_of(id).await.len(),
        entries,
        "a second sweep posts nothing"
    );
    assert_eq!(client.exceptions("resolved").await.len(), resolved.len());
    assert!(client.exceptions("open").await.is_empty());
    verify(&database);
}

async fn dashboard_refund_is_found_and_posted_once(backend: Backend) {
    dashboard_refund_is_found_and_posted_once_at(backend, Psp::Sim).await;
}

async fn dashboard_refund_at_stripe_is_found_and_posted_once(backend: Backend) {
    dashboard_refund_is_found_and_posted_once_at(backend, Psp::Stripe).await;
}

async fn dashboard_refund_at_adyen_is_found_and_posted_once(backend: Backend) {
    dashboard_refund_is_found_and_posted_once_at(backend, Psp::Adyen).await;
}

/// With every webhook lost, mixed payments converge to the provider's truth through the
/// reconciler inside `serve` alone. At Stripe, without a lookup by our key, a payment whose
/// confirmation answer was lost is settled by the settlement report.
async fn payments_converge_through_the_sweeper_alone_at(backend: Backend, psp: Psp) {
    let database = TestDatabase::new(backend).await;
    let rig = Rig::start(
        &database,
        psp,
        &[
            "--psp-timeout",
            "300ms",
            "--pending-timeout",
            "1s",
            "--reconcile-interval",
            "1s",
            "--report-settle",
            "1s",
        ],
    )
    .await;
    let client = rig.client();
    rig.drop_every_webhook().await;
    let methods = [
        "pm_card_ok",
        "pm_card_declined",
        "pm_card_timeout",
        "pm_redirect",
    ];
    let mut ids = Vec::new();
    for index in 0..20 {
        let method = methods[index % methods.len()];
        let payment = client
            .post(
                "/v1/payments",
                &format!("p-{index}"),
                &rig.payment(1_000 + index as i64, method),
            )
            .await
            .json();
        let id = payment["id"].as_str().unwrap().to_owned();
        if method == "pm_redirect" {
            let charge = rig.charge_of(&id).await;
            rig.sim(
                &format!("/charges/{}/complete", charge["id"].as_str().unwrap()),
                json!({"result": "succeeded"}),
            )
            .await;
        }
        ids.push(id);
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    for id in &ids {
        loop {
            let charge = rig.charge_of(id).await;
            let want = match charge["status"].as_str().unwrap() {
                "succeeded" => "captured",
                "failed" => "failed",
                other => panic!("unexpected provider status {other}"),
            };
            let payment = client.get(&format!("/v1/payments/{id}")).await.json();
            if payment["status"] == want && payment["captured_minor"] == charge["amount_captured"] {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{id} never converged: {payment} vs {charge}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    verify(&database);
}

async fn payments_converge_through_the_sweeper_alone(backend: Backend) {
    payments_converge_through_the_sweeper_alone_at(backend, Psp::Sim).await;
}

async fn payments_at_stripe_converge_through_the_sweeper_alone(backend: Backend) {
    payments_converge_through_the_sweeper_alone_at(backend, Psp::Stripe).await;
}

async fn payments_at_adyen_converge_through_the_sweeper_alone(backend: Backend) {
    payments_converge_through_the_sweeper_alone_at(backend, Psp::Adyen).await;
}

/// An amount changed at the provider becomes an open manual exception and moves no money.
async fn amount_mismatch_is_left_open_for_a_person_at(backend: Backend, psp: Psp) {
    let database = TestDatabase::new(backend).await;
    let rig = Rig::start(&database, psp, &[]).await;
    let client = rig.client();
    rig.drop_every_webhook().await;
    let payment = client
        .post("/v1/payments", "m-1", &rig.payment(10_000, "pm_card_ok"))
        .await
        .json();
    let id = payment["id"].as_str().unwrap();
    let position = payment["position"].as_i64().unwrap();
    let balance_path = format!(
        "/v1/accounts/customer:42:available/balance?currency={}&min_position={position}",
        rig.currency()
    );
    let balance = || client.get(&balance_path);
    let before = balance().await.json()["balance_minor"].clone();
    rig.change_charge_amount(id, 12_000).await;

    rig.reconcile(&database.url).await;
    let open = client.exceptions("open").await;
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(
        (open[0]["kind"].as_str(), open[0]["resolution"].as_str()),
        (Some("amount_mismatch"), Some("manual"))
    );
    assert_eq!(
        balance().await.json()["balance_minor"],
        before,
        "no money moved"
    );
    assert_eq!(without_provider_fees(client.entries_of(id).await).len(), 1);

    let exception = open[0]["id"].as_str().unwrap();
    let path = format!("/v1/reconciliation/exceptions/{exception}/resolve");
    let beta = client.with_key("sk_test_beta_0123456789abcdef");
    assert_eq!(
        beta.post(&path, "x", &json!({"note": "not mine"}))
            .await
            .status,
        404
    );
    let resolved = client
        .post(
            &path,
            "x",
            &json!({"note": "amount confirmed with the provider"}),
        )
        .await;
    assert_eq!(
        resolved.status,
        200,
        "{}",
        String::from_utf8_lossy(&resolved.body)
    );
    assert!(client.exceptions("open").await.is_empty());
    // The merchant is told both: opened, then resolved with the note; the other tenant neither.
    let told =
        common::merchant_events_of(&client, "exception.opened,exception.resolved", exception, 2)
            .await;
    let seen: Vec<(&str, &str)> = told
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap(),
                e["data"]["object"]["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("exception.opened", "open"),
            ("exception.resolved", "resolved")
        ]
    );
    assert_eq!(
        told[1]["data"]["object"]["note"],
        "amount confirmed with the provider"
    );
    assert_eq!(told[0]["data"]["object"]["payment_id"], id);
    let beta_feed = beta.get("/v1/events?type=exception.opened").await;
    assert_eq!(beta_feed.json()["data"], json!([]));
}

async fn amount_mismatch_is_left_open_for_a_person(backend: Backend) {
    amount_mismatch_is_left_open_for_a_person_at(backend, Psp::Sim).await;
}

async fn amount_mismatch_at_stripe_is_left_open_for_a_person(backend: Backend) {
    amount_mismatch_is_left_open_for_a_person_at(backend, Psp::Stripe).await;
}

async fn amount_mismatch_at_adyen_is_left_open_for_a_person(backend: Backend) {
    amount_mismatch_is_left_open_for_a_person_at(backend, Psp::Adyen).await;
}

/// Runs one statement; the number of rows it changed.
async fn execute(database: &Database, sql: &str) -> u64 {
    match database {
        Database::Postgres(pool) => sqlx::query(sql)
            .execute(pool)
            .await
            .unwrap()
            .rows_affected(),
        Database::Sqlite(pool) => sqlx::query(sql)
            .execute(pool)
            .await
            .unwrap()
            .rows_affected(),
    }
}

async fn scalar(database: &Database, sql: &str) -> String {
    match database {
        Database::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
        Database::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
    }
}

/// `asiento verify` passes on a healthy database and fails naming the snapshot, then the stream,
/// that a hand-made corruption broke.
async fn verify_names_what_was_corrupted(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    let mut position = 0;
    for index in 0..3 {
        let payment = client
            .post(
                "/v1/payments",
                &format!("v-{index}"),
                &payment_body(5_000, "pm_card_ok"),
            )
            .await
            .json();
        position = payment["position"].as_i64().unwrap();
    }
    // Let the projector and the sealer catch up.
    client
        .get(&format!(
            "/v1/accounts/customer:42:available/balance?currency=USD&min_position={position}"
        ))
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, output) = asiento(&["verify", "--database-url", &database.url]);
        if ok && output.contains("; 0 not sealed") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "verify never passed on a healthy database: {output}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let db = Database::connect(&database.url).await.unwrap();

    // The projector writes the snapshot row on its own schedule: wait until there is one to corrupt.
    let corrupt = common::shift_balance_sql(backend, "customer:42:available", 7);
    while execute(&db, &corrupt).await == 0 {
        assert!(Instant::now() < deadline, "the snapshot row never appeared");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (ok, output) = asiento(&["verify", "--database-url", &database.url]);
    assert!(!ok, "a corrupted snapshot must fail verify: {output}");
    assert!(
        output.contains("customer:42:available"),
        "names the snapshot: {output}"
    );
    execute(
        &db,
        &common::shift_balance_sql(backend, "customer:42:available", -7),
    )
    .await;

    // An edited event payload, with the immutability trigger disabled by hand.
    let (disable, enable) = match backend {
        Backend::Postgres => (
            "ALTER TABLE events DISABLE TRIGGER USER",
            "ALTER TABLE events ENABLE TRIGGER USER",
        ),
        Backend::Sqlite => ("", ""),
    };
    let stream = scalar(
        &db,
        "SELECT stream_id FROM events WHERE event_type = 'PaymentIntended' ORDER BY position LIMIT 1",
    )
    .await;
    if backend == Backend::Postgres {
        execute(&db, disable).await;
        execute(&db, &format!("UPDATE events SET data = jsonb_set(data, '{{description}}', '\"edited\"') WHERE stream_id = '{stream}' AND version = 1")).await;
        execute(&db, enable).await;
    } else {
        // SQLite triggers cannot be disabled: drop the UPDATE guard, edit, put it back.
        const GUARD: &str = "FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'events' \
                             AND sql LIKE '%BEFORE UPDATE%'";
        let trigger = scalar(&db, &format!("SELECT sql {GUARD}")).await;
        let name = scalar(&db, &format!("SELECT name {GUARD}")).await;
        // On one connection: another pool connection could still hold the old schema.
        let Database::Sqlite(pool) = &db else {
            panic!("sqlite backend expected");
        };
        let mut connection = pool.acquire().await.unwrap();
        for statement in [
            format!("DROP TRIGGER {name}"),
            format!(
                "UPDATE events SET data = json_set(data, '$.description', 'edited') \
                 WHERE stream_id = '{stream}' AND version = 1"
            ),
            trigger,
        ] {
            sqlx::query(&statement)
                .execute(&mut *connection)
                .await
                .unwrap();
        }
    }
    let (ok, output) = asiento(&["verify", "--database-url", &database.url]);
    assert!(!ok, "an edited event must fail verify");
    assert!(
        output.contains(&stream),
        "names the stream {stream}: {output}"
    );
}

asiento_testkit::both_backends!(threads = 2;
    dashboard_refund_is_found_and_posted_once,
    dashboard_refund_at_stripe_is_found_and_posted_once,
    dashboard_refund_at_adyen_is_found_and_posted_once,
    payments_converge_through_the_sweeper_alone,
    payments_at_stripe_converge_through_the_sweeper_alone,
    payments_at_adyen_converge_through_the_sweeper_alone,
    amount_mismatch_is_left_open_for_a_person,
    amount_mismatch_at_stripe_is_left_open_for_a_person,
    amount_mismatch_at_adyen_is_left_open_for_a_person,
    verify_names_what_was_corrupted,
);
