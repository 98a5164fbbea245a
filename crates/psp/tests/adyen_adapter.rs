//! `AdyenProvider` against the simulator's Adyen dialect over real HTTP on loopback, through a
//! recording proxy: every request the adapter sends is checked against its request schema in
//! Adyen's Checkout v71 document (`PaymentRequest`, `PaymentCaptureRequest`,
//! `PaymentRefundRequest`, `PaymentCancelRequest`, `StandalonePaymentCancelRequest`) and must
//! carry `X-API-Key` and an `Idempotency-Key`; every answer the dialect gave it against its
//! response schema (or `ServiceError`). The proxy can also answer in the dialect's place, for
//! the error bodies a simulator does not give.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use asiento_psp::adyen::{AdyenAccount, AdyenProvider};
use asiento_psp::{
    ChargeOutcome, ChargeStatus, ClientConfig, CreateCharge, OperationKind, OperationStatus,
    Provider, ProviderError,
};
use asiento_psp_sim::Dialect;
use asiento_psp_sim::SimConfig;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use common::adyen_schema::checkout;
use common::{bounded, RunningSim};

const API_KEY: &str = "AQE_adapter_test_key";
const MERCHANT: &str = "AsientoECOM";
const RETURN_URL: &str = "https://shop.example/return";
/// The simulator's `pm_card_slow` answers this late.
const SLOW_MS: u64 = 400;

