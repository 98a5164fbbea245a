//! The client against a scripted provider over loopback (a real axum server
//! on 127.0.0.1:0) that breaks answers mid-body and answers 409 and 4xx on
//! retries: once an attempt may have reached the provider, no later refusal
//! of the same call is reported as one.

// A test harness: helpers outside `#[test]` functions may panic too.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use asiento_psp::{
    Capabilities, ChargeOutcome, ClientConfig, CreateCharge, HttpProvider, Provider, ProviderError,
};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use chrono::Utc;
use serde_json::json;
use tokio::net::TcpListener;

const TEST_TIMEOUT_S: u64 = 20;

/// One scripted answer.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// 200 and half a charge, then the connection breaks.
    BreakMidBody,
    /// An error status with this code.
    Status(u16, &'static str),
    /// 200 and a whole charge.
    Charge,
}

#[derive(Clone)]
struct Script {
    steps: Arc<Vec<Step>>,
    keys: Arc<Mutex<Vec<String>>>,
}

fn charge_json(key: &str) -> serde_json::Value {
    let now = Utc::now();
    json!({"id": "ch_scripted", "status": "succeeded", "amount_minor": 10_000,
        "currency": "USD", "amount_captured": 10_000, "amount_refunded": 0,
        "idempotency_key": key, "created": now, "updated": now})
}

async fn answer(State(script): State<Script>, headers: HeaderMap) -> Response {
    let key = headers
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let n = {
        let mut keys = script.keys.lock().unwrap();
        keys.push(key.clone());
        keys.len() - 1
    };
    match script.steps[n.min(script.steps.len() - 1)] {
        Step::BreakMidBody => {
            let whole = serde_json::to_vec(&charge_json(&key)).unwrap();
            let half = Bytes::copy_from_slice(&whole[..whole.len() / 2]);
            let parts: Vec<Result<Bytes, std::io::Error>> = vec![
                Ok(half),
                Err(std::io::Error::other("connection broken on purpose")),
            ];
            let body = Body::from_stream(futures::stream::iter(parts));
            (StatusCode::OK, [("content-type", "application/json")], body).into_response()
        }
        Step::Status(status, code) => {
            let body = json!({"error": {"type": "invalid_request_error", "code": code, "message": "scripted"}});
            (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response()
        }
        Step::Charge => axum::Json(charge_json(&key)).into_response(),
    }
}

/// A provider answering `POST /v1/charges` and `POST /v1/refunds` by
/// `steps`, one per attempt; the keys of every attempt are recorded.
async fn scripted(steps: Vec<Step>) -> (String, Arc<Mutex<Vec<String>>>) {
    let keys = Arc::new(Mutex::new(Vec::new()));
    let state = Script {
        steps: Arc::new(steps),
        keys: Arc::clone(&keys),
    };
    let app = Router::new()
        .route("/v1/charges", post(answer))
        .route("/v1/refunds", post(answer))
        .with_state(state);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, keys)
}

fn client(base: &str, attempts_max: u32) -> HttpProvider {
    let config = ClientConfig {
        connect_timeout_ms: 500,
        request_timeout_ms: 2_000,
        attempts_max,
        backoff_base_ms: 2,
        backoff_max_ms: 5,
        ..ClientConfig::default()
    };
    HttpProvider::new("scripted", base, config).unwrap()
}

fn charge_request(key: &str) -> CreateCharge {
    CreateCharge {
        idempotency_key: key.to_string(),
        amount_minor: 10_000,
        currency: "USD".to_string(),
        payment_method: "pm_card_ok".to_string(),
        capture: true,
        reference: Some(format!("pay_{key}")),
        customer: None,
        metadata: BTreeMap::new(),
    }
}

async fn bounded<F: std::future::Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(TEST_TIMEOUT_S), test)
        .await
        .expect("test took too long");
}

