//! Rebuilding every projection from a recorded log gives the read models recorded from it.
//!
//! `recorded_log/events.jsonl` is a log exactly as PostgreSQL's `events` table held it (positions,
//! writing transactions and recording times included), made by
//! [`the_scenario_makes_the_recorded_log`] from a scenario
//! through the real server: payments of every outcome (refunds partial and full, a long run of
//! refunds, manual captures, a cancel, a decline, a redirect, a failed refund and capture, a
//! dispute won, an amount changed at the provider and the exception it opens, resolved), two
//! tenants, transfers, holds posted, voided and expired, a batch, declarations and a balance
//! monitor, part of it by concurrent clients (so that one transaction holds events of several
//! streams).
//!
//! `recorded_log/read_models.json` is what the query routes answered (payments, each payment's
//! events, transfers, accounts, balances now and at past positions, entries, statements, the
//! journal, the events feed) and the rows of the search index, after a build of asiento that
//! re-folded each stream's whole history in every batch (d1dc6c3) rebuilt every projection from
//! that log. The test restores the log into a fresh database, rebuilds every projection with this
//! build, and compares: a change to how a projection stores or applies what it folds must leave
//! every answer the same (but for the one change meant since: `list_latest_operations`).
//!
//! Re-recording (only when an answer is meant to change, and the diff reviewed):
//! `ASIENTO_RECORD_LOG=1 cargo test --test recorded_log the_scenario` writes a new log;
//! `ASIENTO_RECORD_READ_MODELS=1 cargo test --test recorded_log rebuilt` writes the read models
//! (`ASIENTO_RECORDED_BIN=/path/to/asiento` runs another build's binary for it).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use asiento_eventstore::Database;
use common::rig::{Psp, Rig};
use common::{payment_body, Answer, Backend, Client, Process, TestDatabase};
use serde_json::{json, Map, Value};

const BETA_KEY: &str = "sk_test_beta_0123456789abcdef";

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("recorded_log")
        .join(name)
}

