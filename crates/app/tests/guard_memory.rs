//! The guard cache against a second writer: two flows with caches of their own (two processes)
//! post to one account's guard in turns. Each decision of a flow whose remembered guard went
//! stale must conflict, read the log and land on the true balance; the guard stream must chain
//! version after version and every invariant must hold. For ledger commands, which a guard
//! refuses, a refusal decided against a stale memory must not be answered: only the log refuses.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use asiento_app::clock::SystemClock;
use asiento_app::commit::Writer;
use asiento_app::invariants::Checker;
use asiento_app::ledger::{LedgerFlow, NewTransfer};
use asiento_app::log;
use asiento_app::payments::{NewPayment, PaymentFlow};
use asiento_app::reply::Answer;
use asiento_domain::guard::{GuardEvent, GuardKey};
use asiento_domain::payment::CaptureMode;
use asiento_domain::{
    AccountName, Amount, Currency, CustomerId, PaymentId, ProviderName, TenantId,
};
use asiento_psp::ClientConfig;
use asiento_psp_sim::SimConfig;

mod common;

use common::{create_request, Backend, TestDatabase, TestRender, TestSim};

const AMOUNT_MINOR: i64 = 10_000;
const REFUND_MINOR: i64 = 2_500;

async fn pay(flow: &PaymentFlow) -> PaymentId {
    let payment = NewPayment {
        tenant: TenantId::parse("acme").unwrap(),
        amount: Amount::new(AMOUNT_MINOR),
        currency: Currency::parse("USD").unwrap(),
        customer: CustomerId::parse("7").unwrap(),
        provider: ProviderName::parse("sim").unwrap(),
        payment_method: "pm_card_ok".to_owned(),
        capture_mode: CaptureMode::Automatic,
        description: None,
        metadata: serde_json::Map::new(),
    };
    let request = create_request(&uuid::Uuid::new_v4().to_string());
    let Answer::Done(response) = flow.create(&request, payment).await.unwrap() else {
        panic!("create did not finish");
    };
    let body: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(body["status"], "captured", "{body}");
    PaymentId::parse(body["id"].as_str().unwrap()).unwrap()
}

async fn refund(flow: &PaymentFlow, id: PaymentId) {
    let mut request = create_request(&uuid::Uuid::new_v4().to_string());
    request.scope.route = format!("/v1/payments/{id}/refunds");
    let tenant = TenantId::parse("acme").unwrap();
    let answer = flow
        .refund(&request, &tenant, id, Amount::new(REFUND_MINOR))
        .await
        .unwrap();
    assert!(matches!(answer, Answer::Done(_)), "{answer:?}");
}

