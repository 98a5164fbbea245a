//! The simulator's operations and the faults of issue 19 over loopback,
//! through the real client: asynchronous modifications, late refund
//! reversals, failing an operation on demand, cancels, refusals, no lookup
//! routes, 409 while a key's first request runs, and an unreachable period
//! that keeps every charge.

// A test harness: helpers outside `#[test]` functions may panic too.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use asiento_psp::{
    Charge, ChargeOutcome, ChargeStatus, ClientConfig, CreateCharge, EventType, HttpProvider,
    OperationKind, OperationStatus, Provider, ProviderError, WebhookEvent,
};
use asiento_psp_sim::{SimConfig, Simulator};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use common::{bounded, eventually, RunningSim};

impl RunningSim {
    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let response = reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn set_faults(&self, faults: Value) {
        let (status, body) = self.post("/sim/faults", faults).await;
        assert!(status.is_success(), "{status}: {body}");
    }
}

fn client_with(base: &str, attempts_max: u32, request_timeout_ms: u64) -> HttpProvider {
    let config = ClientConfig {
        connect_timeout_ms: 500,
        request_timeout_ms,
        attempts_max,
        backoff_base_ms: 5,
        backoff_max_ms: 20,
        ..ClientConfig::default()
    };
    HttpProvider::new("sim", base, config).unwrap()
}

fn client(base: &str) -> HttpProvider {
    client_with(base, 4, 2_000)
}

fn charge_request(key: &str, capture: bool) -> CreateCharge {
    CreateCharge {
        idempotency_key: key.to_string(),
        amount_minor: 10_000,
        currency: "USD".to_string(),
        payment_method: "pm_card_ok".to_string(),
        capture,
        reference: Some(format!("pay_{key}")),
        customer: None,
        metadata: BTreeMap::new(),
    }
}

fn charge_of(outcome: ChargeOutcome) -> Charge {
    match outcome {
        ChargeOutcome::Succeeded(c)
        | ChargeOutcome::Authorized(c)
        | ChargeOutcome::RequiresAction(c)
        | ChargeOutcome::Declined(c) => c,
        other => panic!("expected a charge, got {other:?}"),
    }
}

// --- a webhook receiver that keeps every event (signatures are the other
// file's business) ---

type Received = Arc<Mutex<Vec<WebhookEvent>>>;

async fn receive(State(received): State<Received>, body: Bytes) -> StatusCode {
    received
        .lock()
        .unwrap()
        .push(serde_json::from_slice(&body).unwrap());
    StatusCode::OK
}

async fn start_receiver() -> (String, Received) {
    let received: Received = Arc::default();
    let app = Router::new()
        .route("/webhooks/sim", post(receive))
        .with_state(Arc::clone(&received));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhooks/sim", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

fn webhook_config(url: String) -> SimConfig {
    SimConfig {
        webhook_url: Some(url),
        webhook_secret: "whsec_ops".to_string(),
        seed: 19,
        webhook_backoff_base_ms: 10,
        webhook_backoff_max_ms: 50,
        ..SimConfig::default()
    }
}

fn updates(received: &Received) -> Vec<WebhookEvent> {
    received
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.kind == EventType::OperationUpdated)
        .cloned()
        .collect()
}

