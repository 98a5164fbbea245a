//! Signed webhooks to merchants through the real binary over real HTTP, on SQLite and
//! PostgreSQL: an endpoint that fails, times out, and is down while asiento is SIGKILLed receives
//! every event of the feed at least once, and exactly once by id; every delivery verifies with
//! the snippet docs/API.md gives, and a forged, replayed or rotated-out one does not; a slow
//! endpoint does not delay another tenant's deliveries; URLs that would reach loopback, private
//! or link-local addresses are refused unless the operator allows them.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::{body::Bytes, extract::State, http::HeaderMap, http::StatusCode, routing::post};
use common::{payment_body, Backend, Client, Server, TestDatabase};
use serde_json::{json, Value};

const BETA_KEY: &str = "sk_test_beta_0123456789abcdef";

/// What the merchant's endpoint does with the n-th request (from 1).
#[derive(Clone, Copy)]
enum Behaviour {
    /// Every third answer is a 500, every seventh takes longer than asiento waits.
    Flaky,
    /// Every answer takes ten seconds.
    Slow,
    /// Every answer is a 503.
    Failing,
    Fine,
}

/// One delivery as the merchant received it.
#[derive(Debug, Clone)]
struct Received {
    event_id: String,
    signature: String,
    body: Vec<u8>,
    at: Instant,
}

#[derive(Clone)]
struct Merchant {
    behaviour: Behaviour,
    requests: Arc<Mutex<u64>>,
    received: Arc<Mutex<Vec<Received>>>,
}

async fn hook(State(merchant): State<Merchant>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let n = {
        let mut requests = merchant.requests.lock().unwrap();
        *requests += 1;
        *requests
    };
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let received = Received {
        event_id: header("asiento-event-id"),
        signature: header("asiento-signature"),
        body: body.to_vec(),
        at: Instant::now(),
    };
    match merchant.behaviour {
        Behaviour::Flaky if n % 7 == 0 => {
            tokio::time::sleep(Duration::from_secs(4)).await;
            StatusCode::OK
        }
        Behaviour::Flaky if n % 3 == 0 => StatusCode::INTERNAL_SERVER_ERROR,
        Behaviour::Failing => StatusCode::SERVICE_UNAVAILABLE,
        Behaviour::Slow => {
            tokio::time::sleep(Duration::from_secs(10)).await;
            merchant.received.lock().unwrap().push(received);
            StatusCode::OK
        }
        Behaviour::Flaky | Behaviour::Fine => {
            merchant.received.lock().unwrap().push(received);
            StatusCode::OK
        }
    }
}

