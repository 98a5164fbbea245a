//! The payments read model against both backends. Payments are made by the domain's own
//! `decide`, appended to the real event store and projected by the real runner; every check
//! compares with the reference the test keeps itself: each payment's state folded in memory as
//! it was decided (never read back through the store or the read model).

#![allow(clippy::unwrap_used)] // test code: a failed setup step should panic loudly

use asiento_testkit::{Backend, TestDatabase};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use asiento_domain::{
    decide_payment, evolve_payment, payment_stream, Amount, CaptureMode, CreatePayment, Currency,
    CustomerId, FeeSchedule, Payment, PaymentCommand, PaymentId, PaymentStatus, ProviderFact,
    ProviderName, TenantId,
};
use asiento_eventstore::{
    Appended, Database, EventStore, ExpectedVersion, Metadata, NewEvent, StreamAppend,
};
use asiento_payments_view::{
    get_payment, list_payments, verify, verify_in_pages, wait_for_position, Mismatch, Page,
    PaymentFilter, PaymentRow, Payments, ViewError, LIST_LIMIT_MAX,
};
use asiento_projector::{on_db, rebuild, Projection, RebuildConfig, Runner, RunnerConfig};
use chrono::{DateTime, Utc};
use tokio::sync::oneshot;
use uuid::Uuid;

const ACME: &str = "acme";
const GLOBEX: &str = "globex";
/// Payments made by `make_many`; enough for several pages and every status.
const PAYMENTS: usize = 30;

struct Harness {
    db: Database,
    store: Arc<dyn EventStore>,
    _test_db: TestDatabase,
}

/// A payment as the test decided it: the reference the read model is checked against.
#[derive(Clone)]
struct Made {
    payment: Payment,
    last_position: i64,
}

impl Made {
    fn id(&self) -> PaymentId {
        self.payment.record.as_ref().unwrap().id
    }

    fn tenant(&self) -> &str {
        self.payment.record.as_ref().unwrap().tenant.as_str()
    }

    /// The row the read model must hold for this payment.
    fn expected(&self) -> PaymentRow {
        let r = self.payment.record.as_ref().unwrap();
        PaymentRow {
            id: r.id,
            tenant: r.tenant.as_str().to_owned(),
            status: r.status,
            amount_minor: r.amount.minor(),
            currency: r.currency.code().to_owned(),
            customer: r.customer.as_str().to_owned(),
            provider: r.provider.as_str().to_owned(),
            captured_minor: r.captured.minor(),
            refunded_minor: r.refunded.minor(),
            fee_minor: r.fee_net().unwrap().minor(),
            description: r.description.clone(),
            metadata: r.metadata.clone(),
            created_at: r.created_at,
            updated_at: r.updated_at,
            next_action: r.next_action.clone(),
            version: self.payment.version,
            position: self.last_position,
        }
    }
}

/// What happens to a payment after it is created.
#[derive(Clone, Copy)]
enum Fate {
    Pending,
    Captured,
    PartiallyRefunded,
    RequiresAction,
    Failed,
}

const FATES: [Fate; 5] = [
    Fate::Pending,
    Fate::Captured,
    Fate::PartiallyRefunded,
    Fate::RequiresAction,
    Fate::Failed,
];

fn at(base: DateTime<Utc>, seconds: i64) -> DateTime<Utc> {
    base + chrono::Duration::seconds(seconds)
}

/// A creation time with nanoseconds, which PostgreSQL timestamps would lose.
fn base_time() -> DateTime<Utc> {
    DateTime::from_timestamp_nanos(1_764_000_000_123_456_789)
}

impl Harness {
    async fn new(backend: Backend) -> Harness {
        let test_db = TestDatabase::open(backend).await;
        let db = test_db.database().clone();
        asiento_payments_view::install(&db).await.unwrap();
        // Installing twice changes nothing.
        asiento_payments_view::install(&db).await.unwrap();
        Harness {
            store: db.event_store(),
            db,
            _test_db: test_db,
        }
    }

