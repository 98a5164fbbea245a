//! `GET /v1/payments` through the real binary, on both backends: the filters people ask for
//! (metadata, amount range, last change) select exactly the payments a model of what was sent
//! says, and the whole list as CSV (`Accept: text/csv`, more payments than one export page),
//! read back by Python's `csv` module, holds every payment once with its figures and metadata,
//! in the JSON list's order. Refused filters are 400 `invalid_query`.
#![allow(clippy::unwrap_used)]

mod common;

use common::{payment_body, Backend, Client, Server, TestDatabase};
use futures::StreamExt as _;
use serde_json::{json, Value};

/// More than one export page (`EXPORT_PAGE_ROWS`), so that the CSV streams several.
const PAYMENTS: usize = 1_100;
const CHANNELS: [&str; 3] = ["web", "app", "pos"];

/// The payment the model expects for index `n`: amount, channel, order id.
fn made(n: usize) -> (i64, &'static str, String) {
    (
        500 + i64::try_from(n).unwrap() * 7,
        CHANNELS[n % CHANNELS.len()],
        format!("ord-{n}"),
    )
}

async fn create_all(client: &Client) -> Vec<String> {
    futures::stream::iter(0..PAYMENTS)
        .map(|n| {
            let client = client.clone();
            async move {
                let (amount, channel, order) = made(n);
                let mut body = payment_body(amount, "pm_card_ok");
                body["metadata"] = json!({"channel": channel, "order_id": order, "n": n});
                body["description"] = json!(format!("order {n}, \"gift\""));
                let answer = client
                    .post("/v1/payments", &format!("list-{n}"), &body)
                    .await;
                assert_eq!(
                    answer.status,
                    201,
                    "{}",
                    String::from_utf8_lossy(&answer.body)
                );
                answer.json()["id"].as_str().unwrap().to_owned()
            }
        })
        .buffered(8)
        .collect()
        .await
}

/// Every page of the JSON list for `query`, in order.
async fn listed(client: &Client, query: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = client
            .get(&format!("/v1/payments?limit=100{query}{cursor}"))
            .await;
        assert_eq!(page.status, 200, "{}", String::from_utf8_lossy(&page.body));
        let page = page.json();
        all.extend(page["data"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => return all,
        }
    }
}

