//! Tenant cells, on two PostgreSQL primaries the test makes (`common::cluster`): one `asiento
//! serve --cells` serves both, with tenant `acme` in cell eu1 and `beta`, `gamma` in eu2, against
//! the Stripe dialect of the simulator in its own process (real HTTP both ways).
//!
//! - Every payment id carries its cell; each tenant's payments, transfers, refunds and the
//!   provider's webhooks for them land in its cell's database and nowhere else: each database's
//!   log holds only its own tenants' events, its webhook inbox only events of its payments.
//! - A console session is routed by its cookie to the cell it was signed in to.
//! - A first provider payout covers the payments of both cells: each cell posts its own part.
//! - Tenant `gamma` moves from eu2 to eu1: paused (its requests and its payments' webhooks are
//!   answered 503, retried), copied by `asiento cells move` with its share of the first payout,
//!   then placed in eu1 and listed as moved out of eu2: its old payments and its books answer
//!   from eu1 (what was paid out of its money included), and a refund of one (minted in eu2)
//!   has its provider webhook routed to eu1.
//! - A payout made while gamma is paused is posted by no cell until the move is done.
//! - A third payout covers what came after (gamma's part in eu1); then the first one fails:
//!   each cell reverses the shares of the tenants it holds, gamma's in eu1 and not in eu2.
//!   `asiento verify --cells` checks the parts add up to each payout, the moved share is in
//!   gamma's cell, gamma's copy is whole (and each cell's invariants);
//!   `reconcile --cells` finds nothing wrong in either cell (no cell takes another's charges for
//!   unknown ones); `projections status --cells` shows both.
//! - With eu1's PostgreSQL killed, eu2's tenants still pay and read: no request of theirs
//!   touches the other cell's database.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::cluster::{Cluster, DATABASE};
use common::stripe::{
    balance, captured, sim_control, start_stripe_sim, stripe_payment, API_KEY, WEBHOOK_SECRET,
};
use common::{asiento_with_env, free_port, Client, Process};
use serde_json::{json, Value};

const KEYS: [(&str, &str); 3] = [
    ("acme", "sk_test_acme_0123456789abcdef"),
    ("beta", "sk_test_beta_0123456789abcdef"),
    ("gamma", "sk_test_gamma_0123456789abcde"),
];

fn key_of(tenant: &str) -> &'static str {
    KEYS.iter().find(|(name, _)| *name == tenant).unwrap().1
}

const OPERATOR_KEY: &str = "op_test_0123456789abcdef";

