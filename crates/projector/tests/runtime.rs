//! The projection runtime against both backends, with a tiny projection that counts events per
//! stream and *refuses* to apply an event twice or out of order (each stream's count must be the
//! event's version minus one). A double apply or a skip therefore stalls the projection and the
//! test fails on its final comparison with the log.

#![allow(clippy::unwrap_used)] // test code: a failed setup step should panic loudly

use asiento_testkit::{Backend, TestDatabase};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use asiento_eventstore::{
    Cursor, Database, EventStore, ExpectedVersion, Metadata, NewEvent, RecordedEvent, StreamAppend,
    Tx,
};
use asiento_projector::{
    on_db, on_tx, rebuild, status, Projection, ProjectionError, RebuildConfig, Runner, RunnerConfig,
};
use tokio::sync::{oneshot, Notify};

// ------------------------------------------------------------------ the test projection

struct Counts {
    fingerprint: &'static str,
    /// Milliseconds each batch sleeps inside its transaction (0: none).
    delay_ms: AtomicU64,
    /// Fired when a batch starts applying, so a test can kill the runner mid-batch.
    applying: Notify,
    /// Batches this instance committed or attempted.
    batches: AtomicU64,
    /// Set: apply fails (a poison batch), to exercise backoff.
    fail: AtomicBool,
}

impl Counts {
    fn new(fingerprint: &'static str) -> Arc<Counts> {
        Arc::new(Counts {
            fingerprint,
            delay_ms: AtomicU64::new(0),
            applying: Notify::new(),
            batches: AtomicU64::new(0),
            fail: AtomicBool::new(false),
        })
    }
}

