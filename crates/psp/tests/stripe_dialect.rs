//! The simulator's Stripe dialect over real HTTP: Stripe's paths, form encoding, strict
//! parameters, objects shaped as Stripe's published fixtures, its error envelope, idempotency
//! and signed events.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use asiento_psp::stripe::wire::{BalanceTransaction, Charge, ErrorBody, PaymentIntent, Refund};
use asiento_psp::stripe::{Form, SIGNATURE_HEADER};
use asiento_psp_sim::Dialect;
use asiento_psp_sim::SimConfig;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing;
use axum::Router;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use common::{bounded, eventually, RunningSim};

const KEY: &str = "sk_test_asiento";

struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    fn error_code(&self) -> Option<&str> {
        self.body["error"]["code"].as_str()
    }
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    let response = request.send().await.unwrap();
    let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        body,
    }
}

async fn post(sim: &RunningSim, path: &str, form: &Form, key: Option<&str>) -> Answer {
    let mut request = reqwest::Client::new()
        .post(format!("{}{path}", sim.base))
        .bearer_auth(KEY)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(form.encode());
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    send(request).await
}

async fn get(sim: &RunningSim, path_and_query: &str) -> Answer {
    send(
        reqwest::Client::new()
            .get(format!("{}{path_and_query}", sim.base))
            .bearer_auth(KEY),
    )
    .await
}

async fn stripe_sim() -> RunningSim {
    RunningSim::start(SimConfig {
        dialect: Dialect::Stripe,
        fee_bps: 290,
        ..SimConfig::default()
    })
    .await
}

fn intent_form(amount: i64, method: &str, capture_method: &str) -> Form {
    Form::new()
        .field("amount", amount.to_string())
        .field("currency", "usd")
        .field("payment_method", method)
        .field("capture_method", capture_method)
        .list("payment_method_types", ["card"])
        .map(
            "metadata",
            &BTreeMap::from([("asiento_payment_id".to_owned(), "pay_1".to_owned())]),
        )
}

fn fixture_keys(name: &str) -> BTreeSet<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/stripe/fixtures3.json"
    );
    let all: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    keys(&all["resources"][name])
}

fn keys(object: &Value) -> BTreeSet<String> {
    object.as_object().unwrap().keys().cloned().collect()
}

/// Every field of Stripe's fixture is there, and nothing beyond what Stripe documents as
/// present only in some states.
fn assert_shaped_as_fixture(name: &str, object: &Value, optional: &[&str]) {
    let ours = keys(object);
    let theirs = fixture_keys(name);
    let missing: Vec<_> = theirs.difference(&ours).collect();
    assert!(missing.is_empty(), "{name} lacks {missing:?}");
    let extra: Vec<_> = ours
        .difference(&theirs)
        .filter(|key| !optional.contains(&key.as_str()))
        .collect();
    assert!(
        extra.is_empty(),
        "{name} has fields Stripe's has not: {extra:?}"
    );
}

