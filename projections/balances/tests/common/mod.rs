//! What the balances tests share: a database with both projections installed, entries posted
//! straight into the log, runners with short leases, and waits for the projector.
#![allow(dead_code)] // each test binary uses its own part

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use asiento_balances::{recompute_all, BalanceKey};
use asiento_domain::payment::EntryPosted;
use asiento_domain::{
    transfer_stream, AccountName, Amount, Balance, Currency, EntryId, Event, JournalEntry, Leg,
    TenantId, TransferEvent, TransferId,
};
use asiento_eventstore::{
    Appended, Database, EventStore, ExpectedVersion, Metadata, NewEvent, StreamAppend,
};
use asiento_projector::{on_db, Projection, Runner, RunnerConfig};
use asiento_testkit::{Backend, TestDatabase};
use rand::{Rng, SeedableRng};
use tokio::sync::oneshot;
use uuid::Uuid;

pub const TENANTS: [&str; 2] = ["acme", "globex"];
pub const ACCOUNTS: [&str; 4] = [
    "customer:1:available",
    "customer:2:available",
    "psp:sim:clearing",
    "revenue:fees",
];
pub const CURRENCIES: [&str; 2] = ["USD", "EUR"];

pub struct Harness {
    pub db: Database,
    pub store: Arc<dyn EventStore>,
    _test_db: TestDatabase,
}

pub fn entry_event(tenant: &str, legs: &[(&str, &str, i64)]) -> (String, NewEvent) {
    let legs = legs
        .iter()
        .map(|(account, currency, amount)| {
            Leg::new(
                AccountName::parse(account).unwrap(),
                Currency::parse(currency).unwrap(),
                Amount::new(*amount),
            )
        })
        .collect();
    let entry = JournalEntry::new(
        EntryId::from_uuid(Uuid::new_v4()),
        TenantId::parse(tenant).unwrap(),
        legs,
        None,
    )
    .unwrap();
    let event = Event::Transfer(TransferEvent::EntryPosted(EntryPosted {
        entry,
        at: chrono::Utc::now(),
        transfer: None,
    }));
    (
        transfer_stream(TransferId::from_uuid(Uuid::new_v4())),
        NewEvent {
            event_id: Uuid::new_v4(),
            event_type: event.event_type().to_owned(),
            schema: event.schema_version(),
            data: event.encode().unwrap(),
            metadata: Metadata {
                tenant: Some(tenant.to_owned()),
                ..Metadata::default()
            },
        },
    )
}

impl Harness {
    pub async fn new(backend: Backend) -> Harness {
        let test_db = TestDatabase::open(backend).await;
        let db = test_db.database().clone();
        asiento_balances::install(&db).await.unwrap();
        Harness {
            store: db.event_store(),
            db,
            _test_db: test_db,
        }
    }

    pub async fn post(&self, tenant: &str, legs: &[(&str, &str, i64)]) -> Appended {
        let (stream_id, event) = entry_event(tenant, legs);
        self.store
            .append(&[StreamAppend {
                stream_id,
                expected: ExpectedVersion::NoStream,
                events: vec![event],
            }])
            .await
            .unwrap()
    }

    /// `n` random two-leg transfers, seeded so that a failure replays.
    pub async fn post_random(&self, seed: u64, n: usize) -> Appended {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut last = None;
        for _ in 0..n {
            let tenant = TENANTS[rng.random_range(0..TENANTS.len())];
            let currency = CURRENCIES[rng.random_range(0..CURRENCIES.len())];
            let from = rng.random_range(0..ACCOUNTS.len());
            let to = (from + rng.random_range(1..ACCOUNTS.len())) % ACCOUNTS.len();
            let amount = rng.random_range(1..100_000);
            last = Some(
                self.post(
                    tenant,
                    &[
                        (ACCOUNTS[from], currency, -amount),
                        (ACCOUNTS[to], currency, amount),
                    ],
                )
                .await,
            );
        }
        last.unwrap()
    }

    /// Waits until every committed event is readable (on PostgreSQL other suites sharing the
    /// server hold back the gap-free horizon).
    pub async fn settle(&self) {
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

    /// The balances projection has applied the whole log.
    pub async fn caught_up(&self) {
        self.caught_up_to(&["balances"]).await;
    }

    /// Both projections of this crate have applied the whole log (tests that run both).
    pub async fn caught_up_all(&self) {
        self.caught_up_to(&["balances", asiento_balances::ENTRIES_NAME])
            .await;
    }

    pub async fn caught_up_to(&self, names: &[&str]) {
        self.settle().await;
        let started = Instant::now();
        loop {
            let head = self.store.head().await.unwrap();
            let mut behind = false;
            for name in names {
                let at = asiento_projector::checkpoint(&self.db, name)
                    .await
                    .unwrap()
                    .unwrap();
                behind |= at.cursor != head;
            }
            if !behind {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "projector not caught up"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn recompute(&self) -> BTreeMap<BalanceKey, Balance> {
        recompute_all(self.store.as_ref(), None).await.unwrap().1
    }

    pub fn runner(&self, projection: Arc<dyn Projection>, owner: &str) -> Runner {
        let config = RunnerConfig {
            batch_size_max: 40,
            lease_ms: 1_000,
            heartbeat_ms: 200,
            idle_poll_ms: 100,
            backoff_ms_max: 500,
            ..RunnerConfig::new(owner)
        };
        Runner::new(self.db.clone(), self.store.clone(), projection, config)
    }

    pub async fn execute(&self, sql: &str) -> u64 {
        on_db!(&self.db, pool => sqlx::query(sql).execute(pool).await.unwrap().rows_affected())
    }
}

pub fn start(runner: Runner) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(runner.run(async move {
        let _ = stopped.await;
    }));
    (stop, handle)
}

pub fn key(tenant: &str, account: &str, currency: &str) -> BalanceKey {
    BalanceKey {
        tenant: tenant.into(),
        account: account.into(),
        currency: currency.into(),
    }
}

/// The harness of a test on `backend`.
pub async fn harness(backend: Backend) -> Harness {
    Harness::new(backend).await
}
