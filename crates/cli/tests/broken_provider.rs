//! The real binary against a scripted provider over loopback whose first answer to a charge
//! breaks mid-body and whose retry meets 409 (the key's first request still running), then a
//! decline: the charge may exist, so the payment stays pending (202), never failed, on both
//! backends.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use common::{payment_body, Backend, Server, TestDatabase};
use serde_json::json;

/// Answers every attempt at a charge in turn: broken mid-body, 409, then 402 declined.
async fn charge(State(attempts): State<Arc<Mutex<u32>>>) -> Response {
    let attempt = {
        let mut attempts = attempts.lock().unwrap();
        *attempts += 1;
        *attempts
    };
    match attempt {
        1 => {
            let whole = br#"{"id":"ch_scripted","status":"succeeded","amount_minor":10000,"currency":"USD"}"#;
            let parts: Vec<Result<Bytes, std::io::Error>> = vec![
                Ok(Bytes::copy_from_slice(&whole[..whole.len() / 2])),
                Err(std::io::Error::other("connection broken on purpose")),
            ];
            let body = Body::from_stream(futures::stream::iter(parts));
            (StatusCode::OK, [("content-type", "application/json")], body).into_response()
        }
        2 => (
            StatusCode::CONFLICT,
            axum::Json(json!({"error": {"type": "invalid_request_error",
                "code": "idempotency_key_in_use", "message": "in use"}})),
        )
            .into_response(),
        _ => (
            StatusCode::PAYMENT_REQUIRED,
            axum::Json(json!({"error": {"type": "card_error",
                "code": "card_declined", "message": "declined"}})),
        )
            .into_response(),
    }
}

async fn scripted_provider() -> (String, Arc<Mutex<u32>>) {
    let attempts = Arc::new(Mutex::new(0));
    let app = Router::new()
        .route("/v1/charges", post(charge))
        .with_state(Arc::clone(&attempts));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, attempts)
}

async fn a_broken_answer_then_409_is_not_a_decline(backend: Backend) {
    let (base, attempts) = scripted_provider().await;
    let database = TestDatabase::new(backend).await;
    let server = Server::start(
        &database.url,
        &["--psp-url", &base, "--pending-timeout", "1h"],
    );
    let client = server.client();
    let created = client
        .post(
            "/v1/payments",
            "broken-1",
            &payment_body(10_000, "pm_card_ok"),
        )
        .await;
    assert_eq!(
        created.status,
        202,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let payment = created.json();
    assert_eq!(payment["status"], "pending", "{payment}");
    assert!(*attempts.lock().unwrap() >= 3, "the decline was reached");
    let id = payment["id"].as_str().unwrap();
    let again = client.get(&format!("/v1/payments/{id}")).await.json();
    assert_eq!(again["status"], "pending", "{again}");
    assert!(again["failure_reason"].is_null(), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_whose_first_answer_broke_and_whose_retry_met_409_is_not_failed_sqlite() {
    a_broken_answer_then_409_is_not_a_decline(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_whose_first_answer_broke_and_whose_retry_met_409_is_not_failed_postgres() {
    a_broken_answer_then_409_is_not_a_decline(Backend::Postgres).await;
}
