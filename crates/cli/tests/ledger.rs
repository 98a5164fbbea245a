//! The ledger's edges through the real binary over real HTTP, on SQLite and PostgreSQL: amounts
//! above the deployment's limit are refused before anything is decided, balances beyond what
//! 64 bits hold are kept exactly without stopping the projector for anyone, system accounts are
//! out of clients' reach, and declared account policies hold under concurrent transfers.
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

/// With the largest limit (10^18), ten payments from ten customers take the provider's clearing
/// account to -10^19, beyond i64: the balance route answers it exactly, the projector applies it
/// and catches up, and `verify` agrees with the log. A client account's guard keeps its balance
/// in i64: the transfer that would take it past i64 is refused at decision time (422
/// `amount_overflow`), not wrapped and not left for a projection to trip on.
async fn balances_beyond_i64_are_exact(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &["--amount-max", "1000000000000000000"]);
    let client = server.client();
    let ceiling = 1_000_000_000_000_000_000i64;
    let mut position = 0;
    for n in 0..10 {
        let mut body = payment_body(ceiling, "pm_card_ok");
        body["customer"] = json!(format!("big-{n}"));
        let answer = client
            .post("/v1/payments", &format!("big-{n}"), &body)
            .await;
        assert_eq!(
            answer.status,
            201,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        position = answer.json()["position"].as_i64().unwrap();
    }
    let text = balance_text(&client, "psp:sim:clearing", position).await;
    assert!(
        text.contains("\"balance_minor\":-10000000000000000000,"),
        "{text}"
    );

    let mut refused = None;
    for n in 0..10 {
        let answer = client
            .post(
                "/v1/transfers",
                &format!("client-{n}"),
                &transfer("merchant:a", "merchant:b", json!(ceiling)),
            )
            .await;
        match (answer.status, answer.code().as_str()) {
            (201, _) => position = answer.json()["position"].as_i64().unwrap(),
            (422, "amount_overflow") => {
                refused = Some(n);
                break;
            }
            (status, code) => panic!("unexpected {status} {code}"),
        }
    }
    assert_eq!(refused, Some(9), "nine fit within i64, the tenth does not");
    let text = balance_text(&client, "merchant:b", position).await;
    assert!(
        text.contains("\"balance_minor\":9000000000000000000,"),
        "{text}"
    );

    projections_catch_up(&database.url).await;
    let (ok, output) = asiento(&["verify", "--database-url", &database.url]);
    assert!(ok, "{output}");
}

async fn declare(client: &Client, key: &str, body: Value) -> common::Answer {
    client.post("/v1/accounts", key, &body).await
}

/// Transfers and declarations naming a system account (`psp:`, `revenue:`, `expense:`, `bank:`)
/// are 422 `account_reserved` and post nothing; the system's own postings still reach them.
async fn system_accounts_are_reserved(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    let paid = client
        .post("/v1/payments", "pay", &payment_body(10_000, "pm_card_ok"))
        .await;
    assert_eq!(paid.status, 201);
    let position = paid.json()["position"].as_i64().unwrap();
    for (n, (from, to)) in [
        ("psp:sim:clearing", "merchant:a"),
        ("customer:42:available", "revenue:fees"),
        ("merchant:a", "expense:anything"),
        ("bank:stripe:payouts", "merchant:a"),
    ]
    .into_iter()
    .enumerate()
    {
        let answer = client
            .post(
                "/v1/transfers",
                &format!("reserved-{n}"),
                &transfer(from, to, json!(100)),
            )
            .await;
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (422, "account_reserved"),
            "{from} -> {to}"
        );
    }
    let declared = declare(
        &client,
        "declare-fees",
        json!({"account": "revenue:fees", "currency": "USD", "frozen": true}),
    )
    .await;
    assert_eq!(
        (declared.status, declared.code().as_str()),
        (422, "account_reserved")
    );
    // Nothing moved: the capture's postings are all there is.
    let fees: Value =
        serde_json::from_str(&balance_text(&client, "revenue:fees", position).await).unwrap();
    assert_eq!(fees["balance_minor"], 300);
    let customer: Value =
        serde_json::from_str(&balance_text(&client, "customer:42:available", position).await)
            .unwrap();
    assert_eq!(customer["balance_minor"], 9_700);
}

