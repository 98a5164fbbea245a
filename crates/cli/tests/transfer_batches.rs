//! `POST /v1/transfers/batch` through the real binary, on both backends: a batch is written all
//! or none under one key. A batch whose third transfer the funds left by the first two cannot
//! pay, or one naming a frozen account, writes nothing (422 naming the first refused transfer's
//! index and reason, replayed by its key); one that fits writes every transfer and hold in
//! order, each seeing what the earlier ones moved; two batches racing for the same money end
//! with exactly one written; a malformed batch is a 400 naming the transfer. `asiento verify`
//! holds after each.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{asiento, payment_body, Answer, Backend, Client, Server, TestDatabase};
use serde_json::{json, Value};

const CUSTOMER: &str = "customer:42:available";

fn transfer(to: &str, amount_minor: i64, pending: bool) -> Value {
    json!({"from": CUSTOMER, "to": to, "amount_minor": amount_minor, "currency": "USD",
           "pending": pending})
}

async fn batch(client: &Client, key: &str, transfers: Vec<Value>) -> Answer {
    client
        .post(
            "/v1/transfers/batch",
            key,
            &json!({ "transfers": transfers }),
        )
        .await
}

/// (posted balance, available) of the customer once the balance includes `position`.
async fn customer(client: &Client, position: i64) -> (i64, i64) {
    let balance = client
        .get(&format!(
            "/v1/accounts/{CUSTOMER}/balance?currency=USD&min_position={position}"
        ))
        .await
        .json();
    (
        balance["balance_minor"].as_i64().unwrap(),
        balance["available_minor"].as_i64().unwrap(),
    )
}

/// Every transfer the tenant has, once the list includes `position`.
async fn transfers(client: &Client, position: i64) -> Vec<Value> {
    let page = client
        .get(&format!("/v1/transfers?limit=100&min_position={position}"))
        .await;
    assert_eq!(page.status, 200, "{}", String::from_utf8_lossy(&page.body));
    page.json()["data"].as_array().unwrap().clone()
}

