//! The merchant events feed through the real binary over real HTTP, on SQLite and PostgreSQL:
//! a consumer that pages `GET /v1/events` from the start, while payments, refunds, transfers
//! and holds are made concurrently and the server is SIGKILLed and restarted under it, sees
//! every event exactly once, in the order of the log; a second reading from the start, and one
//! after `asiento projections rebuild merchant_events`, give the same events byte for byte; a
//! type filter gives the matching subsequence; another tenant sees none of them; bad queries are
//! 400s; and `asiento verify`, which derives the feed again from the log, finds it right, and
//! names a row edited by hand.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use common::{asiento, payment_body, Backend, Client, Server, TestDatabase};
use serde_json::{json, Value};

const CUSTOMER: &str = "customer:42:available";
const BETA_KEY: &str = "sk_test_beta_0123456789abcdef";
const ROUNDS: usize = 6;

/// One page of the feed after `after`.
async fn page(client: &Client, query: &str) -> Value {
    let answer = client.get(&format!("/v1/events?{query}")).await;
    assert_eq!(
        answer.status,
        200,
        "{query}: {}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()
}

/// Pages from `cursor` until a page says nothing more follows; returns the events and the
/// cursor to read on from.
async fn read_on(client: &Client, mut cursor: String, filter: &str) -> (Vec<Value>, String) {
    let mut events = Vec::new();
    loop {
        let answer = page(client, &format!("after={cursor}&limit=7{filter}")).await;
        events.extend(answer["data"].as_array().unwrap().iter().cloned());
        cursor = answer["next_cursor"].as_str().unwrap().to_owned();
        if !answer["has_more"].as_bool().unwrap() {
            return (events, cursor);
        }
    }
}

async fn created(client: &Client, key: &str, body: &Value) -> Value {
    let answer = client.post("/v1/payments", key, body).await;
    assert!(
        matches!(answer.status, 200..=202),
        "{key}: {} {}",
        answer.status,
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()
}

async fn ok(client: &Client, path: &str, key: &str, body: &Value) -> Value {
    let answer = client.post(path, key, body).await;
    assert!(
        matches!(answer.status, 200 | 201),
        "{path} {key}: {} {}",
        answer.status,
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()
}

/// What one round makes, and the merchant events it must yield.
#[derive(Default)]
struct Expected {
    /// Per merchant event type, how many.
    counts: BTreeMap<&'static str, usize>,
    /// Payments made with manual capture (exactly one `payment.authorized` each).
    manual: HashSet<String>,
}

impl Expected {
    fn add(&mut self, kind: &'static str, n: usize) {
        *self.counts.entry(kind).or_default() += n;
    }
}

/// A round: a captured payment refunded twice, a manual one captured, a declined one, a transfer,
/// a hold voided and a hold posted in part, sent concurrently.
async fn round(client: &Client, round: usize, expected: &mut Expected) {
    let refunded = async {
        let paid = created(
            client,
            &format!("auto-{round}"),
            &payment_body(10_000, "pm_card_ok"),
        )
        .await;
        let id = paid["id"].as_str().unwrap().to_owned();
        for (n, amount) in [(1, 300), (2, 200)] {
            ok(
                client,
                &format!("/v1/payments/{id}/refunds"),
                &format!("refund-{round}-{n}"),
                &json!({"amount_minor": amount}),
            )
            .await;
        }
    };
    let manual = async {
        let mut body = payment_body(5_000, "pm_card_ok");
        body["capture"] = json!("manual");
        let authorized = created(client, &format!("manual-{round}"), &body).await;
        let id = authorized["id"].as_str().unwrap().to_owned();
        ok(
            client,
            &format!("/v1/payments/{id}/capture"),
            &format!("capture-{round}"),
            &json!({}),
        )
        .await;
        id
    };
    let declined_key = format!("declined-{round}");
    let declined_body = payment_body(700, "pm_card_declined");
    let declined = created(client, &declined_key, &declined_body);
    let ledger = async {
        let transfer = json!({"from": CUSTOMER, "to": "merchant:shop", "amount_minor": 100,
                              "currency": "USD"});
        ok(
            client,
            "/v1/transfers",
            &format!("transfer-{round}"),
            &transfer,
        )
        .await;
        for (name, ending, body) in [
            ("void", "void", json!({})),
            ("post", "post", json!({"amount_minor": 40})),
        ] {
            let mut hold = transfer.clone();
            hold["pending"] = json!(true);
            let held = ok(
                client,
                "/v1/transfers",
                &format!("hold-{name}-{round}"),
                &hold,
            )
            .await;
            let id = held["id"].as_str().unwrap();
            ok(
                client,
                &format!("/v1/transfers/{id}/{ending}"),
                &format!("{ending}-{round}"),
                &body,
            )
            .await;
        }
    };
    let ((), manual_id, declined, ()) = tokio::join!(refunded, manual, declined, ledger);
    assert_eq!(declined["status"], "failed", "{declined}");
    expected.manual.insert(manual_id);
    expected.add("payment.created", 3);
    expected.add("payment.captured", 2);
    expected.add("payment.refunded", 2);
    expected.add("payment.failed", 1);
    expected.add("transfer.posted", 2);
    expected.add("transfer.pending", 2);
    expected.add("transfer.voided", 1);
}

fn counts(events: &[Value]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for event in events {
        *counts
            .entry(event["type"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    counts
}

/// Whether `events` holds what `expected` says, every type other than `payment.authorized`
/// exactly (automatic captures may or may not pass through `authorized`).
fn complete(events: &[Value], expected: &Expected) -> bool {
    let found = counts(events);
    expected
        .counts
        .iter()
        .all(|(kind, n)| found.get(*kind).copied().unwrap_or(0) == *n)
        && found.get("payment.authorized").copied().unwrap_or(0) >= expected.manual.len()
}

/// Every event once, and each object's events in the order of its stream (by log position);
/// each payment event names a log event of its payment's own history of a type that tells it.
async fn check_order_and_origin(client: &Client, events: &[Value]) {
    let mut ids = HashSet::new();
    let mut last_position: HashMap<String, i64> = HashMap::new();
    let mut histories: HashMap<String, HashMap<i64, String>> = HashMap::new();
    for event in events {
        assert!(
            ids.insert(event["id"].as_str().unwrap().to_owned()),
            "{event} twice"
        );
        let object = &event["data"]["object"];
        let object_id = object["id"].as_str().unwrap().to_owned();
        let position = event["position"].as_i64().unwrap();
        assert_eq!(object["position"].as_i64(), Some(position), "{event}");
        if let Some(before) = last_position.insert(object_id.clone(), position) {
            assert!(before < position, "{object_id}: {before} then {position}");
        }
        let kind = event["type"].as_str().unwrap();
        if !kind.starts_with("payment.") {
            continue;
        }
        if !histories.contains_key(&object_id) {
            let history = client
                .get(&format!("/v1/payments/{object_id}/events"))
                .await;
            assert_eq!(history.status, 200);
            let by_position = history
                .json()
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (
                        e["position"].as_i64().unwrap(),
                        e["type"].as_str().unwrap().to_owned(),
                    )
                })
                .collect();
            histories.insert(object_id.clone(), by_position);
        }
        let origin = histories[&object_id]
            .get(&position)
            .unwrap_or_else(|| panic!("{event} names no event of its payment"));
        let tells = match kind {
            "payment.created" => &["PaymentIntended"][..],
            "payment.authorized" => &["ChargeAuthorized"],
            "payment.captured" => &["ChargeCaptured"],
            "payment.failed" => &["ChargeFailed", "CaptureReversed"],
            "payment.refunded" => &["RefundSettled"],
            other => panic!("unexpected {other}"),
        };
        assert!(tells.contains(&origin.as_str()), "{kind} from {origin}");
        if kind == "payment.refunded" {
            assert_eq!(event["data"]["operation"]["kind"], "refund", "{event}");
        }
    }
}

async fn the_feed_yields_every_event_once_in_log_order_across_a_crash(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let mut server = Server::start(&database.url, &[]);
    let mut client = server.client();
    // Funds for the transfers and holds.
    created(&client, "funds", &payment_body(100_000, "pm_card_ok")).await;
    let mut expected = Expected::default();
    expected.add("payment.created", 1);
    expected.add("payment.captured", 1);

    // The consumer reads as the workload runs, then the server dies under it.
    let mut seen = Vec::new();
    let mut cursor = "0".to_owned();
    for n in 0..ROUNDS {
        if n == ROUNDS / 2 {
            server.crash_and_restart();
            client = server.client();
        }
        let ((), (events, next)) = tokio::join!(
            round(&client, n, &mut expected),
            read_on(&client, cursor.clone(), "")
        );
        seen.extend(events);
        cursor = next;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !complete(&seen, &expected) {
        assert!(
            Instant::now() < deadline,
            "the feed never completed: {:?} of {:?}",
            counts(&seen),
            expected.counts
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (events, next) = read_on(&client, cursor.clone(), "").await;
        seen.extend(events);
        cursor = next;
    }
    check_order_and_origin(&client, &seen).await;
    let authorized: HashSet<String> = seen
        .iter()
        .filter(|e| e["type"] == "payment.authorized")
        .map(|e| e["data"]["object"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(authorized.is_superset(&expected.manual));

    // From the start again, in one go: the same events, the same bytes.
    let (again, _) = read_on(&client, "0".to_owned(), "").await;
    assert_eq!(again, seen);
    // One event by its id; a type filter is the subsequence of that type.
    let first = &seen[0];
    let one = client
        .get(&format!("/v1/events/{}", first["id"].as_str().unwrap()))
        .await;
    assert_eq!((one.status, one.json()), (200, first.clone()));
    let (refunds, _) = read_on(&client, "0".to_owned(), "&type=payment.refunded").await;
    let filtered: Vec<Value> = seen
        .iter()
        .filter(|e| e["type"] == "payment.refunded")
        .cloned()
        .collect();
    assert_eq!(refunds, filtered);
    let (two_types, _) = read_on(
        &client,
        "0".to_owned(),
        "&type=transfer.pending,transfer.voided",
    )
    .await;
    assert_eq!(
        two_types.len(),
        expected.counts["transfer.pending"] + expected.counts["transfer.voided"]
    );

    // Another tenant sees none of it.
    let beta = client.with_key(BETA_KEY);
    assert_eq!(page(&beta, "").await["data"], json!([]));
    let hidden = beta
        .get(&format!("/v1/events/{}", first["id"].as_str().unwrap()))
        .await;
    assert_eq!(
        (hidden.status, hidden.code().as_str()),
        (404, "event_not_found")
    );

    // Bad queries are 400s.
    for query in [
        "after=abc",
        "after=-1",
        "limit=0",
        "limit=101",
        "type=payment.teleported",
    ] {
        let answer = client.get(&format!("/v1/events?{query}")).await;
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (400, "invalid_query"),
            "{query}"
        );
    }

    // A rebuild derives the same feed: same ids, same order, same bytes, same cursors.
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
    let client = server.client();
    let (after_rebuild, _) = read_on(&client, "0".to_owned(), "").await;
    assert_eq!(after_rebuild, seen);
    let middle = seen.len() / 2;
    let (tail, _) = read_on(&client, cursor_before(&client, &seen, middle).await, "").await;
    assert_eq!(tail, seen[middle..]);
    common::verify(&database);

    // `verify` derives the feed again from the log: an edited event is named.
    let db = asiento_eventstore::Database::connect(&database.url)
        .await
        .unwrap();
    let edit = "UPDATE merchant_events_g2 SET body = replace(body, '\"object\":\"event\"', \
                '\"object\":\"edited\"') WHERE seq = 3";
    // ... and so is a stream's stored fold (what the next batch folds onto), given another's.
    let refold = "UPDATE merchant_event_streams_g2 SET state = (SELECT state FROM \
                  merchant_event_streams_g2 WHERE stream_id = (SELECT MAX(stream_id) FROM \
                  merchant_event_streams_g2 WHERE stream_id LIKE 'payment-%')) \
                  WHERE stream_id = (SELECT MIN(stream_id) FROM merchant_event_streams_g2 \
                  WHERE stream_id LIKE 'payment-%')";
    let mut edited = 0;
    for statement in [edit, refold] {
        edited += match &db {
            asiento_eventstore::Database::Postgres(pool) => sqlx::query(statement)
                .execute(pool)
                .await
                .unwrap()
                .rows_affected(),
            asiento_eventstore::Database::Sqlite(pool) => sqlx::query(statement)
                .execute(pool)
                .await
                .unwrap()
                .rows_affected(),
        };
    }
    assert_eq!(edited, 2);
    let (clean, output) = asiento(&["verify", "--database-url", &database.url]);
    assert!(!clean, "{output}");
    let named: Vec<&str> = output
        .lines()
        .filter(|line| line.contains("merchant_events"))
        .collect();
    assert_eq!(named.len(), 2, "{output}");
    assert!(named.iter().any(|line| line.contains("seq 3")), "{output}");
    assert!(
        named
            .iter()
            .any(|line| line.contains("payment-") && line.contains("stored fold")),
        "{output}"
    );
}

/// The cursor after `seen[index - 1]`, found by paging one at a time (cursors are opaque).
async fn cursor_before(client: &Client, seen: &[Value], index: usize) -> String {
    let mut cursor = "0".to_owned();
    for event in &seen[..index] {
        let answer = page(client, &format!("after={cursor}&limit=1")).await;
        assert_eq!(&answer["data"][0], event);
        cursor = answer["next_cursor"].as_str().unwrap().to_owned();
    }
    cursor
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_feed_yields_every_event_once_in_log_order_across_a_crash_sqlite() {
    the_feed_yields_every_event_once_in_log_order_across_a_crash(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_feed_yields_every_event_once_in_log_order_across_a_crash_postgres() {
    the_feed_yields_every_event_once_in_log_order_across_a_crash(Backend::Postgres).await;
}