#[tokio::test]
async fn objects_have_every_field_of_stripe_s_published_fixtures() {
    bounded(async {
        let sim = stripe_sim().await;
        let created = post(
            &sim,
            "/v1/payment_intents",
            &intent_form(1000, "pm_card_visa", "automatic").field("confirm", "true"),
            Some("k-1"),
        )
        .await;
        assert_eq!(created.status, StatusCode::OK, "{}", created.body);
        assert_shaped_as_fixture("payment_intent", &created.body, &[]);
        let intent: PaymentIntent = serde_json::from_value(created.body.clone()).unwrap();
        let read = get(
            &sim,
            &format!(
                "/v1/payment_intents/{}?expand[]=latest_charge.balance_transaction",
                intent.id
            ),
        )
        .await;
        let charge = &read.body["latest_charge"];
        assert_shaped_as_fixture("charge", charge, &[]);
        let txn = &charge["balance_transaction"];
        assert_shaped_as_fixture("balance_transaction", txn, &[]);
        let txn: BalanceTransaction = serde_json::from_value(txn.clone()).unwrap();
        assert_eq!(
            (txn.amount, txn.fee, txn.net),
            (1000, 29, 971),
            "2.9 % of 10.00"
        );
        let _: Charge = serde_json::from_value(charge.clone()).unwrap();

        let refund = post(
            &sim,
            "/v1/refunds",
            &Form::new()
                .field("payment_intent", &intent.id)
                .field("amount", "300"),
            Some("k-2"),
        )
        .await;
        assert_eq!(refund.status, StatusCode::OK, "{}", refund.body);
        assert_shaped_as_fixture("refund", &refund.body, &[]);
        let refund: Refund = serde_json::from_value(refund.body).unwrap();
        assert_eq!(refund.amount, 300);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_payment_intent_is_created_confirmed_captured_in_part_and_refunded() {
    bounded(async {
        let sim = stripe_sim().await;
        let created = post(
            &sim,
            "/v1/payment_intents",
            &intent_form(1000, "pm_card_visa", "manual"),
            Some("create-1"),
        )
        .await;
        assert_eq!(created.body["status"], "requires_confirmation");
        assert_eq!(
            created.body["latest_charge"],
            Value::Null,
            "no money moved yet"
        );
        let id = created.body["id"].as_str().unwrap().to_owned();
        assert!(id.starts_with("pi_"), "{id}");

        let confirmed = post(
            &sim,
            &format!("/v1/payment_intents/{id}/confirm"),
            &Form::new(),
            Some("confirm-1"),
        )
        .await;
        assert_eq!(
            confirmed.body["status"], "requires_capture",
            "{}",
            confirmed.body
        );
        assert_eq!(confirmed.body["amount_capturable"], 1000);

        let captured = post(
            &sim,
            &format!("/v1/payment_intents/{id}/capture"),
            &Form::new().field("amount_to_capture", "600"),
            Some("capture-1"),
        )
        .await;
        assert_eq!(captured.body["status"], "succeeded", "{}", captured.body);
        assert_eq!(captured.body["amount_received"], 600);

        let too_much = post(
            &sim,
            "/v1/refunds",
            &Form::new()
                .field("payment_intent", &id)
                .field("amount", "601"),
            Some("refund-0"),
        )
        .await;
        assert_eq!(
            too_much.status,
            StatusCode::BAD_REQUEST,
            "{}",
            too_much.body
        );
        assert_eq!(too_much.error_code(), Some("amount_too_large"));

        let refund = post(
            &sim,
            "/v1/refunds",
            &Form::new().field("payment_intent", &id),
            Some("refund-1"),
        )
        .await;
        assert_eq!(refund.body["status"], "succeeded");
        assert_eq!(refund.body["amount"], 600, "no amount: the remainder");
        let refund_id = refund.body["id"].as_str().unwrap();
        let read = get(&sim, &format!("/v1/refunds/{refund_id}")).await;
        assert_eq!(read.body, refund.body);

        let intent = get(
            &sim,
            &format!("/v1/payment_intents/{id}?expand[0]=latest_charge"),
        )
        .await;
        let charge = &intent.body["latest_charge"];
        assert_eq!(charge["amount_captured"], 600);
        assert_eq!(charge["amount_refunded"], 600);
        assert_eq!(charge["refunded"], true);
        assert_eq!(charge["refunds"]["data"][0]["id"], refund_id);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_decline_is_a_402_card_error_carrying_the_payment_intent_and_replays_as_such() {
    bounded(async {
        let sim = stripe_sim().await;
        let form = intent_form(500, "pm_card_chargeDeclined", "automatic").field("confirm", "true");
        let declined = post(&sim, "/v1/payment_intents", &form, Some("decline-1")).await;
        assert_eq!(
            declined.status,
            StatusCode::PAYMENT_REQUIRED,
            "{}",
            declined.body
        );
        let error: ErrorBody = serde_json::from_value(declined.body.clone()).unwrap();
        assert_eq!(error.error.code.as_deref(), Some("card_declined"));
        let intent = error.error.payment_intent.expect("the intent exists");
        assert_eq!(
            serde_json::to_value(intent.status).unwrap(),
            "requires_payment_method"
        );
        assert_eq!(
            intent
                .last_payment_error
                .and_then(|e| e.decline_code)
                .as_deref(),
            Some("generic_decline")
        );
        let again = post(&sim, "/v1/payment_intents", &form, Some("decline-1")).await;
        assert_eq!(again.status, StatusCode::PAYMENT_REQUIRED);
        assert_eq!(
            again.body, declined.body,
            "the stored answer, byte for byte"
        );
        assert_eq!(again.header("Idempotent-Replayed"), Some("true"));
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn keys_replay_the_first_answer_and_refuse_other_parameters() {
    bounded(async {
        let sim = stripe_sim().await;
        let form = intent_form(700, "pm_card_visa", "automatic");
        let first = post(&sim, "/v1/payment_intents", &form, Some("same")).await;
        let second = post(&sim, "/v1/payment_intents", &form, Some("same")).await;
        assert_eq!(first.body, second.body);
        assert_eq!(first.header("Idempotent-Replayed"), None);
        assert_eq!(second.header("Idempotent-Replayed"), Some("true"));
        assert_eq!(second.header("Idempotency-Key"), Some("same"));
        assert!(second
            .header("Request-Id")
            .is_some_and(|id| id.starts_with("req_")));

        let other = post(
            &sim,
            "/v1/payment_intents",
            &intent_form(701, "pm_card_visa", "automatic"),
            Some("same"),
        )
        .await;
        assert_eq!(other.status, StatusCode::BAD_REQUEST);
        assert_eq!(other.body["error"]["type"], "idempotency_error");

        let unkeyed_a = post(&sim, "/v1/payment_intents", &form, None).await;
        let unkeyed_b = post(&sim, "/v1/payment_intents", &form, None).await;
        assert_ne!(
            unkeyed_a.body["id"], unkeyed_b.body["id"],
            "no key, no idempotency"
        );
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn requests_stripe_would_refuse_are_refused_as_stripe_refuses_them() {
    bounded(async {
        let sim = stripe_sim().await;
        let unknown = post(
            &sim,
            "/v1/payment_intents",
            &intent_form(100, "pm_card_visa", "automatic").field("colour", "blue"),
            Some("u-1"),
        )
        .await;
        assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
        assert_eq!(unknown.error_code(), Some("parameter_unknown"));
        assert_eq!(unknown.body["error"]["param"], "colour");

        let missing = post(
            &sim,
            "/v1/payment_intents",
            &Form::new().field("currency", "usd"),
            Some("u-2"),
        )
        .await;
        assert_eq!(missing.error_code(), Some("parameter_missing"));
        assert_eq!(missing.body["error"]["param"], "amount");

        let trap = post(
            &sim,
            "/v1/payment_intents",
            &Form::new()
                .field("amount", "100")
                .field("currency", "usd")
                .field("payment_method", "pm_card_visa")
                .field("confirm", "true"),
            Some("u-3"),
        )
        .await;
        assert_eq!(trap.status, StatusCode::BAD_REQUEST);
        assert_eq!(trap.body["error"]["param"], "return_url");

        let no_key =
            send(reqwest::Client::new().get(format!("{}/v1/payment_intents", sim.base))).await;
        assert_eq!(no_key.status, StatusCode::UNAUTHORIZED);
        let live_key = send(
            reqwest::Client::new()
                .get(format!("{}/v1/payment_intents", sim.base))
                .bearer_auth("sk_live_nope"),
        )
        .await;
        assert_eq!(live_key.status, StatusCode::UNAUTHORIZED);
        let basic = send(
            reqwest::Client::new()
                .get(format!("{}/v1/payment_intents", sim.base))
                .basic_auth(KEY, Some("")),
        )
        .await;
        assert_eq!(basic.status, StatusCode::OK, "{}", basic.body);

        let missing_intent = get(&sim, "/v1/payment_intents/pi_nope").await;
        assert_eq!(missing_intent.status, StatusCode::NOT_FOUND);
        assert_eq!(missing_intent.error_code(), Some("resource_missing"));
        let no_route = get(&sim, "/v1/charges").await;
        assert_eq!(no_route.status, StatusCode::NOT_FOUND);
        assert!(no_route.body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Unrecognized request URL"));
        let lookup_by_key = get(&sim, "/v1/operations?idempotency_key=k").await;
        assert_eq!(
            lookup_by_key.status,
            StatusCode::NOT_FOUND,
            "Stripe has no lookup by key"
        );
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn authentication_required_is_a_redirect_and_an_abandoned_one_is_canceled() {
    bounded(async {
        let sim = stripe_sim().await;
        let form = intent_form(900, "pm_card_authenticationRequired", "automatic")
            .field("confirm", "true")
            .field("return_url", "https://shop.example/back");
        let answer = post(&sim, "/v1/payment_intents", &form, Some("r-1")).await;
        assert_eq!(answer.body["status"], "requires_action", "{}", answer.body);
        let action = &answer.body["next_action"];
        assert_eq!(action["type"], "redirect_to_url");
        assert_eq!(
            action["redirect_to_url"]["return_url"],
            "https://shop.example/back"
        );
        assert!(action["redirect_to_url"]["url"]
            .as_str()
            .unwrap()
            .contains("/authenticate"));
        let id = answer.body["id"].as_str().unwrap();

        let canceled = post(
            &sim,
            &format!("/v1/payment_intents/{id}/cancel"),
            &Form::new().field("cancellation_reason", "abandoned"),
            Some("r-2"),
        )
        .await;
        assert_eq!(canceled.body["status"], "canceled", "{}", canceled.body);
        assert_eq!(canceled.body["cancellation_reason"], "abandoned");
        assert_eq!(canceled.body["next_action"], Value::Null);
        let again = post(
            &sim,
            &format!("/v1/payment_intents/{id}/cancel"),
            &Form::new(),
            Some("r-3"),
        )
        .await;
        assert_eq!(again.error_code(), Some("payment_intent_unexpected_state"));
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn listings_page_newest_first_by_cursor_within_a_creation_window() {
    bounded(async {
        let sim = stripe_sim().await;
        let mut ids = Vec::new();
        for n in 0..5 {
            let answer = post(
                &sim,
                "/v1/payment_intents",
                &intent_form(100 + n, "pm_card_visa", "automatic"),
                Some(&format!("l-{n}")),
            )
            .await;
            ids.push(answer.body["id"].as_str().unwrap().to_owned());
        }
        ids.reverse();
        let now = chrono::Utc::now().timestamp();
        let window = format!("created[gte]={}&created[lte]={}", now - 60, now + 60);
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let after = cursor
                .as_deref()
                .map(|id| format!("&starting_after={id}"))
                .unwrap_or_default();
            let page = get(
                &sim,
                &format!("/v1/payment_intents?limit=2&{window}{after}"),
            )
            .await;
            assert_eq!(page.body["object"], "list", "{}", page.body);
            let data = page.body["data"].as_array().unwrap();
            seen.extend(data.iter().map(|pi| pi["id"].as_str().unwrap().to_owned()));
            cursor = seen.last().cloned();
            if page.body["has_more"] != true {
                break;
            }
        }
        assert_eq!(seen, ids);
        let old = get(&sim, "/v1/payment_intents?created[lt]=1000").await;
        assert_eq!(old.body["data"], Value::Array(Vec::new()));
        sim.shutdown().await;
    })
    .await;
}

async fn control(sim: &RunningSim, path: &str, body: Value) {
    let answer = send(
        reqwest::Client::new()
            .post(format!("{}/sim{path}", sim.base))
            .json(&body),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{path}: {}", answer.body);
}

#[tokio::test]
async fn balance_transactions_record_every_movement_with_fees_and_nets() {
    bounded(async {
        let sim = stripe_sim().await;
        let charged =
            |n: i64| intent_form(10_000 * n, "pm_card_visa", "automatic").field("confirm", "true");
        let refunded = post(&sim, "/v1/payment_intents", &charged(1), Some("b-1")).await;
        let refunded_id = refunded.body["id"].as_str().unwrap().to_owned();
        let refund = post(
            &sim,
            "/v1/refunds",
            &Form::new()
                .field("payment_intent", refunded_id.as_str())
                .field("amount", "2500"),
            Some("b-1-refund"),
        )
        .await;
        assert_eq!(refund.status, StatusCode::OK, "{}", refund.body);
        let refund_id = refund.body["id"].as_str().unwrap().to_owned();
        control(&sim, &format!("/operations/{refund_id}/fail"), json!({})).await;
        // A refund made in the dashboard is a Refund object with its balance transaction too.
        let refunded_charge = refunded.body["latest_charge"].as_str().unwrap().to_owned();
        control(
            &sim,
            &format!("/charges/{refunded_charge}/refund_out_of_band"),
            json!({"amount_minor": 1_000}),
        )
        .await;
        let disputed = post(&sim, "/v1/payment_intents", &charged(2), Some("b-2")).await;
        let disputed_charge = disputed.body["latest_charge"].as_str().unwrap().to_owned();
        control(
            &sim,
            &format!("/charges/{disputed_charge}/dispute"),
            json!({}),
        )
        .await;

        // Newest first, two per page, until has_more is false.
        let mut seen: Vec<Value> = Vec::new();
        loop {
            let after = seen
                .last()
                .map(|txn| format!("&starting_after={}", txn["id"].as_str().unwrap()))
                .unwrap_or_default();
            let page = get(
                &sim,
                &format!("/v1/balance_transactions?limit=2&expand[]=data.source{after}"),
            )
            .await;
            assert_eq!(page.status, StatusCode::OK, "{}", page.body);
            seen.extend(page.body["data"].as_array().unwrap().iter().cloned());
            if page.body["has_more"] != true {
                break;
            }
        }
        let mut movements: Vec<(String, i64, i64, i64)> = seen
            .iter()
            .map(|txn| {
                let parsed: BalanceTransaction = serde_json::from_value(txn.clone()).unwrap();
                assert_eq!(parsed.net, parsed.amount - parsed.fee, "{txn}");
                (
                    parsed.reporting_category,
                    parsed.amount,
                    parsed.fee,
                    parsed.net,
                )
            })
            .collect();
        movements.sort();
        assert_eq!(
            movements,
            [
                ("charge".to_owned(), 10_000, 290, 9_710),
                ("charge".to_owned(), 20_000, 580, 19_420),
                ("dispute".to_owned(), -20_000, 1_500, -21_500),
                ("refund".to_owned(), -2_500, 0, -2_500),
                ("refund".to_owned(), -1_000, 0, -1_000),
                ("refund_failure".to_owned(), 2_500, 0, 2_500),
            ]
        );
        let dashboard = seen.iter().find(|txn| txn["amount"] == -1_000).unwrap();
        let refund_of_dashboard = get(
            &sim,
            &format!(
                "/v1/refunds/{}",
                dashboard["source"]["id"].as_str().unwrap()
            ),
        )
        .await;
        assert_eq!(
            refund_of_dashboard.status,
            StatusCode::OK,
            "{}",
            refund_of_dashboard.body
        );
        assert_eq!(refund_of_dashboard.body["status"], "succeeded");
        let charge = get(&sim, &format!("/v1/charges/{refunded_charge}")).await;
        assert_eq!(charge.body["amount_refunded"], 1_000);
        assert_eq!(charge.body["refunds"]["data"].as_array().unwrap().len(), 2);
        for txn in &seen {
            let mut plain = txn.clone();
            plain["source"] = Value::String(String::new());
            assert_shaped_as_fixture("balance_transaction", &plain, &[]);
            // The expanded source names its PaymentIntent, whatever it is.
            let intent = txn["source"]["payment_intent"].as_str().unwrap();
            assert!(
                intent == refunded_id || intent == disputed.body["id"],
                "{txn}"
            );
        }

        let by_type = get(&sim, "/v1/balance_transactions?type=refund_failure").await;
        assert_eq!(by_type.body["data"].as_array().unwrap().len(), 1);
        let dispute = get(
            &sim,
            &format!(
                "/v1/disputes?payment_intent={}",
                disputed.body["id"].as_str().unwrap()
            ),
        )
        .await;
        let withdrawal = &dispute.body["data"][0]["balance_transactions"][0];
        assert_eq!(
            (withdrawal["amount"].as_i64(), withdrawal["fee"].as_i64()),
            (Some(-20_000), Some(1_500))
        );
        let one = get(
            &sim,
            &format!(
                "/v1/balance_transactions/{}",
                withdrawal["id"].as_str().unwrap()
            ),
        )
        .await;
        assert_eq!(&one.body, withdrawal);
        let missing = get(&sim, "/v1/balance_transactions?payout=po_none").await;
        assert_eq!(missing.status, StatusCode::NOT_FOUND);
        let old = get(&sim, "/v1/balance_transactions?created[lt]=1000").await;
        assert_eq!(old.body["data"], Value::Array(Vec::new()));
        sim.shutdown().await;
    })
    .await;
}

type Deliveries = Arc<Mutex<Vec<(String, Bytes)>>>;

/// A webhook endpoint on loopback: its URL, and what it received (signature, body).
async fn start_receiver() -> (String, Deliveries) {
    let deliveries: Deliveries = Arc::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/hook", routing::post(receive))
        .with_state(deliveries.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, deliveries)
}

async fn receive(
    State(deliveries): State<Deliveries>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let signature = headers
        .get(SIGNATURE_HEADER)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    deliveries.lock().unwrap().push((signature, body));
    StatusCode::OK
}

#[tokio::test]
async fn events_are_stripe_event_objects_signed_with_stripe_signature() {
    bounded(async {
        let (url, deliveries) = start_receiver().await;
        let secret = "whsec_test";
        let sim = RunningSim::start(SimConfig {
            dialect: Dialect::Stripe,
            webhook_url: Some(url),
            webhook_secret: secret.to_owned(),
            ..SimConfig::default()
        })
        .await;
        let answer = post(
            &sim,
            "/v1/payment_intents",
            &intent_form(1200, "pm_card_visa", "automatic").field("confirm", "true"),
            Some("e-1"),
        )
        .await;
        let id = answer.body["id"].as_str().unwrap().to_owned();
        assert!(eventually(5_000, || deliveries.lock().unwrap().len() >= 2).await);
        let deliveries = deliveries.lock().unwrap().clone();
        let now = chrono::Utc::now().timestamp();
        let mut types = BTreeSet::new();
        for (signature, body) in &deliveries {
            asiento_psp::verify(secret, signature, body, now, 300).expect("signed");
            let event: asiento_psp::stripe::wire::Event = serde_json::from_slice(body).unwrap();
            assert!(event.id.starts_with("evt_"));
            assert_eq!(
                event
                    .request
                    .and_then(|request| request.idempotency_key)
                    .as_deref(),
                Some("e-1")
            );
            types.insert(event.kind.clone());
            match event.kind.as_str() {
                "payment_intent.succeeded" => {
                    assert_eq!(event.data.object["id"], id.as_str());
                    assert_shaped_as_fixture("payment_intent", &event.data.object, &[]);
                }
                "charge.succeeded" => {
                    assert_eq!(event.data.object["payment_intent"], id.as_str())
                }
                other => panic!("unexpected event {other}"),
            }
        }
        assert_eq!(
            types,
            BTreeSet::from([
                "payment_intent.succeeded".to_owned(),
                "charge.succeeded".to_owned()
            ])
        );
        sim.shutdown().await;
    })
    .await;
}

/// `POST /sim/payouts` pays out every balance transaction not yet paid out, for their net; a
/// payout that fails afterwards puts its money back (a `payout_failure` the next one covers);
/// each is announced by a signed `payout.paid` or `payout.failed`.
#[tokio::test]
async fn payouts_pay_out_the_net_of_what_no_payout_covered_and_a_failed_one_comes_back() {
    bounded(async {
        let (url, deliveries) = start_receiver().await;
        let sim = RunningSim::start(SimConfig {
            dialect: Dialect::Stripe,
            fee_bps: 290,
            webhook_url: Some(url),
            webhook_secret: "whsec_test".to_owned(),
            ..SimConfig::default()
        })
        .await;
        let charged = post(
            &sim,
            "/v1/payment_intents",
            &intent_form(10_000, "pm_card_visa", "automatic").field("confirm", "true"),
            Some("p-1"),
        )
        .await;
        let intent = charged.body["id"].as_str().unwrap().to_owned();
        let refund = post(
            &sim,
            "/v1/refunds",
            &Form::new()
                .field("payment_intent", intent.as_str())
                .field("amount", "2500"),
            Some("p-1-refund"),
        )
        .await;
        assert_eq!(refund.status, StatusCode::OK, "{}", refund.body);

        let pay_out = || async {
            let answer = send(
                reqwest::Client::new()
                    .post(format!("{}/sim/payouts", sim.base))
                    .json(&json!({})),
            )
            .await;
            assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
            answer.body["data"].as_array().unwrap().clone()
        };
        let made = pay_out().await;
        assert_eq!(made.len(), 1, "{made:?}");
        let payout = &made[0];
        assert_eq!(
            (payout["amount"].as_i64(), payout["status"].as_str()),
            (Some(10_000 - 290 - 2_500), Some("paid"))
        );
        assert_shaped_as_fixture("payout", payout, &[]);
        let id = payout["id"].as_str().unwrap().to_owned();
        let read = get(&sim, &format!("/v1/payouts/{id}")).await;
        assert_eq!(&read.body, payout);
        let paid = get(&sim, &format!("/v1/balance_transactions?payout={id}")).await;
        let mut kinds: Vec<(String, i64)> = paid.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|txn| {
                (
                    txn["type"].as_str().unwrap().to_owned(),
                    txn["net"].as_i64().unwrap(),
                )
            })
            .collect();
        kinds.sort();
        assert_eq!(
            kinds,
            [
                ("charge".to_owned(), 9_710),
                ("payout".to_owned(), -7_210),
                ("refund".to_owned(), -2_500)
            ],
            "what it paid out, and its own withdrawal"
        );
        let own = get(
            &sim,
            &format!("/v1/balance_transactions?source={id}&expand[]=data.source"),
        )
        .await;
        assert_eq!(own.body["data"][0]["type"], "payout");
        assert_eq!(own.body["data"][0]["amount"], -7_210);
        assert_eq!(
            &own.body["data"][0]["source"], payout,
            "the payout, expanded"
        );
        assert!(pay_out().await.is_empty(), "nothing is left to pay out");

        let failed = send(
            reqwest::Client::new()
                .post(format!("{}/sim/payouts/{id}/fail", sim.base))
                .json(&json!({})),
        )
        .await;
        assert_eq!(failed.status, StatusCode::OK, "{}", failed.body);
        assert_eq!(failed.body["status"], "failed");
        let listed = get(&sim, "/v1/payouts?status=failed").await;
        assert_eq!(listed.body["data"].as_array().unwrap().len(), 1);
        let again = pay_out().await;
        assert_eq!(
            again.len(),
            1,
            "the failed payout's money is paid out again"
        );
        assert_eq!(again[0]["amount"], 7_210);
        let covered = get(
            &sim,
            &format!(
                "/v1/balance_transactions?payout={}",
                again[0]["id"].as_str().unwrap()
            ),
        )
        .await;
        let mut kinds: Vec<&str> = covered.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|txn| txn["type"].as_str().unwrap())
            .collect();
        kinds.sort_unstable();
        assert_eq!(kinds, ["payout", "payout_failure"]);

        assert!(eventually(5_000, || deliveries.lock().unwrap().len() >= 8).await);
        let now = chrono::Utc::now().timestamp();
        let mut payout_events = Vec::new();
        for (signature, body) in deliveries.lock().unwrap().iter() {
            asiento_psp::verify("whsec_test", signature, body, now, 300).expect("signed");
            let event: asiento_psp::stripe::wire::Event = serde_json::from_slice(body).unwrap();
            if event.kind.starts_with("payout.") {
                payout_events.push((event.kind, event.data.object["status"].clone()));
            }
        }
        assert_eq!(
            payout_events,
            [
                ("payout.created".to_owned(), json!("paid")),
                ("payout.paid".to_owned(), json!("paid")),
                ("payout.failed".to_owned(), json!("failed")),
                ("payout.created".to_owned(), json!("paid")),
                ("payout.paid".to_owned(), json!("paid")),
            ]
        );
        sim.shutdown().await;
    })
    .await;
}