async fn guard_memory_against_a_second_writer(backend: Backend) {
    let db = TestDatabase::open(backend).await;
    let sim = TestSim::start(SimConfig::default()).await;
    let clock = Arc::new(SystemClock);
    let a = sim.flow(db.database(), ClientConfig::default(), clock.clone());
    let b = sim.flow(db.database(), ClientConfig::default(), clock);
    let key = GuardKey {
        tenant: TenantId::parse("acme").unwrap(),
        account: AccountName::customer_available(&CustomerId::parse("7").unwrap()),
        currency: Currency::parse("USD").unwrap(),
    };

    // A writes the guard first and remembers what it wrote.
    pay(&a).await;
    let first = a
        .writer()
        .guards()
        .remembered(&key)
        .expect("A remembers the guard it wrote");
    assert_eq!(first.version, 1);
    assert!(first.balance.minor() > 0);
    let credit = first.balance.minor();

    // B (its own memory) reads the log, so it builds on A's write.
    let paid_by_b = pay(&b).await;
    assert_eq!(b.writer().guards().remembered(&key).unwrap().version, 2);
    assert_eq!(
        a.writer().guards().remembered(&key).unwrap().version,
        1,
        "A's memory is stale now"
    );

    // A decides on its stale memory, conflicts, reads the log and writes version 3, then B
    // refunds on its own stale memory (version 2).
    pay(&a).await;
    let third = a.writer().guards().remembered(&key).unwrap();
    assert_eq!(third.version, 3);
    assert_eq!(third.balance.minor(), 3 * credit);
    refund(&b, paid_by_b).await;
    let fourth = b.writer().guards().remembered(&key).unwrap();
    assert_eq!(fourth.version, 4);
    assert!(
        (3 * credit - REFUND_MINOR..3 * credit).contains(&fourth.balance.minor()),
        "the refund debits the customer at most its amount (less the fee returned): {fourth:?}"
    );

    // The log agrees: one chain of guard events, each balance the previous plus its delta.
    let store = db.database().event_store();
    let events = store.read_stream(&key.stream(), 1, 100).await.unwrap();
    let mut balance = 0;
    for (i, raw) in events.iter().enumerate() {
        assert_eq!(raw.version, i as u64 + 1);
        let event = GuardEvent::decode_raw(&raw.event_type, raw.schema, raw.data.raw()).unwrap();
        let GuardEvent::BalanceChanged(changed) = event else {
            panic!("no overdraft here: {event:?}");
        };
        balance += changed.delta_minor.minor();
        assert_eq!(changed.balance_minor.minor(), balance);
    }
    assert_eq!(events.len(), 4);
    assert_eq!(log::load_guard(store.as_ref(), &key).await.unwrap(), fourth);

    holds_every_invariant(db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_memory_against_a_second_writer_sqlite() {
    guard_memory_against_a_second_writer(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_memory_against_a_second_writer_postgres() {
    guard_memory_against_a_second_writer(Backend::Postgres).await;
}

/// A ledger flow of its own (another process): its own writer and its own memory of guards.
fn ledger(db: &TestDatabase) -> LedgerFlow {
    LedgerFlow::new(
        db.database().clone(),
        Writer::new(db.database().event_store()),
        Arc::new(SystemClock),
        Arc::new(TestRender),
    )
}

/// A transfer of `amount_minor` USD of tenant `acme`: whether it was posted (else refused).
async fn transfer(flow: &LedgerFlow, from: &str, to: &str, amount_minor: i64) -> bool {
    let mut request = create_request(&uuid::Uuid::new_v4().to_string());
    request.scope.route = "/v1/transfers".to_owned();
    let answer = flow
        .transfer(
            &request,
            NewTransfer {
                tenant: TenantId::parse("acme").unwrap(),
                from: AccountName::parse(from).unwrap(),
                to: AccountName::parse(to).unwrap(),
                amount: Amount::new(amount_minor),
                currency: Currency::parse("USD").unwrap(),
                description: None,
                pending: false,
                expires_at: None,
            },
        )
        .await
        .unwrap();
    let Answer::Done(response) = answer else {
        panic!("the transfer did not finish: {answer:?}");
    };
    let body: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    body.get("rejected").is_none()
}

async fn ledger_guard_memory_against_a_second_writer(backend: Backend) {
    let db = TestDatabase::open(backend).await;
    let (a, b) = (ledger(&db), ledger(&db));
    let source = "customer:1:available";
    let key = GuardKey {
        tenant: TenantId::parse("acme").unwrap(),
        account: AccountName::parse(source).unwrap(),
        currency: Currency::parse("USD").unwrap(),
    };
    let remembered = |flow: &LedgerFlow| {
        let state = flow
            .writer()
            .guards()
            .remembered(&key)
            .expect("a guard it wrote");
        (state.version, state.balance.minor())
    };

    assert!(transfer(&a, "treasury:main", source, 100).await);
    assert_eq!(remembered(&a), (1, 100));
    // B funds the account; A's memory still says 100.
    assert!(transfer(&b, "treasury:main", source, 1_000).await);
    assert_eq!(remembered(&b), (2, 1_100));
    assert_eq!(remembered(&a), (1, 100));

    // 500 does not fit what A remembers, but fits the log: posted, not refused.
    assert!(
        transfer(&a, source, "customer:2:available", 500).await,
        "a transfer refused on a stale memory"
    );
    assert_eq!(remembered(&a), (3, 600));

    // 50 fits B's stale memory (version 2): its append conflicts and lands on version 4.
    assert!(transfer(&b, source, "customer:3:available", 50).await);
    assert_eq!(remembered(&b), (4, 550));
    // More than the log holds is refused after the log is read, and nothing is written.
    assert!(!transfer(&a, source, "customer:2:available", 10_000).await);
    assert!(transfer(&a, source, "customer:2:available", 100).await);
    assert_eq!(remembered(&a), (5, 450));

    let store = db.database().event_store();
    let state = log::load_guard(store.as_ref(), &key).await.unwrap();
    assert_eq!((state.version, state.balance.minor()), (5, 450));
    holds_every_invariant(db).await;
}

/// Every invariant holds over what the test wrote; then the database goes.
async fn holds_every_invariant(db: TestDatabase) {
    let report = Checker::new(db.database().clone(), Arc::new(SystemClock))
        .check_once()
        .await
        .unwrap();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_guard_memory_against_a_second_writer_sqlite() {
    ledger_guard_memory_against_a_second_writer(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_guard_memory_against_a_second_writer_postgres() {
    ledger_guard_memory_against_a_second_writer(Backend::Postgres).await;
}
