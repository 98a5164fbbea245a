//! `POST /webhooks/{provider}`: where providers deliver their events.
//!
//! No API key: the provider authenticates by signing the raw body (`Psp-Signature`), so the body
//! is taken as raw `Bytes`, never through a JSON extractor that would parse (and re-encode) it
//! before the signature is checked. A provider that delivers batches of items signed one by one
//! (Adyen) authenticates with basic auth and each item's HMAC, and is answered `[accepted]`. The handler does no processing: a verified event is stored in
//! the inbox (`asiento_app::webhooks`) and answered 200 at once; the webhook worker applies it.
//! A refusal (unknown provider, bad or stale signature, malformed body) is a 400 problem with a
//! stable code and stores nothing; a failure of ours is a 500, which makes the provider retry.

use asiento_app::webhooks::{
    EventFormat, ReceiveError, WebhookReceiver, SIGNATURE_HEADER, STRIPE_SIGNATURE_HEADER,
};
use axum::{
    body::Bytes,
    extract::{Path, State},
    http::header::{AUTHORIZATION, CONTENT_TYPE},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    Json,
};

use crate::problem::Problem;

/// State the handler needs: anything that holds a [`WebhookReceiver`]. `AppState` implements it
/// by handing out its `webhooks` field.
pub trait HasWebhooks {
    fn webhooks(&self) -> &WebhookReceiver;
}

/// Verifies and stores one provider event; 200 `{"received": true}` also for an event id seen
/// before (the provider must stop redelivering it).
pub async fn receive<S>(
    State(state): State<S>,
    Path(provider): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response
where
    S: HasWebhooks + Clone + Send + Sync + 'static,
{
    let receiver = state.webhooks();
    if receiver.secrets.format(&provider) == EventFormat::Adyen {
        let authorization = headers
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok());
        return match receiver
            .receive_batch(&provider, authorization, &body)
            .await
        {
            // Adyen's acknowledgement, valid both where any 2xx accepts and where the body must say so.
            Ok(_) => ([(CONTENT_TYPE, "text/plain")], ADYEN_ACCEPTED).into_response(),
            Err(error) => problem(&error).into_response(),
        };
    }
    // A header that is not visible ASCII cannot be a valid signature: treated as missing.
    // Stripe's header carries the same scheme under its own name.
    let signature = headers
        .get(SIGNATURE_HEADER)
        .or_else(|| headers.get(STRIPE_SIGNATURE_HEADER))
        .and_then(|value| value.to_str().ok());
    match receiver.receive(&provider, signature, &body).await {
        Ok(received) => Json(serde_json::json!({
            "received": true,
            "duplicate": received.duplicate,
        }))
        .into_response(),
        Err(error) => problem(&error).into_response(),
    }
}

/// The body Adyen's notifications are acknowledged with.
pub const ADYEN_ACCEPTED: &str = "[accepted]";

