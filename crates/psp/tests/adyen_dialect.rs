//! The simulator's Adyen dialect over real HTTP on loopback: every answer is validated against
//! its schema in Adyen's Checkout v71 document, and every notification the dialect delivers
//! against Adyen's Webhooks v1 document (the batch, and each item as its event code's), with
//! each item's HMAC checked. A small receiver on loopback checks basic auth, records the
//! batches and answers `[accepted]`.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use asiento_psp::adyen::hmac::verify_item;
use asiento_psp::adyen::wire::NotificationItem;
use asiento_psp::adyen::HmacKey;
use asiento_psp_sim::Dialect;
use asiento_psp_sim::SimConfig;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing;
use axum::Router;
use base64::Engine as _;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use common::adyen_schema::{checkout, webhooks};
use common::{bounded, eventually, RunningSim};

const API_KEY: &str = "AQE_test_key";
const MERCHANT: &str = "AsientoECOM";
const HMAC_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
const WEBHOOK_USER: &str = "adyen-webhooks";
const WEBHOOK_PASSWORD: &str = "s3cret:with:colons";
/// How long a modification waits for its decision in these tests.
const DECISION_MS: u64 = 40;

struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    raw: Bytes,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    fn psp(&self) -> String {
        self.body["pspReference"].as_str().unwrap().to_owned()
    }
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    let response = request.send().await.unwrap();
    let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
    let headers = response.headers().clone();
    let raw = response.bytes().await.unwrap();
    let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        raw,
        body,
    }
}

async fn post(sim: &RunningSim, path: &str, body: &Value, key: Option<&str>) -> Answer {
    let mut request = reqwest::Client::new()
        .post(format!("{}{path}", sim.base))
        .header("X-API-Key", API_KEY)
        .json(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    send(request).await
}

fn payment(holder: &str, value: i64, reference: &str) -> Value {
    json!({
        "merchantAccount": MERCHANT,
        "amount": {"currency": "EUR", "value": value},
        "reference": reference,
        "returnUrl": "https://shop.example/return",
        "paymentMethod": {
            "type": "scheme",
            "encryptedCardNumber": "test_4111111111111111",
            "encryptedExpiryMonth": "test_03",
            "encryptedExpiryYear": "test_2030",
            "encryptedSecurityCode": "test_737",
            "holderName": holder
        },
        "captureDelayHours": 0
    })
}

fn manual(mut body: Value) -> Value {
    let object = body.as_object_mut().unwrap();
    object.remove("captureDelayHours");
    object.insert("additionalData".into(), json!({"manualCapture": "true"}));
    body
}

fn stored(method: &str, value: i64, reference: &str) -> Value {
    json!({
        "merchantAccount": MERCHANT,
        "amount": {"currency": "EUR", "value": value},
        "reference": reference,
        "returnUrl": "https://shop.example/return",
        "paymentMethod": {"type": "scheme", "storedPaymentMethodId": method},
        "shopperReference": "shopper-42",
        "shopperInteraction": "ContAuth",
        "recurringProcessingModel": "CardOnFile"
    })
}

fn modification(value: Option<i64>, reference: &str) -> Value {
    let mut body = json!({"merchantAccount": MERCHANT, "reference": reference});
    if let Some(value) = value {
        body["amount"] = json!({"currency": "EUR", "value": value});
    }
    body
}

/// What the receiver saw.
#[derive(Default)]
struct Received {
    /// Every delivery: its Authorization header, its body, and whether it was accepted.
    deliveries: Vec<(Option<String>, Bytes, bool)>,
    /// Deliveries to answer 500 before accepting any.
    failures_left: usize,
}

type Receiver = Arc<Mutex<Received>>;

async fn receive(State(received): State<Receiver>, headers: HeaderMap, body: Bytes) -> Response {
    let authorization = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let mut received = received.lock().unwrap();
    let accepted = received.failures_left == 0;
    received.deliveries.push((authorization, body, accepted));
    if !accepted {
        received.failures_left -= 1;
        return (StatusCode::INTERNAL_SERVER_ERROR, "down").into_response();
    }
    (StatusCode::OK, "[accepted]").into_response()
}

async fn start_receiver(failures: usize) -> (String, Receiver) {
    let received: Receiver = Arc::new(Mutex::new(Received {
        failures_left: failures,
        ..Received::default()
    }));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhooks/adyen", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/webhooks/adyen", routing::post(receive))
        .with_state(Arc::clone(&received));
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (url, received)
}

fn config(url: Option<String>) -> SimConfig {
    SimConfig {
        dialect: Dialect::Adyen,
        webhook_url: url,
        webhook_hmac_key: HMAC_KEY.to_owned(),
        webhook_username: Some(WEBHOOK_USER.to_owned()),
        webhook_password: Some(WEBHOOK_PASSWORD.to_owned()),
        modification_delay_ms: DECISION_MS,
        webhook_backoff_base_ms: 20,
        webhook_backoff_max_ms: 200,
        slow_ms: 1_000,
        hang_ms: 1_000,
        ..SimConfig::default()
    }
}

async fn adyen_sim() -> (RunningSim, Receiver) {
    let (url, received) = start_receiver(0).await;
    (RunningSim::start(config(Some(url))).await, received)
}

