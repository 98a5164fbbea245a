//! asiento with a Stripe provider (`--providers stripe=stripe:…`, its secrets from the
//! environment) against `asiento psp-sim --dialect stripe`, on both backends: payments captured at
//! once and by a later capture, a refund, a decline, and a payment whose confirmation answer was
//! lost settled by Stripe's signed webhook alone (read as a hint: the worker reads the
//! PaymentIntent), with `asiento verify` holding after.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{asiento, payment_body, Backend, Client, Process, Server, TestDatabase};
use serde_json::{json, Value};

const WEBHOOK_SECRET: &str = "whsec_stripe_test_0123456789";
const API_KEY: &str = "sk_test_asiento_stripe";

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The Stripe dialect on `listen`, delivering its events to the server at `server`.
fn start_stripe_sim(listen: &str, server: &str) -> Process {
    let webhook_url = format!("{server}/webhooks/stripe");
    let mut process = Process::spawn(
        &[
            "psp-sim",
            "--dialect",
            "stripe",
            "--listen",
            listen,
            "--seed",
            "5",
            "--fee-bps",
            "290",
            "--hang-ms",
            "1500",
            "--webhook-url",
            &webhook_url,
            "--webhook-secret",
            WEBHOOK_SECRET,
        ],
        &[],
    );
    process.wait_for_line("psp-sim listening on ");
    process
}

async fn payment(client: &Client, id: &str) -> Value {
    client.get(&format!("/v1/payments/{id}")).await.json()
}

async fn wait_for(client: &Client, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let current = payment(client, id).await;
        if done(&current) {
            return current;
        }
        assert!(Instant::now() < deadline, "{what}: payment is {current}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn verify(database: &TestDatabase) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, output) = asiento(&["verify", "--database-url", &database.url]);
        if ok {
            return;
        }
        assert!(Instant::now() < deadline, "verify: {output}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn stripe_payment(amount_minor: i64, method: &str) -> Value {
    let mut body = payment_body(amount_minor, method);
    body["provider"] = json!("stripe");
    body
}

async fn metric(client: &Client, line_start: &str) -> f64 {
    let text = client
        .http
        .get(format!("{}/metrics", client.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|line| line.starts_with(line_start))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn payments_through_stripe(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    // The server does not call its provider before a payment, so the simulator can start after
    // it, on a port chosen now, knowing where to deliver.
    let sim_listen = format!("127.0.0.1:{}", free_port());
    let providers = format!("stripe=stripe:http://{sim_listen}");
    let server = Server::start_with_env(
        &database.url,
        &[
            "--providers",
            &providers,
            "--psp-timeout",
            "500ms",
            "--reconcile-interval",
            "300ms",
        ],
        &[
            ("ASIENTO_PROVIDER_STRIPE_API_KEY", API_KEY),
            ("ASIENTO_PROVIDER_STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET),
        ],
    );
    let client = server.client();
    let _sim = start_stripe_sim(&sim_listen, &server.base);

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
    assert_eq!(refund.json()["refunded_minor"], 2_000);

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
    let intents: Value = client
        .http
        .get(format!("http://{sim_listen}/v1/payment_intents?limit=100"))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut ours: Vec<&str> = intents["data"]
        .as_array()
        .unwrap()
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

    // Every event was verified and stored, none refused or dead-lettered.
    assert!(
        metric(
            &client,
            "asiento_webhooks_received_total{outcome=\"stored\""
        )
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
        assert_eq!(metric(&client, &line).await, 0.0, "{refused}");
    }
    assert_eq!(
        metric(
            &client,
            "asiento_webhook_events_processed_total{outcome=\"dead\""
        )
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
