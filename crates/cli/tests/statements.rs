//! Balances in the past, statements and the journal's export through the real binary over real
//! HTTP, on SQLite and PostgreSQL: after a run of payments, refunds, holds and transfers on one
//! customer, a balance `at_position` or `at` a time equals the log read in its own order at ten
//! random moments, and a statement's opening plus its lines is its closing, as JSON pages and as
//! CSV; a journal of 100,000 entries exported as CSV is read back by Python's `csv` module to
//! the sums the log holds, and its JSON pages list the same entries.
#![allow(clippy::unwrap_used)]

mod common;

use asiento_domain::Event;
use asiento_eventstore::Cursor;
use asiento_testkit::Rng;
use chrono::{DateTime, SecondsFormat, Utc};
use common::{payment_body, Backend, Client, Server, TestDatabase};
use serde_json::{json, Value};

const CUSTOMER: &str = "customer:42:available";

/// Each journal entry of the tenant, in log order: cursor, position, time, and the customer's
/// (posted, pending debits, pending credits) after it (its account and its pending accounts, in
/// USD); with whether it touched them.
type Moment = (Cursor, i64, DateTime<Utc>, [i128; 3], bool);

/// The model: the log read in its own order.
async fn model(database: &TestDatabase) -> Vec<Moment> {
    let store = database.database().event_store();
    let names = [
        CUSTOMER.to_owned(),
        format!("pending_debits:{CUSTOMER}"),
        format!("pending_credits:{CUSTOMER}"),
    ];
    let mut moments = Vec::new();
    let mut figures = [0i128; 3];
    for recorded in &asiento_testkit::whole_log(store.as_ref()).await {
        let event = Event::decode_raw(
            &recorded.stream_id,
            &recorded.event_type,
            recorded.schema,
            recorded.data.raw(),
        )
        .unwrap();
        let Some(entry) = event.entry() else { continue };
        let mut touched = false;
        for leg in entry.legs().iter().filter(|l| l.currency.code() == "USD") {
            let Some(slot) = names.iter().position(|n| n == leg.account.as_str()) else {
                continue;
            };
            let amount = i128::from(leg.amount.minor());
            figures[slot] += if slot == 1 { -amount } else { amount };
            touched = true;
        }
        moments.push((
            recorded.cursor,
            recorded.position,
            recorded.recorded_at,
            figures,
            touched,
        ));
    }
    moments
}

/// What the server must answer for `at=time`: the figures after the tenant's last entry
/// recorded at or before it, by time and then log order.
fn at_time(moments: &[Moment], time: DateTime<Utc>) -> (i64, [i128; 3]) {
    moments
        .iter()
        .filter(|m| m.2 <= time)
        .max_by_key(|m| (m.2, m.0))
        .map_or((0, [0; 3]), |m| (m.1, m.3))
}

fn figures(balance: &Value) -> [i128; 3] {
    [
        "balance_minor",
        "pending_debits_minor",
        "pending_credits_minor",
    ]
    .map(|f| {
        i128::from(
            balance[f]
                .as_i64()
                .unwrap_or_else(|| panic!("{f} in {balance}")),
        )
    })
}

async fn ok(client: &Client, path: &str, key: &str, body: &Value) -> Value {
    let answer = client.post(path, key, body).await;
    assert!(
        answer.status < 300,
        "{path}: {} {}",
        answer.status,
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()
}

/// Payments to the customer (every third refunded in part), holds on it posted in part or
/// voided, and transfers out and back, from two clients at once.
async fn run_history(server: &Server) -> i64 {
    let mut tasks = Vec::new();
    for worker in 0..2 {
        let client = server.client();
        tasks.push(tokio::spawn(async move {
            let mut last = 0;
            for i in 0..12 {
                let key = |what: &str| format!("w{worker}-{i}-{what}");
                let paid = ok(&client, "/v1/payments", &key("pay"), &payment_body(2_000 + i, "pm_card_ok")).await;
                let id = paid["id"].as_str().unwrap().to_owned();
                if i % 3 == 0 {
                    ok(&client, &format!("/v1/payments/{id}/refunds"), &key("refund"), &json!({"amount_minor": 500})).await;
                }
                let hold = ok(&client, "/v1/transfers", &key("hold"), &json!({"from": CUSTOMER, "to": "merchant:shop", "amount_minor": 300, "currency": "USD", "pending": true})).await;
                let hold_id = hold["id"].as_str().unwrap();
                let ended = if i % 2 == 0 {
                    ok(&client, &format!("/v1/transfers/{hold_id}/post"), &key("post"), &json!({"amount_minor": 200})).await
                } else {
                    ok(&client, &format!("/v1/transfers/{hold_id}/void"), &key("void"), &json!({})).await
                };
                last = last.max(ended["position"].as_i64().unwrap());
            }
            last
        }));
    }
    let mut last = 0;
    for task in tasks {
        last = last.max(task.await.unwrap());
    }
    last
}

/// A server after [`run_history`], once its log is readable through the run's last position,
/// and the model of that log.
async fn history(backend: Backend) -> (TestDatabase, Server, Vec<Moment>) {
    let database = TestDatabase::open(backend).await;
    let server = Server::start(&database.url, &[]);
    let last = run_history(&server).await;
    let caught_up = server
        .client()
        .get(&format!(
            "/v1/accounts/{CUSTOMER}/balance?currency=USD&min_position={last}"
        ))
        .await;
    assert_eq!(caught_up.status, 200);
    let moments = model(&database).await;
    (database, server, moments)
}

fn rfc3339(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Nanos, true)
}

