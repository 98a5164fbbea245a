//! The operator console at the HTML level, through the real binary on SQLite and PostgreSQL:
//! every screen renders what a support person needs, and every refusal holds (no session, a
//! missing or wrong CSRF token, another tenant's ids, a wrong key), with nothing changed by a
//! refused request. `console_browser.rs` drives the same pages in Chromium.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::rig::{Psp, Rig};
use common::{payment, Backend, Client, TestDatabase};
use serde_json::json;

const ACME_KEY: &str = "sk_test_acme_0123456789abcdef";
const BETA_KEY: &str = "sk_test_beta_0123456789abcdef";
const OPERATOR_KEY: &str = "op_test_platform_0123456789";

/// A browser without a browser: keeps cookies, follows no redirect by itself.
struct Visitor {
    http: reqwest::Client,
    base: String,
    cookies: HashMap<String, String>,
}

/// One answer of a page.
struct Page {
    status: u16,
    location: Option<String>,
    headers: reqwest::header::HeaderMap,
    html: String,
}

impl Page {
    /// The value of the first `name="field" value="…"` hidden input.
    fn hidden(&self, field: &str) -> String {
        let marker = format!("name=\"{field}\" value=\"");
        let start = self
            .html
            .find(&marker)
            .unwrap_or_else(|| panic!("no field {field} in {}", self.html))
            + marker.len();
        let end = self.html[start..].find('"').unwrap() + start;
        self.html[start..end].to_owned()
    }

    fn assert_contains(&self, text: &str) {
        assert!(
            self.html.contains(text),
            "{text:?} not in page:\n{}",
            self.html
        );
    }
}

impl Visitor {
    fn new(base: &str) -> Self {
        Self {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            base: base.to_owned(),
            cookies: HashMap::new(),
        }
    }

    fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    async fn answer(&mut self, request: reqwest::RequestBuilder) -> Page {
        let response = request
            .header("cookie", self.cookie_header())
            .send()
            .await
            .unwrap();
        for value in response.headers().get_all("set-cookie") {
            let text = value.to_str().unwrap();
            let (pair, _) = text.split_once(';').unwrap_or((text, ""));
            let (name, value) = pair.split_once('=').unwrap();
            if value.is_empty() || text.contains("Max-Age=0") {
                self.cookies.remove(name);
            } else {
                self.cookies.insert(name.to_owned(), value.to_owned());
            }
        }
        Page {
            status: response.status().as_u16(),
            location: response
                .headers()
                .get("location")
                .map(|value| value.to_str().unwrap().to_owned()),
            headers: response.headers().clone(),
            html: response.text().await.unwrap(),
        }
    }

    async fn get(&mut self, path: &str) -> Page {
        let request = self.http.get(format!("{}{path}", self.base));
        self.answer(request).await
    }

    async fn post(&mut self, path: &str, fields: &[(&str, &str)]) -> Page {
        let request = self.http.post(format!("{}{path}", self.base)).form(fields);
        self.answer(request).await
    }

