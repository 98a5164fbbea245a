//! The ledger's edges through the real binary over real HTTP, on SQLite and PostgreSQL: amounts
//! above the deployment's limit are refused before anything is decided, and balances beyond what
//! 64 bits hold are kept exactly without stopping the projector for anyone.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{asiento, payment_body, Backend, Client, Server, TestDatabase};
use serde_json::{json, Value};

fn transfer(from: &str, to: &str, amount_minor: Value) -> Value {
    json!({"from": from, "to": to, "amount_minor": amount_minor, "currency": "USD"})
}

/// The balance route's raw body: a balance beyond i64 is an exact JSON integer, which
/// `serde_json::Value` would turn into a float.
async fn balance_text(client: &Client, account: &str, min_position: i64) -> String {
    let answer = client
        .get(&format!(
            "/v1/accounts/{account}/balance?currency=USD&min_position={min_position}"
        ))
        .await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    String::from_utf8(answer.body).unwrap()
}

/// Waits until `asiento projections status` shows every projection with no lag: a projection
/// that stopped on an event it cannot apply never gets there.
async fn projections_catch_up(database_url: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, output) = asiento(&["projections", "status", "--database-url", database_url]);
        assert!(ok, "{output}");
        let lags: Vec<&str> = output
            .lines()
            .skip(1)
            .filter(|line| !line.starts_with(' '))
            .filter_map(|line| line.split_whitespace().nth(4))
            .collect();
        if !lags.is_empty() && lags.iter().all(|lag| *lag == "0") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the projections never caught up:\n{output}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Two transfers of i64::MAX (which once overflowed the balances projection and stopped it for
/// every tenant) are 422 `amount_too_large` and change nothing; so is every other amount above
/// the default limit of 10^15, on every route that takes one. The limit itself is accepted.
async fn amounts_above_the_limit_are_refused_at_the_edge(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    for key in ["max-1", "max-2"] {
        let answer = client
            .post(
                "/v1/transfers",
                key,
                &transfer("merchant:a", "merchant:b", json!(i64::MAX)),
            )
            .await;
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (422, "amount_too_large")
        );
        assert!(
            answer.json()["detail"]
                .as_str()
                .unwrap()
                .contains("1000000000000000"),
            "names the limit"
        );
    }
    let over = client
        .post(
            "/v1/payments",
            "pay-over",
            &payment_body(1_000_000_000_000_001, "pm_card_ok"),
        )
        .await;
    assert_eq!(
        (over.status, over.code().as_str()),
        (422, "amount_too_large")
    );
    let manual = {
        let mut body = payment_body(5_000, "pm_card_ok");
        body["capture"] = json!("manual");
        client.post("/v1/payments", "pay-manual", &body).await
    };
    assert_eq!(manual.status, 201);
    let id = manual.json()["id"].as_str().unwrap().to_owned();
    for route in ["capture", "refunds"] {
        let answer = client
            .post(
                &format!("/v1/payments/{id}/{route}"),
                &format!("{route}-over"),
                &json!({"amount_minor": i64::MAX}),
            )
            .await;
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (422, "amount_too_large"),
            "{route}"
        );
    }

    let at_limit = client
        .post(
            "/v1/transfers",
            "at-limit",
            &transfer("merchant:a", "merchant:b", json!(1_000_000_000_000_000i64)),
        )
        .await;
    assert_eq!(at_limit.status, 201);
    let position = at_limit.json()["position"].as_i64().unwrap();
    let body: Value =
        serde_json::from_str(&balance_text(&client, "merchant:b", position).await).unwrap();
    assert_eq!(body["balance_minor"], json!(1_000_000_000_000_000i64));
    // The other tenant's ledger works as before.
    let beta = Client {
        key: "sk_test_beta_0123456789abcdef".to_owned(),
        ..client.clone()
    };
    let theirs = beta
        .post(
            "/v1/transfers",
            "beta-1",
            &transfer("merchant:x", "merchant:y", json!(7)),
        )
        .await;
    assert_eq!(theirs.status, 201);
    projections_catch_up(&database.url).await;
    let (ok, output) = asiento(&["verify", "--database-url", &database.url]);
    assert!(ok, "{output}");
}

/// With the largest limit (10^18), ten transfers make balances of ±10^19, beyond i64: the
/// balance route answers them exactly, the projector applies them and catches up, and `verify`
/// agrees with the log. A `customer:` account's guard keeps its balance in i64: the transfer
/// that would take it past i64::MAX is refused at decision time (422 `amount_overflow`), not
/// wrapped and not left for a projection to trip on.
async fn balances_beyond_i64_are_exact(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &["--amount-max", "1000000000000000000"]);
    let client = server.client();
    let ceiling = json!(1_000_000_000_000_000_000i64);
    let mut position = 0;
    for n in 0..10 {
        let answer = client
            .post(
                "/v1/transfers",
                &format!("big-{n}"),
                &transfer("merchant:a", "merchant:b", ceiling.clone()),
            )
            .await;
        assert_eq!(
            answer.status,
            201,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        position = answer.json()["position"].as_i64().unwrap();
    }
    for (account, balance) in [
        ("merchant:b", "10000000000000000000"),
        ("merchant:a", "-10000000000000000000"),
    ] {
        let text = balance_text(&client, account, position).await;
        assert!(
            text.contains(&format!("\"balance_minor\":{balance},")),
            "{account}: {text}"
        );
    }

    let mut refused = None;
    for n in 0..10 {
        let answer = client
            .post(
                "/v1/transfers",
                &format!("customer-{n}"),
                &transfer("merchant:a", "customer:1:available", ceiling.clone()),
            )
            .await;
        match (answer.status, answer.code().as_str()) {
            (201, _) => {}
            (422, "amount_overflow") => {
                refused = Some(n);
                break;
            }
            (status, code) => panic!("unexpected {status} {code}"),
        }
    }
    assert_eq!(
        refused,
        Some(9),
        "nine fit below i64::MAX, the tenth does not"
    );
    let text = balance_text(&client, "customer:1:available", 0).await;
    assert!(
        text.contains("\"balance_minor\":9000000000000000000,"),
        "{text}"
    );

    projections_catch_up(&database.url).await;
    let (ok, output) = asiento(&["verify", "--database-url", &database.url]);
    assert!(ok, "{output}");
}

macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Postgres).await;
                }
            )*
        }
    };
}

on_both_backends!(
    amounts_above_the_limit_are_refused_at_the_edge,
    balances_beyond_i64_are_exact,
);