/// Checks one delivered batch against Adyen's schemas and each item's HMAC, and returns its
/// items.
fn check_batch(authorization: Option<&str>, body: &[u8]) -> Vec<Value> {
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD
            .encode(format!("{WEBHOOK_USER}:{WEBHOOK_PASSWORD}"))
    );
    assert_eq!(authorization, Some(expected.as_str()), "basic auth");
    let batch: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(batch["live"], "false");
    let wrappers = batch["notificationItems"].as_array().unwrap().clone();
    assert!(!wrappers.is_empty() && wrappers.len() <= 100);
    // The generic NotificationRequest's item names an additionalData schema without
    // hmacSignature or disputeStatus (a gap in Adyen's document): the batch is checked against
    // it without the items' additionalData, which each item's own schema checks below.
    let mut envelope = batch.clone();
    for wrapper in envelope["notificationItems"].as_array_mut().unwrap() {
        wrapper["NotificationRequestItem"]
            .as_object_mut()
            .unwrap()
            .remove("additionalData");
    }
    webhooks().assert_valid("NotificationRequest", &envelope);
    let key = HmacKey::from_hex(HMAC_KEY).unwrap();
    wrappers
        .into_iter()
        .map(|wrapper| {
            let item = wrapper["NotificationRequestItem"].clone();
            let code = item["eventCode"].as_str().unwrap().to_owned();
            let spec = webhooks();
            spec.assert_valid(&spec.webhook_item(&code), &item);
            spec.assert_valid(
                &spec.webhook_request(&code),
                &json!({"live": "false", "notificationItems": [wrapper]}),
            );
            for field in ["success", "live"] {
                if let Some(value) = item.get(field) {
                    assert!(value.is_string(), "{field} is a string: {item}");
                }
            }
            let parsed: NotificationItem = serde_json::from_value(item.clone()).unwrap();
            verify_item(&key, &parsed).unwrap_or_else(|e| panic!("{e}: {item}"));
            chrono::DateTime::parse_from_rfc3339(&parsed.event_date).unwrap();
            item
        })
        .collect()
}

/// Every item delivered and accepted so far, checked.
fn items(received: &Receiver) -> Vec<Value> {
    let received = received.lock().unwrap();
    received
        .deliveries
        .iter()
        .filter(|(.., accepted)| *accepted)
        .flat_map(|(authorization, body, _)| check_batch(authorization.as_deref(), body))
        .collect()
}

/// Waits until an item with this event code and pspReference has arrived, and returns it.
async fn item_of(received: &Receiver, event_code: &str, psp_reference: &str) -> Value {
    let found = |received: &Receiver| {
        items(received)
            .into_iter()
            .find(|item| item["eventCode"] == event_code && item["pspReference"] == psp_reference)
    };
    assert!(
        eventually(5_000, || found(received).is_some()).await,
        "no {event_code} for {psp_reference}: {:#?}",
        items(received)
    );
    found(received).unwrap()
}

fn codes_for(received: &Receiver, original: &str) -> Vec<String> {
    items(received)
        .into_iter()
        .filter(|item| item["originalReference"] == original || item["pspReference"] == original)
        .map(|item| item["eventCode"].as_str().unwrap().to_owned())
        .collect()
}

async fn truth(sim: &RunningSim, psp: &str) -> Value {
    let all = send(reqwest::Client::new().get(format!("{}/sim/charges", sim.base))).await;
    all.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|charge| charge["id"] == psp)
        .cloned()
        .unwrap()
}

#[test]
fn the_schema_validator_refuses_what_adyen_s_schemas_refuse() {
    let checkout = checkout();
    let fine = json!({"pspReference": "QFQTPCQ8HXSKGK82", "resultCode": "Authorised"});
    checkout.assert_valid("PaymentResponse", &fine);
    let typo = json!({"pspReference": "QFQTPCQ8HXSKGK82", "resultcode": "Authorised"});
    assert!(!checkout.errors("PaymentResponse", &typo).is_empty());
    let bad_enum = json!({"resultCode": "Approved"});
    assert!(!checkout.errors("PaymentResponse", &bad_enum).is_empty());
    let missing = json!({"merchantAccount": MERCHANT, "pspReference": "X", "status": "received",
        "amount": {"currency": "EUR", "value": 1}});
    assert!(!checkout
        .errors("PaymentCaptureResponse", &missing)
        .is_empty());
    let nested_typo = json!({"merchantAccount": MERCHANT, "pspReference": "X", "status": "received",
        "paymentPspReference": "Y", "amount": {"currency": "EUR", "valu": 1}});
    assert!(!checkout
        .errors("PaymentCaptureResponse", &nested_typo)
        .is_empty());
    let webhooks = webhooks();
    let item = json!({"pspReference": "X", "merchantReference": "r", "merchantAccountCode": "m",
        "eventDate": "2021-01-01T01:00:00+01:00", "amount": {"currency": "EUR", "value": 1},
        "eventCode": "AUTHORISATION", "success": "true"});
    webhooks.assert_valid("AuthorisationNotificationRequestItem", &item);
    let mut with_original = item.clone();
    with_original["originalReference"] = json!("Y");
    assert!(!webhooks
        .errors("AuthorisationNotificationRequestItem", &with_original)
        .is_empty());
    let mut bad_date = item.clone();
    bad_date["eventDate"] = json!("yesterday");
    assert!(!webhooks
        .errors("AuthorisationNotificationRequestItem", &bad_date)
        .is_empty());
    let mut no_success = item.clone();
    no_success.as_object_mut().unwrap().remove("success");
    assert!(!webhooks
        .errors("AuthorisationNotificationRequestItem", &no_success)
        .is_empty());
    for (code, schema) in [
        ("AUTHORISATION", "AuthorisationNotificationRequestItem"),
        ("CAPTURE", "CaptureNotificationRequestItem"),
        ("REFUND", "RefundNotificationRequestItem"),
        ("CANCELLATION", "CancellationNotificationRequestItem"),
        ("TECHNICAL_CANCEL", "ModificationNotificationRequestItem"),
        (
            "CAPTURE_FAILED",
            "RefundCaptureFailedNotificationRequestItem",
        ),
        (
            "REFUND_FAILED",
            "RefundCaptureFailedNotificationRequestItem",
        ),
        ("REFUNDED_REVERSED", "ModificationNotificationRequestItem"),
        (
            "NOTIFICATION_OF_CHARGEBACK",
            "DisputesNotificationRequestItem",
        ),
        ("CHARGEBACK", "DisputesNotificationRequestItem"),
        ("CHARGEBACK_REVERSED", "DisputesNotificationRequestItem"),
        ("SECOND_CHARGEBACK", "DisputesNotificationRequestItem"),
    ] {
        assert_eq!(webhooks.webhook_item(code), schema, "{code}");
    }
}

