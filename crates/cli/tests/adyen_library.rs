//! Adyen's own Python library (PyPI `Adyen`, pinned in conformance/requirements.txt) against the
//! notifications of `asiento psp-sim --dialect adyen`: the real binary delivers its batches to a
//! receiver here (basic auth checked, `[accepted]` answered) while payments and modifications go
//! through plain HTTP, and conformance/adyen_notifications.py checks every item with
//! `Adyen.util.is_valid_hmac_notification` (and a tampered copy of each, refused).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{json, Value};

use common::{url_after, Process};

const HMAC_KEY: &str = "74F490DD33F7327BAECC88B2947C011FC02D014A473AAA33A8EC93E4DC069174";
const MERCHANT: &str = "AsientoECOM";
/// `user:password` in base64, as the receiver expects it.
const BASIC: &str = "Basic YXNpZW50bzp3ZWJob29rLXBhc3N3b3Jk";

type Batches = Arc<Mutex<Vec<Bytes>>>;

async fn receive(State(batches): State<Batches>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let authorized = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        == Some(BASIC);
    if !authorized {
        return StatusCode::UNAUTHORIZED;
    }
    batches.lock().unwrap().push(body);
    StatusCode::OK
}

async fn post(client: &reqwest::Client, url: String, body: Value) -> Value {
    let answer = client
        .post(url)
        .header("X-API-Key", "AQE_conformance")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{}", answer.status());
    answer.json().await.unwrap()
}

fn payment(holder: &str, reference: &str, manual: bool) -> Value {
    let mut body = json!({
        "merchantAccount": MERCHANT,
        "amount": {"currency": "EUR", "value": 1130},
        "reference": reference,
        "returnUrl": "https://shop.example/return",
        "paymentMethod": {"type": "scheme", "holderName": holder,
            "encryptedCardNumber": "test_4111111111111111"},
    });
    if manual {
        body["additionalData"] = json!({"manualCapture": "true"});
    } else {
        body["captureDelayHours"] = json!(0);
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adyen_s_python_library_accepts_every_notification_item_of_the_adyen_dialect() {
    let python = std::env::var("ASIENTO_TEST_PYTHON").expect(
        "ASIENTO_TEST_PYTHON must name the python of the venv that scripts/test builds from \
         conformance/requirements.txt: run scripts/test",
    );
    let batches: Batches = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let webhook_url = format!("http://{}/webhooks/adyen", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .route("/webhooks/adyen", axum::routing::post(receive))
        .with_state(Arc::clone(&batches));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let mut sim = Process::spawn(
        &[
            "psp-sim",
            "--dialect",
            "adyen",
            "--listen",
            "127.0.0.1:0",
            "--seed",
            "7",
            "--modification-delay-ms",
            "50",
            "--webhook-url",
            &webhook_url,
            "--webhook-hmac-key",
            HMAC_KEY,
            "--webhook-username",
            "asiento",
        ],
        &[("ASIENTO_PSP_SIM_WEBHOOK_PASSWORD", "webhook-password")],
    );
    let base = url_after(&sim.wait_for_line("psp-sim listening on "), "listening on ");
    let client = reqwest::Client::new();

    // References with the characters an escaping signer would get wrong.
    let paid = post(
        &client,
        format!("{base}/v71/payments"),
        payment("APPROVED", r"order:1\with/slashes", false),
    )
    .await;
    post(
        &client,
        format!("{base}/v71/payments"),
        payment("DECLINED", "order-2", false),
    )
    .await;
    let auth = post(
        &client,
        format!("{base}/v71/payments"),
        payment("APPROVED", "order-3", true),
    )
    .await;
    let psp = paid["pspReference"].as_str().unwrap();
    let auth_psp = auth["pspReference"].as_str().unwrap();
    let modification = |value: Option<i64>, reference: &str| {
        let mut body = json!({"merchantAccount": MERCHANT, "reference": reference});
        if let Some(value) = value {
            body["amount"] = json!({"currency": "EUR", "value": value});
        }
        body
    };
    post(
        &client,
        format!("{base}/v71/payments/{psp}/refunds"),
        modification(Some(500), "order-1:refund"),
    )
    .await;
    post(
        &client,
        format!("{base}/v71/payments/{auth_psp}/captures"),
        modification(Some(1130), "order-3-capture"),
    )
    .await;
    post(
        &client,
        format!("{base}/v71/payments/{psp}/cancels"),
        modification(None, "order-1-cancel"),
    )
    .await;
    let pending = post(
        &client,
        format!("{base}/v71/payments"),
        payment("APPROVED", "order-4", true),
    )
    .await;
    post(
        &client,
        format!("{base}/v71/cancels"),
        json!({"merchantAccount": MERCHANT, "paymentReference": "order-4", "reference": "order-4-cancel"}),
    )
    .await;
    assert!(pending["pspReference"].is_string());

    // 4 AUTHORISATION, REFUND, CAPTURE, CANCELLATION, TECHNICAL_CANCEL.
    let items_wanted = 8;
    let deadline = Instant::now() + Duration::from_secs(10);
    let count = |batches: &Batches| {
        batches
            .lock()
            .unwrap()
            .iter()
            .map(|body| {
                let batch: Value = serde_json::from_slice(body).unwrap();
                batch["notificationItems"].as_array().unwrap().len()
            })
            .sum::<usize>()
    };
    while count(&batches) < items_wanted && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count(&batches), items_wanted);
    sim.kill();

    let delivered: Vec<Value> = batches
        .lock()
        .unwrap()
        .iter()
        .map(|body| serde_json::from_slice(body).unwrap())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("batches.json");
    std::fs::write(&file, serde_json::to_vec(&delivered).unwrap()).unwrap();
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/adyen_notifications.py");
    let output = Command::new(&python)
        .arg(&script)
        .env("ASIENTO_ADYEN_BATCHES", &file)
        .env("ASIENTO_ADYEN_HMAC_KEY", HMAC_KEY)
        .env(
            "ASIENTO_ADYEN_EVENT_CODES",
            "AUTHORISATION,REFUND,CAPTURE,CANCELLATION,TECHNICAL_CANCEL",
        )
        .output()
        .unwrap_or_else(|error| panic!("running {python} {}: {error}", script.display()));
    assert!(
        output.status.success(),
        "Adyen's library refused the dialect's notifications:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
