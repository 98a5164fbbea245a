//! Provider operations through the real binary, on both backends: a refund or capture sent while
//! the provider is unreachable answers 202 and ends with exactly one provider operation and its
//! posting, with no client retry (against the in-process simulator and against the Stripe
//! dialect, which has no lookup by our key). With the in-process simulator: a refund the provider
//! refuses is a 422 that releases its amount; a refund that fails after it succeeded posts a
//! reversing entry; a lost dispute whose every webhook was dropped is posted by the sweep.
//! `asiento verify` holds after each.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::rig::{Psp, Rig};
use common::{
    payment_body, sim_list, verify, wait_for, Answer, Backend, Client, Server, TestDatabase,
};
use serde_json::{json, Value};

const SECRET: &str = "whsec_test_0123456789";

fn start(database: &TestDatabase) -> Server {
    start_with_report_settle(database, "0s")
}

/// `report_settle` set to an hour keeps the settlement report from seeing anything the test
/// does (its windows end before), so only what the test drives reaches the ledger.
fn start_with_report_settle(database: &TestDatabase, report_settle: &str) -> Server {
    Server::start(
        &database.url,
        &[
            "--webhook-secret",
            SECRET,
            "--reconcile-interval",
            "300ms",
            "--operation-timeout",
            "0s",
            "--report-settle",
            report_settle,
        ],
    )
}

async fn sim_post(client: &Client, path: &str, body: Value) -> Answer {
    client
        .send(
            client
                .http
                .post(format!("{}{path}", client.base))
                .json(&body),
        )
        .await
}

async fn faults(client: &Client, body: Value) {
    let answer = sim_post(client, "/sim/faults", body).await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
}

async fn charge_of(client: &Client, id: &str) -> Value {
    let charges = sim_list(client, "/sim/charges").await;
    charges
        .into_iter()
        .find(|charge| charge["reference"] == id)
        .unwrap()
}

async fn create(client: &Client, key: &str, body: &Value) -> String {
    let created = client.post("/v1/payments", key, body).await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    created.json()["id"].as_str().unwrap().to_owned()
}

/// Refunds `amount` of payment `id` (which succeeds at once), then has the provider fail that
/// refund: a reversal after success.
async fn refund_then_fail(client: &Client, id: &str, key: &str, amount: i64) {
    let refund = client
        .post(
            &format!("/v1/payments/{id}/refunds"),
            key,
            &json!({ "amount_minor": amount }),
        )
        .await;
    assert_eq!(
        refund.status,
        201,
        "{}",
        String::from_utf8_lossy(&refund.body)
    );
    let refund_id = refund.json()["operations"][0]["provider_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let failed = sim_post(
        client,
        &format!("/sim/operations/{refund_id}/fail"),
        json!({}),
    )
    .await;
    assert_eq!(
        failed.status,
        200,
        "{}",
        String::from_utf8_lossy(&failed.body)
    );
}

/// The refund entries among `entries`: money back to `psp:{provider}:clearing` (a provider's fee
/// also raises the clearing account, and is not one).
fn refund_entries(entries: &[Value], provider: &str) -> usize {
    let clearing = format!("psp:{provider}:clearing");
    entries
        .iter()
        .filter(|entry| {
            let legs = entry["legs"].as_array().unwrap();
            legs.iter()
                .any(|leg| leg["account"] == clearing && leg["amount_minor"].as_i64() > Some(0))
                && !legs.iter().any(|leg| {
                    leg["account"]
                        .as_str()
                        .is_some_and(|account| account.starts_with("expense:provider_fees:"))
                })
        })
        .count()
}

