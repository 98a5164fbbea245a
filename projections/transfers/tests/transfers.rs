//! The transfers read model against a model of what was appended, on both backends: every
//! filter (an account on either side, a status, a time range) selects exactly the transfers the
//! model says, pages neither skip nor repeat, tenants never see each other, a hold's ending
//! arriving before the hold waits for it, and `verify` finds a corrupted or missing row that a
//! rebuild then restores.
// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use asiento_domain::hold::{HoldAction, SettleHold};
use asiento_domain::transfer::{decide as decide_transfer, evolve};
use asiento_domain::{
    transfer_stream, AccountName, Amount, Currency, RequestTransfer, TenantId, Transfer,
    TransferEvent, TransferId, TransferStatus,
};
use asiento_eventstore::{
    Database, EventStore, ExpectedVersion, Metadata, NewEvent, RecordedEvent, StreamAppend,
};
use asiento_projector::{on_db, rebuild, Projection, RebuildConfig, Runner, RunnerConfig};
use asiento_testkit::{Backend, TestDatabase};
use asiento_transfer_list::{
    list_transfers, verify, verify_in_pages, ListError, TransferFilter, TransferRow, Transfers,
};
use chrono::{DateTime, Utc};
use tokio::sync::oneshot;
use uuid::Uuid;

const ACME: &str = "acme";
const GLOBEX: &str = "globex";
const ACCOUNTS: [&str; 3] = [
    "customer:1:available",
    "customer:2:available",
    "merchant:shop",
];

struct Harness {
    db: Database,
    store: Arc<dyn EventStore>,
    _test_db: TestDatabase,
}

/// A transfer as the test made it: its aggregate and the position of its last event.
#[derive(Clone)]
struct Made {
    transfer: Transfer,
    position: i64,
}

impl Made {
    fn expected(&self) -> TransferRow {
        let record = self.transfer.record.as_ref().unwrap();
        let requested = &record.requested;
        TransferRow {
            id: requested.transfer_id.to_string(),
            tenant: requested.tenant.as_str().to_owned(),
            from: requested.from.as_str().to_owned(),
            to: requested.to.as_str().to_owned(),
            status: record.status(),
            created_at: requested.at,
            object: asiento_objects::transfer_json(record, self.position),
            version: self.transfer.version,
            position: self.position,
        }
    }
}

fn base_time() -> DateTime<Utc> {
    DateTime::from_timestamp_nanos(1_764_000_000_123_456_789)
}

fn at(seconds: i64) -> DateTime<Utc> {
    base_time() + chrono::Duration::seconds(seconds)
}

impl Harness {
    async fn new(backend: Backend) -> Harness {
        let test_db = TestDatabase::open(backend).await;
        let db = test_db.database().clone();
        asiento_transfer_list::install(&db).await.unwrap();
        Harness {
            store: db.event_store(),
            db,
            _test_db: test_db,
        }
    }

