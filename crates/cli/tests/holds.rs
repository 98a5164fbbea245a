//! Holds (two-phase transfers) through the real binary over real HTTP, on SQLite and PostgreSQL:
//! a hold reserves the amount out of reach of every later command, is posted whole or in part
//! (the rest released) or voided, each ending its own entry; the worker voids one whose
//! `expires_at` passed; of concurrent posts and voids of one hold exactly one wins; an authorized
//! card payment shows as a pending credit to its customer until captured or cancelled; a
//! customer's open holds, a merchant's incoming transfers and a status's transfers are listed by
//! `GET /v1/transfers`; and `asiento verify` finds every guard and the transfer list in
//! agreement with the log.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{asiento, payment_body, sim_list, Backend, Client, Server, TestDatabase};
use serde_json::{json, Value};

const CUSTOMER: &str = "customer:42:available";

fn hold(from: &str, to: &str, amount_minor: i64) -> Value {
    json!({"from": from, "to": to, "amount_minor": amount_minor, "currency": "USD",
           "pending": true})
}

/// The balance once it includes `position`.
async fn balance(client: &Client, account: &str, position: i64) -> Value {
    let answer = client
        .get(&format!(
            "/v1/accounts/{account}/balance?currency=USD&min_position={position}"
        ))
        .await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()
}

/// (posted, pending debits, pending credits, available) of `account`.
async fn amounts(client: &Client, account: &str, position: i64) -> [i64; 4] {
    let b = balance(client, account, position).await;
    [
        "balance_minor",
        "pending_debits_minor",
        "pending_credits_minor",
        "available_minor",
    ]
    .map(|field| {
        b[field]
            .as_i64()
            .unwrap_or_else(|| panic!("{field} in {b}"))
    })
}

/// A server whose customer 42 holds 9,700 (a captured payment of 10,000 less its fee).
async fn funded(backend: Backend) -> (TestDatabase, Server, Client, i64) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    let paid = client
        .post("/v1/payments", "pay", &payment_body(10_000, "pm_card_ok"))
        .await;
    assert_eq!(paid.status, 201);
    let position = paid.json()["position"].as_i64().unwrap();
    (database, server, client, position)
}