/// A refund and a capture sent while the provider is unreachable answer 202 and are finished by
/// the reconciler alone, with one operation each at the provider and one posting.
async fn unreachable_refund_and_capture_at(backend: Backend, psp: Psp) {
    let database = TestDatabase::new(backend).await;
    let mut extra = vec![
        "--reconcile-interval",
        "300ms",
        "--operation-timeout",
        "0s",
        "--report-settle",
        "0s",
    ];
    if psp == Psp::Sim {
        extra.extend(["--webhook-secret", SECRET]);
    }
    let rig = Rig::start(&database, psp, &extra);
    let client = rig.client();

    let refunded = create(&client, "op-refund", &rig.payment(5_000, "pm_card_ok")).await;
    let mut manual = rig.payment(3_000, "pm_card_ok");
    manual["capture"] = json!("manual");
    let captured = create(&client, "op-capture", &manual).await;

    // Long enough that both requests give up (four attempts, under a second each) inside it.
    rig.sim("/faults", json!({"unreachable_ms": 5_000})).await;
    let refund = client
        .post(
            &format!("/v1/payments/{refunded}/refunds"),
            "op-refund-1",
            &json!({"amount_minor": 5_000}),
        )
        .await;
    assert_eq!(
        refund.status,
        202,
        "{}",
        String::from_utf8_lossy(&refund.body)
    );
    assert_eq!(refund.json()["operations"][0]["state"], "requested");
    let capture = client
        .post(
            &format!("/v1/payments/{captured}/capture"),
            "op-capture-1",
            &json!({}),
        )
        .await;
    assert_eq!(
        capture.status,
        202,
        "{}",
        String::from_utf8_lossy(&capture.body)
    );

    // No client retry: the reconciler finishes both once the provider is back.
    let after = wait_for(&client, &refunded, "the refund never settled", |p| {
        p["status"] == "refunded"
    })
    .await;
    assert_eq!(after["refunded_minor"], 5_000);
    assert_eq!(after["operations"][0]["state"], "succeeded");
    wait_for(&client, &captured, "the capture never settled", |p| {
        p["status"] == "captured"
    })
    .await;
    assert_eq!(rig.operations_of(&refunded, "refund").await.len(), 1);
    assert_eq!(rig.operations_of(&captured, "capture").await.len(), 1);
    assert_eq!(
        refund_entries(&client.entries_of(&refunded).await, rig.provider()),
        1
    );
    // The replay answers what the first request answered.
    let replay = client
        .post(
            &format!("/v1/payments/{refunded}/refunds"),
            "op-refund-1",
            &json!({"amount_minor": 5_000}),
        )
        .await;
    assert_eq!(replay.status, 202);
    verify(&database);
}

async fn unreachable_refund_and_capture(backend: Backend) {
    unreachable_refund_and_capture_at(backend, Psp::Sim).await;
}