async fn verify_clean(database_url: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, output) = asiento(&["verify", "--database-url", database_url]);
        if ok {
            return;
        }
        assert!(Instant::now() < deadline, "verify never passed:\n{output}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn refused(answer: &Answer, status: u16, code: &str, index: usize) {
    assert_eq!(
        (answer.status, answer.code()),
        (status, code.to_owned()),
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(answer.json()["index"], index, "{}", answer.json());
}

async fn batches_are_written_all_or_none(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    let paid = client
        .post("/v1/payments", "pay", &payment_body(10_000, "pm_card_ok"))
        .await;
    assert_eq!(paid.status, 201);
    let funded_at = paid.json()["position"].as_i64().unwrap();
    assert_eq!(customer(&client, funded_at).await, (9_700, 9_700));

    // The third transfer needs what the first two left: refused, and nothing of the batch is.
    let too_much = vec![
        transfer("merchant:shop", 5_000, false),
        transfer("merchant:wallet", 3_000, true),
        transfer("merchant:shop", 2_000, false),
    ];
    let answer = batch(&client, "too-much", too_much.clone()).await;
    refused(&answer, 422, "insufficient_funds", 2);
    let replay = batch(&client, "too-much", too_much).await;
    assert_eq!((replay.status, &replay.body), (answer.status, &answer.body));
    assert!(replay.replayed());
    assert!(transfers(&client, funded_at).await.is_empty());
    assert_eq!(customer(&client, funded_at).await, (9_700, 9_700));

    // A frozen account anywhere in the batch refuses it.
    let frozen = client
        .post(
            "/v1/accounts",
            "freeze",
            &json!({"account": "merchant:frozen", "currency": "USD", "frozen": true}),
        )
        .await;
    assert_eq!(
        frozen.status,
        201,
        "{}",
        String::from_utf8_lossy(&frozen.body)
    );
    let answer = batch(
        &client,
        "frozen",
        vec![
            transfer("merchant:shop", 100, false),
            transfer("merchant:frozen", 100, false),
        ],
    )
    .await;
    refused(&answer, 422, "account_frozen", 1);
    let at = frozen.json()["position"].as_i64().unwrap();
    assert!(transfers(&client, at).await.is_empty());

    // One that fits: every transfer, in order, each on what the one before left.
    let fits = batch(
        &client,
        "fits",
        vec![
            transfer("merchant:shop", 5_000, false),
            transfer("merchant:wallet", 3_000, true),
            transfer("merchant:shop", 1_000, false),
        ],
    )
    .await;
    assert_eq!(fits.status, 201, "{}", String::from_utf8_lossy(&fits.body));
    let written = fits.json();
    assert_eq!(written["object"], "transfer_batch");
    let statuses: Vec<&str> = written["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["posted", "pending", "posted"]);
    let position = written["position"].as_i64().unwrap();
    assert_eq!(customer(&client, position).await, (3_700, 700));
    let listed = transfers(&client, position).await;
    assert_eq!(listed.len(), 3);
    for transfer in written["data"].as_array().unwrap() {
        let id = transfer["id"].as_str().unwrap();
        let read = client.get(&format!("/v1/transfers/{id}")).await.json();
        assert_eq!(read["status"], transfer["status"], "{read}");
    }
    // The same key and body replay the answer.
    let replay = batch(
        &client,
        "fits",
        vec![
            transfer("merchant:shop", 5_000, false),
            transfer("merchant:wallet", 3_000, true),
            transfer("merchant:shop", 1_000, false),
        ],
    )
    .await;
    assert_eq!((replay.status, &replay.body), (fits.status, &fits.body));

    // Two batches racing for the last 700: exactly one is written.
    let racers = futures::future::join_all((0..2).map(|n| {
        let client = client.clone();
        async move {
            batch(
                &client,
                &format!("race-{n}"),
                vec![
                    transfer("merchant:shop", 300, false),
                    transfer("merchant:wallet", 300, false),
                ],
            )
            .await
        }
    }))
    .await;
    let mut statuses: Vec<u16> = racers.iter().map(|a| a.status).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 422], "{racers:?}");
    let loser = racers.iter().find(|a| a.status == 422).unwrap();
    refused(loser, 422, "insufficient_funds", 0);
    let winner = racers.iter().find(|a| a.status == 201).unwrap();
    let position = winner.json()["position"].as_i64().unwrap();
    assert_eq!(customer(&client, position).await, (3_100, 100));
    assert_eq!(transfers(&client, position).await.len(), 5);

    // Malformed batches name what is wrong, and where.
    let over: Vec<Value> = (0..101)
        .map(|_| transfer("merchant:shop", 1, false))
        .collect();
    for (key, body, code, index) in [
        ("empty", json!({"transfers": []}), "invalid_field", None),
        ("over", json!({ "transfers": over }), "invalid_field", None),
        (
            "not-a-list",
            json!({"transfers": {}}),
            "invalid_field",
            None,
        ),
        (
            "extra",
            json!({"transfers": [], "note": 1}),
            "unknown_field",
            None,
        ),
        (
            "bad-amount",
            json!({"transfers": [transfer("merchant:shop", 1, false),
                                 {"from": CUSTOMER, "to": "merchant:shop", "amount_minor": -5,
                                  "currency": "USD"}]}),
            "amount_must_be_positive",
            Some(1),
        ),
        (
            "same-accounts",
            json!({"transfers": [transfer(CUSTOMER, 1, false)]}),
            "accounts_must_be_different",
            Some(0),
        ),
    ] {
        let answer = client.post("/v1/transfers/batch", key, &body).await;
        assert_eq!(
            (answer.status, answer.code()),
            (400, code.to_owned()),
            "{key}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        assert_eq!(
            answer.json().get("index").and_then(Value::as_u64),
            index.map(|i: u64| i),
            "{key}"
        );
    }
    verify_clean(&database.url).await;
    drop(server);
    database.finish().await;
}

asiento_testkit::both_backends!(threads = 2;
    batches_are_written_all_or_none,
);
