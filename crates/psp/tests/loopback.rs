//! The client against the real simulator over loopback, and the simulator's
//! webhooks against a real receiver: every "done when" of the provider issue.
//! Every test is bounded by [`TEST_TIMEOUT_S`].

// A test harness: helpers outside `#[test]` functions may panic too.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use asiento_psp::{
    sign, verify, Charge, ChargeOutcome, ChargeStatus, ClientConfig, CreateCharge, DisputeStatus,
    EventType, HttpProvider, Provider, ProviderError, RetrySleeper, WebhookEvent, SIGNATURE_HEADER,
};
use asiento_psp_sim::Faults;
use asiento_psp_sim::{SimConfig, Simulator};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use chrono::Utc;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use common::{bounded, eventually, RunningSim};
use tokio::sync::oneshot;

const SECRET: &str = "whsec_loopback";

impl RunningSim {
    async fn control(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let response = reqwest::Client::new()
            .request(method, format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
        response.json().await.unwrap()
    }

    async fn set_faults(&self, faults: Value) {
        self.control(reqwest::Method::POST, "/sim/faults", faults)
            .await;
    }
}

fn fast_client(base: &str) -> HttpProvider {
    let config = ClientConfig {
        connect_timeout_ms: 500,
        request_timeout_ms: 2_000,
        attempts_max: 4,
        backoff_base_ms: 5,
        backoff_max_ms: 20,
        ..ClientConfig::default()
    };
    HttpProvider::new("sim", base, config).unwrap()
}

fn charge_request(key: &str, method: &str, capture: bool) -> CreateCharge {
    CreateCharge {
        idempotency_key: key.to_string(),
        amount_minor: 10_000,
        currency: "USD".to_string(),
        payment_method: method.to_string(),
        capture,
        reference: Some(format!("pay_{key}")),
        customer: None,
        metadata: BTreeMap::from([("order".to_string(), "1001".to_string())]),
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

/// Records the delays the client asks for, and really waits them.
#[derive(Default)]
struct RecordingSleeper {
    delays: Mutex<Vec<Duration>>,
}

impl RetrySleeper for RecordingSleeper {
    fn sleep(&self, delay: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.delays.lock().unwrap().push(delay);
        Box::pin(tokio::time::sleep(delay))
    }
}

// --- a webhook receiver, as the ledger's endpoint would be ---

#[derive(Clone, Default)]
struct Received {
    /// Every verified delivery, in arrival order.
    events: Vec<WebhookEvent>,
    /// Deliveries whose signature did not verify.
    invalid: u32,
    /// Requests answered 500 on purpose.
    refused: u32,
}

#[derive(Clone)]
struct ReceiverState {
    received: Arc<Mutex<Received>>,
    refuse_first: Arc<AtomicU32>,
}

/// A copy, so that no lock is held across an await.
fn snapshot(received: &Mutex<Received>) -> Received {
    received.lock().unwrap().clone()
}

async fn receive(
    State(state): State<ReceiverState>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let header = headers
        .get(SIGNATURE_HEADER)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let mut received = state.received.lock().unwrap();
    if verify(SECRET, header, &body, Utc::now().timestamp(), 300).is_err() {
        received.invalid += 1;
        return StatusCode::BAD_REQUEST;
    }
    if state
        .refuse_first
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        received.refused += 1;
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    received.events.push(serde_json::from_slice(&body).unwrap());
    StatusCode::OK
}

async fn start_receiver(refuse_first: u32) -> (String, Arc<Mutex<Received>>) {
    let state = ReceiverState {
        received: Arc::default(),
        refuse_first: Arc::new(AtomicU32::new(refuse_first)),
    };
    let received = Arc::clone(&state.received);
    let app = Router::new()
        .route("/webhooks/sim", post(receive))
        .with_state(state);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhooks/sim", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

fn webhook_config(url: String) -> SimConfig {
    SimConfig {
        webhook_url: Some(url),
        webhook_secret: SECRET.to_string(),
        seed: 11,
        webhook_backoff_base_ms: 10,
        webhook_backoff_max_ms: 50,
        ..SimConfig::default()
    }
}

// --- idempotency ---

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_reused_by_50_concurrent_calls_returns_one_charge() {
    bounded(async {
        let sim = RunningSim::start(SimConfig::default()).await;
        let client = Arc::new(fast_client(&sim.base));
        let calls: Vec<_> = (0..50)
            .map(|_| {
                let client = Arc::clone(&client);
                tokio::spawn(async move {
                    client
                        .create_charge(&charge_request("same-key", "pm_card_ok", true))
                        .await
                })
            })
            .collect();
        let mut ids = HashSet::new();
        for call in calls {
            match call.await.unwrap() {
                ChargeOutcome::Succeeded(charge) => {
                    ids.insert(charge.id);
                }
                other => panic!("unexpected outcome {other:?}"),
            }
        }
        assert_eq!(ids.len(), 1, "every call got the same charge");
        let held = sim.sim.charges();
        assert_eq!(held.len(), 1);
        assert!(ids.contains(&held[0].id));
        assert_eq!(held[0].idempotency_key, "same-key");
        assert_eq!(sim.sim.events().len(), 1, "one charge, one event");
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_key_reused_with_another_body_is_rejected_not_unknown() {
    bounded(async {
        let sim = RunningSim::start(SimConfig::default()).await;
        let client = fast_client(&sim.base);
        charge_of(
            client
                .create_charge(&charge_request("k", "pm_card_ok", true))
                .await,
        );
        let mut other = charge_request("k", "pm_card_ok", true);
        other.amount_minor = 1;
        match client.create_charge(&other).await {
            ChargeOutcome::Rejected(r) => {
                assert_eq!((r.status, r.code.as_str()), (422, "idempotency_key_reused"))
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
        let mut bad = charge_request("k2", "pm_card_ok", true);
        bad.currency = "usd".to_string();
        assert!(matches!(
            client.create_charge(&bad).await,
            ChargeOutcome::Rejected(r) if r.code == "currency_invalid"
        ));
        assert_eq!(sim.sim.charges().len(), 1);
        sim.shutdown().await;
    })
    .await;
}

// --- timeouts: unknown is not failed ---

#[tokio::test]
async fn card_timeout_charges_once_is_unknown_and_a_lookup_by_key_finds_it() {
    bounded(async {
        let sim = RunningSim::start(SimConfig {
            hang_ms: 10_000,
            ..SimConfig::default()
        })
        .await;
        let config = ClientConfig {
            request_timeout_ms: 300,
            attempts_max: 3,
            ..ClientConfig::default()
        };
        let client = HttpProvider::new("sim", &sim.base, config).unwrap();
        let started = Instant::now();
        let outcome = client
            .create_charge(&charge_request("t-1", "pm_card_timeout", true))
            .await;
        assert!(
            matches!(&outcome, ChargeOutcome::Unknown { reason } if reason.contains("may have happened")),
            "{outcome:?}"
        );
        // A write that timed out after sending is not retried: the timeout
        // is the caller's whole budget.
        assert!(started.elapsed() < Duration::from_millis(1_500), "{:?}", started.elapsed());

        let held = sim.sim.charges();
        assert_eq!(held.len(), 1, "the provider really charged, once");
        assert_eq!(held[0].status, ChargeStatus::Succeeded);
        let found = client.find_charge_by_key("t-1").await.unwrap().unwrap();
        assert_eq!(found.id, held[0].id);
        assert_eq!(found.amount_captured, 10_000);
        assert_eq!(found.reference.as_deref(), Some("pay_t-1"));
        assert_eq!(client.find_charge_by_key("never-sent").await.unwrap(), None);
        // A hanging answer does not hold the simulator's shutdown.
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn the_timeout_fault_hangs_after_the_effect_and_slow_cards_answer_late() {
    bounded(async {
        let sim = RunningSim::start(SimConfig {
            hang_ms: 10_000,
            slow_ms: 300,
            ..SimConfig::default()
        })
        .await;
        let client = fast_client(&sim.base);
        let started = Instant::now();
        let slow = charge_of(
            client
                .create_charge(&charge_request("slow", "pm_card_slow", true))
                .await,
        );
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(slow.status, ChargeStatus::Succeeded);

        sim.set_faults(json!({"timeout_rate": 1.0})).await;
        let short = HttpProvider::new(
            "sim",
            &sim.base,
            ClientConfig {
                request_timeout_ms: 200,
                ..ClientConfig::default()
            },
        )
        .unwrap();
        let outcome = short
            .create_charge(&charge_request("hang", "pm_card_ok", true))
            .await;
        assert!(
            matches!(outcome, ChargeOutcome::Unknown { .. }),
            "{outcome:?}"
        );
        sim.set_faults(json!({"timeout_rate": 0.0})).await;
        assert!(short.find_charge_by_key("hang").await.unwrap().is_some());
        sim.shutdown().await;
    })
    .await;
}

// --- retries ---

#[tokio::test]
async fn retries_through_errors_before_and_after_creation_never_make_a_second_charge() {
    bounded(async {
        let sim = RunningSim::start(SimConfig {
            seed: 42,
            ..SimConfig::default()
        })
        .await;
        sim.set_faults(json!({"error_rate": 0.5})).await;
        let sleeper = Arc::new(RecordingSleeper::default());
        let config = ClientConfig {
            attempts_max: 12,
            backoff_base_ms: 1,
            backoff_max_ms: 4,
            ..ClientConfig::default()
        };
        let client = HttpProvider::new("sim", &sim.base, config)
            .unwrap()
            .with_sleeper(sleeper.clone());
        let keys: Vec<String> = (0..30).map(|i| format!("retry-{i}")).collect();
        let mut outcomes = HashMap::new();
        for key in &keys {
            outcomes.insert(
                key.clone(),
                client
                    .create_charge(&charge_request(key, "pm_card_ok", true))
                    .await,
            );
        }
        sim.set_faults(json!({"error_rate": 0.0})).await;

        let retries = sleeper.delays.lock().unwrap().len();
        assert!(
            retries >= 10,
            "the fault made the client retry ({retries} retries)"
        );
        let held = sim.sim.charges();
        let mut by_key: HashMap<&str, Vec<&Charge>> = HashMap::new();
        for charge in &held {
            by_key
                .entry(charge.idempotency_key.as_str())
                .or_default()
                .push(charge);
        }
        assert!(
            by_key.values().all(|charges| charges.len() == 1),
            "a key made two charges"
        );
        assert_eq!(
            sim.sim.events().len(),
            held.len(),
            "one charge.succeeded per charge"
        );
        for (key, outcome) in &outcomes {
            match outcome {
                ChargeOutcome::Succeeded(charge) => {
                    assert_eq!(by_key[key.as_str()][0].id, charge.id)
                }
                ChargeOutcome::Unknown { .. } => {
                    // 12 attempts at 50 % make this rare; the key still
                    // tells the truth.
                    let found = client.find_charge_by_key(key).await.unwrap();
                    assert_eq!(
                        found.map(|c| c.id),
                        by_key.get(key.as_str()).map(|c| c[0].id.clone())
                    );
                }
                other => panic!("{key}: unexpected {other:?}"),
            }
        }
        sim.shutdown().await;
    })
    .await;
}

/// A provider that answers a script of statuses to `POST /v1/charges`,
/// recording the idempotency key of every attempt.
async fn scripted_provider(
    script: Vec<(u16, Option<&'static str>)>,
) -> (String, Arc<Mutex<Vec<String>>>) {
    #[derive(Clone)]
    struct Script {
        steps: Arc<Vec<(u16, Option<&'static str>)>>,
        keys: Arc<Mutex<Vec<String>>>,
    }
    async fn answer(State(s): State<Script>, headers: HeaderMap) -> axum::response::Response {
        let key = headers
            .get("Idempotency-Key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let n = {
            let mut keys = s.keys.lock().unwrap();
            keys.push(key.clone());
            keys.len() - 1
        };
        let (status, retry_after) = s.steps[n.min(s.steps.len() - 1)];
        let status = StatusCode::from_u16(status).unwrap();
        if status.is_success() {
            let now = Utc::now();
            let charge = json!({"id": "ch_scripted", "status": "succeeded", "amount_minor": 10_000,
                "currency": "USD", "amount_captured": 10_000, "amount_refunded": 0,
                "idempotency_key": key, "created": now, "updated": now});
            return (status, axum::Json(charge)).into_response();
        }
        let body = json!({"error": {"type": "x", "code": format!("scripted_{}", status.as_u16()), "message": "scripted"}});
        let mut response = (status, axum::Json(body)).into_response();
        if let Some(after) = retry_after {
            response
                .headers_mut()
                .insert("Retry-After", after.parse().unwrap());
        }
        response
    }
    let keys = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route("/v1/charges", post(answer))
        .with_state(Script {
            steps: Arc::new(script),
            keys: Arc::clone(&keys),
        });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, keys)
}

fn retry_client(base: &str, sleeper: Arc<RecordingSleeper>) -> HttpProvider {
    let config = ClientConfig {
        connect_timeout_ms: 500,
        request_timeout_ms: 2_000,
        attempts_max: 5,
        backoff_base_ms: 40,
        backoff_max_ms: 160,
        ..ClientConfig::default()
    };
    HttpProvider::new("scripted", base, config)
        .unwrap()
        .with_sleeper(sleeper)
        .with_jitter_seed(3)
}

#[tokio::test]
async fn the_retry_policy_backs_off_with_full_jitter_then_gives_up_as_unknown() {
    bounded(async {
        let (base, keys) = scripted_provider(vec![(503, None)]).await;
        let sleeper = Arc::new(RecordingSleeper::default());
        let client = retry_client(&base, sleeper.clone());
        let started = Instant::now();
        let outcome = client
            .create_charge(&charge_request("k-503", "pm_card_ok", true))
            .await;
        let elapsed = started.elapsed();

        match &outcome {
            ChargeOutcome::Unknown { reason } => assert!(reason.contains("5 attempt"), "{reason}"),
            other => panic!("gave up with {other:?}, not unknown"),
        }
        let keys = keys.lock().unwrap().clone();
        assert_eq!(keys.len(), 5, "attempts_max bounds the attempts");
        assert!(
            keys.iter().all(|k| k == "k-503"),
            "same key on every attempt: {keys:?}"
        );

        let delays = sleeper.delays.lock().unwrap().clone();
        assert_eq!(delays.len(), 4, "one delay between attempts");
        let ceilings_ms = [40u128, 80, 160, 160];
        for (delay, ceiling) in delays.iter().zip(ceilings_ms) {
            assert!(
                delay.as_millis() <= ceiling,
                "{delays:?} over {ceilings_ms:?}"
            );
        }
        // Jittered: not the plain exponential sequence.
        let plain: Vec<Duration> = ceilings_ms
            .iter()
            .map(|ms| Duration::from_millis(*ms as u64))
            .collect();
        assert_ne!(delays, plain);
        // The client really waited them.
        assert!(
            elapsed >= delays.iter().sum::<Duration>(),
            "{elapsed:?} vs {delays:?}"
        );

        // The seed replays the same jitter.
        let (base2, _) = scripted_provider(vec![(503, None)]).await;
        let sleeper2 = Arc::new(RecordingSleeper::default());
        retry_client(&base2, sleeper2.clone())
            .create_charge(&charge_request("k-503", "pm_card_ok", true))
            .await;
        assert_eq!(*sleeper2.delays.lock().unwrap(), delays);
    })
    .await;
}

#[tokio::test]
async fn four_xx_is_never_retried_but_429_is_and_retry_after_lengthens_the_wait() {
    bounded(async {
        let (base, keys) = scripted_provider(vec![(400, None)]).await;
        let sleeper = Arc::new(RecordingSleeper::default());
        let outcome = retry_client(&base, sleeper.clone())
            .create_charge(&charge_request("k-400", "pm_card_ok", true))
            .await;
        assert!(matches!(&outcome, ChargeOutcome::Rejected(r) if r.status == 400 && r.code == "scripted_400"), "{outcome:?}");
        assert_eq!(keys.lock().unwrap().len(), 1);
        assert!(sleeper.delays.lock().unwrap().is_empty());

        let (base, keys) = scripted_provider(vec![(429, Some("1")), (502, None), (200, None)]).await;
        let sleeper = Arc::new(RecordingSleeper::default());
        let outcome = retry_client(&base, sleeper.clone())
            .create_charge(&charge_request("k-429", "pm_card_ok", true))
            .await;
        assert!(matches!(outcome, ChargeOutcome::Succeeded(ref c) if c.id == "ch_scripted"), "{outcome:?}");
        assert_eq!(keys.lock().unwrap().len(), 3);
        let delays = sleeper.delays.lock().unwrap().clone();
        // Retry-After: 1 s, capped at backoff_max_ms (160 ms).
        assert_eq!(delays[0], Duration::from_millis(160));
        assert!(delays[1] <= Duration::from_millis(80));
    })
    .await;
}

#[tokio::test]
async fn connect_errors_are_retried_and_end_unknown_not_failed() {
    bounded(async {
        // A port that was just free: nothing listens there.
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let sleeper = Arc::new(RecordingSleeper::default());
        let client = retry_client(&base, sleeper.clone());
        let outcome = client.create_charge(&charge_request("k-down", "pm_card_ok", true)).await;
        assert!(matches!(&outcome, ChargeOutcome::Unknown { reason } if reason.contains("could not connect")), "{outcome:?}");
        assert_eq!(sleeper.delays.lock().unwrap().len(), 4);
        assert!(matches!(
            client.capture("ch_x", None, "USD", "cap-1").await,
            Err(ProviderError::Unknown { .. })
        ));
    })
    .await;
}

// --- webhooks ---

#[tokio::test]
async fn webhooks_arrive_signed_and_are_redelivered_until_a_2xx() {
    bounded(async {
        let (url, received) = start_receiver(2).await;
        let sim = RunningSim::start(webhook_config(url)).await;
        let client = fast_client(&sim.base);
        let charge = charge_of(
            client
                .create_charge(&charge_request("w-1", "pm_card_ok", true))
                .await,
        );

        assert!(eventually(5_000, || !received.lock().unwrap().events.is_empty()).await);
        let got = snapshot(&received);
        assert_eq!(
            got.refused, 2,
            "the first two deliveries were refused and retried"
        );
        assert_eq!(got.invalid, 0, "every delivery verified");
        let event = &got.events[0];
        assert_eq!(event.kind, EventType::ChargeSucceeded);
        assert_eq!(event.data.charge.as_ref().unwrap().id, charge.id);
        assert!(event.id.starts_with("evt_"));
        assert!((Utc::now().timestamp() - event.created).abs() < 60);

        // The signature covers the raw body: a changed body fails.
        let body = serde_json::to_vec(event).unwrap();
        let header = sign(SECRET, Utc::now().timestamp(), &body);
        let mut tampered = body.clone();
        tampered.push(b' ');
        assert!(verify(SECRET, &header, &tampered, Utc::now().timestamp(), 300).is_err());
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn with_duplicate_and_reorder_faults_every_event_still_arrives() {
    bounded(async {
        let (url, received) = start_receiver(0).await;
        let sim = RunningSim::start(webhook_config(url)).await;
        sim.set_faults(json!({"webhook_duplicate_rate": 0.5, "webhook_reorder": true}))
            .await;
        let client = fast_client(&sim.base);
        for i in 0..12 {
            let key = format!("dr-{i}");
            let charge = charge_of(
                client
                    .create_charge(&charge_request(&key, "pm_card_ok", i % 3 != 0))
                    .await,
            );
            if i % 3 == 0 {
                client
                    .capture(&charge.id, None, "USD", &format!("{key}-cap"))
                    .await
                    .unwrap();
            }
            if i % 2 == 0 {
                client
                    .refund(&charge.id, 2_500, "USD", &format!("{key}-ref"))
                    .await
                    .unwrap();
            }
        }
        let emitted: Vec<String> = sim.sim.events().into_iter().map(|e| e.id).collect();
        assert_eq!(emitted.len(), 12 + 4 + 6);
        let all_arrived = eventually(5_000, || {
            let got = snapshot(&received);
            let ids: HashSet<&str> = got.events.iter().map(|e| e.id.as_str()).collect();
            emitted.iter().all(|id| ids.contains(id.as_str()))
        })
        .await;
        assert!(all_arrived, "an event never arrived");
        let got = snapshot(&received);
        assert_eq!(got.invalid, 0);
        assert!(
            got.events.len() > emitted.len(),
            "the duplicate fault sent some twice"
        );
        let mut first_arrivals: Vec<&str> = Vec::new();
        for event in &got.events {
            if !first_arrivals.contains(&event.id.as_str()) {
                first_arrivals.push(&event.id);
            }
        }
        assert_ne!(
            first_arrivals,
            emitted.iter().map(String::as_str).collect::<Vec<_>>(),
            "the reorder fault shuffled them"
        );
        // A duplicate is the same event: same id, same content.
        let mut by_id: HashMap<&str, &WebhookEvent> = HashMap::new();
        for event in &got.events {
            if let Some(seen) = by_id.insert(&event.id, event) {
                assert_eq!(seen, event);
            }
        }
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn the_drop_fault_loses_events_and_no_url_only_records_them() {
    bounded(async {
        let (url, received) = start_receiver(0).await;
        let sim = RunningSim::start(webhook_config(url)).await;
        sim.set_faults(json!({"webhook_drop_rate": 1.0})).await;
        let client = fast_client(&sim.base);
        charge_of(
            client
                .create_charge(&charge_request("d-1", "pm_card_ok", true))
                .await,
        );
        sim.set_faults(json!({"webhook_drop_rate": 0.0})).await;
        let kept = charge_of(
            client
                .create_charge(&charge_request("d-2", "pm_card_ok", true))
                .await,
        );
        assert!(eventually(5_000, || !received.lock().unwrap().events.is_empty()).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let got = snapshot(&received);
        assert_eq!(got.events.len(), 1);
        assert_eq!(got.events[0].data.charge.as_ref().unwrap().id, kept.id);
        sim.shutdown().await;

        let quiet = RunningSim::start(SimConfig::default()).await;
        charge_of(
            fast_client(&quiet.base)
                .create_charge(&charge_request("q", "pm_card_declined", true))
                .await,
        );
        let events = quiet
            .control(reqwest::Method::GET, "/sim/events", Value::Null)
            .await;
        assert_eq!(events["data"][0]["type"], "charge.failed");
        quiet.shutdown().await;
    })
    .await;
}

// --- the settlement report ---

#[tokio::test]
async fn the_report_for_a_window_lists_exactly_the_charges_touched_in_it() {
    bounded(async {
        let sim = RunningSim::start(SimConfig {
            fee_bps: 300,
            ..SimConfig::default()
        })
        .await;
        let client = fast_client(&sim.base);
        let pause = || tokio::time::sleep(Duration::from_millis(5));

        let t0 = Utc::now();
        pause().await;
        let a = charge_of(
            client
                .create_charge(&charge_request("a", "pm_card_ok", true))
                .await,
        );
        let b = charge_of(
            client
                .create_charge(&charge_request("b", "pm_card_ok", false))
                .await,
        );
        pause().await;
        let t1 = Utc::now();
        pause().await;
        client
            .capture(&b.id, Some(6_000), "USD", "b-cap")
            .await
            .unwrap();
        let c = charge_of(
            client
                .create_charge(&charge_request("c", "pm_card_declined", true))
                .await,
        );
        pause().await;
        let t2 = Utc::now();
        pause().await;
        client.refund(&a.id, 1_000, "USD", "a-ref").await.unwrap();
        pause().await;
        let t3 = Utc::now();
        charge_of(
            client
                .create_charge(&charge_request("d", "pm_card_ok", true))
                .await,
        );

        let ids = |lines: &[asiento_psp::ReportLine]| -> Vec<String> {
            lines.iter().map(|l| l.charge_id.clone()).collect()
        };
        let w01 = client.settlement_report(t0, t1).await.unwrap().data;
        assert_eq!(ids(&w01), [a.id.clone(), b.id.clone()]);
        let w12 = client.settlement_report(t1, t2).await.unwrap().data;
        assert_eq!(ids(&w12), [b.id.clone(), c.id.clone()]);
        let w23 = client.settlement_report(t2, t3).await.unwrap().data;
        assert_eq!(ids(&w23), std::slice::from_ref(&a.id));
        let all = client.settlement_report(t0, t3).await.unwrap().data;
        assert_eq!(ids(&all), [a.id.clone(), b.id.clone(), c.id.clone()]);

        let fee = |line: &asiento_psp::ReportLine| -> Vec<(String, i64)> {
            line.provider_fees
                .iter()
                .map(|fee| (fee.transaction_id.clone(), fee.fee_minor))
                .collect()
        };
        let line_a = &w23[0];
        assert_eq!(
            (line_a.amount_captured, line_a.amount_refunded, fee(line_a)),
            (10_000, 1_000, vec![(format!("txn_{}", a.id), 300)])
        );
        assert_eq!(line_a.reference.as_deref(), Some("pay_a"));
        assert_eq!(line_a.idempotency_key, "a");
        assert!(line_a.last_touched >= t2 && line_a.last_touched < t3);
        let line_b = &w12[0];
        assert_eq!(
            (line_b.status, line_b.amount_captured, fee(line_b)),
            (
                ChargeStatus::Succeeded,
                6_000,
                vec![(format!("txn_{}", b.id), 180)]
            )
        );
        assert_eq!(
            (w12[1].status, fee(&w12[1])),
            (ChargeStatus::Failed, vec![])
        );

        let backwards = client.settlement_report(t1, t0).await;
        assert!(matches!(backwards, Err(ProviderError::Rejected(r)) if r.code == "window_invalid"));
        sim.shutdown().await;
    })
    .await;
}

// --- the rest of a charge's life, through the client and the control routes ---

#[tokio::test]
async fn redirects_captures_refunds_disputes_and_out_of_band_changes() {
    bounded(async {
        let (url, received) = start_receiver(0).await;
        let sim = RunningSim::start(webhook_config(url)).await;
        let client = fast_client(&sim.base);
        let post = reqwest::Method::POST;

        // A redirect waits for the customer, then completes.
        let pending = charge_of(client.create_charge(&charge_request("r", "pm_redirect", true)).await);
        assert_eq!(pending.status, ChargeStatus::RequiresAction);
        let redirect = pending.next_action.clone().unwrap().redirect_url;
        assert!(redirect.starts_with(&sim.base), "{redirect}");
        assert_eq!(reqwest::get(&redirect).await.unwrap().status(), 200);
        let path = format!("/sim/charges/{}/complete", pending.id);
        let done: Charge = serde_json::from_value(sim.control(post.clone(), &path, json!({"result": "succeeded"})).await).unwrap();
        assert_eq!((done.status, done.amount_captured), (ChargeStatus::Succeeded, 10_000));
        assert_eq!(client.get_charge(&pending.id).await.unwrap(), Some(done.clone()));

        // Refunds: bounded, replayed by key.
        let refund = client.refund(&done.id, 2_500, "USD", "r-ref-1").await.unwrap();
        assert_eq!(refund.charge.as_ref().unwrap().amount_refunded, 2_500);
        assert_eq!(client.refund(&done.id, 2_500, "USD", "r-ref-1").await.unwrap(), refund);
        let too_much = client.refund(&done.id, 7_501, "USD", "r-ref-2").await;
        assert!(matches!(too_much, Err(ProviderError::Rejected(r)) if r.status == 422 && r.code == "refund_exceeds_captured"));

        // Out of band: the provider's dashboard.
        let path = format!("/sim/charges/{}/refund_out_of_band", done.id);
        let after: Charge = serde_json::from_value(sim.control(post.clone(), &path, json!({"amount_minor": 500})).await).unwrap();
        assert_eq!(after.amount_refunded, 3_000);

        // Disputes open and close.
        let path = format!("/sim/charges/{}/dispute", done.id);
        let disputed: Charge = serde_json::from_value(sim.control(post.clone(), &path, json!({})).await).unwrap();
        assert_eq!(disputed.dispute.as_ref().unwrap().amount_minor, 7_000);
        let path = format!("/sim/charges/{}/dispute/close", done.id);
        let closed: Charge = serde_json::from_value(sim.control(post.clone(), &path, json!({"outcome": "lost"})).await).unwrap();
        assert_eq!(closed.dispute.unwrap().status, DisputeStatus::Lost);

        // Manual capture, once.
        let auth = charge_of(client.create_charge(&charge_request("m", "pm_card_ok", false)).await);
        assert_eq!(auth.status, ChargeStatus::RequiresCapture);
        let captured = client.capture(&auth.id, Some(4_000), "USD", "m-cap").await.unwrap();
        assert_eq!(captured.charge.unwrap().amount_captured, 4_000);
        let again = client.capture(&auth.id, None, "USD", "m-cap-2").await;
        assert!(matches!(again, Err(ProviderError::Rejected(r)) if r.status == 400 && r.code == "charge_not_capturable"));

        // An amount mismatch, injected silently for reconciliation tests.
        let path = format!("/sim/charges/{}/amount", auth.id);
        let drifted: Charge = serde_json::from_value(sim.control(post.clone(), &path, json!({"amount_minor": 3_999})).await).unwrap();
        assert_eq!(drifted.amount_captured, 3_999);

        // Declines and lookups of what does not exist.
        let declined = client.create_charge(&charge_request("x", "pm_card_declined", true)).await;
        assert!(matches!(declined, ChargeOutcome::Declined(ref c) if c.failure_code.as_deref() == Some("card_declined")));
        assert_eq!(client.get_charge("ch_missing").await.unwrap(), None);

        // Every change was announced, in order, with cumulative refunds.
        let expected = [
            EventType::ChargeSucceeded,
            EventType::ChargeRefunded,
            EventType::ChargeRefunded,
            EventType::ChargeDisputeCreated,
            EventType::ChargeDisputeClosed,
            EventType::ChargeAuthorized,
            EventType::ChargeCaptured,
            EventType::ChargeFailed,
        ];
        assert!(eventually(5_000, || received.lock().unwrap().events.len() >= expected.len()).await);
        let kinds: Vec<EventType> = sim.sim.events().iter().map(|e| e.kind).collect();
        assert_eq!(kinds, expected);
        let refunded: Vec<i64> = sim
            .sim
            .events()
            .iter()
            .filter(|e| e.kind == EventType::ChargeRefunded)
            .map(|e| e.data.charge.as_ref().unwrap().amount_refunded)
            .collect();
        assert_eq!(refunded, [2_500, 3_000]);
        let listed = sim.control(reqwest::Method::GET, "/sim/charges", Value::Null).await;
        assert_eq!(listed["data"].as_array().unwrap().len(), 3);
        assert_eq!(listed["data"][0]["idempotency_key"], "r");
        sim.shutdown().await;
    })
    .await;
}

// --- mounted inside another server ---

#[tokio::test]
async fn the_mounted_router_serves_the_provider_under_sim() {
    bounded(async {
        let sim = Simulator::new(SimConfig::default());
        let app = Router::new()
            .route("/healthz", axum::routing::get(|| async { "ok" }))
            .merge(sim.mounted_router());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let dispatcher = sim
            .spawn_webhook_dispatcher(async {
                let _ = stopped.await;
            })
            .unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await });

        let client = fast_client(&format!("http://{addr}/sim"));
        let charge = charge_of(
            client
                .create_charge(&charge_request("mounted", "pm_redirect", true))
                .await,
        );
        assert_eq!(
            charge.next_action.unwrap().redirect_url,
            format!("http://{addr}/sim/charges/{}/authenticate", charge.id)
        );
        assert_eq!(
            client
                .find_charge_by_key("mounted")
                .await
                .unwrap()
                .unwrap()
                .id,
            charge.id
        );
        let faults: Faults = reqwest::get(format!("http://{addr}/sim/faults"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(faults, Faults::default());
        let listed: Value = reqwest::get(format!("http://{addr}/sim/charges"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(listed["data"][0]["id"], charge.id.as_str());

        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(2), dispatcher)
            .await
            .unwrap()
            .unwrap();
        server.abort();
    })
    .await;
}
