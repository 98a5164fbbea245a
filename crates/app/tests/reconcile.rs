//! The reconciler against a real simulator over HTTP, on both backends, with no webhook ever
//! delivered (the worker is not running here: everything converges through the sweep alone):
//! a refund made in the provider's dashboard is found (not while its tenant is paused for a move
//! between cells), posted once and listed as an auto-resolved exception, and a second sweep
//! changes nothing; 100 mixed payments (ok, declined, timeout, redirect completed) converge to
//! the provider's truth (not while their tenant is paused); an amount changed at the provider
//! becomes an open manual exception that moves no money and that a person resolves; a charge
//! naming no payment of ours lands in the platform scope; a charge the provider never got expires;
//! a request that died mid-flight has its key finished; one sweep at a time holds the lease.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use asiento_app::clock::SystemClock;
use asiento_app::exceptions::{self, ExceptionError, Scope as ExceptionScope};
use asiento_app::log;
use asiento_app::payments::{CellPlace, NewPayment};
use asiento_app::reconcile::{acquire_job, Reconciler, ReconcilerConfig, RECONCILER_JOB};
use asiento_app::reply::Answer;
use asiento_domain::exception::{ExceptionRejection, ExceptionStatus};
use asiento_domain::{
    Amount, CaptureMode, CellNumber, Currency, CustomerId, ExceptionId, PaymentEvent, PaymentId,
    PaymentStatus, ProviderName, TenantId,
};
use asiento_psp::{Charge, ChargeStatus, ClientConfig};
use asiento_psp_sim::SimConfig;
use serde_json::{json, Value};

mod common;

use common::{create_request, Backend, PaymentRig};

fn config() -> ReconcilerConfig {
    ReconcilerConfig {
        // Everything is stale at once, and reports reach up to now.
        pending_timeout_ms: 0,
        report_settle_ms: 0,
        ..ReconcilerConfig::default()
    }
}

impl PaymentRig {
    async fn for_reconcile(backend: Backend) -> PaymentRig {
        let client = ClientConfig {
            // pm_card_timeout hangs: give up fast, the sweep settles it (not so fast that a
            // loaded test machine turns ordinary lookups into timeouts).
            request_timeout_ms: 1_000,
            attempts_max: 1,
            ..ClientConfig::default()
        };
        PaymentRig::start(
            backend,
            SimConfig {
                seed: 11,
                ..SimConfig::default()
            },
            client,
            Arc::new(SystemClock),
        )
        .await
    }

    fn reconciler(&self) -> Reconciler {
        Reconciler::new(self.flow.clone(), config())
    }

    /// The reconciler of the home cell of a deployment of cells, with `tenant` paused for a move.
    fn reconciler_with_paused(&self, tenant: &str) -> Reconciler {
        let place = CellPlace {
            number: CellNumber::new(1).unwrap(),
            home: true,
            moved_out: Vec::new(),
            paused: vec![TenantId::parse(tenant).unwrap()],
        };
        Reconciler::new(self.flow.clone().in_cell(place), config())
    }

    fn new_payment(method: &str, amount: i64) -> NewPayment {
        NewPayment {
            tenant: TenantId::parse("acme").unwrap(),
            amount: Amount::new(amount),
            currency: Currency::parse("USD").unwrap(),
            customer: CustomerId::parse("42").unwrap(),
            provider: ProviderName::parse("sim").unwrap(),
            payment_method: method.to_owned(),
            capture_mode: CaptureMode::Automatic,
            description: None,
            metadata: serde_json::Map::new(),
        }
    }

    /// A payment whose charge never reached the provider: every call fails. Half the failures
    /// happen after the effect (the provider charged, then answered 500), so payments are made
    /// until one really never reached it.
    async fn never_sent(&self, amount: i64) -> PaymentId {
        self.served
            .sim
            .set_faults(&serde_json::from_value(json!({"error_rate": 1.0})).unwrap())
            .unwrap();
        let mut never_sent = None;
        for _ in 0..40 {
            let id = self.create("pm_card_ok", amount).await;
            let reference = id.to_string();
            if !self
                .served
                .sim
                .charges()
                .iter()
                .any(|c| c.reference.as_deref() == Some(reference.as_str()))
            {
                never_sent = Some(id);
                break;
            }
        }
        self.served
            .sim
            .set_faults(&serde_json::from_value(json!({"error_rate": 0.0})).unwrap())
            .unwrap();
        never_sent.expect("a charge that never reached the provider")
    }