/// Fifty transfers at once from each of three declared accounts: exactly those that fit the
/// policy succeed (an overdraft limit of 5,000; overdraft forbidden on 3,000 of funds; a debit-
/// normal account that may not go above zero). A frozen account takes no transfer either way;
/// the listing shows balances and policies as declared; verify holds.
async fn overdraft_policies_hold_under_concurrent_transfers(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    let limited = declare(
        &client,
        "declare-limited",
        json!({"account": "merchant:limited", "currency": "USD",
               "overdraft": {"policy": "limit", "limit_minor": 5_000},
               "metadata": {"owner": "treasury"}}),
    )
    .await;
    assert_eq!(
        limited.status,
        201,
        "{}",
        String::from_utf8_lossy(&limited.body)
    );
    assert_eq!(
        limited.json()["overdraft"],
        json!({"policy": "limit", "limit_minor": 5000})
    );
    let strict = declare(
        &client,
        "declare-strict",
        json!({"account": "merchant:strict", "currency": "USD",
               "overdraft": {"policy": "forbidden"}}),
    )
    .await;
    assert_eq!(strict.status, 201);
    let funded = client
        .post(
            "/v1/transfers",
            "fund-strict",
            &transfer("merchant:source", "merchant:strict", json!(3_000)),
        )
        .await;
    assert_eq!(funded.status, 201);
    // A debit-normal account sits below zero; being credited past zero is its overdraft.
    let debit = declare(
        &client,
        "declare-debit",
        json!({"account": "merchant:receivable", "currency": "USD", "normal_balance": "debit",
               "overdraft": {"policy": "forbidden"}}),
    )
    .await;
    assert_eq!(debit.status, 201);
    let owed = client
        .post(
            "/v1/transfers",
            "owe",
            &transfer("merchant:receivable", "merchant:source", json!(2_000)),
        )
        .await;
    assert_eq!(owed.status, 201);

    let cases = [
        ("merchant:limited", "merchant:sink", 1_000, 5),
        ("merchant:strict", "merchant:sink", 100, 30),
        ("merchant:sink", "merchant:receivable", 100, 20),
    ];
    let mut tasks = Vec::new();
    for (case, (from, to, amount, _)) in cases.iter().enumerate() {
        for n in 0..50 {
            let client = client.clone();
            let body = transfer(from, to, json!(amount));
            tasks.push(tokio::spawn(async move {
                let answer = client
                    .post("/v1/transfers", &format!("race-{case}-{n}"), &body)
                    .await;
                (case, answer.status, answer.code())
            }));
        }
    }
    let mut accepted = [0; 3];
    for task in tasks {
        match task.await.unwrap() {
            (case, 201, _) => accepted[case] += 1,
            (_, 422, code) if code == "insufficient_funds" => {}
            (case, status, code) => panic!("case {case}: unexpected {status} {code}"),
        }
    }
    assert_eq!(
        accepted,
        [cases[0].3, cases[1].3, cases[2].3],
        "exactly the transfers that fit each policy"
    );

    // Frozen: nothing in, nothing out; thawed: as before.
    let frozen = declare(
        &client,
        "freeze",
        json!({"account": "merchant:strict", "currency": "USD", "frozen": true}),
    )
    .await;
    assert_eq!(
        (frozen.status, frozen.json()["frozen"].as_bool()),
        (200, Some(true))
    );
    for (n, (from, to)) in [
        ("merchant:strict", "merchant:x"),
        ("merchant:x", "merchant:strict"),
    ]
    .into_iter()
    .enumerate()
    {
        let answer = client
            .post(
                "/v1/transfers",
                &format!("frozen-{n}"),
                &transfer(from, to, json!(1)),
            )
            .await;
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (422, "account_frozen")
        );
    }
    let thawed = declare(
        &client,
        "thaw",
        json!({"account": "merchant:strict", "currency": "USD"}),
    )
    .await;
    assert_eq!(thawed.status, 200);
    let last = client
        .post(
            "/v1/transfers",
            "after-thaw",
            &transfer("merchant:x", "merchant:strict", json!(1)),
        )
        .await;
    assert_eq!(last.status, 201);
    let last_position = last.json()["position"].as_i64().unwrap();

    // The listing, once the projector has reached the last transfer.
    let deadline = Instant::now() + Duration::from_secs(30);
    let listing = loop {
        let answer = client
            .get("/v1/accounts?prefix=merchant:&currency=USD")
            .await;
        assert_eq!(answer.status, 200);
        let listing = answer.json();
        if listing["as_of_position"].as_i64().unwrap() >= last_position {
            break listing;
        }
        assert!(Instant::now() < deadline, "the listing never caught up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let account = |name: &str| -> Value {
        listing["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["account"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} not listed: {listing}"))
    };
    let limited = account("merchant:limited");
    assert_eq!(limited["balance_minor"], -5_000);
    assert_eq!(limited["declared"], true);
    assert_eq!(limited["metadata"], json!({"owner": "treasury"}));
    assert_eq!(account("merchant:strict")["balance_minor"], 1);
    assert_eq!(account("merchant:strict")["frozen"], false);
    assert_eq!(account("merchant:receivable")["balance_minor"], 0);
    assert_eq!(account("merchant:receivable")["normal_balance"], "debit");
    let sink = account("merchant:sink");
    assert_eq!(
        (
            sink["declared"].as_bool(),
            sink["overdraft"]["policy"].as_str()
        ),
        (Some(false), Some("allowed"))
    );
    assert_eq!(sink["balance_minor"], 5_000 + 3_000 - 2_000);
    // Pages in name order: one account per page walks the same list.
    let mut walked = Vec::new();
    let mut after = String::new();
    loop {
        let page = client
            .get(&format!(
                "/v1/accounts?prefix=merchant:&currency=USD&limit=1{after}"
            ))
            .await
            .json();
        walked.extend(
            page["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["account"].as_str().unwrap().to_owned()),
        );
        match page["next_after"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    let listed: Vec<String> = listing["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["account"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(walked, listed);
    assert!(
        listed.windows(2).all(|pair| pair[0] < pair[1]),
        "{listed:?}"
    );
    let bad = client.get("/v1/accounts?prefix=Merchant").await;
    assert_eq!((bad.status, bad.code().as_str()), (400, "invalid_query"));

    projections_catch_up(&database.url).await;
    let (ok, output) = asiento(&["verify", "--database-url", &database.url]);
    assert!(ok, "{output}");
}

asiento_testkit::both_backends!(threads = 2;
    amounts_above_the_limit_are_refused_at_the_edge,
    balances_beyond_i64_are_exact,
    system_accounts_are_reserved,
    overdraft_policies_hold_under_concurrent_transfers,
);