#[async_trait::async_trait]
impl Projection for Counts {
    fn name(&self) -> &'static str {
        "stream_counts"
    }

    fn fingerprint(&self) -> &'static str {
        self.fingerprint
    }

    async fn create_generation(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        let ddl = format!(
            "CREATE TABLE stream_counts_g{g} (stream_id TEXT PRIMARY KEY, \
             events BIGINT NOT NULL, last_version BIGINT NOT NULL)"
        );
        on_tx!(tx, conn => sqlx::query(&ddl).execute(conn).await?.rows_affected());
        Ok(())
    }

    async fn point_views(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        asiento_projector::point_view(tx, "stream_counts", &format!("stream_counts_g{g}")).await
    }

    async fn drop_generation(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        let ddl = format!("DROP TABLE IF EXISTS stream_counts_g{g}");
        on_tx!(tx, conn => sqlx::query(&ddl).execute(conn).await?.rows_affected());
        Ok(())
    }

    async fn apply(
        &self,
        tx: &mut Tx,
        g: i64,
        events: &[RecordedEvent],
    ) -> Result<(), ProjectionError> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        self.applying.notify_one();
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(ProjectionError::Malformed {
                position: events[0].position,
                reason: "poisoned by the test".into(),
            });
        }
        let insert = format!(
            "INSERT INTO stream_counts_g{g} (stream_id, events, last_version) VALUES ($1, 1, 1)"
        );
        let update = format!(
            "UPDATE stream_counts_g{g} SET events = events + 1, last_version = $2 \
             WHERE stream_id = $1 AND last_version = $2 - 1"
        );
        for e in events {
            let version = i64::try_from(e.version).unwrap();
            let changed = if version == 1 {
                on_tx!(tx, conn => sqlx::query(&insert).bind(&e.stream_id).execute(conn).await?.rows_affected())
            } else {
                on_tx!(tx, conn => sqlx::query(&update).bind(&e.stream_id).bind(version).execute(conn).await?.rows_affected())
            };
            if changed != 1 {
                return Err(ProjectionError::Malformed {
                    position: e.position,
                    reason: format!("{} v{version} applied twice or out of order", e.stream_id),
                });
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------------------ harness

struct Harness {
    db: Database,
    store: Arc<dyn EventStore>,
    _test_db: TestDatabase,
}

impl Harness {
    async fn new(backend: Backend) -> Harness {
        let test_db = TestDatabase::open(backend).await;
        let db = test_db.database().clone();
        Harness {
            store: db.event_store(),
            db,
            _test_db: test_db,
        }
    }

    /// Appends `n` events spread round-robin over `streams` streams named `{prefix}-{i}`.
    async fn append(&self, prefix: &str, streams: usize, n: usize) {
        for i in 0..n {
            self.store
                .append(&[StreamAppend {
                    stream_id: format!("{prefix}-{}", i % streams),
                    expected: ExpectedVersion::Any,
                    events: vec![NewEvent {
                        event_id: uuid::Uuid::new_v4(),
                        event_type: "Tick".into(),
                        schema: 1,
                        data: serde_json::json!({ "i": i }),
                        metadata: Metadata::default(),
                    }],
                }])
                .await
                .unwrap();
        }
    }

    /// Appends `per_stream` events to each of `streams` streams in ONE append. On SQLite a batch
    /// holds the write lock while it runs, so a test that hangs a batch must write beforehand.
    async fn append_at_once(&self, prefix: &str, streams: usize, per_stream: usize) {
        let appends: Vec<StreamAppend> = (0..streams)
            .map(|s| StreamAppend {
                stream_id: format!("{prefix}-{s}"),
                expected: ExpectedVersion::Any,
                events: (0..per_stream)
                    .map(|i| NewEvent {
                        event_id: uuid::Uuid::new_v4(),
                        event_type: "Tick".into(),
                        schema: 1,
                        data: serde_json::json!({ "i": i }),
                        metadata: Metadata::default(),
                    })
                    .collect(),
            })
            .collect();
        self.store.append(&appends).await.unwrap();
    }

    /// Per stream, the number of events in the log (the full recomputation).
    async fn recompute(&self) -> BTreeMap<String, i64> {
        let mut counts = BTreeMap::new();
        let mut after = Cursor::START;
        loop {
            let batch = self.store.read_all(after, 1000).await.unwrap();
            let Some(last) = batch.last() else { break };
            after = last.cursor;
            for e in &batch {
                *counts.entry(e.stream_id.clone()).or_insert(0) += 1;
            }
        }
        counts
    }

    async fn projected(&self) -> BTreeMap<String, i64> {
        let rows: Vec<(String, i64)> = on_db!(&self.db, pool => {
            sqlx::query_as("SELECT stream_id, events FROM stream_counts")
                .fetch_all(pool)
                .await
                .unwrap()
        });
        rows.into_iter().collect()
    }

    async fn owner(&self) -> Option<String> {
        on_db!(&self.db, pool => {
            sqlx::query_scalar("SELECT lease_owner FROM projections WHERE name = 'stream_counts'")
                .fetch_optional(pool)
                .await
                .unwrap()
                .flatten()
        })
    }

    async fn table_exists(&self, table: &str) -> bool {
        match &self.db {
            Database::Postgres(pool) => {
                sqlx::query_scalar::<_, bool>("SELECT to_regclass($1) IS NOT NULL")
                    .bind(table)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }
            Database::Sqlite(pool) => {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = $1",
                )
                .bind(table)
                .fetch_one(pool)
                .await
                .unwrap()
                    > 0
            }
        }
    }

    /// Waits until every committed event is readable. On PostgreSQL the gap-free order hides
    /// events above the oldest running transaction of the whole server, and other test suites
    /// share the server, so "appended" does not yet mean "readable".
    async fn settle(&self) {
        let started = Instant::now();
        loop {
            let last: Option<i64> = on_db!(&self.db, pool => {
                sqlx::query_scalar("SELECT max(position) FROM events")
                    .fetch_one(pool)
                    .await
                    .unwrap()
            });
            let head = self.store.head().await.unwrap();
            // Test appends run one after another, so the last appended is the head once visible.
            if last.unwrap_or(0) <= head.position() {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "events never became readable"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the projection's checkpoint is the log's head, with everything committed so
    /// far readable.
    async fn caught_up(&self, within: Duration) {
        self.settle().await;
        let started = Instant::now();
        loop {
            let head = self.store.head().await.unwrap();
            let at = asiento_projector::checkpoint(&self.db, "stream_counts")
                .await
                .unwrap()
                .map(|c| c.cursor);
            if at == Some(head) {
                return;
            }
            assert!(
                started.elapsed() < within,
                "not caught up: at {at:?}, head {head}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn runner(&self, projection: Arc<Counts>, owner: &str) -> Runner {
        let config = RunnerConfig {
            batch_size_max: 50,
            lease_ms: 1_000,
            heartbeat_ms: 200,
            idle_poll_ms: 100,
            backoff_ms_max: 500,
            ..RunnerConfig::new(owner)
        };
        Runner::new(self.db.clone(), self.store.clone(), projection, config)
    }
}

/// Starts a runner; the sender stops it gracefully.
fn start(runner: Runner) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(runner.run(async move {
        let _ = stopped.await;
    }));
    (stop, handle)
}

/// The harness of a test on `backend`.
async fn harness(backend: Backend) -> Harness {
    Harness::new(backend).await
}

asiento_testkit::both_backends!(
    fixture = harness;
    catches_up_then_tails_live_and_releases_its_lease_on_shutdown,
    one_of_two_runners_is_active_and_the_other_takes_over_when_it_dies_mid_batch,
    a_batch_whose_lease_was_taken_rolls_back,
    a_failing_batch_is_retried_not_skipped,
    rebuild_while_events_flow_swaps_without_failing_reads,
    a_changed_fingerprint_refuses_to_resume_until_rebuilt,
    an_interrupted_rebuild_resumes,
);

// ------------------------------------------------------------------ tests

async fn catches_up_then_tails_live_and_releases_its_lease_on_shutdown(h: Harness) {
    h.append("s", 7, 300).await;
    let (stop, handle) = start(h.runner(Counts::new("v1"), "a"));
    h.caught_up(Duration::from_secs(20)).await;
    assert_eq!(h.projected().await, h.recompute().await);
    assert_eq!(h.owner().await.as_deref(), Some("a"));

    // Live tail.
    h.append("t", 3, 40).await;
    h.caught_up(Duration::from_secs(20)).await;
    assert_eq!(h.projected().await, h.recompute().await);

    let statuses = status(&h.db, h.store.as_ref(), &[]).await.unwrap();
    assert_eq!(statuses.len(), 1);
    assert_eq!(statuses[0].lag_events, 0);
    assert!(statuses[0].lease_live);
    assert_eq!(statuses[0].owner.as_deref(), Some("a"));

    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(
        h.owner().await,
        None,
        "a graceful shutdown gives the lease up"
    );
}

async fn one_of_two_runners_is_active_and_the_other_takes_over_when_it_dies_mid_batch(h: Harness) {
    h.append("s", 5, 200).await;
    let a = Counts::new("v1");
    let b = Counts::new("v1");
    let (_stop_a, handle_a) = start(h.runner(a.clone(), "a"));
    h.caught_up(Duration::from_secs(20)).await;
    let (stop_b, handle_b) = start(h.runner(b.clone(), "b"));

    // Several lease periods pass: b stays on standby while a heart-beats.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(h.owner().await.as_deref(), Some("a"));
    assert_eq!(
        b.batches.load(Ordering::SeqCst),
        0,
        "the standby applied something"
    );

    // a's next batch hangs inside its transaction; kill a right there.
    a.delay_ms.store(60_000, Ordering::SeqCst);
    let mid_batch = a.applying.notified();
    h.append_at_once("t", 4, 25).await;
    mid_batch.await;
    handle_a.abort();
    let killed = Instant::now();
    let _ = handle_a.await;

    // b takes over within the lease time (plus its poll interval and some slack).
    loop {
        if h.owner().await.as_deref() == Some("b") {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_millis(3_000),
            "no takeover"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.caught_up(Duration::from_secs(20)).await;
    assert!(b.batches.load(Ordering::SeqCst) > 0);
    // Nothing applied twice (the projection would have refused and stalled) or skipped.
    assert_eq!(h.projected().await, h.recompute().await);

    stop_b.send(()).unwrap();
    handle_b.await.unwrap();
}

async fn a_batch_whose_lease_was_taken_rolls_back(h: Harness) {
    h.append("s", 3, 30).await;
    let a = Counts::new("v1");
    let (stop, handle) = start(h.runner(a.clone(), "a"));
    h.caught_up(Duration::from_secs(20)).await;

    // While a batch sleeps, another process steals the lease (as if a's had expired).
    a.delay_ms.store(800, Ordering::SeqCst);
    let mid_batch = a.applying.notified();
    h.append_at_once("t", 2, 5).await;
    mid_batch.await;
    let before = asiento_projector::checkpoint(&h.db, "stream_counts")
        .await
        .unwrap();
    on_db!(&h.db, pool => {
        sqlx::query("UPDATE projections SET lease_owner = 'thief', lease_expires_ms = 0 WHERE name = 'stream_counts'")
            .execute(pool)
            .await
            .unwrap()
            .rows_affected()
    });
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    a.delay_ms.store(0, Ordering::SeqCst);
    // The thief's lease (expired at once) goes back to a, which redoes the rolled-back batch.
    h.caught_up(Duration::from_secs(20)).await;
    let after = asiento_projector::checkpoint(&h.db, "stream_counts")
        .await
        .unwrap();
    assert_ne!(before, after);
    assert_eq!(h.projected().await, h.recompute().await);
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn a_failing_batch_is_retried_not_skipped(h: Harness) {
    h.append("s", 3, 30).await;
    let a = Counts::new("v1");
    a.fail.store(true, Ordering::SeqCst);
    h.settle().await;
    let (stop, handle) = start(h.runner(a.clone(), "a"));
    let started = Instant::now();
    while a.batches.load(Ordering::SeqCst) < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the batch was not retried"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stuck = asiento_projector::checkpoint(&h.db, "stream_counts")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stuck.cursor,
        Cursor::START,
        "a failing batch moved the checkpoint"
    );
    a.fail.store(false, Ordering::SeqCst);
    h.caught_up(Duration::from_secs(20)).await;
    assert_eq!(h.projected().await, h.recompute().await);
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn rebuild_while_events_flow_swaps_without_failing_reads(h: Harness) {
    let h = Arc::new(h);
    h.append("s", 10, 600).await;
    let live = Counts::new("v1");
    let (stop, handle) = start(h.runner(live.clone(), "a"));
    h.caught_up(Duration::from_secs(20)).await;

    // A writer and a reader run throughout the rebuild.
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let (h, writing) = (h.clone(), writing.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while writing.load(Ordering::SeqCst) {
                h.append("w", 4, 5).await;
                n += 5;
            }
            n
        })
    };
    let reader = {
        let (h, writing) = (h.clone(), writing.clone());
        tokio::spawn(async move {
            let mut reads = 0u64;
            while writing.load(Ordering::SeqCst) {
                let total: Option<i64> = on_db!(&h.db, pool => {
                    sqlx::query_scalar("SELECT CAST(sum(events) AS BIGINT) FROM stream_counts")
                        .fetch_one(pool)
                        .await
                        .expect("a read failed during the rebuild")
                });
                assert!(total.unwrap_or(0) >= 600, "a read saw a partial generation");
                reads += 1;
            }
            reads
        })
    };

    let rebuilder = Counts::new("v1");
    let config = RebuildConfig {
        batch_size_max: 100,
        ..RebuildConfig::new("rebuilder")
    };
    let report = rebuild(
        &h.db,
        &h.store,
        rebuilder.as_ref(),
        &config,
        std::future::pending(),
    )
    .await
    .unwrap();
    assert_eq!(report.generation, 2);
    assert_eq!(report.previous_generation, 1);
    assert!(report.events_applied >= 600);

    tokio::time::sleep(Duration::from_millis(300)).await;
    writing.store(false, Ordering::SeqCst);
    let written = writer.await.unwrap();
    let reads = reader.await.unwrap();
    assert!(written > 0 && reads > 0);

    h.caught_up(Duration::from_secs(20)).await;
    let checkpoint = asiento_projector::checkpoint(&h.db, "stream_counts")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(checkpoint.generation, 2);
    assert_eq!(h.projected().await, h.recompute().await);
    // The live runner moved on to generation 2 and the old tables are gone.
    let started = Instant::now();
    while h.table_exists("stream_counts_g1").await {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "generation 1 not dropped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(h.table_exists("stream_counts_g2").await);
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn a_changed_fingerprint_refuses_to_resume_until_rebuilt(h: Harness) {
    h.append("s", 3, 50).await;
    let (stop, handle) = start(h.runner(Counts::new("v1"), "a"));
    h.caught_up(Duration::from_secs(20)).await;
    stop.send(()).unwrap();
    handle.await.unwrap();

    // New code: the runner refuses to touch what v1 built.
    h.append("t", 2, 20).await;
    let v2 = Counts::new("v2");
    let (stop, handle) = start(h.runner(v2.clone(), "b"));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(v2.batches.load(Ordering::SeqCst), 0);
    let statuses = status(&h.db, h.store.as_ref(), &[v2.as_ref()])
        .await
        .unwrap();
    assert!(statuses[0].rebuild_needed);
    assert!(statuses[0].lag_events > 0);

    let report = rebuild(
        &h.db,
        &h.store,
        Counts::new("v2").as_ref(),
        &RebuildConfig::new("rebuilder"),
        std::future::pending(),
    )
    .await
    .unwrap();
    assert_eq!(report.generation, 2);
    // The waiting runner now resumes on the rebuilt generation.
    h.append("u", 2, 10).await;
    h.caught_up(Duration::from_secs(40)).await;
    assert_eq!(h.projected().await, h.recompute().await);
    let statuses = status(&h.db, h.store.as_ref(), &[v2.as_ref()])
        .await
        .unwrap();
    assert!(!statuses[0].rebuild_needed);
    assert_eq!(statuses[0].fingerprint, "v2");
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn an_interrupted_rebuild_resumes(h: Harness) {
    h.append("s", 3, 400).await;
    h.settle().await;
    asiento_projector::install(&h.db, Counts::new("v1").as_ref())
        .await
        .unwrap();

    // The first rebuild is stopped part way (its batches are slow).
    let slow = Counts::new("v1");
    slow.delay_ms.store(50, Ordering::SeqCst);
    let config = RebuildConfig {
        batch_size_max: 50,
        ..RebuildConfig::new("first")
    };
    let interrupted = rebuild(
        &h.db,
        &h.store,
        slow.as_ref(),
        &config,
        tokio::time::sleep(Duration::from_millis(300)),
    )
    .await;
    assert!(matches!(
        interrupted,
        Err(asiento_projector::ProjectorError::Interrupted { .. })
    ));
    let statuses = status(&h.db, h.store.as_ref(), &[]).await.unwrap();
    let pending = statuses[0]
        .rebuild
        .clone()
        .expect("the rebuild row is kept");
    assert!(pending.checkpoint > Cursor::START);
    assert!(!pending.lease_live);

    let config = RebuildConfig {
        batch_size_max: 50,
        ..RebuildConfig::new("second")
    };
    let report = rebuild(
        &h.db,
        &h.store,
        Counts::new("v1").as_ref(),
        &config,
        std::future::pending(),
    )
    .await
    .unwrap();
    assert!(report.resumed);
    assert_eq!(report.generation, pending.generation);
    assert!(report.events_applied < 400, "resumed from scratch");
    assert_eq!(h.projected().await, h.recompute().await);
}
