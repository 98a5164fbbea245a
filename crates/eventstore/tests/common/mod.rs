//! What every test binary of this crate needs: a fresh database of either
//! backend, migrated, and small builders for events.
#![allow(dead_code)] // each test binary uses a different part
#![allow(clippy::unwrap_used)] // test code

use std::sync::Arc;

use asiento_eventstore::{Backend, Cursor, ExpectedVersion};
use asiento_eventstore::{Database, EventStore, Metadata, NewEvent, StreamAppend, Upcaster};
use asiento_testkit::TestDatabase;
use uuid::Uuid;

/// A migrated log of the test's own ([`TestDatabase`]), with a pool large enough for the races.
pub struct Harness {
    pub db: Database,
    pub store: Arc<dyn EventStore>,
    test_db: TestDatabase,
}

impl Harness {
    pub async fn open(backend: asiento_testkit::Backend) -> Harness {
        let test_db = TestDatabase::new(backend).await;
        let db = Database::connect_with_pool_size(&test_db.url, 24)
            .await
            .unwrap();
        db.migrate().await.unwrap();
        Harness {
            store: db.event_store(),
            db,
            test_db,
        }
    }

    pub fn backend(&self) -> Backend {
        self.db.backend()
    }

    pub fn store_with(&self, upcaster: Arc<dyn Upcaster>) -> Arc<dyn EventStore> {
        self.db.event_store_with(upcaster)
    }

    /// Waits until `read_all` can return everything up to `cursor`. On
    /// PostgreSQL a committed event becomes readable only once every older
    /// transaction in the cluster has finished (other tests run beside us).
    pub async fn settled(&self, cursor: Cursor) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.store.head().await.unwrap() < cursor {
            assert!(
                std::time::Instant::now() < deadline,
                "log never reached {cursor}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Runs one statement that returns nothing, on either backend.
    pub async fn execute(&self, sql: &str) -> Result<(), sqlx::Error> {
        match &self.db {
            Database::Postgres(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
            Database::Sqlite(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
        }
    }

    pub async fn count(&self, sql: &str) -> i64 {
        match &self.db {
            Database::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
            Database::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
        }
    }

    /// Closes the pool and drops the PostgreSQL test database.
    pub async fn finish(self) {
        match self.db {
            Database::Postgres(pool) => pool.close().await,
            Database::Sqlite(pool) => pool.close().await,
        }
        self.test_db.finish().await;
    }
}

pub fn event(event_type: &str, data: serde_json::Value) -> NewEvent {
    NewEvent {
        event_id: Uuid::new_v4(),
        event_type: event_type.to_owned(),
        schema: 1,
        data,
        metadata: Metadata::default(),
    }
}

pub fn events(n: usize) -> Vec<NewEvent> {
    (0..n)
        .map(|i| event("Tested", serde_json::json!({ "i": i })))
        .collect()
}

pub fn to(stream_id: &str, expected: ExpectedVersion, events: Vec<NewEvent>) -> StreamAppend {
    StreamAppend {
        stream_id: stream_id.to_owned(),
        expected,
        events,
    }
}

/// What a subscriber collected holds every committed event exactly once, in log order; the
/// event ids in the order it got them.
pub fn assert_each_committed_once(
    got: &[asiento_eventstore::RecordedEvent],
    committed: &std::collections::HashSet<Uuid>,
) -> Vec<Uuid> {
    let ids: Vec<Uuid> = got.iter().map(|e| e.event_id).collect();
    let unique: std::collections::HashSet<Uuid> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "no event delivered twice");
    assert_eq!(&unique, committed, "every committed event, nothing else");
    assert!(got.windows(2).all(|w| w[0].cursor < w[1].cursor));
    ids
}
