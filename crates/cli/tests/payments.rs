//! The command API through the real binary over real HTTP, on SQLite and PostgreSQL: idempotency
//! under concurrency, provider outcomes and their postings, and a capture repeated after its
//! answer was lost (each against the simulator, its Stripe dialect and its Adyen dialect, where
//! a capture is decided after it is received and a lost notification is found in the accounting
//! report), byte-identical
//! replays, a crash between the provider's charge and our finalisation, transfers racing for the
//! same money, and bad input that must never produce a 5xx.
#![allow(clippy::unwrap_used)]

mod common;

use common::rig::{Psp, Rig};
use common::{payment_body, without_provider_fees, Backend, Server, Simulator, TestDatabase};
use serde_json::{json, Value};

/// One key, twenty requests at once: the provider holds one charge, and every answer is either the
/// one success (the same bytes each time) or 409 while it was in flight.
async fn one_key_many_concurrent_requests_charge_once_at(backend: Backend, psp: Psp) {
    let database = TestDatabase::new(backend).await;
    let rig = Rig::start(&database, psp, &[]).await;
    let client = rig.client();
    let body = rig.payment(10_000, "pm_card_ok");
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let client = client.clone();
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            client.post("/v1/payments", "same-key", &body).await
        }));
    }
    let mut successes = Vec::new();
    for task in tasks {
        let answer = task.await.unwrap();
        match answer.status {
            201 => successes.push(answer.body),
            409 => assert_eq!(answer.code(), "idempotency_request_in_progress"),
            other => panic!(
                "unexpected {other}: {}",
                String::from_utf8_lossy(&answer.body)
            ),
        }
    }
    assert!(!successes.is_empty());
    assert!(
        successes.windows(2).all(|pair| pair[0] == pair[1]),
        "bodies differ"
    );
    let charges = rig.charges().await;
    assert_eq!(
        charges.len(),
        1,
        "the provider must hold exactly one charge: {charges:?}"
    );
    if psp == Psp::Stripe {
        let intents = rig.payment_intents().await;
        assert_eq!(intents.len(), 1, "one PaymentIntent at Stripe: {intents:?}");
    }
}

async fn one_key_many_concurrent_requests_charge_once(backend: Backend) {
    one_key_many_concurrent_requests_charge_once_at(backend, Psp::Sim).await;
}

async fn one_key_many_concurrent_requests_charge_once_at_stripe(backend: Backend) {
    one_key_many_concurrent_requests_charge_once_at(backend, Psp::Stripe).await;
}

async fn one_key_many_concurrent_requests_charge_once_at_adyen(backend: Backend) {
    one_key_many_concurrent_requests_charge_once_at(backend, Psp::Adyen).await;
}

/// Replays are byte for byte with `Idempotent-Replayed: true`, whatever the original answer was;
/// the same JSON with its keys reordered is the same request; another body is 422.
async fn replays_are_byte_identical(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();

    let first = client
        .post_raw(
            "/v1/payments",
            Some("order-1"),
            r#"{"amount_minor": 10000, "currency": "USD", "customer": "42", "payment_method": "pm_card_ok"}"#,
        )
        .await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    let reordered = client
        .post_raw(
            "/v1/payments",
            Some("order-1"),
            r#"{"payment_method":"pm_card_ok","customer":"42","currency":"USD","amount_minor":10000}"#,
        )
        .await;
    assert_eq!(reordered.status, 201);
    assert!(reordered.replayed());
    assert_eq!(reordered.body, first.body, "a replay is byte-identical");

    let other = client
        .post(
            "/v1/payments",
            "order-1",
            &payment_body(10_001, "pm_card_ok"),
        )
        .await;
    assert_eq!(
        (other.status, other.code().as_str()),
        (422, "idempotency_key_reused")
    );

    let missing = client
        .post_raw(
            "/v1/payments",
            None,
            serde_json::to_vec(&payment_body(1, "pm_card_ok")).unwrap(),
        )
        .await;
    assert_eq!(
        (missing.status, missing.code().as_str()),
        (400, "idempotency_key_missing")
    );

    // A business rejection is stored and replayed like a success.
    let id = first.json()["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/payments/{id}/refunds");
    let refused = client
        .post(&path, "refund-1", &json!({"amount_minor": 20_000}))
        .await;
    assert_eq!(
        (refused.status, refused.code().as_str()),
        (422, "refund_exceeds_captured")
    );
    let again = client
        .post(&path, "refund-1", &json!({"amount_minor": 20_000}))
        .await;
    assert_eq!(again.status, 422);
    assert!(again.replayed());
    assert_eq!(again.body, refused.body);

    // Another tenant sees nothing of it.
    let beta = client.with_key("sk_test_beta_0123456789abcdef");
    let hidden = beta.get(&format!("/v1/payments/{id}")).await;
    assert_eq!(
        (hidden.status, hidden.code().as_str()),
        (404, "payment_not_found")
    );
    let hidden = beta
        .post(&path, "refund-2", &json!({"amount_minor": 1}))
        .await;
    assert_eq!(hidden.status, 404);
}

