//! A capture asked for while the same capture is open answers that capture, even once it has
//! settled before the request reaches the provider, on both backends.
//!
//! Two captures of one payment at once (each with its own key): the second is decided while the
//! first awaits the provider, records nothing, and must name the first's operation as its own.
//! Named by the payment alone, a request that reaches the provider after the first capture
//! settled, or that resumes after its process died, looks for an open capture that is gone (the
//! race campaign's 500s, `request on pay_… names no capture`). Here the order is made certain:
//! the provider holds both calls, the second request dies in its call, the first completes, and
//! the second is resumed with its key once its lease has run out.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use asiento_app::clock::ManualClock;
use asiento_app::log;
use asiento_app::payments::{Idempotent, NewPayment, PaymentFlow};
use asiento_app::reply::Answer;
use asiento_domain::{
    Amount, CaptureMode, Currency, CustomerId, OperationKind, OperationState, PaymentId,
    PaymentStatus, ProviderName, TenantId,
};
use asiento_psp::{
    Capabilities, Charge, ChargeOutcome, ClientConfig, CreateCharge, HttpProvider, Operation,
    OperationAnswer, Provider, ProviderError, SettlementReport,
};
use asiento_psp_sim::SimConfig;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio::sync::{Notify, Semaphore};

mod common;

use common::{create_request, flow_of, Backend, TestDatabase, TestSim};

/// A provider whose captures wait, while `holding`, until the test lets them through.
struct Held {
    inner: HttpProvider,
    holding: AtomicBool,
    entered: AtomicUsize,
    arrived: Notify,
    through: Semaphore,
}

impl Held {
    /// Waits until `count` captures are held.
    async fn captures_held(&self, count: usize) {
        loop {
            let arrived = self.arrived.notified();
            if self.entered.load(Ordering::SeqCst) >= count {
                return;
            }
            arrived.await;
        }
    }

    fn let_through(&self) {
        self.holding.store(false, Ordering::SeqCst);
        self.through.add_permits(Semaphore::MAX_PERMITS / 2);
    }
}

#[async_trait]
impl Provider for Held {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn create_charge(&self, req: &CreateCharge) -> ChargeOutcome {
        self.inner.create_charge(req).await
    }

    async fn capture(
        &self,
        charge_id: &str,
        amount_minor: Option<i64>,
        currency: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        if self.holding.load(Ordering::SeqCst) {
            self.entered.fetch_add(1, Ordering::SeqCst);
            self.arrived.notify_waiters();
            let _through = self.through.acquire().await.unwrap();
        }
        self.inner
            .capture(charge_id, amount_minor, currency, idempotency_key)
            .await
    }

    async fn refund(
        &self,
        charge_id: &str,
        amount_minor: i64,
        currency: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        self.inner
            .refund(charge_id, amount_minor, currency, idempotency_key)
            .await
    }

    async fn cancel(
        &self,
        charge_id: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        self.inner.cancel(charge_id, idempotency_key).await
    }

    async fn get_charge(&self, charge_id: &str) -> Result<Option<Charge>, ProviderError> {
        self.inner.get_charge(charge_id).await
    }

    async fn find_charge_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Charge>, ProviderError> {
        self.inner.find_charge_by_key(idempotency_key).await
    }

    async fn find_operation_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Operation>, ProviderError> {
        self.inner.find_operation_by_key(idempotency_key).await
    }

    async fn get_operation(&self, id: &str) -> Result<Option<Operation>, ProviderError> {
        self.inner.get_operation(id).await
    }

    async fn settlement_report(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<SettlementReport, ProviderError> {
        self.inner.settlement_report(from, to).await
    }
}

fn capture_request(id: PaymentId, key: &str) -> Idempotent {
    let mut request = create_request(key);
    request.scope.route = format!("/v1/payments/{id}/capture");
    request
}

async fn capture(flow: &PaymentFlow, request: &Idempotent, id: PaymentId) -> Answer {
    flow.capture(request, &TenantId::parse("acme").unwrap(), id, None)
        .await
        .unwrap_or_else(|error| panic!("capture {}: {error}", request.key.as_str()))
}

fn status_of(answer: &Answer) -> String {
    let Answer::Done(response) = answer else {
        panic!("not answered: {answer:?}");
    };
    let body: Value = serde_json::from_slice(&response.body).unwrap();
    body["status"].as_str().unwrap().to_owned()
}

async fn second_capture_resumed_after_the_first_settled(backend: Backend) {
    let db = TestDatabase::open(backend).await;
    let mut served = TestSim::start(SimConfig {
        seed: 11,
        ..SimConfig::default()
    })
    .await;
    let held = Arc::new(Held {
        inner: HttpProvider::new(
            "sim",
            &format!("http://{}", served.addr),
            ClientConfig::default(),
        )
        .unwrap(),
        holding: AtomicBool::new(false),
        entered: AtomicUsize::new(0),
        arrived: Notify::new(),
        through: Semaphore::new(0),
    });
    let clock = Arc::new(ManualClock::at_ms(Utc::now().timestamp_millis()));
    let flow = flow_of(db.database(), "sim", held.clone(), clock.clone());

    let payment = NewPayment {
        tenant: TenantId::parse("acme").unwrap(),
        amount: Amount::new(10_000),
        currency: Currency::parse("USD").unwrap(),
        customer: CustomerId::parse("42").unwrap(),
        provider: ProviderName::parse("sim").unwrap(),
        payment_method: "pm_card_ok".into(),
        capture_mode: CaptureMode::Manual,
        description: None,
        metadata: serde_json::Map::new(),
    };
    let created = flow
        .create(&create_request("authorize"), payment)
        .await
        .unwrap();
    let Answer::Done(response) = created else {
        panic!("create did not finish");
    };
    let body: Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(body["status"], "authorized");
    let id = PaymentId::parse(body["id"].as_str().unwrap()).unwrap();

    // The first capture records its operation and waits at the provider; the second, decided
    // while it is open, records nothing and waits there too; then its process dies.
    held.holding.store(true, Ordering::SeqCst);
    let first = tokio::spawn({
        let flow = flow.clone();
        async move { capture(&flow, &capture_request(id, "capture-first"), id).await }
    });
    held.captures_held(1).await;
    let second = tokio::spawn({
        let flow = flow.clone();
        async move { capture(&flow, &capture_request(id, "capture-second"), id).await }
    });
    held.captures_held(2).await;
    second.abort();
    assert!(second.await.unwrap_err().is_cancelled());

    // The first capture settles.
    held.let_through();
    assert_eq!(status_of(&first.await.unwrap()), "captured");

    // Once its key's lease has run out, the second request resumes and answers the capture it
    // was decided against.
    clock.advance_ms(asiento_app::payments::IDEMPOTENCY_LEASE_MS_DEFAULT + 1_000);
    let resumed = capture(&flow, &capture_request(id, "capture-second"), id).await;
    assert_eq!(status_of(&resumed), "captured");

    let record = log::load_payment(flow.store().as_ref(), id)
        .await
        .unwrap()
        .aggregate
        .record
        .unwrap();
    assert_eq!(record.status, PaymentStatus::Captured);
    let captures: Vec<OperationState> = record
        .operations
        .iter()
        .filter(|op| op.kind == OperationKind::Capture)
        .map(|op| op.state)
        .collect();
    assert_eq!(captures, [OperationState::Succeeded]);
    served.stop();
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_capture_resumed_after_the_first_settled_answers_it_sqlite() {
    second_capture_resumed_after_the_first_settled(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_capture_resumed_after_the_first_settled_answers_it_postgres() {
    second_capture_resumed_after_the_first_settled(Backend::Postgres).await;
}
