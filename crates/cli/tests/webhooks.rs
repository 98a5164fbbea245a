//! Webhooks through the real binary: the simulator delivers its signed events with duplicates and
//! reordering switched on, in its own protocol, in Stripe's (as a `stripe` provider, where each
//! event is a hint the worker reads the object for) and in Adyen's (as an `adyen` provider: batches
//! under basic auth, each item signed on its own), and every payment converges to the provider's
//! truth with nothing posted twice; the endpoint refuses what is not signed right and stores
//! nothing then, under `Psp-Signature` and under `Stripe-Signature` (where a secret rotation's
//! two `v1` values are accepted).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::rig::{Psp, Rig};
use common::stripe::WEBHOOK_SECRET;
use common::{
    expected_status, payment_body, verify, without_provider_fees, Backend, Client, Server,
    TestDatabase,
};
use serde_json::{json, Value};

const SECRET: &str = "whsec_test_0123456789";

/// The provider's charges, by our payment id (their `reference`).
async fn provider_truth(rig: &Rig) -> BTreeMap<String, Value> {
    rig.charges()
        .await
        .into_iter()
        .filter_map(|charge| Some((charge["reference"].as_str()?.to_owned(), charge)))
        .collect()
}

async fn converged(client: &Client, truth: &BTreeMap<String, Value>) -> Result<(), String> {
    for (payment_id, charge) in truth {
        let payment = client
            .get(&format!("/v1/payments/{payment_id}"))
            .await
            .json();
        let want = (
            expected_status(charge),
            charge["amount_captured"].as_i64().unwrap(),
            charge["amount_refunded"].as_i64().unwrap(),
        );
        let have = (
            payment["status"].as_str().unwrap_or_default(),
            payment["captured_minor"].as_i64().unwrap_or_default(),
            payment["refunded_minor"].as_i64().unwrap_or_default(),
        );
        if want != have {
            return Err(format!(
                "{payment_id}: provider says {want:?}, we say {have:?}"
            ));
        }
        // A refund Adyen received and has not decided yet agrees with both sides for now.
        let open = payment["operations"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|op| op["state"] == "pending" || op["state"] == "requested");
        if open {
            return Err(format!(
                "{payment_id}: an operation is still open: {payment}"
            ));
        }
    }
    Ok(())
}