const STRIPE_ENV: [(&str, &str); 2] = [
    ("ASIENTO_PROVIDER_STRIPE_API_KEY", API_KEY),
    ("ASIENTO_PROVIDER_STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET),
];

/// The cell number a payment id carries: the four hex digits after the time, `8` then the cell.
fn cell_of(payment_id: &str) -> &str {
    let hex = payment_id.strip_prefix("pay_").unwrap();
    assert_eq!(&hex[12..13], "8", "{payment_id} is not minted in a cell");
    &hex[13..16]
}

fn client(base: &str, tenant: &str) -> Client {
    Client {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
        base: base.to_owned(),
        key: key_of(tenant).to_owned(),
    }
}

/// Waits until `client`'s tenant holds `minor` in `account`.
async fn wait_balance(client: &Client, account: &str, minor: i64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = balance(client, account).await;
        if now == minor {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {account} holds {now}, not {minor}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `asiento serve --cells` on `listen` (kept across restarts: the simulator delivers there), with
/// `extra` flags.
fn serve(listen: &str, cells: &str, providers: &str, extra: &[&str]) -> Process {
    let api_keys = KEYS
        .iter()
        .map(|(tenant, key)| format!("{tenant}:{key}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut args = vec![
        "serve",
        "--listen",
        listen,
        "--cells",
        cells,
        "--api-keys",
        &api_keys,
        "--providers",
        providers,
        "--psp-timeout",
        "500ms",
        "--reconcile-interval",
        "300ms",
        "--operator-key",
        OPERATOR_KEY,
    ];
    args.extend_from_slice(extra);
    let mut server = Process::spawn(&args, &STRIPE_ENV);
    server.wait_for_line("asiento listening on ");
    server
}

/// A directory file of `cells`, `tenants` and the rest of `extra`.
fn directory(
    eu1: &Cluster,
    eu2: &Cluster,
    tenants: Value,
    extra: Value,
) -> tempfile::NamedTempFile {
    let mut file = json!({
        "cells": {
            "eu1": {"number": 1, "database_url": eu1.url()},
            "eu2": {"number": 2, "database_url": eu2.url()},
        },
        "tenants": tenants,
    });
    for (key, value) in extra.as_object().unwrap() {
        if key == "eu2_moved_out" {
            file["cells"]["eu2"]["moved_out"] = value.clone();
        } else {
            file[key] = value.clone();
        }
    }
    let written = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(written.path(), file.to_string()).unwrap();
    written
}

/// `asiento verify --cells` clean, and no payout pending in a cell, once the cells' workers and
/// projectors caught up.
async fn verified_clean(cells: &str, env: &[(&str, &str)]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, output) = asiento_with_env(&["verify", "--cells", cells], env);
        let settled = ok
            && output.contains("2 cells checked; 0 violations across cells")
            && !output.contains("pending");
        if settled {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "verify --cells never clean:\n{output}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn path(file: &tempfile::NamedTempFile) -> String {
    file.path().to_string_lossy().into_owned()
}

/// The status a Stripe event naming `payment` gets from the server at `base`. Its signature is
/// not Stripe's: what is checked is where the front sends it, before any cell verifies it.
async fn stripe_event_naming(client: &Client, base: &str, id: &str, payment: &str) -> u16 {
    let event = json!({
        "id": id, "object": "event", "type": "charge.refunded", "created": 1,
        "data": {"object": {"object": "charge", "metadata": {"asiento_payment_id": payment}}},
    });
    client
        .http
        .post(format!("{base}/webhooks/stripe"))
        .header("stripe-signature", "t=1,v1=00")
        .body(event.to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// A `psql` answer as a set of lines.
fn lines(text: &str) -> BTreeSet<String> {
    text.lines().map(str::to_owned).collect()
}

/// The console of one browser: its cookies, no redirects followed.
struct Browser {
    http: reqwest::Client,
    base: String,
    cookies: BTreeMap<String, String>,
}

impl Browser {
    async fn send(&mut self, request: reqwest::RequestBuilder) -> (u16, String) {
        let cookie = self
            .cookies
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("; ");
        let response = request.header("cookie", cookie).send().await.unwrap();
        for value in response.headers().get_all("set-cookie") {
            let text = value.to_str().unwrap();
            let pair = text.split(';').next().unwrap();
            let (name, value) = pair.split_once('=').unwrap();
            self.cookies.insert(name.to_owned(), value.to_owned());
        }
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    /// Signs in with `key` on the sign-in form at `form_path`.
    async fn sign_in(&mut self, form_path: &str, key: &str) {
        let url = format!("{}/console/sign-in", self.base);
        let form_url = format!("{}{form_path}", self.base);
        let (status, form) = self.send(self.http.get(&form_url)).await;
        assert_eq!(status, 200, "{form}");
        let csrf = form
            .split("name=\"csrf\" value=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap()
            .to_owned();
        let fields = [
            ("csrf", csrf.as_str()),
            ("operator", "ops"),
            ("api_key", key),
        ];
        let (status, page) = self.send(self.http.post(&url).form(&fields)).await;
        assert_eq!(status, 303, "{page}");
    }

    /// `path` once it contains `text`.
    async fn get_when(&mut self, path: &str, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let url = format!("{}{path}", self.base);
            let (status, page) = self.send(self.http.get(url)).await;
            if status == 200 && page.contains(text) {
                return page;
            }
            assert!(
                Instant::now() < deadline,
                "{text:?} never on {path} ({status}):\n{page}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_live_in_their_cells_and_a_payout_is_posted_in_parts() {
    let eu1 = Cluster::primary();
    let eu2 = Cluster::primary();
    let placed = json!({"acme": "eu1", "beta": "eu2", "gamma": "eu2"});
    let initial = directory(&eu1, &eu2, placed.clone(), json!({}));
    let cells = path(&initial);
    let sim_listen = format!("127.0.0.1:{}", free_port());
    let providers = format!("stripe=stripe:http://{sim_listen}");
    let listen = format!("127.0.0.1:{}", free_port());
    let base = format!("http://{listen}");
    let mut server = serve(&listen, &cells, &providers, &[]);
    let _sim = start_stripe_sim(&sim_listen, &base);
    let (acme, beta, gamma) = (
        client(&base, "acme"),
        client(&base, "beta"),
        client(&base, "gamma"),
    );

    // Payments (one refunded in part) and a transfer for each tenant.
    let mut paid: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut owed: BTreeMap<&str, i64> = BTreeMap::new();
    for (tenant, client) in [("acme", &acme), ("beta", &beta), ("gamma", &gamma)] {
        let first = captured(client, &format!("{tenant}-1"), 10_000).await;
        let second = captured(client, &format!("{tenant}-2"), 4_000).await;
        let refund = client
            .post(
                &format!("/v1/payments/{second}/refunds"),
                &format!("{tenant}-2-refund"),
                &json!({"amount_minor": 1_500}),
            )
            .await;
        assert_eq!(
            refund.status,
            201,
            "{}",
            String::from_utf8_lossy(&refund.body)
        );
        let transfer = client
            .post(
                "/v1/transfers",
                &format!("{tenant}-t1"),
                &json!({"from": "merchant:a", "to": "merchant:b", "amount_minor": 700, "currency": "USD"}),
            )
            .await;
        assert_eq!(
            transfer.status,
            201,
            "{}",
            String::from_utf8_lossy(&transfer.body)
        );
        // 10000 less Stripe's 2.9 % (290), and 4000 less 116 with 1500 refunded.
        owed.insert(tenant, (10_000 - 290) + (4_000 - 116 - 1_500));
        paid.insert(tenant, vec![first, second]);
    }
    for id in &paid["acme"] {
        assert_eq!(cell_of(id), "001", "{id}");
    }
    for id in paid["beta"].iter().chain(&paid["gamma"]) {
        assert_eq!(cell_of(id), "002", "{id}");
    }
    // A tenant never sees another's payment, in its cell or the other.
    for (client, other) in [
        (&beta, &paid["acme"][0]),
        (&acme, &paid["beta"][0]),
        (&gamma, &paid["beta"][0]),
    ] {
        assert_eq!(
            client.get(&format!("/v1/payments/{other}")).await.status,
            404
        );
    }

    // Each database holds only its own tenants' events, and provider events of its payments.
    let tenants_sql = "select distinct metadata->>'tenant' from events \
                       where metadata->>'tenant' is not null order by 1";
    assert_eq!(lines(&eu1.psql(DATABASE, tenants_sql)), lines("acme"));
    assert_eq!(
        lines(&eu2.psql(DATABASE, tenants_sql)),
        lines("beta\ngamma")
    );
    let refs_sql = "select distinct substr(payment_ref, 17, 4) from webhook_inbox \
                    where payment_ref like 'pay_%'";
    assert_eq!(lines(&eu1.psql(DATABASE, refs_sql)), lines("8001"));
    assert_eq!(lines(&eu2.psql(DATABASE, refs_sql)), lines("8002"));

    // The console: beta's session lives in eu2, and shows beta's payments.
    let mut browser = Browser {
        http: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap(),
        base: base.clone(),
        cookies: BTreeMap::new(),
    };
    browser.sign_in("/console/sign-in", key_of("beta")).await;
    assert!(
        browser.cookies["asiento_console"].starts_with("eu2."),
        "{:?}",
        browser.cookies
    );
    let page = browser
        .get_when("/console/payments", &paid["beta"][0])
        .await;
    assert!(
        !page.contains(&paid["acme"][0]),
        "acme's payment on beta's console"
    );
    assert_eq!(
        eu2.psql(
            DATABASE,
            "select count(*) from console_sessions where tenant = 'beta'"
        ),
        "1"
    );
    assert_eq!(
        eu1.psql(DATABASE, "select count(*) from console_sessions"),
        "0"
    );
    // The platform operator's key is no tenant's: it signs in to the cell the form was asked for.
    let mut operator = Browser {
        http: browser.http.clone(),
        base: base.clone(),
        cookies: BTreeMap::new(),
    };
    operator
        .sign_in("/console/sign-in?cell=eu2", OPERATOR_KEY)
        .await;
    assert!(
        operator.cookies["asiento_console"].starts_with("eu2."),
        "{:?}",
        operator.cookies
    );
    operator.get_when("/console/exceptions", "xceptions").await;
    assert_eq!(
        eu2.psql(
            DATABASE,
            "select count(*) from console_sessions where tenant is null"
        ),
        "1"
    );

    // A first payout of everything so far: each cell posts its tenants' shares.
    let made = sim_control(&acme, &sim_listen, "/sim/payouts", json!({})).await;
    let first_payout = made["data"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        made["data"][0]["amount"],
        owed.values().sum::<i64>(),
        "{made}"
    );
    for (tenant, client) in [("acme", &acme), ("beta", &beta), ("gamma", &gamma)] {
        wait_balance(client, "bank:stripe:payouts", -owed[tenant], tenant).await;
        wait_balance(client, "psp:stripe:clearing", 0, tenant).await;
    }
    let paid_first = owed.clone();

    // gamma moves to eu1. Paused first: its requests, and provider events of its payments, are
    // answered 503 with Retry-After; beta's are not.
    let env: Vec<(&str, &str)> = STRIPE_ENV.to_vec();
    let move_gamma = [
        "cells", "move", "--cells", &cells, "--tenant", "gamma", "--to", "eu1",
    ];
    let (ok, output) = asiento_with_env(&move_gamma, &env);
    assert!(!ok && output.contains("is not paused"), "{output}");
    let pausing = directory(&eu1, &eu2, placed, json!({"paused": ["gamma"]}));
    server.terminate();
    server = serve(&listen, &path(&pausing), &providers, &[]);
    let paused = gamma.get("/v1/payments?limit=10").await;
    assert_eq!(
        (paused.status, paused.code().as_str()),
        (503, "tenant_paused")
    );
    assert!(paused.headers.contains_key("retry-after"));
    assert_eq!(beta.get("/v1/payments?limit=10").await.status, 200);
    let delivered = stripe_event_naming(&gamma, &base, "evt_while_paused", &paid["gamma"][1]).await;
    assert_eq!(delivered, 503);
    // While a tenant is paused no cell posts a payout (which cell posts gamma's share changes
    // with the move): one made now, of a payment of beta's, is posted once the move is done.
    captured(&beta, "beta-3", 10_000).await;
    *owed.get_mut("beta").unwrap() += 10_000 - 290;
    let made = sim_control(&acme, &sim_listen, "/sim/payouts", json!({})).await;
    let while_paused = made["data"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(made["data"][0]["amount"], 10_000 - 290, "{made}");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let posted =
        format!("select count(*) from events where stream_id = 'payout-stripe:{while_paused}'");
    assert_eq!(eu1.psql(DATABASE, &posted), "0");
    assert_eq!(eu2.psql(DATABASE, &posted), "0");
    // Its webhook waits in each cell's inbox, its retries not counted as failures.
    let waiting = "select count(*) || ' ' || coalesce(sum(attempts), 0) from webhook_inbox \
                   where event_type like 'payout.%' and status = 'pending' \
                   and last_error like '%paused%'";
    assert_eq!(eu1.psql(DATABASE, waiting), "1 0");
    assert_eq!(eu2.psql(DATABASE, waiting), "1 0");
    let move_paused = [
        "cells",
        "move",
        "--cells",
        &path(&pausing),
        "--tenant",
        "gamma",
        "--to",
        "eu1",
    ];
    let (ok, output) = asiento_with_env(&move_paused, &env);
    assert!(ok, "{output}");
    // Run again (as after a cut): nothing more is copied, no share moves twice.
    let (ok, output) = asiento_with_env(&move_paused, &env);
    assert!(
        ok && output.contains("events: 0 rows copied") && output.contains("payout shares: 1 moved"),
        "{output}"
    );
    let moved = directory(
        &eu1,
        &eu2,
        json!({"acme": "eu1", "beta": "eu2", "gamma": "eu1"}),
        json!({"eu2_moved_out": ["gamma"]}),
    );
    let cells = path(&moved);
    server.terminate();
    server = serve(&listen, &cells, &providers, &[]);
    for id in &paid["gamma"] {
        let answer = gamma.get(&format!("/v1/payments/{id}")).await;
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
    }
    assert_eq!(
        eu2.psql(
            DATABASE,
            "select count(*) from api_keys where tenant = 'gamma'"
        ),
        "0"
    );
    // gamma's books in eu1 hold its share of the first payout, moved with it, and verify finds
    // the copy whole and each payout's share in one cell.
    verified_clean(&cells, &env).await;
    wait_balance(&gamma, "bank:stripe:payouts", -owed["gamma"], "gamma moved").await;
    wait_balance(&gamma, "psp:stripe:clearing", 0, "gamma moved").await;
    // A refund of a payment minted in eu2: its provider webhook reaches eu1 (a fee refund
    // included, its share of the payout below is 500 less).
    let second = &paid["gamma"][1];
    // The payment's provider events in a cell's inbox (none were copied: the inbox is a cell's
    // own), processed, by type.
    let events_sql = format!(
        "select count(*) from webhook_inbox where payment_ref = '{second}' \
         and event_type = 'charge.refunded' and status = 'processed'"
    );
    let eu2_before = eu2.psql(DATABASE, &events_sql);
    assert_eq!(eu1.psql(DATABASE, &events_sql), "0");
    let refund = gamma
        .post(
            &format!("/v1/payments/{second}/refunds"),
            "gamma-2-refund-after-move",
            &json!({"amount_minor": 500}),
        )
        .await;
    assert_eq!(
        refund.status,
        201,
        "{}",
        String::from_utf8_lossy(&refund.body)
    );
    *owed.get_mut("gamma").unwrap() -= 500;
    let deadline = Instant::now() + Duration::from_secs(30);
    while eu1.psql(DATABASE, &events_sql) == "0" {
        assert!(
            Instant::now() < deadline,
            "the refund's webhook never reached eu1"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(eu2.psql(DATABASE, &events_sql), eu2_before);

    // A third payout of what came since (beta's new payment, gamma's refund in eu1): each cell
    // posts its tenants' shares (the second, made while gamma was paused, is posted by now).
    captured(&beta, "beta-4", 10_000).await;
    *owed.get_mut("beta").unwrap() += 10_000 - 290;
    let made = sim_control(&acme, &sim_listen, "/sim/payouts", json!({})).await;
    let payouts = made["data"].as_array().unwrap();
    assert_eq!(payouts.len(), 1, "one currency, one payout: {made}");
    let total: i64 = owed.values().sum::<i64>() - paid_first.values().sum::<i64>() - (10_000 - 290);
    assert_eq!(payouts[0]["amount"], total, "{made}");
    for (tenant, client) in [("acme", &acme), ("beta", &beta), ("gamma", &gamma)] {
        wait_balance(client, "bank:stripe:payouts", -owed[tenant], tenant).await;
        wait_balance(client, "psp:stripe:clearing", 0, tenant).await;
    }

    // The first payout fails at the bank: every tenant's share of it is back in clearing, each
    // reversed in the cell that holds the tenant now (gamma's in eu1, none of gamma's in eu2).
    sim_control(
        &acme,
        &sim_listen,
        &format!("/sim/payouts/{first_payout}/fail"),
        json!({}),
    )
    .await;
    for (tenant, client) in [("acme", &acme), ("beta", &beta), ("gamma", &gamma)] {
        let since = owed[tenant] - paid_first[tenant];
        wait_balance(client, "bank:stripe:payouts", -since, tenant).await;
        wait_balance(client, "psp:stripe:clearing", -paid_first[tenant], tenant).await;
    }
    let reversals_of = |tenant: &str| {
        format!(
            "select count(*) from events where stream_id = 'payout-stripe:{first_payout}' \
             and event_type = 'EntryPosted' and data->'entry'->>'tenant' = '{tenant}' \
             and data->'entry'->>'reverses' is not null"
        )
    };
    assert_eq!(eu1.psql(DATABASE, &reversals_of("gamma")), "1");
    assert_eq!(eu2.psql(DATABASE, &reversals_of("gamma")), "0");
    assert_eq!(eu2.psql(DATABASE, &reversals_of("beta")), "1");

    // Each cell's projectors and workers record under their cell's label.
    let metrics = acme.metrics_text().await;
    for cell in ["eu1", "eu2"] {
        let label = format!("cell=\"{cell}\"");
        for metric in ["asiento_projection_owner{", "asiento_events_unsealed{"] {
            assert!(
                metrics
                    .lines()
                    .any(|line| line.starts_with(metric) && line.contains(&label)),
                "no {metric}{label} in:\n{metrics}"
            );
        }
    }

    verified_clean(&cells, &env).await;
    let (ok, output) = asiento_with_env(
        &[
            "reconcile",
            "--cells",
            &cells,
            "--providers",
            &providers,
            "--report-settle",
            "0s",
        ],
        &env,
    );
    assert!(ok, "{output}");
    assert_eq!(
        output.matches("open exceptions: 0").count(),
        2,
        "each cell compares only its own charges:\n{output}"
    );
    let (ok, output) = asiento_with_env(&["projections", "status", "--cells", &cells], &env);
    assert!(
        ok && output.contains("cell eu1") && output.contains("cell eu2"),
        "{output}"
    );

    // gamma cannot move back to eu2, where its share of the first payout moved out.
    let back = directory(
        &eu1,
        &eu2,
        json!({"acme": "eu1", "beta": "eu2", "gamma": "eu1"}),
        json!({"eu2_moved_out": ["gamma"], "paused": ["gamma"]}),
    );
    let (ok, output) = asiento_with_env(
        &[
            "cells",
            "move",
            "--cells",
            &path(&back),
            "--tenant",
            "gamma",
            "--to",
            "eu2",
        ],
        &env,
    );
    assert!(!ok && output.contains("left eu2 before"), "{output}");

    // A directory that places beta in eu1, while beta's events are in eu2, and says acme moved
    // out of eu1 to eu2, where nothing of acme's was copied: verify names both.
    let wrong = directory(
        &eu1,
        &eu2,
        json!({"acme": "eu2", "beta": "eu1", "gamma": "eu1"}),
        json!({"eu2_moved_out": ["gamma"]}),
    );
    let mut file: Value =
        serde_json::from_str(&std::fs::read_to_string(wrong.path()).unwrap()).unwrap();
    file["cells"]["eu1"]["moved_out"] = json!(["acme"]);
    std::fs::write(wrong.path(), file.to_string()).unwrap();
    let (ok, output) = asiento_with_env(&["verify", "--cells", &path(&wrong)], &env);
    assert!(!ok, "{output}");
    assert!(
        output.contains(
            "cell_placement: cell eu2 holds events of tenant beta, which the directory places in eu1"
        ),
        "{output}"
    );
    assert!(
        output.contains("moved_tenant: tenant acme from eu1 to eu2: event "),
        "{output}"
    );

    // A process of eu1 alone (`--cell`): it serves eu1's tenants and sends a provider event of
    // an eu2 payment back as misdirected (421), never into eu1.
    let eu1_listen = format!("127.0.0.1:{}", free_port());
    let _eu1_only = serve(
        &eu1_listen,
        &cells,
        &providers,
        &["--cell", "eu1", "--role", "api"],
    );
    let eu1_base = format!("http://{eu1_listen}");
    let acme_there = client(&eu1_base, "acme");
    let own = acme_there
        .get(&format!("/v1/payments/{}", paid["acme"][0]))
        .await;
    assert_eq!(own.status, 200, "{}", String::from_utf8_lossy(&own.body));
    let misdirected =
        stripe_event_naming(&acme_there, &eu1_base, "evt_elsewhere", &paid["beta"][0]).await;
    assert_eq!(misdirected, 421);

    // eu1's PostgreSQL gone: eu2's tenant goes on paying and reading.
    eu1.kill_postmaster();
    let after = beta
        .post(
            "/v1/payments",
            "beta-after",
            &stripe_payment(2_500, "pm_card_ok"),
        )
        .await;
    assert_eq!(
        after.status,
        201,
        "{}",
        String::from_utf8_lossy(&after.body)
    );
    let list = beta.get("/v1/payments?limit=10").await;
    assert_eq!(list.status, 200, "{}", String::from_utf8_lossy(&list.body));
    server.kill();
}
