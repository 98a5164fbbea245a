//! Every capture and refund ends in a recorded outcome, against a real simulator over HTTP on both
//! backends, with no webhook delivered and no client retry: a refund or capture sent while the
//! provider is unreachable is recorded as requested and finished by the reconciler's operations
//! sweep with exactly one provider operation and one posting; a refund the provider refuses
//! releases its amount, which a later refund can take; without a lookup route the sweep sends
//! the operation again under the same key.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use asiento_app::clock::SystemClock;
use asiento_app::log;
use asiento_app::payments::NewPayment;
use asiento_app::reconcile::{Reconciler, ReconcilerConfig};
use asiento_app::reply::Answer;
use asiento_domain::{
    Amount, CaptureMode, Currency, CustomerId, OperationKind, OperationState, PaymentEvent,
    PaymentId, PaymentRecord, PaymentStatus, ProviderName, TenantId,
};
use asiento_psp::{Capabilities, ClientConfig, OperationKind as SimKind};
use asiento_psp_sim::FaultsPatch;
use asiento_psp_sim::SimConfig;
use serde_json::{json, Value};

mod common;

use common::{create_request, Backend, PaymentRig};

/// Operations are due at once, the report window ends before anything here (so only the
/// operations sweep can settle them), and nothing is stale.
fn config() -> ReconcilerConfig {
    ReconcilerConfig {
        operation_timeout_ms: 0,
        report_settle_ms: 3_600_000,
        interval_ms: 0,
        ..ReconcilerConfig::default()
    }
}

impl PaymentRig {
    async fn for_operations(backend: Backend, capabilities: Capabilities) -> PaymentRig {
        let client = ClientConfig {
            request_timeout_ms: 1_000,
            attempts_max: 2,
            capabilities,
            ..ClientConfig::default()
        };
        PaymentRig::start(
            backend,
            SimConfig {
                seed: 5,
                ..SimConfig::default()
            },
            client,
            Arc::new(SystemClock),
        )
        .await
    }

    async fn sweep(&self) -> asiento_app::reconcile::SweepSummary {
        self.log_readable().await;
        let summary = Reconciler::new(self.flow.clone(), config())
            .sweep_once()
            .await
            .unwrap();
        assert_eq!(summary.errors, 0, "{summary}");
        summary
    }

    async fn create(&self, mode: CaptureMode) -> PaymentId {
        let payment = NewPayment {
            tenant: TenantId::parse("acme").unwrap(),
            amount: Amount::new(10_000),
            currency: Currency::parse("USD").unwrap(),
            customer: CustomerId::parse("42").unwrap(),
            provider: ProviderName::parse("sim").unwrap(),
            payment_method: "pm_card_ok".into(),
            capture_mode: mode,
            description: None,
            metadata: serde_json::Map::new(),
        };
        let request = create_request(&uuid::Uuid::new_v4().to_string());
        let Answer::Done(response) = self.flow.create(&request, payment).await.unwrap() else {
            panic!("create did not finish");
        };
        let body: Value = serde_json::from_slice(&response.body).unwrap();
        PaymentId::parse(body["id"].as_str().unwrap()).unwrap()
    }

    async fn refund(&self, id: PaymentId, amount: i64) -> Answer {
        let mut request = create_request(&uuid::Uuid::new_v4().to_string());
        request.scope.route = format!("/v1/payments/{id}/refunds");
        let tenant = TenantId::parse("acme").unwrap();
        self.flow
            .refund(&request, &tenant, id, Amount::new(amount))
            .await
            .unwrap()
    }

    async fn capture(&self, id: PaymentId) -> Answer {
        let mut request = create_request(&uuid::Uuid::new_v4().to_string());
        request.scope.route = format!("/v1/payments/{id}/capture");
        let tenant = TenantId::parse("acme").unwrap();
        self.flow
            .capture(&request, &tenant, id, None)
            .await
            .unwrap()
    }

    async fn record(&self, id: PaymentId) -> PaymentRecord {
        log::load_payment(self.flow.store().as_ref(), id)
            .await
            .unwrap()
            .aggregate
            .record
            .unwrap()
    }

