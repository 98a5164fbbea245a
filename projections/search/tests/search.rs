//! The payment search index against both backends. Payments are made by the domain's own
//! `decide`, appended to the real event store with the Idempotency-Key of the request that
//! caused each step, and projected by the real runner; every check names the term and the kind
//! the test itself gave the payment.

#![allow(clippy::unwrap_used)] // test code: a failed setup step should panic loudly

use asiento_testkit::{Backend, TestDatabase};
use std::sync::Arc;
use std::time::{Duration, Instant};

use asiento_domain::payment::ProviderRequest;
use asiento_domain::{
    decide_payment, evolve_payment, payment_stream, Amount, CaptureMode, CreatePayment, Currency,
    CustomerId, FeeSchedule, OperationKind, OperationOutcome, Payment, PaymentCommand,
    PaymentEvent, PaymentId, ProviderFact, ProviderName, TenantId,
};
use asiento_eventstore::{
    Database, EventStore, ExpectedVersion, Metadata, NewEvent, RecordedEvent, StreamAppend,
};
use asiento_payment_search::{
    find, verify, verify_in_pages, wait_for_position, Match, PaymentSearch, SearchError,
    FIND_LIMIT_MAX,
};
use asiento_projector::{on_db, rebuild, Projection, RebuildConfig, Runner, RunnerConfig};
use chrono::{DateTime, Utc};
use serde_json::json;
use tokio::sync::oneshot;
use uuid::Uuid;

const ACME: &str = "acme";
const GLOBEX: &str = "globex";

struct Harness {
    db: Database,
    store: Arc<dyn EventStore>,
    _test_db: TestDatabase,
}

/// A payment as the test decided it.
struct Made {
    payment: Payment,
    last_position: i64,
}

impl Made {
    fn id(&self) -> PaymentId {
        self.payment.record.as_ref().unwrap().id
    }

    fn tenant(&self) -> String {
        self.payment.record.as_ref().unwrap().tenant.to_string()
    }

    /// The PSP key of the payment's last operation of `kind`.
    fn last_psp_key(&self, kind: OperationKind) -> String {
        let record = self.payment.record.as_ref().unwrap();
        let op = record.operations.iter().rev().find(|o| o.kind == kind);
        op.unwrap().psp_key.clone()
    }
}

fn base_time() -> DateTime<Utc> {
    DateTime::from_timestamp_millis(1_764_000_000_123).unwrap()
}

fn at(seconds: i64) -> DateTime<Utc> {
    base_time() + chrono::Duration::seconds(seconds)
}

fn fees() -> FeeSchedule {
    FeeSchedule::new(300, Amount::ZERO).unwrap()
}

fn provider(fact: ProviderFact, seconds: i64) -> PaymentCommand {
    PaymentCommand::Provider {
        fact,
        fees: fees(),
        at: at(seconds),
    }
}

impl Harness {
    async fn new(backend: Backend) -> Harness {
        let test_db = TestDatabase::open(backend).await;
        let db = test_db.database().clone();
        asiento_payment_search::install(&db).await.unwrap();
        // Installing twice changes nothing.
        asiento_payment_search::install(&db).await.unwrap();
        Harness {
            store: db.event_store(),
            db,
            _test_db: test_db,
        }
    }

    /// Appends `events` to `made`'s stream as one request with Idempotency-Key `key` would.
    async fn append(&self, made: &mut Made, events: Vec<PaymentEvent>, key: Option<&str>) {
        assert!(!events.is_empty(), "nothing to append");
        let (stream, tenant) = match (&made.payment.record, &events[0]) {
            (Some(r), _) => (payment_stream(r.id), r.tenant.to_string()),
            (None, PaymentEvent::PaymentIntended(e)) => {
                (payment_stream(e.payment_id), e.tenant.to_string())
            }
            (None, _) => panic!("a payment starts with PaymentIntended"),
        };
        let new_events = events
            .iter()
            .map(|e| NewEvent {
                event_id: Uuid::new_v4(),
                event_type: e.event_type().to_owned(),
                schema: e.schema_version(),
                data: e.encode().unwrap(),
                metadata: Metadata {
                    tenant: Some(tenant.clone()),
                    idempotency_key: key.map(str::to_owned),
                    ..Metadata::default()
                },
            })
            .collect();
        let appended = self
            .store
            .append(&[StreamAppend {
                stream_id: stream,
                expected: ExpectedVersion::Exact(made.payment.version),
                events: new_events,
            }])
            .await
            .unwrap();
        for event in &events {
            made.payment = evolve_payment(std::mem::take(&mut made.payment), event);
        }
        made.last_position = appended.last_position;
    }