    /// A create request for `payment` under `key` whose work has begun and not finished: its key
    /// in flight under a lease of `lease_ms` from now (negative: already run out).
    async fn claim_creation(
        &self,
        key: &str,
        payment: PaymentId,
        lease_ms: i64,
    ) -> asiento_app::payments::Idempotent {
        let request = create_request(key);
        let mut tx = self.db.database().begin().await.unwrap();
        let claim = asiento_app::idempotency::claim(
            &mut tx,
            &request.scope,
            &request.key,
            request.body,
            &payment.to_string(),
            self.flow.clock().now_ms(),
            lease_ms,
        )
        .await
        .unwrap();
        assert!(matches!(
            claim,
            asiento_app::idempotency::Claim::Fresh { .. }
        ));
        tx.commit().await.unwrap();
        request
    }

    async fn create(&self, method: &str, amount: i64) -> PaymentId {
        let key = uuid::Uuid::new_v4().to_string();
        let answer = self
            .flow
            .create(&create_request(&key), Self::new_payment(method, amount))
            .await
            .unwrap();
        let Answer::Done(response) = answer else {
            panic!("unexpected answer {answer:?}")
        };
        let body: Value = serde_json::from_slice(&response.body).unwrap();
        PaymentId::parse(body["id"].as_str().unwrap()).unwrap()
    }

    fn charge_of(&self, payment: PaymentId) -> Charge {
        let reference = payment.to_string();
        self.served
            .sim
            .charges()
            .into_iter()
            .find(|charge| charge.reference.as_deref() == Some(reference.as_str()))
            .unwrap()
    }

    async fn status(&self, payment: PaymentId) -> PaymentStatus {
        self.record(payment).await.status
    }

    async fn record(&self, payment: PaymentId) -> asiento_domain::PaymentRecord {
        log::load_payment(self.flow.store().as_ref(), payment)
            .await
            .unwrap()
            .aggregate
            .record
            .unwrap()
    }

    async fn events(&self, payment: PaymentId) -> Vec<PaymentEvent> {
        log::load_payment(self.flow.store().as_ref(), payment)
            .await
            .unwrap()
            .events
            .into_iter()
            .map(|(_, event)| event)
            .collect()
    }

    /// A POST to the simulator over plain HTTP/1.1 (its control routes).
    async fn sim_post(&self, path: &str, body: Value) -> (u16, Value) {
        common::sim_post(self.served.addr, path, &body).await
    }

    async fn open_exceptions(&self, scope: ExceptionScope) -> Vec<exceptions::ExceptionView> {
        exceptions::list(self.db.database(), &scope, Some(ExceptionStatus::Open), 500)
            .await
            .unwrap()
    }

    async fn all_exceptions(&self) -> Vec<exceptions::ExceptionView> {
        exceptions::list(self.db.database(), &ExceptionScope::All, None, 500)
            .await
            .unwrap()
    }
}

fn acme() -> ExceptionScope {
    ExceptionScope::Tenant(TenantId::parse("acme").unwrap())
}

// ------------------------------------------------------------------------ out-of-band refund