    /// Decides `command` for `made` and appends what it decided.
    async fn run(&self, made: &mut Made, command: PaymentCommand) {
        let events = decide_payment(&made.payment, command).unwrap();
        assert!(!events.is_empty(), "the command decided nothing");
        let record = made.payment.record.as_ref();
        let (stream, tenant) = match (record, &events[0]) {
            (Some(r), _) => (payment_stream(r.id), r.tenant.to_string()),
            (None, asiento_domain::PaymentEvent::PaymentIntended(e)) => {
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
                    ..Metadata::default()
                },
            })
            .collect();
        let appended: Appended = self
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

    async fn make(
        &self,
        tenant: &str,
        customer: &str,
        amount: i64,
        created: DateTime<Utc>,
        fate: Fate,
    ) -> Made {
        let mut made = Made {
            payment: Payment::default(),
            last_position: 0,
        };
        let id = PaymentId::from_uuid(Uuid::new_v4());
        self.run(
            &mut made,
            PaymentCommand::Create(CreatePayment {
                id,
                tenant: TenantId::parse(tenant).unwrap(),
                amount: Amount::new(amount),
                currency: Currency::parse("USD").unwrap(),
                customer: CustomerId::parse(customer).unwrap(),
                provider: ProviderName::parse("sim").unwrap(),
                capture_mode: CaptureMode::Automatic,
                description: Some(format!("order of {amount}")),
                metadata: metadata(amount),
                payment_method: None,
                at: created,
            }),
        )
        .await;
        let charge_id = format!("ch_{}", id.as_uuid().simple());
        let later = |s| at(created, s);
        let fees = FeeSchedule::new(300, Amount::ZERO).unwrap();
        let fact = |fact, s| PaymentCommand::Provider {
            fact,
            fees,
            at: later(s),
        };
        match fate {
            Fate::Pending => {}
            Fate::Captured | Fate::PartiallyRefunded => {
                self.run(
                    &mut made,
                    fact(
                        ProviderFact::Captured {
                            charge_id: charge_id.clone(),
                            amount: Amount::new(amount),
                        },
                        2,
                    ),
                )
                .await;
                if let Fate::PartiallyRefunded = fate {
                    self.run(
                        &mut made,
                        PaymentCommand::RequestRefund {
                            amount: Amount::new(amount / 4),
                            at: later(3),
                        },
                    )
                    .await;
                    self.run(
                        &mut made,
                        fact(
                            ProviderFact::Refunded {
                                charge_id,
                                amount_refunded: Amount::new(amount / 4),
                                current: false,
                            },
                            4,
                        ),
                    )
                    .await;
                }
            }
            Fate::RequiresAction => {
                self.run(
                    &mut made,
                    fact(
                        ProviderFact::ActionRequired {
                            charge_id,
                            redirect_url: "https://sim.example/3ds".into(),
                        },
                        1,
                    ),
                )
                .await;
            }
            Fate::Failed => {
                self.run(
                    &mut made,
                    fact(
                        ProviderFact::Failed {
                            charge_id: Some(charge_id),
                            reason: "card_declined".into(),
                        },
                        1,
                    ),
                )
                .await;
            }
        }
        made
    }

    /// `PAYMENTS` payments over two tenants, two customers, every fate; two at each creation
    /// time, so that ties are ordered by id.
    /// What `verify` finds, which must be what it finds two payments a page (its default page
    /// holds every payment of these tests).
    async fn verified(&self) -> Vec<Mismatch> {
        let whole = verify(&self.db, self.store.as_ref()).await.unwrap();
        let paged = verify_in_pages(&self.db, self.store.as_ref(), 2)
            .await
            .unwrap();
        assert_eq!(
            paged, whole,
            "two payments a page finds what one page finds"
        );
        whole
    }