#[tokio::test]
async fn a_charge_whose_first_attempt_broke_mid_answer_and_whose_retry_got_409_is_not_declined() {
    bounded(async {
        let (base, keys) = scripted(vec![
            Step::BreakMidBody,
            Step::Status(409, "idempotency_key_in_use"),
            Step::Status(402, "card_declined"),
        ])
        .await;
        let outcome = client(&base, 4)
            .create_charge(&charge_request("k-broken"))
            .await;
        match &outcome {
            ChargeOutcome::Unknown { reason } => {
                assert!(reason.contains("earlier attempt may have reached"), "{reason}");
                assert!(reason.contains("card_declined"), "{reason}");
            }
            other => panic!("reported as {other:?}, not unknown"),
        }
        let keys = keys.lock().unwrap().clone();
        assert_eq!(keys, ["k-broken"; 3], "the same key on every attempt, and no more");

        // The broken answer alone is enough.
        let (base, _) = scripted(vec![Step::BreakMidBody, Step::Status(402, "card_declined")]).await;
        let outcome = client(&base, 4).create_charge(&charge_request("k-b")).await;
        assert!(
            matches!(&outcome, ChargeOutcome::Unknown { reason } if reason.contains("earlier attempt")),
            "{outcome:?}"
        );

        // The same refusal on a first attempt is one.
        let (base, _) = scripted(vec![Step::Status(402, "card_declined")]).await;
        let outcome = client(&base, 4).create_charge(&charge_request("k-402")).await;
        assert!(
            matches!(&outcome, ChargeOutcome::Rejected(r) if r.status == 402 && r.code == "card_declined"),
            "{outcome:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_409_is_retried_with_the_same_key_and_is_unknown_when_the_retries_run_out() {
    bounded(async {
        let (base, keys) = scripted(vec![
            Step::Status(409, "idempotency_key_in_use"),
            Step::Status(409, "idempotency_key_in_use"),
            Step::Charge,
        ])
        .await;
        let outcome = client(&base, 4).create_charge(&charge_request("k-409")).await;
        assert!(
            matches!(&outcome, ChargeOutcome::Succeeded(c) if c.id == "ch_scripted"),
            "{outcome:?}"
        );
        assert_eq!(keys.lock().unwrap().as_slice(), ["k-409"; 3]);

        let (base, keys) = scripted(vec![Step::Status(409, "idempotency_key_in_use")]).await;
        let outcome = client(&base, 3).create_charge(&charge_request("k-409s")).await;
        assert!(
            matches!(&outcome, ChargeOutcome::Unknown { reason } if reason.contains("3 attempt") && reason.contains("409")),
            "{outcome:?}"
        );
        assert_eq!(keys.lock().unwrap().len(), 3, "attempts_max bounds 409 retries");
    })
    .await;
}

#[tokio::test]
async fn a_refund_refused_after_a_5xx_is_unknown_but_a_first_refusal_is_rejected() {
    bounded(async {
        let (base, _) = scripted(vec![
            Step::Status(500, "api_error"),
            Step::Status(422, "refund_exceeds_captured"),
        ])
        .await;
        let answer = client(&base, 4).refund("ch_1", 500, "USD", "k-ref").await;
        assert!(
            matches!(&answer, Err(ProviderError::Unknown { reason }) if reason.contains("refund_exceeds_captured")),
            "{answer:?}"
        );

        let (base, _) = scripted(vec![Step::Status(422, "refund_exceeds_captured")]).await;
        let answer = client(&base, 4).refund("ch_1", 500, "USD", "k-ref").await;
        assert!(
            matches!(&answer, Err(ProviderError::Rejected(r)) if r.code == "refund_exceeds_captured"),
            "{answer:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn without_lookup_by_key_the_lookups_are_unsupported_without_a_call() {
    bounded(async {
        // Nothing listens on port 1: a call would end unknown, not unsupported.
        let config = ClientConfig {
            capabilities: Capabilities {
                lookup_by_key: false,
                ..Capabilities::SIM
            },
            attempts_max: 1,
            ..ClientConfig::default()
        };
        let client = HttpProvider::new("nolookup", "http://127.0.0.1:1", config).unwrap();
        assert!(!client.capabilities().lookup_by_key);
        assert!(matches!(
            client.find_charge_by_key("k").await,
            Err(ProviderError::Unsupported { .. })
        ));
        assert!(matches!(
            client.find_operation_by_key("k").await,
            Err(ProviderError::Unsupported { .. })
        ));
        // Reads by id are still attempted (and fail as unknown here).
        assert!(matches!(
            client.get_operation("re_1").await,
            Err(ProviderError::Unknown { .. })
        ));
        let sim = HttpProvider::new("sim", "http://127.0.0.1:1", ClientConfig::default()).unwrap();
        assert_eq!(sim.capabilities(), Capabilities::SIM);
        let defaults = sim.capabilities();
        assert_eq!(defaults.key_lifetime, Duration::from_secs(24 * 60 * 60));
        assert!(defaults.lookup_by_key && defaults.lookup_by_id && !defaults.async_modifications);
    })
    .await;
}