#[tokio::test]
async fn async_captures_and_refunds_answer_pending_and_are_decided_by_webhook() {
    bounded(async {
        let (url, received) = start_receiver().await;
        let sim = RunningSim::start(webhook_config(url)).await;
        sim.set_faults(json!({"async_modifications": true, "async_delay_ms": 150}))
            .await;
        let client = client(&sim.base);
        let auth = charge_of(client.create_charge(&charge_request("a", false)).await);

        let capture = client
            .capture(&auth.id, None, "USD", "a-cap")
            .await
            .unwrap();
        assert_eq!(
            (capture.operation.kind, capture.operation.status),
            (OperationKind::Capture, OperationStatus::Pending)
        );
        assert_eq!(
            capture.charge.unwrap().status,
            ChargeStatus::RequiresCapture
        );
        let held = client
            .get_operation(&capture.operation.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(held.status, OperationStatus::Pending);
        assert_eq!(
            client.get_charge(&auth.id).await.unwrap().unwrap().status,
            ChargeStatus::RequiresCapture,
            "the charge changes only when decided"
        );
        assert!(eventually(5_000, || updates(&received).len() == 1).await);
        let event = &updates(&received)[0];
        let op = event.data.operation.as_ref().unwrap();
        assert_eq!(
            (op.id.as_str(), op.status),
            (capture.operation.id.as_str(), OperationStatus::Succeeded)
        );
        assert_eq!(event.data.charge.as_ref().unwrap().amount_captured, 10_000);
        assert_eq!(
            client.get_charge(&auth.id).await.unwrap().unwrap().status,
            ChargeStatus::Succeeded
        );

        let refund = client
            .refund(&auth.id, 4_000, "USD", "a-ref")
            .await
            .unwrap();
        assert_eq!(refund.operation.status, OperationStatus::Pending);
        assert_eq!(refund.charge.unwrap().amount_refunded, 0);
        assert!(eventually(5_000, || updates(&received).len() == 2).await);
        let found = client
            .find_operation_by_key("a-ref")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (found.id, found.status),
            (refund.operation.id, OperationStatus::Succeeded)
        );
        assert_eq!(
            client
                .get_charge(&auth.id)
                .await
                .unwrap()
                .unwrap()
                .amount_refunded,
            4_000
        );
        assert_eq!(client.find_operation_by_key("never").await.unwrap(), None);
        assert_eq!(client.get_operation("re_missing").await.unwrap(), None);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_reversed_refund_fails_after_succeeding_and_the_refunded_amount_goes_back_down() {
    bounded(async {
        let (url, received) = start_receiver().await;
        let sim = RunningSim::start(webhook_config(url)).await;
        sim.set_faults(json!({"refund_reversal_rate": 1.0, "refund_reversal_delay_ms": 150}))
            .await;
        let client = client(&sim.base);
        let charge = charge_of(client.create_charge(&charge_request("r", true)).await);
        let refund = client
            .refund(&charge.id, 2_500, "USD", "r-ref")
            .await
            .unwrap();
        assert_eq!(refund.operation.status, OperationStatus::Succeeded);
        assert_eq!(refund.charge.unwrap().amount_refunded, 2_500);
        assert!(eventually(5_000, || updates(&received).len() == 1).await);
        let event = &updates(&received)[0];
        let op = event.data.operation.as_ref().unwrap();
        assert_eq!(op.status, OperationStatus::Failed);
        assert_eq!(
            op.failure_reason.as_deref(),
            Some("expired_or_canceled_card")
        );
        assert_eq!(event.data.charge.as_ref().unwrap().amount_refunded, 0);
        assert_eq!(
            client
                .get_charge(&charge.id)
                .await
                .unwrap()
                .unwrap()
                .amount_refunded,
            0
        );

        // On demand: a succeeded refund fails now.
        sim.set_faults(json!({"refund_reversal_rate": 0.0})).await;
        let refund = client
            .refund(&charge.id, 1_000, "USD", "r-ref-2")
            .await
            .unwrap();
        let path = format!("/sim/operations/{}/fail", refund.operation.id);
        let (status, body) = sim.post(&path, json!({})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["operation"]["status"], "failed");
        assert_eq!(body["charge"]["amount_refunded"], 0);
        let (status, _) = sim.post(&path, json!({})).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "a failed operation cannot fail again"
        );
        assert!(eventually(5_000, || updates(&received).len() == 2).await);
        assert_eq!(sim.sim.operations().len(), 2);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn cancels_void_authorisations_and_refusals_are_refusals() {
    bounded(async {
        let sim = RunningSim::start(SimConfig::default()).await;
        let client = client(&sim.base);
        let auth = charge_of(client.create_charge(&charge_request("c", false)).await);
        let canceled = client.cancel(&auth.id, "c-cnl").await.unwrap();
        assert_eq!(
            (canceled.operation.kind, canceled.operation.status),
            (OperationKind::Cancel, OperationStatus::Succeeded)
        );
        let after = canceled.charge.unwrap();
        assert_eq!(
            (after.status, after.failure_code.as_deref()),
            (ChargeStatus::Failed, Some("canceled"))
        );
        assert_eq!(client.cancel(&auth.id, "c-cnl").await.unwrap().operation.id, canceled.operation.id);
        let again = client.capture(&auth.id, None, "USD", "c-cap").await;
        assert!(matches!(&again, Err(ProviderError::Rejected(r)) if r.status == 400 && r.code == "charge_not_capturable"), "{again:?}");

        let paid = charge_of(client.create_charge(&charge_request("d", true)).await);
        let (status, _) = sim.post(&format!("/sim/charges/{}/dispute", paid.id), json!({})).await;
        assert_eq!(status, StatusCode::OK);
        let disputed = client.refund(&paid.id, 100, "USD", "d-ref").await;
        assert!(matches!(&disputed, Err(ProviderError::Rejected(r)) if r.status == 400 && r.code == "charge_disputed"), "{disputed:?}");
        let not_cancelable = client.cancel(&paid.id, "d-cnl").await;
        assert!(matches!(&not_cancelable, Err(ProviderError::Rejected(r)) if r.code == "charge_not_cancelable"), "{not_cancelable:?}");
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn without_the_lookup_routes_a_lookup_by_key_is_a_bare_404_not_none() {
    bounded(async {
        let sim = RunningSim::start(SimConfig::default()).await;
        let client = client(&sim.base);
        let charge = charge_of(client.create_charge(&charge_request("l", true)).await);
        client.refund(&charge.id, 100, "USD", "l-ref").await.unwrap();
        sim.set_faults(json!({"lookup_disabled": true})).await;
        for answer in [
            client.find_charge_by_key("l").await.map(|c| c.is_some()),
            client.find_operation_by_key("l-ref").await.map(|o| o.is_some()),
        ] {
            assert!(
                matches!(&answer, Err(ProviderError::Rejected(r)) if r.status == 404 && r.code == "http_404"),
                "{answer:?}"
            );
        }
        assert!(client.get_charge(&charge.id).await.unwrap().is_some());
        sim.set_faults(json!({"lookup_disabled": false})).await;
        assert!(client.find_charge_by_key("l").await.unwrap().is_some());
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_key_whose_first_request_still_runs_answers_409_and_the_client_does_not_call_it_refused()
{
    bounded(async {
        let sim = RunningSim::start(SimConfig::default()).await;
        sim.set_faults(json!({"latency_ms": 600, "key_in_use_conflict": true}))
            .await;
        let first = {
            let client = client(&sim.base);
            tokio::spawn(async move { client.create_charge(&charge_request("busy", true)).await })
        };
        tokio::time::sleep(Duration::from_millis(150)).await;
        // Two quick attempts, both inside the first request's latency.
        let second = client_with(&sim.base, 2, 2_000)
            .create_charge(&charge_request("busy", true))
            .await;
        assert!(
            matches!(&second, ChargeOutcome::Unknown { reason } if reason.contains("409")),
            "{second:?}"
        );
        let first = charge_of(first.await.unwrap());
        assert_eq!(sim.sim.charges().len(), 1);
        // Once the first has answered, the key replays.
        sim.set_faults(json!({"latency_ms": 0})).await;
        let replay = charge_of(
            client(&sim.base)
                .create_charge(&charge_request("busy", true))
                .await,
        );
        assert_eq!(replay.id, first.id);

        // Without the fault, a concurrent request waits its turn and replays.
        sim.set_faults(json!({"latency_ms": 400, "key_in_use_conflict": false}))
            .await;
        let slow = {
            let client = client(&sim.base);
            tokio::spawn(async move { client.create_charge(&charge_request("calm", true)).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let calm = charge_of(
            client_with(&sim.base, 1, 2_000)
                .create_charge(&charge_request("calm", true))
                .await,
        );
        assert_eq!(calm.id, charge_of(slow.await.unwrap()).id);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_provider_refuses_connections_then_comes_back_with_everything() {
    bounded(async {
        let sim = RunningSim::start(SimConfig::default()).await;
        let client = client(&sim.base);
        let before = charge_of(client.create_charge(&charge_request("u1", true)).await);
        sim.set_faults(json!({"unreachable_ms": 500})).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        let during = client_with(&sim.base, 1, 2_000)
            .create_charge(&charge_request("u2", true))
            .await;
        assert!(
            matches!(&during, ChargeOutcome::Unknown { reason } if reason.contains("could not connect")),
            "{during:?}"
        );
        assert!(started.elapsed() < Duration::from_millis(400), "refused, not hung");
        // A refund whose retries outlast the period gets through.
        let patient = HttpProvider::new(
            "sim",
            &sim.base,
            ClientConfig {
                attempts_max: 12,
                backoff_base_ms: 100,
                backoff_max_ms: 200,
                ..ClientConfig::default()
            },
        )
        .unwrap();
        let refund = patient.refund(&before.id, 1_000, "USD", "u1-ref").await.unwrap();
        assert_eq!(refund.operation.status, OperationStatus::Succeeded);
        assert!(started.elapsed() >= Duration::from_millis(350), "{:?}", started.elapsed());
        assert_eq!(
            client.get_charge(&before.id).await.unwrap().unwrap().amount_refunded,
            1_000,
            "state kept across the period"
        );
        assert_eq!(sim.sim.charges().len(), 1, "the refused charge never arrived");
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn mounted_the_provider_routes_answer_503_while_control_stays_up() {
    bounded(async {
        let sim = Simulator::new(SimConfig::default());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, Router::new().merge(sim.mounted_router())).await
        });
        let base = format!("http://{addr}/sim");
        let client = client_with(&base, 2, 2_000);
        let before = charge_of(client.create_charge(&charge_request("m1", true)).await);
        let http = reqwest::Client::new();
        let faults = http
            .post(format!("{base}/faults"))
            .json(&json!({"unreachable_ms": 400}))
            .send()
            .await
            .unwrap();
        assert!(faults.status().is_success());
        let during = client.create_charge(&charge_request("m2", true)).await;
        assert!(
            matches!(&during, ChargeOutcome::Unknown { reason } if reason.contains("503")),
            "{during:?}"
        );
        let control = http.get(format!("{base}/faults")).send().await.unwrap();
        assert_eq!(control.status().as_u16(), 200, "control stays reachable");
        tokio::time::sleep(Duration::from_millis(450)).await;
        assert_eq!(
            client.get_charge(&before.id).await.unwrap().unwrap().id,
            before.id
        );
        charge_of(client.create_charge(&charge_request("m2", true)).await);
        server.abort();
    })
    .await;
}