fn problem(error: &ReceiveError) -> Problem {
    if matches!(error, ReceiveError::Unauthorized) {
        Problem::new(StatusCode::UNAUTHORIZED, error.code(), error.to_string())
    } else if error.is_client_fault() {
        Problem::bad_request(error.code(), error.to_string())
    } else {
        // Logged by the receiver with its cause; the provider only learns to retry.
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "the event could not be stored; deliver it again",
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use asiento_app::clock::ManualClock;
    use asiento_app::webhooks::WebhookSecrets;
    use asiento_eventstore::Database;
    use axum::{body::Body, http::Request, routing::post, Router};
    use sha2::{Digest, Sha256};
    use tower::ServiceExt as _;

    use super::*;

    const NOW_S: i64 = 1_764_000_000;

    #[derive(Clone)]
    struct TestState(WebhookReceiver);

    impl HasWebhooks for TestState {
        fn webhooks(&self) -> &WebhookReceiver {
            &self.0
        }
    }

    /// HMAC-SHA256 (RFC 2104) written out, so that this test does not share the signing code it
    /// checks the handler against.
    fn sign(secret: &str, t: i64, body: &[u8]) -> String {
        const BLOCK: usize = 64;
        let mut key = secret.as_bytes().to_vec();
        if key.len() > BLOCK {
            key = Sha256::digest(&key).to_vec();
        }
        key.resize(BLOCK, 0);
        let pad = |byte: u8| key.iter().map(|k| k ^ byte).collect::<Vec<u8>>();
        let mut inner = Sha256::new();
        inner.update(pad(0x36));
        inner.update(format!("{t}.").as_bytes());
        inner.update(body);
        let mut outer = Sha256::new();
        outer.update(pad(0x5c));
        outer.update(inner.finalize());
        format!("t={t},v1={}", hex::encode(outer.finalize()))
    }

    fn event_body(id: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "id": id,
            "type": "charge.succeeded",
            "created": NOW_S,
            "data": {"charge": {
                "id": "ch_1", "status": "succeeded", "amount_minor": 1000, "currency": "USD",
                "amount_captured": 1000, "amount_refunded": 0, "reference": "pay_x",
                "idempotency_key": "psp_x", "created": "2025-11-24T16:00:00Z",
                "updated": "2025-11-24T16:00:00Z"
            }}
        }))
        .unwrap()
    }

    async fn app() -> (impl Sized, Database, Router) {
        let (dir, url) = asiento_eventstore::scratch::temp_sqlite_url();
        let database = Database::connect(&url).await.unwrap();
        database.migrate().await.unwrap();
        let receiver = WebhookReceiver {
            database: database.clone(),
            writer: asiento_app::commit::Writer::new(database.event_store()),
            secrets: "sim:whsec_sim,acme:whsec_acme"
                .parse::<WebhookSecrets>()
                .unwrap(),
            clock: Arc::new(ManualClock::at_ms(NOW_S * 1000)),
            tolerance_s: 300,
        };
        let router = Router::new()
            .route("/webhooks/{provider}", post(receive::<TestState>))
            .with_state(TestState(receiver));
        (dir, database, router)
    }

    async fn post_event(
        router: &Router,
        provider: &str,
        signature: Option<String>,
        body: Vec<u8>,
    ) -> (u16, serde_json::Value) {
        post_event_under(router, SIGNATURE_HEADER, provider, signature, body).await
    }

    /// [`post_event`] with the signature under `header` (ours, or Stripe's name for it).
    async fn post_event_under(
        router: &Router,
        header: &str,
        provider: &str,
        signature: Option<String>,
        body: Vec<u8>,
    ) -> (u16, serde_json::Value) {
        let mut request = Request::post(format!("/webhooks/{provider}"))
            .header("content-type", "application/json");
        if let Some(signature) = signature {
            request = request.header(header, signature);
        }
        let response = router
            .clone()
            .oneshot(request.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    async fn stored(database: &Database) -> i64 {
        let Database::Sqlite(pool) = database else {
            panic!("sqlite")
        };
        sqlx::query_scalar("select count(*) from webhook_inbox")
            .fetch_one(pool)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_signed_event_is_stored_once_and_answered_200_every_time() {
        let (_dir, database, router) = app().await;
        let body = event_body("evt_1");
        for duplicate in [false, true] {
            let signature = Some(sign("whsec_sim", NOW_S, &body));
            let (status, answer) = post_event(&router, "sim", signature, body.clone()).await;
            assert_eq!(status, 200, "{answer}");
            assert_eq!(answer["received"], true);
            assert_eq!(answer["duplicate"], duplicate);
        }
        assert_eq!(stored(&database).await, 1);
        // The same event id from another provider is another event.
        let signature = Some(sign("whsec_acme", NOW_S, &body));
        assert_eq!(post_event(&router, "acme", signature, body).await.0, 200);
        assert_eq!(stored(&database).await, 2);
        // Stripe's header carries the same scheme.
        let body = event_body("evt_4");
        let signature = Some(sign("whsec_sim", NOW_S, &body));
        let (status, answer) =
            post_event_under(&router, STRIPE_SIGNATURE_HEADER, "sim", signature, body).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(stored(&database).await, 3);
    }

    #[tokio::test]
    async fn refusals_are_400_with_a_code_and_store_nothing() {
        let (_dir, database, router) = app().await;
        let body = event_body("evt_2");
        /// (name, provider, signature header, body, expected code)
        type Case = (
            &'static str,
            &'static str,
            Option<String>,
            Vec<u8>,
            &'static str,
        );
        let cases: Vec<Case> = vec![
            ("no header", "sim", None, body.clone(), "signature_invalid"),
            (
                "wrong secret",
                "sim",
                Some(sign("whsec_acme", NOW_S, &body)),
                body.clone(),
                "signature_invalid",
            ),
            (
                "body changed after signing",
                "sim",
                Some(sign("whsec_sim", NOW_S, &body)),
                event_body("evt_3"),
                "signature_invalid",
            ),
            (
                "stale timestamp",
                "sim",
                Some(sign("whsec_sim", NOW_S - 301, &body)),
                body.clone(),
                "signature_stale",
            ),
            (
                "unknown provider",
                "nobody",
                Some(sign("whsec_sim", NOW_S, &body)),
                body.clone(),
                "unknown_provider",
            ),
            (
                "signed but not an event",
                "sim",
                Some(sign("whsec_sim", NOW_S, b"{\"id\":1}")),
                b"{\"id\":1}".to_vec(),
                "invalid_body",
            ),
        ];
        for (name, provider, signature, body, code) in cases {
            for header in [SIGNATURE_HEADER, STRIPE_SIGNATURE_HEADER] {
                let (status, answer) =
                    post_event_under(&router, header, provider, signature.clone(), body.clone())
                        .await;
                assert_eq!(status, 400, "{name} under {header}: {answer}");
                assert_eq!(answer["code"], code, "{name} under {header}: {answer}");
            }
        }
        assert_eq!(stored(&database).await, 0);
    }
}