/// The process dies after the provider charged and before we finalised: after a restart, a retry
/// with the same key finishes the payment with exactly one charge and one posting.
async fn crash_between_charge_and_finalisation_resumes_once(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    // The provider outlives the server, as a real one does.
    let simulator = Simulator::start(&["--slow-ms", "4000"]);
    let mut server = Server::start(
        &database.url,
        &["--psp-url", &simulator.base, "--idempotency-lease", "1s"],
    );
    let client = server.client();
    let body = payment_body(10_000, "pm_card_slow");
    let in_flight = client.post_in_background("/v1/payments", "crashy", &body);
    // Wait until the provider has charged, then kill the server while the answer is held.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while simulator.charges().await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the provider never saw the charge"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    server.crash_and_restart();
    assert!(
        in_flight.await.unwrap().is_err(),
        "the killed server cannot have answered"
    );

    let client = server.client();
    // Past the lease, the retry takes the key over and resumes the same payment.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let resumed = client.post("/v1/payments", "crashy", &body).await;
    assert_eq!(
        resumed.status,
        201,
        "{}",
        String::from_utf8_lossy(&resumed.body)
    );
    let payment = resumed.json();
    assert_eq!(payment["status"], "captured");
    assert_eq!(
        simulator.charges().await.len(),
        1,
        "one charge at the provider"
    );
    let entries = client.entries_of(payment["id"].as_str().unwrap()).await;
    assert_eq!(entries.len(), 1, "one posting: {entries:?}");
    let replay = client.post("/v1/payments", "crashy", &body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, resumed.body);
}

fn legs(entry: &Value) -> Vec<(String, i64)> {
    let mut legs: Vec<(String, i64)> = entry["legs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|leg| {
            (
                leg["account"].as_str().unwrap().to_owned(),
                leg["amount_minor"].as_i64().unwrap(),
            )
        })
        .collect();
    legs.sort();
    legs
}