async fn verify_clean(database_url: &str) {
    // The balances projection may still be catching up; verify reads the log and the tables.
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

/// A hold of 6,000 leaves 3,700 available: a transfer of 4,000 is refused, one of 3,700 is not.
/// Posting 2,500 of the hold moves 2,500 and releases the rest; the hold then refuses a second
/// post and a void, and a replay answers the same bytes. A second hold is voided whole. Bad
/// requests are refused with their codes and change nothing.
async fn holds_reserve_then_post_or_void(backend: Backend) {
    let (database, _server, client, paid_at) = funded(backend).await;
    assert_eq!(
        amounts(&client, CUSTOMER, paid_at).await,
        [9_700, 0, 0, 9_700]
    );
    let held = client
        .post(
            "/v1/transfers",
            "hold-1",
            &hold(CUSTOMER, "merchant:shop", 6_000),
        )
        .await;
    assert_eq!(held.status, 201, "{}", String::from_utf8_lossy(&held.body));
    let held = held.json();
    assert_eq!(
        (held["status"].as_str(), held["pending"].as_bool()),
        (Some("pending"), Some(true))
    );
    assert_eq!(held["posted_amount_minor"], 0);
    let id = held["id"].as_str().unwrap().to_owned();
    let at = held["position"].as_i64().unwrap();
    assert_eq!(
        amounts(&client, CUSTOMER, at).await,
        [9_700, 6_000, 0, 3_700]
    );
    assert_eq!(
        amounts(&client, "merchant:shop", at).await,
        [0, 0, 6_000, 0]
    );

    // The reservation is out of reach of the next command.
    let spend = |amount| json!({"from": CUSTOMER, "to": "merchant:cafe", "amount_minor": amount, "currency": "USD"});
    let refused = client
        .post("/v1/transfers", "spend-4000", &spend(4_000))
        .await;
    assert_eq!(
        (refused.status, refused.code().as_str()),
        (422, "insufficient_funds")
    );
    let spent = client
        .post("/v1/transfers", "spend-3700", &spend(3_700))
        .await;
    assert_eq!(spent.status, 201);
    let at = spent.json()["position"].as_i64().unwrap();
    assert_eq!(amounts(&client, CUSTOMER, at).await, [6_000, 6_000, 0, 0]);

    // Bad requests: each its code, nothing changed.
    let post_path = format!("/v1/transfers/{id}/post");
    for (key, path, body, status, code) in [
        (
            "too-much",
            post_path.as_str(),
            json!({"amount_minor": 6_001}),
            422,
            "amount_exceeds_hold",
        ),
        (
            "zero",
            post_path.as_str(),
            json!({"amount_minor": 0}),
            400,
            "amount_must_be_positive",
        ),
        (
            "typo",
            post_path.as_str(),
            json!({"amount": 5}),
            400,
            "unknown_field",
        ),
        (
            "nobody",
            "/v1/transfers/tr_00000000000000000000000000000001/post",
            json!({}),
            404,
            "transfer_not_found",
        ),
        (
            "garbage",
            "/v1/transfers/nope/void",
            json!({}),
            404,
            "transfer_not_found",
        ),
    ] {
        let answer = client.post(path, key, &body).await;
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (status, code),
            "{key}"
        );
    }
    let beta = client.with_key("sk_test_beta_0123456789abcdef");
    let foreign = beta
        .post(&format!("/v1/transfers/{id}/void"), "foreign", &json!({}))
        .await;
    assert_eq!(
        (foreign.status, foreign.code().as_str()),
        (404, "transfer_not_found")
    );
    assert_eq!(beta.get(&format!("/v1/transfers/{id}")).await.status, 404);
    for (key, body, code) in [
        (
            "past",
            json!({"from": CUSTOMER, "to": "merchant:shop", "amount_minor": 1, "currency": "USD",
                         "pending": true, "expires_at": "2020-01-01T00:00:00Z"}),
            "expires_at_in_the_past",
        ),
        (
            "no-hold",
            json!({"from": CUSTOMER, "to": "merchant:shop", "amount_minor": 1, "currency": "USD",
                            "expires_at": "2999-01-01T00:00:00Z"}),
            "expires_at_without_hold",
        ),
        (
            "shadow",
            hold("pending_debits:customer:42:available", "merchant:shop", 1),
            "account_reserved",
        ),
    ] {
        let answer = client.post("/v1/transfers", key, &body).await;
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (422, code),
            "{key}"
        );
    }
    let unparsable = client
        .post(
            "/v1/transfers",
            "bad-time",
            &json!({"from": CUSTOMER, "to": "merchant:shop", "amount_minor": 1, "currency": "USD",
                    "pending": true, "expires_at": "tomorrow"}),
        )
        .await;
    assert_eq!(
        (unparsable.status, unparsable.code().as_str()),
        (400, "invalid_field")
    );
    let plain = spent.json()["id"].as_str().unwrap().to_owned();
    let not_a_hold = client
        .post(&format!("/v1/transfers/{plain}/void"), "plain", &json!({}))
        .await;
    assert_eq!(
        (not_a_hold.status, not_a_hold.code().as_str()),
        (409, "not_a_hold")
    );

    // A partial post: 2,500 moves, 3,500 is released.
    let posted = client
        .post(&post_path, "post-1", &json!({"amount_minor": 2_500}))
        .await;
    assert_eq!(
        posted.status,
        200,
        "{}",
        String::from_utf8_lossy(&posted.body)
    );
    let body = posted.json();
    assert_eq!(
        (
            body["status"].as_str(),
            body["posted_amount_minor"].as_i64()
        ),
        (Some("posted"), Some(2_500))
    );
    assert!(body["settled_entry_id"].is_string());
    let at = body["position"].as_i64().unwrap();
    assert_eq!(amounts(&client, CUSTOMER, at).await, [3_500, 0, 0, 3_500]);
    assert_eq!(
        amounts(&client, "merchant:shop", at).await,
        [2_500, 0, 0, 2_500]
    );
    let replay = client
        .post(&post_path, "post-1", &json!({"amount_minor": 2_500}))
        .await;
    assert!(replay.replayed());
    assert_eq!((replay.status, replay.body), (posted.status, posted.body));
    for (key, action) in [("post-2", "post"), ("void-late", "void")] {
        let again = client
            .post(&format!("/v1/transfers/{id}/{action}"), key, &json!({}))
            .await;
        assert_eq!((again.status, again.code().as_str()), (409, "hold_posted"));
    }
    let read = client.get(&format!("/v1/transfers/{id}")).await;
    assert_eq!(read.status, 200);
    assert_eq!(read.json()["status"], "posted");

    // A second hold, voided whole.
    let second = client
        .post(
            "/v1/transfers",
            "hold-2",
            &hold(CUSTOMER, "merchant:shop", 3_000),
        )
        .await;
    assert_eq!(second.status, 201);
    let second_id = second.json()["id"].as_str().unwrap().to_owned();
    let voided = client
        .post(
            &format!("/v1/transfers/{second_id}/void"),
            "void-2",
            &json!({}),
        )
        .await;
    assert_eq!(voided.status, 200);
    assert_eq!(voided.json()["status"], "voided");
    let at = voided.json()["position"].as_i64().unwrap();
    assert_eq!(amounts(&client, CUSTOMER, at).await, [3_500, 0, 0, 3_500]);
    let post_voided = client
        .post(
            &format!("/v1/transfers/{second_id}/post"),
            "post-voided",
            &json!({}),
        )
        .await;
    assert_eq!(
        (post_voided.status, post_voided.code().as_str()),
        (409, "hold_voided")
    );

    // The listing shows the reservation on the account, never the pending accounts themselves.
    let third = client
        .post(
            "/v1/transfers",
            "hold-3",
            &hold(CUSTOMER, "merchant:new", 1_000),
        )
        .await;
    let at = third.json()["position"].as_i64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let listing = loop {
        let listing = client.get("/v1/accounts?currency=USD").await.json();
        if listing["as_of_position"].as_i64().unwrap() >= at {
            break listing;
        }
        assert!(Instant::now() < deadline, "the listing never caught up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let data = listing["data"].as_array().unwrap();
    assert!(
        data.iter()
            .all(|a| !a["account"].as_str().unwrap().starts_with("pending_")),
        "{listing}"
    );
    let customer = data.iter().find(|a| a["account"] == CUSTOMER).unwrap();
    assert_eq!(
        (
            &customer["balance_minor"],
            &customer["pending_debits_minor"],
            &customer["available_minor"]
        ),
        (&json!(3_500), &json!(1_000), &json!(2_500))
    );
    // An account with nothing posted yet is listed with what holds reserve for it.
    let new = data
        .iter()
        .find(|a| a["account"] == "merchant:new")
        .unwrap();
    assert_eq!(
        (&new["balance_minor"], &new["pending_credits_minor"]),
        (&json!(0), &json!(1_000))
    );
    verify_clean(&database.url).await;
}

/// A hold with an `expires_at` two seconds ahead: the worker voids it as expired, the money is
/// available again, and a post after that is refused.
async fn the_worker_voids_an_expired_hold(backend: Backend) {
    let (database, _server, client, _) = funded(backend).await;
    let expires_at = chrono::Utc::now() + chrono::Duration::seconds(2);
    let held = client
        .post(
            "/v1/transfers",
            "expiring",
            &json!({"from": CUSTOMER, "to": "merchant:shop", "amount_minor": 9_000,
                    "currency": "USD", "pending": true,
                    "expires_at": expires_at.to_rfc3339()}),
        )
        .await;
    assert_eq!(held.status, 201, "{}", String::from_utf8_lossy(&held.body));
    let id = held.json()["id"].as_str().unwrap().to_owned();
    let at = held.json()["position"].as_i64().unwrap();
    assert_eq!(amounts(&client, CUSTOMER, at).await[3], 700);
    let deadline = Instant::now() + Duration::from_secs(30);
    let expired = loop {
        let read = client.get(&format!("/v1/transfers/{id}")).await.json();
        if read["status"] == "expired" {
            break read;
        }
        assert_eq!(read["status"], "pending");
        assert!(Instant::now() < deadline, "the hold never expired: {read}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let settled_at =
        chrono::DateTime::parse_from_rfc3339(expired["settled_at"].as_str().unwrap()).unwrap();
    assert!(settled_at >= expires_at, "voided before it expired");
    let at = expired["position"].as_i64().unwrap();
    assert_eq!(amounts(&client, CUSTOMER, at).await, [9_700, 0, 0, 9_700]);
    let late = client
        .post(&format!("/v1/transfers/{id}/post"), "late", &json!({}))
        .await;
    assert_eq!((late.status, late.code().as_str()), (409, "hold_expired"));
    // The merchant is told: reserved, then expired.
    let told =
        common::merchant_events_of(&client, "transfer.pending,transfer.expired", &id, 2).await;
    let kinds: Vec<&str> = told.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["transfer.pending", "transfer.expired"]);
    assert_eq!(told[1]["data"]["object"]["status"], "expired");
    // Listed as expired.
    let expired_list = client
        .get(&format!("/v1/transfers?status=expired&min_position={at}"))
        .await
        .json();
    assert_eq!(expired_list["data"][0]["id"], id.as_str(), "{expired_list}");
    verify_clean(&database.url).await;
}

/// Twenty requests at once on one hold, half posts and half voids, each with its own key:
/// exactly one wins, every other is 409 naming how the hold ended, and one ending entry exists.
async fn racing_endings_of_one_hold_exactly_one_wins(backend: Backend) {
    let (database, _server, client, _) = funded(backend).await;
    let held = client
        .post(
            "/v1/transfers",
            "hold",
            &hold(CUSTOMER, "merchant:shop", 5_000),
        )
        .await;
    assert_eq!(held.status, 201);
    let id = held.json()["id"].as_str().unwrap().to_owned();
    let mut tasks = Vec::new();
    for n in 0..20 {
        let (client, id) = (client.clone(), id.clone());
        let action = if n % 2 == 0 { "post" } else { "void" };
        tasks.push(tokio::spawn(async move {
            let answer = client
                .post(
                    &format!("/v1/transfers/{id}/{action}"),
                    &format!("race-{n}"),
                    &json!({}),
                )
                .await;
            (action, answer.status, answer.code(), answer.json())
        }));
    }
    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            (action, 200, _, body) => winners.push((action, body)),
            (_, 409, code, _) => losers.push(code),
            (action, status, code, _) => panic!("{action}: unexpected {status} {code}"),
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    let (action, body) = &winners[0];
    let ended = if *action == "post" {
        "hold_posted"
    } else {
        "hold_voided"
    };
    assert!(losers.iter().all(|code| code == ended), "{losers:?}");
    let at = body["position"].as_i64().unwrap();
    let expected = if *action == "post" {
        [4_700, 0, 0, 4_700]
    } else {
        [9_700, 0, 0, 9_700]
    };
    assert_eq!(amounts(&client, CUSTOMER, at).await, expected);
    let legs = client
        .get(&format!(
            "/v1/accounts/pending_debits:{CUSTOMER}/entries?currency=USD&min_position={at}"
        ))
        .await
        .json();
    assert_eq!(
        legs["data"].as_array().unwrap().len(),
        2,
        "the hold and one ending: {legs}"
    );
    verify_clean(&database.url).await;
}

/// A manual-capture payment of 4,000 shows as a pending credit of 4,000 to the customer (nothing
/// posted, nothing available); capturing 2,500 of it posts the capture and releases the whole
/// hold. A second one, cancelled at the provider, releases its hold without posting anything.
async fn an_authorized_payment_is_a_pending_credit_until_captured_or_cancelled(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    let authorize = |key: &'static str| {
        let client = client.clone();
        async move {
            let mut body = payment_body(4_000, "pm_card_ok");
            body["capture"] = json!("manual");
            let answer = client.post("/v1/payments", key, &body).await;
            assert_eq!(
                answer.status,
                201,
                "{}",
                String::from_utf8_lossy(&answer.body)
            );
            let payment = answer.json();
            assert_eq!(payment["status"], "authorized");
            (
                payment["id"].as_str().unwrap().to_owned(),
                payment["position"].as_i64().unwrap(),
            )
        }
    };
    let (first, at) = authorize("auth-1").await;
    assert_eq!(amounts(&client, CUSTOMER, at).await, [0, 0, 4_000, 0]);
    let captured = client
        .post(
            &format!("/v1/payments/{first}/capture"),
            "capture-1",
            &json!({"amount_minor": 2_500}),
        )
        .await;
    assert_eq!(
        captured.status,
        200,
        "{}",
        String::from_utf8_lossy(&captured.body)
    );
    let at = captured.json()["position"].as_i64().unwrap();
    // 2,500 less the 3% fee (75) is posted; the hold of 4,000 is gone.
    assert_eq!(amounts(&client, CUSTOMER, at).await, [2_425, 0, 0, 2_425]);

    let (second, at) = authorize("auth-2").await;
    assert_eq!(
        amounts(&client, CUSTOMER, at).await,
        [2_425, 0, 4_000, 2_425]
    );
    let charge = sim_list(&client, "/sim/charges")
        .await
        .into_iter()
        .find(|charge| charge["reference"] == second.as_str())
        .unwrap_or_else(|| panic!("no charge for {second}"));
    let cancelled = client
        .post(
            &format!("/sim/v1/charges/{}/cancel", charge["id"].as_str().unwrap()),
            "cancel-at-provider",
            &json!({}),
        )
        .await;
    assert_eq!(
        cancelled.status,
        200,
        "{}",
        String::from_utf8_lossy(&cancelled.body)
    );
    // The provider's webhook fails the payment; its hold is released.
    let deadline = Instant::now() + Duration::from_secs(30);
    let failed = loop {
        let payment = client.get(&format!("/v1/payments/{second}")).await.json();
        if payment["status"] == "failed" {
            break payment;
        }
        assert!(
            Instant::now() < deadline,
            "the cancel never arrived: {payment}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let at = failed["position"].as_i64().unwrap();
    assert_eq!(amounts(&client, CUSTOMER, at).await, [2_425, 0, 0, 2_425]);
    verify_clean(&database.url).await;
}

/// Ten posts of one hold sent across its `expires_at` (from 200 ms before to 250 ms after), while
/// the worker looks for due holds once a second: however each is decided, the hold ends once,
/// posted (exactly one post answered 200, the others 409) or expired (every post answered 409),
/// and its pending account holds the hold and one ending.
async fn posts_racing_the_expiry_of_one_hold_end_it_once(backend: Backend) {
    let (database, _server, client, _) = funded(backend).await;
    let expires_at = chrono::Utc::now() + chrono::Duration::milliseconds(1_500);
    let held = client
        .post(
            "/v1/transfers",
            "expiring",
            &json!({"from": CUSTOMER, "to": "merchant:shop", "amount_minor": 1_000,
                    "currency": "USD", "pending": true,
                    "expires_at": expires_at.to_rfc3339()}),
        )
        .await;
    assert_eq!(held.status, 201);
    let id = held.json()["id"].as_str().unwrap().to_owned();
    let mut tasks = Vec::new();
    for n in 0..10u64 {
        let (client, id) = (client.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1_300 + n * 50)).await;
            let answer = client
                .post(
                    &format!("/v1/transfers/{id}/post"),
                    &format!("post-{n}"),
                    &json!({}),
                )
                .await;
            (answer.status, answer.code())
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    assert!(
        answers
            .iter()
            .all(|(status, _)| [200, 409].contains(status)),
        "{answers:?}"
    );
    let posted = answers.iter().filter(|(status, _)| *status == 200).count();
    assert!(posted <= 1, "{answers:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let ended = loop {
        let read = client.get(&format!("/v1/transfers/{id}")).await.json();
        if read["status"] != "pending" {
            break read;
        }
        assert!(Instant::now() < deadline, "the hold never ended: {read}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let expected = if posted == 1 { "posted" } else { "expired" };
    assert_eq!(ended["status"], expected, "{answers:?}");
    let at = ended["position"].as_i64().unwrap();
    let legs = client
        .get(&format!(
            "/v1/accounts/pending_debits:{CUSTOMER}/entries?currency=USD&min_position={at}"
        ))
        .await
        .json();
    assert_eq!(legs["data"].as_array().unwrap().len(), 2, "{legs}");
    verify_clean(&database.url).await;
}

/// The ids of every transfer `GET /v1/transfers?{query}` lists, page by page, newest first.
async fn listed(client: &Client, query: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = client
            .get(&format!("/v1/transfers?limit=2&{query}{cursor}"))
            .await;
        assert_eq!(page.status, 200, "{}", String::from_utf8_lossy(&page.body));
        let page = page.json();
        for transfer in page["data"].as_array().unwrap() {
            ids.push(transfer["id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => return ids,
        }
    }
}

/// Holds and transfers between a customer, a shop and a wallet, listed by account (either
/// side), status and time: each list holds exactly what was made, newest first, and the
/// objects are those `GET /v1/transfers/{id}` answers.
async fn transfers_are_listed_by_account_status_and_time(backend: Backend) {
    let (database, _server, client, _) = funded(backend).await;
    let shop = "merchant:shop";
    let wallet = "merchant:wallet";
    let mut made: Vec<(String, &str, &str)> = Vec::new();
    let mut position = 0;
    for (n, (from, to, pending)) in [
        (CUSTOMER, shop, true),
        (CUSTOMER, shop, true),
        (CUSTOMER, shop, false),
        (CUSTOMER, wallet, true),
        (CUSTOMER, shop, true),
    ]
    .into_iter()
    .enumerate()
    {
        let body = json!({"from": from, "to": to, "amount_minor": 100 + n, "currency": "USD",
                          "pending": pending});
        let answer = client.post("/v1/transfers", &format!("t{n}"), &body).await;
        assert_eq!(
            answer.status,
            201,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        made.push((answer.json()["id"].as_str().unwrap().to_owned(), from, to));
        position = answer.json()["position"].as_i64().unwrap();
    }
    let since = chrono::Utc::now();
    for (path, key) in [
        (format!("/v1/transfers/{}/post", made[0].0), "post-0"),
        (format!("/v1/transfers/{}/void", made[1].0), "void-1"),
    ] {
        let answer = client.post(&path, key, &json!({})).await;
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        position = position.max(answer.json()["position"].as_i64().unwrap());
    }
    let ids =
        |keep: &[usize]| -> Vec<String> { keep.iter().rev().map(|&n| made[n].0.clone()).collect() };
    let fresh = format!("min_position={position}");
    assert_eq!(listed(&client, &fresh).await, ids(&[0, 1, 2, 3, 4]));
    // The customer's open holds; the shop's incoming transfers; the wallet's.
    let open = format!("{fresh}&account={CUSTOMER}&status=pending");
    assert_eq!(listed(&client, &open).await, ids(&[3, 4]));
    assert_eq!(
        listed(&client, &format!("account={shop}")).await,
        ids(&[0, 1, 2, 4])
    );
    assert_eq!(
        listed(&client, &format!("account={wallet}")).await,
        ids(&[3])
    );
    assert_eq!(listed(&client, "status=posted").await, ids(&[0, 2]));
    assert_eq!(listed(&client, "status=voided").await, ids(&[1]));
    let after = since
        .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
        .replace('+', "%2B");
    assert!(listed(&client, &format!("created_gte={after}"))
        .await
        .is_empty());
    assert_eq!(
        listed(&client, &format!("created_lt={after}")).await,
        ids(&[0, 1, 2, 3, 4])
    );
    // The listed object is the transfer's own.
    let page = client.get(&format!("/v1/transfers?{open}")).await.json();
    let single = client
        .get(&format!("/v1/transfers/{}", made[4].0))
        .await
        .json();
    assert_eq!(page["data"][0], single);
    // Refused queries, and another tenant sees nothing.
    for query in [
        "status=open",
        "account=Not An Account",
        "limit=0",
        "limit=101",
        "cursor=nope",
        "created_gte=yesterday",
    ] {
        let answer = client.get(&format!("/v1/transfers?{query}")).await;
        assert_eq!(
            (answer.status, answer.code()),
            (400, "invalid_query".to_owned()),
            "{query}"
        );
    }
    let beta = client.with_key("sk_test_beta_0123456789abcdef");
    assert!(listed(&beta, "").await.is_empty());
    verify_clean(&database.url).await;
}

asiento_testkit::both_backends!(threads = 2;
    transfers_are_listed_by_account_status_and_time,
    posts_racing_the_expiry_of_one_hold_end_it_once,
    an_authorized_payment_is_a_pending_credit_until_captured_or_cancelled,
    holds_reserve_then_post_or_void,
    the_worker_voids_an_expired_hold,
    racing_endings_of_one_hold_exactly_one_wins,
);
