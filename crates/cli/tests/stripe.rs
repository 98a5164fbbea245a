//! asiento with a Stripe provider (`--providers stripe=stripe:…`, its secrets from the
//! environment) against `asiento psp-sim --dialect stripe`, on both backends, `asiento verify`
//! holding after each:
//! - payments captured at once and by a later capture, a refund, a decline, a payment whose
//!   confirmation answer was lost settled by Stripe's signed webhook alone (read as a hint: the
//!   worker reads the PaymentIntent), and a dispute opened and lost, posted from its webhooks;
//!   Stripe's fee on each captured PaymentIntent posted once to `expense:provider_fees:stripe`;
//! - a refund whose answer was lost, sent again by the sweep under its key (one refund at
//!   Stripe), and a refund that fails after it succeeded, reversed;
//! - a kill -9 between Stripe's answer and our commit, resumed by the client's retry to one
//!   PaymentIntent, one capture posting and one fee posting.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::stripe::{
    payment_intents, sim_charges, sim_control, sim_faults, sim_truth, start_rig, stripe_payment,
};
use common::{payment, verify, wait_for, Backend, Client, TestDatabase};
use serde_json::{json, Value};

async fn payments_through_stripe(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    // The server does not call its provider before a payment, so the simulator can start after
    // it, on a port chosen now, knowing where to deliver.
    let rig = start_rig(
        &database,
        &["--psp-timeout", "500ms", "--reconcile-interval", "300ms"],
    );
    let client = rig.server.client();
    let sim_listen = rig.sim_listen.clone();

    let captured = client
        .post(
            "/v1/payments",
            "stripe-1",
            &stripe_payment(5_000, "pm_card_visa"),
        )
        .await;
    assert_eq!(
        captured.status,
        201,
        "{}",
        String::from_utf8_lossy(&captured.body)
    );
    let captured = captured.json();
    assert_eq!(captured["status"], "captured", "{captured}");
    assert_eq!(captured["provider"], "stripe", "{captured}");
    assert!(
        captured["provider_charge_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("pi_")),
        "the PaymentIntent is the charge: {captured}"
    );
    let id = captured["id"].as_str().unwrap().to_owned();

    let refund = client
        .post(
            &format!("/v1/payments/{id}/refunds"),
            "stripe-1-refund",
            &json!({"amount_minor": 2_000}),
        )
        .await;
    assert_eq!(
        refund.status,
        201,
        "{}",
        String::from_utf8_lossy(&refund.body)
    );
    let refunded = refund.json();
    assert_eq!(refunded["refunded_minor"], 2_000);
    // The operation names the request of Stripe's that answered it.
    let requests = &refunded["operations"][0]["provider_requests"];
    assert_eq!(requests.as_array().map(Vec::len), Some(1), "{refunded}");
    assert!(
        requests[0]["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("req_")),
        "{refunded}"
    );
    assert_eq!(requests[0]["replayed"], false);

    let mut manual = stripe_payment(3_000, "pm_card_mastercard");
    manual["capture"] = json!("manual");
    let authorized = client
        .post("/v1/payments", "stripe-2", &manual)
        .await
        .json();
    assert_eq!(authorized["status"], "authorized", "{authorized}");
    let manual_id = authorized["id"].as_str().unwrap().to_owned();
    let capture = client
        .post(
            &format!("/v1/payments/{manual_id}/capture"),
            "stripe-2-capture",
            &json!({}),
        )
        .await;
    assert_eq!(
        capture.status,
        200,
        "{}",
        String::from_utf8_lossy(&capture.body)
    );
    assert_eq!(capture.json()["status"], "captured");

    let declined = client
        .post(
            "/v1/payments",
            "stripe-3",
            &stripe_payment(700, "pm_card_chargeDeclined"),
        )
        .await
        .json();
    assert_eq!(declined["status"], "failed", "{declined}");

    // The confirmation charges, then its answer hangs past --psp-timeout: the payment is
    // pending until Stripe's webhook says what the PaymentIntent became.
    let lost = client
        .post(
            "/v1/payments",
            "stripe-4",
            &stripe_payment(900, "pm_card_timeout"),
        )
        .await;
    assert_eq!(lost.status, 202, "{}", String::from_utf8_lossy(&lost.body));
    let lost_id = lost.json()["id"].as_str().unwrap().to_owned();
    wait_for(&client, &lost_id, "the webhook never settled it", |p| {
        p["status"] == "captured"
    })
    .await;

    // One PaymentIntent per payment at Stripe, each with our payment id in its metadata.
    let intents = payment_intents(&client, &sim_listen).await;
    let mut ours: Vec<&str> = intents
        .iter()
        .map(|intent| intent["metadata"]["asiento_payment_id"].as_str().unwrap())
        .collect();
    ours.sort_unstable();
    let mut expected = vec![
        id.as_str(),
        manual_id.as_str(),
        declined["id"].as_str().unwrap(),
        lost_id.as_str(),
    ];
    expected.sort_unstable();
    assert_eq!(ours, expected);

    // A dispute opened and lost at Stripe reaches the ledger by its webhooks alone.
    let charge_id = sim_charges(&client, &sim_listen)
        .await
        .into_iter()
        .find(|charge| charge["reference"] == id.as_str())
        .and_then(|charge| charge["id"].as_str().map(str::to_owned))
        .unwrap();
    sim_control(
        &client,
        &sim_listen,
        &format!("/sim/charges/{charge_id}/dispute"),
        json!({}),
    )
    .await;
    wait_for(&client, &id, "the dispute never opened", |p| {
        p["status"] == "disputed"
    })
    .await;
    let before = client.entries_of(&id).await.len();
    sim_control(
        &client,
        &sim_listen,
        &format!("/sim/charges/{charge_id}/dispute/close"),
        json!({"outcome": "lost"}),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.entries_of(&id).await.len() == before {
        assert!(
            Instant::now() < deadline,
            "the lost dispute was never posted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(payment(&client, &id).await["status"], "disputed");

    // Stripe's fee on each captured PaymentIntent (2.9 % in the simulator), read from the
    // charge's balance transaction, is posted once: the clearing account comes up by it and
    // Stripe's expense account takes it. The disputed one also carries the dispute fee of its
    // withdrawal. The declined payment moved no money and has none.
    let mut fees = 0;
    for (paid, expected) in [
        (&id, vec![145, 1_500]),
        (&manual_id, vec![87]),
        (&lost_id, vec![26]),
    ] {
        let paid = wait_for(&client, paid, "Stripe's fees were never posted", |p| {
            p["provider_fees"]
                .as_array()
                .is_some_and(|fees| fees.len() == expected.len())
        })
        .await;
        let posted: Vec<i64> = paid["provider_fees"]
            .as_array()
            .unwrap()
            .iter()
            .map(|fee| {
                assert!(fee["transaction_id"]
                    .as_str()
                    .is_some_and(|txn| txn.starts_with("txn_")));
                fee["fee_minor"].as_i64().unwrap()
            })
            .collect();
        assert_eq!(posted, expected, "{paid}");
        fees += posted.iter().sum::<i64>();
    }
    let declined_now = payment(&client, declined["id"].as_str().unwrap()).await;
    assert_eq!(declined_now["provider_fees"], json!([]));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let balance = client
            .get("/v1/accounts/expense:provider_fees:stripe/balance?currency=USD")
            .await
            .json();
        if balance["balance_minor"] == -fees {
            break;
        }
        assert!(Instant::now() < deadline, "{balance}, expected -{fees}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Every event was verified and stored, none refused or dead-lettered.
    assert!(
        client
            .metric("asiento_webhooks_received_total{outcome=\"stored\"")
            .await
            >= 4.0
    );
    for refused in [
        "signature_invalid",
        "signature_stale",
        "invalid_body",
        "unknown_provider",
    ] {
        let line = format!("asiento_webhooks_received_total{{outcome=\"{refused}\"");
        assert_eq!(client.metric(&line).await, 0.0, "{refused}");
    }
    assert_eq!(
        client
            .metric("asiento_webhook_events_processed_total{outcome=\"dead\"")
            .await,
        0.0
    );
    verify(&database);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_through_stripe_sqlite() {
    payments_through_stripe(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_through_stripe_postgres() {
    payments_through_stripe(Backend::Postgres).await;
}

async fn sim_refunds(client: &Client, sim_listen: &str) -> Vec<Value> {
    sim_truth(client, sim_listen, "/sim/operations")
        .await
        .into_iter()
        .filter(|operation| operation["kind"] == "refund")
        .collect()
}

/// A refund whose answer was lost is sent again by the sweep under its key and is one refund at
/// Stripe; a refund that fails after it succeeded (Stripe's `refund.failed`) is reversed.
async fn refunds_through_stripe(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let rig = start_rig(
        &database,
        &[
            "--psp-timeout",
            "500ms",
            "--reconcile-interval",
            "300ms",
            "--operation-timeout",
            "0s",
        ],
    );
    let client = rig.server.client();
    let sim_listen = rig.sim_listen.clone();
    let captured = client
        .post(
            "/v1/payments",
            "refunds-1",
            &stripe_payment(5_000, "pm_card_visa"),
        )
        .await
        .json();
    assert_eq!(captured["status"], "captured", "{captured}");
    let id = captured["id"].as_str().unwrap().to_owned();

    // Stripe refunds, then its answer hangs past --psp-timeout.
    sim_faults(&client, &sim_listen, json!({"timeout_rate": 1.0})).await;
    let lost = client
        .post(
            &format!("/v1/payments/{id}/refunds"),
            "refunds-1-a",
            &json!({"amount_minor": 2_000}),
        )
        .await;
    assert_eq!(lost.status, 202, "{}", String::from_utf8_lossy(&lost.body));
    sim_faults(&client, &sim_listen, json!({"timeout_rate": 0.0})).await;
    let refunded = wait_for(&client, &id, "the lost refund never settled", |p| {
        p["refunded_minor"] == 2_000 && p["operations"][0]["state"] == "succeeded"
    })
    .await;
    assert_eq!(refunded["status"], "partially_refunded");
    assert_eq!(
        sim_refunds(&client, &sim_listen).await.len(),
        1,
        "one refund at Stripe"
    );
    // Its first answer was lost: an answer heard afterwards, to the sweep's re-send under the
    // same key, can only be Stripe's replay of it (the webhook may have settled it first).
    let requests = refunded["operations"][0]["provider_requests"]
        .as_array()
        .unwrap();
    assert!(
        requests.iter().all(|request| request["replayed"] == true),
        "{refunded}"
    );

    // The next refund succeeds, then fails at Stripe.
    sim_faults(
        &client,
        &sim_listen,
        json!({"refund_reversal_rate": 1.0, "refund_reversal_delay_ms": 300}),
    )
    .await;
    let second = client
        .post(
            &format!("/v1/payments/{id}/refunds"),
            "refunds-1-b",
            &json!({"amount_minor": 1_000}),
        )
        .await;
    assert_eq!(
        second.status,
        201,
        "{}",
        String::from_utf8_lossy(&second.body)
    );
    let reversed = wait_for(&client, &id, "the failed refund was never reversed", |p| {
        p["operations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|operation| operation["state"] == "reversed")
    })
    .await;
    assert_eq!(reversed["refunded_minor"], 2_000, "{reversed}");
    assert_eq!(sim_refunds(&client, &sim_listen).await.len(), 2);
    verify(&database);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_through_stripe_sqlite() {
    refunds_through_stripe(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_through_stripe_postgres() {
    refunds_through_stripe(Backend::Postgres).await;
}

/// The server is killed after Stripe confirmed and before we committed: after a restart, a retry
/// with the same key re-sends both steps under their keys and finishes the payment with one
/// PaymentIntent at Stripe, one capture posting and one posting of Stripe's fee.
async fn a_kill_between_stripe_s_answer_and_our_commit_resumes_once(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    // Events go to the first server, which will be dead: only the retry can finish the payment.
    let mut rig = start_rig(&database, &["--idempotency-lease", "1s"]);
    let client = rig.server.client();
    let sim_listen = rig.sim_listen.clone();
    let body = stripe_payment(4_000, "pm_card_slow");
    let in_flight = client.post_in_background("/v1/payments", "crash-stripe", &body);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if !sim_charges(&client, &sim_listen).await.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "Stripe never confirmed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rig.server.crash_and_restart();
    assert!(
        in_flight.await.unwrap().is_err(),
        "the killed server cannot have answered"
    );
    let client = rig.server.client();
    // The killed server's lease (1 s, renewed while Stripe is slow) runs out; until it does, the
    // key is in flight (409) and a client asks again, as this one does.
    let deadline = Instant::now() + Duration::from_secs(20);
    let resumed = loop {
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let resumed = client.post("/v1/payments", "crash-stripe", &body).await;
        if resumed.status != 409 || Instant::now() > deadline {
            break resumed;
        }
    };
    assert_eq!(
        resumed.status,
        201,
        "{}",
        String::from_utf8_lossy(&resumed.body)
    );
    let payment = resumed.json();
    assert_eq!(payment["status"], "captured");
    let seen = sim_charges(&client, &sim_listen).await;
    assert_eq!(seen.len(), 1, "one PaymentIntent confirmed: {seen:?}");
    // One capture posting and one posting of Stripe's fee on it, each once.
    let entries = client.entries_of(payment["id"].as_str().unwrap()).await;
    let touching = |account: &str| {
        entries
            .iter()
            .filter(|entry| {
                entry["legs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|leg| leg["account"] == account)
            })
            .count()
    };
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(touching("revenue:fees"), 1, "one capture: {entries:?}");
    assert_eq!(
        touching("expense:provider_fees:stripe"),
        1,
        "one fee of Stripe's: {entries:?}"
    );
    verify(&database);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_between_stripe_s_answer_and_our_commit_resumes_once_sqlite() {
    a_kill_between_stripe_s_answer_and_our_commit_resumes_once(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_between_stripe_s_answer_and_our_commit_resumes_once_postgres() {
    a_kill_between_stripe_s_answer_and_our_commit_resumes_once(Backend::Postgres).await;
}
