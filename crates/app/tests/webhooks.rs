//! The webhook inbox and worker against a real simulator over HTTP, on both backends: the race
//! between the synchronous finalisation and the webhook, 200 mixed payments under duplicated and
//! reordered delivery checked against the provider's truth, redelivery, out-of-order and
//! cumulative facts, dead letters, two workers draining one inbox, and the payment lease.
//!
//! Events are taken from the simulator's record (`Simulator::events`) and delivered through the
//! same `WebhookReceiver::receive` the HTTP handler calls, signed as the provider signs them; the
//! duplicate and reorder faults are applied here, seeded, so a failing run replays. The HTTP hop
//! itself is tested in `asiento-api` (handler) and `asiento-cli` (black box).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use asiento_app::clock::{Clock, ManualClock, SystemClock};
use asiento_app::leases;
use asiento_app::log;
use asiento_app::payments::{Finalize, NewPayment, PaymentFlow};
use asiento_app::providers::Providers;
use asiento_app::reply::Answer;
use asiento_app::webhooks::{
    dead_letters, inbox_counts, pending_count, DeadReason, DrainReport, WebhookReceiver,
    WebhookSecrets, Worker, WorkerConfig,
};
use asiento_domain::{
    Amount, CaptureMode, Currency, CustomerId, FeeSchedule, PaymentEvent, PaymentId, PaymentRecord,
    PaymentStatus, ProviderName, TenantId,
};
use asiento_eventstore::Database;
use asiento_psp::{Charge, ChargeStatus, ClientConfig, WebhookEvent};
use asiento_psp_sim::FaultsPatch;
use asiento_psp_sim::SimConfig;
use asiento_testkit::Rng;
use serde_json::{json, Value};

mod common;

use common::{create_request, Backend, PaymentRig, TestDatabase, FEE_BPS};

const SECRET: &str = "whsec_test_sim";
const OTHER_SECRET: &str = "whsec_test_other";

impl PaymentRig {
    async fn for_webhooks(backend: Backend, clock: Arc<dyn Clock>) -> PaymentRig {
        let sim = SimConfig {
            webhook_secret: SECRET.to_owned(),
            seed: 7,
            ..SimConfig::default()
        };
        PaymentRig::start(backend, sim, ClientConfig::default(), clock).await
    }

    /// The webhook receiver of the process the flow runs in: it knows the simulator's secret and
    /// another provider's.
    fn receiver(&self) -> WebhookReceiver {
        WebhookReceiver {
            database: self.db.database().clone(),
            writer: self.flow.writer().clone(),
            secrets: format!("sim:{SECRET},other:{OTHER_SECRET}")
                .parse::<WebhookSecrets>()
                .unwrap(),
            clock: self.flow.clock().clone(),
            tolerance_s: asiento_app::webhooks::TOLERANCE_S_DEFAULT,
        }
    }

    fn worker(&self, config: WorkerConfig) -> Worker {
        Worker::new(self.flow.clone(), config)
    }

    /// Creates a payment through the synchronous path; returns its id and the rendered answer.
    async fn create(&self, method: &str, amount: i64, capture: CaptureMode) -> (PaymentId, Value) {
        let request = create_request(&uuid::Uuid::new_v4().to_string());
        let payment = NewPayment {
            tenant: TenantId::parse("acme").unwrap(),
            amount: Amount::new(amount),
            currency: Currency::parse("USD").unwrap(),
            customer: CustomerId::parse("42").unwrap(),
            provider: ProviderName::parse("sim").unwrap(),
            payment_method: method.to_owned(),
            capture_mode: capture,
            description: None,
            metadata: serde_json::Map::new(),
        };
        let answer = self.flow.create(&request, payment).await.unwrap();
        let Answer::Done(response) = answer else {
            panic!("unexpected answer {answer:?}")
        };
        let body: Value = serde_json::from_slice(&response.body).unwrap();
        let id = PaymentId::parse(body["id"].as_str().unwrap()).unwrap();
        (id, body)
    }

    /// Delivers one event as the provider would: its body signed now.
    async fn deliver_as(&self, provider: &str, secret: &str, event: &WebhookEvent) -> bool {
        let body = serde_json::to_vec(event).unwrap();
        let t = self.receiver().clock.now_ms() / 1000;
        let signature = asiento_psp::sign(secret, t, &body);
        self.receiver()
            .receive(provider, Some(&signature), &body)
            .await
            .unwrap()
            .duplicate
    }