/// One request the adapter sent, and what it got.
#[derive(Clone, Debug)]
struct Seen {
    method: Method,
    path: String,
    headers: HeaderMap,
    body: Bytes,
    status: StatusCode,
    answer: Bytes,
    /// Answered by the proxy itself, not the dialect.
    injected: bool,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    fn key(&self) -> &str {
        self.header("idempotency-key").unwrap()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    fn answer_json(&self) -> Value {
        serde_json::from_slice(&self.answer).unwrap_or(Value::Null)
    }
}

/// An answer the proxy gives instead of forwarding.
struct Injected {
    status: StatusCode,
    body: &'static str,
}

#[derive(Default)]
struct Recording {
    seen: Vec<Seen>,
    inject: VecDeque<Injected>,
}

#[derive(Clone)]
struct ProxyState {
    target: String,
    http: reqwest::Client,
    recording: Arc<Mutex<Recording>>,
}

async fn forward(
    State(proxy): State<ProxyState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let injected = proxy.recording.lock().unwrap().inject.pop_front();
    let (status, answer_headers, answer, injected) = match injected {
        Some(Injected { status, body }) => {
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert("content-type", "application/json".parse().unwrap());
            (status, headers, Bytes::from_static(body.as_bytes()), true)
        }
        None => {
            let mut request = proxy
                .http
                .request(method.clone(), format!("{}{uri}", proxy.target));
            for (name, value) in &headers {
                if name != "host" && name != "content-length" {
                    request = request.header(name, value);
                }
            }
            let response = request.body(body.clone()).send().await.unwrap();
            let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
            let headers = response.headers().clone();
            (status, headers, response.bytes().await.unwrap(), false)
        }
    };
    proxy.recording.lock().unwrap().seen.push(Seen {
        method,
        path: uri.path().to_owned(),
        headers,
        body,
        status,
        answer: answer.clone(),
        injected,
    });
    let mut response = (status, answer).into_response();
    for name in ["content-type", "idempotency-key", "transient-error"] {
        if let Some(value) = answer_headers.get(name) {
            response.headers_mut().insert(name, value.clone());
        }
    }
    response
}

/// The dialect, a recording proxy in front of it, and the adapter pointed at the proxy.
struct Rig {
    sim: RunningSim,
    proxy: String,
    recording: Arc<Mutex<Recording>>,
}

impl Rig {
    async fn start() -> Rig {
        let sim = RunningSim::start(SimConfig {
            dialect: Dialect::Adyen,
            modification_delay_ms: 30,
            slow_ms: SLOW_MS,
            hang_ms: 5_000,
            ..SimConfig::default()
        })
        .await;
        let recording = Arc::new(Mutex::new(Recording::default()));
        let state = ProxyState {
            target: sim.base.clone(),
            http: reqwest::Client::new(),
            recording: Arc::clone(&recording),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new().fallback(forward).with_state(state);
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Rig {
            sim,
            proxy,
            recording,
        }
    }

    fn adapter(
        &self,
        attempts_max: u32,
        backoff_base_ms: u64,
        backoff_max_ms: u64,
    ) -> AdyenProvider {
        let config = ClientConfig {
            connect_timeout_ms: 500,
            request_timeout_ms: 3_000,
            attempts_max,
            backoff_base_ms,
            backoff_max_ms,
            ..ClientConfig::default()
        };
        let account = AdyenAccount {
            merchant_account: MERCHANT.to_owned(),
            return_url: RETURN_URL.to_owned(),
        };
        AdyenProvider::new("adyen", &self.proxy, API_KEY, account, config).unwrap()
    }

    /// An adapter that retries a few times, quickly.
    fn quick(&self) -> AdyenProvider {
        self.adapter(3, 5, 20)
    }

    fn inject(&self, status: StatusCode, body: &'static str) {
        self.recording
            .lock()
            .unwrap()
            .inject
            .push_back(Injected { status, body });
    }

    fn seen(&self) -> Vec<Seen> {
        self.recording.lock().unwrap().seen.clone()
    }

    /// Every request seen so far, checked; returns them.
    fn checked(&self) -> Vec<Seen> {
        let seen = self.seen();
        for request in &seen {
            check_request(request);
        }
        seen
    }

    async fn truth(&self, path: &str) -> Vec<Value> {
        let answer: Value = reqwest::get(format!("{}/sim/{path}", self.sim.base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        answer["data"].as_array().unwrap().clone()
    }

    async fn charge(&self, psp: &str) -> Value {
        self.truth("charges")
            .await
            .into_iter()
            .find(|charge| charge["id"] == psp)
            .unwrap_or_else(|| panic!("no charge {psp} in the simulator"))
    }

    /// Polls until the simulator holds `count` charges.
    async fn charges_until(&self, count: usize) {
        for _ in 0..250 {
            if self.truth("charges").await.len() >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the simulator never held {count} charges");
    }

    /// Polls the simulator's charge until `done` holds.
    async fn charge_until(&self, psp: &str, done: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..250 {
            let charge = self.charge(psp).await;
            if done(&charge) {
                return charge;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("charge {psp} never got there: {}", self.charge(psp).await);
    }
}

/// The request schema of a path the adapter posts to, and the schema of its success.
fn schemas_of(path: &str) -> (&'static str, &'static str) {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segments.as_slice() {
        ["v71", "payments"] => ("PaymentRequest", "PaymentResponse"),
        ["v71", "payments", _, "captures"] => ("PaymentCaptureRequest", "PaymentCaptureResponse"),
        ["v71", "payments", _, "refunds"] => ("PaymentRefundRequest", "PaymentRefundResponse"),
        ["v71", "payments", _, "cancels"] => ("PaymentCancelRequest", "PaymentCancelResponse"),
        ["v71", "cancels"] => (
            "StandalonePaymentCancelRequest",
            "StandalonePaymentCancelResponse",
        ),
        _ => panic!("the adapter posted to a path of no Checkout v71 route: {path}"),
    }
}

/// What every request the adapter sends must be: a POST to a Checkout v71 route with Adyen's
/// API key, an idempotency key Adyen accepts, a JSON body valid under the route's request
/// schema; and the dialect's answer valid under its response schema.
fn check_request(seen: &Seen) {
    assert_eq!(seen.method, Method::POST, "{}", seen.path);
    let (request, response) = schemas_of(&seen.path);
    assert_eq!(seen.header("x-api-key"), Some(API_KEY), "{}", seen.path);
    let key = seen
        .header("idempotency-key")
        .unwrap_or_else(|| panic!("no Idempotency-Key on {}", seen.path));
    assert!(
        !key.is_empty() && key.len() <= 64,
        "Adyen takes keys of at most 64 characters: {key:?}"
    );
    assert_eq!(seen.header("content-type"), Some("application/json"));
    checkout().assert_valid(request, &seen.json());
    if seen.injected {
        return;
    }
    let answer = seen.answer_json();
    if seen.status.is_success() {
        checkout().assert_valid(response, &answer);
    } else {
        checkout().assert_valid("ServiceError", &answer);
    }
}

fn charge(key: &str, method: &str, capture: bool) -> CreateCharge {
    CreateCharge {
        idempotency_key: key.to_owned(),
        amount_minor: 1_000,
        currency: "eur".to_owned(),
        payment_method: method.to_owned(),
        capture,
        reference: Some(format!("pay_{key}")),
        customer: Some("42".to_owned()),
        metadata: BTreeMap::from([("order".to_owned(), "A-17".to_owned())]),
    }
}

#[tokio::test]
async fn an_authorisation_succeeds_with_automatic_capture_and_is_authorized_with_manual() {
    bounded(async {
        let rig = Rig::start().await;
        let adyen = rig.quick();
        let ChargeOutcome::Succeeded(auto) = adyen
            .create_charge(&charge("k-auto", "pm_card_ok", true))
            .await
        else {
            panic!("pm_card_ok is authorised");
        };
        assert_eq!(auto.id.len(), 16, "a pspReference: {}", auto.id);
        assert_eq!(auto.status, ChargeStatus::Succeeded);
        assert_eq!((auto.amount_minor, auto.amount_captured), (1_000, 1_000));
        assert_eq!(auto.currency, "EUR");
        assert_eq!(auto.reference.as_deref(), Some("pay_k-auto"));
        assert_eq!(auto.idempotency_key, "k-auto");
        assert!(auto.capture);
        let ChargeOutcome::Authorized(manual) = adyen
            .create_charge(&charge("k-manual", "pm_card_ok", false))
            .await
        else {
            panic!("manual capture is authorised, not captured");
        };
        assert_eq!(manual.status, ChargeStatus::RequiresCapture);
        assert_eq!((manual.amount_minor, manual.amount_captured), (1_000, 0));
        assert_ne!(manual.id, auto.id);
        // The customer is the shopper, when Adyen can take its id as a shopperReference.
        let mut shopper = charge("k-shopper", "pm_card_ok", true);
        shopper.customer = Some("shopper-42".to_owned());
        assert!(matches!(
            adyen.create_charge(&shopper).await,
            ChargeOutcome::Succeeded(_)
        ));

        let seen = rig.checked();
        assert_eq!(seen.len(), 3);
        let (auto_body, manual_body) = (seen[0].json(), seen[1].json());
        assert_eq!(seen[2].json()["shopperReference"], "shopper-42");
        assert_eq!(seen[2].json()["shopperInteraction"], "ContAuth");
        assert_eq!(seen[2].json()["recurringProcessingModel"], "CardOnFile");
        assert!(
            auto_body.get("shopperReference").is_none(),
            "Adyen takes no shopperReference of 2 characters: {auto_body}"
        );
        assert_eq!(seen[0].key(), "k-auto");
        assert_eq!(
            auto_body["amount"],
            json!({"currency": "EUR", "value": 1_000})
        );
        assert_eq!(auto_body["merchantAccount"], MERCHANT);
        assert_eq!(auto_body["reference"], "pay_k-auto");
        assert_eq!(auto_body["returnUrl"], RETURN_URL);
        assert_eq!(
            auto_body["paymentMethod"],
            json!({"type": "scheme", "storedPaymentMethodId": "pm_card_ok"})
        );
        assert_eq!(auto_body["captureDelayHours"], 0);
        assert!(auto_body.get("additionalData").is_none(), "{auto_body}");
        assert_eq!(auto_body["metadata"], json!({"order": "A-17"}));
        assert_eq!(
            manual_body["additionalData"],
            json!({"manualCapture": "true"})
        );
        assert!(
            manual_body.get("captureDelayHours").is_none(),
            "{manual_body}"
        );

        assert_eq!(rig.charge(&auto.id).await["status"], "succeeded");
        let held = rig.charge(&manual.id).await;
        assert_eq!(
            (held["status"].as_str(), held["amount_captured"].as_i64()),
            (Some("requires_capture"), Some(0))
        );
        rig.sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_refusal_is_declined_with_adyen_s_reason() {
    bounded(async {
        let rig = Rig::start().await;
        let adyen = rig.quick();
        let ChargeOutcome::Declined(declined) = adyen
            .create_charge(&charge("k-declined", "pm_card_declined", true))
            .await
        else {
            panic!("pm_card_declined is refused");
        };
        assert_eq!(declined.status, ChargeStatus::Failed);
        assert_eq!(declined.failure_code.as_deref(), Some("Refused"));
        assert_eq!(declined.amount_captured, 0);
        assert_eq!(declined.id.len(), 16);
        let seen = rig.checked();
        assert_eq!(seen.len(), 1);
        assert_eq!(
            seen[0].status,
            StatusCode::OK,
            "a refusal is a 200 at Adyen"
        );
        assert_eq!(seen[0].answer_json()["resultCode"], "Refused");
        assert_eq!(rig.charge(&declined.id).await["status"], "failed");
        rig.sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_redirect_is_an_action_with_its_url() {
    bounded(async {
        let rig = Rig::start().await;
        let adyen = rig.quick();
        let ChargeOutcome::RequiresAction(waiting) = adyen
            .create_charge(&charge("k-redirect", "pm_redirect", true))
            .await
        else {
            panic!("pm_redirect asks the shopper");
        };
        assert_eq!(waiting.status, ChargeStatus::RequiresAction);
        let action = waiting.next_action.unwrap();
        assert_eq!(action.kind, "redirect");
        assert!(
            action.redirect_url.starts_with("http://") && action.redirect_url.contains(&waiting.id),
            "{}",
            action.redirect_url
        );
        let seen = rig.checked();
        assert_eq!(seen[0].answer_json()["resultCode"], "RedirectShopper");
        assert_eq!(rig.charge(&waiting.id).await["status"], "requires_action");
        rig.sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn captures_refunds_and_cancels_are_received_as_pending_operations_then_decided() {
    bounded(async {
        let rig = Rig::start().await;
        let adyen = rig.quick();
        let ChargeOutcome::Authorized(held) = adyen
            .create_charge(&charge("k-capture", "pm_card_ok", false))
            .await
        else {
            panic!("authorised");
        };
        let capture = adyen
            .capture(&held.id, Some(600), "eur", "k-capture_capture")
            .await
            .unwrap();
        let op = &capture.operation;
        assert_eq!(op.kind, OperationKind::Capture);
        assert_eq!(op.status, OperationStatus::Pending);
        assert_eq!(op.charge, held.id);
        assert_eq!(op.id.len(), 16);
        assert_ne!(op.id, held.id, "a capture has a pspReference of its own");
        assert_eq!((op.amount_minor, op.currency.as_str()), (600, "EUR"));
        assert_eq!(op.idempotency_key, "k-capture_capture");
        assert!(
            capture.charge.is_none(),
            "Adyen says nothing of the payment"
        );

        let ChargeOutcome::Succeeded(paid) = adyen
            .create_charge(&charge("k-refund", "pm_card_ok", true))
            .await
        else {
            panic!("authorised");
        };
        let refund = adyen
            .refund(&paid.id, 250, "EUR", "k-refund_refund_1")
            .await
            .unwrap();
        let op = &refund.operation;
        assert_eq!(
            (op.kind, op.status),
            (OperationKind::Refund, OperationStatus::Pending)
        );
        assert_eq!(
            (op.charge.as_str(), op.amount_minor),
            (paid.id.as_str(), 250)
        );
        assert_eq!(op.idempotency_key, "k-refund_refund_1");

        let ChargeOutcome::Authorized(abandoned) = adyen
            .create_charge(&charge("k-cancel", "pm_card_ok", false))
            .await
        else {
            panic!("authorised");
        };
        let cancel = adyen
            .cancel(&abandoned.id, "k-cancel_cancel")
            .await
            .unwrap();
        let op = &cancel.operation;
        assert_eq!(
            (op.kind, op.status),
            (OperationKind::Cancel, OperationStatus::Pending)
        );
        assert_eq!(op.charge, abandoned.id);

        let seen = rig.checked();
        let paths: Vec<String> = seen.iter().map(|seen| seen.path.clone()).collect();
        assert_eq!(
            paths,
            [
                "/v71/payments".to_owned(),
                format!("/v71/payments/{}/captures", held.id),
                "/v71/payments".to_owned(),
                format!("/v71/payments/{}/refunds", paid.id),
                "/v71/payments".to_owned(),
                format!("/v71/payments/{}/cancels", abandoned.id),
            ]
        );
        for (index, amount) in [(1, Some(600)), (3, Some(250)), (5, None)] {
            assert_eq!(seen[index].status, StatusCode::CREATED);
            assert_eq!(seen[index].answer_json()["status"], "received");
            let body = seen[index].json();
            assert_eq!(body["merchantAccount"], MERCHANT);
            assert_eq!(
                body["reference"],
                seen[index].key(),
                "the PSP key is the reference"
            );
            match amount {
                Some(value) => {
                    assert_eq!(body["amount"], json!({"currency": "EUR", "value": value}))
                }
                None => assert!(body.get("amount").is_none(), "{body}"),
            }
        }

        // The dialect decides what it received: the capture and the refund of what was asked,
        // and the cancel.
        let captured = rig
            .charge_until(&held.id, |c| c["amount_captured"] == 600)
            .await;
        assert_eq!(captured["status"], "succeeded");
        rig.charge_until(&paid.id, |c| c["amount_refunded"] == 250)
            .await;
        rig.charge_until(&abandoned.id, |c| c["status"] == "failed")
            .await;
        rig.sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_request_sent_again_under_its_key_is_the_same_payment_and_the_same_refund() {
    bounded(async {
        let rig = Rig::start().await;
        let adyen = rig.quick();
        let ask = charge("k-again", "pm_card_ok", true);
        let ChargeOutcome::Succeeded(first) = adyen.create_charge(&ask).await else {
            panic!("authorised");
        };
        let ChargeOutcome::Succeeded(again) = adyen.create_charge(&ask).await else {
            panic!("the replay answers the first answer");
        };
        assert_eq!(again.id, first.id, "one pspReference for one key");
        let refund = adyen
            .refund(&first.id, 300, "EUR", "k-again_refund_1")
            .await
            .unwrap();
        let refund_again = adyen
            .refund(&first.id, 300, "EUR", "k-again_refund_1")
            .await
            .unwrap();
        assert_eq!(refund_again.operation.id, refund.operation.id);

        let seen = rig.checked();
        assert_eq!(seen.len(), 4);
        // Adyen documents no check of the body under a key: the adapter sends the same bytes.
        assert_eq!(
            (seen[0].key(), &seen[0].body),
            (seen[1].key(), &seen[1].body)
        );
        assert_eq!(seen[0].answer, seen[1].answer, "replayed byte for byte");
        assert_eq!(
            (seen[2].key(), &seen[2].body),
            (seen[3].key(), &seen[3].body)
        );
        assert_eq!(rig.truth("charges").await.len(), 1, "no second payment");
        rig.charge_until(&first.id, |c| c["amount_refunded"] == 300)
            .await;
        let refunds: Vec<Value> = rig
            .truth("operations")
            .await
            .into_iter()
            .filter(|op| op["kind"] == "refund")
            .collect();
        assert_eq!(refunds.len(), 1, "no second refund: {refunds:?}");
        rig.sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_key_whose_first_request_still_runs_is_retried_never_refused() {
    bounded(async {
        let rig = Rig::start().await;
        let ask = charge("k-slow", "pm_card_slow", true);
        let first = {
            let adyen = rig.quick();
            let ask = ask.clone();
            tokio::spawn(async move { adyen.create_charge(&ask).await })
        };
        // The proxy records a request when it is answered; the dialect holds the first for
        // SLOW_MS with its charge made, so its charge says the first request is running.
        rig.charges_until(1).await;

        // Retries spread over far longer than the first request runs (each waits up to 100 ms,
        // 29 of them), so the last ones find its answer stored.
        let patient = rig.adapter(30, 20, 100);
        let ChargeOutcome::Succeeded(second) = patient.create_charge(&ask).await else {
            panic!("a 704 is retried until the first answer can be replayed");
        };
        let ChargeOutcome::Succeeded(first) = first.await.unwrap() else {
            panic!("pm_card_slow is authorised, late");
        };
        assert_eq!(second.id, first.id);
        let seen = rig.checked();
        let busy: Vec<&Seen> = seen
            .iter()
            .filter(|seen| seen.answer_json()["errorCode"] == "704")
            .collect();
        assert!(!busy.is_empty(), "the second call met 704: {seen:#?}");
        for answer in &busy {
            assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);
            assert_eq!(
                answer.answer_json()["message"],
                "request already processed or in progress"
            );
        }
        assert!(seen
            .iter()
            .all(|request| request.key() == "k-slow" && request.body == seen[0].body));
        assert_eq!(rig.truth("charges").await.len(), 1, "one payment");

        // When the retries run out while the first still runs, the charge is unknown, never
        // refused.
        let slow = charge("k-slow-2", "pm_card_slow", true);
        let running = {
            let adyen = rig.quick();
            let slow = slow.clone();
            tokio::spawn(async move { adyen.create_charge(&slow).await })
        };
        rig.charges_until(2).await;
        let impatient = rig.adapter(2, 1, 2);
        match impatient.create_charge(&slow).await {
            ChargeOutcome::Unknown { reason } => assert!(reason.contains("704"), "{reason}"),
            other => panic!("a key in progress is unknown, never refused: {other:?}"),
        }
        assert!(matches!(
            running.await.unwrap(),
            ChargeOutcome::Succeeded(_)
        ));
        rig.checked();
        rig.sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn adyen_s_error_bodies_are_refusals_with_their_code_and_5xx_is_unknown() {
    bounded(async {
        let rig = Rig::start().await;
        let adyen = rig.quick();
        // The dialect's own: a modification of a payment it does not have, a stored method it
        // does not know.
        let Err(ProviderError::Rejected(refused)) = adyen
            .capture("0000000000000000", Some(100), "EUR", "k-missing_capture")
            .await
        else {
            panic!("a capture of no payment is refused");
        };
        assert_eq!(
            (refused.status, refused.code.as_str(), refused.message.as_str()),
            (422, "167", "Original pspReference required for this operation")
        );
        let ChargeOutcome::Rejected(unknown_method) = adyen
            .create_charge(&charge("k-contract", "pm_nope", true))
            .await
        else {
            panic!("an unknown stored method is refused");
        };
        assert_eq!(
            (unknown_method.status, unknown_method.code.as_str(), unknown_method.message.as_str()),
            (422, "800", "Contract not found")
        );

        // Adyen's that the dialect does not give: a security error, the RFC 7807 shape of newer
        // APIs, and a 500 that may have had its effect.
        rig.inject(
            StatusCode::FORBIDDEN,
            r#"{"status":403,"errorCode":"901","message":"Invalid Merchant Account","errorType":"security"}"#,
        );
        let ChargeOutcome::Rejected(forbidden) = adyen
            .create_charge(&charge("k-forbidden", "pm_card_ok", true))
            .await
        else {
            panic!("a 403 is a refusal");
        };
        assert_eq!(
            (forbidden.status, forbidden.code.as_str(), forbidden.message.as_str()),
            (403, "901", "Invalid Merchant Account")
        );
        rig.inject(
            StatusCode::UNPROCESSABLE_ENTITY,
            r#"{"type":"https://docs.adyen.com/errors/validation","title":"Invalid request","status":422,"detail":"Amount is not valid","errorCode":"14_030"}"#,
        );
        let Err(ProviderError::Rejected(problem)) =
            adyen.refund("0000000000000001", 100, "EUR", "k-problem_refund_1").await
        else {
            panic!("a 422 problem is a refusal");
        };
        assert_eq!(
            (problem.status, problem.code.as_str(), problem.message.as_str()),
            (422, "14_030", "Amount is not valid")
        );
        let internal = r#"{"status":500,"errorCode":"000","message":"An internal error occurred","errorType":"internal"}"#;
        for _ in 0..3 {
            rig.inject(StatusCode::INTERNAL_SERVER_ERROR, internal);
        }
        let before = rig.seen().len();
        let ChargeOutcome::Unknown { reason } = adyen
            .create_charge(&charge("k-internal", "pm_card_ok", true))
            .await
        else {
            panic!("a 500 may have charged: unknown");
        };
        assert!(reason.contains("3 attempt"), "{reason}");
        let seen = rig.checked();
        assert_eq!(seen.len() - before, 3, "retried under the same key");
        assert!(seen[before..].iter().all(|request| request.key() == "k-internal"));
        // A 4xx after a 500 of the same call says nothing of the first attempt's effect.
        rig.inject(StatusCode::INTERNAL_SERVER_ERROR, internal);
        rig.inject(
            StatusCode::FORBIDDEN,
            r#"{"status":403,"errorCode":"901","message":"Invalid Merchant Account","errorType":"security"}"#,
        );
        assert!(matches!(
            adyen.create_charge(&charge("k-after-500", "pm_card_ok", true)).await,
            ChargeOutcome::Unknown { .. }
        ));
        assert_eq!(rig.truth("charges").await.len(), 0, "nothing was charged");
        rig.sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_payment_whose_answer_was_lost_is_cancelled_by_our_reference() {
    bounded(async {
        let rig = Rig::start().await;
        let adyen = rig.quick();
        let ChargeOutcome::Authorized(held) = adyen
            .create_charge(&charge("k-lost", "pm_card_ok", false))
            .await
        else {
            panic!("authorised");
        };
        let cancel = adyen
            .cancel_by_reference("pay_k-lost", "k-lost_technical_cancel")
            .await
            .unwrap();
        assert_eq!(cancel.len(), 16);
        assert_ne!(cancel, held.id, "the cancel has a pspReference of its own");
        let seen = rig.checked();
        let request = seen.last().unwrap();
        assert_eq!(request.path, "/v71/cancels");
        assert_eq!(
            request.json(),
            json!({"merchantAccount": MERCHANT, "paymentReference": "pay_k-lost",
                "reference": "k-lost_technical_cancel"})
        );
        assert_eq!(request.status, StatusCode::CREATED);
        assert_eq!(request.answer_json()["pspReference"], cancel.as_str());
        let cancelled = rig
            .charge_until(&held.id, |c| c["status"] == "failed")
            .await;
        assert_eq!(cancelled["amount_captured"], 0);
        rig.sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn lookups_are_unsupported_without_a_call() {
    bounded(async {
        let rig = Rig::start().await;
        let adyen = rig.quick();
        assert!(!adyen.capabilities().lookup_by_key);
        assert!(!adyen.capabilities().lookup_by_id);
        assert!(adyen.capabilities().async_modifications);
        let unsupported = |result: Result<(), ProviderError>| {
            assert!(
                matches!(result, Err(ProviderError::Unsupported { .. })),
                "{result:?}"
            );
        };
        unsupported(adyen.get_charge("QFQTPCQ8HXSKGK82").await.map(|_| ()));
        unsupported(adyen.find_charge_by_key("k-1").await.map(|_| ()));
        unsupported(adyen.get_operation("QFQTPCQ8HXSKGK83").await.map(|_| ()));
        unsupported(
            adyen
                .find_operation_by_key("k-1_refund_1")
                .await
                .map(|_| ()),
        );
        // A capture without an amount is not one Adyen takes: refused before any call.
        unsupported(
            adyen
                .capture("QFQTPCQ8HXSKGK82", None, "EUR", "k-1_capture")
                .await
                .map(|_| ()),
        );
        assert!(
            rig.seen().is_empty(),
            "no request reached Adyen: {:?}",
            rig.seen()
        );
        rig.sim.shutdown().await;
    })
    .await;
}
