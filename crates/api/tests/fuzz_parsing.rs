//! Fuzzing the HTTP edge: body parsing, every field accessor, and the whole router in process.
//!
//! Nothing a client sends may panic or reach a 5xx; every refusal is problem+json with the status
//! it claims and a non-empty `code`. Inputs come from a seeded generator (this crate's `rand`;
//! `proptest` is not among its dev-dependencies), so a failure names its seed and input and
//! replays exactly: `ASIENTO_FUZZ_SEED=<seed> ASIENTO_FUZZ_CASES=1 cargo test -p asiento-api
//! --test fuzz_parsing`. A longer hunt: `ASIENTO_FUZZ_CASES=20000`.
//!
//! The router runs on a real SQLite database (migrated, projections installed as `serve` installs
//! them, one API key) with no payment provider configured: a create-payment body that passes
//! every check would end at "provider not configured", so generated create bodies always name a
//! provider and stop at `unknown_provider`. The provider hop and the live projector are what
//! `scripts/schemathesis` covers against the real binary. `min_position` is not generated: with no
//! projector running, any position waits 5 s and answers 503 by design.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use asiento_api::body::{parse_object, Fields, JSON_DEPTH_MAX};
use asiento_api::problem::{Problem, PROBLEM_CONTENT_TYPE};
use asiento_api::{AppState, REQUEST_BODY_BYTES_MAX};
use asiento_app::clock::SystemClock;
use asiento_app::ledger::LedgerFlow;
use asiento_app::payments::PaymentFlow;
use asiento_app::providers::Providers;
use asiento_app::webhooks::{WebhookReceiver, WebhookSecrets};
use asiento_domain::{AccountName, AmountLimit, Currency, AMOUNT_MAX_DEFAULT};
use asiento_eventstore::Database;
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};
use tower::ServiceExt as _;

const API_KEY: &str = "sk_test_fuzz_0123456789abcdef";
const WEBHOOK_SECRET: &str = "whsec_fuzz";

/// Cases per property by default: each body property runs in well under a second and the router
/// property in a few seconds, in a debug build on 2 cores.
const BODY_CASES: u64 = 3_000;
const ROUTER_CASES: u64 = 300;