/// Timeout → 202 pending with nothing posted, and the outcome arriving later posts once;
/// declined → failed with nothing posted; a capture posts exactly API.md's entry with the 3% fee.
async fn provider_outcomes_and_their_postings_at(backend: Backend, psp: Psp) {
    let database = TestDatabase::new(backend).await;
    let rig = Rig::start(&database, psp, &["--psp-timeout", "300ms"]).await;
    let client = rig.client();
    let entries = |id: String| {
        let client = client.clone();
        async move { without_provider_fees(client.entries_of(&id).await) }
    };
    // The provider's webhook for the timed-out charge must come after our answer, as it would
    // from a provider that is slow to notify.
    rig.sim("/faults", json!({"webhook_delay_ms": 1_500})).await;

    let timing_out = rig.payment(5_000, "pm_card_timeout");
    let pending = client.post("/v1/payments", "t-1", &timing_out).await;
    assert_eq!(
        pending.status,
        202,
        "{}",
        String::from_utf8_lossy(&pending.body)
    );
    assert_eq!(pending.json()["status"], "pending");
    let id = pending.json()["id"].as_str().unwrap().to_owned();
    assert!(client.entries_of(&id).await.is_empty());
    let replay = client.post("/v1/payments", "t-1", &timing_out).await;
    assert_eq!((replay.status, replay.replayed()), (202, true));
    // The outcome arrives later (the provider's webhook): posted once.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while client.get(&format!("/v1/payments/{id}")).await.json()["status"] != "captured" {
        assert!(
            std::time::Instant::now() < deadline,
            "the late outcome never arrived"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(entries(id.clone()).await.len(), 1);
    let replay = client.post("/v1/payments", "t-1", &timing_out).await;
    assert_eq!(
        replay.status, 202,
        "the stored answer is replayed as it was"
    );

    let declined = client
        .post(
            "/v1/payments",
            "d-1",
            &rig.payment(5_000, "pm_card_declined"),
        )
        .await;
    assert_eq!(declined.status, 201);
    assert_eq!(declined.json()["status"], "failed");
    assert!(client
        .entries_of(declined.json()["id"].as_str().unwrap())
        .await
        .is_empty());

    let captured = client
        .post("/v1/payments", "ok-1", &rig.payment(10_000, "pm_card_ok"))
        .await;
    let payment = captured.json();
    assert_eq!(
        (payment["status"].as_str(), payment["fee_minor"].as_i64()),
        (Some("captured"), Some(300))
    );
    let posted = entries(payment["id"].as_str().unwrap().to_owned()).await;
    assert_eq!(posted.len(), 1);
    assert_eq!(
        legs(&posted[0]),
        vec![
            ("customer:42:available".to_owned(), 9_700),
            (format!("psp:{}:clearing", rig.provider()), -10_000),
            ("revenue:fees".to_owned(), 300),
        ]
    );
}

async fn provider_outcomes_and_their_postings(backend: Backend) {
    provider_outcomes_and_their_postings_at(backend, Psp::Sim).await;
}

async fn provider_outcomes_and_their_postings_at_stripe(backend: Backend) {
    provider_outcomes_and_their_postings_at(backend, Psp::Stripe).await;
}

async fn provider_outcomes_and_their_postings_at_adyen(backend: Backend) {
    provider_outcomes_and_their_postings_at(backend, Psp::Adyen).await;
}

/// Transfers racing for one customer's money: exactly those that fit succeed.
async fn concurrent_transfers_never_overdraw(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    // 10000 captured → 9700 available to customer 42.
    let funded = client
        .post("/v1/payments", "fund", &payment_body(10_000, "pm_card_ok"))
        .await;
    assert_eq!(funded.status, 201);
    let mut tasks = Vec::new();
    for index in 0..20 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            client
                .post(
                    "/v1/transfers",
                    &format!("transfer-{index}"),
                    &json!({"from": "customer:42:available", "to": "customer:7:available",
                            "amount_minor": 1_000, "currency": "USD"}),
                )
                .await
        }));
    }
    let (mut accepted, mut refused) = (0, 0);
    for task in tasks {
        let answer = task.await.unwrap();
        match (answer.status, answer.code().as_str()) {
            (201, _) => accepted += 1,
            (422, "insufficient_funds") => refused += 1,
            (status, code) => panic!("unexpected {status} {code}"),
        }
    }
    assert_eq!(
        (accepted, refused),
        (9, 11),
        "9700 fits nine transfers of 1000"
    );
}