fn created(answer: Answer, what: &str) -> Value {
    assert!(
        (200..300).contains(&answer.status),
        "{what}: {} {}",
        answer.status,
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()
}

/// A POST that must succeed: the scenario's commands all do.
async fn act(client: &Client, path: &str, key: &str, body: &Value) -> Value {
    created(client.post(path, key, body).await, key)
}

async fn pay(client: &Client, key: &str, body: Value) -> String {
    let payment = act(client, "/v1/payments", key, &body).await;
    payment["id"].as_str().unwrap().to_owned()
}

async fn refund(client: &Client, id: &str, key: &str, amount_minor: i64) {
    let path = format!("/v1/payments/{id}/refunds");
    act(client, &path, key, &json!({ "amount_minor": amount_minor })).await;
}

async fn transfer(client: &Client, key: &str, body: Value) -> String {
    let transfer = act(client, "/v1/transfers", key, &body).await;
    transfer["id"].as_str().unwrap().to_owned()
}

/// Polls `path` until `done` holds (at most 30 s).
async fn wait_until(client: &Client, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let answer = client.get(path).await;
        if answer.status == 200 && done(&answer.json()) {
            return answer.json();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{path}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait_for_status(client: &Client, id: &str, status: &str) {
    wait_until(client, &format!("/v1/payments/{id}"), |payment| {
        payment["status"] == status
    })
    .await;
}

/// The scenario of the module's doc, through a server on PostgreSQL with the in-process
/// simulator, still makes the log the fixture holds: the same streams with the same events in
/// the same order (ids and times aside), so the fixture can always be made again, and a change to
/// what a command writes shows here first. With `ASIENTO_RECORD_LOG` set, the log it made
/// becomes `recorded_log/events.jsonl` (then record the read models again too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scenario_makes_the_recorded_log() {
    let database = TestDatabase::new(Backend::Postgres).await;
    let rig = Rig::start(&database, Psp::Sim, &[]).await;
    let acme = rig.client();
    let beta = acme.with_key(BETA_KEY);

    // Concurrent clients: transactions commit out of their ids' order.
    let mut tasks = Vec::new();
    for n in 0..12_i64 {
        let client = if n % 3 == 0 {
            beta.clone()
        } else {
            acme.clone()
        };
        tasks.push(tokio::spawn(async move {
            let mut body = payment_body(1_000 + 100 * n, "pm_card_ok");
            body["customer"] = json!(format!("c{}", n % 4));
            body["metadata"] = json!({"order": format!("R-{n}")});
            let id = pay(&client, &format!("burst-{n}"), body).await;
            if n % 2 == 0 {
                refund(&client, &id, &format!("burst-refund-{n}"), 300).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    let refunded = pay(&acme, "refunded", payment_body(10_000, "pm_card_ok")).await;
    refund(&acme, &refunded, "refunded-1", 2_000).await;
    refund(&acme, &refunded, "refunded-2", 3_000).await;
    refund(&acme, &refunded, "refunded-3", 5_000).await;

    let long = pay(&acme, "long", payment_body(50_000, "pm_card_ok")).await;
    for n in 0..25 {
        refund(&acme, &long, &format!("long-{n}"), 100 + n).await;
    }

    let mut manual = payment_body(8_000, "pm_card_ok");
    manual["capture"] = json!("manual");
    let captured = pay(&acme, "manual-captured", manual.clone()).await;
    act(
        &acme,
        &format!("/v1/payments/{captured}/capture"),
        "manual-captured-capture",
        &json!({"amount_minor": 5_000}),
    )
    .await;
    let canceled = pay(&acme, "manual-canceled", manual.clone()).await;
    act(
        &acme,
        &format!("/v1/payments/{canceled}/cancel"),
        "manual-canceled-cancel",
        &json!({}),
    )
    .await;
    // A capture the provider decides later, and refuses.
    rig.sim(
        "/faults",
        json!({"async_modifications": true, "async_delay_ms": 60_000}),
    )
    .await;
    let capture_refused = pay(&acme, "capture-refused", manual.clone()).await;
    act(
        &acme,
        &format!("/v1/payments/{capture_refused}/capture"),
        "capture-refused-capture",
        &json!({}),
    )
    .await;
    let operation = rig.operations_of(&capture_refused, "capture").await;
    rig.sim(
        &format!("/operations/{}/fail", operation[0]["id"].as_str().unwrap()),
        json!({}),
    )
    .await;
    rig.sim("/faults", json!({"async_modifications": false}))
        .await;
    wait_until(
        &acme,
        &format!("/v1/payments/{capture_refused}"),
        |payment| payment["operations"][0]["state"] == "refused",
    )
    .await;

    let declined = acme
        .post(
            "/v1/payments",
            "declined",
            &payment_body(2_500, "pm_card_declined"),
        )
        .await;
    assert!(declined.status < 500, "declined: {}", declined.status);

    let redirected = pay(&acme, "redirect", payment_body(3_300, "pm_redirect")).await;
    let charge = rig.charge_of(&redirected).await;
    rig.sim(
        &format!("/charges/{}/complete", charge["id"].as_str().unwrap()),
        json!({"result": "succeeded"}),
    )
    .await;
    wait_for_status(&acme, &redirected, "captured").await;

    // A refund that succeeded, then failed at the provider.
    let reversed = pay(&acme, "refund-reversed", payment_body(6_000, "pm_card_ok")).await;
    refund(&acme, &reversed, "refund-reversed-1", 1_000).await;
    let operation = rig.operations_of(&reversed, "refund").await;
    rig.sim(
        &format!("/operations/{}/fail", operation[0]["id"].as_str().unwrap()),
        json!({}),
    )
    .await;
    wait_until(&acme, &format!("/v1/payments/{reversed}"), |payment| {
        payment["operations"][0]["state"] == "reversed"
    })
    .await;

    let disputed = pay(&acme, "disputed", payment_body(7_000, "pm_card_ok")).await;
    let charge = rig.charge_of(&disputed).await;
    let charge = charge["id"].as_str().unwrap().to_owned();
    rig.sim(&format!("/charges/{charge}/dispute"), json!({}))
        .await;
    wait_for_status(&acme, &disputed, "disputed").await;
    rig.sim(
        &format!("/charges/{charge}/dispute/close"),
        json!({"outcome": "won"}),
    )
    .await;
    wait_for_status(&acme, &disputed, "captured").await;

    let mismatched = pay(&acme, "mismatched", payment_body(5_000, "pm_card_ok")).await;
    rig.change_charge_amount(&mismatched, 6_000).await;
    rig.reconcile(&database.url).await;
    let open = acme.exceptions("open").await;
    for exception in &open {
        let id = exception["id"].as_str().unwrap();
        let path = format!("/v1/reconciliation/exceptions/{id}/resolve");
        let note = json!({"note": "checked with the provider"});
        act(&acme, &path, &format!("resolve-{id}"), &note).await;
    }

    act(
        &acme,
        "/v1/accounts",
        "declare-merchant",
        &json!({"account": "merchant:acme", "currency": "USD",
                    "metadata": {"owner": "finance"}}),
    )
    .await;
    act(
        &acme,
        "/v1/balance_monitors",
        "monitor",
        &json!({"account": "customer:42:available", "currency": "USD",
                    "field": "available", "condition": "lt", "amount_minor": 20_000,
                    "description": "top up"}),
    )
    .await;
    let plain = json!({"from": "customer:42:available", "to": "merchant:acme",
                       "amount_minor": 1_500, "currency": "USD", "description": "fees"});
    transfer(&acme, "transfer-1", plain.clone()).await;
    let mut hold = plain.clone();
    hold["pending"] = json!(true);
    let posted = transfer(&acme, "hold-posted", hold.clone()).await;
    act(
        &acme,
        &format!("/v1/transfers/{posted}/post"),
        "hold-posted-post",
        &json!({"amount_minor": 700}),
    )
    .await;
    let voided = transfer(&acme, "hold-voided", hold.clone()).await;
    act(
        &acme,
        &format!("/v1/transfers/{voided}/void"),
        "hold-voided-void",
        &json!({}),
    )
    .await;
    let mut expiring = hold.clone();
    expiring["expires_at"] =
        json!((chrono::Utc::now() + chrono::Duration::seconds(2)).to_rfc3339());
    let expired = transfer(&acme, "hold-expiring", expiring).await;
    act(
        &acme,
        "/v1/transfers/batch",
        "batch",
        &json!({"transfers": [plain.clone(), hold.clone(), plain.clone()]}),
    )
    .await;
    wait_until(&acme, &format!("/v1/transfers/{expired}"), |transfer| {
        transfer["status"] == "expired"
    })
    .await;
    let beta_paid = pay(&beta, "beta-last", payment_body(9_900, "pm_card_ok")).await;
    refund(&beta, &beta_paid, "beta-last-refund", 9_900).await;
    common::verify(&database);

    let Database::Postgres(pool) = Database::connect(&database.url).await.unwrap() else {
        unreachable!("recorded on PostgreSQL")
    };
    let rows: Vec<(String,)> = sqlx::query_as(
        "SELECT json_build_object(
             'position', position, 'xact', xact, 'stream_id', stream_id, 'version', version,
             'event_id', event_id, 'event_type', event_type, 'schema', schema, 'data', data,
             'metadata', metadata,
             'recorded_at', to_char(recorded_at AT TIME ZONE 'UTC',
                                    'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'))::text
         FROM events ORDER BY position",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let lines: Vec<String> = rows.into_iter().map(|(line,)| line).collect();
    let text = lines.join("\n") + "\n";
    drop(rig);
    database.finish().await;
    if std::env::var_os("ASIENTO_RECORD_LOG").is_some() {
        std::fs::write(fixture("events.jsonl"), text).unwrap();
        return;
    }
    let recorded = std::fs::read_to_string(fixture("events.jsonl")).unwrap();
    assert_eq!(
        stream_shapes(&text),
        stream_shapes(&recorded),
        "the scenario no longer makes the recorded log: record it (ASIENTO_RECORD_LOG=1) and \
         its read models again, and review both diffs"
    );
}

/// Each stream of a log as its kind and its events' types in version order, sorted: what a log
/// holds, without the ids and times that differ from one run to the next.
fn stream_shapes(log: &str) -> Vec<(String, Vec<String>)> {
    let mut streams: std::collections::BTreeMap<String, Vec<(i64, String)>> =
        std::collections::BTreeMap::new();
    for line in log.lines() {
        let row: Row = serde_json::from_str(line).unwrap();
        streams
            .entry(row.stream_id)
            .or_default()
            .push((row.version, row.event_type));
    }
    let mut shapes: Vec<(String, Vec<String>)> = streams
        .into_iter()
        .map(|(stream, mut events)| {
            events.sort();
            let kind = stream.split('-').next().unwrap_or_default().to_owned();
            (kind, events.into_iter().map(|(_, kind)| kind).collect())
        })
        .collect();
    shapes.sort();
    shapes
}

/// One recorded event row.
#[derive(serde::Deserialize)]
struct Row {
    position: i64,
    xact: i64,
    stream_id: String,
    version: i64,
    event_id: String,
    event_type: String,
    schema: i32,
    data: Value,
    metadata: Value,
    recorded_at: String,
}

/// The recorded rows into the `events` table of a migrated, empty PostgreSQL database, as a
/// restore of a dump would put them (positions, transaction ids and times as recorded).
async fn restore(url: &str) -> i64 {
    let Database::Postgres(pool) = Database::connect(url).await.unwrap() else {
        unreachable!("restored on PostgreSQL")
    };
    let text = std::fs::read_to_string(fixture("events.jsonl")).unwrap();
    let rows: Vec<Row> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    // Readers take only rows below every open transaction (`xact < pg_snapshot_xmin`), as in the
    // database the log was recorded from: a young cluster's transaction ids are first moved past
    // the recorded ones.
    let recorded_max = rows.iter().map(|row| row.xact).max().unwrap_or(0);
    while sqlx::query_scalar::<_, i64>("SELECT txid_current()")
        .fetch_one(&pool)
        .await
        .unwrap()
        <= recorded_max
    {}
    let mut head = 0;
    for row in rows {
        sqlx::query(
            "INSERT INTO events (position, xact, stream_id, version, event_id, event_type, schema,
                                 data, metadata, recorded_at)
             OVERRIDING SYSTEM VALUE
             VALUES ($1, $2, $3, $4, $5::uuid, $6, $7, $8, $9, $10::timestamptz)",
        )
        .bind(row.position)
        .bind(row.xact)
        .bind(&row.stream_id)
        .bind(row.version)
        .bind(&row.event_id)
        .bind(&row.event_type)
        .bind(row.schema)
        .bind(&row.data)
        .bind(&row.metadata)
        .bind(&row.recorded_at)
        .execute(&pool)
        .await
        .unwrap();
        head = head.max(row.position);
    }
    sqlx::query("SELECT setval(pg_get_serial_sequence('events', 'position'), $1)")
        .bind(head)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    head
}

fn run(bin: &str, args: &[&str]) {
    let (ok, output) = common::run_bin(bin, args, &[]);
    assert!(ok, "{bin} {args:?}: {output}");
}

/// Every page of a list route: `data` of each, following `cursor_field` into `param`.
async fn pages(client: &Client, path: &str, cursor_field: &str, param: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut url = path.to_owned();
    let joiner = if path.contains('?') { '&' } else { '?' };
    loop {
        let answer = client.get(&url).await;
        assert_eq!(
            answer.status,
            200,
            "{url}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        let page = answer.json();
        all.extend(page["data"].as_array().unwrap().iter().cloned());
        let more = page.get("has_more").is_none_or(|more| more == true);
        match page[cursor_field].as_str().map(str::to_owned).or_else(|| {
            page[cursor_field]
                .as_i64()
                .map(|position| position.to_string())
        }) {
            Some(cursor) if more && !page["data"].as_array().unwrap().is_empty() => {
                url = format!("{path}{joiner}{param}={cursor}");
            }
            _ => return all,
        }
    }
}

async fn get(client: &Client, path: &str) -> Value {
    let answer = client.get(path).await;
    assert_eq!(
        answer.status,
        200,
        "{path}: {}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()
}

/// What one tenant's query routes answer, keyed by route.
async fn tenant_read_models(client: &Client, head: i64) -> Map<String, Value> {
    let mut out = Map::new();
    let payments = pages(client, "/v1/payments?limit=7", "next_cursor", "cursor").await;
    for payment in &payments {
        let id = payment["id"].as_str().unwrap();
        let path = format!("/v1/payments/{id}/events");
        out.insert(path.clone(), get(client, &path).await);
    }
    out.insert("/v1/payments".into(), Value::Array(payments));
    for path in ["/v1/transfers?limit=3", "/v1/transfers?status=pending"] {
        out.insert(
            path.into(),
            Value::Array(pages(client, path, "next_cursor", "cursor").await),
        );
    }
    out.insert(
        "/v1/events".into(),
        Value::Array(pages(client, "/v1/events?limit=9", "next_cursor", "after").await),
    );
    out.insert(
        "/v1/journal".into(),
        Value::Array(pages(client, "/v1/journal?limit=11", "next_after", "after").await),
    );
    let accounts = pages(client, "/v1/accounts?limit=5", "next_after", "after").await;
    for account in &accounts {
        let name = account["account"].as_str().unwrap();
        let currency = account["currency"].as_str().unwrap();
        let base = format!("/v1/accounts/{name}");
        out.insert(
            format!("{base}/entries?currency={currency}"),
            Value::Array(
                pages(
                    client,
                    &format!("{base}/entries?currency={currency}&limit=4"),
                    "next_after",
                    "after",
                )
                .await,
            ),
        );
        for at in [head / 4, head / 2, head * 3 / 4, head] {
            let path = format!("{base}/balance?currency={currency}&at_position={at}");
            out.insert(path.clone(), get(client, &path).await);
        }
        let path = format!("{base}/statement?currency={currency}&to_position={head}&limit=1000");
        out.insert(path.clone(), get(client, &path).await);
    }
    out.insert("/v1/accounts".into(), Value::Array(accounts));
    out
}

/// The search index's rows: its API is the console's HTML, so its rows stand for it.
async fn search_rows(url: &str) -> Value {
    let Database::Postgres(pool) = Database::connect(url).await.unwrap() else {
        unreachable!("read on PostgreSQL")
    };
    let rows: Vec<(String, String, String, String, i64)> = sqlx::query_as(
        "SELECT tenant, term, kind, payment_id, created_ms FROM payment_search
         ORDER BY tenant, term, kind, payment_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    Value::Array(
        rows.into_iter()
            .map(|(tenant, term, kind, payment, created_ms)| {
                json!([tenant, term, kind, payment, created_ms])
            })
            .collect(),
    )
}

const PROJECTIONS: [&str; 6] = [
    "balances",
    "ledger_entries",
    "payments",
    "transfers",
    "merchant_events",
    "payment_search",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuilt_read_models_equal_the_recorded_ones() {
    let bin = std::env::var("ASIENTO_RECORDED_BIN").unwrap_or_else(|_| common::BIN.to_owned());
    let database = TestDatabase::new(Backend::Postgres).await;
    run(&bin, &["migrate", "--database-url", &database.url]);
    let head = restore(&database.url).await;
    for name in PROJECTIONS {
        run(
            &bin,
            &[
                "projections",
                "rebuild",
                name,
                "--batch-size",
                "17",
                "--database-url",
                &database.url,
            ],
        );
    }
    // Queries only: no projector or worker may add to the restored log or move a read model.
    let mut server = Process::spawn_bin(
        &bin,
        &[
            "serve",
            "--role",
            "api",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &database.url,
            "--api-keys",
            "acme:sk_test_acme_0123456789abcdef,beta:sk_test_beta_0123456789abcdef",
        ],
        &[],
    );
    let base = common::url_after(
        &server.wait_for_line("asiento listening on "),
        "listening on ",
    );
    let acme = Client {
        http: reqwest::Client::new(),
        base,
        key: "sk_test_acme_0123456789abcdef".to_owned(),
    };
    let mut read_models = Map::new();
    read_models.insert(
        "acme".into(),
        Value::Object(tenant_read_models(&acme, head).await),
    );
    read_models.insert(
        "beta".into(),
        Value::Object(tenant_read_models(&acme.with_key(BETA_KEY), head).await),
    );
    read_models.insert("search".into(), search_rows(&database.url).await);
    server.kill();
    let read_models = Value::Object(read_models);

    let path = fixture("read_models.json");
    if std::env::var_os("ASIENTO_RECORD_READ_MODELS").is_some() {
        let text = serde_json::to_string_pretty(&read_models).unwrap();
        std::fs::write(&path, text + "\n").unwrap();
    } else {
        let mut recorded: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for tenant in ["acme", "beta"] {
            for event in recorded[tenant]["/v1/events"].as_array_mut().unwrap() {
                list_latest_operations(&mut event["data"]["object"]);
            }
        }
        if let Some(difference) = first_difference(&recorded, &read_models) {
            panic!("the rebuilt read models answer differently: {difference}");
        }
    }
    database.finish().await;
}

/// The one answer meant to differ from the recorded build's: a merchant event's payment lists its
/// latest `RECENT_OPERATIONS` operations, and how many it has (docs/API.md "Events").
fn list_latest_operations(object: &mut Value) {
    let Some(operations) = object.get_mut("operations").and_then(Value::as_array_mut) else {
        return;
    };
    let total = operations.len();
    operations.drain(..total.saturating_sub(asiento_domain::payment::RECENT_OPERATIONS));
    object["operations_total"] = json!(total);
}

/// Where `actual` first differs from `expected`: the path of keys and indexes, and both values.
fn first_difference(expected: &Value, actual: &Value) -> Option<String> {
    match (expected, actual) {
        (Value::Object(expected), Value::Object(actual)) => {
            for (key, value) in expected {
                let Some(other) = actual.get(key) else {
                    return Some(format!("{key:?} is missing"));
                };
                if let Some(difference) = first_difference(value, other) {
                    return Some(format!("{key} {difference}"));
                }
            }
            actual
                .keys()
                .find(|key| !expected.contains_key(*key))
                .map(|key| format!("{key:?} is new"))
        }
        (Value::Array(expected), Value::Array(actual)) => {
            for (index, (value, other)) in expected.iter().zip(actual).enumerate() {
                if let Some(difference) = first_difference(value, other) {
                    return Some(format!("[{index}] {difference}"));
                }
            }
            (expected.len() != actual.len())
                .then(|| format!("holds {} items, recorded {}", actual.len(), expected.len()))
        }
        _ => (expected != actual).then(|| format!("is {actual}, recorded {expected}")),
    }
}
