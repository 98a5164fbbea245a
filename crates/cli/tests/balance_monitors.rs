//! Balance monitors through the real binary over real HTTP, on SQLite and PostgreSQL: a monitor
//! tells `balance.threshold_crossed` once per crossing (an entry that takes its field from not
//! matching to matching), again after the balance crosses back and forth, under concurrent
//! transfers and holds exactly as a model replaying the log's entries one at a time says, the
//! same across a crash and a rebuild of the merchant events projection; bad requests change
//! nothing; `asiento verify` derives the same crossings from the log.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;

use asiento_domain::{Event, StreamKind};
use common::{asiento, payment_body, Backend, Client, Server, TestDatabase};
use serde_json::{json, Value};

const CUSTOMER: &str = "customer:42:available";
const SHOP: &str = "merchant:shop";
const CROSSED: &str = "balance.threshold_crossed";

fn monitor_body(field: &str, condition: &str, amount_minor: i64) -> Value {
    json!({"account": CUSTOMER, "currency": "USD", "field": field, "condition": condition,
           "amount_minor": amount_minor, "description": format!("{field} {condition} {amount_minor}")})
}

async fn create_monitor(client: &Client, key: &str, body: &Value) -> Value {
    let answer = client.post("/v1/balance_monitors", key, body).await;
    assert_eq!(
        answer.status,
        201,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()
}

/// A command that must succeed; its `position`.
async fn ok(client: &Client, path: &str, key: &str, body: &Value) -> (Value, i64) {
    let answer = client.post(path, key, body).await;
    assert!(
        answer.status == 201 || answer.status == 200,
        "{path}: {} {}",
        answer.status,
        String::from_utf8_lossy(&answer.body)
    );
    let json = answer.json();
    let position = json["position"].as_i64().unwrap();
    (json, position)
}

fn transfer(from: &str, to: &str, amount_minor: i64, pending: bool) -> Value {
    json!({"from": from, "to": to, "amount_minor": amount_minor, "currency": "USD",
           "pending": pending})
}

/// Every crossing in the feed once it reflects `position`, per monitor in feed order.
async fn crossings(client: &Client, position: i64) -> HashMap<String, Vec<Value>> {
    // After a crash the projector's lease must run out first: 503 until it catches up.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let caught_up = client
            .get(&format!("/v1/balance_monitors?min_position={position}"))
            .await;
        if caught_up.status == 200 {
            break;
        }
        assert_eq!(caught_up.code(), "projection_lagging");
        assert!(
            std::time::Instant::now() < deadline,
            "the feed never caught up"
        );
    }
    let mut by_monitor: HashMap<String, Vec<Value>> = HashMap::new();
    let mut after = "0".to_owned();
    loop {
        let page = client
            .get(&format!(
                "/v1/events?type={CROSSED}&after={after}&limit=100"
            ))
            .await;
        assert_eq!(page.status, 200);
        let page = page.json();
        let data = page["data"].as_array().unwrap().clone();
        for event in &data {
            let monitor = event["data"]["object"]["id"].as_str().unwrap().to_owned();
            by_monitor.entry(monitor).or_default().push(event.clone());
        }
        match page["next_cursor"].as_str() {
            Some(next) if !data.is_empty() => after = next.to_owned(),
            _ => return by_monitor,
        }
    }
}

/// Field values of one account, in the API's terms.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    posted: i128,
    pending_debits: i128,
    pending_credits: i128,
}

impl Figures {
    fn get(&self, field: &str) -> i128 {
        match field {
            "posted" => self.posted,
            "pending_debits" => self.pending_debits,
            "pending_credits" => self.pending_credits,
            // Credit-normal (the customer's implied policy).
            "available" => self.posted - self.pending_debits,
            other => panic!("field {other}"),
        }
    }
}

fn holds(condition: &str, value: i128, threshold: i128) -> bool {
    match condition {
        "lt" => value < threshold,
        "lte" => value <= threshold,
        "gt" => value > threshold,
        "gte" => value >= threshold,
        other => panic!("condition {other}"),
    }
}