/// Bad input answers 4xx with a stable code and changes nothing; the server stays healthy.
async fn bad_input_is_a_4xx_with_a_code(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client().unpooled();
    let ok = r#"{"amount_minor": 100, "currency": "USD", "customer": "42", "payment_method": "pm_card_ok"}"#;
    let long_key = "k".repeat(300);
    // (what, path, idempotency key, body, status, code)
    type Case<'a> = (&'a str, &'a str, Option<&'a str>, String, u16, &'a str);
    let cases: Vec<Case<'_>> = vec![
        (
            "float",
            "/v1/payments",
            Some("a"),
            ok.replace("100", "100.5"),
            400,
            "amount_must_be_integer",
        ),
        (
            "negative",
            "/v1/payments",
            Some("a"),
            ok.replace("100", "-100"),
            400,
            "amount_must_be_positive",
        ),
        (
            "over i64",
            "/v1/payments",
            Some("a"),
            ok.replace("100", "9223372036854775808"),
            422,
            "amount_too_large",
        ),
        (
            "string amount",
            "/v1/payments",
            Some("a"),
            ok.replace("100", "\"100\""),
            400,
            "amount_must_be_integer",
        ),
        (
            "unknown currency",
            "/v1/payments",
            Some("a"),
            ok.replace("USD", "XYZ"),
            400,
            "unknown_currency",
        ),
        (
            "unknown provider",
            "/v1/payments",
            Some("a"),
            ok.replace("\"customer\"", "\"provider\": \"nope\", \"customer\""),
            400,
            "unknown_provider",
        ),
        (
            "malformed json",
            "/v1/payments",
            Some("a"),
            "{\"amount_minor\": ".to_owned(),
            400,
            "malformed_json",
        ),
        (
            "not an object",
            "/v1/payments",
            Some("a"),
            "[1, 2]".to_owned(),
            400,
            "invalid_body",
        ),
        (
            "bad account",
            "/v1/transfers",
            Some("a"),
            r#"{"from": "Customer:42", "to": "customer:7", "amount_minor": 1, "currency": "USD"}"#
                .to_owned(),
            400,
            "invalid_account",
        ),
        (
            "300-character key",
            "/v1/payments",
            Some(&long_key),
            ok.to_owned(),
            400,
            "idempotency_key_invalid",
        ),
        (
            "unknown field",
            "/v1/payments",
            Some("a"),
            ok.replace("\"customer\"", "\"ammount\": 1, \"customer\""),
            400,
            "unknown_field",
        ),
        (
            "unknown route",
            "/v1/nothing",
            Some("a"),
            ok.to_owned(),
            404,
            "not_found",
        ),
        (
            "bad payment id",
            "/v1/payments/pay_nope/refunds",
            Some("a"),
            r#"{"amount_minor": 1}"#.to_owned(),
            404,
            "payment_not_found",
        ),
    ];
    for (name, path, key, body, status, code) in cases {
        let answer = client.post_raw(path, key, body.into_bytes()).await;
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (status, code),
            "{name}"
        );
        assert_eq!(
            answer.headers.get("content-type").unwrap(),
            "application/problem+json",
            "{name}"
        );
    }
    // A 2 MB body is refused from its declared length, before it is read: the server may close
    // the connection while a client still writes, so this sends the headers alone.
    let (status, body) =
        common::raw_post_headers_only(&client.base, "/v1/payments", &client.key, 2 * 1024 * 1024)
            .await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("\"code\":\"body_too_large\""), "{body}");

    // A non-ASCII key cannot even be sent by reqwest as a str header; send it as raw bytes.
    let answer = client
        .send(
            client
                .http
                .post(format!("{}/v1/payments", client.base))
                .bearer_auth(&client.key)
                .header(
                    "idempotency-key",
                    reqwest::header::HeaderValue::from_bytes("clé".as_bytes()).unwrap(),
                )
                .body(ok),
        )
        .await;
    assert_eq!(
        (answer.status, answer.code().as_str()),
        (400, "idempotency_key_invalid")
    );
    let wrong_method = client
        .send(client.http.delete(format!("{}/v1/payments", client.base)))
        .await;
    assert_eq!(
        (wrong_method.status, wrong_method.code().as_str()),
        (405, "method_not_allowed")
    );
    let unauthenticated = client
        .send(client.http.post(format!("{}/v1/payments", client.base)))
        .await;
    assert_eq!(unauthenticated.status, 401);

    // Nothing of it was recorded, and the server still works.
    let health = client.get("/healthz").await;
    assert_eq!(health.status, 200);
    let fine = client.post_raw("/v1/payments", Some("a"), ok).await;
    assert_eq!(
        fine.status, 201,
        "the key refused by validation was not stored"
    );
}