    async fn deliver(&self, event: &WebhookEvent) -> bool {
        self.deliver_as("sim", SECRET, event).await
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

    /// A control route of the simulator (`/sim/…`), over plain HTTP/1.1.
    async fn sim_post(&self, path: &str, body: &Value) -> Value {
        let (status, payload) = common::sim_post(self.served.addr, path, body).await;
        assert_eq!(status, 200, "{path}: {payload}");
        payload
    }

    async fn load(
        &self,
        payment: PaymentId,
    ) -> (PaymentRecord, Vec<PaymentEvent>, Vec<Option<String>>) {
        let loaded = log::load_payment(self.flow.store().as_ref(), payment)
            .await
            .unwrap();
        let keys = loaded
            .events
            .iter()
            .map(|(raw, _)| raw.metadata.idempotency_key.clone())
            .collect();
        let events = loaded.events.into_iter().map(|(_, event)| event).collect();
        (loaded.aggregate.record.unwrap(), events, keys)
    }

    /// Drains until nothing is pending, waiting out short backoffs.
    async fn drain_all(&self, workers: &[Worker]) -> DrainReport {
        let mut total = DrainReport::default();
        for _ in 0..10_000 {
            for worker in workers {
                let report = worker.drain().await.unwrap();
                add(&mut total, &report);
            }
            if inbox_counts(self.db.database()).await.unwrap().pending == 0 {
                return total;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the inbox never drained: {total:?}");
    }

    /// The payment agrees with the provider's charge: state, amounts, and exactly the postings
    /// the provider's truth implies (so nothing posted twice and nothing lost).
    async fn check_against_provider(&self, payment: PaymentId) {
        let charge = self.charge_of(payment);
        let (record, events, _) = self.load(payment).await;
        let expected_status = match charge.status {
            ChargeStatus::Failed => PaymentStatus::Failed,
            ChargeStatus::RequiresAction => PaymentStatus::RequiresAction,
            ChargeStatus::RequiresCapture => PaymentStatus::Authorized,
            ChargeStatus::Succeeded if charge.amount_refunded == 0 => PaymentStatus::Captured,
            ChargeStatus::Succeeded if charge.amount_refunded < charge.amount_captured => {
                PaymentStatus::PartiallyRefunded
            }
            ChargeStatus::Succeeded => PaymentStatus::Refunded,
        };
        assert_eq!(record.status, expected_status, "{payment}: {charge:?}");
        assert_eq!(record.captured.minor(), charge.amount_captured, "{payment}");
        assert_eq!(record.refunded.minor(), charge.amount_refunded, "{payment}");
        assert!(record.flags.is_empty(), "{payment}: {:?}", record.flags);
        assert_eq!(
            record.next_action.is_some(),
            charge.status == ChargeStatus::RequiresAction
        );

        let captures = events
            .iter()
            .filter(|e| matches!(e, PaymentEvent::ChargeCaptured(_)))
            .count();
        assert_eq!(
            captures,
            usize::from(charge.amount_captured > 0),
            "{payment}"
        );

        let mut balances: BTreeMap<String, i64> = BTreeMap::new();
        let mut entry_ids = BTreeSet::new();
        for event in &events {
            if let PaymentEvent::EntryPosted(posted) = event {
                assert!(
                    entry_ids.insert(posted.entry.id()),
                    "{payment}: entry twice"
                );
                for leg in posted.entry.legs() {
                    *balances.entry(leg.account.as_str().to_owned()).or_default() +=
                        leg.amount.minor();
                }
            }
        }
        let schedule = FeeSchedule::new(FEE_BPS, Amount::ZERO).unwrap();
        let fee = |minor: i64| {
            asiento_domain::fee(Amount::new(minor), schedule)
                .unwrap()
                .minor()
        };
        let captured = charge.amount_captured;
        let refunded = charge.amount_refunded;
        let fee_kept = fee(captured) - fee(refunded).min(fee(captured));
        let get = |account: &str| balances.get(account).copied().unwrap_or(0);
        assert_eq!(get("psp:sim:clearing"), -(captured - refunded), "{payment}");
        assert_eq!(
            get("customer:42:available"),
            captured - refunded - fee_kept,
            "{payment}"
        );
        assert_eq!(get("revenue:fees"), fee_kept, "{payment}");
    }
}

fn add(total: &mut DrainReport, report: &DrainReport) {
    total.claimed += report.claimed;
    total.applied += report.applied;
    total.ignored += report.ignored;
    total.retried += report.retried;
    total.deferred += report.deferred;
    total.dead += report.dead;
    total.lost += report.lost;
}

fn fast_config() -> WorkerConfig {
    WorkerConfig {
        batch_size_max: 16,
        backoff_base_ms: 5,
        backoff_max_ms: 50,
        lease_busy_retry_ms: 2,
        idle_poll_ms: 2,
        ..WorkerConfig::default()
    }
}

fn system_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

fn iterations(default: usize) -> usize {
    std::env::var("ASIENTO_WEBHOOK_RACE_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

// ------------------------------------------------------------------------------------ the race

/// The synchronous path (create → provider → finalize) and the webhook for the same charge
/// (receive → worker → finalize) run at once for hundreds of payments: each ends with exactly one
/// capture and one journal entry, and both orders of winning really happened.
async fn race(backend: Backend) {
    let h = Arc::new(PaymentRig::for_webhooks(backend, system_clock()).await);
    let payments_total = iterations(400);
    let creators = 4;
    let done = Arc::new(AtomicBool::new(false));

    let feeder = {
        let h = h.clone();
        let done = done.clone();
        let worker = h.worker(fast_config());
        tokio::spawn(async move {
            loop {
                let finished = done.load(Ordering::SeqCst);
                let events = h.new_events();
                for event in &events {
                    h.deliver(event).await;
                }
                let report = worker.drain_once().await.unwrap();
                if finished
                    && events.is_empty()
                    && report.claimed == 0
                    && inbox_counts(h.db.database()).await.unwrap().pending == 0
                {
                    break;
                }
                if events.is_empty() && report.claimed == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        })
    };
    let mut tasks = Vec::new();
    for creator in 0..creators {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..payments_total / creators {
                // Provider latency on some calls hands the webhook a head start, so that both
                // sides win some of the races; long enough to survive a loaded machine (60 ms did
                // not: a CI run saw the webhook win none of 400).
                let latency_ms = if (i + creator) % 3 == 0 { 250 } else { 0 };
                h.served
                    .sim
                    .set_faults(&FaultsPatch {
                        latency_ms: Some(latency_ms),
                        ..FaultsPatch::default()
                    })
                    .unwrap();
                let (id, body) = h.create("pm_card_ok", 1_000, CaptureMode::Automatic).await;
                assert_eq!(body["status"], "captured", "{body}");
                ids.push(id);
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.extend(task.await.unwrap());
    }
    done.store(true, Ordering::SeqCst);
    feeder.await.unwrap();

    let (mut webhook_first, mut sync_first) = (0, 0);
    for id in &ids {
        let (record, events, keys) = h.load(*id).await;
        assert_eq!(record.status, PaymentStatus::Captured);
        let captures: Vec<usize> = events
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, PaymentEvent::ChargeCaptured(_)))
            .map(|(i, _)| i)
            .collect();
        let entries = events
            .iter()
            .filter(|e| matches!(e, PaymentEvent::EntryPosted(_)))
            .count();
        assert_eq!(captures.len(), 1, "{id}: {events:?}");
        assert_eq!(entries, 1, "{id}: {events:?}");
        // The synchronous path's events carry the client's key; the worker's carry none.
        if keys[captures[0]].is_some() {
            sync_first += 1;
        } else {
            webhook_first += 1;
        }
        h.check_against_provider(*id).await;
    }
    assert_eq!(ids.len(), payments_total / creators * creators);
    eprintln!("{backend:?}: webhook first {webhook_first}, synchronous path first {sync_first}");
    assert!(
        webhook_first > 0 && sync_first > 0,
        "webhook first {webhook_first}, sync first {sync_first}"
    );
    let counts = inbox_counts(h.db.database()).await.unwrap();
    assert_eq!((counts.pending, counts.dead), (0, 0));
    Arc::into_inner(h).unwrap().finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_between_sync_finalize_and_webhook_sqlite() {
    race(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_between_sync_finalize_and_webhook_postgres() {
    race(Backend::Postgres).await;
}

// ------------------------------------------------------------------------ 200 mixed payments

/// 200 payments of every kind; events delivered with half of them duplicated and all shuffled;
/// every payment agrees with the provider afterwards.
async fn mixed_payments(backend: Backend) {
    let h = PaymentRig::for_webhooks(backend, system_clock()).await;
    let mut rng = Rng::new(0x5eed_0001);
    let mut ids = Vec::new();
    for i in 0..200 {
        let amount = 1_000 + (i as i64) * 7;
        let id = match i % 5 {
            0 => {
                h.create("pm_card_ok", amount, CaptureMode::Automatic)
                    .await
                    .0
            }
            1 => {
                h.create("pm_card_declined", amount, CaptureMode::Automatic)
                    .await
                    .0
            }
            2 => {
                let (id, body) = h
                    .create("pm_redirect", amount, CaptureMode::Automatic)
                    .await;
                assert_eq!(body["status"], "requires_action");
                let charge = h.charge_of(id);
                let result = if i % 10 == 2 { "succeeded" } else { "failed" };
                h.sim_post(
                    &format!("/sim/charges/{}/complete", charge.id),
                    &json!({"result": result}),
                )
                .await;
                id
            }
            3 => {
                // Refunded in parts at the provider's dashboard: only webhooks tell us.
                let (id, _) = h.create("pm_card_ok", amount, CaptureMode::Automatic).await;
                let charge = h.charge_of(id);
                for part in [amount / 4, amount / 3] {
                    h.sim_post(
                        &format!("/sim/charges/{}/refund_out_of_band", charge.id),
                        &json!({"amount_minor": part}),
                    )
                    .await;
                }
                id
            }
            _ => h.create("pm_card_ok", amount, CaptureMode::Manual).await.0,
        };
        ids.push(id);
    }
    let mut deliveries = Vec::new();
    for event in h.new_events() {
        if rng.below(2) == 0 {
            deliveries.push(event.clone());
        }
        deliveries.push(event);
    }
    rng.shuffle(&mut deliveries);
    let workers = [h.worker(fast_config())];
    let mut duplicates = 0;
    for chunk in deliveries.chunks(37) {
        for event in chunk {
            duplicates += usize::from(h.deliver(event).await);
        }
        h.drain_all(&workers).await;
    }
    assert!(duplicates > 0);
    for id in &ids {
        h.check_against_provider(*id).await;
    }
    let counts = inbox_counts(h.db.database()).await.unwrap();
    assert_eq!(counts.pending + counts.dead, 0);
    assert_eq!(counts.processed as usize, deliveries.len() - duplicates);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_payments_settle_under_duplicates_and_reordering_sqlite() {
    mixed_payments(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_payments_settle_under_duplicates_and_reordering_postgres() {
    mixed_payments(Backend::Postgres).await;
}

// ---------------------------------------------------------------------------- redelivery

async fn redelivery(backend: Backend) {
    let h = PaymentRig::for_webhooks(backend, system_clock()).await;
    let worker = h.worker(fast_config());
    let (id, _) = h.create("pm_redirect", 2_500, CaptureMode::Automatic).await;
    let charge = h.charge_of(id);
    h.sim_post(
        &format!("/sim/charges/{}/complete", charge.id),
        &json!({"result": "succeeded"}),
    )
    .await;
    let events = h.new_events();
    assert_eq!(events.len(), 1);
    assert!(!h.deliver(&events[0]).await);
    assert_eq!(worker.drain().await.unwrap().applied, 1);
    let (record, before, _) = h.load(id).await;
    assert_eq!(record.status, PaymentStatus::Captured);

    // The same signed body again: acknowledged, not stored, nothing to process, nothing appended.
    assert!(h.deliver(&events[0]).await);
    assert_eq!(worker.drain().await.unwrap().claimed, 0);
    // The same fact under a new event id: processed, and the domain finds nothing new.
    let mut resent = events[0].clone();
    resent.id = format!("{}_resent", resent.id);
    assert!(!h.deliver(&resent).await);
    assert_eq!(worker.drain().await.unwrap().applied, 1);
    let (_, after, _) = h.load(id).await;
    assert_eq!(before.len(), after.len());
    let counts = inbox_counts(h.db.database()).await.unwrap();
    assert_eq!((counts.processed, counts.pending, counts.dead), (2, 0, 0));

    // Refused deliveries store nothing.
    let mut fresh = events[0].clone();
    fresh.id = "evt_never_stored".into();
    let body = serde_json::to_vec(&fresh).unwrap();
    let now_s = h.receiver().clock.now_ms() / 1000;
    let refused = [
        (
            "sim",
            Some(asiento_psp::sign("whsec_wrong", now_s, &body)),
            "signature_invalid",
        ),
        (
            "sim",
            Some(asiento_psp::sign(SECRET, now_s - 301, &body)),
            "signature_stale",
        ),
        ("sim", None, "signature_invalid"),
        (
            "nobody",
            Some(asiento_psp::sign(SECRET, now_s, &body)),
            "unknown_provider",
        ),
    ];
    for (provider, signature, code) in refused {
        let error = h
            .receiver()
            .receive(provider, signature.as_deref(), &body)
            .await
            .unwrap_err();
        assert_eq!(error.code(), code);
    }
    let tampered = asiento_psp::sign(SECRET, now_s, &body);
    let mut other = fresh.clone();
    other.data.charge.as_mut().unwrap().amount_captured += 1;
    let error = h
        .receiver()
        .receive("sim", Some(&tampered), &serde_json::to_vec(&other).unwrap())
        .await
        .unwrap_err();
    assert_eq!(error.code(), "signature_invalid");
    let counts = inbox_counts(h.db.database()).await.unwrap();
    assert_eq!(counts.processed + counts.pending + counts.dead, 2);
    assert_eq!(inbox_counts(h.db.database()).await.unwrap().processed, 2);
    h.finish().await;
}

#[tokio::test]
async fn the_same_body_twice_changes_nothing_and_refusals_store_nothing_sqlite() {
    redelivery(Backend::Sqlite).await;
}

#[tokio::test]
async fn the_same_body_twice_changes_nothing_and_refusals_store_nothing_postgres() {
    redelivery(Backend::Postgres).await;
}

// ----------------------------------------------------------- out of order, cumulative, disputes

async fn out_of_order(backend: Backend) {
    let h = PaymentRig::for_webhooks(backend, system_clock()).await;
    let worker = h.worker(fast_config());

    // Captured before authorized: a redirect with manual capture, completed and then captured at
    // the provider; the events arrive newest first.
    let (a, _) = h.create("pm_redirect", 5_000, CaptureMode::Manual).await;
    let charge = h.charge_of(a);
    h.sim_post(
        &format!("/sim/charges/{}/complete", charge.id),
        &json!({"result": "succeeded"}),
    )
    .await;
    let sim = h
        .flow
        .providers()
        .get(&ProviderName::parse("sim").unwrap())
        .unwrap();
    sim.adapter
        .capture(&charge.id, Some(4_000), "USD", "test_capture_a")
        .await
        .unwrap();
    let mut events = h.new_events();
    assert_eq!(events.len(), 2);
    events.reverse();
    for event in &events {
        h.deliver(event).await;
        worker.drain().await.unwrap();
    }
    h.check_against_provider(a).await;
    assert_eq!(h.load(a).await.0.status, PaymentStatus::Captured);

    // Cumulative refunds: 1000 then 2500 (total), delivered in reverse, then a full one.
    let (b, _) = h.create("pm_card_ok", 10_000, CaptureMode::Automatic).await;
    let charge = h.charge_of(b);
    let refund = |amount: i64| {
        let path = format!("/sim/charges/{}/refund_out_of_band", charge.id);
        let h = &h;
        async move { h.sim_post(&path, &json!({"amount_minor": amount})).await }
    };
    refund(1_000).await;
    refund(1_500).await;
    let mut events = h.new_events();
    let events: Vec<WebhookEvent> = events
        .drain(..)
        .filter(|e| e.data.charge.as_ref().unwrap().amount_refunded > 0)
        .collect();
    assert_eq!(events.len(), 2);
    h.deliver(&events[1]).await;
    worker.drain().await.unwrap();
    assert_eq!(h.load(b).await.0.refunded, Amount::new(2_500));
    h.deliver(&events[0]).await;
    worker.drain().await.unwrap();
    h.check_against_provider(b).await;
    refund(7_500).await;
    for event in h.new_events() {
        h.deliver(&event).await;
    }
    worker.drain().await.unwrap();
    h.check_against_provider(b).await;
    let (record, events, _) = h.load(b).await;
    assert_eq!(record.status, PaymentStatus::Refunded);
    let refunds = events
        .iter()
        .filter(|e| matches!(e, PaymentEvent::RefundSettled(_)))
        .count();
    assert_eq!(refunds, 2, "the late 1000 posts nothing: {events:?}");

    // A dispute closed (lost) before its opening arrives: the close stands for both.
    let (c, _) = h.create("pm_card_ok", 3_000, CaptureMode::Automatic).await;
    let charge = h.charge_of(c);
    h.new_events();
    h.sim_post(&format!("/sim/charges/{}/dispute", charge.id), &json!({}))
        .await;
    h.sim_post(
        &format!("/sim/charges/{}/dispute/close", charge.id),
        &json!({"outcome": "lost"}),
    )
    .await;
    let mut events = h.new_events();
    assert_eq!(events.len(), 2);
    events.reverse();
    for event in &events {
        h.deliver(event).await;
        worker.drain().await.unwrap();
    }
    let (record, events, _) = h.load(c).await;
    assert!(record.flags.is_empty(), "{:?}", record.flags);
    let dispute = record.dispute.unwrap();
    assert_eq!(dispute.amount, Amount::new(3_000));
    assert!(dispute.outcome.is_some());
    let opened = events
        .iter()
        .filter(|e| matches!(e, PaymentEvent::DisputeOpened(_)))
        .count();
    assert_eq!(opened, 1);
    h.finish().await;
}

#[tokio::test]
async fn out_of_order_cumulative_and_dispute_facts_sqlite() {
    out_of_order(Backend::Sqlite).await;
}

#[tokio::test]
async fn out_of_order_cumulative_and_dispute_facts_postgres() {
    out_of_order(Backend::Postgres).await;
}

// ----------------------------------------------------------------------------- dead letters

async fn dead_letters_case(backend: Backend) {
    let clock = Arc::new(ManualClock::at_ms(chrono::Utc::now().timestamp_millis()));
    let h = PaymentRig::for_webhooks(backend, clock.clone()).await;
    let config = WorkerConfig {
        attempts_max: 3,
        backoff_base_ms: 1_000,
        backoff_max_ms: 10_000,
        unknown_payment_retry_ms: 60_000,
        ..fast_config()
    };

    // A worker whose flow cannot process (its provider is not configured) fails every attempt:
    // retried with backoff, then dead-lettered and the payment flagged.
    let (id, _) = h.create("pm_card_ok", 1_000, CaptureMode::Automatic).await;
    let broken = Worker::new(
        PaymentFlow::new(
            h.db.database().clone(),
            h.flow.writer().clone(),
            Providers::default(),
            h.flow.clock().clone(),
            Arc::new(common::TestRender),
        ),
        config.clone(),
    );
    let events = h.new_events();
    h.deliver(&events[0]).await;
    assert_eq!(pending_count(h.db.database()).await.unwrap(), 1);
    assert_eq!(broken.drain().await.unwrap().retried, 1);
    // Still pending (the depth gauge's count), but not due before its backoff.
    assert_eq!(pending_count(h.db.database()).await.unwrap(), 1);
    assert_eq!(broken.drain().await.unwrap().claimed, 0);
    clock.advance_ms(1_000);
    assert_eq!(broken.drain().await.unwrap().retried, 1);
    clock.advance_ms(2_000);
    assert_eq!(broken.drain().await.unwrap().dead, 1);
    assert_eq!(pending_count(h.db.database()).await.unwrap(), 0);
    let dead = dead_letters(h.db.database(), Some(DeadReason::AttemptsExhausted), 0, 100)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].event_id, events[0].id);
    assert_eq!(dead[0].attempts, 3);
    let (record, _, _) = h.load(id).await;
    assert_eq!(record.flags.len(), 1, "{:?}", record.flags);
    assert!(record.flags[0].detail.contains(&events[0].id));

    // An event for a payment we do not know: retried for a while, then an unknown_payment
    // dead letter (a reconciliation exception), queryable by reason.
    let worker = h.worker(config.clone());
    let mut stranger = events[0].clone();
    stranger.id = "evt_stranger".into();
    stranger.data.charge.as_mut().unwrap().reference =
        Some(PaymentId::from_uuid(uuid::Uuid::now_v7()).to_string());
    h.deliver(&stranger).await;
    assert_eq!(worker.drain().await.unwrap().deferred, 1);
    clock.advance_ms(30_000);
    assert_eq!(worker.drain().await.unwrap().deferred, 1);
    clock.advance_ms(30_000);
    assert_eq!(worker.drain().await.unwrap().dead, 1);
    let unknown = dead_letters(h.db.database(), Some(DeadReason::UnknownPayment), 0, 100)
        .await
        .unwrap();
    assert_eq!(unknown.len(), 1);
    assert_eq!(
        unknown[0].payment_ref,
        stranger.data.charge.as_ref().unwrap().reference
    );

    // No reference at all, and an event signed by another provider than the payment's.
    let mut orphan = events[0].clone();
    orphan.id = "evt_orphan".into();
    orphan.data.charge.as_mut().unwrap().reference = None;
    h.deliver(&orphan).await;
    let mut foreign = events[0].clone();
    foreign.id = "evt_foreign".into();
    h.deliver_as("other", OTHER_SECRET, &foreign).await;
    // An event type we do not know is acknowledged and ignored.
    let mut unknown_type = serde_json::to_value(&events[0]).unwrap();
    unknown_type["id"] = json!("evt_new_type");
    unknown_type["type"] = json!("charge.expired");
    let body = serde_json::to_vec(&unknown_type).unwrap();
    let t = clock.now_ms() / 1000;
    h.receiver()
        .receive("sim", Some(&asiento_psp::sign(SECRET, t, &body)), &body)
        .await
        .unwrap();
    let report = worker.drain().await.unwrap();
    assert_eq!((report.dead, report.ignored), (2, 1), "{report:?}");
    for (reason, event_id) in [
        (DeadReason::NoPaymentReference, "evt_orphan"),
        (DeadReason::ProviderMismatch, "evt_foreign"),
    ] {
        let rows = dead_letters(h.db.database(), Some(reason), 0, 100)
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "{reason:?}");
        assert_eq!(rows[0].event_id, event_id);
    }
    assert_eq!(
        dead_letters(h.db.database(), None, 0, 100)
            .await
            .unwrap()
            .len(),
        4
    );
    let counts = inbox_counts(h.db.database()).await.unwrap();
    assert_eq!((counts.pending, counts.processed, counts.dead), (0, 1, 4));
    // The flagged payment is otherwise untouched: still only the synchronous capture.
    h.check_against_provider_flagged(id).await;

    // An event whose charge is not its payment's (another amount, another key) is never
    // applied: a charge_mismatch dead letter, and the payment is flagged for a person.
    let (other, _) = h.create("pm_card_ok", 2_000, CaptureMode::Automatic).await;
    let mut misfits = h.new_events();
    let misfit = misfits.pop().unwrap();
    for (n, change) in [
        (|c: &mut asiento_psp::Charge| c.amount_minor += 1) as fn(&mut asiento_psp::Charge),
        |c| c.idempotency_key = "psp_someone_else".into(),
    ]
    .into_iter()
    .enumerate()
    {
        let mut event = misfit.clone();
        event.id = format!("evt_misfit_{n}");
        change(event.data.charge.as_mut().unwrap());
        event.data.charge.as_mut().unwrap().amount_refunded = 500;
        h.deliver(&event).await;
    }
    assert_eq!(worker.drain().await.unwrap().dead, 2);
    let mismatched = dead_letters(h.db.database(), Some(DeadReason::ChargeMismatch), 0, 100)
        .await
        .unwrap();
    assert_eq!(mismatched.len(), 2);
    let (record, _, _) = h.load(other).await;
    assert_eq!(
        record.refunded,
        Amount::ZERO,
        "nothing of a misfit is applied"
    );
    assert!(record.needs_review(), "{:?}", record.flags);
    h.finish().await;
}

impl PaymentRig {
    async fn check_against_provider_flagged(&self, payment: PaymentId) {
        let (record, events, _) = self.load(payment).await;
        assert_eq!(record.status, PaymentStatus::Captured);
        let entries = events
            .iter()
            .filter(|e| matches!(e, PaymentEvent::EntryPosted(_)))
            .count();
        assert_eq!(entries, 1);
    }
}

#[tokio::test]
async fn failures_retry_then_dead_letter_and_flag_sqlite() {
    dead_letters_case(Backend::Sqlite).await;
}

#[tokio::test]
async fn failures_retry_then_dead_letter_and_flag_postgres() {
    dead_letters_case(Backend::Postgres).await;
}

// ------------------------------------------------------------------------ two workers, 1000

/// Two workers, each with its own connection pool (as two processes have), drain one inbox of
/// 1,000 events: every row processed exactly once and the ledger matches the provider.
async fn two_workers(backend: Backend) {
    let h = PaymentRig::for_webhooks(backend, system_clock()).await;
    let mut ids = Vec::new();
    for _ in 0..250 {
        let (id, _) = h.create("pm_card_ok", 1_000, CaptureMode::Automatic).await;
        let charge = h.charge_of(id);
        for _ in 0..3 {
            h.sim_post(
                &format!("/sim/charges/{}/refund_out_of_band", charge.id),
                &json!({"amount_minor": 100}),
            )
            .await;
        }
        ids.push(id);
    }
    let mut events = h.new_events();
    assert_eq!(events.len(), 1_000);
    Rng::new(0x5eed_0002).shuffle(&mut events);
    for event in &events {
        assert!(!h.deliver(event).await);
    }

    let mut handles = Vec::new();
    for _ in 0..2 {
        // A second pool on the same database: nothing shared with the other worker but the rows.
        let database = match h.db.database() {
            Database::Postgres(_) => Database::connect(&h.db.url).await.unwrap(),
            _ => h.db.database().clone(),
        };
        let flow = PaymentFlow::new(
            database.clone(),
            asiento_app::commit::Writer::new(database.event_store()),
            h.flow.providers().clone(),
            h.flow.clock().clone(),
            Arc::new(common::TestRender),
        );
        let worker = Worker::new(flow, fast_config());
        handles.push(tokio::spawn(async move {
            let mut total = DrainReport::default();
            loop {
                let report = worker.drain().await.unwrap();
                add(&mut total, &report);
                if inbox_counts(&database).await.unwrap().pending == 0 {
                    return total;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    let mut reports = Vec::new();
    for handle in handles {
        reports.push(handle.await.unwrap());
    }
    let applied: usize = reports.iter().map(|r| r.applied).sum();
    assert_eq!(applied, 1_000, "{reports:?}");
    assert!(
        reports.iter().all(|r| r.applied > 0 && r.lost == 0),
        "{reports:?}"
    );
    let counts = inbox_counts(h.db.database()).await.unwrap();
    assert_eq!(
        (counts.processed, counts.pending, counts.dead),
        (1_000, 0, 0)
    );
    for id in &ids {
        h.check_against_provider(*id).await;
        assert_eq!(h.load(*id).await.0.refunded, Amount::new(300));
    }
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_drain_a_shared_inbox_of_1000_exactly_once_postgres() {
    two_workers(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_drain_a_shared_inbox_of_1000_exactly_once_sqlite() {
    two_workers(Backend::Sqlite).await;
}

// ------------------------------------------------------------------------ redirect + stale read

/// A redirect payment finished by its webhook never shows `next_action` again, even when the
/// synchronous path applies the provider's older "requires action" answer after (or while) the
/// webhook commits.
async fn redirect_finished_by_webhook(backend: Backend) {
    let h = Arc::new(PaymentRig::for_webhooks(backend, system_clock()).await);
    let worker = h.worker(fast_config());
    for _ in 0..30 {
        let (id, body) = h.create("pm_redirect", 4_200, CaptureMode::Automatic).await;
        assert_eq!(body["next_action"], true);
        let charge = h.charge_of(id);
        let stale =
            asiento_app::facts::charge_status_fact(&charge, asiento_app::facts::Read::Snapshot);
        h.sim_post(
            &format!("/sim/charges/{}/complete", charge.id),
            &json!({"result": "succeeded"}),
        )
        .await;
        for event in h.new_events() {
            h.deliver(&event).await;
        }
        // The stale synchronous answer races the worker.
        let sync = {
            let h = h.clone();
            tokio::spawn(async move {
                h.flow
                    .finalize(Finalize::facts(id, Some(stale)))
                    .await
                    .unwrap()
            })
        };
        worker.drain().await.unwrap();
        sync.await.unwrap();
        let read = h.flow.finalize(Finalize::facts(id, None)).await.unwrap();
        assert_eq!(read.payment.status, PaymentStatus::Captured);
        assert!(read.payment.next_action.is_none());
        h.check_against_provider(id).await;
    }
    Arc::into_inner(h).unwrap().finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirect_finished_by_webhook_has_no_next_action_sqlite() {
    redirect_finished_by_webhook(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirect_finished_by_webhook_has_no_next_action_postgres() {
    redirect_finished_by_webhook(Backend::Postgres).await;
}

// ----------------------------------------------------------------------------- payment lease

/// Takes the payment's lease as another holder would, then delivers the provider's new events.
async fn hold_and_deliver(h: &PaymentRig, payment: PaymentId) -> leases::PaymentLease {
    let now = h.flow.clock().now_ms();
    let held = leases::acquire(h.db.database(), payment, now, 60_000)
        .await
        .unwrap()
        .unwrap();
    for event in h.new_events() {
        h.deliver(&event).await;
    }
    held
}

async fn payment_lease(backend: Backend) {
    let h = PaymentRig::for_webhooks(backend, system_clock()).await;
    let id = PaymentId::from_uuid(uuid::Uuid::now_v7());
    let first = leases::acquire(h.db.database(), id, 1_000, 500)
        .await
        .unwrap()
        .unwrap();
    assert!(leases::acquire(h.db.database(), id, 1_499, 500)
        .await
        .unwrap()
        .is_none());
    // Expired: taken over; the old holder's release leaves the new lease alone.
    let second = leases::acquire(h.db.database(), id, 1_500, 500)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(first.owner, second.owner);
    leases::release(h.db.database(), &first).await.unwrap();
    assert!(leases::acquire(h.db.database(), id, 1_600, 500)
        .await
        .unwrap()
        .is_none());
    leases::release(h.db.database(), &second).await.unwrap();
    assert!(leases::acquire(h.db.database(), id, 1_600, 500)
        .await
        .unwrap()
        .is_some());

    let worker = h.worker(fast_config());
    // An event the payment already reflects (the synchronous answer recorded the capture) needs
    // no lease: the row is marked processed even while someone holds the payment.
    let (payment, _) = h.create("pm_card_ok", 1_000, CaptureMode::Automatic).await;
    let held = hold_and_deliver(&h, payment).await;
    let report = worker.drain_once().await.unwrap();
    assert_eq!((report.applied, report.deferred), (1, 0));
    leases::release(h.db.database(), &held).await.unwrap();

    // An event that changes the payment (a redirect completed at the provider) waits for the
    // lease: the worker defers the row without counting an attempt, and applies it once free.
    let (payment, body) = h.create("pm_redirect", 1_000, CaptureMode::Automatic).await;
    assert_eq!(body["status"], "requires_action");
    let charge = h.charge_of(payment);
    h.sim_post(
        &format!("/sim/charges/{}/complete", charge.id),
        &json!({"result": "succeeded"}),
    )
    .await;
    let held = hold_and_deliver(&h, payment).await;
    assert_eq!(worker.drain_once().await.unwrap().deferred, 1);
    assert_eq!(
        h.load(payment).await.0.status,
        PaymentStatus::RequiresAction
    );
    leases::release(h.db.database(), &held).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(worker.drain().await.unwrap().applied, 1);
    assert_eq!(h.load(payment).await.0.status, PaymentStatus::Captured);
    h.finish().await;
}

#[tokio::test]
async fn payment_lease_has_one_holder_sqlite() {
    payment_lease(Backend::Sqlite).await;
}

#[tokio::test]
async fn payment_lease_has_one_holder_postgres() {
    payment_lease(Backend::Postgres).await;
}

// ------------------------------------------------------------------ remembered payment states

/// A webhook whose event a payment state this process committed already reflects is marked
/// without reading the log. Shown with workers whose log is another, empty database: the one
/// with the flow's memory finds the events reflected, the one without it cannot even find the
/// payment.
async fn remembered(backend: Backend) {
    let h = PaymentRig::for_webhooks(backend, system_clock()).await;
    let empty = TestDatabase::open(backend).await;
    // Its inbox on the harness's database, its log read from the empty one, with the memory of
    // the writer that committed the payments.
    let blind = PaymentFlow::new(
        h.db.database().clone(),
        asiento_app::commit::Writer::new(empty.database().event_store()),
        h.flow.providers().clone(),
        h.flow.clock().clone(),
        Arc::new(common::TestRender),
    )
    .with_writer(h.flow.writer().clone());

    let (first, _) = h.create("pm_card_ok", 1_000, CaptureMode::Automatic).await;
    let events = h.new_events();
    assert!(!events.is_empty());
    for event in &events {
        assert!(!h.deliver(event).await);
    }
    let report = Worker::new(blind.clone(), fast_config())
        .drain()
        .await
        .unwrap();
    assert_eq!(
        (report.applied, report.deferred),
        (events.len(), 0),
        "{report:?}"
    );
    assert_eq!(inbox_counts(h.db.database()).await.unwrap().pending, 0);
    h.check_against_provider(first).await;

    let _ = h.create("pm_card_ok", 2_000, CaptureMode::Automatic).await;
    let events = h.new_events();
    for event in &events {
        assert!(!h.deliver(event).await);
    }
    // A writer of its own: no memory of the payments the first one committed.
    let forgetful = blind.with_writer(asiento_app::commit::Writer::new(
        empty.database().event_store(),
    ));
    let report = Worker::new(forgetful, fast_config())
        .drain_once()
        .await
        .unwrap();
    assert_eq!(
        (report.applied, report.deferred),
        (0, events.len()),
        "{report:?}"
    );
    empty.finish().await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_the_process_committed_answers_without_a_read_sqlite() {
    remembered(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_the_process_committed_answers_without_a_read_postgres() {
    remembered(Backend::Postgres).await;
}