fn ids(payments: &[Value]) -> Vec<String> {
    payments
        .iter()
        .map(|p| p["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn filters_and_csv(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    let created = create_all(&client).await;
    // A refund changes one payment after everything else was made.
    let changed_at = chrono::Utc::now();
    let refunded = &created[17];
    let refund = client
        .post(
            &format!("/v1/payments/{refunded}/refunds"),
            "list-refund",
            &json!({"amount_minor": 100}),
        )
        .await;
    assert_eq!(
        refund.status,
        201,
        "{}",
        String::from_utf8_lossy(&refund.body)
    );
    let position = refund.json()["position"].as_i64().unwrap();

    // Everything, newest first, once the list reflects the refund.
    let all = listed(&client, &format!("&min_position={position}")).await;
    assert_eq!(all.len(), PAYMENTS);
    let by_id: std::collections::HashMap<&str, usize> = created
        .iter()
        .enumerate()
        .map(|(n, id)| (id.as_str(), n))
        .collect();
    let index = |p: &Value| by_id[p["id"].as_str().unwrap()];
    for payment in &all {
        let (amount, channel, order) = made(index(payment));
        assert_eq!(payment["amount_minor"], amount);
        assert_eq!(payment["metadata"]["channel"], channel);
        assert_eq!(payment["metadata"]["order_id"], order.as_str());
    }
    let expect = |keep: &dyn Fn(usize) -> bool| -> Vec<String> {
        all.iter()
            .filter(|p| keep(index(p)))
            .map(|p| p["id"].as_str().unwrap().to_owned())
            .collect()
    };

    let web = listed(&client, "&metadata[channel]=web").await;
    assert_eq!(ids(&web), expect(&|n| made(n).1 == "web"));
    let one = listed(&client, "&metadata[order_id]=ord-42&metadata[channel]=web").await;
    assert_eq!(ids(&one), expect(&|n| n == 42));
    let none = listed(&client, "&metadata[order_id]=ord-42&metadata[channel]=app").await;
    assert!(none.is_empty());
    // A number in the metadata is shown, not matched by text.
    assert!(listed(&client, "&metadata[n]=42").await.is_empty());
    let range = listed(
        &client,
        "&amount_gte=1000&amount_lte=2000&metadata[channel]=pos",
    )
    .await;
    assert_eq!(
        ids(&range),
        expect(&|n| (1_000..=2_000).contains(&made(n).0) && made(n).1 == "pos")
    );
    let since = changed_at.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
    let updated = listed(
        &client,
        &format!("&updated_gte={}", since.replace('+', "%2B")),
    )
    .await;
    assert_eq!(ids(&updated), vec![refunded.clone()]);

    // The whole list as CSV, several export pages, read by Python's csv module.
    let csv = client
        .send(
            client
                .http
                .get(format!("{}/v1/payments", client.base))
                .bearer_auth(&client.key)
                .header("accept", "text/csv"),
        )
        .await;
    assert_eq!(csv.status, 200, "{}", String::from_utf8_lossy(&csv.body));
    assert_eq!(
        csv.headers["content-type"].to_str().unwrap(),
        "text/csv; charset=utf-8"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("payments.csv");
    std::fs::write(&path, &csv.body).unwrap();
    let python = std::env::var("ASIENTO_TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let script = r#"
import csv, json, sys
rows = []
with open(sys.argv[1], newline="") as f:
    for row in csv.DictReader(f):
        rows.append({"id": row["payment_id"], "amount_minor": int(row["amount_minor"]),
                     "refunded_minor": int(row["refunded_minor"]), "currency": row["currency"],
                     "description": row["description"], "metadata": json.loads(row["metadata"])})
print(json.dumps(rows))
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
    let read: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        ids(&read),
        ids(&all),
        "the CSV lists the JSON list, in its order"
    );
    for (row, payment) in read.iter().zip(&all) {
        assert_eq!(row["amount_minor"], payment["amount_minor"]);
        assert_eq!(row["refunded_minor"], payment["refunded_minor"]);
        assert_eq!(row["currency"], "USD");
        assert_eq!(row["description"], payment["description"]);
        assert_eq!(row["metadata"], payment["metadata"]);
    }
    let refunded_rows: i64 = read
        .iter()
        .map(|row| row["refunded_minor"].as_i64().unwrap())
        .sum();
    assert_eq!(refunded_rows, 100);
    // The same filters apply to the CSV.
    let filtered = client
        .send(
            client
                .http
                .get(format!(
                    "{}/v1/payments?metadata[order_id]=ord-42",
                    client.base
                ))
                .bearer_auth(&client.key)
                .header("accept", "text/csv"),
        )
        .await;
    let text = String::from_utf8(filtered.body).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.lines().nth(1).unwrap().starts_with(&created[42]));

    // Refused filters.
    for query in [
        "metadata[]=web",
        "amount_gte=-1",
        "amount_lte=ten",
        "updated_gte=yesterday",
        "metadata[order_id]=ord%00",
        "metadata[ord%00]=1",
        "metadata[a]=1&metadata[b]=1&metadata[c]=1&metadata[d]=1&metadata[e]=1&metadata[f]=1\
         &metadata[g]=1&metadata[h]=1&metadata[i]=1&metadata[j]=1&metadata[k]=1",
    ] {
        let answer = client.get(&format!("/v1/payments?{query}")).await;
        assert_eq!(
            (answer.status, answer.code()),
            (400, "invalid_query".to_owned()),
            "{query}"
        );
    }
    // Another tenant sees none of them.
    let beta = client.with_key("sk_test_beta_0123456789abcdef");
    assert!(listed(&beta, "&metadata[channel]=web").await.is_empty());
    drop(server);
    database.finish().await;
}

asiento_testkit::both_backends!(threads = 2;
    filters_and_csv,
);