/// Regression (found by the simulation, seed 329): a second capture request for the amount of a
/// capture still awaiting the provider's answer decided nothing new, and the empty decision was
/// appended: a 500 on every retry. It must ask the provider again and capture.
async fn repeated_capture_after_a_lost_answer_captures_at(backend: Backend, psp: Psp) {
    let database = TestDatabase::new(backend).await;
    let rig = Rig::start(&database, psp, &["--psp-timeout", "300ms"]).await;
    let client = rig.client();
    let mut body = rig.payment(5_000, "pm_card_ok");
    body["capture"] = json!("manual");
    let authorized = client.post("/v1/payments", "m-1", &body).await.json();
    assert_eq!(authorized["status"], "authorized");
    let id = authorized["id"].as_str().unwrap();
    // Webhooks dropped: only our own second request can learn the outcome.
    let faults = |rate: f64| {
        rig.sim(
            "/faults",
            json!({"timeout_rate": rate, "webhook_drop_rate": 1.0}),
        )
    };
    // The provider captures, but its answer never arrives.
    faults(1.0).await;
    let path = format!("/v1/payments/{id}/capture");
    let lost = client.post(&path, "c-1", &json!({})).await;
    assert_eq!(lost.status, 202, "{}", String::from_utf8_lossy(&lost.body));
    faults(0.0).await;
    let again = client.post(&path, "c-2", &json!({})).await;
    if psp == Psp::Adyen {
        // Adyen decides a capture after receiving it: asked again under its key, it answers
        // the first request's `received`, and its CAPTURE notification was dropped, so the
        // accounting report settles it.
        assert_eq!(
            again.status,
            202,
            "{}",
            String::from_utf8_lossy(&again.body)
        );
        let pending = again.json();
        assert_eq!(pending["operations"][0]["state"], "pending", "{pending}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            rig.reconcile(&database.url).await;
            let now = common::payment(&client, id).await;
            if now["status"] == "captured" {
                assert_eq!(now["operations"][0]["state"], "succeeded", "{now}");
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the report never settled the capture: {now}"
            );
        }
    } else {
        assert_eq!(
            again.status,
            200,
            "{}",
            String::from_utf8_lossy(&again.body)
        );
        assert_eq!(again.json()["status"], "captured");
    }
    // The authorization's hold, one capture, the hold's release.
    let clearing = format!("psp:{}:clearing", rig.provider());
    let captures = without_provider_fees(client.entries_of(id).await)
        .into_iter()
        .filter(|entry| {
            entry["legs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|leg| leg["account"] == clearing.as_str())
        })
        .count();
    assert_eq!(captures, 1, "captured once");
    assert_eq!(rig.operations_of(id, "capture").await.len(), 1);
}

async fn repeated_capture_after_a_lost_answer_captures(backend: Backend) {
    repeated_capture_after_a_lost_answer_captures_at(backend, Psp::Sim).await;
}

async fn repeated_capture_after_a_lost_answer_captures_at_stripe(backend: Backend) {
    repeated_capture_after_a_lost_answer_captures_at(backend, Psp::Stripe).await;
}

async fn repeated_capture_after_a_lost_answer_captures_at_adyen(backend: Backend) {
    repeated_capture_after_a_lost_answer_captures_at(backend, Psp::Adyen).await;
}

/// Creates a payment that needs a redirect (key `key`), completes the redirect at the simulator
/// and waits until the payment has left `requires_action`; returns the create's first answer.
async fn redirect_completed(client: &common::Client, key: &str) -> common::Answer {
    let created = client
        .post("/v1/payments", key, &payment_body(4_000, "pm_redirect"))
        .await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let payment = created.json();
    assert_eq!(payment["status"], "requires_action");
    let redirect = payment["next_action"]["redirect_url"].as_str().unwrap();
    let charge_id = redirect
        .split('/')
        .find(|part| part.starts_with("ch_"))
        .unwrap();
    let completed = client
        .send(
            client
                .http
                .post(format!("{}/sim/charges/{charge_id}/complete", client.base))
                .json(&json!({"result": "succeeded"})),
        )
        .await;
    assert_eq!(completed.status, 200);
    let id = payment["id"].as_str().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let now = client.get(&format!("/v1/payments/{id}")).await.json();
        if now["status"] != "requires_action" {
            assert_eq!(now["status"], "captured");
            assert!(now["next_action"].is_null());
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the redirect's outcome never arrived"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    created
}

/// A replayed create hands a `next_action` out only while the payment still requires it: once
/// the redirect completed, the replay is the stored status and body with `next_action: null`.
async fn replay_after_the_redirect_carries_no_next_action(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    let body = payment_body(4_000, "pm_redirect");
    // Still waiting for the customer: the replay is the first answer, byte for byte.
    let waiting = client.post("/v1/payments", "redirect-0", &body).await;
    let again = client.post("/v1/payments", "redirect-0", &body).await;
    assert!(again.replayed());
    assert_eq!(again.body, waiting.body);
    assert!(again.json()["next_action"]["redirect_url"].is_string());

    let first = redirect_completed(&client, "redirect-1").await;
    let replay = client.post("/v1/payments", "redirect-1", &body).await;
    assert_eq!(replay.status, first.status);
    assert!(replay.replayed());
    let mut expected = first.json();
    expected["next_action"] = Value::Null;
    assert_eq!(replay.json(), expected, "only next_action is taken out");
    assert_eq!(
        replay.body,
        serde_json::to_vec(&expected).unwrap(),
        "the rest of the stored body is replayed byte for byte"
    );
}

/// The events view and the merchant events withhold the redirect URL (and review details): the
/// history of a payment never hands out what lets someone act on it.
async fn events_view_withholds_the_redirect_url(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    let first = redirect_completed(&client, "redirect-events").await;
    let payment = first.json();
    let url = payment["next_action"]["redirect_url"].as_str().unwrap();
    let id = payment["id"].as_str().unwrap();
    let events = client.get(&format!("/v1/payments/{id}/events")).await;
    assert_eq!(events.status, 200);
    assert!(
        !String::from_utf8_lossy(&events.body).contains(url),
        "the redirect URL is in the history"
    );
    let events = events.json();
    let action = events
        .as_array()
        .unwrap()
        .iter()
        .find(|event| event["type"] == "ActionRequired")
        .expect("an ActionRequired event");
    assert_eq!(action["data"]["redirect_url"], "[redacted]");
    assert!(action["data"]["charge_id"]
        .as_str()
        .unwrap()
        .starts_with("ch_"));
    // So do the merchant events: the payment required action, then was captured.
    let told = common::merchant_events_of(
        &client,
        "payment.created,payment.requires_action,payment.captured",
        id,
        3,
    )
    .await;
    let kinds: Vec<&str> = told.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "payment.created",
            "payment.requires_action",
            "payment.captured"
        ]
    );
    assert_eq!(
        told[1]["data"]["object"]["next_action"]["redirect_url"],
        "[redacted]"
    );
    let feed = client.get("/v1/events?limit=100").await;
    assert!(
        !String::from_utf8_lossy(&feed.body).contains(url),
        "the redirect URL is in the feed"
    );
}

asiento_testkit::both_backends!(threads = 2;
    one_key_many_concurrent_requests_charge_once,
    one_key_many_concurrent_requests_charge_once_at_stripe,
    one_key_many_concurrent_requests_charge_once_at_adyen,
    replays_are_byte_identical,
    crash_between_charge_and_finalisation_resumes_once,
    provider_outcomes_and_their_postings,
    provider_outcomes_and_their_postings_at_stripe,
    provider_outcomes_and_their_postings_at_adyen,
    concurrent_transfers_never_overdraw,
    bad_input_is_a_4xx_with_a_code,
    repeated_capture_after_a_lost_answer_captures,
    repeated_capture_after_a_lost_answer_captures_at_stripe,
    repeated_capture_after_a_lost_answer_captures_at_adyen,
    replay_after_the_redirect_carries_no_next_action,
    events_view_withholds_the_redirect_url,
);