    async fn make_many(&self) -> Vec<Made> {
        let mut made = Vec::new();
        for i in 0..PAYMENTS {
            let tenant = if i % 3 == 0 { GLOBEX } else { ACME };
            let customer = if i % 2 == 0 { "1" } else { "2" };
            let seconds = i64::try_from(i / 2).unwrap() * 60;
            let amount = 1_000 * (i64::try_from(i).unwrap() + 1);
            made.push(
                self.make(
                    tenant,
                    customer,
                    amount,
                    at(base_time(), seconds),
                    FATES[i % FATES.len()],
                )
                .await,
            );
        }
        made
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
            let at = asiento_projector::checkpoint(&self.db, "payments")
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
            batch_size_max: 7,
            lease_ms: 1_000,
            heartbeat_ms: 200,
            idle_poll_ms: 50,
            backoff_ms_max: 500,
            ..RunnerConfig::new("runner")
        };
        let runner = Runner::new(
            self.db.clone(),
            self.store.clone(),
            asiento_payments_view::projection(),
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

    /// Every page of a listing, following `next_cursor`; asserts each page's size.
    async fn all_pages(&self, tenant: &str, filter: PaymentFilter) -> Vec<PaymentRow> {
        let tenant = TenantId::parse(tenant).unwrap();
        let limit = usize::try_from(filter.limit).unwrap();
        let mut rows = Vec::new();
        let mut cursor = None;
        loop {
            let page: Page = list_payments(
                &self.db,
                &tenant,
                PaymentFilter {
                    cursor: cursor.take(),
                    ..filter.clone()
                },
            )
            .await
            .unwrap();
            assert!(page.data.len() <= limit);
            rows.extend(page.data.iter().cloned());
            match page.next_cursor {
                Some(next) => {
                    assert_eq!(page.data.len(), limit, "a short page with a next cursor");
                    cursor = Some(next);
                }
                None => return rows,
            }
        }
    }
}

/// A payment's metadata: an order number, a channel (two payments in three `web`), a key
/// with characters JSON paths would quote, and the amount as a number (shown, never matched by a
/// filter's text).
fn metadata(amount: i64) -> serde_json::Map<String, serde_json::Value> {
    let channel = if amount % 3_000 == 0 { "app" } else { "web" };
    serde_json::json!({
        "order_id": format!("ord-{amount}"),
        "channel": channel,
        "shop.\"region\"": "eu",
        "amount": amount,
    })
    .as_object()
    .unwrap()
    .clone()
}

/// The reference listing: the tenant's payments that `keep` accepts, newest first, ties by id.
fn expected(made: &[Made], tenant: &str, keep: impl Fn(&PaymentRow) -> bool) -> Vec<PaymentRow> {
    let mut rows: Vec<PaymentRow> = made
        .iter()
        .filter(|m| m.tenant() == tenant)
        .map(Made::expected)
        .filter(|r| keep(r))
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse((r.created_at, r.id.to_string())));
    rows
}

fn filter(limit: u32) -> PaymentFilter {
    PaymentFilter {
        limit,
        ..PaymentFilter::default()
    }
}

/// The harness of a test on `backend`.
async fn harness(backend: Backend) -> Harness {
    Harness::new(backend).await
}

asiento_testkit::both_backends!(
    fixture = harness;
    rows_are_the_fold_of_their_streams_and_list_newest_first,
    every_filter_selects_exactly_the_matching_payments,
    pages_neither_skip_nor_repeat_while_payments_are_created,
    tenants_never_see_each_other,
    bad_limits_and_cursors_are_typed_errors,
    min_position_waits_for_the_projector_then_reports_lagging,
    a_corrupted_row_is_detected_and_a_rebuild_restores_the_same_rows,
    versions_arriving_out_of_global_order_wait_for_the_gap,
);