/// The model: the log read in its own order, one entry at a time, every monitor of `CUSTOMER`
/// judged after each entry that touches it. The entry ids each monitor fires on, in order.
async fn expected_crossings(database: &TestDatabase) -> HashMap<String, Vec<String>> {
    let store = database.database().event_store();
    let mut figures = Figures::default();
    // id → (field, condition, threshold, matching)
    let mut monitors: Vec<(String, String, String, i128, bool)> = Vec::new();
    let mut fired: HashMap<String, Vec<String>> = HashMap::new();
    for recorded in &asiento_testkit::whole_log(store.as_ref()).await {
        let event = Event::decode_raw(
            &recorded.stream_id,
            &recorded.event_type,
            recorded.schema,
            recorded.data.raw(),
        )
        .unwrap();
        if let Some(StreamKind::BalanceMonitor(id)) = StreamKind::parse(&recorded.stream_id) {
            let data: Value = serde_json::from_str(recorded.data.raw()).unwrap();
            if recorded.event_type == "MonitorCreated" && data["account"] == CUSTOMER {
                let threshold = &data["threshold"];
                let (field, condition) = (
                    threshold["field"].as_str().unwrap().to_owned(),
                    threshold["condition"].as_str().unwrap().to_owned(),
                );
                let amount = i128::from(threshold["amount_minor"].as_i64().unwrap());
                let matching = holds(&condition, figures.get(&field), amount);
                monitors.push((id, field, condition, amount, matching));
            } else if recorded.event_type == "MonitorDeleted" {
                monitors.retain(|m| m.0 != id);
            }
            continue;
        }
        let Some(entry) = event.entry() else {
            continue;
        };
        let mut touched = false;
        for leg in entry.legs() {
            let amount = i128::from(leg.amount.minor());
            match leg.account.as_str() {
                a if a == CUSTOMER => figures.posted += amount,
                a if a == format!("pending_debits:{CUSTOMER}") => {
                    figures.pending_debits -= amount;
                }
                a if a == format!("pending_credits:{CUSTOMER}") => {
                    figures.pending_credits += amount;
                }
                _ => continue,
            }
            touched = true;
        }
        if !touched {
            continue;
        }
        for (id, field, condition, amount, matching) in &mut monitors {
            let now = holds(condition, figures.get(field), *amount);
            if now && !*matching {
                fired
                    .entry(id.clone())
                    .or_default()
                    .push(entry.id().to_string());
            }
            *matching = now;
        }
    }
    fired
}

fn fired_entries(crossings: &[Value]) -> Vec<String> {
    crossings
        .iter()
        .map(|c| c["data"]["entry"]["id"].as_str().unwrap().to_owned())
        .collect()
}