#[tokio::test]
async fn holder_names_are_adyen_s_test_triggers_answered_and_notified() {
    bounded(async {
        let (sim, received) = adyen_sim().await;
        let cases = [
            ("APPROVED", "Authorised", None),
            ("John Smith", "Authorised", None),
            ("DECLINED", "Refused", Some(("Refused", "2"))),
            ("CARD_EXPIRED", "Refused", Some(("Expired Card", "6"))),
            (
                "NOT_ENOUGH_BALANCE",
                "Refused",
                Some(("Not enough balance", "12")),
            ),
            (
                "ISSUER_UNAVAILABLE",
                "Refused",
                Some(("Issuer Unavailable", "9")),
            ),
            ("ERROR", "Error", Some(("Acquirer Error", "4"))),
            ("CANCELLED", "Cancelled", Some(("Cancelled", "15"))),
            ("PENDING", "Received", None),
        ];
        let mut made = Vec::new();
        for (n, (holder, result, refusal)) in cases.iter().enumerate() {
            let reference = format!("pay-{n}");
            let answer = post(
                &sim,
                "/v71/payments",
                &payment(holder, 1_000 + n as i64, &reference),
                None,
            )
            .await;
            assert_eq!(answer.status, StatusCode::OK, "{holder}: {}", answer.body);
            checkout().assert_valid("PaymentResponse", &answer.body);
            assert_eq!(answer.body["resultCode"], *result, "{holder}");
            assert_eq!(answer.body["merchantReference"], reference.as_str());
            assert_eq!(answer.body["amount"]["value"], 1_000 + n as i64);
            let psp = answer.psp();
            assert_eq!(psp.len(), 16);
            assert!(psp
                .bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()));
            match refusal {
                Some((reason, code)) => {
                    assert_eq!(answer.body["refusalReason"], *reason, "{holder}");
                    assert_eq!(answer.body["refusalReasonCode"], *code, "{holder}");
                }
                None => assert!(answer.body.get("refusalReason").is_none(), "{holder}"),
            }
            made.push((psp, reference, refusal.map(|(reason, _)| reason)));
        }
        for (psp, reference, refusal) in &made {
            let item = item_of(&received, "AUTHORISATION", psp).await;
            assert_eq!(item["merchantReference"], reference.as_str());
            assert_eq!(item["merchantAccountCode"], MERCHANT);
            assert!(item.get("originalReference").is_none());
            assert_eq!(
                item["success"],
                if refusal.is_some() { "false" } else { "true" }
            );
            assert_eq!(item["additionalData"]["captureDelayHours"], "0");
            if let Some(reason) = refusal {
                assert_eq!(item["reason"], *reason);
            }
        }
        // Automatic capture is Adyen's default: no CAPTURE follows an AUTHORISATION.
        tokio::time::sleep(Duration::from_millis(4 * DECISION_MS)).await;
        assert!(items(&received)
            .iter()
            .all(|item| item["eventCode"] == "AUTHORISATION"));
        let unique: std::collections::BTreeSet<&String> =
            made.iter().map(|(psp, ..)| psp).collect();
        assert_eq!(unique.len(), made.len());
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn the_simulator_s_methods_and_a_redirect_completed_later() {
    bounded(async {
        let (sim, received) = adyen_sim().await;
        let ok = post(
            &sim,
            "/v71/payments",
            &stored("pm_card_ok", 500, "s-1"),
            None,
        )
        .await;
        assert_eq!(ok.body["resultCode"], "Authorised");
        let declined = post(
            &sim,
            "/v71/payments",
            &stored("pm_card_declined", 500, "s-2"),
            None,
        )
        .await;
        assert_eq!(
            (
                &declined.body["resultCode"],
                &declined.body["refusalReasonCode"]
            ),
            (&json!("Refused"), &json!("2"))
        );
        let unknown = post(
            &sim,
            "/v71/payments",
            &stored("8415718415718415", 500, "s-3"),
            None,
        )
        .await;
        assert_eq!(unknown.status, StatusCode::UNPROCESSABLE_ENTITY);
        checkout().assert_valid("ServiceError", &unknown.body);
        assert_eq!(unknown.body["errorCode"], "800");

        let redirect = post(
            &sim,
            "/v71/payments",
            &stored("pm_redirect", 700, "s-4"),
            None,
        )
        .await;
        checkout().assert_valid("PaymentResponse", &redirect.body);
        assert_eq!(redirect.body["resultCode"], "RedirectShopper");
        let psp = redirect.psp();
        let action = &redirect.body["action"];
        assert_eq!(
            (
                &action["type"],
                &action["method"],
                &action["paymentMethodType"]
            ),
            (&json!("redirect"), &json!("GET"), &json!("scheme"))
        );
        assert_eq!(
            action["url"],
            format!("{}/sim/charges/{psp}/authenticate", sim.base).as_str()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            codes_for(&received, &psp).is_empty(),
            "nothing before the shopper is back"
        );
        let done = send(
            reqwest::Client::new()
                .post(format!("{}/sim/charges/{psp}/complete", sim.base))
                .json(&json!({"result": "succeeded"})),
        )
        .await;
        assert_eq!(done.status, StatusCode::OK, "{}", done.body);
        let item = item_of(&received, "AUTHORISATION", &psp).await;
        assert_eq!(item["success"], "true");
        assert_eq!(item["merchantReference"], "s-4");
        assert!(item["additionalData"].get("captureDelayHours").is_none());
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn manual_capture_is_received_then_notified_and_automatic_is_not_captured_twice() {
    bounded(async {
        let (sim, received) = adyen_sim().await;
        let auth = post(
            &sim,
            "/v71/payments",
            &manual(payment("APPROVED", 10_000, "m-1")),
            None,
        )
        .await;
        let psp = auth.psp();
        assert_eq!(truth(&sim, &psp).await["status"], "requires_capture");
        let too_much = post(
            &sim,
            &format!("/v71/payments/{psp}/captures"),
            &modification(Some(10_001), "m-1-capture-big"),
            Some("m-1-c0"),
        )
        .await;
        assert_eq!(too_much.status, StatusCode::CREATED, "{}", too_much.body);
        checkout().assert_valid("PaymentCaptureResponse", &too_much.body);
        let refused = item_of(&received, "CAPTURE", &too_much.psp()).await;
        assert_eq!(refused["success"], "false");
        assert!(refused["reason"].as_str().is_some_and(|r| !r.is_empty()));

        let capture = post(
            &sim,
            &format!("/v71/payments/{psp}/captures"),
            &modification(Some(10_000), "m-1-capture"),
            Some("m-1-c1"),
        )
        .await;
        assert_eq!(capture.status, StatusCode::CREATED);
        checkout().assert_valid("PaymentCaptureResponse", &capture.body);
        assert_eq!(capture.body["status"], "received");
        assert_eq!(capture.body["paymentPspReference"], psp.as_str());
        assert_eq!(capture.body["merchantAccount"], MERCHANT);
        assert_eq!(capture.body["reference"], "m-1-capture");
        assert_ne!(capture.psp(), psp);
        assert_eq!(
            truth(&sim, &psp).await["status"],
            "requires_capture",
            "decided later, not at the answer"
        );
        let item = item_of(&received, "CAPTURE", &capture.psp()).await;
        assert_eq!(
            (
                &item["success"],
                &item["originalReference"],
                &item["merchantReference"]
            ),
            (&json!("true"), &json!(psp), &json!("m-1-capture"))
        );
        assert_eq!(truth(&sim, &psp).await["amount_captured"], 10_000);

        let automatic = post(
            &sim,
            "/v71/payments",
            &payment("APPROVED", 3_000, "a-1"),
            None,
        )
        .await;
        let auto_psp = automatic.psp();
        assert_eq!(truth(&sim, &auto_psp).await["amount_captured"], 3_000);
        let again = post(
            &sim,
            &format!("/v71/payments/{auto_psp}/captures"),
            &modification(Some(3_000), "a-1-capture"),
            None,
        )
        .await;
        assert_eq!(again.status, StatusCode::CREATED);
        let told = item_of(&received, "CAPTURE", &again.psp()).await;
        assert_eq!(told["success"], "false");
        let after = truth(&sim, &auto_psp).await;
        assert_eq!(
            (after["amount_captured"].as_i64(), after["status"].as_str()),
            (Some(3_000), Some("succeeded"))
        );

        let unknown = post(
            &sim,
            "/v71/payments/ZZZZZZZZZZZZZZZZ/captures",
            &modification(Some(1), "x"),
            None,
        )
        .await;
        assert_eq!(unknown.status, StatusCode::UNPROCESSABLE_ENTITY);
        checkout().assert_valid("ServiceError", &unknown.body);
        assert_eq!(unknown.body["errorCode"], "167");
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn refunds_and_cancels_are_received_then_decided_by_notification() {
    bounded(async {
        let (sim, received) = adyen_sim().await;
        let paid = post(&sim, "/v71/payments", &payment("APPROVED", 5_000, "r-1"), None).await;
        let psp = paid.psp();
        let mut refund_body = modification(Some(2_000), "r-1-refund");
        refund_body["merchantRefundReason"] = json!("CUSTOMER REQUEST");
        let refund = post(&sim, &format!("/v71/payments/{psp}/refunds"), &refund_body, None).await;
        assert_eq!(refund.status, StatusCode::CREATED, "{}", refund.body);
        checkout().assert_valid("PaymentRefundResponse", &refund.body);
        assert_eq!(refund.body["merchantRefundReason"], "CUSTOMER REQUEST");
        let done = item_of(&received, "REFUND", &refund.psp()).await;
        assert_eq!((&done["success"], &done["merchantReference"]), (&json!("true"), &json!("r-1-refund")));
        assert_eq!(truth(&sim, &psp).await["amount_refunded"], 2_000);
        let over = post(
            &sim,
            &format!("/v71/payments/{psp}/refunds"),
            &modification(Some(3_001), "r-1-refund-2"),
            None,
        )
        .await;
        let refused = item_of(&received, "REFUND", &over.psp()).await;
        assert_eq!(refused["success"], "false");
        assert_eq!(truth(&sim, &psp).await["amount_refunded"], 2_000);

        let captured_cancel = post(
            &sim,
            &format!("/v71/payments/{psp}/cancels"),
            &modification(None, "r-1-cancel"),
            None,
        )
        .await;
        assert_eq!(captured_cancel.status, StatusCode::CREATED);
        checkout().assert_valid("PaymentCancelResponse", &captured_cancel.body);
        let told = item_of(&received, "CANCELLATION", &captured_cancel.psp()).await;
        assert_eq!(told["success"], "false");

        let auth = post(&sim, "/v71/payments", &manual(payment("APPROVED", 900, "c-1")), None).await;
        let cancel = post(
            &sim,
            &format!("/v71/payments/{}/cancels", auth.psp()),
            &modification(None, "c-1-cancel"),
            None,
        )
        .await;
        let told = item_of(&received, "CANCELLATION", &cancel.psp()).await;
        assert_eq!(
            (&told["success"], &told["originalReference"], &told["amount"]["value"]),
            (&json!("true"), &json!(auth.psp()), &json!(900))
        );
        assert_eq!(truth(&sim, &auth.psp()).await["status"], "failed");

        let lost = post(&sim, "/v71/payments", &manual(payment("APPROVED", 800, "t-1")), None).await;
        let by_reference = post(
            &sim,
            "/v71/cancels",
            &json!({"merchantAccount": MERCHANT, "paymentReference": "t-1", "reference": "t-1-cancel"}),
            None,
        )
        .await;
        assert_eq!(by_reference.status, StatusCode::CREATED, "{}", by_reference.body);
        checkout().assert_valid("StandalonePaymentCancelResponse", &by_reference.body);
        assert_eq!(by_reference.body["paymentReference"], "t-1");
        let told = item_of(&received, "TECHNICAL_CANCEL", &by_reference.psp()).await;
        assert_eq!(
            (&told["success"], &told["originalReference"], &told["merchantReference"]),
            (&json!("true"), &json!(lost.psp()), &json!("t-1-cancel"))
        );
        let never = post(
            &sim,
            "/v71/cancels",
            &json!({"merchantAccount": MERCHANT, "paymentReference": "never-made"}),
            None,
        )
        .await;
        let told = item_of(&received, "TECHNICAL_CANCEL", &never.psp()).await;
        assert_eq!(told["success"], "false");
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn captures_and_refunds_that_succeeded_fail_late_with_their_own_psp_reference() {
    bounded(async {
        let (sim, received) = adyen_sim().await;
        let auth = post(
            &sim,
            "/v71/payments",
            &manual(payment("capture failed", 4_000, "f-1")),
            None,
        )
        .await;
        let psp = auth.psp();
        let capture = post(
            &sim,
            &format!("/v71/payments/{psp}/captures"),
            &modification(Some(4_000), "f-1-capture"),
            None,
        )
        .await;
        let done = item_of(&received, "CAPTURE", &capture.psp()).await;
        assert_eq!(done["success"], "true");
        let failed = item_of(&received, "CAPTURE_FAILED", &capture.psp()).await;
        assert_eq!(
            (&failed["originalReference"], &failed["merchantReference"]),
            (&json!(psp), &json!("f-1-capture"))
        );
        assert_eq!(truth(&sim, &psp).await["amount_captured"], 0);

        let paid = post(
            &sim,
            "/v71/payments",
            &payment("refund failed", 4_000, "f-2"),
            None,
        )
        .await;
        let refund = post(
            &sim,
            &format!("/v71/payments/{}/refunds", paid.psp()),
            &modification(Some(1_500), "f-2-refund"),
            None,
        )
        .await;
        assert_eq!(
            item_of(&received, "REFUND", &refund.psp()).await["success"],
            "true"
        );
        let failed = item_of(&received, "REFUND_FAILED", &refund.psp()).await;
        assert_eq!(failed["originalReference"], paid.psp().as_str());
        assert_eq!(truth(&sim, &paid.psp()).await["amount_refunded"], 0);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_key_replays_its_first_answer_byte_for_byte_and_704_while_it_runs() {
    bounded(async {
        let (sim, _received) = adyen_sim().await;
        let first = post(
            &sim,
            "/v71/payments",
            &payment("DECLINED", 100, "k-1"),
            Some("key-1"),
        )
        .await;
        assert_eq!(first.header("idempotency-key"), Some("key-1"));
        let again = post(
            &sim,
            "/v71/payments",
            &payment("DECLINED", 100, "k-1"),
            Some("key-1"),
        )
        .await;
        assert_eq!((again.status, &again.raw), (first.status, &first.raw));
        assert_eq!(again.header("idempotency-key"), Some("key-1"));
        // Adyen documents no body check: another body under the key replays the first answer.
        let other = post(
            &sim,
            "/v71/payments",
            &payment("APPROVED", 999, "k-2"),
            Some("key-1"),
        )
        .await;
        assert_eq!(other.raw, first.raw);
        let charges = send(reqwest::Client::new().get(format!("{}/sim/charges", sim.base))).await;
        assert_eq!(charges.body["data"].as_array().unwrap().len(), 1);

        let paid = post(
            &sim,
            "/v71/payments",
            &payment("APPROVED", 100, "k-3"),
            None,
        )
        .await;
        let refund = modification(Some(10), "k-3-refund");
        let path = format!("/v71/payments/{}/refunds", paid.psp());
        let one = post(&sim, &path, &refund, Some("key-2")).await;
        let two = post(&sim, &path, &refund, Some("key-2")).await;
        assert_eq!((one.status, &one.raw), (two.status, &two.raw));
        assert_eq!(two.header("idempotency-key"), Some("key-2"));
        // A refusal made after the request began is stored and replayed too.
        let missing_payment = "/v71/payments/0000000000000000/refunds";
        let refused = post(&sim, missing_payment, &refund, Some("key-3")).await;
        assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            post(&sim, missing_payment, &refund, Some("key-3"))
                .await
                .raw,
            refused.raw
        );

        let slow = stored("pm_card_slow", 100, "k-4");
        let running = {
            let base = sim.base.clone();
            let slow = slow.clone();
            tokio::spawn(async move {
                reqwest::Client::new()
                    .post(format!("{base}/v71/payments"))
                    .header("X-API-Key", API_KEY)
                    .header("Idempotency-Key", "key-4")
                    .json(&slow)
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap()
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let busy = post(&sim, "/v71/payments", &slow, Some("key-4")).await;
        assert_eq!(busy.status, StatusCode::UNPROCESSABLE_ENTITY);
        checkout().assert_valid("ServiceError", &busy.body);
        assert_eq!(
            busy.body,
            json!({"status": 422, "errorCode": "704",
                "message": "request already processed or in progress", "errorType": "validation"})
        );
        assert_eq!(busy.header("transient-error"), Some("true"));
        assert_eq!(busy.header("idempotency-key"), Some("key-4"));
        let first = running.await.unwrap();
        let replay = post(&sim, "/v71/payments", &slow, Some("key-4")).await;
        assert_eq!(replay.raw, first);

        let too_long = post(&sim, "/v71/payments", &slow, Some(&"k".repeat(65))).await;
        assert_eq!(too_long.status, StatusCode::UNPROCESSABLE_ENTITY);
        checkout().assert_valid("ServiceError", &too_long.body);
        // Without a key, nothing is idempotent.
        let a = post(&sim, "/v71/payments", &payment("APPROVED", 1, "k-5"), None).await;
        let b = post(&sim, "/v71/payments", &payment("APPROVED", 1, "k-5"), None).await;
        assert_ne!(a.psp(), b.psp());
        assert!(a.header("idempotency-key").is_none());
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn auth_validation_and_no_lookup_route() {
    bounded(async {
        let (sim, _received) = adyen_sim().await;
        let anonymous = send(
            reqwest::Client::new()
                .post(format!("{}/v71/payments", sim.base))
                .json(&payment("APPROVED", 100, "v-1")),
        )
        .await;
        assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            anonymous.raw.as_ref(),
            br#"{"status":401,"errorCode":"000","message":"HTTP Status Response - Unauthorized","errorType":"security"}"#
        );
        let mut cases: Vec<(Value, &str)> = Vec::new();
        let mut no_merchant = payment("APPROVED", 100, "v-2");
        no_merchant.as_object_mut().unwrap().remove("merchantAccount");
        cases.push((no_merchant, "702"));
        let mut empty_merchant = payment("APPROVED", 100, "v-2");
        empty_merchant["merchantAccount"] = json!("");
        cases.push((empty_merchant, "702"));
        let mut no_reference = payment("APPROVED", 100, "v-2");
        no_reference.as_object_mut().unwrap().remove("reference");
        cases.push((no_reference, "130"));
        let mut no_amount = payment("APPROVED", 100, "v-2");
        no_amount.as_object_mut().unwrap().remove("amount");
        cases.push((no_amount, "100"));
        cases.push((payment("APPROVED", 0, "v-2"), "137"));
        let mut lower_currency = payment("APPROVED", 100, "v-2");
        lower_currency["amount"]["currency"] = json!("eur");
        cases.push((lower_currency, "138"));
        for field in ["returnUrl", "paymentMethod"] {
            let mut missing = payment("APPROVED", 100, "v-2");
            missing.as_object_mut().unwrap().remove(field);
            cases.push((missing, "702"));
        }
        let mut typo = payment("APPROVED", 100, "v-2");
        typo["merchantReference"] = json!("oops");
        cases.push((typo, "702"));
        for (body, code) in cases {
            let refused = post(&sim, "/v71/payments", &body, None).await;
            assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
            checkout().assert_valid("ServiceError", &refused.body);
            assert_eq!(refused.body["errorCode"], code, "{body}: {}", refused.body);
        }
        let paid = post(&sim, "/v71/payments", &payment("APPROVED", 100, "v-3"), None).await;
        let psp = paid.psp();
        let no_merchant = post(
            &sim,
            &format!("/v71/payments/{psp}/refunds"),
            &json!({"amount": {"currency": "EUR", "value": 1}}),
            None,
        )
        .await;
        assert_eq!(no_merchant.status, StatusCode::UNPROCESSABLE_ENTITY);
        let other_account = post(
            &sim,
            &format!("/v71/payments/{psp}/refunds"),
            &json!({"merchantAccount": "SomeoneElse", "amount": {"currency": "EUR", "value": 1}}),
            None,
        )
        .await;
        assert_eq!(other_account.body["errorCode"], "167");
        for path in [
            format!("/v71/payments/{psp}"),
            "/v71/payments".to_owned(),
            format!("/v71/payments/{psp}/captures"),
            "/v71/payments?reference=v-3".to_owned(),
        ] {
            let looked_up = send(
                reqwest::Client::new()
                    .get(format!("{}{path}", sim.base))
                    .header("X-API-Key", API_KEY),
            )
            .await;
            assert!(
                matches!(looked_up.status, StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED),
                "GET {path}: {}",
                looked_up.status
            );
        }
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn disputes_are_notified_from_the_control_routes_and_from_triggers() {
    bounded(async {
        let (sim, received) = adyen_sim().await;
        let paid = post(
            &sim,
            "/v71/payments",
            &payment("APPROVED", 6_000, "d-1"),
            None,
        )
        .await;
        let psp = paid.psp();
        let control = |path: String, body: Value| {
            let base = sim.base.clone();
            async move {
                send(
                    reqwest::Client::new()
                        .post(format!("{base}{path}"))
                        .json(&body),
                )
                .await
            }
        };
        let opened = control(format!("/sim/charges/{psp}/dispute"), json!({})).await;
        assert_eq!(opened.status, StatusCode::OK, "{}", opened.body);
        assert!(
            eventually(2_000, || codes_for(&received, &psp)
                .contains(&"NOTIFICATION_OF_CHARGEBACK".to_owned()))
            .await
        );
        let closed = control(
            format!("/sim/charges/{psp}/dispute/close"),
            json!({"outcome": "lost"}),
        )
        .await;
        assert_eq!(closed.status, StatusCode::OK, "{}", closed.body);
        assert!(
            eventually(2_000, || codes_for(&received, &psp)
                .contains(&"CHARGEBACK".to_owned()))
            .await
        );
        let disputes: Vec<Value> = items(&received)
            .into_iter()
            .filter(|item| item["originalReference"] == psp.as_str())
            .collect();
        assert_eq!(disputes.len(), 2);
        let dispute_psp = disputes[0]["pspReference"].as_str().unwrap();
        assert_eq!(dispute_psp.len(), 16);
        assert_ne!(dispute_psp, psp);
        for item in &disputes {
            assert_eq!(item["pspReference"], dispute_psp);
            assert_eq!(item["merchantReference"], "d-1");
            assert_eq!(item["amount"]["value"], 6_000);
        }
        assert_eq!(
            disputes[0]["additionalData"]["disputeStatus"],
            "Unresponded"
        );
        assert_eq!(disputes[1]["additionalData"]["disputeStatus"], "Lost");

        let reversed = post(
            &sim,
            "/v71/payments",
            &payment("Chargeback Reversed", 700, "d-2"),
            None,
        )
        .await;
        let second = post(
            &sim,
            "/v71/payments",
            &manual(payment("Second Chargeback", 800, "d-3")),
            None,
        )
        .await;
        post(
            &sim,
            &format!("/v71/payments/{}/captures", second.psp()),
            &modification(Some(800), "d-3-capture"),
            None,
        )
        .await;
        let lost = post(
            &sim,
            "/v71/payments",
            &payment("Chargeback:4837", 900, "d-4"),
            None,
        )
        .await;
        let wanted = |psp: &str, codes: &[&str]| {
            let psp = psp.to_owned();
            let codes: Vec<String> = codes.iter().map(|c| (*c).to_owned()).collect();
            let received = Arc::clone(&received);
            async move {
                let ok = eventually(5_000, || {
                    let seen: Vec<String> = codes_for(&received, &psp)
                        .into_iter()
                        .filter(|code| code != "AUTHORISATION" && code != "CAPTURE")
                        .collect();
                    seen == codes
                })
                .await;
                assert!(
                    ok,
                    "{psp}: {:?}, wanted {codes:?}",
                    codes_for(&received, &psp)
                );
            }
        };
        wanted(
            &reversed.psp(),
            &[
                "NOTIFICATION_OF_CHARGEBACK",
                "CHARGEBACK",
                "CHARGEBACK_REVERSED",
            ],
        )
        .await;
        wanted(
            &second.psp(),
            &[
                "NOTIFICATION_OF_CHARGEBACK",
                "CHARGEBACK",
                "CHARGEBACK_REVERSED",
                "SECOND_CHARGEBACK",
            ],
        )
        .await;
        wanted(&lost.psp(), &["NOTIFICATION_OF_CHARGEBACK", "CHARGEBACK"]).await;
        let code = items(&received)
            .into_iter()
            .find(|item| item["originalReference"] == lost.psp().as_str())
            .unwrap();
        assert_eq!(code["additionalData"]["chargebackReasonCode"], "4837");
        let won = items(&received)
            .into_iter()
            .find(|item| {
                item["eventCode"] == "CHARGEBACK_REVERSED"
                    && item["originalReference"] == reversed.psp().as_str()
            })
            .unwrap();
        assert_eq!(won["additionalData"]["disputeStatus"], "Won");
        assert_eq!(
            truth(&sim, &reversed.psp()).await["dispute"]["status"],
            "won"
        );
        assert_eq!(
            truth(&sim, &second.psp()).await["dispute"]["status"],
            "lost"
        );
        sim.shutdown().await;
    })
    .await;
}

/// Asked for Adyen's examples' shape, the dialect sends a dispute's CHARGEBACK_REVERSED and
/// SECOND_CHARGEBACK without `originalReference` (the dispute's pspReference and the payment's
/// reference name them), and each still validates against its schema and its HMAC.
#[tokio::test]
async fn a_dispute_s_later_items_can_leave_as_adyen_s_examples_show_them() {
    bounded(async {
        let (sim, received) = adyen_sim().await;
        let faults = send(
            reqwest::Client::new()
                .post(format!("{}/sim/faults", sim.base))
                .json(&json!({"dispute_items_as_adyen_examples": true})),
        )
        .await;
        assert_eq!(faults.status, StatusCode::OK, "{}", faults.body);
        let second = post(
            &sim,
            "/v71/payments",
            &payment("Second Chargeback", 800, "e-1"),
            None,
        )
        .await;
        let psp = second.psp();
        let chargeback_of = |received: &Receiver| {
            items(received).into_iter().find(|item| {
                item["eventCode"] == "CHARGEBACK" && item["originalReference"] == psp.as_str()
            })
        };
        assert!(eventually(5_000, || chargeback_of(&received).is_some()).await);
        let chargeback = chargeback_of(&received).unwrap();
        let dispute = chargeback["pspReference"].as_str().unwrap().to_owned();
        for code in ["CHARGEBACK_REVERSED", "SECOND_CHARGEBACK"] {
            let item = item_of(&received, code, &dispute).await;
            assert!(item.get("originalReference").is_none(), "{item}");
            assert_eq!(item["merchantReference"], "e-1");
            assert_eq!(item["amount"]["value"], 800);
        }
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_failing_endpoint_is_retried_and_items_ready_together_leave_in_one_batch() {
    bounded(async {
        let (url, received) = start_receiver(2).await;
        let sim = RunningSim::start(config(Some(url))).await;
        let paid = post(
            &sim,
            "/v71/payments",
            &payment("APPROVED", 100, "b-1"),
            None,
        )
        .await;
        let item = item_of(&received, "AUTHORISATION", &paid.psp()).await;
        assert_eq!(item["success"], "true");
        {
            let received = received.lock().unwrap();
            assert_eq!(received.deliveries.len(), 3, "two failures, then accepted");
            assert!(received
                .deliveries
                .windows(2)
                .all(|pair| pair[0].1 == pair[1].1));
        }

        let faults = send(
            reqwest::Client::new()
                .post(format!("{}/sim/faults", sim.base))
                .json(&json!({"webhook_reorder": true})),
        )
        .await;
        assert_eq!(faults.status, StatusCode::OK);
        let before = received.lock().unwrap().deliveries.len();
        let mut made = Vec::new();
        for n in 0..4 {
            made.push(
                post(
                    &sim,
                    "/v71/payments",
                    &payment("APPROVED", 100 + n, &format!("b-{n}x")),
                    None,
                )
                .await
                .psp(),
            );
        }
        assert!(eventually(3_000, || received.lock().unwrap().deliveries.len() > before).await);
        let batch = {
            let received = received.lock().unwrap();
            received.deliveries[before].clone()
        };
        let items = check_batch(batch.0.as_deref(), &batch.1);
        assert_eq!(items.len(), 4, "{items:#?}");
        let mut psps: Vec<String> = items
            .iter()
            .map(|i| i["pspReference"].as_str().unwrap().to_owned())
            .collect();
        psps.sort();
        made.sort();
        assert_eq!(psps, made);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn webhook_faults_apply_to_items_a_duplicate_is_the_same_signed_item() {
    bounded(async {
        let (sim, received) = adyen_sim().await;
        let faults = send(
            reqwest::Client::new()
                .post(format!("{}/sim/faults", sim.base))
                .json(&json!({"webhook_duplicate_rate": 1.0})),
        )
        .await;
        assert_eq!(faults.status, StatusCode::OK);
        let paid = post(
            &sim,
            "/v71/payments",
            &payment("APPROVED", 100, "w-1"),
            None,
        )
        .await;
        let psp = paid.psp();
        assert!(
            eventually(3_000, || items(&received)
                .iter()
                .filter(|item| item["pspReference"] == psp.as_str())
                .count()
                == 2)
            .await
        );
        let copies: Vec<Value> = items(&received)
            .into_iter()
            .filter(|item| item["pspReference"] == psp.as_str())
            .collect();
        assert_eq!(copies[0], copies[1]);

        let dropped = send(
            reqwest::Client::new()
                .post(format!("{}/sim/faults", sim.base))
                .json(&json!({"webhook_duplicate_rate": 0.0, "webhook_drop_rate": 1.0})),
        )
        .await;
        assert_eq!(dropped.status, StatusCode::OK);
        let lost = post(
            &sim,
            "/v71/payments",
            &payment("APPROVED", 100, "w-2"),
            None,
        )
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(codes_for(&received, &lost.psp()).is_empty());
        sim.shutdown().await;
    })
    .await;
}