async fn rows_are_the_fold_of_their_streams_and_list_newest_first(h: Harness) {
    let made = h.make_many().await;
    let (stop, handle) = h.start();
    h.caught_up().await;

    for tenant in [ACME, GLOBEX] {
        let page = list_payments(
            &h.db,
            &TenantId::parse(tenant).unwrap(),
            filter(LIST_LIMIT_MAX),
        )
        .await
        .unwrap();
        assert_eq!(page.data, expected(&made, tenant, |_| true), "{tenant}");
        assert_eq!(page.next_cursor, None);
    }
    // Spot-check one against API.md's numbers: a 3% fee, part of it given back by the refund.
    let refunded = made
        .iter()
        .map(Made::expected)
        .find(|r| r.status == PaymentStatus::PartiallyRefunded)
        .unwrap();
    let got = get_payment(
        &h.db,
        &TenantId::parse(&refunded.tenant).unwrap(),
        refunded.id,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(got, refunded);
    assert_eq!(got.captured_minor, got.amount_minor);
    assert_eq!(got.refunded_minor, got.amount_minor / 4);
    let fee = (got.amount_minor * 3 + 50) / 100;
    assert!(got.fee_minor > 0 && got.fee_minor < fee, "{got:?}");
    assert_eq!(got.created_at.timestamp_subsec_nanos() % 1_000, 789);
    let action = made
        .iter()
        .map(Made::expected)
        .find(|r| r.status == PaymentStatus::RequiresAction)
        .unwrap();
    assert!(action.next_action.is_some());
    let json = serde_json::to_value(&got).unwrap();
    assert_eq!(json["id"], got.id.to_string());
    assert_eq!(json["status"], "partially_refunded");
    assert!(json.get("tenant").is_none() && json.get("version").is_none());

    assert_eq!(verify(&h.db, h.store.as_ref()).await.unwrap(), vec![]);
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn every_filter_selects_exactly_the_matching_payments(h: Harness) {
    let made = h.make_many().await;
    let (stop, handle) = h.start();
    h.caught_up().await;

    let gte = at(base_time(), 3 * 60);
    let lt = at(base_time(), 9 * 60);
    for status in PaymentStatus::ALL {
        let got = h
            .all_pages(
                ACME,
                PaymentFilter {
                    status: Some(status),
                    ..filter(2)
                },
            )
            .await;
        assert_eq!(
            got,
            expected(&made, ACME, |r| r.status == status),
            "{status}"
        );
    }
    for customer in ["1", "2", "3"] {
        let got = h
            .all_pages(
                ACME,
                PaymentFilter {
                    customer: Some(CustomerId::parse(customer).unwrap()),
                    provider: None,
                    ..filter(3)
                },
            )
            .await;
        let want = expected(&made, ACME, |r| r.customer == customer);
        assert_eq!(got, want, "customer {customer}");
        assert_eq!(want.is_empty(), customer == "3");
    }
    let got = h
        .all_pages(
            ACME,
            PaymentFilter {
                created_gte: Some(gte),
                created_lt: Some(lt),
                ..filter(4)
            },
        )
        .await;
    let want = expected(&made, ACME, |r| r.created_at >= gte && r.created_at < lt);
    assert!(want.len() >= 4, "{}", want.len());
    assert_eq!(got, want);
    // The bounds are exact to the nanosecond: one nanosecond later excludes the payments
    // created exactly at `gte`.
    let one_ns = chrono::Duration::nanoseconds(1);
    let got = h
        .all_pages(
            ACME,
            PaymentFilter {
                created_gte: Some(gte + one_ns),
                ..filter(50)
            },
        )
        .await;
    assert_eq!(got, expected(&made, ACME, |r| r.created_at > gte));
    let got = h
        .all_pages(
            ACME,
            PaymentFilter {
                created_lt: Some(lt + one_ns),
                ..filter(50)
            },
        )
        .await;
    assert_eq!(got, expected(&made, ACME, |r| r.created_at <= lt));
    // Everything at once.
    let got = h
        .all_pages(
            ACME,
            PaymentFilter {
                status: Some(PaymentStatus::Captured),
                customer: Some(CustomerId::parse("2").unwrap()),
                provider: None,
                created_gte: Some(base_time()),
                created_lt: Some(at(base_time(), 3_600)),
                ..filter(1)
            },
        )
        .await;
    let want = expected(&made, ACME, |r| {
        r.status == PaymentStatus::Captured && r.customer == "2"
    });
    assert!(!want.is_empty());
    assert_eq!(got, want);

    // By amount, by last change, by metadata.
    let got = h
        .all_pages(
            ACME,
            PaymentFilter {
                amount_gte: Some(5_000),
                amount_lte: Some(20_000),
                ..filter(3)
            },
        )
        .await;
    let want = expected(&made, ACME, |r| (5_000..=20_000).contains(&r.amount_minor));
    assert!(want.len() >= 3, "{}", want.len());
    assert_eq!(got, want);
    let changed = at(base_time(), 4 * 60 + 2);
    for (gte, lt) in [(Some(changed), None), (None, Some(changed))] {
        let got = h
            .all_pages(
                ACME,
                PaymentFilter {
                    updated_gte: gte,
                    updated_lt: lt,
                    ..filter(5)
                },
            )
            .await;
        let want = expected(&made, ACME, |r| {
            gte.is_none_or(|gte| r.updated_at >= gte) && lt.is_none_or(|lt| r.updated_at < lt)
        });
        assert!(!want.is_empty());
        assert_eq!(got, want);
    }
    let text = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let matching = |r: &PaymentRow, pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .all(|(k, v)| r.metadata.get(*k).and_then(|x| x.as_str()) == Some(*v))
    };
    for pairs in [
        &[("order_id", "ord-5000")][..],
        &[("channel", "web")],
        &[("channel", "app"), ("shop.\"region\"", "eu")],
        &[("channel", "app"), ("order_id", "ord-5000")],
        // A number is shown, never matched by text.
        &[("amount", "5000")],
        &[("missing", "web")],
    ] {
        let got = h
            .all_pages(
                ACME,
                PaymentFilter {
                    metadata: text(pairs),
                    ..filter(4)
                },
            )
            .await;
        assert_eq!(
            got,
            expected(&made, ACME, |r| matching(r, pairs)),
            "{pairs:?}"
        );
    }
    assert_eq!(
        h.all_pages(
            ACME,
            PaymentFilter {
                metadata: text(&[("channel", "web")]),
                ..filter(50)
            }
        )
        .await
        .len(),
        expected(&made, ACME, |r| r.metadata["channel"] == "web").len()
    );
    let too_many: Vec<(String, String)> = (0..=asiento_payments_view::METADATA_FILTERS_MAX)
        .map(|n| (format!("k{n}"), "v".to_owned()))
        .collect();
    assert!(matches!(
        list_payments(
            &h.db,
            &TenantId::parse(ACME).unwrap(),
            PaymentFilter {
                metadata: too_many,
                ..filter(5)
            }
        )
        .await,
        Err(ViewError::TooManyMetadataFilters { count: 11 })
    ));
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn pages_neither_skip_nor_repeat_while_payments_are_created(h: Harness) {
    let mut made = h.make_many().await;
    let (stop, handle) = h.start();
    h.caught_up().await;
    let before = expected(&made, ACME, |_| true);

    let tenant = TenantId::parse(ACME).unwrap();
    let mut seen = Vec::new();
    let mut cursor = None;
    let mut round = 0;
    loop {
        let page = list_payments(
            &h.db,
            &tenant,
            PaymentFilter {
                cursor: cursor.take(),
                ..filter(3)
            },
        )
        .await
        .unwrap();
        seen.extend(page.data);
        // Between pages, newer payments arrive (they belong before the first page) and one
        // older than everything (it belongs on the last page).
        round += 1;
        let newer = at(base_time(), 10_000 + round);
        made.push(h.make(ACME, "1", 500, newer, Fate::Captured).await);
        if round == 2 {
            let oldest = at(base_time(), -10_000);
            made.push(h.make(ACME, "2", 700, oldest, Fate::Pending).await);
        }
        h.caught_up().await;
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let ids: HashSet<PaymentId> = seen.iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), seen.len(), "a payment was listed twice");
    let oldest = made
        .iter()
        .find(|m| m.expected().amount_minor == 700)
        .unwrap();
    let mut want = before;
    want.push(oldest.expected());
    assert_eq!(seen, want);
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn tenants_never_see_each_other(h: Harness) {
    let made = h.make_many().await;
    let (stop, handle) = h.start();
    h.caught_up().await;
    let acme = TenantId::parse(ACME).unwrap();
    let globex = TenantId::parse(GLOBEX).unwrap();
    let theirs = h.all_pages(GLOBEX, filter(100)).await;
    assert!(!theirs.is_empty());
    assert!(theirs.iter().all(|r| r.tenant == GLOBEX));
    for m in &made {
        let (own, other) = if m.tenant() == ACME {
            (&acme, &globex)
        } else {
            (&globex, &acme)
        };
        assert_eq!(
            get_payment(&h.db, own, m.id()).await.unwrap(),
            Some(m.expected())
        );
        assert_eq!(get_payment(&h.db, other, m.id()).await.unwrap(), None);
    }
    // A tenant with no payments lists nothing.
    let nobody = TenantId::parse("initech").unwrap();
    let page = list_payments(&h.db, &nobody, filter(10)).await.unwrap();
    assert!(page.data.is_empty() && page.next_cursor.is_none());
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn bad_limits_and_cursors_are_typed_errors(h: Harness) {
    h.make_many().await;
    let (stop, handle) = h.start();
    h.caught_up().await;
    let acme = TenantId::parse(ACME).unwrap();
    for limit in [0, LIST_LIMIT_MAX + 1, u32::MAX] {
        let result = list_payments(&h.db, &acme, filter(limit)).await;
        assert!(
            matches!(result, Err(ViewError::LimitOutOfRange { .. })),
            "{limit}: {result:?}"
        );
    }
    let first = list_payments(&h.db, &acme, filter(2)).await.unwrap();
    let good = first.next_cursor.unwrap();
    for cursor in [
        "",
        "abc",
        "pay_00000000000000000000000000000001",
        &good[1..],
    ] {
        let result = list_payments(
            &h.db,
            &acme,
            PaymentFilter {
                cursor: Some(cursor.to_owned()),
                ..filter(2)
            },
        )
        .await;
        assert!(
            matches!(result, Err(ViewError::InvalidCursor)),
            "{cursor:?}: {result:?}"
        );
    }
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn min_position_waits_for_the_projector_then_reports_lagging(h: Harness) {
    let (stop, handle) = h.start();
    let acme = TenantId::parse(ACME).unwrap();
    for fate in FATES {
        let made = h.make(ACME, "1", 4_200, base_time(), fate).await;
        wait_for_position(&h.db, h.store.as_ref(), made.last_position)
            .await
            .unwrap();
        // Read-your-writes: the row includes the command's last event at once.
        let row = get_payment(&h.db, &acme, made.id()).await.unwrap().unwrap();
        assert_eq!(row, made.expected());
        assert_eq!(row.position, made.last_position);
    }
    stop.send(()).unwrap();
    handle.await.unwrap();

    let started = Instant::now();
    let lagging = wait_for_position(&h.db, h.store.as_ref(), i64::MAX / 2).await;
    assert!(
        matches!(lagging, Err(ViewError::ProjectionLagging { .. })),
        "{lagging:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(4_900));
}

async fn a_corrupted_row_is_detected_and_a_rebuild_restores_the_same_rows(h: Harness) {
    let made = h.make_many().await;
    let (stop, handle) = h.start();
    h.caught_up().await;
    assert_eq!(verify(&h.db, h.store.as_ref()).await.unwrap(), vec![]);
    let before = h.all_pages(ACME, filter(7)).await;

    let victim = made
        .iter()
        .find(|m| m.tenant() == ACME && m.expected().refunded_minor > 0)
        .unwrap();
    let corrupted = h
        .execute(&format!(
            "UPDATE payments_g1 SET refunded_minor = refunded_minor + 1 WHERE payment_id = '{}'",
            victim.id()
        ))
        .await;
    assert_eq!(corrupted, 1);
    let mismatches = h.verified().await;
    assert_eq!(mismatches.len(), 1, "{mismatches:?}");
    assert_eq!(mismatches[0].payment_id, victim.id().to_string());
    let stored = mismatches[0].stored.as_ref().unwrap();
    let recomputed = mismatches[0].recomputed.as_ref().unwrap();
    assert_eq!(stored.refunded_minor, recomputed.refunded_minor + 1);
    assert_eq!(recomputed, &victim.expected());

    // A missing row is a mismatch too.
    let deleted = h
        .execute(&format!(
            "DELETE FROM payments_g1 WHERE payment_id = '{}'",
            made[0].id()
        ))
        .await;
    assert_eq!(deleted, 1);
    let mismatches = h.verified().await;
    assert_eq!(mismatches.len(), 2, "{mismatches:?}");
    assert!(mismatches
        .iter()
        .any(|m| m.payment_id == made[0].id().to_string() && m.stored.is_none()));

    // A folded state edited by hand, its columns left alone: the next batch would fold onto it.
    let folded = made
        .iter()
        .rev()
        .find(|m| m.id() != victim.id() && m.id() != made[0].id())
        .unwrap();
    let set_position = match h.db {
        Database::Postgres(_) => "jsonb_set(state, '{position}', '0')",
        Database::Sqlite(_) => "json_set(state, '$.position', 0)",
    };
    let edited = h
        .execute(&format!(
            "UPDATE payments_g1 SET state = {set_position} WHERE payment_id = '{}'",
            folded.id()
        ))
        .await;
    assert_eq!(edited, 1);
    let mismatches = h.verified().await;
    assert_eq!(mismatches.len(), 3, "{mismatches:?}");
    assert!(mismatches
        .iter()
        .any(|m| m.payment_id == folded.id().to_string()
            && m.state_differs
            && m.stored == m.recomputed));

    let report = rebuild(
        &h.db,
        &h.store,
        &Payments,
        &RebuildConfig::new("rebuilder"),
        std::future::pending(),
    )
    .await
    .unwrap();
    assert_eq!(report.generation, 2);
    h.caught_up().await;
    assert_eq!(verify(&h.db, h.store.as_ref()).await.unwrap(), vec![]);
    assert_eq!(h.all_pages(ACME, filter(7)).await, before);
    assert_eq!(
        h.all_pages(GLOBEX, filter(100)).await,
        expected(&made, GLOBEX, |_| true)
    );
    stop.send(()).unwrap();
    handle.await.unwrap();
}

/// On PostgreSQL the log orders by writing transaction id, so version n+1 of a stream can come
/// before version n. The store cannot be made to do that on demand, so the test hands the
/// projection a real stream's events in such an order itself.
async fn versions_arriving_out_of_global_order_wait_for_the_gap(h: Harness) {
    let made = h
        .make(ACME, "1", 10_000, base_time(), Fate::PartiallyRefunded)
        .await;
    h.settle().await;
    let stream = payment_stream(made.id());
    let events = h.store.read_stream(&stream, 1, 100).await.unwrap();
    assert!(events.len() >= 6, "{}", events.len());
    let acme = TenantId::parse(ACME).unwrap();
    let version = |v: u64| events.iter().find(|e| e.version == v).unwrap().clone();
    let last = u64::try_from(events.len()).unwrap();

    async fn apply(h: &Harness, batch: &[asiento_eventstore::RecordedEvent]) {
        let mut tx = h.db.begin().await.unwrap();
        Payments.apply(&mut tx, 1, batch).await.unwrap();
        tx.commit().await.unwrap();
    }
    // v2 and v3 first: nothing to show without v1.
    apply(&h, &[version(3), version(2)]).await;
    assert_eq!(get_payment(&h.db, &acme, made.id()).await.unwrap(), None);
    // v1 closes the gap: the row is the fold of 1..=3.
    apply(&h, &[version(1)]).await;
    let row = get_payment(&h.db, &acme, made.id()).await.unwrap().unwrap();
    assert_eq!((row.version, row.position), (3, version(3).position));
    // The tail without v4 waits.
    let tail: Vec<_> = (5..=last).map(version).collect();
    apply(&h, &tail).await;
    let row = get_payment(&h.db, &acme, made.id()).await.unwrap().unwrap();
    assert_eq!(row.version, 3);
    // A version seen twice is refused (and the transaction rolled back).
    let mut tx = h.db.begin().await.unwrap();
    let twice = Payments.apply(&mut tx, 1, &[version(5)]).await;
    assert!(twice.is_err(), "{twice:?}");
    tx.rollback().await.unwrap();
    apply(&h, &[version(4)]).await;
    let row = get_payment(&h.db, &acme, made.id()).await.unwrap().unwrap();
    assert_eq!(row, made.expected());
    let waiting = h.execute("DELETE FROM payment_pending_g1").await;
    assert_eq!(waiting, 0, "events still waiting after the gap closed");
}