    /// Decides `command` for `made` and appends what it decided.
    async fn run(&self, made: &mut Made, command: PaymentCommand, key: Option<&str>) {
        let events = decide_payment(&made.payment, command).unwrap();
        self.append(made, events, key).await;
    }

    /// A payment of `tenant` created with Idempotency-Key `key`, metadata and description.
    async fn create(
        &self,
        tenant: &str,
        key: &str,
        metadata: serde_json::Value,
        description: Option<&str>,
        created: DateTime<Utc>,
    ) -> Made {
        let mut made = Made {
            payment: Payment::default(),
            last_position: 0,
        };
        let serde_json::Value::Object(metadata) = metadata else {
            panic!("metadata is an object");
        };
        let create = CreatePayment {
            id: PaymentId::from_uuid(Uuid::now_v7()),
            tenant: TenantId::parse(tenant).unwrap(),
            amount: Amount::new(10_000),
            currency: Currency::parse("EUR").unwrap(),
            customer: CustomerId::parse("c1").unwrap(),
            provider: ProviderName::parse("sim").unwrap(),
            capture_mode: CaptureMode::Manual,
            description: description.map(str::to_owned),
            metadata,
            payment_method: None,
            at: created,
        };
        self.run(&mut made, PaymentCommand::Create(create), Some(key))
            .await;
        made
    }