async fn unreachable_refund_and_capture_at_stripe(backend: Backend) {
    unreachable_refund_and_capture_at(backend, Psp::Stripe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_and_captures_sent_while_the_provider_is_unreachable_converge_sqlite() {
    unreachable_refund_and_capture(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_and_captures_sent_while_the_provider_is_unreachable_converge_postgres() {
    unreachable_refund_and_capture(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_and_captures_sent_while_stripe_is_unreachable_converge_sqlite() {
    unreachable_refund_and_capture_at_stripe(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_and_captures_sent_while_stripe_is_unreachable_converge_postgres() {
    unreachable_refund_and_capture_at_stripe(Backend::Postgres).await;
}

async fn refusal_reversal_and_lost_dispute(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    // The provider's dispute below must stay unknown to us (no webhook, no report) until the
    // refund meets it.
    let server = start_with_report_settle(&database, "1h");
    let client = server.client();

    // A refund the provider refuses (its charge is under a dispute we have not heard of) is a
    // 422 and releases its amount.
    let refused = create(&client, "refused", &payment_body(4_000, "pm_card_ok")).await;
    let charge = charge_of(&client, &refused).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    faults(&client, json!({"webhook_drop_rate": 1.0})).await;
    let opened = sim_post(
        &client,
        &format!("/sim/charges/{charge}/dispute"),
        json!({"amount_minor": 4_000}),
    )
    .await;
    assert_eq!(opened.status, 200);
    let answer = client
        .post(
            &format!("/v1/payments/{refused}/refunds"),
            "refused-1",
            &json!({"amount_minor": 4_000}),
        )
        .await;
    assert_eq!(
        answer.status,
        422,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(answer.code(), "refund_refused");
    let closed = sim_post(
        &client,
        &format!("/sim/charges/{charge}/dispute/close"),
        json!({"outcome": "won"}),
    )
    .await;
    assert_eq!(closed.status, 200);
    let again = client
        .post(
            &format!("/v1/payments/{refused}/refunds"),
            "refused-2",
            &json!({"amount_minor": 4_000}),
        )
        .await;
    assert_eq!(
        again.status,
        201,
        "{}",
        String::from_utf8_lossy(&again.body)
    );

    drop(server);
    let server = start(&database);
    let client = server.client();

    // A refund that fails after it succeeded is reversed by its own entry.
    faults(&client, json!({"webhook_drop_rate": 0.0})).await;
    let reversed = create(&client, "reversed", &payment_body(6_000, "pm_card_ok")).await;
    refund_then_fail(&client, &reversed, "reversed-1", 2_500).await;
    let after = wait_for(&client, &reversed, "the reversal never arrived", |p| {
        p["operations"][0]["state"] == "reversed"
    })
    .await;
    assert_eq!(after["status"], "captured");
    assert_eq!(after["refunded_minor"], 0);
    let entries = client.entries_of(&reversed).await;
    assert_eq!(entries.len(), 3, "capture, refund, reversal: {entries:?}");

    // A lost dispute whose every webhook is dropped is posted by the sweep (the report).
    faults(&client, json!({"webhook_drop_rate": 1.0})).await;
    let disputed = create(&client, "disputed", &payment_body(7_000, "pm_card_ok")).await;
    let charge = charge_of(&client, &disputed).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let opened = sim_post(
        &client,
        &format!("/sim/charges/{charge}/dispute"),
        json!({"amount_minor": 7_000}),
    )
    .await;
    assert_eq!(opened.status, 200);
    let closed = sim_post(
        &client,
        &format!("/sim/charges/{charge}/dispute/close"),
        json!({"outcome": "lost"}),
    )
    .await;
    assert_eq!(closed.status, 200);
    wait_for(
        &client,
        &disputed,
        "the lost dispute was never posted",
        |p| p["status"] == "disputed",
    )
    .await;
    // The capture, the provider's withdrawal as the dispute opened (clearing +7000, disputed
    // −7000), and the loss: the withdrawn money was the customer's (disputed +7000, customer
    // −7000).
    let deadline = Instant::now() + Duration::from_secs(30);
    let entries = loop {
        let entries = client.entries_of(&disputed).await;
        if entries.len() == 3 {
            break entries;
        }
        assert!(Instant::now() < deadline, "no dispute entries: {entries:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let moved = |account: &str| -> i64 {
        entries
            .iter()
            .skip(1)
            .flat_map(|entry| entry["legs"].as_array().unwrap())
            .filter(|leg| leg["account"] == account)
            .map(|leg| leg["amount_minor"].as_i64().unwrap())
            .sum()
    };
    assert_eq!(
        (
            moved("psp:sim:clearing"),
            moved("psp:sim:disputed"),
            moved("customer:42:available")
        ),
        (7_000, 0, -7_000),
        "{entries:?}"
    );

    // A reversal whose webhook is lost (webhooks are still dropped) is found when the report
    // shows less refunded than we do: the refund is read again and reversed.
    let dark = create(&client, "reversed-dark", &payment_body(5_000, "pm_card_ok")).await;
    refund_then_fail(&client, &dark, "reversed-dark-1", 2_000).await;
    let after = wait_for(&client, &dark, "the lost reversal was never posted", |p| {
        p["operations"][0]["state"] == "reversed"
    })
    .await;
    assert_eq!(after["refunded_minor"], 0);
    assert_eq!(after["needs_review"], false, "{after}");
    verify(&database);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_release_reversals_reverse_and_lost_disputes_are_posted_sqlite() {
    refusal_reversal_and_lost_dispute(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_release_reversals_reverse_and_lost_disputes_are_posted_postgres() {
    refusal_reversal_and_lost_dispute(Backend::Postgres).await;
}