    async fn events(&self, id: PaymentId) -> Vec<PaymentEvent> {
        log::load_payment(self.flow.store().as_ref(), id)
            .await
            .unwrap()
            .events
            .into_iter()
            .map(|(_, event)| event)
            .collect()
    }

    fn sim_operations(&self, record: &PaymentRecord, kind: SimKind) -> usize {
        let charge = record.provider_charge_id.clone().unwrap();
        self.served
            .sim
            .operations()
            .into_iter()
            .filter(|op| op.charge == charge && op.kind == kind)
            .count()
    }

    fn unreachable_for(&self, ms: u64) {
        self.served
            .sim
            .set_faults(&FaultsPatch {
                unreachable_ms: Some(ms),
                ..FaultsPatch::default()
            })
            .unwrap();
    }

    /// A POST to the simulator's control routes over plain HTTP/1.1.
    async fn sim_post(&self, path: &str, body: Value) -> u16 {
        common::sim_post(self.served.addr, path, &body).await.0
    }
}

fn entries(events: &[PaymentEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, PaymentEvent::EntryPosted(_)))
        .count()
}

async fn refund_while_unreachable(backend: Backend) {
    let h = PaymentRig::for_operations(backend, Capabilities::SIM).await;
    let id = h.create(CaptureMode::Automatic).await;
    assert_eq!(h.record(id).await.status, PaymentStatus::Captured);
    let entries_before = entries(&h.events(id).await);

    h.unreachable_for(1_500);
    assert!(matches!(h.refund(id, 10_000).await, Answer::Done(_)));
    let record = h.record(id).await;
    let op = record.operation(OperationKind::Refund, 1).unwrap();
    assert_eq!(
        op.state,
        OperationState::Requested,
        "unknown, never refused"
    );
    assert_eq!(record.status, PaymentStatus::Captured);

    // The provider comes back; the sweep alone finishes the refund.
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let summary = h.sweep().await;
    assert_eq!(summary.operations_settled, 1, "{summary}");
    let record = h.record(id).await;
    assert_eq!(record.status, PaymentStatus::Refunded);
    assert_eq!(record.refunded.minor(), 10_000);
    assert_eq!(
        record.operation(OperationKind::Refund, 1).unwrap().state,
        OperationState::Succeeded
    );
    assert_eq!(h.sim_operations(&record, SimKind::Refund), 1);
    assert_eq!(entries(&h.events(id).await), entries_before + 1);
    // Converged: nothing left to drive.
    let again = h.sweep().await;
    assert_eq!(again.operations_checked, 0, "{again}");
    h.finish().await;
}