fn cases(default: u64) -> std::ops::Range<u64> {
    let base = std::env::var("ASIENTO_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let count = std::env::var("ASIENTO_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    base..base + count
}

// ---------------------------------------------------------------------------------------------
// The generator

struct Gen(StdRng);

impl Gen {
    fn new(seed: u64) -> Self {
        Gen(StdRng::seed_from_u64(seed))
    }

    fn below(&mut self, n: usize) -> usize {
        self.0.random_range(0..n)
    }

    fn chance(&mut self, p: f64) -> bool {
        self.0.random_bool(p)
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }

    fn char(&mut self) -> char {
        match self.below(6) {
            0 => self.0.random_range(' '..='~'),
            1 => self.0.random_range('\0'..='\u{1f}'),
            2 => self.pick(&['"', '\\', '/', '\u{7f}', '\u{a0}', '\u{feff}', '\u{200f}']),
            3 => self.pick(&['é', 'ñ', '\u{301}', '\u{fffd}', '💸', '\u{10ffff}', 'Ⱥ']),
            4 => self.0.random_range('a'..='z'),
            _ => self.0.random::<char>(),
        }
    }

    fn text(&mut self, length_max: usize) -> String {
        let length = self.below(length_max + 1);
        (0..length).map(|_| self.char()).collect()
    }

    fn number(&mut self) -> Value {
        match self.below(9) {
            0 => Value::from(self.0.random_range(-5i64..5)),
            1 => Value::from(self.0.random::<i64>()),
            2 => Value::from(self.0.random::<u64>()),
            3 => Value::from(i64::MAX),
            4 => Value::from(u64::MAX),
            5 => Value::from(i64::MIN),
            6 => Value::from(self.0.random_range(1i64..1_000_000)),
            7 => Value::Number(Number::from_f64(self.0.random_range(-1e6..1e6)).unwrap()),
            _ => {
                Number::from_f64(f64::from_bits(self.0.random())).map_or(Value::Null, Value::Number)
            }
        }
    }

    fn scalar(&mut self) -> Value {
        match self.below(4) {
            0 => Value::Null,
            1 => Value::Bool(self.chance(0.5)),
            2 => self.number(),
            _ => Value::String(self.text(12)),
        }
    }

    fn value(&mut self, depth: usize) -> Value {
        if depth == 0 || self.chance(0.5) {
            return self.scalar();
        }
        let width = self.below(5);
        if self.chance(0.5) {
            Value::Array((0..width).map(|_| self.value(depth - 1)).collect())
        } else {
            Value::Object(self.object(width, depth - 1, &[]))
        }
    }

    /// An object whose keys are drawn from `names` (the fields a route knows) and odd text.
    fn object(&mut self, width: usize, depth: usize, names: &[&str]) -> Map<String, Value> {
        let mut map = Map::new();
        for _ in 0..width {
            let key = if !names.is_empty() && self.chance(0.8) {
                self.pick(names).to_owned()
            } else {
                self.text(8)
            };
            let value = self.value(depth);
            map.insert(key, value);
        }
        map
    }

    /// Nesting of `depth` arrays and objects around a scalar, as text.
    fn nested(&mut self, depth: usize) -> String {
        let mut open = String::from("{\"a\":");
        let mut close = String::from("}");
        for _ in 0..depth {
            if self.chance(0.5) {
                open.push('[');
                close.insert(0, ']');
            } else {
                open.push_str("{\"k\":");
                close.insert(0, '}');
            }
        }
        format!("{open}1{close}")
    }

    /// Bytes from garbage through token soup to real JSON, cut short or not.
    fn body_bytes(&mut self) -> Vec<u8> {
        match self.below(6) {
            0 => (0..self.below(64)).map(|_| self.0.random()).collect(),
            1 => {
                let tokens = [
                    "{",
                    "}",
                    "[",
                    "]",
                    ":",
                    ",",
                    "\"",
                    "\"a\"",
                    "1",
                    "-",
                    "1e999",
                    "-0",
                    "0.5e-9",
                    "null",
                    "true",
                    "\"\\ud800\"",
                    "\"\\u0000\"",
                    " ",
                    "\n",
                    "\u{feff}",
                    "\\",
                    "9223372036854775808",
                    "\"amount_minor\"",
                ];
                let count = self.below(24);
                (0..count)
                    .map(|_| self.pick(&tokens))
                    .collect::<String>()
                    .into_bytes()
            }
            2 => {
                let depth = self.below(200);
                self.nested(depth).into_bytes()
            }
            3 => {
                let mut bytes = serde_json::to_vec(&self.value(4)).unwrap();
                let keep = self.below(bytes.len() + 1);
                bytes.truncate(keep);
                bytes
            }
            4 => " \t\r\n".repeat(self.below(3)).into_bytes(),
            _ => {
                let width = self.below(6);
                serde_json::to_vec(&Value::Object(self.object(width, 3, FIELD_NAMES))).unwrap()
            }
        }
    }
}

/// Every field name a route reads.
const FIELD_NAMES: &[&str] = &[
    "amount_minor",
    "currency",
    "customer",
    "provider",
    "payment_method",
    "capture",
    "description",
    "metadata",
    "from",
    "to",
    "note",
];

fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn check_problem(problem: &Problem, codes: &[&str], input: &dyn std::fmt::Debug) {
    // A well-formed amount the deployment refuses is a 422; every other field error a 400.
    let status = if problem.code == "amount_too_large" {
        422
    } else {
        400
    };
    assert_eq!(problem.status, status, "{problem:?} for {input:?}");
    assert!(
        codes.contains(&problem.code),
        "unexpected code {:?} for {input:?} (expected one of {codes:?})",
        problem.code
    );
    assert!(!problem.detail.is_empty() && !problem.title.is_empty());
    assert!(problem.type_uri.ends_with(problem.code));
}

// ---------------------------------------------------------------------------------------------
// Bodies and fields

#[test]
fn parse_object_never_panics_and_refuses_with_a_code() {
    for seed in cases(BODY_CASES) {
        let mut gen = Gen::new(seed);
        let bytes = gen.body_bytes();
        let input = format!("seed {seed}: {:?}", String::from_utf8_lossy(&bytes));
        match parse_object(&bytes) {
            Ok(map) => {
                if bytes.iter().all(u8::is_ascii_whitespace) {
                    assert!(map.is_empty(), "{input}");
                } else {
                    let value: Value = serde_json::from_slice(&bytes).unwrap();
                    assert_eq!(value, Value::Object(map), "{input}");
                    assert!(depth(&value) <= JSON_DEPTH_MAX, "{input}");
                }
            }
            Err(problem) => {
                check_problem(&problem, &["malformed_json", "invalid_body"], &input);
                // Valid JSON is refused only for its shape: not an object, or too deep.
                if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                    assert!(
                        !value.is_object() || depth(&value) > JSON_DEPTH_MAX,
                        "{input} refused: {problem:?}"
                    );
                    assert_eq!(problem.code, "invalid_body", "{input}");
                }
            }
        }
    }
}