/// Ten random positions and ten random times of the run: the server's balance there equals the
/// model's; before anything it is zero.
async fn balances_in_the_past_equal_the_log_at_ten_random_moments(backend: Backend) {
    let (database, server, moments) = history(backend).await;
    let client = server.client();
    let touching: Vec<Moment> = moments.iter().filter(|m| m.4).copied().collect();
    assert!(touching.len() > 40, "{} moments", touching.len());
    let mut rng = Rng::new(7);
    for _ in 0..10 {
        let (_, position, _, want, _) = *rng.pick(&touching);
        let answer = client
            .get(&format!(
                "/v1/accounts/{CUSTOMER}/balance?currency=USD&at_position={position}"
            ))
            .await;
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        let body = answer.json();
        assert_eq!(figures(&body), want, "at position {position}: {body}");
        assert_eq!(body["as_of_position"], position);
    }
    for _ in 0..10 {
        let (_, _, time, ..) = *rng.pick(&touching);
        let (position, want) = at_time(&moments, time);
        let answer = client
            .get(&format!(
                "/v1/accounts/{CUSTOMER}/balance?currency=USD&at={}",
                rfc3339(time).replace('+', "%2B")
            ))
            .await;
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        let body = answer.json();
        assert_eq!(figures(&body), want, "at {time}: {body}");
        assert_eq!(body["as_of_position"], position);
    }
    let before = client
        .get(&format!(
            "/v1/accounts/{CUSTOMER}/balance?currency=USD&at=2000-01-01T00:00:00Z"
        ))
        .await
        .json();
    assert_eq!(
        (figures(&before), before["as_of_position"].as_i64()),
        ([0; 3], Some(0))
    );
    for (query, code) in [
        ("at=yesterday", "invalid_query"),
        ("at_position=999999999", "unknown_position"),
    ] {
        let answer = client
            .get(&format!(
                "/v1/accounts/{CUSTOMER}/balance?currency=USD&{query}"
            ))
            .await;
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (400, code),
            "{query}"
        );
    }
    common::verify(&database);
    drop(server);
    database.finish().await;
}

