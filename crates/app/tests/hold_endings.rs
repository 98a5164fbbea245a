//! A hold's ending on a busy account is not starved by the other writes to that account, on both
//! backends.
//!
//! A post or void of a hold is a command on the account's debit guard, like every transfer out of
//! it, and payments to the account write that guard too. While commands of this process are being
//! written to the guard, an ending decided against the log decides against the state they are
//! changing and loses its race to them, again and again while they keep coming, until it gives up
//! (the race campaign's 500 `hold tr_… kept losing races`). Here six clients keep paying into one
//! account and four keep transferring out of it while its holds are voided and posted one after
//! another: each ending must end its hold.
//!
//! And a hold of a tenant paused for a move between cells does not expire until the tenant is not
//! paused: nothing writes for a paused tenant.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use asiento_app::clock::SystemClock;
use asiento_app::hold_expiry::expire_due;
use asiento_app::idempotency::StoredResponse;
use asiento_app::invariants::Checker;
use asiento_app::ledger::{LedgerFlow, NewTransfer};
use asiento_app::payments::{FlowError, NewPayment, PaymentFlow};
use asiento_app::reply::{Answer, Render, Reply};
use asiento_domain::hold::HoldAction;
use asiento_domain::payment::CaptureMode;
use asiento_domain::{
    AccountName, Amount, Currency, CustomerId, ProviderName, TenantId, TransferId,
};
use asiento_psp::ClientConfig;
use asiento_psp_sim::SimConfig;
use serde_json::{json, Value};

mod common;

use common::{create_request, Backend, TestDatabase, TestSim};

const BUSY: &str = "customer:1:available";
/// Clients transferring out of the busy account meanwhile, and clients paying into it.
const TRANSFERRING_CLIENTS: usize = 4;
const PAYING_CLIENTS: usize = 6;
/// Requests one client sends at most.
const REQUESTS_PER_CLIENT_MAX: usize = 5_000;
/// Holds ended one after another while the transfers run.
const HOLDS: usize = 40;
/// Tries to create one hold at most.
const HOLD_TRIES_MAX: usize = 20;

/// Renders the transfer's id and status, or the rejection.
struct IdRender;

impl Render for IdRender {
    fn render(&self, reply: &Reply<'_>) -> StoredResponse {
        let body = match reply {
            Reply::Transfer { transfer, .. } => json!({
                "id": transfer.requested.transfer_id.to_string(),
                "status": transfer.status().as_str(),
            }),
            Reply::Rejected(rejected) => json!({"rejected": format!("{rejected:?}")}),
            Reply::Payment { .. }
            | Reply::TransferBatch { .. }
            | Reply::Account { .. }
            | Reply::Monitor { .. } => json!({}),
        };
        StoredResponse {
            status: 200,
            body: serde_json::to_vec(&body).unwrap(),
        }
    }
}

/// The ledger flow of the process `payments` runs in: one writer, one memory of guards.
fn ledger(db: &TestDatabase, payments: &PaymentFlow) -> LedgerFlow {
    LedgerFlow::new(
        db.database().clone(),
        Arc::clone(payments.writer()),
        Arc::new(SystemClock),
        Arc::new(IdRender),
    )
}

/// A payment of customer 1, captured at once.
async fn pay(flow: &PaymentFlow) {
    let payment = NewPayment {
        tenant: TenantId::parse("acme").unwrap(),
        amount: Amount::new(1_000),
        currency: Currency::parse("USD").unwrap(),
        customer: CustomerId::parse("1").unwrap(),
        provider: ProviderName::parse("sim").unwrap(),
        payment_method: "pm_card_ok".to_owned(),
        capture_mode: CaptureMode::Automatic,
        description: None,
        metadata: serde_json::Map::new(),
    };
    let request = create_request(&uuid::Uuid::new_v4().to_string());
    flow.create(&request, payment).await.unwrap();
}

fn body_of(answer: Answer) -> Value {
    let Answer::Done(response) = answer else {
        panic!("not answered: {answer:?}");
    };
    serde_json::from_slice(&response.body).unwrap()
}

/// A transfer (or a hold) of tenant `acme`: its answer, or the error it ended in.
async fn transfer(
    flow: &LedgerFlow,
    from: &str,
    to: &str,
    amount: i64,
    pending: bool,
) -> Result<Value, FlowError> {
    let mut request = create_request(&uuid::Uuid::new_v4().to_string());
    request.scope.route = "/v1/transfers".to_owned();
    let answer = flow
        .transfer(
            &request,
            NewTransfer {
                tenant: TenantId::parse("acme").unwrap(),
                from: AccountName::parse(from).unwrap(),
                to: AccountName::parse(to).unwrap(),
                amount: Amount::new(amount),
                currency: Currency::parse("USD").unwrap(),
                description: None,
                pending,
                expires_at: None,
            },
        )
        .await?;
    Ok(body_of(answer))
}