#[tokio::test]
async fn a_refund_sent_while_the_provider_is_unreachable_ends_refunded_sqlite() {
    refund_while_unreachable(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_refund_sent_while_the_provider_is_unreachable_ends_refunded_postgres() {
    refund_while_unreachable(Backend::Postgres).await;
}

async fn capture_while_unreachable(backend: Backend) {
    let h = PaymentRig::for_operations(backend, Capabilities::SIM).await;
    let id = h.create(CaptureMode::Manual).await;
    assert_eq!(h.record(id).await.status, PaymentStatus::Authorized);

    h.unreachable_for(1_500);
    assert!(matches!(h.capture(id).await, Answer::Done(_)));
    let record = h.record(id).await;
    assert_eq!(record.status, PaymentStatus::Authorized);
    assert_eq!(
        record.open_capture().map(|op| op.state),
        Some(OperationState::Requested)
    );

    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let summary = h.sweep().await;
    assert_eq!(summary.operations_settled, 1, "{summary}");
    let record = h.record(id).await;
    assert_eq!(record.status, PaymentStatus::Captured);
    assert_eq!(record.captured.minor(), 10_000);
    assert!(record.open_capture().is_none());
    assert_eq!(h.sim_operations(&record, SimKind::Capture), 1);
    let captures = h
        .events(id)
        .await
        .iter()
        .filter(|e| matches!(e, PaymentEvent::ChargeCaptured(_)))
        .count();
    assert_eq!(captures, 1);
    h.finish().await;
}

#[tokio::test]
async fn a_capture_sent_while_the_provider_is_unreachable_ends_captured_sqlite() {
    capture_while_unreachable(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_capture_sent_while_the_provider_is_unreachable_ends_captured_postgres() {
    capture_while_unreachable(Backend::Postgres).await;
}

async fn refused_refund_releases(backend: Backend) {
    let h = PaymentRig::for_operations(backend, Capabilities::SIM).await;
    let id = h.create(CaptureMode::Automatic).await;
    let charge = h.record(id).await.provider_charge_id.unwrap();
    // A dispute opens at the provider (its webhook never reaches us): the provider refuses to
    // refund a disputed charge.
    let status = h
        .sim_post(
            &format!("/sim/charges/{charge}/dispute"),
            json!({"amount_minor": 10_000}),
        )
        .await;
    assert_eq!(status, 200);
    assert!(matches!(h.refund(id, 10_000).await, Answer::Done(_)));
    let record = h.record(id).await;
    let op = record.operation(OperationKind::Refund, 1).unwrap();
    assert_eq!(op.state, OperationState::Refused);
    assert_eq!(op.reason.as_deref(), Some("charge_disputed"));
    assert_eq!(record.refund_committed().unwrap(), Amount::ZERO);

    // The dispute is won at the provider; the whole amount can be refunded again.
    let status = h
        .sim_post(
            &format!("/sim/charges/{charge}/dispute/close"),
            json!({"outcome": "won"}),
        )
        .await;
    assert_eq!(status, 200);
    assert!(matches!(h.refund(id, 10_000).await, Answer::Done(_)));
    let record = h.record(id).await;
    assert_eq!(
        record.operation(OperationKind::Refund, 2).unwrap().state,
        OperationState::Succeeded
    );
    assert_eq!(record.status, PaymentStatus::Refunded);
    h.finish().await;
}

#[tokio::test]
async fn a_refused_refund_releases_its_amount_sqlite() {
    refused_refund_releases(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_refused_refund_releases_its_amount_postgres() {
    refused_refund_releases(Backend::Postgres).await;
}

/// A provider without any lookup: the sweep sends the operation again under its key, which the
/// provider answers from its first execution (no second refund).
async fn no_lookup_resends_under_the_key(backend: Backend) {
    let capabilities = Capabilities {
        lookup_by_key: false,
        lookup_by_id: false,
        ..Capabilities::SIM
    };
    let h = PaymentRig::for_operations(backend, capabilities).await;
    h.served
        .sim
        .set_faults(&FaultsPatch {
            lookup_disabled: Some(true),
            ..FaultsPatch::default()
        })
        .unwrap();
    let id = h.create(CaptureMode::Automatic).await;
    // The refund is executed, but its answer is lost.
    h.served
        .sim
        .set_faults(&FaultsPatch {
            timeout_rate: Some(1.0),
            ..FaultsPatch::default()
        })
        .unwrap();
    assert!(matches!(h.refund(id, 4_000).await, Answer::Done(_)));
    assert_eq!(
        h.record(id)
            .await
            .operation(OperationKind::Refund, 1)
            .unwrap()
            .state,
        OperationState::Requested
    );
    h.served
        .sim
        .set_faults(&FaultsPatch {
            timeout_rate: Some(0.0),
            ..FaultsPatch::default()
        })
        .unwrap();
    let summary = h.sweep().await;
    assert_eq!(summary.operations_settled, 1, "{summary}");
    let record = h.record(id).await;
    assert_eq!(record.status, PaymentStatus::PartiallyRefunded);
    assert_eq!(record.refunded.minor(), 4_000);
    assert_eq!(h.sim_operations(&record, SimKind::Refund), 1);
    h.finish().await;
}

#[tokio::test]
async fn without_a_lookup_the_sweep_resends_under_the_same_key_sqlite() {
    no_lookup_resends_under_the_key(Backend::Sqlite).await;
}

#[tokio::test]
async fn without_a_lookup_the_sweep_resends_under_the_same_key_postgres() {
    no_lookup_resends_under_the_key(Backend::Postgres).await;
}