/// A statement of the middle of the run: paged as JSON, opening plus its lines is its closing
/// and each line's balance is the one before plus its amount; as CSV, the same rows.
async fn a_statement_adds_up_as_json_pages_and_as_csv(backend: Backend) {
    let (database, server, moments) = history(backend).await;
    let client = server.client();
    // A transfer the merchant describes: its line says so.
    let gift = ok(
        &client,
        "/v1/transfers",
        "gift",
        &json!({"from": CUSTOMER, "to": "merchant:shop", "amount_minor": 100, "currency": "USD",
                "description": "gift for order 7"}),
    )
    .await;
    let gift_entry = gift["entry_id"].as_str().unwrap().to_owned();
    let gift_position = gift["position"].as_i64().unwrap();
    let from = rfc3339(moments[moments.len() / 4].2).replace('+', "%2B");
    let base = format!("/v1/accounts/{CUSTOMER}/statement?currency=USD&from={from}");
    // Pinned at the gift: without a point, a statement ends at the log's gap-free head, which
    // other transactions on the server may hold back.
    let first = client
        .get(&format!("{base}&limit=7&to_position={gift_position}"))
        .await;
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let first = first.json();
    let (opening, closing) = (
        i128::from(first["opening_balance_minor"].as_i64().unwrap()),
        i128::from(first["closing_balance_minor"].as_i64().unwrap()),
    );
    let closing_position = first["closing_position"].as_i64().unwrap();
    let at_closing = client
        .get(&format!(
            "/v1/accounts/{CUSTOMER}/balance?currency=USD&at_position={closing_position}"
        ))
        .await
        .json();
    assert_eq!(figures(&at_closing)[0], closing);
    let mut lines: Vec<(String, i64, i128)> = Vec::new();
    let mut sources: Vec<(String, String)> = Vec::new();
    let mut running = opening;
    let mut page = first;
    loop {
        for line in page["data"].as_array().unwrap() {
            let amount = i128::from(line["amount_minor"].as_i64().unwrap());
            running += amount;
            assert_eq!(
                i128::from(line["balance_minor"].as_i64().unwrap()),
                running,
                "{line}"
            );
            lines.push((
                line["entry_id"].as_str().unwrap().to_owned(),
                line["position"].as_i64().unwrap(),
                amount,
            ));
            let source = line["source"].as_str().unwrap_or_default().to_owned();
            assert!(
                source.starts_with("payment-pay_") || source.starts_with("transfer-tr_"),
                "{line}"
            );
            let described = line["entry_id"] == gift_entry.as_str();
            assert_eq!(
                line["description"].as_str(),
                described.then_some("gift for order 7"),
                "{line}"
            );
            sources.push((
                source,
                line["description"].as_str().unwrap_or_default().to_owned(),
            ));
        }
        let Some(after) = page["next_after"].as_i64() else {
            break;
        };
        page = client
            .get(&format!(
                "{base}&limit=7&after={after}&to_position={closing_position}"
            ))
            .await
            .json();
    }
    assert!(lines.len() > 7, "several pages: {}", lines.len());
    assert_eq!(running, closing, "opening plus the lines is the closing");

    let csv = client
        .send(
            client
                .http
                .get(format!(
                    "{}{base}&to_position={closing_position}",
                    client.base
                ))
                .bearer_auth(&client.key)
                .header("accept", "text/csv"),
        )
        .await;
    assert_eq!(csv.status, 200);
    assert_eq!(
        csv.headers["content-type"].to_str().unwrap(),
        "text/csv; charset=utf-8"
    );
    let text = String::from_utf8(csv.body).unwrap();
    let mut rows = text.lines();
    assert_eq!(
        rows.next(),
        Some(
            "kind,account,currency,entry_id,position,recorded_at,amount_minor,balance_minor,\
             source,description"
        )
    );
    let rows: Vec<Vec<&str>> = rows.map(|row| row.split(',').collect()).collect();
    assert_eq!(rows.first().unwrap()[0], "opening");
    assert_eq!(rows.first().unwrap()[7].parse::<i128>().unwrap(), opening);
    assert_eq!(rows.last().unwrap()[0], "closing");
    assert_eq!(rows.last().unwrap()[7].parse::<i128>().unwrap(), closing);
    let csv_lines: Vec<(String, i64, i128)> = rows[1..rows.len() - 1]
        .iter()
        .map(|row| {
            assert_eq!((row[0], row[1], row[2]), ("leg", CUSTOMER, "USD"));
            (
                row[3].to_owned(),
                row[4].parse().unwrap(),
                row[6].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(csv_lines, lines);
    let csv_sources: Vec<(String, String)> = rows[1..rows.len() - 1]
        .iter()
        .map(|row| (row[8].to_owned(), row[9].to_owned()))
        .collect();
    assert_eq!(csv_sources, sources);
    assert!(sources
        .iter()
        .any(|(_, description)| description == "gift for order 7"));
    // The journal names the entry's source and description too.
    let entry = client
        .get(&format!("/v1/journal/{gift_entry}"))
        .await
        .json();
    assert_eq!(entry["description"], "gift for order 7", "{entry}");
    assert!(
        entry["source"]
            .as_str()
            .unwrap()
            .starts_with("transfer-tr_"),
        "{entry}"
    );
    drop(server);
    database.finish().await;
}

/// Entries seeded straight into the log, as payouts post them (a payout stream's entries touch
/// no projection but the ledger's): `count` entries moving `amount(i)` from the clearing account
/// to the bank, in appends of a thousand streams.
async fn seed_payout_entries(database: &TestDatabase, count: u64) -> i128 {
    use asiento_domain::payment::EntryPosted;
    use asiento_domain::{
        payout_stream, AccountName, Amount, Currency, EntryId, JournalEntry, Leg, PayoutEvent,
        PayoutId, ProviderName, TenantId,
    };
    use asiento_eventstore::{ExpectedVersion, Metadata, NewEvent, StreamAppend};
    let store = database.database().event_store();
    let (clearing, bank) = (
        AccountName::parse("psp:sim:clearing").unwrap(),
        AccountName::parse("bank:sim:payouts").unwrap(),
    );
    let (usd, sim, acme) = (
        Currency::parse("USD").unwrap(),
        ProviderName::parse("sim").unwrap(),
        TenantId::parse("acme").unwrap(),
    );
    let mut total = 0i128;
    for chunk in 0..count.div_ceil(1_000) {
        let mut appends = Vec::new();
        for i in chunk * 1_000..((chunk + 1) * 1_000).min(count) {
            let amount = 1 + i64::try_from(i % 9_973).unwrap();
            total += i128::from(amount);
            let entry = JournalEntry::new(
                EntryId::derived(&format!("export-{i}")),
                acme.clone(),
                vec![
                    Leg::new(clearing.clone(), usd, Amount::new(-amount)),
                    Leg::new(bank.clone(), usd, Amount::new(amount)),
                ],
                None,
            )
            .unwrap();
            let event = PayoutEvent::EntryPosted(EntryPosted {
                entry,
                at: Utc::now(),
                transfer: None,
            });
            appends.push(StreamAppend {
                stream_id: payout_stream(&sim, &PayoutId::parse(&format!("po_export{i}")).unwrap()),
                expected: ExpectedVersion::NoStream,
                events: vec![NewEvent {
                    event_id: uuid::Uuid::new_v4(),
                    event_type: event.event_type().to_owned(),
                    schema: event.schema_version(),
                    data: event.encode().unwrap(),
                    metadata: Metadata {
                        tenant: Some("acme".to_owned()),
                        ..Metadata::default()
                    },
                }],
            });
        }
        store.append(&appends).await.unwrap();
    }
    total
}

/// The journal of 100,000 entries: its CSV, read by Python's `csv` module, sums to what was
/// seeded per account, entry for entry; its first JSON pages list the CSV's first entries.
async fn a_journal_of_a_hundred_thousand_entries_exports_as_csv(backend: Backend) {
    const ENTRIES: u64 = 100_000;
    let database = TestDatabase::open(backend).await;
    let total = seed_payout_entries(&database, ENTRIES).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    let request = client
        .http
        .get(format!("{}/v1/journal", client.base))
        .bearer_auth(&client.key)
        .header("accept", "text/csv")
        .timeout(std::time::Duration::from_secs(300));
    // The legs projection catches up first (503 projection_lagging meanwhile).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    let csv = loop {
        let answer = client.send(request.try_clone().unwrap()).await;
        if answer.status == 200 {
            break answer;
        }
        assert_eq!(
            answer.code(),
            "projection_lagging",
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the journal never caught up"
        );
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.csv");
    std::fs::write(&path, &csv.body).unwrap();
    let python = std::env::var("ASIENTO_TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let script = r#"
import csv, json, sys
sums, entries, rows = {}, set(), 0
with open(sys.argv[1], newline="") as f:
    for row in csv.DictReader(f):
        rows += 1
        entries.add(row["entry_id"])
        sums[row["account"]] = sums.get(row["account"], 0) + int(row["amount_minor"])
print(json.dumps({"rows": rows, "entries": len(entries), "sums": sums}))
"#;
    let output = std::process::Command::new(&python)
        .arg("-c")
        .arg(script)
        .arg(&path)
        .output()
        .unwrap_or_else(|error| panic!("{python}: {error}"));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let read: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(read["entries"], ENTRIES);
    assert_eq!(read["rows"], 2 * ENTRIES);
    assert_eq!(
        read["sums"]["bank:sim:payouts"].as_i64().map(i128::from),
        Some(total)
    );
    assert_eq!(
        read["sums"]["psp:sim:clearing"].as_i64().map(i128::from),
        Some(-total)
    );
    // The JSON pages list the same entries in the same order.
    let text = String::from_utf8(csv.body).unwrap();
    let csv_ids: Vec<&str> = text
        .lines()
        .skip(1)
        .step_by(2)
        .take(250)
        .map(|row| row.split(',').next().unwrap())
        .collect();
    let mut json_ids = Vec::new();
    let mut after = String::new();
    while json_ids.len() < 250 {
        let page = client
            .get(&format!("/v1/journal?limit=100{after}"))
            .await
            .json();
        for entry in page["data"].as_array().unwrap() {
            json_ids.push(entry["entry_id"].as_str().unwrap().to_owned());
        }
        after = format!("&after={}", page["next_after"].as_str().unwrap());
    }
    assert_eq!(json_ids[..250], csv_ids[..]);
    // Another tenant's journal holds none of them; a bad cursor is refused.
    let beta = client.with_key("sk_test_beta_0123456789abcdef");
    assert_eq!(beta.get("/v1/journal").await.json()["data"], json!([]));
    assert_eq!(
        client.get("/v1/journal?after=nope").await.code(),
        "invalid_query"
    );
    drop(server);
    database.finish().await;
}

asiento_testkit::both_backends!(threads = 2;
    balances_in_the_past_equal_the_log_at_ten_random_moments,
    a_statement_adds_up_as_json_pages_and_as_csv,
    a_journal_of_a_hundred_thousand_entries_exports_as_csv,
);