    /// A payment with an id of every kind: authorized, captured (answered pending, then
    /// succeeded), a provider fee, a refund settled by a cumulative total and then identified,
    /// a second refund answered with its id, a dispute. Returns it with the (term, kind) pairs
    /// it must be found by.
    async fn rich(&self) -> (Made, Vec<(String, &'static str)>) {
        let mut made = self
            .create(
                ACME,
                "create-key-1001",
                json!({
                    "order": "1001",
                    "customer_ref": "  CUST-9  ",
                    "count": 42,
                    "gift": true,
                    "nested": {"a": "inner"},
                    "long": "x".repeat(300),
                }),
                Some(" Blue shoes, size 42 "),
                base_time(),
            )
            .await;
        let charge = "pi_3SearchCharge".to_owned();
        let amount = Amount::new(10_000);
        let create_key = Some("create-key-1001");
        let authorized = ProviderFact::Authorized {
            charge_id: charge.clone(),
            amount,
        };
        self.run(&mut made, provider(authorized, 1), create_key)
            .await;

        let capture_key = Some("capture-key-7");
        let request_capture = PaymentCommand::RequestCapture {
            amount: None,
            at: at(2),
        };
        self.run(&mut made, request_capture, capture_key).await;
        let capture_psp_key = made.last_psp_key(OperationKind::Capture);
        let capture = |outcome, request: &str, seconds| {
            provider(
                ProviderFact::Operation {
                    kind: OperationKind::Capture,
                    charge_id: charge.clone(),
                    psp_key: capture_psp_key.clone(),
                    provider_id: Some("cap_op_1".into()),
                    amount,
                    outcome,
                    request: Some(ProviderRequest {
                        id: request.into(),
                        replayed: false,
                    }),
                },
                seconds,
            )
        };
        let pending = capture(OperationOutcome::Pending, "req_capture_1", 3);
        self.run(&mut made, pending, capture_key).await;
        let succeeded = capture(OperationOutcome::Succeeded, "req_capture_2", 4);
        self.run(&mut made, succeeded, None).await;
        let fee = ProviderFact::ProviderFeeCharged {
            charge_id: charge.clone(),
            transaction_id: "txn_fee_1".into(),
            fee: Amount::new(29),
        };
        self.run(&mut made, provider(fee, 5), None).await;

        let refund_key = Some("refund-key-9");
        let request_refund = PaymentCommand::RequestRefund {
            amount: Amount::new(1_000),
            at: at(6),
        };
        self.run(&mut made, request_refund, refund_key).await;
        let first_refund_psp_key = made.last_psp_key(OperationKind::Refund);
        // A cumulative total settles the first refund before anything names it …
        let total = ProviderFact::Refunded {
            charge_id: charge.clone(),
            amount_refunded: Amount::new(1_000),
            current: true,
        };
        self.run(&mut made, provider(total, 7), None).await;
        // … then the answer names it.
        let named = ProviderFact::Operation {
            kind: OperationKind::Refund,
            charge_id: charge.clone(),
            psp_key: first_refund_psp_key.clone(),
            provider_id: Some("re_identified_1".into()),
            amount: Amount::new(1_000),
            outcome: OperationOutcome::Succeeded,
            request: None,
        };
        self.run(&mut made, provider(named, 8), refund_key).await;

        let second_key = Some("refund-key-10");
        let request_refund = PaymentCommand::RequestRefund {
            amount: Amount::new(500),
            at: at(9),
        };
        self.run(&mut made, request_refund, second_key).await;
        let second_refund_psp_key = made.last_psp_key(OperationKind::Refund);
        let answered = ProviderFact::Operation {
            kind: OperationKind::Refund,
            charge_id: charge.clone(),
            psp_key: second_refund_psp_key.clone(),
            provider_id: Some("re_settled_2".into()),
            amount: Amount::new(500),
            outcome: OperationOutcome::Succeeded,
            request: Some(ProviderRequest {
                id: "req_refund_2".into(),
                replayed: false,
            }),
        };
        self.run(&mut made, provider(answered, 10), second_key)
            .await;
        let dispute = ProviderFact::DisputeOpened {
            charge_id: charge.clone(),
            dispute_id: "du_search_1".into(),
            amount: Amount::new(2_000),
        };
        self.run(&mut made, provider(dispute, 11), None).await;

        let record = made.payment.record.as_ref().unwrap();
        let mut expected: Vec<(String, &'static str)> = vec![
            (made.id().to_string(), "payment_id"),
            ("create-key-1001".into(), "idempotency_key"),
            ("capture-key-7".into(), "idempotency_key"),
            ("refund-key-9".into(), "idempotency_key"),
            ("refund-key-10".into(), "idempotency_key"),
            (record.psp_key.clone(), "psp_key"),
            (capture_psp_key, "psp_key"),
            (first_refund_psp_key, "psp_key"),
            (second_refund_psp_key, "psp_key"),
            (charge, "charge_id"),
            ("cap_op_1".into(), "operation_id"),
            ("re_identified_1".into(), "operation_id"),
            ("re_settled_2".into(), "operation_id"),
            ("req_capture_1".into(), "request_id"),
            ("req_capture_2".into(), "request_id"),
            ("req_refund_2".into(), "request_id"),
            ("du_search_1".into(), "dispute_id"),
            ("txn_fee_1".into(), "transaction_id"),
            ("1001".into(), "metadata"),
            ("CUST-9".into(), "metadata"),
            ("42".into(), "metadata"),
            ("Blue shoes, size 42".into(), "description"),
        ];
        // Every journal entry the payment posted.
        let events = self
            .store
            .read_stream(&payment_stream(made.id()), 1, 1_000)
            .await
            .unwrap();
        let mut entries = 0;
        for event in &events {
            let decoded =
                PaymentEvent::decode(&event.event_type, event.schema, event.data.value()).unwrap();
            if let PaymentEvent::EntryPosted(e) = decoded {
                expected.push((e.entry.id().to_string(), "entry_id"));
                entries += 1;
            }
        }
        assert!(
            entries >= 3,
            "capture, fee and refunds post entries: {entries}"
        );
        // The test's flow reached every kind of event it means to index.
        for event_type in [
            "OperationReceived",
            "OperationAnswered",
            "OperationIdentified",
            "RefundSettled",
            "DisputeOpened",
            "ProviderFeeCharged",
            "CaptureRequested",
            "RefundRequested",
        ] {
            assert!(
                events.iter().any(|e| e.event_type == event_type),
                "no {event_type} in {:?}",
                events.iter().map(|e| &e.event_type).collect::<Vec<_>>()
            );
        }
        (made, expected)
    }

    /// Waits until every committed event is readable (on PostgreSQL other suites sharing the
    /// server hold back the gap-free horizon).
    async fn settle(&self) {
        let started = Instant::now();
        loop {
            let last: Option<i64> = on_db!(&self.db, pool => {
                sqlx::query_scalar("SELECT max(position) FROM events").fetch_one(pool).await.unwrap()
            });
            if last.unwrap_or(0) <= self.store.head().await.unwrap().position() {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "events never became readable"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn caught_up(&self) {
        self.settle().await;
        let started = Instant::now();
        loop {
            let head = self.store.head().await.unwrap();
            let at = asiento_projector::checkpoint(&self.db, asiento_payment_search::NAME)
                .await
                .unwrap()
                .unwrap();
            if at.cursor == head {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "projector not caught up"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A runner with small batches, so that payments straddle batches.
    fn start(&self) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
        let config = RunnerConfig {
            batch_size_max: 5,
            lease_ms: 1_000,
            heartbeat_ms: 200,
            idle_poll_ms: 50,
            backoff_ms_max: 500,
            ..RunnerConfig::new("runner")
        };
        let runner = Runner::new(
            self.db.clone(),
            self.store.clone(),
            asiento_payment_search::projection(),
            config,
        );
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(runner.run(async move {
            let _ = stopped.await;
        }));
        (stop, handle)
    }

    async fn execute(&self, sql: &str) -> u64 {
        on_db!(&self.db, pool => sqlx::query(sql).execute(pool).await.unwrap().rows_affected())
    }

    /// Every row of the index and every waiting term, in one order.
    async fn rows(&self) -> (Vec<(String, String, String, String, i64)>, Vec<String>) {
        on_db!(&self.db, pool => {
            let rows = sqlx::query_as(
                "SELECT payment_id, term, kind, tenant, created_ms FROM payment_search \
                 ORDER BY payment_id, term, kind",
            )
            .fetch_all(pool)
            .await
            .unwrap();
            let waiting = sqlx::query_scalar(
                "SELECT payment_id || ' ' || term || ' ' || kind FROM payment_search_waiting \
                 ORDER BY 1",
            )
            .fetch_all(pool)
            .await
            .unwrap();
            (rows, waiting)
        })
    }

    async fn find(&self, tenant: &str, term: &str) -> Vec<Match> {
        find(&self.db, &TenantId::parse(tenant).unwrap(), term, 10)
            .await
            .unwrap()
    }

    /// Applies `batch` to generation 1 in one transaction, as a runner's batch.
    async fn apply(&self, batch: &[RecordedEvent]) {
        let mut tx = self.db.begin().await.unwrap();
        PaymentSearch.apply(&mut tx, 1, batch).await.unwrap();
        tx.commit().await.unwrap();
    }
}

fn found(made: &Made, kind: &str) -> Vec<Match> {
    vec![Match {
        payment_id: made.id().to_string(),
        kind: kind.to_owned(),
    }]
}

/// The harness of a test on `backend`.
async fn harness(backend: Backend) -> Harness {
    Harness::new(backend).await
}

asiento_testkit::both_backends!(
    fixture = harness;
    a_payment_is_found_by_every_kind_of_term,
    another_tenants_payments_are_never_found,
    several_payments_come_newest_first_each_once_up_to_the_limit,
    a_rebuild_gives_the_same_rows_and_verify_finds_a_hand_edit,
    an_event_applied_twice_adds_nothing_and_order_does_not_matter,
    min_position_waits_for_the_projector_then_reports_lagging,
);

async fn a_payment_is_found_by_every_kind_of_term(h: Harness) {
    let (made, expected) = h.rich().await;
    let (stop, handle) = h.start();
    h.caught_up().await;

    let kinds: std::collections::BTreeSet<&str> = expected.iter().map(|(_, k)| *k).collect();
    assert_eq!(
        kinds.len(),
        asiento_payment_search::Kind::ALL.len(),
        "{kinds:?}"
    );
    for (term, kind) in &expected {
        assert_eq!(h.find(ACME, term).await, found(&made, kind), "{term:?}");
    }
    // Terms are trimmed on the way in and on the way out, and matched exactly otherwise.
    assert_eq!(h.find(ACME, "  CUST-9\t").await, found(&made, "metadata"));
    assert_eq!(h.find(ACME, "cust-9").await, vec![]);
    assert_eq!(h.find(ACME, "pi_3Search").await, vec![]);
    assert_eq!(h.find(ACME, "").await, vec![]);
    assert_eq!(h.find(ACME, "   ").await, vec![]);
    // Longer than 255 characters, not a string, or nested: not indexed.
    assert_eq!(h.find(ACME, &"x".repeat(300)).await, vec![]);
    assert_eq!(h.find(ACME, "true").await, vec![]);
    assert_eq!(h.find(ACME, "inner").await, vec![]);
    // Every row the payment has is one the test expects.
    let (rows, waiting) = h.rows().await;
    assert!(waiting.is_empty(), "{waiting:?}");
    let mut stored: Vec<(String, String)> = rows
        .iter()
        .map(|(payment, term, kind, tenant, created_ms)| {
            assert_eq!(payment, &made.id().to_string());
            assert_eq!(tenant, ACME);
            assert_eq!(*created_ms, base_time().timestamp_millis());
            (term.clone(), kind.clone())
        })
        .collect();
    stored.sort();
    let mut want: Vec<(String, String)> = expected
        .iter()
        .map(|(term, kind)| (term.clone(), (*kind).to_owned()))
        .collect();
    want.sort();
    assert_eq!(stored, want);
    assert_eq!(verify(&h.db, h.store.as_ref()).await.unwrap(), vec![]);
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn another_tenants_payments_are_never_found(h: Harness) {
    let (made, expected) = h.rich().await;
    // Globex's payment shares the order number and the create key with acme's.
    let theirs = h
        .create(
            GLOBEX,
            "create-key-1001",
            json!({"order": "1001"}),
            None,
            at(60),
        )
        .await;
    let (stop, handle) = h.start();
    h.caught_up().await;

    assert_eq!(h.find(ACME, "1001").await, found(&made, "metadata"));
    assert_eq!(h.find(GLOBEX, "1001").await, found(&theirs, "metadata"));
    assert_eq!(
        h.find(GLOBEX, "create-key-1001").await,
        found(&theirs, "idempotency_key")
    );
    for (term, _) in &expected {
        if term == "1001" || term == "create-key-1001" {
            continue;
        }
        assert_eq!(h.find(GLOBEX, term).await, vec![], "{term:?}");
        assert_eq!(h.find("initech", term).await, vec![], "{term:?}");
    }
    assert_eq!(
        h.find(ACME, &theirs.id().to_string()).await,
        vec![],
        "another tenant's payment id"
    );
    assert_eq!(theirs.tenant(), GLOBEX);
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn several_payments_come_newest_first_each_once_up_to_the_limit(h: Harness) {
    let mut made = Vec::new();
    // Created out of order; the newest is the one created last in time, not in the log.
    for (i, seconds) in [30, 10, 50, 20, 40].into_iter().enumerate() {
        // The shared reference is both the metadata value and, for the first, its create key.
        let key = if i == 0 {
            "shared-ref".to_owned()
        } else {
            format!("key-{i}")
        };
        made.push(
            h.create(
                ACME,
                &key,
                json!({"batch": "shared-ref"}),
                None,
                at(seconds),
            )
            .await,
        );
    }
    let (stop, handle) = h.start();
    h.caught_up().await;
    let acme = TenantId::parse(ACME).unwrap();
    let by_age = [2, 4, 0, 3, 1];
    let want: Vec<Match> = by_age
        .iter()
        .map(|&i| Match {
            payment_id: made[i].id().to_string(),
            // Named by its create key and its metadata, it is reported by the key.
            kind: if i == 0 {
                "idempotency_key"
            } else {
                "metadata"
            }
            .to_owned(),
        })
        .collect();
    assert_eq!(find(&h.db, &acme, "shared-ref", 10).await.unwrap(), want);
    for limit in [1, 2, 3] {
        let got = find(&h.db, &acme, "shared-ref", limit).await.unwrap();
        assert_eq!(got, want[..usize::try_from(limit).unwrap()], "{limit}");
    }
    // The limit is clamped, never refused.
    assert_eq!(
        find(&h.db, &acme, "shared-ref", 0).await.unwrap(),
        want[..1]
    );
    assert_eq!(
        find(&h.db, &acme, "shared-ref", -5).await.unwrap(),
        want[..1]
    );
    assert_eq!(
        find(&h.db, &acme, "shared-ref", i64::MAX).await.unwrap(),
        want
    );
    assert_eq!(FIND_LIMIT_MAX, 50);
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn a_rebuild_gives_the_same_rows_and_verify_finds_a_hand_edit(h: Harness) {
    let (made, _) = h.rich().await;
    for i in 0..6 {
        h.create(
            if i % 2 == 0 { ACME } else { GLOBEX },
            &format!("key-{i}"),
            json!({"order": format!("{i}")}),
            Some("a description"),
            at(100 + i),
        )
        .await;
    }
    let (stop, handle) = h.start();
    h.caught_up().await;
    assert_eq!(verify(&h.db, h.store.as_ref()).await.unwrap(), vec![]);
    let before = h.rows().await;
    assert!(before.0.len() > 30, "{}", before.0.len());

    let edited = h
        .execute(&format!(
            "UPDATE payment_search_g1 SET tenant = 'globex' WHERE payment_id = '{}' \
             AND kind = 'charge_id'",
            made.id()
        ))
        .await;
    assert_eq!(edited, 1);
    let deleted = h
        .execute("DELETE FROM payment_search_g1 WHERE term = 'du_search_1'")
        .await;
    assert_eq!(deleted, 1);
    // A waiting row of a payment the log does not have.
    let orphan = "pay_00000000000000000000000000000000";
    let inserted = h
        .execute(&format!(
            "INSERT INTO payment_search_waiting_g1 (payment_id, term, kind) \
             VALUES ('{orphan}', 'no-such-key', 'idempotency_key')"
        ))
        .await;
    assert_eq!(inserted, 1);
    let mismatches = verify(&h.db, h.store.as_ref()).await.unwrap();
    let paged = verify_in_pages(&h.db, h.store.as_ref(), 2).await.unwrap();
    assert_eq!(
        paged, mismatches,
        "two payments a page finds what one page finds"
    );
    assert_eq!(mismatches.len(), 3, "{mismatches:?}");
    let extra = mismatches.iter().find(|m| m.payment_id == orphan).unwrap();
    assert_eq!(
        (extra.stored.as_ref(), extra.derived.as_ref()),
        (Some(&None), None)
    );
    let moved = mismatches.iter().find(|m| m.kind == "charge_id").unwrap();
    assert_eq!(moved.term, "pi_3SearchCharge");
    assert_eq!(moved.stored.as_ref().unwrap().as_ref().unwrap().0, GLOBEX);
    assert_eq!(moved.derived.as_ref().unwrap().as_ref().unwrap().0, ACME);
    let missing = mismatches.iter().find(|m| m.kind == "dispute_id").unwrap();
    assert_eq!(
        (missing.payment_id.as_str(), missing.stored.as_ref()),
        (made.id().to_string().as_str(), None)
    );

    let report = rebuild(
        &h.db,
        &h.store,
        &PaymentSearch,
        &RebuildConfig::new("rebuilder"),
        std::future::pending(),
    )
    .await
    .unwrap();
    assert_eq!(report.generation, 2);
    h.caught_up().await;
    assert_eq!(verify(&h.db, h.store.as_ref()).await.unwrap(), vec![]);
    assert_eq!(h.rows().await, before);
    assert_eq!(
        h.find(ACME, "du_search_1").await,
        found(&made, "dispute_id")
    );
    stop.send(()).unwrap();
    handle.await.unwrap();
}

/// The runtime applies each event once; this pins that a batch applied again (a retried
/// batch, an overlapping rebuild) changes nothing, and that a stream's events in any order,
/// even before its `PaymentIntended`, end with the same rows.
async fn an_event_applied_twice_adds_nothing_and_order_does_not_matter(h: Harness) {
    let (made, expected) = h.rich().await;
    h.settle().await;
    let events = h
        .store
        .read_stream(&payment_stream(made.id()), 1, 1_000)
        .await
        .unwrap();

    // Everything after the intent first: nothing can be found, the terms wait for the tenant.
    h.apply(&events[1..]).await;
    let (rows, waiting) = h.rows().await;
    assert!(rows.is_empty(), "{rows:?}");
    assert!(!waiting.is_empty());
    assert_eq!(h.find(ACME, "pi_3SearchCharge").await, vec![]);
    // The intent lets them in.
    h.apply(&events[..1]).await;
    let once = h.rows().await;
    assert!(once.1.is_empty(), "{:?}", once.1);
    assert_eq!(once.0.len(), expected.len());
    assert_eq!(
        h.find(ACME, "pi_3SearchCharge").await,
        found(&made, "charge_id")
    );

    // Applied again, whole or in part, in any order: nothing changes.
    h.apply(&events).await;
    assert_eq!(h.rows().await, once);
    let mut reversed = events.clone();
    reversed.reverse();
    h.apply(&reversed[..4]).await;
    h.apply(&reversed).await;
    assert_eq!(h.rows().await, once);
}

async fn min_position_waits_for_the_projector_then_reports_lagging(h: Harness) {
    let (stop, handle) = h.start();
    let made = h
        .create(ACME, "wait-key", json!({"order": "w-1"}), None, at(0))
        .await;
    wait_for_position(&h.db, h.store.as_ref(), made.last_position)
        .await
        .unwrap();
    assert_eq!(h.find(ACME, "w-1").await, found(&made, "metadata"));
    stop.send(()).unwrap();
    handle.await.unwrap();

    let started = Instant::now();
    let lagging = wait_for_position(&h.db, h.store.as_ref(), i64::MAX / 2).await;
    assert!(
        matches!(lagging, Err(SearchError::ProjectionLagging { .. })),
        "{lagging:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(4_900));
}