/// A monitor on the available balance fires when a transfer takes it below the line, not again
/// while it stays below, again after the balance came back and a hold took it below once more;
/// the event names the monitor, the entry and both balances. Monitors on other fields fire on
/// their own crossings; a deleted monitor fires no more.
async fn a_monitor_fires_once_per_crossing_and_again_after_crossing_back(backend: Backend) {
    let database = TestDatabase::open(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    ok(
        &client,
        "/v1/payments",
        "pay",
        &payment_body(10_000, "pm_card_ok"),
    )
    .await;
    // The customer holds 9,700.
    let below = create_monitor(
        &client,
        "m-available",
        &monitor_body("available", "lt", 5_000),
    )
    .await;
    assert_eq!(
        (
            below["object"].as_str(),
            below["status"].as_str(),
            below["field"].as_str()
        ),
        (Some("balance_monitor"), Some("active"), Some("available"))
    );
    let below_id = below["id"].as_str().unwrap().to_owned();
    let reserved = create_monitor(
        &client,
        "m-pending",
        &monitor_body("pending_debits", "gte", 700),
    )
    .await;
    let reserved_id = reserved["id"].as_str().unwrap().to_owned();
    let posted = create_monitor(&client, "m-posted", &monitor_body("posted", "lte", 0)).await;
    let posted_id = posted["id"].as_str().unwrap().to_owned();

    let out = |amount| transfer(CUSTOMER, SHOP, amount, false);
    let back = |amount| transfer(SHOP, CUSTOMER, amount, false);
    let (first, _) = ok(&client, "/v1/transfers", "t1", &out(5_000)).await; // 4,700: crosses
    ok(&client, "/v1/transfers", "t2", &out(100)).await; // 4,600: still below
    ok(&client, "/v1/transfers", "t3", &back(1_000)).await; // 5,600: above, armed again
    let (hold, _) = ok(
        &client,
        "/v1/transfers",
        "h1",
        &transfer(CUSTOMER, SHOP, 700, true),
    )
    .await; // available 4,900: crosses; pending 700: crosses
    let hold_id = hold["id"].as_str().unwrap().to_owned();
    ok(
        &client,
        &format!("/v1/transfers/{hold_id}/void"),
        "h1-void",
        &json!({}),
    )
    .await; // 5,600; pending 0
    let delete = client_delete(&client, &format!("/v1/balance_monitors/{reserved_id}"));
    let deleted = client.send(delete).await;
    assert_eq!(deleted.status, 200);
    assert_eq!(deleted.json()["status"], "deleted");
    let again = client_delete(&client, &format!("/v1/balance_monitors/{reserved_id}"));
    let again = client.send(again).await;
    assert_eq!(
        (again.status, again.json()["status"].clone()),
        (200, json!("deleted"))
    );
    ok(
        &client,
        "/v1/transfers",
        "h2",
        &transfer(CUSTOMER, SHOP, 800, true),
    )
    .await; // available 4,800: crosses; the deleted monitor is silent
    let (_, last) = ok(&client, "/v1/transfers", "t4", &out(4_800)).await; // posted 800, available 0

    let found = crossings(&client, last).await;
    let below_crossings = &found[&below_id];
    assert_eq!(below_crossings.len(), 3, "{below_crossings:#?}");
    let first_crossing = &below_crossings[0];
    assert_eq!(first_crossing["data"]["entry"]["id"], first["entry_id"]);
    assert_eq!(
        first_crossing["data"]["balance_before"]["available_minor"],
        9_700
    );
    assert_eq!(
        first_crossing["data"]["balance_after"]["available_minor"],
        4_700
    );
    assert_eq!(first_crossing["data"]["object"]["condition"], "lt");
    assert_eq!(
        below_crossings[1]["data"]["balance_after"]["pending_debits_minor"],
        700
    );
    assert_eq!(
        below_crossings[1]["data"]["balance_after"]["available_minor"],
        4_900
    );
    assert_eq!(found[&reserved_id].len(), 1, "deleted after one crossing");
    assert!(!found.contains_key(&posted_id), "posted never reached 0");
    let model = expected_crossings(&database).await;
    for id in [&below_id, &reserved_id] {
        assert_eq!(fired_entries(&found[id]), model[id], "{id}");
    }

    // The list says what each monitor is and whether it matches now.
    let listed = client
        .get(&format!(
            "/v1/balance_monitors?account={CUSTOMER}&currency=USD&min_position={last}"
        ))
        .await
        .json();
    let listed: Vec<(String, bool)> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_owned(),
                m["matching"].as_bool().unwrap(),
            )
        })
        .collect();
    let mut expected = vec![(below_id.clone(), true), (posted_id.clone(), false)];
    expected.sort();
    assert_eq!(listed, expected, "the deleted monitor is not listed");
    let with_deleted = client
        .get("/v1/balance_monitors?include_deleted=true")
        .await
        .json();
    assert_eq!(with_deleted["data"].as_array().unwrap().len(), 3);
    common::verify(&database);
    drop(server);
    database.finish().await;
}

fn client_delete(client: &Client, path: &str) -> reqwest::RequestBuilder {
    client
        .http
        .delete(format!("{}{path}", client.base))
        .bearer_auth(&client.key)
}