/// A hold of 1,000 on the busy account, asked again while it meets a busy account (creating it
/// is not what is tested).
async fn hold(flow: &LedgerFlow) -> TransferId {
    for _ in 0..HOLD_TRIES_MAX {
        match transfer(flow, BUSY, "merchant:hold", 1_000, true).await {
            Ok(held) => {
                assert_eq!(held["status"], "pending", "{held}");
                return TransferId::parse(held["id"].as_str().unwrap()).unwrap();
            }
            Err(FlowError::Contended(_)) => {}
            Err(error) => panic!("a hold: {error}"),
        }
    }
    panic!("no hold in {HOLD_TRIES_MAX} tries");
}

async fn end(flow: &LedgerFlow, id: TransferId, action: HoldAction) -> Value {
    let mut request = create_request(&uuid::Uuid::new_v4().to_string());
    request.scope.route = format!("/v1/transfers/{id}/end");
    let answer = flow
        .settle_hold(&request, &TenantId::parse("acme").unwrap(), id, action)
        .await
        .unwrap_or_else(|error| panic!("ending hold {id}: {error}"));
    body_of(answer)
}

async fn endings_on_a_busy_account(backend: Backend) {
    let db = TestDatabase::open(backend).await;
    let mut sim = TestSim::start(SimConfig::default()).await;
    let payments = sim.flow(
        db.database(),
        ClientConfig::default(),
        Arc::new(SystemClock),
    );
    let flow = ledger(&db, &payments);
    let funded = transfer(&flow, "treasury:main", BUSY, 1_000_000_000, false)
        .await
        .unwrap();
    assert_eq!(funded["status"], "posted", "{funded}");

    let done = Arc::new(AtomicBool::new(false));
    let mut clients: Vec<_> = (0..TRANSFERRING_CLIENTS)
        .map(|n| {
            let (flow, done) = (flow.clone(), Arc::clone(&done));
            tokio::spawn(async move {
                let to = format!("merchant:shop-{n}");
                for _ in 0..REQUESTS_PER_CLIENT_MAX {
                    if done.load(Ordering::SeqCst) {
                        break;
                    }
                    // Busy itself, a transfer may give up (`Contended`): it is load here.
                    match transfer(&flow, BUSY, &to, 100, false).await {
                        Ok(_) | Err(FlowError::Contended(_)) => {}
                        Err(error) => panic!("a transfer: {error}"),
                    }
                }
            })
        })
        .collect();
    clients.extend((0..PAYING_CLIENTS).map(|_| {
        let (payments, done) = (payments.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            for _ in 0..REQUESTS_PER_CLIENT_MAX {
                if done.load(Ordering::SeqCst) {
                    break;
                }
                pay(&payments).await;
            }
        })
    }));

    for n in 0..HOLDS {
        let id = hold(&flow).await;
        let (action, ended) = if n % 2 == 0 {
            (HoldAction::Void, "voided")
        } else {
            (HoldAction::Post { amount: None }, "posted")
        };
        let answer = end(&flow, id, action).await;
        assert_eq!(answer["status"], ended, "hold {n}: {answer}");
    }
    done.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }

    let report = Checker::new(db.database().clone(), Arc::new(SystemClock))
        .check_once()
        .await
        .unwrap();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    sim.stop();
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_s_ending_on_a_busy_account_is_not_starved_sqlite() {
    endings_on_a_busy_account(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_s_ending_on_a_busy_account_is_not_starved_postgres() {
    endings_on_a_busy_account(Backend::Postgres).await;
}

async fn a_paused_tenant_s_hold_waits(backend: Backend) {
    let db = TestDatabase::open(backend).await;
    let mut sim = TestSim::start(SimConfig::default()).await;
    let payments = sim.flow(
        db.database(),
        ClientConfig::default(),
        Arc::new(SystemClock),
    );
    let flow = ledger(&db, &payments);
    transfer(&flow, "treasury:main", BUSY, 10_000, false)
        .await
        .unwrap();
    let mut request = create_request("a-hold-that-expires");
    request.scope.route = "/v1/transfers".to_owned();
    let held = flow
        .transfer(
            &request,
            NewTransfer {
                tenant: TenantId::parse("acme").unwrap(),
                from: AccountName::parse(BUSY).unwrap(),
                to: AccountName::parse("merchant:hold").unwrap(),
                amount: Amount::new(1_000),
                currency: Currency::parse("USD").unwrap(),
                description: None,
                pending: true,
                expires_at: Some(chrono::Utc::now() + chrono::Duration::milliseconds(200)),
            },
        )
        .await
        .unwrap();
    assert_eq!(body_of(held)["status"], "pending");
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;

    let paused = [
        TenantId::parse("beta").unwrap(),
        TenantId::parse("acme").unwrap(),
    ];
    assert_eq!(expire_due(&flow, &paused).await.unwrap(), 0, "paused");
    assert_eq!(
        expire_due(&flow, &paused[..1]).await.unwrap(),
        1,
        "another paused"
    );
    sim.stop();
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_tenant_s_hold_does_not_expire_until_it_is_not_paused_sqlite() {
    a_paused_tenant_s_hold_waits(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_tenant_s_hold_does_not_expire_until_it_is_not_paused_postgres() {
    a_paused_tenant_s_hold_waits(Backend::Postgres).await;
}
