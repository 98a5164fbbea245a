//! The operator console in a real browser (headless Chromium through chromedriver), driven
//! against the real binary as a support person uses it: sign in with the tenant's key, find a
//! payment by its order's Idempotency-Key, refund part of it, resolve a manual reconciliation
//! exception with a note, read the audit trail, look at accounts and health, sign out. What the
//! pages say they did is checked again through the JSON API. Every screen is saved as a PNG in
//! `target/console-screenshots/` of the workspace, for a person to look at.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::rig::{Psp, Rig};
use common::webdriver::{Browser, WAIT_TIMEOUT};
use common::{payment_body, Backend, TestDatabase};
use serde_json::{json, Value};

const OPERATOR: &str = "Ana Support";
const ORDER_KEY: &str = "order-7731";
const NOTE: &str = "Refunded by hand; provider confirmed by phone";
/// How long the API may take to show what the console did.
const API_TIMEOUT: Duration = Duration::from_secs(20);
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Where the screens are saved: `target/console-screenshots/` of the workspace (not
/// `CARGO_TARGET_DIR`, which may be anywhere) for the walk on SQLite, and
/// `target/console-screenshots-postgres/` for the one on PostgreSQL, each emptied first so that
/// every PNG is of this run.
struct Screens {
    folder: PathBuf,
}

impl Screens {
    fn new(backend: Backend) -> Self {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .nth(2)
            .expect("the workspace root");
        let name = match backend {
            Backend::Sqlite => "console-screenshots",
            Backend::Postgres => "console-screenshots-postgres",
        };
        let folder = workspace.join("target").join(name);
        let _ = std::fs::remove_dir_all(&folder);
        std::fs::create_dir_all(&folder)
            .unwrap_or_else(|error| panic!("create {}: {error}", folder.display()));
        Self { folder }
    }

    async fn save(&self, browser: &Browser, name: &str) {
        browser
            .screenshot(&self.folder.join(format!("{name}.png")))
            .await;
    }

    /// A screen behind sign-in: the search box is on every one of them.
    async fn save_signed_in(&self, browser: &Browser, name: &str) {
        browser.find("#q").await;
        self.save(browser, name).await;
    }
}

/// Polls `read` until `done` holds of what it answers (at most [`API_TIMEOUT`]).
async fn api_until<F, Fut>(what: &str, read: F, done: impl Fn(&Value) -> bool) -> Value
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Value>,
{
    let deadline = Instant::now() + API_TIMEOUT;
    loop {
        let current = read().await;
        if done(&current) {
            return current;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the API answers {current}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Waits until the browser's page text satisfies `done` (a form's answer rendered).
async fn page_until(browser: &Browser, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT_TIMEOUT;
    loop {
        let text = browser.body_text().await;
        if done(&text) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the page at {} says\n{text}",
            browser.current_url().await
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// A support person's walk through the console: a customer's order `order-7731` (100.00 USD,
/// captured) is refunded 25.00 from its page, a lost order's authorization is canceled from its
/// page, the open manual exception is resolved with a note, and the audit trail names who did
/// each.
async fn support_person_refunds_and_resolves_in_the_console(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let rig = Rig::start(&database, Psp::Sim, &[]).await;
    let client = rig.client();
    let base = rig.server.base.clone();

    // The order's payment, captured at once.
    let created = client
        .post(
            "/v1/payments",
            ORDER_KEY,
            &json!({
                "amount_minor": 10_000,
                "currency": "USD",
                "customer": "42",
                "payment_method": "pm_card_ok",
                "capture": "automatic",
                "description": "order 7731",
            }),
        )
        .await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let payment = created.json();
    assert_eq!(payment["status"], "captured", "{payment}");
    let payment_id = payment["id"].as_str().unwrap().to_owned();

    // A lost order's payment, authorized only: its hold is released from the console.
    let mut held = payment_body(6_000, "pm_card_ok");
    held["capture"] = json!("manual");
    let held = client
        .post("/v1/payments", "order-7740", &held)
        .await
        .json();
    assert_eq!(held["status"], "authorized", "{held}");
    let held_id = held["id"].as_str().unwrap().to_owned();

    // One open manual exception for this tenant, the way reconcile.rs makes one: another
    // payment whose amount the provider then changes, found by a sweep. Webhooks are dropped
    // meanwhile, so that the sweep, not a late webhook, is what finds the mismatch.
    rig.drop_every_webhook().await;
    let other = client
        .post(
            "/v1/payments",
            "order-6100",
            &payment_body(4_000, "pm_card_ok"),
        )
        .await
        .json();
    let other_id = other["id"].as_str().unwrap().to_owned();
    rig.change_charge_amount(&other_id, 4_500).await;
    rig.reconcile(&database.url).await;
    let open = client.exceptions("open").await;
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0]["resolution"], "manual", "{open:?}");
    let exception_id = open[0]["id"].as_str().unwrap().to_owned();
    assert!(exception_id.starts_with("exc_"), "{exception_id}");
    let faults = client
        .send(client.http.delete(format!("{base}/sim/faults")))
        .await;
    assert_eq!(
        faults.status,
        200,
        "{}",
        String::from_utf8_lossy(&faults.body)
    );
    // The list the console shows reads the payments projection: wait until it holds the order.
    api_until(
        "the payment list holds the order",
        || async { client.get("/v1/payments?limit=50").await.json() },
        |list| {
            list["data"]
                .as_array()
                .is_some_and(|data| data.iter().any(|p| p["id"] == payment_id.as_str()))
        },
    )
    .await;

    let screens = Screens::new(backend);
    let browser = Browser::start().await;

    // Sign in: the console's home sends a stranger to the sign-in form.
    browser.goto(&format!("{base}/console")).await;
    browser
        .wait_for_path("the sign-in page", |path| path == "/console/sign-in")
        .await;
    screens.save(&browser, "sign-in").await;
    browser.type_into("#api_key", &client.key).await;
    browser.type_into("#operator", OPERATOR).await;
    browser.click("#sign-in-submit").await;
    browser
        .wait_for_path("the payments list", |path| path == "/console/payments")
        .await;
    assert!(
        browser.page_source().await.contains(&payment_id),
        "the payments list shows {payment_id}:\n{}",
        browser.body_text().await
    );
    screens.save_signed_in(&browser, "payments").await;
    // The browser holds a session, never the key itself, and no script can read it.
    let cookies = browser.get_cookies().await;
    assert!(!cookies.is_empty(), "signed in without a cookie");
    for cookie in &cookies {
        assert_eq!(cookie["httpOnly"], true, "{cookie}");
        assert!(
            !cookie["value"]
                .as_str()
                .unwrap_or_default()
                .contains(&client.key),
            "the API key is in a cookie: {cookie}"
        );
    }

    // Search by the order's Idempotency-Key: one match goes straight to the payment's page.
    let payment_path = format!("/console/payments/{payment_id}");
    browser.clear("#q").await;
    browser.type_into("#q", ORDER_KEY).await;
    browser.click("#search-submit").await;
    browser
        .wait_for_path("the payment's page", |path| path == payment_path)
        .await;
    for section in [
        "#timeline",
        "#entries",
        "#operations",
        "#webhooks",
        "#exceptions",
    ] {
        browser.find(section).await;
    }
    screens.save_signed_in(&browser, "payment").await;

    // Refund 25.00: a confirmation first, then the refund, told on the payment's page.
    browser.clear("#refund-amount").await;
    browser.type_into("#refund-amount", "25.00").await;
    browser.click("#refund-submit").await;
    browser
        .wait_for_path("the refund's confirmation", |path| {
            path.ends_with("/refund")
        })
        .await;
    let confirm = browser.body_text().await;
    assert!(
        confirm.contains("25.00") && confirm.contains("USD"),
        "the confirmation names the amount:\n{confirm}"
    );
    screens.save_signed_in(&browser, "refund-confirm").await;
    browser.click("#confirm-submit").await;
    browser
        .wait_for_path("the payment's page after the refund", |path| {
            path == payment_path
        })
        .await;
    let notice = browser.text("#notice").await.to_lowercase();
    assert!(
        notice.contains("refund") && notice.contains("accepted"),
        "the notice: {notice}"
    );
    let operations = browser.text("#operations").await;
    assert!(
        operations.to_lowercase().contains("refund") && operations.contains("25.00"),
        "the operations list the refund:\n{operations}"
    );
    screens.save_signed_in(&browser, "payment-refunded").await;
    api_until(
        "the refund reaches the payment",
        || common::payment(&client, &payment_id),
        |payment| payment["refunded_minor"] == 2_500,
    )
    .await;

    // The lost order's authorization, canceled: a confirmation that names the hold, then the
    // cancel, told on the payment's page.
    let held_path = format!("/console/payments/{held_id}");
    browser.goto(&format!("{base}{held_path}")).await;
    browser
        .wait_for_path("the authorized payment's page", |path| path == held_path)
        .await;
    browser.click("#cancel-submit").await;
    browser
        .wait_for_path("the cancel's confirmation", |path| {
            path.ends_with("/cancel")
        })
        .await;
    let confirm = browser.body_text().await;
    assert!(
        confirm.contains("60.00") && confirm.to_lowercase().contains("cancel"),
        "the confirmation names the hold:\n{confirm}"
    );
    browser.click("#confirm-submit").await;
    browser
        .wait_for_path("the payment's page after the cancel", |path| {
            path == held_path
        })
        .await;
    let notice = browser.text("#notice").await.to_lowercase();
    assert!(
        notice.contains("cancel") && notice.contains("accepted"),
        "the notice: {notice}"
    );
    api_until(
        "the cancel reaches the payment",
        || common::payment(&client, &held_id),
        |payment| payment["status"] == "canceled",
    )
    .await;
    browser.goto(&format!("{base}{held_path}")).await;
    page_until(&browser, "the page shows the payment canceled", |text| {
        text.contains("canceled")
    })
    .await;
    assert!(
        browser.find_all("#cancel-submit").await.is_empty(),
        "a canceled payment offers no cancel"
    );
    screens.save_signed_in(&browser, "payment-canceled").await;

    // The open manual exception, resolved with a note.
    browser.click("#nav-exceptions").await;
    browser
        .wait_for_path("the exceptions", |path| path == "/console/exceptions")
        .await;
    let exception_path = format!("/console/exceptions/{exception_id}");
    let link = browser.property("#open-manual a", "href").await;
    assert!(
        link.as_str()
            .is_some_and(|href| href.ends_with(&exception_path)),
        "the first open manual exception links to {exception_path}: {link}"
    );
    screens.save_signed_in(&browser, "exceptions").await;
    browser.click("#open-manual a").await;
    browser
        .wait_for_path("the exception's page", |path| path == exception_path)
        .await;
    screens.save_signed_in(&browser, "exception").await;
    browser.type_into("#note", NOTE).await;
    browser.click("#resolve-submit").await;
    page_until(&browser, "the exception resolved", |text| {
        text.contains(NOTE) && text.to_lowercase().contains("resolved")
    })
    .await;
    screens.save_signed_in(&browser, "exception-resolved").await;
    let resolved = api_until(
        "the exception resolved with the note",
        || async { json!(client.exceptions("resolved").await) },
        |resolved| {
            resolved
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["id"] == exception_id.as_str())
        },
    )
    .await;
    let resolved = resolved
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == exception_id.as_str())
        .unwrap()
        .clone();
    assert_eq!(resolved["status"], "resolved", "{resolved}");
    // The note as typed; the console may add who resolved it after it.
    assert!(
        resolved["note"]
            .as_str()
            .is_some_and(|note| note.starts_with(NOTE)),
        "{resolved}"
    );
    assert!(client.exceptions("open").await.is_empty());

    // The audit trail names the person and both actions.
    browser.click("#nav-audit").await;
    browser
        .wait_for_path("the audit trail", |path| path == "/console/audit")
        .await;
    // One line of the page per action (a table row), naming who took it.
    let audit = browser.body_text().await;
    let by_operator = |action: &str| {
        audit
            .lines()
            .any(|line| line.contains(OPERATOR) && line.to_lowercase().contains(action))
    };
    assert!(
        by_operator("refund") && by_operator("cancel") && by_operator("resolve"),
        "the audit names {OPERATOR} with the refund, the cancel and the resolution:\n{audit}"
    );
    screens.save_signed_in(&browser, "audit").await;

    // Accounts (and the first account's entries, when the list links them), health.
    browser.goto(&format!("{base}/console/accounts")).await;
    browser
        .wait_for_path("the accounts", |path| path == "/console/accounts")
        .await;
    screens.save_signed_in(&browser, "accounts").await;
    if !browser.find_all("#accounts a").await.is_empty() {
        browser.click("#accounts a").await;
        browser
            .wait_for_path("an account's entries", |path| {
                path.starts_with("/console/accounts/")
            })
            .await;
        screens.save_signed_in(&browser, "account").await;
    }
    browser.goto(&format!("{base}/console/health")).await;
    browser
        .wait_for_path("the health page", |path| path == "/console/health")
        .await;
    screens.save_signed_in(&browser, "health").await;

    // Signed out, the console is closed again.
    // A click may return before the form's navigation starts, and a goto then would cancel
    // it: the sign-out's own redirect to the sign-in page is what says the session is gone.
    browser.click("#sign-out-submit").await;
    browser
        .wait_for_path("the sign-in page the sign-out redirects to", |path| {
            path == "/console/sign-in"
        })
        .await;
    browser.goto(&format!("{base}/console/payments")).await;
    browser
        .wait_for_path("the sign-in page after signing out", |path| {
            path == "/console/sign-in"
        })
        .await;
    screens.save(&browser, "signed-out").await;

    println!("console screenshots: {}", screens.folder.display());
}

asiento_testkit::both_backends!(threads = 2; support_person_refunds_and_resolves_in_the_console);