/// Ten clients transfer out of and back into one customer account and place and void holds on
/// it, while monitors watch three of its figures. Every crossing is told exactly as a model that
/// replays the log's entries one at a time finds it, across a crash of the server mid-way and
/// after the merchant events projection is rebuilt.
async fn monitors_fire_as_the_log_says_under_concurrent_transfers_and_holds(backend: Backend) {
    let database = TestDatabase::open(backend).await;
    let mut server = Server::start(&database.url, &[]);
    let client = server.client();
    ok(
        &client,
        "/v1/payments",
        "pay",
        &payment_body(10_000, "pm_card_ok"),
    )
    .await;
    let mut ids = Vec::new();
    for (key, body) in [
        ("m1", monitor_body("available", "lt", 6_000)),
        ("m2", monitor_body("available", "lte", 3_000)),
        ("m3", monitor_body("pending_debits", "gt", 900)),
        ("m4", monitor_body("posted", "lt", 8_000)),
    ] {
        ids.push(
            create_monitor(&client, key, &body).await["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let mut last = 0;
    for round in 0..2 {
        let mut tasks = Vec::new();
        for worker in 0..10 {
            let client = server.client();
            tasks.push(tokio::spawn(async move {
                let mut last = 0;
                for step in 0..6 {
                    let key = |what: &str| format!("r{round}-w{worker}-s{step}-{what}");
                    let amount = 100 + 50 * ((worker + step) % 7);
                    if (worker + step) % 2 == 0 {
                        let out = client
                            .post(
                                "/v1/transfers",
                                &key("out"),
                                &transfer(CUSTOMER, SHOP, amount, false),
                            )
                            .await;
                        // Refused when the customer's available balance is short: fine.
                        if out.status == 201 {
                            let back = client
                                .post(
                                    "/v1/transfers",
                                    &key("back"),
                                    &transfer(SHOP, CUSTOMER, amount, false),
                                )
                                .await;
                            assert_eq!(back.status, 201, "{}", String::from_utf8_lossy(&back.body));
                            last = last.max(back.json()["position"].as_i64().unwrap());
                        }
                    } else {
                        let hold = client
                            .post(
                                "/v1/transfers",
                                &key("hold"),
                                &transfer(CUSTOMER, SHOP, amount, true),
                            )
                            .await;
                        if hold.status == 201 {
                            let id = hold.json()["id"].as_str().unwrap().to_owned();
                            let void = client
                                .post(
                                    &format!("/v1/transfers/{id}/void"),
                                    &key("void"),
                                    &json!({}),
                                )
                                .await;
                            assert_eq!(void.status, 200, "{}", String::from_utf8_lossy(&void.body));
                            last = last.max(void.json()["position"].as_i64().unwrap());
                        }
                    }
                }
                last
            }));
        }
        for task in tasks {
            last = last.max(task.await.unwrap());
        }
        if round == 0 {
            server.crash_and_restart();
        }
    }
    let client = server.client();
    let found = crossings(&client, last).await;
    let model = expected_crossings(&database).await;
    assert!(
        model.values().map(Vec::len).sum::<usize>() >= 4,
        "the run should cross several times: {model:?}"
    );
    for id in &ids {
        let told = found.get(id).map(|c| fired_entries(c)).unwrap_or_default();
        assert_eq!(&told, model.get(id).unwrap_or(&Vec::new()), "{id}");
    }
    let feed_ids: Vec<String> = found
        .values()
        .flatten()
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect();
    common::verify(&database);

    // A rebuild tells the same crossings, under the same ids.
    drop(server);
    let (rebuilt, output) = asiento(&[
        "projections",
        "rebuild",
        "merchant_events",
        "--database-url",
        &database.url,
    ]);
    assert!(rebuilt, "{output}");
    let server = Server::start(&database.url, &[]);
    let again = crossings(&server.client(), last).await;
    let mut again_ids: Vec<String> = again
        .values()
        .flatten()
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect();
    let mut feed_ids = feed_ids;
    feed_ids.sort();
    again_ids.sort();
    assert_eq!(again_ids, feed_ids);
    drop(server);
    database.finish().await;
}

/// Bad requests are refused with their codes and create nothing; a monitor is its tenant's only.
async fn bad_monitors_are_refused_and_change_nothing(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    let cases = [
        (
            json!({"account": "psp:sim:clearing", "currency": "USD", "field": "posted", "condition": "lt", "amount_minor": 0}),
            422,
            "account_reserved",
        ),
        (
            json!({"account": CUSTOMER, "currency": "USD", "field": "balance", "condition": "lt", "amount_minor": 0}),
            400,
            "invalid_field",
        ),
        (
            json!({"account": CUSTOMER, "currency": "USD", "field": "posted", "condition": "below", "amount_minor": 0}),
            400,
            "invalid_field",
        ),
        (
            json!({"account": CUSTOMER, "currency": "USD", "field": "posted", "condition": "lt", "amount_minor": 1.5}),
            400,
            "amount_must_be_integer",
        ),
        (
            json!({"account": CUSTOMER, "currency": "USD", "field": "posted", "condition": "lt", "amount_minor": -10_000_000_000_000_000i64}),
            422,
            "amount_too_large",
        ),
        (
            json!({"account": CUSTOMER, "currency": "XXX", "field": "posted", "condition": "lt", "amount_minor": 0}),
            400,
            "unknown_currency",
        ),
        (
            json!({"account": CUSTOMER, "currency": "USD", "field": "posted", "condition": "lt", "amount_minor": 0, "extra": 1}),
            400,
            "unknown_field",
        ),
    ];
    for (i, (body, status, code)) in cases.iter().enumerate() {
        let answer = client
            .post("/v1/balance_monitors", &format!("bad-{i}"), body)
            .await;
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (*status, *code),
            "{body}"
        );
    }
    let created = create_monitor(&client, "good", &monitor_body("posted", "gt", 1)).await;
    let id = created["id"].as_str().unwrap();
    let position = created["position"].as_i64().unwrap();
    // A replay answers the same bytes; another tenant sees nothing of it.
    let replay = client
        .post(
            "/v1/balance_monitors",
            "good",
            &monitor_body("posted", "gt", 1),
        )
        .await;
    assert!(replay.replayed());
    assert_eq!(replay.json(), created);
    let beta = client.with_key("sk_test_beta_0123456789abcdef");
    assert_eq!(
        beta.get(&format!("/v1/balance_monitors/{id}")).await.status,
        404
    );
    assert_eq!(
        beta.send(client_delete(&beta, &format!("/v1/balance_monitors/{id}")))
            .await
            .status,
        404
    );
    assert_eq!(
        client.get("/v1/balance_monitors/bm_nope").await.code(),
        "invalid_id"
    );
    let listed = client
        .get(&format!("/v1/balance_monitors?min_position={position}"))
        .await
        .json();
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
    let beta_listed = beta.get("/v1/balance_monitors").await.json();
    assert_eq!(beta_listed["data"], json!([]));
    assert_eq!(
        client
            .get("/v1/balance_monitors?account=Customer")
            .await
            .code(),
        "invalid_account"
    );
    let other_account = client
        .get(&format!(
            "/v1/balance_monitors?account=customer:1&min_position={position}"
        ))
        .await
        .json();
    assert_eq!(other_account["data"], json!([]));
    let fetched = client
        .get(&format!("/v1/balance_monitors/{id}"))
        .await
        .json();
    assert_eq!(fetched, created);
    drop(server);
    database.finish().await;
}

asiento_testkit::both_backends!(threads = 2;
    a_monitor_fires_once_per_crossing_and_again_after_crossing_back,
    monitors_fire_as_the_log_says_under_concurrent_transfers_and_holds,
    bad_monitors_are_refused_and_change_nothing,
);