async fn out_of_band_refund(backend: Backend) {
    let h = PaymentRig::for_reconcile(backend).await;
    let id = h.create("pm_card_ok", 10_000).await;
    assert_eq!(h.status(id).await, PaymentStatus::Captured);
    let charge = h.charge_of(id);
    let (status, _) = h
        .sim_post(
            &format!("/sim/charges/{}/refund_out_of_band", charge.id),
            json!({"amount_minor": 2_500}),
        )
        .await;
    assert_eq!(status, 200);

    // While its tenant is paused for a move between cells, nothing is written for the payment:
    // its report line waits for a sweep after the pause.
    let before = h.events(id).await.len();
    h.log_readable().await;
    let paused = h.reconciler_with_paused("acme").sweep_once().await.unwrap();
    assert_eq!(paused.exceptions_total(), 0, "{paused}");
    assert_eq!(h.events(id).await.len(), before);
    assert!(h.all_exceptions().await.is_empty());

    let reconciler = h.reconciler();
    h.log_readable().await;
    let summary = reconciler.sweep_once().await.unwrap();
    assert_eq!(summary.exceptions_total(), 1, "{summary}");
    let record = h.record(id).await;
    assert_eq!(record.status, PaymentStatus::PartiallyRefunded);
    assert_eq!(record.refunded, Amount::new(2_500));
    let events = h.events(id).await;
    let refunds = events
        .iter()
        .filter(|e| matches!(e, PaymentEvent::RefundSettled(_)))
        .count();
    let entries = events
        .iter()
        .filter(|e| matches!(e, PaymentEvent::EntryPosted(_)))
        .count();
    assert_eq!((refunds, entries), (1, 2), "capture + refund entries");

    let listed = h.all_exceptions().await;
    assert_eq!(listed.len(), 1);
    let exception = &listed[0];
    assert_eq!(exception.kind, "refunded_out_of_band");
    assert_eq!(exception.resolution, "auto");
    assert_eq!(exception.status, "resolved");
    assert_eq!(
        exception.payment_id.as_deref(),
        Some(id.to_string().as_str())
    );
    assert_eq!(exception.difference["refunded_minor"], json!(2_500));
    assert!(h.open_exceptions(acme()).await.is_empty());

    // Again: nothing new, anywhere.
    let version = events.len();
    h.log_readable().await;
    let again = reconciler.sweep_once().await.unwrap();
    assert_eq!(again.exceptions_total(), 0, "{again}");
    assert_eq!(h.events(id).await.len(), version);
    assert_eq!(h.all_exceptions().await.len(), 1);
    // A fresh reconciler (no cursor in memory, same database) agrees.
    h.log_readable().await;
    let third = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(third.exceptions_total(), 0, "{third}");
    assert_eq!(h.events(id).await.len(), version);
    h.finish().await;
}

#[tokio::test]
async fn out_of_band_refund_is_posted_once_and_auto_resolved_sqlite() {
    out_of_band_refund(Backend::Sqlite).await;
}

#[tokio::test]
async fn out_of_band_refund_is_posted_once_and_auto_resolved_postgres() {
    out_of_band_refund(Backend::Postgres).await;
}

// ------------------------------------------------------------------------ convergence