/// The merchant's endpoint on a loopback port; dropping the handle takes it down.
struct Endpoint {
    merchant: Merchant,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Endpoint {
    async fn start(behaviour: Behaviour, addr: Option<SocketAddr>) -> Endpoint {
        let merchant = Merchant {
            behaviour,
            requests: Arc::default(),
            received: Arc::default(),
        };
        Endpoint::serve(merchant, addr).await
    }

    async fn serve(merchant: Merchant, addr: Option<SocketAddr>) -> Endpoint {
        let listener = tokio::net::TcpListener::bind(addr.unwrap_or(([127, 0, 0, 1], 0).into()))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route("/hook", post(hook))
            .with_state(merchant.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Endpoint {
            merchant,
            addr,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Down: the port refuses connections until [`Endpoint::up`].
    fn down(self) -> (Merchant, SocketAddr) {
        self.task.abort();
        (self.merchant, self.addr)
    }

    async fn up(merchant: Merchant, addr: SocketAddr) -> Endpoint {
        Endpoint::serve(merchant, Some(addr)).await
    }

    fn received(&self) -> Vec<Received> {
        self.merchant.received.lock().unwrap().clone()
    }
}

async fn register(client: &Client, key: &str, url: &str, events: Value) -> Value {
    let answer = client
        .post(
            "/v1/webhook_endpoints",
            key,
            &json!({"url": url, "enabled_events": events}),
        )
        .await;
    assert_eq!(
        answer.status,
        201,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()
}

/// The whole feed of the client's tenant, from the start.
async fn feed(client: &Client) -> Vec<Value> {
    let mut events = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let page = client
            .get(&format!("/v1/events?after={cursor}&limit=100"))
            .await
            .json();
        events.extend(page["data"].as_array().unwrap().iter().cloned());
        cursor = page["next_cursor"].as_str().unwrap().to_owned();
        if !page["has_more"].as_bool().unwrap() {
            return events;
        }
    }
}

/// Runs docs/API.md's verification snippet on each (body, header, secrets, now) case.
fn verified_by_the_documented_snippet(cases: &[(Vec<u8>, String, Vec<String>, i64)]) -> Vec<bool> {
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/API.md")).unwrap();
    let start = docs
        .find("```python\n# asiento-verify\n")
        .expect("the snippet in docs/API.md");
    let code = &docs[start + "```python\n".len()..];
    let code = &code[..code.find("```").unwrap()];
    let input: Vec<Value> = cases
        .iter()
        .map(|(body, header, secrets, now)| {
            json!({"body": String::from_utf8_lossy(body), "header": header,
                   "secrets": secrets, "now": now})
        })
        .collect();
    let script = format!(
        "{code}\nimport json, sys\nfor case in json.load(sys.stdin):\n    \
         print(verify(case['body'].encode(), case['header'], case['secrets'], case['now']))\n"
    );
    let mut child = std::process::Command::new("python3")
        .args(["-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    std::io::Write::write_all(
        child.stdin.as_mut().unwrap(),
        serde_json::to_string(&input).unwrap().as_bytes(),
    )
    .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| line == "True")
        .collect()
}

fn signed_at(header: &str) -> i64 {
    header
        .split(',')
        .find_map(|part| part.strip_prefix("t="))
        .unwrap()
        .parse()
        .unwrap()
}

async fn pay(client: &Client, key: &str, method: &str) -> String {
    let answer = client
        .post("/v1/payments", key, &payment_body(3_000, method))
        .await;
    assert_eq!(
        answer.status,
        201,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()["id"].as_str().unwrap().to_owned()
}

fn serve_args() -> Vec<&'static str> {
    vec![
        "--webhook-allow-hosts",
        "127.0.0.1",
        "--webhook-timeout",
        "2s",
        "--webhook-retry-base",
        "100ms",
        "--webhook-retry-max",
        "1s",
    ]
}

async fn every_event_reaches_a_failing_endpoint_once_by_id(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let mut server = Server::start(&database.url, &serve_args());
    let mut client = server.client();
    let merchant = Endpoint::start(Behaviour::Flaky, None).await;
    let endpoint = register(&client, "hook", &merchant.url(), json!(["*"])).await;
    let secret = endpoint["secret"].as_str().unwrap().to_owned();
    let id = endpoint["id"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{endpoint}");

    for n in 0..6 {
        let paid = pay(&client, &format!("a-{n}"), "pm_card_ok").await;
        let refund = client
            .post(
                &format!("/v1/payments/{paid}/refunds"),
                &format!("r-{n}"),
                &json!({"amount_minor": 500}),
            )
            .await;
        assert_eq!(refund.status, 201);
        pay(&client, &format!("d-{n}"), "pm_card_declined").await;
    }
    // The merchant goes down, asiento is killed and comes back, payments go on meanwhile.
    let (down, addr) = merchant.down();
    pay(&client, "while-down-1", "pm_card_ok").await;
    server.crash_and_restart();
    client = server.client();
    for n in 0..4 {
        pay(&client, &format!("after-{n}"), "pm_card_ok").await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let merchant = Endpoint::up(down, addr).await;

    let deadline = Instant::now() + Duration::from_secs(90);
    let (events, received) = loop {
        let events = feed(&client).await;
        let received = merchant.received();
        let got: BTreeSet<&str> = received.iter().map(|r| r.event_id.as_str()).collect();
        let want: BTreeSet<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
        // 6 × (created, captured, refunded; created, failed) + 5 × (created, captured).
        if events.len() >= 40 && got == want {
            break (events, received);
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} events received; missing {:?}",
            got.len(),
            want.len(),
            want.difference(&got).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(events.len(), 40, "{events:?}");
    // Exactly once by id: every copy of an event is the event, byte for byte.
    let bodies: HashMap<&str, &Value> = events
        .iter()
        .map(|e| (e["id"].as_str().unwrap(), e))
        .collect();
    for delivery in &received {
        let body: Value = serde_json::from_slice(&delivery.body).unwrap();
        assert_eq!(&&body, bodies.get(delivery.event_id.as_str()).unwrap());
    }
    // Every delivery verifies with the documented snippet.
    let cases: Vec<_> = received
        .iter()
        .map(|r| {
            (
                r.body.clone(),
                r.signature.clone(),
                vec![secret.clone()],
                signed_at(&r.signature),
            )
        })
        .collect();
    assert!(verified_by_the_documented_snippet(&cases)
        .iter()
        .all(|ok| *ok));
    // The attempts are on record: failures with their status or error, then the success.
    let deliveries = client
        .get(&format!("/v1/webhook_endpoints/{id}/deliveries"))
        .await
        .json();
    let deliveries = deliveries["data"].as_array().unwrap();
    assert!(
        deliveries.iter().all(|d| d["status"] == "succeeded"),
        "{deliveries:?}"
    );
    let attempts: Vec<&Value> = deliveries
        .iter()
        .flat_map(|d| d["attempts"].as_array().unwrap())
        .collect();
    assert!(attempts.iter().any(|a| a["response_status"] == 500));
    assert!(attempts.iter().any(|a| a["error"]
        .as_str()
        .is_some_and(|e| e.contains("connect") || e.contains("timed out"))));
    assert!(attempts.len() > deliveries.len(), "no retries were needed?");

    // Another tenant sees none of it.
    let beta = client.with_key(BETA_KEY);
    let hidden = beta.get(&format!("/v1/webhook_endpoints/{id}")).await;
    assert_eq!(
        (hidden.status, hidden.code().as_str()),
        (404, "webhook_endpoint_not_found")
    );
    assert_eq!(
        beta.get("/v1/webhook_endpoints").await.json()["data"],
        json!([])
    );
    common::verify(&database);
}

/// Forged, replayed and rotated-out deliveries fail the documented check; during a rotation a
/// delivery carries a signature under each secret.
async fn signatures_fail_when_forged_replayed_or_rotated_out(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &serve_args());
    let client = server.client();
    let merchant = Endpoint::start(Behaviour::Fine, None).await;
    let endpoint = register(&client, "hook", &merchant.url(), json!(["payment.created"])).await;
    let id = endpoint["id"].as_str().unwrap().to_owned();
    let old = endpoint["secret"].as_str().unwrap().to_owned();
    let wait_for = |count: usize| {
        let merchant = &merchant;
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let received = merchant.received();
                if received.len() >= count {
                    return received[count - 1].clone();
                }
                assert!(Instant::now() < deadline, "delivery {count} never came");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    pay(&client, "one", "pm_card_ok").await;
    let first = wait_for(1).await;
    let t = signed_at(&first.signature);
    let mut forged = first.body.clone();
    let at = forged.len() / 2;
    forged[at] = if forged[at] == b'1' { b'2' } else { b'1' };

    // A rotation that keeps the old secret for an hour: both sign.
    let rotated = client
        .post(
            &format!("/v1/webhook_endpoints/{id}/rotate_secret"),
            "rotate-1",
            &json!({"expire_previous_in_s": 3600}),
        )
        .await;
    assert_eq!(
        rotated.status,
        200,
        "{}",
        String::from_utf8_lossy(&rotated.body)
    );
    let new = rotated.json()["secret"].as_str().unwrap().to_owned();
    assert_ne!(new, old);
    pay(&client, "two", "pm_card_ok").await;
    let second = wait_for(2).await;
    // The old secret ends now: only the new one signs.
    let ended = client
        .post(
            &format!("/v1/webhook_endpoints/{id}/rotate_secret"),
            "rotate-2",
            &json!({"expire_previous_in_s": 0}),
        )
        .await;
    assert_eq!(ended.status, 200);
    let newest = ended.json()["secret"].as_str().unwrap().to_owned();
    pay(&client, "three", "pm_card_ok").await;
    let third = wait_for(3).await;
    let t3 = signed_at(&third.signature);

    let case = |r: &Received, body: &[u8], secret: &str, now: i64| {
        (
            body.to_vec(),
            r.signature.clone(),
            vec![secret.to_owned()],
            now,
        )
    };
    let results = verified_by_the_documented_snippet(&[
        case(&first, &first.body, &old, t),
        case(&first, &forged, &old, t),
        case(&first, &first.body, &old, t + 301),
        case(&first, &first.body, &old, t - 301),
        case(&first, &first.body, "whsec_wrong", t),
        case(&second, &second.body, &old, signed_at(&second.signature)),
        case(&second, &second.body, &new, signed_at(&second.signature)),
        case(&third, &third.body, &newest, t3),
        case(&third, &third.body, &new, t3),
        case(&third, &third.body, &old, t3),
    ]);
    assert_eq!(
        results,
        [true, false, false, false, false, true, true, true, false, false]
    );
    // A rotation replayed under its key answers the same secret; it is shown nowhere else.
    let replay = client
        .post(
            &format!("/v1/webhook_endpoints/{id}/rotate_secret"),
            "rotate-2",
            &json!({"expire_previous_in_s": 0}),
        )
        .await;
    assert_eq!(replay.json()["secret"], newest.as_str());
    let read = client
        .get(&format!("/v1/webhook_endpoints/{id}"))
        .await
        .json();
    assert!(read.get("secret").is_none(), "{read}");
}

/// Tenant acme's endpoint takes ten seconds per answer; tenant beta's events still arrive at
/// once.
async fn a_slow_endpoint_does_not_delay_another_tenant(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &["--webhook-allow-hosts", "127.0.0.1"]);
    let acme = server.client();
    let beta = acme.with_key(BETA_KEY);
    let slow = Endpoint::start(Behaviour::Slow, None).await;
    let fine = Endpoint::start(Behaviour::Fine, None).await;
    register(&acme, "slow", &slow.url(), json!(["*"])).await;
    register(&beta, "fine", &fine.url(), json!(["payment.captured"])).await;
    for n in 0..8 {
        pay(&acme, &format!("slow-{n}"), "pm_card_ok").await;
    }
    // acme's endpoint now has more deliveries than it can take in ten seconds.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    pay(&beta, "fine-1", "pm_card_ok").await;
    let deadline = started + Duration::from_secs(30);
    while fine.received().is_empty() {
        assert!(Instant::now() < deadline, "beta's event never came");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = fine.received()[0].at - started;
    assert!(
        took < Duration::from_secs(5),
        "beta waited {took:?} behind acme's slow endpoint"
    );
    assert!(
        slow.received().len() < 16,
        "acme's endpoint was not slow: {}",
        slow.received().len()
    );
}

/// URLs that would reach loopback, private or link-local addresses are refused with a 422 and
/// store nothing; the operator's allow-list opens what it names, and nothing more.
async fn urls_that_reach_inside_are_refused(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let mut server = Server::start(&database.url, &[]);
    let client = server.client();
    for (n, url) in [
        "http://127.0.0.1:9/hook",
        "https://127.0.0.1:9/hook",
        "http://169.254.169.254/latest/meta-data/",
        "https://169.254.169.254/",
        "https://10.0.0.1/hook",
        "https://192.168.1.10/hook",
        "https://[::1]/hook",
        "https://localhost/hook",
        "https://user:secret@93.184.215.14/hook",
        "ftp://93.184.215.14/hook",
    ]
    .iter()
    .enumerate()
    {
        let answer = client
            .post(
                "/v1/webhook_endpoints",
                &format!("refused-{n}"),
                &json!({"url": url, "enabled_events": ["*"]}),
            )
            .await;
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (422, "webhook_url_refused"),
            "{url}: {}",
            String::from_utf8_lossy(&answer.body)
        );
    }
    for (body, code) in [
        (json!({"enabled_events": ["*"]}), "missing_field"),
        (
            json!({"url": "https://93.184.215.14/", "enabled_events": []}),
            "invalid_field",
        ),
        (
            json!({"url": "https://93.184.215.14/", "enabled_events": ["payment.teleported"]}),
            "invalid_field",
        ),
        (
            json!({"url": "https://93.184.215.14/", "enabled_events": "*"}),
            "invalid_field",
        ),
        (
            json!({"url": "https://93.184.215.14/", "enabled_events": ["*"], "colour": "red"}),
            "unknown_field",
        ),
    ] {
        let answer = client.post("/v1/webhook_endpoints", "bad", &body).await;
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (400, code),
            "{body}"
        );
    }
    assert_eq!(
        client.get("/v1/webhook_endpoints").await.json()["data"],
        json!([])
    );

    server.process.kill();
    let server = Server::start(
        &database.url,
        &["--webhook-allow-hosts", "127.0.0.1,localhost"],
    );
    let client = server.client();
    register(
        &client,
        "allowed-1",
        "http://127.0.0.1:9/hook",
        json!(["*"]),
    )
    .await;
    register(
        &client,
        "allowed-2",
        "http://localhost:9/hook",
        json!(["*"]),
    )
    .await;
    for url in [
        "http://127.0.0.2:9/hook",
        "https://169.254.169.254/",
        "https://10.0.0.1/",
    ] {
        let answer = client
            .post(
                "/v1/webhook_endpoints",
                &format!("still-{url}"),
                &json!({"url": url, "enabled_events": ["*"]}),
            )
            .await;
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (422, "webhook_url_refused"),
            "{url}"
        );
    }
    let listed = client.get("/v1/webhook_endpoints").await.json();
    assert_eq!(listed["data"].as_array().unwrap().len(), 2);
    let allowed = listed["data"][0]["id"].as_str().unwrap().to_owned();

    // The operator takes 127.0.0.1 off the list: deliveries to it are refused from then on.
    drop(client);
    drop(server);
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    pay(&client, "after-the-list-changed", "pm_card_ok").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let deliveries = client
            .get(&format!("/v1/webhook_endpoints/{allowed}/deliveries"))
            .await
            .json();
        let refused = deliveries["data"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|d| d["attempts"].as_array().unwrap())
            .any(|a| {
                a["error"]
                    .as_str()
                    .is_some_and(|e| e.starts_with("refused"))
            });
        if refused {
            break;
        }
        assert!(Instant::now() < deadline, "never refused: {deliveries}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// An endpoint whose every delivery fails for the whole retry window is disabled, and its
/// tenant's feed says so; its deliveries are given up; enabled again, a delivery retried by hand
/// is sent again.
async fn an_endpoint_failing_for_the_whole_window_is_disabled_and_told(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let mut args = serve_args();
    args.extend(["--webhook-retry-window", "2s"]);
    let server = Server::start(&database.url, &args);
    let client = server.client();
    let failing = Endpoint::start(Behaviour::Failing, None).await;
    let endpoint = register(
        &client,
        "failing",
        &failing.url(),
        json!(["payment.created"]),
    )
    .await;
    let id = endpoint["id"].as_str().unwrap().to_owned();
    pay(&client, "doomed", "pm_card_ok").await;
    let told = common::merchant_events_of(&client, "webhook_endpoint.disabled", &id, 1).await;
    assert_eq!(told[0]["data"]["object"]["status"], "disabled");
    assert_eq!(told[0]["data"]["object"]["url"], failing.url().as_str());
    let read = client
        .get(&format!("/v1/webhook_endpoints/{id}"))
        .await
        .json();
    assert_eq!(read["status"], "disabled", "{read}");
    assert!(read["disabled_reason"]
        .as_str()
        .unwrap()
        .contains("retry window"));
    let deliveries = client
        .get(&format!("/v1/webhook_endpoints/{id}/deliveries"))
        .await
        .json();
    let delivery = &deliveries["data"][0];
    assert_eq!(delivery["status"], "failed", "{deliveries}");
    let attempts = delivery["attempt_count"].as_i64().unwrap();
    assert!(attempts >= 2, "{delivery}");
    assert!(delivery["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .all(|a| a["response_status"] == 503));

    let enabled = client
        .post(
            &format!("/v1/webhook_endpoints/{id}/enable"),
            "enable",
            &json!({}),
        )
        .await;
    assert_eq!(enabled.json()["status"], "enabled");
    let delivery_id = delivery["id"].as_str().unwrap();
    let retried = client
        .post(
            &format!("/v1/webhook_endpoints/{id}/deliveries/{delivery_id}/retry"),
            "retry",
            &json!({}),
        )
        .await;
    assert_eq!(
        retried.status,
        202,
        "{}",
        String::from_utf8_lossy(&retried.body)
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let again = client
            .get(&format!("/v1/webhook_endpoints/{id}/deliveries"))
            .await
            .json();
        if again["data"][0]["attempt_count"].as_i64().unwrap() > attempts {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the retry was never sent: {again}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let missing = client
        .post(
            &format!("/v1/webhook_endpoints/{id}/deliveries/wd_nope/retry"),
            "retry-nope",
            &json!({}),
        )
        .await;
    assert_eq!(
        (missing.status, missing.code().as_str()),
        (404, "webhook_delivery_not_found")
    );
    let deleted = client
        .send(
            client
                .http
                .delete(format!("{}/v1/webhook_endpoints/{id}", client.base))
                .bearer_auth(&client.key),
        )
        .await;
    assert_eq!(deleted.status, 200);
    assert_eq!(
        client
            .get(&format!("/v1/webhook_endpoints/{id}"))
            .await
            .status,
        404
    );
    common::verify(&database);
}

asiento_testkit::both_backends!(threads = 2;
    an_endpoint_failing_for_the_whole_window_is_disabled_and_told,
    every_event_reaches_a_failing_endpoint_once_by_id,
    signatures_fail_when_forged_replayed_or_rotated_out,
    a_slow_endpoint_does_not_delay_another_tenant,
    urls_that_reach_inside_are_refused,
);