#[test]
fn field_accessors_never_panic_and_agree_with_the_value() {
    for seed in cases(BODY_CASES) {
        let mut gen = Gen::new(seed);
        let width = gen.below(6);
        let map = gen.object(width, 2, FIELD_NAMES);
        let fields = Fields(&map);
        let input = format!("seed {seed}: {}", Value::Object(map.clone()));
        let mut names: Vec<String> = FIELD_NAMES.iter().map(|n| (*n).to_owned()).collect();
        names.push(gen.text(6));

        for name in &names {
            let value = map.get(name).filter(|v| !v.is_null());
            let exact = value.and_then(Value::as_i64);

            match fields.optional_positive_amount(name, AmountLimit::DEFAULT) {
                Ok(Some(amount)) => assert_eq!(Some(amount.minor()), exact, "{input}"),
                Ok(None) => assert!(value.is_none(), "{input}"),
                Err(problem) => {
                    check_problem(
                        &problem,
                        &[
                            "amount_must_be_integer",
                            "amount_too_large",
                            "amount_must_be_positive",
                        ],
                        &input,
                    );
                    assert!(
                        exact.is_none_or(|minor| minor <= 0 || minor > AMOUNT_MAX_DEFAULT),
                        "{input}"
                    );
                }
            }
            match fields.positive_amount(name, AmountLimit::DEFAULT) {
                Ok(amount) => assert_eq!(Some(amount.minor()), exact, "{input}"),
                Err(problem) if value.is_none() => {
                    check_problem(&problem, &["missing_field"], &input)
                }
                Err(problem) => check_problem(
                    &problem,
                    &[
                        "amount_must_be_integer",
                        "amount_too_large",
                        "amount_must_be_positive",
                    ],
                    &input,
                ),
            }
            match fields.string(name) {
                Ok(text) => assert_eq!(value, Some(&Value::String(text.to_owned())), "{input}"),
                Err(problem) => {
                    check_problem(&problem, &["missing_field", "invalid_field"], &input);
                    assert!(!value.is_some_and(Value::is_string), "{input}");
                }
            }
            match fields.currency(name) {
                Ok(currency) => {
                    let raw = value.and_then(Value::as_str).unwrap();
                    assert_eq!(Currency::parse(raw), Ok(currency), "{input}");
                }
                Err(problem) => check_problem(
                    &problem,
                    &["missing_field", "invalid_field", "unknown_currency"],
                    &input,
                ),
            }
            match fields.account(name) {
                Ok(account) => {
                    let raw = value.and_then(Value::as_str).unwrap();
                    assert_eq!(AccountName::parse(raw).as_ref(), Ok(&account), "{input}");
                }
                Err(problem) => check_problem(
                    &problem,
                    &["missing_field", "invalid_field", "invalid_account"],
                    &input,
                ),
            }
            let length_max = gen.below(8);
            match fields.optional_text(name, length_max) {
                Ok(Some(text)) => {
                    assert!(text.chars().count() <= length_max, "{input}");
                    assert_eq!(value, Some(&Value::String(text)), "{input}");
                }
                Ok(None) => assert!(value.is_none(), "{input}"),
                Err(problem) => check_problem(&problem, &["invalid_field"], &input),
            }
            match fields.optional_object(name) {
                Ok(Some(object)) => assert_eq!(value, Some(&Value::Object(object)), "{input}"),
                Ok(None) => assert!(value.is_none(), "{input}"),
                Err(problem) => {
                    check_problem(&problem, &["invalid_field"], &input);
                    assert!(!value.is_some_and(Value::is_object), "{input}");
                }
            }
        }

        let known: Vec<&str> = FIELD_NAMES[..gen.below(FIELD_NAMES.len() + 1)].to_vec();
        match fields.only(&known) {
            Ok(()) => assert!(map.keys().all(|k| known.contains(&k.as_str())), "{input}"),
            Err(problem) => {
                check_problem(&problem, &["unknown_field"], &input);
                assert!(map.keys().any(|k| !known.contains(&k.as_str())), "{input}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The router

/// HMAC-SHA256 (RFC 2104) over `"{t}.{body}"`, as the provider signs webhooks.
fn sign(secret: &str, t: i64, body: &[u8]) -> String {
    const BLOCK: usize = 64;
    let mut key = secret.as_bytes().to_vec();
    key.resize(BLOCK, 0);
    let pad = |byte: u8| key.iter().map(|k| k ^ byte).collect::<Vec<u8>>();
    let mut inner = Sha256::new();
    inner.update(pad(0x36));
    inner.update(format!("{t}.").as_bytes());
    inner.update(body);
    let mut outer = Sha256::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize());
    format!("t={t},v1={}", hex::encode(outer.finalize()))
}

/// The application as `serve` builds it, minus providers and the projector.
async fn app() -> (tempdir::Guard, Router) {
    let dir = tempdir::Guard::new();
    let url = format!("sqlite://{}", dir.0.join("fuzz.db").display());
    let database = Database::connect(&url).await.unwrap();
    database.migrate().await.unwrap();
    // As `serve` installs them: every read model the router reads from.
    asiento_balances::install(&database).await.unwrap();
    asiento_payments_view::install(&database).await.unwrap();
    asiento_merchant_events::install(&database).await.unwrap();
    asiento_app::api_keys::register(&database, "acme", API_KEY, 0)
        .await
        .unwrap();
    let clock = Arc::new(SystemClock);
    let render = Arc::new(asiento_api::render::JsonRender);
    let store = database.event_store();
    let writer = asiento_app::commit::Writer::new(store.clone());
    let state = AppState {
        database: database.clone(),
        reads: Arc::new(asiento_api::reads::Reads::primary_only(
            asiento_api::reads::ReadSide::primary(database.clone(), store),
        )),
        payments: PaymentFlow::new(
            database.clone(),
            writer.clone(),
            Providers::default(),
            clock.clone(),
            render.clone(),
        )
        .with_leases(30_000, asiento_app::leases::PAYMENT_LEASE_MS_DEFAULT),
        ledger: LedgerFlow::new(database.clone(), writer.clone(), clock.clone(), render)
            .with_idempotency_lease(30_000),
        webhooks: WebhookReceiver {
            database: database.clone(),
            writer,
            secrets: format!("sim:{WEBHOOK_SECRET}")
                .parse::<WebhookSecrets>()
                .unwrap(),
            clock,
            tolerance_s: 300,
        },
        key_cache: Default::default(),
        amount_limit: AmountLimit::DEFAULT,
        webhook_urls: Default::default(),
        rate_limits: Default::default(),
    };
    (dir, asiento_api::router(state))
}

/// A temp directory removed on drop (this crate has no `tempfile`).
mod tempdir {
    pub struct Guard(pub std::path::PathBuf);

    impl Guard {
        pub fn new() -> Self {
            let path = std::env::temp_dir().join(format!("asiento-fuzz-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&path).unwrap();
            Guard(path)
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Path segments: ids of the right shape, of the wrong shape, and hostile text (percent-encoded,
/// so the request can be built at all).
fn segment(gen: &mut Gen, prefix: &str) -> String {
    match gen.below(6) {
        0 => format!("{prefix}{}", uuid::Uuid::from_u128(gen.0.random()).simple()),
        1 => format!("{prefix}{}", uuid::Uuid::from_u128(gen.0.random())),
        2 => gen
            .pick(&[
                "customer:42:available",
                "merchant:acme:available",
                "platform:revenue",
                "x",
            ])
            .to_owned(),
        3 => "%00%ff%2F..%2f".to_owned(),
        4 => gen.text(10).bytes().map(|b| format!("%{b:02X}")).collect(),
        _ => gen
            .pick(&["", "..", "pay_", "je_", "exc_", "a%20b"])
            .to_owned(),
    }
}

fn path(gen: &mut Gen) -> String {
    let pay = segment(gen, "pay_");
    let account = segment(gen, "");
    let entry = segment(gen, "je_");
    let exception = segment(gen, "exc_");
    let provider = gen.pick(&["sim", "sim", "sim", "acme", "%2e%2e", "SIM", "sim%00"]);
    let paths = [
        "/v1/payments".to_owned(),
        format!("/v1/payments/{pay}"),
        format!("/v1/payments/{pay}/events"),
        format!("/v1/payments/{pay}/capture"),
        format!("/v1/payments/{pay}/refunds"),
        "/v1/transfers".to_owned(),
        format!("/v1/accounts/{account}/balance"),
        format!("/v1/accounts/{account}/entries"),
        format!("/v1/journal/{entry}"),
        "/v1/reconciliation/exceptions".to_owned(),
        format!("/v1/reconciliation/exceptions/{exception}/resolve"),
        format!("/webhooks/{provider}"),
        "/healthz".to_owned(),
        "/readyz".to_owned(),
        "/openapi.json".to_owned(),
        "/v1/nope".to_owned(),
        "//v1//payments/".to_owned(),
    ];
    let mut path = gen.pick(&paths);
    if gen.chance(0.6) {
        let params = [
            (
                "status",
                vec!["pending", "captured", "open", "resolved", "", "PENDING"],
            ),
            ("customer", vec!["42", "", "a:b", "%00"]),
            ("currency", vec!["USD", "usd", "XXX", "", "%FF"]),
            (
                "limit",
                vec![
                    "0",
                    "1",
                    "100",
                    "101",
                    "1000",
                    "1001",
                    "-1",
                    "1e3",
                    "99999999999999999999",
                ],
            ),
            ("cursor", vec!["", "abc", "eyJ4Ijo", "%00", "MTIzOjQ1Ng"]),
            (
                "created_gte",
                vec![
                    "2025-11-24T16:00:00Z",
                    "2025-13-01",
                    "",
                    "+275760-09-13T00:00:00Z",
                ],
            ),
            (
                "created_lt",
                vec!["2025-11-24T16:00:00Z", "yesterday", "9999-12-31T23:59:59Z"],
            ),
            ("offset", vec!["1"]),
        ];
        let count = 1 + gen.below(3);
        let query: Vec<String> = (0..count)
            .map(|_| {
                let (name, values) = gen.pick(&params);
                format!("{name}={}", gen.pick(&values))
            })
            .collect();
        path = format!("{path}?{}", query.join("&"));
    }
    path
}

/// A body for `path`: mostly an object of the route's fields with values that are often right,
/// sometimes anything.
fn router_body(gen: &mut Gen, path: &str) -> Vec<u8> {
    if gen.chance(0.25) {
        return gen.body_bytes();
    }
    let mut map = Map::new();
    let good_account = |gen: &mut Gen| {
        Value::from(gen.pick(&[
            "customer:42:available",
            "merchant:acme:available",
            "platform:revenue",
            "merchant:acme:reserve",
        ]))
    };
    let amount = Value::from(gen.0.random_range(1i64..100_000));
    let currency = Value::from(gen.pick(&["USD", "EUR", "JPY"]));
    let mut fields: Vec<(&str, Value)> = Vec::new();
    if path.contains("/resolve") {
        fields.push(("note", Value::from(gen.text(30))));
    } else if path.starts_with("/v1/transfers") {
        fields.push(("amount_minor", amount));
        fields.push(("currency", currency));
        fields.push(("from", good_account(gen)));
        fields.push(("to", good_account(gen)));
        fields.push(("description", Value::from(gen.text(20))));
    } else if path.ends_with("/capture") || path.ends_with("/refunds") {
        fields.push(("amount_minor", amount));
    } else {
        fields.push(("amount_minor", amount));
        fields.push(("currency", currency));
        fields.push(("customer", Value::from(gen.pick(&["42", "c_1"]))));
        fields.push(("payment_method", Value::from("pm_card_ok")));
        fields.push(("capture", Value::from(gen.pick(&["automatic", "manual"]))));
        fields.push(("description", Value::from(gen.text(20))));
        fields.push(("metadata", Value::Object(gen.object(2, 2, &[]))));
    }
    for (name, value) in fields {
        if gen.chance(0.95) {
            let value = if gen.chance(0.07) {
                gen.value(3)
            } else {
                value
            };
            map.insert(name.to_owned(), value);
        }
    }
    if path == "/v1/payments" || path.starts_with("/v1/payments?") {
        // No provider is configured here (see the module comment).
        let provider = map
            .get("provider")
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or_else(|| Value::from("sim"));
        map.insert("provider".to_owned(), provider);
    }
    if gen.chance(0.1) {
        map.insert(gen.text(6), gen.value(2));
    }
    serde_json::to_vec(&Value::Object(map)).unwrap()
}

fn request(gen: &mut Gen) -> (Request<Body>, String) {
    let path = path(gen);
    let method = if gen.chance(0.9) {
        if path.ends_with("/capture")
            || path.ends_with("/refunds")
            || path.ends_with("/resolve")
            || path.starts_with("/v1/transfers")
            || path.starts_with("/webhooks")
            || (path.starts_with("/v1/payments") && gen.chance(0.5))
        {
            Method::POST
        } else {
            Method::GET
        }
    } else {
        gen.pick(&[
            Method::PUT,
            Method::DELETE,
            Method::PATCH,
            Method::HEAD,
            Method::OPTIONS,
        ])
    };
    let mut body = if method == Method::GET && gen.chance(0.8) {
        Vec::new()
    } else {
        router_body(gen, &path)
    };
    if gen.chance(0.02) {
        body = vec![b' '; REQUEST_BODY_BYTES_MAX + 1 + gen.below(10)];
    }
    let mut builder = Request::builder().method(method.clone()).uri(&path);
    match gen.below(16) {
        0 => {}
        1 => builder = builder.header(header::AUTHORIZATION, "Bearer sk_test_wrong_0000000000"),
        2 => builder = builder.header(header::AUTHORIZATION, format!("bearer {API_KEY}")),
        3 => builder = builder.header(header::AUTHORIZATION, b"Bearer \xff\xfe".as_slice()),
        _ => builder = builder.header(header::AUTHORIZATION, format!("Bearer {API_KEY}")),
    }
    match gen.below(14) {
        0 => {}
        1 => builder = builder.header("idempotency-key", ""),
        2 => builder = builder.header("idempotency-key", "x".repeat(256)),
        3 => builder = builder.header("idempotency-key", b"key-\x80\xff".as_slice()),
        4 => builder = builder.header("idempotency-key", "order-1"),
        _ => builder = builder.header("idempotency-key", format!("k-{}", gen.below(50))),
    }
    if gen.chance(0.8) {
        let content_type = gen.pick(&[
            "application/json",
            "text/plain",
            "application/x-www-form-urlencoded",
            "",
        ]);
        builder = builder.header(header::CONTENT_TYPE, content_type);
    }
    if gen.chance(0.05) {
        builder = builder.header(
            header::CONTENT_LENGTH,
            gen.pick(&["70000", "18446744073709551616", "-1", "abc"]),
        );
    }
    if gen.chance(0.3) {
        let request_id = gen.pick(&["not-a-uuid", "0190a000-0000-7000-8000-000000000001", ""]);
        builder = builder.header("x-request-id", request_id);
    }
    if path.starts_with("/webhooks") {
        // A provider event of arbitrary content, so that parsing gets past the signature.
        if gen.chance(0.7) {
            body = serde_json::to_vec(&webhook_event(gen)).unwrap();
        }
        let now = chrono::Utc::now().timestamp();
        let signature = match gen.below(6) {
            0 => sign(WEBHOOK_SECRET, now - 10_000, &body),
            1 => sign("whsec_wrong", now, &body),
            2 => gen.text(40),
            _ => sign(WEBHOOK_SECRET, now, &body),
        };
        if let Ok(value) = axum::http::HeaderValue::from_str(&signature) {
            builder = builder.header("psp-signature", value);
        }
    }
    let description = format!(
        "{method} {path} body {:?}",
        String::from_utf8_lossy(&body[..body.len().min(300)])
    );
    (builder.body(Body::from(body)).unwrap(), description)
}

/// A provider event in the shape the simulator sends, with fields replaced by anything.
fn webhook_event(gen: &mut Gen) -> Value {
    let mut charge = serde_json::json!({
        "id": "ch_1", "status": gen.pick(&["succeeded", "requires_capture", "failed", "refunded", "weird"]),
        "amount_minor": 1000, "currency": "USD", "amount_captured": 1000, "amount_refunded": 0,
        "reference": format!("pay_{}", uuid::Uuid::from_u128(gen.0.random()).simple()),
        "idempotency_key": "psp_x", "created": "2025-11-24T16:00:00Z",
        "updated": "2025-11-24T16:00:00Z"
    });
    let mut event = serde_json::json!({
        "id": format!("evt_{}", gen.below(1000)),
        "type": gen.pick(&["charge.succeeded", "charge.failed", "charge.refunded", "charge.dispute.created", "nope"]),
        "created": chrono::Utc::now().timestamp(),
        "data": {}
    });
    for _ in 0..gen.below(4).saturating_sub(1) {
        let keys: Vec<String> = charge.as_object().unwrap().keys().cloned().collect();
        let key = gen.pick(&keys);
        charge[key] = gen.value(2);
    }
    if gen.chance(0.2) {
        let keys = ["id", "type", "created", "data"];
        event[gen.pick(&keys)] = gen.value(2);
    }
    if event["data"].is_object() {
        event["data"]["charge"] = charge;
    }
    event
}

/// What is wrong with one response, if anything.
fn judge(
    status: StatusCode,
    content_type: &str,
    has_request_id: bool,
    bytes: &[u8],
    is_head: bool,
) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    if status.is_server_error() {
        return Some(format!("{status}: {text}"));
    }
    if !has_request_id {
        return Some(format!("{status} without x-request-id"));
    }
    if status.is_client_error() && !is_head {
        if content_type != PROBLEM_CONTENT_TYPE {
            return Some(format!(
                "{status} as {content_type:?}, not problem+json: {text}"
            ));
        }
        let Ok(problem) = serde_json::from_slice::<Value>(bytes) else {
            return Some(format!("{status} body is not JSON: {text}"));
        };
        if problem["status"] != status.as_u16()
            || problem["code"].as_str().is_none_or(str::is_empty)
        {
            return Some(format!("{status} with a problem that disagrees: {text}"));
        }
        if status == StatusCode::PAYLOAD_TOO_LARGE && problem["code"] != "body_too_large" {
            return Some(format!("413 with code {}", problem["code"]));
        }
    }
    None
}

#[tokio::test]
async fn the_router_answers_anything_without_a_server_error() {
    let (_dir, router) = app().await;
    let mut failures = Vec::new();
    // Which answers the run reached, by route and status: shown with `--nocapture`, to see that
    // generated requests get past authentication and parsing to the use cases.
    let mut reached = std::collections::BTreeMap::<(String, u16), u32>::new();
    for seed in cases(ROUTER_CASES) {
        let mut gen = Gen::new(seed);
        let (request, description) = request(&mut gen);
        let is_head = request.method() == Method::HEAD;
        let route = format!(
            "{} {}",
            request.method(),
            request
                .uri()
                .path()
                .split('/')
                .take(3)
                .collect::<Vec<_>>()
                .join("/")
        );
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        *reached.entry((route, status.as_u16())).or_default() += 1;
        let has_request_id = response.headers().contains_key("x-request-id");
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap_or_default().to_owned())
            .unwrap_or_default();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        if let Some(failure) = judge(status, &content_type, has_request_id, &bytes, is_head) {
            failures.push(format!("seed {seed}: {description}\n    → {failure}"));
        }
    }
    for ((route, status), count) in &reached {
        eprintln!("{count:>6} {status} {route}");
    }
    assert!(
        failures.is_empty(),
        "{} of the requests were answered wrongly:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