async fn convergence(backend: Backend) {
    let h = PaymentRig::for_reconcile(backend).await;
    let methods = [
        "pm_card_ok",
        "pm_card_declined",
        "pm_card_timeout",
        "pm_redirect",
    ];
    let mut payments = Vec::new();
    for i in 0..100 {
        let method = methods[i % methods.len()];
        payments.push((h.create(method, 1_000 + i as i64).await, method));
    }
    // Customers finish their redirects at the provider; no webhook reaches us.
    for (i, (id, method)) in payments.iter().enumerate() {
        if *method == "pm_redirect" {
            let charge = h.charge_of(*id);
            let result = if i % 8 == 3 { "succeeded" } else { "failed" };
            let (status, _) = h
                .sim_post(
                    &format!("/sim/charges/{}/complete", charge.id),
                    json!({ "result": result }),
                )
                .await;
            assert_eq!(status, 200);
        }
    }
    // Paused for a move between cells, the tenant's stale payments are left as they are.
    let mut versions = Vec::new();
    for (id, _) in &payments {
        versions.push(h.events(*id).await.len());
    }
    h.log_readable().await;
    let paused = h.reconciler_with_paused("acme").sweep_once().await.unwrap();
    assert_eq!((paused.settled, paused.expired), (0, 0), "{paused}");
    for ((id, method), version) in payments.iter().zip(versions) {
        assert_eq!(h.events(*id).await.len(), version, "{id} ({method})");
    }
    h.log_readable().await;
    let summary = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(summary.errors, 0, "{summary}");
    for (id, method) in &payments {
        let charge = h.charge_of(*id);
        let expected = match charge.status {
            ChargeStatus::Succeeded => PaymentStatus::Captured,
            ChargeStatus::Failed => PaymentStatus::Failed,
            other => panic!("{method}: the provider left {other:?}"),
        };
        let record = h.record(*id).await;
        assert_eq!(record.status, expected, "{id} ({method})");
        if expected == PaymentStatus::Captured {
            assert_eq!(record.captured.minor(), charge.amount_captured);
        }
        assert!(!record.needs_review(), "{id} ({method}) flagged");
    }
    // Converged: a second sweep has nothing to do.
    h.log_readable().await;
    let again = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(
        (again.settled, again.expired, again.exceptions_total()),
        (0, 0, 0),
        "{again}"
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_payments_converge_through_the_sweep_alone_sqlite() {
    convergence(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_payments_converge_through_the_sweep_alone_postgres() {
    convergence(Backend::Postgres).await;
}

// ------------------------------------------------------------------------ amount mismatch

async fn amount_mismatch(backend: Backend) {
    let h = PaymentRig::for_reconcile(backend).await;
    let id = h.create("pm_card_ok", 10_000).await;
    let charge = h.charge_of(id);
    let before = h.events(id).await;
    let (status, _) = h
        .sim_post(
            &format!("/sim/charges/{}/amount", charge.id),
            json!({"amount_minor": 9_999}),
        )
        .await;
    assert_eq!(status, 200);
    h.log_readable().await;
    let summary = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(summary.flagged, 1, "{summary}");

    let open = h.open_exceptions(acme()).await;
    assert_eq!(open.len(), 1);
    let exception = &open[0];
    assert_eq!(exception.kind, "amount_mismatch");
    assert_eq!(exception.resolution, "manual");
    assert_eq!(exception.difference["amount_minor"], json!(-1));
    assert_eq!(exception.local["amount_minor"], json!(10_000));
    assert_eq!(exception.provider_state["amount_minor"], json!(9_999));
    // No money moved: the only new event is the review flag.
    let after = h.events(id).await;
    assert_eq!(after.len(), before.len() + 1);
    assert!(matches!(
        after.last(),
        Some(PaymentEvent::FlaggedForReview(_))
    ));
    let record = h.record(id).await;
    assert_eq!(record.captured, Amount::new(10_000));
    assert!(record.needs_review());

    // The same sweep again records nothing and flags nothing twice.
    h.log_readable().await;
    let again = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(again.exceptions_total(), 0, "{again}");
    assert_eq!(h.events(id).await.len(), after.len());

    // Another tenant cannot see or resolve it; acme can, once.
    let exception_id = ExceptionId::parse(&exception.id).unwrap();
    let other = ExceptionScope::Tenant(TenantId::parse("globex").unwrap());
    assert!(h.open_exceptions(other.clone()).await.is_empty());
    let store = h.flow.store().clone();
    let refused = exceptions::resolve(
        h.db.database(),
        store.as_ref(),
        &other,
        exception_id,
        "not mine".into(),
        chrono::Utc::now(),
    )
    .await;
    assert!(matches!(
        refused,
        Err(ExceptionError::Rejected(ExceptionRejection::NotFound))
    ));
    let resolved = exceptions::resolve(
        h.db.database(),
        store.as_ref(),
        &acme(),
        exception_id,
        "the provider fixed its amount".into(),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    assert_eq!(resolved.status, "resolved");
    assert_eq!(
        resolved.note.as_deref(),
        Some("the provider fixed its amount")
    );
    assert!(h.open_exceptions(acme()).await.is_empty());
    let twice = exceptions::resolve(
        h.db.database(),
        store.as_ref(),
        &acme(),
        exception_id,
        "again".into(),
        chrono::Utc::now(),
    )
    .await;
    assert!(matches!(
        twice,
        Err(ExceptionError::Rejected(
            ExceptionRejection::AlreadyResolved
        ))
    ));
    h.finish().await;
}

#[tokio::test]
async fn an_amount_mismatch_is_an_open_manual_exception_that_moves_no_money_sqlite() {
    amount_mismatch(Backend::Sqlite).await;
}

#[tokio::test]
async fn an_amount_mismatch_is_an_open_manual_exception_that_moves_no_money_postgres() {
    amount_mismatch(Backend::Postgres).await;
}

// ------------------------------------------------------------------------ the rest

async fn unknown_expired_stuck_and_lease(backend: Backend) {
    let h = PaymentRig::for_reconcile(backend).await;
    // A charge made at the provider by someone else: no payment of ours.
    let (status, _) = h
        .sim_post(
            "/v1/charges",
            json!({"amount_minor": 700, "currency": "USD", "payment_method": "pm_card_ok",
                   "capture": true, "reference": "order-77"}),
        )
        .await;
    assert!(
        status == 200 || status == 201,
        "the simulator took the foreign charge: {status}"
    );

    // A payment whose charge never reached the provider.
    let never_sent = h.never_sent(1_234).await;
    assert_eq!(h.status(never_sent).await, PaymentStatus::Pending);

    // A request that died after its intent: its key is in flight past its lease. (The payment's
    // own request answered 202 pending; this second key stands for a request whose process died
    // before it could answer.)
    let died = h.create("pm_card_timeout", 4_321).await;
    assert_eq!(h.status(died).await, PaymentStatus::Pending);
    let stuck = h.claim_creation("died-mid-flight", died, -1).await;

    // Another process holds the sweep lease: this sweep does nothing.
    let holder = uuid::Uuid::new_v4();
    let now_ms = h.flow.clock().now_ms();
    acquire_job(h.db.database(), RECONCILER_JOB, holder, now_ms, 60_000)
        .await
        .unwrap()
        .unwrap();
    h.log_readable().await;
    let busy = h.reconciler().sweep_once().await.unwrap();
    assert!(busy.lease_busy);
    assert_eq!(h.status(never_sent).await, PaymentStatus::Pending);
    asiento_app::reconcile::release_job(h.db.database(), RECONCILER_JOB, holder)
        .await
        .unwrap();

    h.log_readable().await;

    let summary = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(
        h.status(never_sent).await,
        PaymentStatus::Expired,
        "{summary}"
    );
    assert_eq!(h.status(died).await, PaymentStatus::Captured, "{summary}");
    assert_eq!(summary.keys_finished, 1, "{summary}");
    let mut tx = h.db.database().begin().await.unwrap();
    let replay = asiento_app::idempotency::claim(
        &mut tx,
        &stuck.scope,
        &stuck.key,
        stuck.body,
        "unused",
        h.flow.clock().now_ms(),
        60_000,
    )
    .await
    .unwrap();
    drop(tx);
    let asiento_app::idempotency::Claim::Completed(response) = replay else {
        panic!("the stuck key was not finished: {replay:?}")
    };
    let body: Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(body["status"], json!("captured"));

    let platform = h.open_exceptions(ExceptionScope::Platform).await;
    assert_eq!(platform.len(), 1, "{platform:?}");
    assert_eq!(platform[0].kind, "unknown_charge");
    assert_eq!(platform[0].tenant, None);
    // Platform exceptions are not any tenant's.
    assert!(h
        .open_exceptions(acme())
        .await
        .iter()
        .all(|e| e.kind != "unknown_charge"));
    h.finish().await;
}

#[tokio::test]
async fn unknown_charges_expiry_and_the_sweep_lease_sqlite() {
    unknown_expired_stuck_and_lease(Backend::Sqlite).await;
}

#[tokio::test]
async fn unknown_charges_expiry_and_the_sweep_lease_postgres() {
    unknown_expired_stuck_and_lease(Backend::Postgres).await;
}

/// More abandoned redirects than one sweep looks at must not hide a payment the provider
/// charged: the sweep visits the watch list in rotation (least recently checked first, the newest
/// first among those never checked), so the charged one is resolved within two sweeps.
async fn abandoned_redirects_do_not_starve_the_sweep(backend: Backend) {
    let h = PaymentRig::for_reconcile(backend).await;
    let abandoned =
        usize::try_from(asiento_app::reconcile::STALE_PAYMENTS_PER_SWEEP_MAX).unwrap() * 2;
    for i in 0..abandoned {
        h.create("pm_redirect", 1_000 + i as i64).await;
    }
    // Charged at the provider; our answer was lost, so the payment stays pending.
    let charged = h.create("pm_card_timeout", 4_200).await;
    assert_eq!(h.status(charged).await, PaymentStatus::Pending);
    // The settlement report would find the charge too: its window ends before any of these
    // payments, so only the stale sweep can resolve it.
    let config = ReconcilerConfig {
        report_settle_ms: 3_600_000,
        ..config()
    };
    let mut resolved_in = None;
    for sweep in 1..=2 {
        let summary = Reconciler::new(h.flow.clone(), config.clone())
            .sweep_once()
            .await
            .unwrap();
        assert_eq!(summary.errors, 0, "{summary}");
        if h.status(charged).await == PaymentStatus::Captured {
            resolved_in = Some(sweep);
            break;
        }
    }
    assert!(
        resolved_in.is_some(),
        "the charged payment is still pending after two sweeps"
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_redirects_do_not_starve_the_sweep_sqlite() {
    abandoned_redirects_do_not_starve_the_sweep(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_redirects_do_not_starve_the_sweep_postgres() {
    abandoned_redirects_do_not_starve_the_sweep(Backend::Postgres).await;
}

/// A payment the provider has not got is not expired while a request creating it still runs
/// (its key in flight under a live lease): that request may yet reach the provider, and a charge
/// on an expired payment would be money nobody books. Once the lease runs out, the sweep settles
/// it (the stuck key is resumed, or the payment expires).
async fn a_payment_whose_creation_still_runs_is_not_expired(backend: Backend) {
    let h = PaymentRig::for_reconcile(backend).await;
    let never_sent = h.never_sent(1_111).await;
    // A request creating it that is still running: its key is in flight for two more seconds.
    h.claim_creation("still-running", never_sent, 2_000).await;
    let eager = ReconcilerConfig {
        interval_ms: 0,
        ..config()
    };
    let summary = Reconciler::new(h.flow.clone(), eager.clone())
        .sweep_once()
        .await
        .unwrap();
    assert_eq!(summary.errors, 0, "{summary}");
    assert_eq!(
        h.status(never_sent).await,
        PaymentStatus::Pending,
        "expired while its creation runs: {summary}"
    );

    tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;
    let summary = Reconciler::new(h.flow.clone(), eager)
        .sweep_once()
        .await
        .unwrap();
    assert_eq!(summary.errors, 0, "{summary}");
    let settled = h.status(never_sent).await;
    assert!(
        matches!(settled, PaymentStatus::Expired | PaymentStatus::Captured),
        "{settled:?}: {summary}"
    );
    h.finish().await;
}

#[tokio::test]
async fn a_payment_whose_creation_still_runs_is_not_expired_sqlite() {
    a_payment_whose_creation_still_runs_is_not_expired(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_payment_whose_creation_still_runs_is_not_expired_postgres() {
    a_payment_whose_creation_still_runs_is_not_expired(Backend::Postgres).await;
}

/// A redirect nobody finishes is cancelled at the provider and expires once the timeout for
/// customer action has passed; one the customer finished meanwhile is settled instead.
async fn abandoned_redirects_are_cancelled_and_expire(backend: Backend) {
    let h = PaymentRig::for_reconcile(backend).await;
    let abandoned = h.create("pm_redirect", 1_000).await;
    let finished = h.create("pm_redirect", 2_000).await;
    let charge = h.charge_of(finished);
    let (status, _) = h
        .sim_post(
            &format!("/sim/charges/{}/complete", charge.id),
            json!({"result": "succeeded"}),
        )
        .await;
    assert_eq!(status, 200);
    // Not yet past the timeout: nothing is cancelled.
    // Each sweep looks at every watched payment again (no pause between visits).
    let patient = ReconcilerConfig {
        report_settle_ms: 3_600_000,
        interval_ms: 0,
        ..config()
    };
    Reconciler::new(h.flow.clone(), patient.clone())
        .sweep_once()
        .await
        .unwrap();
    assert_eq!(h.status(abandoned).await, PaymentStatus::RequiresAction);
    assert_eq!(h.charge_of(abandoned).status, ChargeStatus::RequiresAction);

    let impatient = ReconcilerConfig {
        requires_action_timeout_ms: 0,
        ..patient
    };
    // Under load a sweep may leave either to the next (its lease held by the webhook worker, the
    // provider's answer to the cancel or the lookup too slow): a few sweeps, never an error.
    let sweeper = Reconciler::new(h.flow.clone(), impatient);
    for _ in 0..20 {
        let summary = sweeper.sweep_once().await.unwrap();
        assert_eq!(summary.errors, 0, "{summary}");
        if h.status(abandoned).await == PaymentStatus::Expired
            && h.status(finished).await == PaymentStatus::Captured
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(h.status(abandoned).await, PaymentStatus::Expired);
    assert_eq!(h.charge_of(abandoned).status, ChargeStatus::Failed);
    assert_eq!(h.status(finished).await, PaymentStatus::Captured);
    h.finish().await;
}

#[tokio::test]
async fn abandoned_redirects_are_cancelled_and_expire_sqlite() {
    abandoned_redirects_are_cancelled_and_expire(Backend::Sqlite).await;
}

#[tokio::test]
async fn abandoned_redirects_are_cancelled_and_expire_postgres() {
    abandoned_redirects_are_cancelled_and_expire(Backend::Postgres).await;
}

/// A rig whose simulator reports in slices of `report_slice` (none: whole windows), at most
/// `report_lines_max` lines a request.
async fn rig_with_reports(
    backend: Backend,
    report_slice: Option<std::time::Duration>,
    report_lines_max: usize,
) -> PaymentRig {
    let client = ClientConfig {
        capabilities: asiento_psp::Capabilities {
            report_slice,
            ..asiento_psp::Capabilities::SIM
        },
        report_lines_max,
        attempts_max: 1,
        ..ClientConfig::default()
    };
    PaymentRig::start(
        backend,
        SimConfig {
            seed: 11,
            ..SimConfig::default()
        },
        client,
        Arc::new(SystemClock),
    )
    .await
}

/// A report window is asked for a slice at a time (the provider's `report_slice`), so that one
/// request's lines are all the sweep holds at once, and a quiet window takes few requests: the
/// first slice is the provider's, each next one at most twice as long as the one before (here,
/// with one line in the window, exactly twice), the slices follow each other without a gap from
/// the window's start to its end, a difference in the last one is found, and the next sweep
/// starts from the cursor the slices moved.
async fn report_in_slices(backend: Backend) {
    let slice = std::time::Duration::from_secs(2);
    let h = rig_with_reports(
        backend,
        Some(slice),
        ClientConfig::default().report_lines_max,
    )
    .await;
    let id = h.create("pm_card_ok", 10_000).await;
    let charge = h.charge_of(id);
    let (status, _) = h
        .sim_post(
            &format!("/sim/charges/{}/amount", charge.id),
            json!({"amount_minor": 9_999}),
        )
        .await;
    assert_eq!(status, 200);
    h.log_readable().await;
    let sliced = ReconcilerConfig {
        report_lookback_ms: 15_000,
        report_overlap_ms: 3_000,
        ..config()
    };
    let started = chrono::Utc::now();
    let summary = Reconciler::new(h.flow.clone(), sliced.clone())
        .sweep_once()
        .await
        .unwrap();
    assert_eq!(summary.flagged, 1, "{summary}");
    let windows = h.served.sim.report_windows();
    // 2 s, 4 s, 8 s, then the rest of the 15 s.
    assert_eq!(windows.len(), 4, "{windows:?}");
    let length =
        |(from, to): &(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)| *to - *from;
    assert_eq!(
        length(&windows[0]),
        chrono::Duration::from_std(slice).unwrap()
    );
    for pair in windows.windows(2) {
        assert_eq!(
            pair[0].1, pair[1].0,
            "slices follow each other: {windows:?}"
        );
        assert!(length(&pair[1]) <= length(&pair[0]) * 2, "{windows:?}");
    }
    let (first, last) = (windows[0].0, windows[windows.len() - 1].1);
    assert!(first <= started - chrono::Duration::seconds(14), "{first}");
    assert!(last >= started, "{last}");

    // The next sweep reaches back from the cursor by the overlap, no further.
    let summary = Reconciler::new(h.flow.clone(), sliced)
        .sweep_once()
        .await
        .unwrap();
    assert_eq!(summary.exceptions_total(), 0, "{summary}");
    let again = &h.served.sim.report_windows()[windows.len()..];
    assert!(!again.is_empty());
    assert_eq!(again[0].0, last - chrono::Duration::seconds(3), "{again:?}");
    h.finish().await;
}

#[tokio::test]
async fn a_report_window_is_compared_a_slice_at_a_time_sqlite() {
    report_in_slices(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_report_window_is_compared_a_slice_at_a_time_postgres() {
    report_in_slices(Backend::Postgres).await;
}

/// One report line that differs from its payment in two ways (a refund made in the provider's
/// dashboard and a dispute whose webhooks never came) has both applied in one sweep: a verdict
/// brings one kind of difference in line, and the line is compared again after it. Found by the
/// simulation (a payment left without its dispute once the cursor moved past its line).
async fn two_differences_on_one_line(backend: Backend) {
    let h = PaymentRig::for_reconcile(backend).await;
    let id = h.create("pm_card_ok", 10_000).await;
    let charge = h.charge_of(id);
    for (path, body) in [
        ("refund_out_of_band", json!({"amount_minor": 2_500})),
        ("dispute", json!({})),
    ] {
        let (status, answer) = h
            .sim_post(&format!("/sim/charges/{}/{path}", charge.id), body)
            .await;
        assert_eq!(status, 200, "{path}: {answer}");
    }
    h.log_readable().await;
    let summary = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(summary.exceptions_total(), 2, "{summary}");
    let record = h.record(id).await;
    assert_eq!(record.refunded, Amount::new(2_500));
    assert_eq!(record.status, PaymentStatus::Disputed);
    assert!(record.dispute.is_some());
    h.finish().await;
}

#[tokio::test]
async fn a_line_with_two_differences_has_both_applied_in_one_sweep_sqlite() {
    two_differences_on_one_line(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_line_with_two_differences_has_both_applied_in_one_sweep_postgres() {
    two_differences_on_one_line(Backend::Postgres).await;
}

/// A provider that tells so many lines of a report at most (the simulator's `limit`) ends the
/// report early, where the first line left out was touched: the sweep asks for the rest from
/// there, so however many lines a window holds, one request's are all it holds at once, and
/// every line is compared once.
async fn report_lines_at_most(backend: Backend) {
    let h = rig_with_reports(backend, None, 2).await;
    let mut paid = Vec::new();
    for _ in 0..5 {
        paid.push(h.create("pm_card_ok", 10_000).await);
    }
    let last = h.charge_of(paid[4]);
    let (status, _) = h
        .sim_post(
            &format!("/sim/charges/{}/amount", last.id),
            json!({"amount_minor": 9_999}),
        )
        .await;
    assert_eq!(status, 200);
    h.log_readable().await;
    let config = ReconcilerConfig {
        report_lookback_ms: 60_000,
        ..config()
    };
    let summary = Reconciler::new(h.flow.clone(), config)
        .sweep_once()
        .await
        .unwrap();
    assert_eq!(summary.report_lines, 5, "{summary}");
    assert_eq!(summary.flagged, 1, "{summary}");
    let windows = h.served.sim.report_windows();
    assert!(windows.len() >= 3, "5 lines, 2 a request: {windows:?}");
    // Each request asks for the rest of the window from where the one before ended.
    for pair in windows.windows(2) {
        assert!(
            pair[0].0 < pair[1].0 && pair[1].0 < pair[0].1,
            "{windows:?}"
        );
        assert_eq!(pair[0].1, pair[1].1, "{windows:?}");
    }
    h.finish().await;
}

#[tokio::test]
async fn a_report_longer_than_a_request_brings_is_asked_for_in_parts_sqlite() {
    report_lines_at_most(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_report_longer_than_a_request_brings_is_asked_for_in_parts_postgres() {
    report_lines_at_most(Backend::Postgres).await;
}