/// Mixed payments (ok, declined, redirect completed either way, refunded in parts) settle with the
/// simulator duplicating half its webhooks and reordering them.
async fn payments_converge_under_duplicated_and_reordered_webhooks_at(backend: Backend, psp: Psp) {
    let database = TestDatabase::new(backend).await;
    let extra: &[&str] = match psp {
        Psp::Sim => &["--webhook-secret", SECRET],
        Psp::Stripe | Psp::Adyen => &[],
    };
    let rig = Rig::start(&database, psp, extra).await;
    let client = rig.client();
    rig.sim(
        "/faults",
        json!({"webhook_duplicate_rate": 0.5, "webhook_reorder": true}),
    )
    .await;

    let methods = [
        "pm_card_ok",
        "pm_card_declined",
        "pm_redirect",
        "pm_card_ok",
    ];
    for index in 0..40 {
        let method = methods[index % methods.len()];
        let mut body = rig.payment(1_000 + index as i64 * 10, method);
        body["customer"] = json!(format!("c{}", index % 5));
        let created = client
            .post("/v1/payments", &format!("p-{index}"), &body)
            .await;
        assert_eq!(
            created.status,
            201,
            "{}",
            String::from_utf8_lossy(&created.body)
        );
        let payment = created.json();
        let id = payment["id"].as_str().unwrap().to_owned();
        if method == "pm_redirect" {
            let charge = rig.charge_of(&id).await;
            let result = if index % 8 == 2 {
                "succeeded"
            } else {
                "failed"
            };
            rig.sim(
                &format!("/charges/{}/complete", charge["id"].as_str().unwrap()),
                json!({"result": result}),
            )
            .await;
        }
        if index % 4 == 3 {
            // Refunded in two parts through our API.
            for part in 0..2 {
                let refund = client
                    .post(
                        &format!("/v1/payments/{id}/refunds"),
                        &format!("r-{index}-{part}"),
                        &json!({"amount_minor": 300}),
                    )
                    .await;
                // Adyen decides a refund after receiving it.
                let expected = if psp == Psp::Adyen { 202 } else { 201 };
                assert_eq!(
                    refund.status,
                    expected,
                    "{}",
                    String::from_utf8_lossy(&refund.body)
                );
            }
        }
    }

    // Read again each time, until no operation is open: Adyen decides the refunds it received
    // a moment later.
    let deadline = Instant::now() + Duration::from_secs(60);
    let truth = loop {
        let truth = provider_truth(&rig).await;
        assert_eq!(truth.len(), 40);
        match converged(&client, &truth).await {
            Ok(()) => break truth,
            Err(difference) => {
                assert!(Instant::now() < deadline, "never converged: {difference}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    // Nothing posted twice: each captured payment has one capture, and the provider's clearing
    // account is exactly what the provider's truth implies, less the fees it kept.
    let mut owed = 0;
    let mut last_position = 0;
    for (payment_id, charge) in &truth {
        let payment = client
            .get(&format!("/v1/payments/{payment_id}"))
            .await
            .json();
        last_position = last_position.max(payment["position"].as_i64().unwrap());
        let events = client
            .get(&format!("/v1/payments/{payment_id}/events"))
            .await
            .json();
        let captures = events
            .as_array()
            .unwrap()
            .iter()
            .filter(|event| event["type"] == "ChargeCaptured")
            .count();
        let captured = charge["amount_captured"].as_i64().unwrap();
        assert_eq!(
            captures,
            usize::from(captured > 0),
            "{payment_id}: {captures} captures"
        );
        let fees: i64 = payment["provider_fees"]
            .as_array()
            .unwrap()
            .iter()
            .map(|fee| fee["fee_minor"].as_i64().unwrap())
            .sum();
        let payment_owed = captured - charge["amount_refunded"].as_i64().unwrap() - fees;
        // The payment's own entries on the clearing account say the same.
        let clearing = format!("psp:{}:clearing", rig.provider());
        let entries = client.entries_of(payment_id).await;
        let posted: i64 = entries
            .iter()
            .flat_map(|entry| entry["legs"].as_array().unwrap())
            .filter(|leg| leg["account"] == clearing.as_str())
            .map(|leg| leg["amount_minor"].as_i64().unwrap())
            .sum();
        assert_eq!(
            posted, -payment_owed,
            "{payment_id}: {charge} {entries:#?} {events:#?}"
        );
        owed += payment_owed;
    }
    // Read-your-writes: the balance includes every event of these payments.
    let clearing = client
        .get(&format!(
            "/v1/accounts/psp:{}:clearing/balance?currency={}&min_position={last_position}",
            rig.provider(),
            rig.currency()
        ))
        .await
        .json();
    assert_eq!(clearing["balance_minor"].as_i64().unwrap(), -owed);
    verify(&database);
}

async fn payments_converge_under_duplicated_and_reordered_webhooks(backend: Backend) {
    payments_converge_under_duplicated_and_reordered_webhooks_at(backend, Psp::Sim).await;
}

async fn payments_at_stripe_converge_under_duplicated_and_reordered_webhooks(backend: Backend) {
    payments_converge_under_duplicated_and_reordered_webhooks_at(backend, Psp::Stripe).await;
}

async fn payments_at_adyen_converge_under_duplicated_and_reordered_webhooks(backend: Backend) {
    payments_converge_under_duplicated_and_reordered_webhooks_at(backend, Psp::Adyen).await;
}

/// Only correctly signed, fresh events from a configured provider are stored; a repeat of one is
/// acknowledged and changes nothing.
async fn the_endpoint_refuses_what_is_not_signed_right(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let rig = Rig::start(&database, Psp::Sim, &["--webhook-secret", SECRET]).await;
    let server = &rig.server;
    let client = server.client();
    let created = client
        .post("/v1/payments", "w-1", &payment_body(10_000, "pm_card_ok"))
        .await
        .json();
    let id = created["id"].as_str().unwrap();
    let truth = provider_truth(&rig).await;
    let charge_id = truth[id]["id"].as_str().unwrap();
    // The charge as the provider holds it, under our key: an event about a charge with another
    // key is not this payment's and is dead-lettered.
    let key = truth[id]["idempotency_key"].as_str().unwrap();
    let body = serde_json::to_vec(&json!({
        "id": "evt_test_1", "type": "charge.refunded", "created": 1_764_000_000,
        "data": {"charge": {
            "id": charge_id, "status": "succeeded", "amount_minor": 10_000, "currency": "USD",
            "amount_captured": 10_000, "amount_refunded": 1_000, "reference": id,
            "idempotency_key": key, "payment_method": "pm_card_ok", "capture": true,
            "metadata": {}, "created": "2026-01-01T00:00:00Z", "updated": "2026-01-01T00:00:00Z"
        }}
    }))
    .unwrap();
    // Read at each signing: a wall clock that jumps mid-test (a paused VM) must not make a
    // signature stale that the test means to be fresh.
    let now = || chrono::Utc::now().timestamp();
    let post = |provider: &str, signature: String, body: Vec<u8>| {
        client.send(
            client
                .http
                .post(format!("{}/webhooks/{provider}", client.base))
                .header("psp-signature", signature)
                .body(body),
        )
    };
    let cases = [
        (
            "sim",
            asiento_psp::sign("wrong-secret", now(), &body),
            400,
            "signature_invalid",
        ),
        (
            "sim",
            asiento_psp::sign(SECRET, now() - 3_600, &body),
            400,
            "signature_stale",
        ),
        (
            "other",
            asiento_psp::sign(SECRET, now(), &body),
            400,
            "unknown_provider",
        ),
        (
            "sim",
            asiento_psp::sign(SECRET, now(), b"{not json"),
            400,
            "invalid_body",
        ),
    ];
    for (provider, signature, status, code) in cases {
        let raw = if code == "invalid_body" {
            b"{not json".to_vec()
        } else {
            body.clone()
        };
        let answer = post(provider, signature, raw).await;
        assert_eq!((answer.status, answer.code().as_str()), (status, code));
    }
    let first = post("sim", asiento_psp::sign(SECRET, now(), &body), body.clone()).await;
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    assert_eq!(first.json()["duplicate"], false);
    let again = post("sim", asiento_psp::sign(SECRET, now(), &body), body.clone()).await;
    assert_eq!(
        (again.status, again.json()["duplicate"].clone()),
        (200, json!(true))
    );

    // The one stored event is applied once: refunded 1000 of 10000, one refund entry.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let payment = client.get(&format!("/v1/payments/{id}")).await.json();
        if payment["refunded_minor"] == 1_000 {
            assert_eq!(payment["status"], "partially_refunded");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the refund webhook was never applied: {payment}"
        );
        assert_eq!(payment["needs_review"], false, "{payment}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let entries = client.entries_of(id).await;
    assert_eq!(
        entries.len(),
        2,
        "one capture entry and one refund entry: {entries:?}"
    );
}

/// Stripe's endpoint, `/webhooks/stripe`, under `Stripe-Signature`: a wrong secret, a stale
/// timestamp and a body that is no event are refused and store nothing; during a secret rotation
/// (one `v1` per secret) any matching `v1` is enough; a repeat is acknowledged as a duplicate, and
/// the one stored event, a hint, is read as the PaymentIntent stands: nothing posted twice.
async fn the_stripe_endpoint_refuses_what_is_not_signed_right(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let rig = Rig::start(&database, Psp::Stripe, &[]).await;
    let client = rig.client();
    rig.drop_every_webhook().await;
    let created = client
        .post("/v1/payments", "ws-1", &rig.payment(10_000, "pm_card_ok"))
        .await
        .json();
    assert_eq!(created["status"], "captured", "{created}");
    let id = created["id"].as_str().unwrap();
    let intent = created["provider_charge_id"].as_str().unwrap();
    let body = serde_json::to_vec(&json!({
        "id": "evt_test_stripe_1", "object": "event", "type": "payment_intent.succeeded",
        "api_version": asiento_psp::stripe::API_VERSION, "created": 1_764_000_000,
        "livemode": false, "pending_webhooks": 1,
        "request": {"id": null, "idempotency_key": null},
        "data": {"object": {"id": intent, "object": "payment_intent", "status": "succeeded",
                            "metadata": {"asiento_payment_id": id}}}
    }))
    .unwrap();
    // Read at each signing: a wall clock that jumps mid-test (a paused VM) must not make a
    // signature stale that the test means to be fresh.
    let now = || chrono::Utc::now().timestamp();
    let post = |signature: String, body: Vec<u8>| {
        client.send(
            client
                .http
                .post(format!("{}/webhooks/stripe", client.base))
                .header("stripe-signature", signature)
                .body(body),
        )
    };
    let v1 = |secret: &str, at: i64, body: &[u8]| {
        let signed = asiento_psp::sign(secret, at, body);
        signed.split_once(",v1=").unwrap().1.to_owned()
    };
    let cases = [
        (
            asiento_psp::sign("whsec_wrong", now(), &body),
            body.clone(),
            "signature_invalid",
        ),
        (
            asiento_psp::sign(WEBHOOK_SECRET, now() - 3_600, &body),
            body.clone(),
            "signature_stale",
        ),
        (
            asiento_psp::sign(WEBHOOK_SECRET, now(), b"{not json"),
            b"{not json".to_vec(),
            "invalid_body",
        ),
    ];
    for (signature, raw, code) in cases {
        let answer = post(signature, raw).await;
        assert_eq!((answer.status, answer.code().as_str()), (400, code));
    }
    // A rotation: the old secret's signature first, the current one's second.
    let at = now();
    let rotated = format!(
        "t={at},v1={},v1={}",
        v1("whsec_old_secret", at, &body),
        v1(WEBHOOK_SECRET, at, &body)
    );
    let first = post(rotated, body.clone()).await;
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    assert_eq!(first.json()["duplicate"], false);
    let again = post(
        asiento_psp::sign(WEBHOOK_SECRET, now(), &body),
        body.clone(),
    )
    .await;
    assert_eq!(
        (again.status, again.json()["duplicate"].clone()),
        (200, json!(true))
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while client
        .metric("asiento_webhook_events_processed_total{outcome=\"applied\"")
        .await
        < 1.0
    {
        assert!(
            Instant::now() < deadline,
            "the stored event was never applied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let payment = client.get(&format!("/v1/payments/{id}")).await.json();
    assert_eq!(payment["status"], "captured");
    assert_eq!(payment["needs_review"], false, "{payment}");
    let entries = without_provider_fees(client.entries_of(id).await);
    assert_eq!(entries.len(), 1, "one capture entry: {entries:?}");
    verify(&database);
}

/// Two `serve --role worker` processes drain one PostgreSQL inbox of 1,000 events: every event is
/// applied exactly once, and both processes did some of the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_worker_processes_drain_one_inbox_exactly_once() {
    const PAYMENTS: usize = 100;
    const REFUNDS_PER_PAYMENT: i64 = 10;
    let database = TestDatabase::new(Backend::Postgres).await;
    let sim = common::Simulator::start(&[]);
    let api = Server::start(
        &database.url,
        &[
            "--role",
            "api",
            "--psp-url",
            &sim.base,
            "--webhook-secret",
            SECRET,
        ],
    );
    let client = api.client();
    let mut ids = Vec::new();
    for index in 0..PAYMENTS {
        let payment = client
            .post(
                "/v1/payments",
                &format!("p-{index}"),
                &payment_body(1_000, "pm_card_ok"),
            )
            .await
            .json();
        assert_eq!(payment["status"], "captured");
        ids.push(payment["id"].as_str().unwrap().to_owned());
    }
    let charges: BTreeMap<String, Value> = sim
        .charges()
        .await
        .into_iter()
        .map(|charge| (charge["reference"].as_str().unwrap().to_owned(), charge))
        .collect();

    let mut workers: Vec<common::Process> = (0..2)
        .map(|_| {
            let mut worker = common::Process::spawn(
                &[
                    "serve",
                    "--role",
                    "worker",
                    "--listen",
                    "127.0.0.1:0",
                    "--database-url",
                    &database.url,
                    "--psp-url",
                    &sim.base,
                ],
                &[],
            );
            worker.wait_for_line("webhook worker");
            worker
        })
        .collect();

    // Ten cumulative refunds per payment (10, 20 … 100), delivered in a scrambled order.
    let mut events = Vec::new();
    for id in &ids {
        for step in 1..=REFUNDS_PER_PAYMENT {
            let mut charge = charges[id].clone();
            charge["amount_refunded"] = json!(step * 10);
            events.push(
                serde_json::to_vec(&json!({
                    "id": format!("evt_{id}_{step}"), "type": "charge.refunded",
                    "created": 1_764_000_000, "data": {"charge": charge}
                }))
                .unwrap(),
            );
        }
    }
    let mut order: Vec<usize> = (0..events.len()).collect();
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for index in (1..order.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(index, (state % (index as u64 + 1)) as usize);
    }
    let events = std::sync::Arc::new(events);
    let mut senders = Vec::new();
    for lane in 0..8 {
        let (client, events, order) = (client.clone(), events.clone(), order.clone());
        senders.push(tokio::spawn(async move {
            for &index in order.iter().skip(lane).step_by(8) {
                let body = events[index].clone();
                let signature = asiento_psp::sign(SECRET, chrono::Utc::now().timestamp(), &body);
                let answer = client
                    .send(
                        client
                            .http
                            .post(format!("{}/webhooks/sim", client.base))
                            .header("psp-signature", signature)
                            .body(body),
                    )
                    .await;
                assert_eq!(
                    answer.status,
                    200,
                    "{}",
                    String::from_utf8_lossy(&answer.body)
                );
            }
        }));
    }
    for sender in senders {
        sender.await.unwrap();
    }

    let db = asiento_eventstore::Database::connect(&database.url)
        .await
        .unwrap();
    let asiento_eventstore::Database::Postgres(pool) = &db else {
        panic!("postgres expected");
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE status = 'pending'")
                .fetch_one(pool)
                .await
                .unwrap();
        if pending == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{pending} events still pending");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (processed, dead): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'processed' AND outcome = 'applied'), \
                count(*) FILTER (WHERE status = 'dead') FROM webhook_inbox",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        (processed, dead),
        (PAYMENTS as i64 * REFUNDS_PER_PAYMENT, 0)
    );
    // Each process counts the rows it applied: both worked, and together exactly once each.
    let mut per_worker = Vec::new();
    for worker in &mut workers {
        let line = worker.wait_for_line("asiento listening on ");
        let base = line.split_whitespace().nth(3).unwrap().to_owned();
        let metrics = reqwest::get(format!("{base}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let applied: f64 = metrics
            .lines()
            .find(|line| {
                line.starts_with("asiento_webhook_events_processed_total{outcome=\"applied\"}")
            })
            .and_then(|line| line.split_whitespace().last())
            .map_or(0.0, |value| value.parse().unwrap());
        per_worker.push(applied as i64);
    }
    assert!(
        per_worker.iter().all(|applied| *applied > 0),
        "both worked: {per_worker:?}"
    );
    assert_eq!(per_worker.iter().sum::<i64>(), processed, "{per_worker:?}");
    for id in &ids {
        let payment = client.get(&format!("/v1/payments/{id}")).await.json();
        assert_eq!(payment["refunded_minor"], 100, "{payment}");
        // The refunds posted exactly what the provider refunded, once: 100 back to clearing.
        let refunded_to_clearing: i64 = client
            .entries_of(id)
            .await
            .iter()
            .flat_map(|entry| entry["legs"].as_array().unwrap().clone())
            .filter(|leg| leg["account"] == "psp:sim:clearing")
            .map(|leg| leg["amount_minor"].as_i64().unwrap())
            .filter(|amount| *amount > 0)
            .sum();
        assert_eq!(refunded_to_clearing, 100, "{id}");
    }
    drop(workers);
}

asiento_testkit::both_backends!(threads = 2;
    payments_converge_under_duplicated_and_reordered_webhooks,
    payments_at_stripe_converge_under_duplicated_and_reordered_webhooks,
    payments_at_adyen_converge_under_duplicated_and_reordered_webhooks,
    the_endpoint_refuses_what_is_not_signed_right,
    the_stripe_endpoint_refuses_what_is_not_signed_right,
);