    async fn append(&self, made: &mut Made, events: Vec<TransferEvent>) {
        let record = made.transfer.record.as_ref();
        let (id, tenant) = match (record, &events[0]) {
            (Some(r), _) => (r.requested.transfer_id, r.requested.tenant.to_string()),
            (None, TransferEvent::EntryPosted(posted)) => {
                let requested = posted.transfer.as_ref().unwrap();
                (requested.transfer_id, requested.tenant.to_string())
            }
            (None, other) => panic!("a transfer starts with its request, not {other:?}"),
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
        let appended = self
            .store
            .append(&[StreamAppend {
                stream_id: transfer_stream(id),
                expected: ExpectedVersion::Exact(made.transfer.version),
                events: new_events,
            }])
            .await
            .unwrap();
        for event in &events {
            made.transfer = evolve(std::mem::take(&mut made.transfer), event);
        }
        made.position = appended.last_position;
    }

    /// A transfer (or hold, ended as `end` says: 0 open, 1 posted in part, 2 voided, 3 expired).
    async fn make(&self, tenant: &str, n: usize, hold: bool, end: u8) -> Made {
        let mut made = Made {
            transfer: Transfer::default(),
            position: 0,
        };
        let id = TransferId::from_uuid(Uuid::new_v4());
        let tenant = TenantId::parse(tenant).unwrap();
        let created = at(i64::try_from(n / 2).unwrap() * 60);
        let request = RequestTransfer {
            id,
            tenant: tenant.clone(),
            from: AccountName::parse(ACCOUNTS[n % 3]).unwrap(),
            to: AccountName::parse(ACCOUNTS[(n + 1) % 3]).unwrap(),
            amount: Amount::new(1_000 + i64::try_from(n).unwrap()),
            currency: Currency::parse("USD").unwrap(),
            description: Some(format!("transfer {n}")),
            pending: hold,
            expires_at: (hold && end == 3).then(|| created + chrono::Duration::seconds(30)),
            at: created,
        };
        let events = decide_transfer(&made.transfer, request).unwrap();
        self.append(&mut made, events).await;
        let action = match (hold, end) {
            (true, 1) => Some(HoldAction::Post {
                amount: Some(Amount::new(400)),
            }),
            (true, 2) => Some(HoldAction::Void),
            (true, 3) => Some(HoldAction::Expire),
            _ => None,
        };
        if let Some(action) = action {
            let command = SettleHold {
                id,
                tenant,
                action,
                at: created + chrono::Duration::seconds(40),
            };
            let events = asiento_domain::hold::decide(&made.transfer, &command).unwrap();
            self.append(&mut made, events).await;
        }
        made
    }

    async fn make_many(&self) -> Vec<Made> {
        let mut made = Vec::new();
        for n in 0..36 {
            let tenant = if n % 4 == 3 { GLOBEX } else { ACME };
            let hold = n % 2 == 1;
            let end = u8::try_from((n / 4) % 4).unwrap();
            made.push(self.make(tenant, n, hold, end).await);
        }
        made
    }

    async fn caught_up(&self) {
        let started = Instant::now();
        loop {
            let last: Option<i64> = on_db!(&self.db, pool => {
                sqlx::query_scalar("SELECT max(position) FROM events").fetch_one(pool).await.unwrap()
            });
            let head = self.store.head().await.unwrap();
            let at = asiento_projector::checkpoint(&self.db, "transfers")
                .await
                .unwrap()
                .unwrap();
            if last.unwrap_or(0) <= head.position() && at.cursor == head {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "projector not caught up"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A runner with small batches, so that a hold and its ending straddle batches.
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
            asiento_transfer_list::projection(),
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

    /// Every page of a listing, following `next_cursor`.
    async fn all_pages(&self, tenant: &str, filter: TransferFilter) -> Vec<TransferRow> {
        let tenant = TenantId::parse(tenant).unwrap();
        let limit = usize::try_from(filter.limit).unwrap();
        let mut rows = Vec::new();
        let mut cursor = None;
        loop {
            let page = list_transfers(
                &self.db,
                &tenant,
                TransferFilter {
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

/// The reference listing: the tenant's transfers that `keep` accepts, newest first.
fn expected(made: &[Made], tenant: &str, keep: impl Fn(&TransferRow) -> bool) -> Vec<TransferRow> {
    let mut rows: Vec<TransferRow> = made
        .iter()
        .map(Made::expected)
        .filter(|r| r.tenant == tenant && keep(r))
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse((r.created_at, r.id.clone())));
    rows
}

fn filter(limit: u32) -> TransferFilter {
    TransferFilter {
        limit,
        ..TransferFilter::default()
    }
}

async fn every_filter_selects_exactly_the_matching_transfers(backend: Backend) {
    let h = Harness::new(backend).await;
    let made = h.make_many().await;
    let (stop, handle) = h.start();
    h.caught_up().await;

    assert_eq!(
        h.all_pages(ACME, filter(4)).await,
        expected(&made, ACME, |_| true)
    );
    assert_eq!(
        h.all_pages(GLOBEX, filter(100)).await,
        expected(&made, GLOBEX, |_| true)
    );
    for account in ACCOUNTS {
        let got = h
            .all_pages(
                ACME,
                TransferFilter {
                    account: Some(AccountName::parse(account).unwrap()),
                    ..filter(3)
                },
            )
            .await;
        let want = expected(&made, ACME, |r| r.from == account || r.to == account);
        assert!(!want.is_empty());
        assert_eq!(got, want, "{account}");
    }
    for status in [
        TransferStatus::Posted,
        TransferStatus::Pending,
        TransferStatus::Voided,
        TransferStatus::Expired,
    ] {
        let got = h
            .all_pages(
                ACME,
                TransferFilter {
                    status: Some(status),
                    ..filter(2)
                },
            )
            .await;
        let want = expected(&made, ACME, |r| r.status == status);
        assert!(!want.is_empty(), "{status:?}");
        assert_eq!(got, want, "{status:?}");
    }
    // A customer's open holds in a window.
    let customer = AccountName::parse(ACCOUNTS[0]).unwrap();
    let (gte, lt) = (at(3 * 60), at(12 * 60));
    let got = h
        .all_pages(
            ACME,
            TransferFilter {
                account: Some(customer.clone()),
                status: Some(TransferStatus::Pending),
                created_gte: Some(gte),
                created_lt: Some(lt),
                ..filter(1)
            },
        )
        .await;
    let want = expected(&made, ACME, |r| {
        (r.from == customer.as_str() || r.to == customer.as_str())
            && r.status == TransferStatus::Pending
            && r.created_at >= gte
            && r.created_at < lt
    });
    assert!(!want.is_empty());
    assert_eq!(got, want);
    // Bad limits and cursors are typed errors.
    let acme = TenantId::parse(ACME).unwrap();
    for limit in [0, 101] {
        assert!(matches!(
            list_transfers(&h.db, &acme, filter(limit)).await,
            Err(ListError::LimitOutOfRange { .. })
        ));
    }
    assert!(matches!(
        list_transfers(
            &h.db,
            &acme,
            TransferFilter {
                cursor: Some("tr_nope".into()),
                ..filter(5)
            }
        )
        .await,
        Err(ListError::InvalidCursor)
    ));
    assert_eq!(verify(&h.db, h.store.as_ref()).await.unwrap(), vec![]);
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn a_hold_s_ending_before_the_hold_waits_for_it(backend: Backend) {
    let h = Harness::new(backend).await;
    let made = h.make(ACME, 1, true, 1).await;
    let id = made.expected().id;
    let stream = transfer_stream(TransferId::parse(&id).unwrap());
    let events: Vec<RecordedEvent> = h.store.read_stream(&stream, 1, 100).await.unwrap();
    assert!(events.len() >= 2, "{}", events.len());
    let last = u64::try_from(events.len()).unwrap();
    let version = |v: u64| events.iter().find(|e| e.version == v).unwrap().clone();
    async fn apply(h: &Harness, batch: &[RecordedEvent]) {
        let mut tx = h.db.begin().await.unwrap();
        Transfers.apply(&mut tx, 1, batch).await.unwrap();
        tx.commit().await.unwrap();
    }
    let listed = || async { h.all_pages(ACME, filter(10)).await };
    // The ending first: nothing to show without the hold.
    let ending: Vec<RecordedEvent> = (2..=last).map(version).collect();
    apply(&h, &ending).await;
    assert!(listed().await.is_empty());
    // The hold closes the gap: the row is the fold of the whole stream.
    apply(&h, &[version(1)]).await;
    assert_eq!(listed().await, vec![made.expected()]);
    assert_eq!(listed().await[0].status, TransferStatus::Posted);
    let waiting = h.execute("DELETE FROM transfer_pending_g1").await;
    assert_eq!(waiting, 0, "events still waiting after the gap closed");
}

async fn a_corrupted_row_is_detected_and_a_rebuild_restores_it(backend: Backend) {
    let h = Harness::new(backend).await;
    let made = h.make_many().await;
    let (stop, handle) = h.start();
    h.caught_up().await;
    let before = h.all_pages(ACME, filter(7)).await;
    let victim = made[1].expected();
    let changed = h
        .execute(&format!(
            "UPDATE transfers_g1 SET status = 'voided' WHERE transfer_id = '{}'",
            victim.id
        ))
        .await;
    assert_eq!(changed, 1);
    h.execute(&format!(
        "DELETE FROM transfers_g1 WHERE transfer_id = '{}'",
        made[2].expected().id
    ))
    .await;
    // A folded state edited by hand, its columns left alone: the next batch would fold onto it.
    let folded = made[3].expected();
    let set_position = match h.db {
        Database::Postgres(_) => "jsonb_set(state, '{position}', '0')",
        Database::Sqlite(_) => "json_set(state, '$.position', 0)",
    };
    let edited = h
        .execute(&format!(
            "UPDATE transfers_g1 SET state = {set_position} WHERE transfer_id = '{}'",
            folded.id
        ))
        .await;
    assert_eq!(edited, 1);
    let mismatches = verify(&h.db, h.store.as_ref()).await.unwrap();
    let paged = verify_in_pages(&h.db, h.store.as_ref(), 2).await.unwrap();
    assert_eq!(
        paged, mismatches,
        "two transfers a page finds what one page finds"
    );
    assert_eq!(mismatches.len(), 3, "{mismatches:?}");
    assert!(mismatches
        .iter()
        .any(|m| m.transfer_id == victim.id && m.recomputed.as_ref() == Some(&victim)));
    assert!(mismatches
        .iter()
        .any(|m| m.transfer_id == folded.id && m.state_differs && m.stored == m.recomputed));
    assert!(mismatches
        .iter()
        .any(|m| m.transfer_id == made[2].expected().id && m.stored.is_none()));
    let report = rebuild(
        &h.db,
        &h.store,
        &Transfers,
        &RebuildConfig::new("rebuilder"),
        std::future::pending(),
    )
    .await
    .unwrap();
    assert_eq!(report.generation, 2);
    h.caught_up().await;
    assert_eq!(verify(&h.db, h.store.as_ref()).await.unwrap(), vec![]);
    assert_eq!(h.all_pages(ACME, filter(7)).await, before);
    stop.send(()).unwrap();
    handle.await.unwrap();
}

asiento_testkit::both_backends!(threads = 2;
    every_filter_selects_exactly_the_matching_transfers,
    a_hold_s_ending_before_the_hold_waits_for_it,
    a_corrupted_row_is_detected_and_a_rebuild_restores_it,
);