    /// `path` once its page contains `text`: the read models behind lists, search and balances
    /// follow the log, so a page may show a just-made payment a moment later.
    async fn get_when(&mut self, path: &str, text: &str) -> Page {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let page = self.get(path).await;
            if page.html.contains(text)
                || page.location.as_deref().is_some_and(|l| l.contains(text))
            {
                return page;
            }
            assert!(
                Instant::now() < deadline,
                "{text:?} never on {path}:\n{}",
                page.html
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Signs in as `operator` with `key`; answers the page signed in to.
    async fn sign_in(&mut self, operator: &str, key: &str) -> Page {
        let form = self.get("/console/sign-in").await;
        assert_eq!(form.status, 200);
        let csrf = form.hidden("csrf");
        let signed = self
            .post(
                "/console/sign-in",
                &[("csrf", &csrf), ("operator", operator), ("api_key", key)],
            )
            .await;
        assert_eq!(signed.status, 303, "{}", signed.html);
        assert_eq!(signed.location.as_deref(), Some("/console/payments"));
        self.get("/console/payments").await
    }
}

/// A captured payment and one open manual exception (its amount changed at the provider).
async fn seed(rig: &Rig, database: &TestDatabase) -> (String, String, String) {
    let client = rig.client();
    let mut body = rig.payment(10_000, "pm_card_ok");
    body["metadata"] = json!({"order": "A-1001"});
    let paid = client
        .post("/v1/payments", "order-7731", &body)
        .await
        .json();
    let paid_id = paid["id"].as_str().unwrap().to_owned();
    rig.drop_every_webhook().await;
    let other = client
        .post(
            "/v1/payments",
            "order-7732",
            &rig.payment(5_000, "pm_card_ok"),
        )
        .await
        .json();
    let other_id = other["id"].as_str().unwrap().to_owned();
    rig.change_charge_amount(&other_id, 6_000).await;
    rig.reconcile(&database.url).await;
    let open = client.exceptions("open").await;
    let exception = open
        .iter()
        .find(|e| e["resolution"] == "manual")
        .unwrap_or_else(|| panic!("no manual exception: {open:?}"))["id"]
        .as_str()
        .unwrap()
        .to_owned();
    (paid_id, other_id, exception)
}

async fn wait_refunded(client: &Client, id: &str, minor: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = payment(client, id).await;
        if now["refunded_minor"] == minor {
            return;
        }
        assert!(Instant::now() < deadline, "never refunded {minor}: {now}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every screen, as a support person walks through them: sign in, find a payment by its order
/// reference and by its Idempotency-Key, read its story, refund part of it through the confirm
/// step (a double submit refunds once), resolve an exception with a note, read the accounts, a
/// journal entry, health and the audit trail, sign out.
async fn every_screen_answers_a_support_person(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let rig = Rig::start(&database, Psp::Sim, &["--operator-key", OPERATOR_KEY]).await;
    let (paid, _, exception) = seed(&rig, &database).await;
    let client = rig.client();
    let mut ana = Visitor::new(&client.base);

    ana.sign_in("Ana Support", ACME_KEY).await;
    let list = ana.get_when("/console/payments", &paid).await;
    assert_eq!(list.status, 200);
    list.assert_contains("100.00 USD");
    let csp = list.headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("default-src 'none'") && !csp.contains("script-src"),
        "{csp}"
    );
    let filtered = ana.get("/console/payments?status=failed").await;
    assert!(
        !filtered.html.contains(&paid),
        "a captured payment under status=failed"
    );

    for term in ["A-1001", "order-7731", paid.as_str()] {
        let found = ana
            .get_when(&format!("/console/search?q={term}"), &paid)
            .await;
        assert_eq!(found.status, 303, "{term}: {}", found.html);
        assert_eq!(found.location.unwrap(), format!("/console/payments/{paid}"));
    }
    let missing = ana.get("/console/search?q=no-such-thing").await;
    missing.assert_contains("no-match");

    let page = ana.get(&format!("/console/payments/{paid}")).await;
    assert_eq!(page.status, 200);
    for section in [
        "id=\"timeline\"",
        "id=\"entries\"",
        "id=\"operations\"",
        "id=\"webhooks\"",
        "id=\"exceptions\"",
    ] {
        page.assert_contains(section);
    }
    page.assert_contains("PaymentIntended");
    page.assert_contains("ChargeCaptured");
    page.assert_contains("customer:42:available");
    page.assert_contains("order-7731");

    let confirm = ana
        .get(&format!("/console/payments/{paid}/refund?amount=25.00"))
        .await;
    assert_eq!(confirm.status, 200, "{}", confirm.html);
    confirm.assert_contains("25.00 USD");
    let key = confirm.hidden("key");
    let csrf = confirm.hidden("csrf");
    let fields = [
        ("csrf", csrf.as_str()),
        ("key", key.as_str()),
        ("amount_minor", "2500"),
    ];
    let refunded = ana
        .post(&format!("/console/payments/{paid}/refund"), &fields)
        .await;
    assert_eq!(refunded.status, 303, "{}", refunded.html);
    let again = ana
        .post(&format!("/console/payments/{paid}/refund"), &fields)
        .await;
    assert_eq!(again.status, 303, "a double submit replays: {}", again.html);
    wait_refunded(&client, &paid, 2_500).await;
    let after = ana.get(refunded.location.as_deref().unwrap()).await;
    after.assert_contains("id=\"notice\"");
    after.assert_contains("refund #1");
    assert_eq!(
        payment(&client, &paid).await["operations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|op| op["kind"] == "refund")
            .count(),
        1,
        "two submits of one confirm page made one refund"
    );
    let too_much = ana
        .get(&format!("/console/payments/{paid}/refund?amount=25.005"))
        .await;
    assert_eq!(too_much.status, 400, "{}", too_much.html);

    let exceptions = ana.get("/console/exceptions").await;
    exceptions.assert_contains(&exception);
    let shown = ana.get(&format!("/console/exceptions/{exception}")).await;
    shown.assert_contains("amount_mismatch".replace('_', " ").as_str());
    shown.assert_contains("Our side");
    let csrf = shown.hidden("csrf");
    let empty_note = ana
        .post(
            &format!("/console/exceptions/{exception}/resolve"),
            &[("csrf", &csrf), ("note", "  ")],
        )
        .await;
    assert_eq!(empty_note.status, 400);
    let resolved = ana
        .post(
            &format!("/console/exceptions/{exception}/resolve"),
            &[
                ("csrf", &csrf),
                ("note", "Amount confirmed with the provider"),
            ],
        )
        .await;
    assert_eq!(resolved.status, 303, "{}", resolved.html);
    let listed = client
        .get("/v1/reconciliation/exceptions?status=resolved")
        .await
        .json();
    assert!(
        listed
            .to_string()
            .contains("Amount confirmed with the provider (by Ana Support)"),
        "{listed}"
    );

    let accounts = ana
        .get_when("/console/accounts", "customer:42:available")
        .await;
    accounts.assert_contains("as-of");
    let legs = ana
        .get_when(
            "/console/accounts/customer%3A42%3Aavailable?currency=USD",
            "Balance after",
        )
        .await;
    assert_eq!(legs.status, 200, "{}", legs.html);
    legs.assert_contains("Balance after");
    legs.assert_contains("Opening balance");
    // The statement's CSV, the same the API streams; a period of days.
    let csv = ana
        .get("/console/accounts/customer%3A42%3Aavailable/statement.csv?currency=USD&from=2000-01-01&to=2999-12-31")
        .await;
    assert_eq!(csv.status, 200, "{}", csv.html);
    assert!(
        csv.html
            .starts_with("kind,account,currency,entry_id,position,recorded_at,amount_minor,balance_minor,source,description\r\nopening,customer:42:available,USD,"),
        "{}",
        csv.html
    );
    assert!(csv.html.contains("\r\nclosing,"), "{}", csv.html);
    let period = ana
        .get("/console/accounts/customer%3A42%3Aavailable?currency=USD&from=2999-01-01&to=2999-01-31")
        .await;
    period.assert_contains("No legs on this account in this currency and period.");
    let bad = ana
        .get("/console/accounts/customer%3A42%3Aavailable?currency=USD&from=yesterday")
        .await;
    assert_eq!(bad.status, 400, "{}", bad.html);
    let entry = client.entries_of(&paid).await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let journal = ana
        .get_when(&format!("/console/journal/{entry}"), "balanced")
        .await;
    journal.assert_contains("balanced");

    let health = ana.get("/console/health").await;
    assert_eq!(health.status, 200, "{}", health.html);
    health.assert_contains("Projections");
    health.assert_contains("payments");
    health.assert_contains("keys-in-flight");

    let audit = ana.get("/console/audit").await;
    for text in [
        "Ana Support",
        "refund 25.00 USD",
        "resolve: Amount confirmed",
        "sign in",
    ] {
        audit.assert_contains(text);
    }

    let csrf = audit.hidden("csrf");
    let out = ana.post("/console/sign-out", &[("csrf", &csrf)]).await;
    assert_eq!(out.location.as_deref(), Some("/console/sign-in"));
    let gone = ana.get("/console/payments").await;
    assert_eq!(gone.location.as_deref(), Some("/console/sign-in"));
}

#[tokio::test]
async fn every_screen_answers_a_support_person_sqlite() {
    every_screen_answers_a_support_person(Backend::Sqlite).await;
}

#[tokio::test]
async fn every_screen_answers_a_support_person_postgres() {
    every_screen_answers_a_support_person(Backend::Postgres).await;
}

/// What is refused: pages without a session, forms without the session's CSRF token (nothing
/// changes), another tenant's payment, exception and journal entry (404, as for no such id), a
/// wrong key, a sign-in without its form token; and the platform operator sees the platform's
/// exceptions but no tenant's payments.
async fn refusals_change_nothing(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let rig = Rig::start(&database, Psp::Sim, &["--operator-key", OPERATOR_KEY]).await;
    let (paid, _, exception) = seed(&rig, &database).await;
    let client = rig.client();
    let entry = client.entries_of(&paid).await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let mut stranger = Visitor::new(&client.base);
    for path in [
        "/console/payments".to_owned(),
        format!("/console/payments/{paid}"),
        "/console/exceptions".to_owned(),
        "/console/accounts".to_owned(),
        "/console/health".to_owned(),
        "/console/audit".to_owned(),
        "/console/search?q=order-7731".to_owned(),
    ] {
        let page = stranger.get(&path).await;
        assert_eq!(
            (page.status, page.location.as_deref()),
            (303, Some("/console/sign-in")),
            "{path}"
        );
    }
    let refused = stranger
        .post(
            &format!("/console/payments/{paid}/refund"),
            &[("key", "k"), ("amount_minor", "100")],
        )
        .await;
    assert_eq!(refused.status, 303);

    stranger.get("/console/sign-in").await;
    let no_token = stranger
        .post(
            "/console/sign-in",
            &[("operator", "Eve"), ("api_key", ACME_KEY)],
        )
        .await;
    assert_eq!(no_token.status, 403);
    // The refusal shows the form again, with a fresh token.
    let csrf = no_token.hidden("csrf");
    let wrong = stranger
        .post(
            "/console/sign-in",
            &[
                ("csrf", &csrf),
                ("operator", "Eve"),
                ("api_key", "sk_wrong_0000000000000000"),
            ],
        )
        .await;
    assert_eq!(wrong.status, 401);
    assert!(!stranger.cookies.contains_key("asiento_console"));

    let mut bea = Visitor::new(&client.base);
    bea.sign_in("Bea", BETA_KEY).await;
    let session_cookie = bea.cookies["asiento_console"].clone();
    assert!(
        !bea.cookie_header().contains(BETA_KEY),
        "the key is never a cookie"
    );
    for path in [
        format!("/console/payments/{paid}"),
        format!("/console/payments/{paid}/refund?amount=1.00"),
        format!("/console/exceptions/{exception}"),
        format!("/console/journal/{entry}"),
        "/console/payments/pay_not_an_id".to_owned(),
    ] {
        let page = bea.get(&path).await;
        assert_eq!(page.status, 404, "{path}: {}", page.html);
    }
    // Once acme finds its payment, beta's search has the same index to miss it in.
    let mut acme = Visitor::new(&client.base);
    acme.sign_in("Ana", ACME_KEY).await;
    acme.get_when("/console/search?q=order-7731", &paid).await;
    let missing = bea.get("/console/search?q=order-7731").await;
    missing.assert_contains("no-match");
    let listed = bea.get("/console/payments").await;
    assert!(!listed.html.contains(&paid));
    let csrf = listed.hidden("csrf");
    let theirs = bea
        .post(
            &format!("/console/exceptions/{exception}/resolve"),
            &[("csrf", &csrf), ("note", "not mine")],
        )
        .await;
    assert_eq!(theirs.status, 404);
    assert!(session_cookie.len() >= 64);

    let mut ana = Visitor::new(&client.base);
    let page = ana.sign_in("Ana", ACME_KEY).await;
    let csrf = page.hidden("csrf");
    let confirm = ana
        .get(&format!("/console/payments/{paid}/refund?amount=10.00"))
        .await;
    let key = confirm.hidden("key");
    for bad in ["", "not-the-token", csrf.get(1..).unwrap()] {
        let forged = ana
            .post(
                &format!("/console/payments/{paid}/refund"),
                &[("csrf", bad), ("key", &key), ("amount_minor", "1000")],
            )
            .await;
        assert_eq!(forged.status, 403, "csrf {bad:?}");
        let forged = ana
            .post(
                &format!("/console/exceptions/{exception}/resolve"),
                &[("csrf", bad), ("note", "forged")],
            )
            .await;
        assert_eq!(forged.status, 403);
    }
    let out = ana.post("/console/sign-out", &[("csrf", "wrong")]).await;
    assert_eq!(out.status, 403, "sign-out needs the token too");
    assert_eq!(payment(&client, &paid).await["refunded_minor"], 0);
    let open = client
        .get("/v1/reconciliation/exceptions?status=open")
        .await
        .json();
    assert!(open.to_string().contains(&exception), "still open: {open}");
    let audit = ana.get("/console/audit").await;
    assert!(
        !audit.html.contains("forged"),
        "a refused form is no action"
    );

    let mut operator = Visitor::new(&client.base);
    operator.sign_in("Olga On-call", OPERATOR_KEY).await;
    let payments = operator.get("/console/payments").await;
    assert_eq!(
        payments.status, 403,
        "the platform has no payments of its own"
    );
    let exceptions = operator.get("/console/exceptions").await;
    assert_eq!(exceptions.status, 200);
    assert!(
        !exceptions.html.contains(&exception),
        "a tenant's exception is not the platform's"
    );
    let health = operator.get("/console/health").await;
    assert_eq!(health.status, 200);
}

#[tokio::test]
async fn refusals_change_nothing_sqlite() {
    refusals_change_nothing(Backend::Sqlite).await;
}

#[tokio::test]
async fn refusals_change_nothing_postgres() {
    refusals_change_nothing(Backend::Postgres).await;
}

/// `serve` says where the console is, beside the API key it prints.
#[tokio::test]
async fn serve_prints_the_console_url() {
    let database = TestDatabase::new(Backend::Sqlite).await;
    let mut process = common::Process::spawn(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &database.url,
        ],
        &[],
    );
    let line = process.wait_for_line("console: ");
    assert!(line.contains("/console"), "{line}");
    let key_line = process
        .seen
        .iter()
        .find(|line| line.contains("API key (shown once)"))
        .cloned()
        .unwrap_or_default();
    assert!(!key_line.is_empty(), "printed: {:?}", process.seen);
}
