//! The balances read model against both backends: every check compares with a full
//! recomputation from the log (`recompute_all`), the reference model.

#![allow(clippy::unwrap_used)] // test code: a failed setup step should panic loudly

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use asiento_balances::{
    entries, journal_entry, read_balance, snapshot_all, verify, BalanceError, BalanceKey, Balances,
};
use asiento_domain::{AccountName, Balance};
use asiento_eventstore::{Database, ExpectedVersion, RecordedEvent, StreamAppend, Tx};
use asiento_projector::{rebuild, Projection, ProjectionError, RebuildConfig};
use rand::{Rng, SeedableRng};
use tokio::sync::Notify;

use common::{entry_event, harness, key, start, Harness, ACCOUNTS};

/// Balances, made slow on demand so a test can kill its runner mid-batch.
struct Slow {
    delay_ms: AtomicU64,
    applying: Notify,
    batches: AtomicU64,
}

impl Slow {
    fn new() -> Arc<Slow> {
        Arc::new(Slow {
            delay_ms: AtomicU64::new(0),
            applying: Notify::new(),
            batches: AtomicU64::new(0),
        })
    }
}

#[async_trait::async_trait]
impl Projection for Slow {
    fn name(&self) -> &'static str {
        Balances.name()
    }
    fn fingerprint(&self) -> &'static str {
        Balances.fingerprint()
    }
    async fn create_generation(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        Balances.create_generation(tx, g).await
    }
    async fn point_views(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        Balances.point_views(tx, g).await
    }
    async fn drop_generation(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        Balances.drop_generation(tx, g).await
    }
    async fn apply(
        &self,
        tx: &mut Tx,
        g: i64,
        events: &[RecordedEvent],
    ) -> Result<(), ProjectionError> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        // Write first, then hang: the kill lands after this batch's rows are written.
        Balances.apply(tx, g, events).await?;
        self.applying.notify_one();
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        Ok(())
    }
}

asiento_testkit::both_backends!(
    fixture = harness;
    reads_are_exact_whether_the_projector_is_current_behind_or_stopped,
    min_position_that_is_never_reached_is_projection_lagging,
    entries_page_in_log_order_and_journal_entries_are_per_tenant,
    a_corrupted_snapshot_is_detected_and_repaired_by_a_rebuild,
    balances_beyond_i64_are_exact_in_the_snapshot_the_tail_and_verify,
    a_rebuild_under_load_never_fails_a_read_and_ends_exact,
    failover_mid_batch_applies_nothing_twice,
);

async fn assert_reads_match(h: &Harness, expected: &BTreeMap<BalanceKey, Balance>) {
    for (k, want) in expected {
        let got = read_balance(
            &h.db,
            h.store.as_ref(),
            &k.tenant,
            &AccountName::parse(&k.account).unwrap(),
            &k.currency,
            None,
        )
        .await
        .unwrap();
        assert_eq!(got.balance_minor, *want, "{k:?}");
    }
}

async fn reads_are_exact_whether_the_projector_is_current_behind_or_stopped(h: Harness) {
    // Nothing projected yet: reads are the log's tail alone.
    h.post_random(1, 60).await;
    h.settle().await;
    let expected = h.recompute().await;
    assert!(!expected.is_empty());
    assert_reads_match(&h, &expected).await;

    let (stop, handle) = start(h.runner(asiento_balances::projection(), "a"));
    // Held to the end of the test: dropping the sender stops the runner.
    let (_stop_entries, _entries_handle) =
        start(h.runner(asiento_balances::entries_projection(), "e"));
    h.post_random(2, 120).await;
    h.caught_up_all().await;
    let expected = h.recompute().await;
    assert_eq!(snapshot_all(&h.db).await.unwrap().1, expected);
    assert!(verify(&h.db, h.store.as_ref()).await.unwrap().is_empty());
    assert_reads_match(&h, &expected).await;
    stop.send(()).unwrap();
    handle.await.unwrap();

    // The projector is stopped: snapshot + tail is still exact, and read-your-writes holds at
    // once for a fresh append.
    h.post_random(3, 40).await;
    let appended = h
        .post(
            "acme",
            &[
                ("customer:1:available", "USD", 7),
                ("revenue:fees", "USD", -7),
            ],
        )
        .await;
    let got = read_balance(
        &h.db,
        h.store.as_ref(),
        "acme",
        &AccountName::parse("customer:1:available").unwrap(),
        "USD",
        Some(appended.last_position),
    )
    .await
    .unwrap();
    assert!(got.as_of_position >= appended.last_position);
    h.settle().await;
    let expected = h.recompute().await;
    assert_eq!(
        got.balance_minor,
        expected[&key("acme", "customer:1:available", "USD")]
    );
    assert_reads_match(&h, &expected).await;
    // Unknown balances are zero.
    let none = read_balance(
        &h.db,
        h.store.as_ref(),
        "acme",
        &AccountName::parse("nobody").unwrap(),
        "JPY",
        None,
    )
    .await
    .unwrap();
    assert_eq!(none.balance_minor, Balance::ZERO);
}

/// Three entries of i64::MAX each: a sum no 64-bit column holds. The projection must apply them
/// (not stop), and the snapshot, a read of the tail and the checker must all agree on it.
async fn balances_beyond_i64_are_exact_in_the_snapshot_the_tail_and_verify(h: Harness) {
    let max = i64::MAX;
    const LEGS: [(&str, &str, i64); 2] = [
        ("merchant:a", "USD", i64::MAX),
        ("merchant:b", "USD", -i64::MAX),
    ];
    let post_max = || h.post("acme", &LEGS);
    post_max().await;
    post_max().await;
    let (stop, handle) = start(h.runner(asiento_balances::projection(), "a"));
    h.caught_up().await;
    // The third one only in the log's tail: the read adds it to the snapshot.
    stop.send(()).unwrap();
    handle.await.unwrap();
    post_max().await;
    h.settle().await;
    let three = 3 * i128::from(max);
    for (account, want) in [("merchant:a", three), ("merchant:b", -three)] {
        let got = read_balance(
            &h.db,
            h.store.as_ref(),
            "acme",
            &AccountName::parse(account).unwrap(),
            "USD",
            None,
        )
        .await
        .unwrap();
        assert_eq!(got.balance_minor, Balance::new(want), "{account}");
    }
    let snapshot = snapshot_all(&h.db).await.unwrap().1;
    assert_eq!(
        snapshot[&key("acme", "merchant:a", "USD")],
        Balance::new(2 * i128::from(max))
    );
    assert!(verify(&h.db, h.store.as_ref()).await.unwrap().is_empty());
    let (stop, handle) = start(h.runner(asiento_balances::projection(), "a"));
    h.caught_up().await;
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(snapshot_all(&h.db).await.unwrap().1, h.recompute().await);
    assert!(verify(&h.db, h.store.as_ref()).await.unwrap().is_empty());
}

async fn min_position_that_is_never_reached_is_projection_lagging(h: Harness) {
    let appended = h.post_random(4, 5).await;
    let started = Instant::now();
    let lagging = read_balance(
        &h.db,
        h.store.as_ref(),
        "acme",
        &AccountName::parse("revenue:fees").unwrap(),
        "USD",
        Some(i64::MAX / 2),
    )
    .await;
    assert!(
        matches!(lagging, Err(BalanceError::ProjectionLagging { .. })),
        "{lagging:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(4_900));
    assert!(started.elapsed() < Duration::from_millis(8_000));
    // The legs come from the projection only, and no projector runs.
    let lagging = entries(
        &h.db,
        h.store.as_ref(),
        "acme",
        "revenue:fees",
        "USD",
        None,
        10,
        Some(appended.last_position),
    )
    .await;
    assert!(
        matches!(lagging, Err(BalanceError::ProjectionLagging { .. })),
        "{lagging:?}"
    );
}

async fn entries_page_in_log_order_and_journal_entries_are_per_tenant(h: Harness) {
    h.post_random(5, 30).await;
    // One entry with two legs on the same account.
    let split = h
        .post(
            "acme",
            &[
                ("customer:1:available", "USD", 5),
                ("customer:1:available", "USD", 5),
                ("psp:sim:clearing", "USD", -10),
            ],
        )
        .await;
    h.post_random(6, 30).await;
    let (stop, handle) = start(h.runner(asiento_balances::projection(), "a"));
    // Held to the end of the test: dropping the sender stops the runner.
    let (_stop_entries, _entries_handle) =
        start(h.runner(asiento_balances::entries_projection(), "e"));
    h.caught_up_all().await;

    // All legs of acme's customer 1 in USD, page by page.
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let page = entries(
            &h.db,
            h.store.as_ref(),
            "acme",
            "customer:1:available",
            "USD",
            after,
            1,
            None,
        )
        .await
        .unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.position);
        all.extend(page);
    }
    assert_eq!(
        all.iter()
            .filter(|l| l.position == split.last_position)
            .count(),
        2,
        "a page split an entry"
    );
    let sum: i64 = all.iter().map(|l| l.amount_minor).sum();
    assert_eq!(
        Balance::new(sum.into()),
        h.recompute().await[&key("acme", "customer:1:available", "USD")]
    );
    let positions: Vec<i64> = all.iter().map(|l| l.position).collect();
    let mut sorted = positions.clone();
    sorted.sort();
    assert_eq!(positions, sorted, "legs are not oldest first");

    let entry_id = all
        .iter()
        .find(|l| l.position == split.last_position)
        .unwrap()
        .entry_id
        .clone();
    let entry = journal_entry(&h.db, h.store.as_ref(), "acme", &entry_id, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(entry.legs.len(), 3);
    assert_eq!(entry.legs.iter().map(|l| l.amount_minor).sum::<i64>(), 0);
    assert_eq!(entry.position, split.last_position);
    assert_eq!(
        journal_entry(&h.db, h.store.as_ref(), "globex", &entry_id, None)
            .await
            .unwrap(),
        None
    );
    // Another tenant's legs never show.
    let theirs = entries(
        &h.db,
        h.store.as_ref(),
        "globex",
        "customer:1:available",
        "USD",
        None,
        1_000,
        None,
    )
    .await
    .unwrap();
    assert!(theirs.iter().all(|l| l.entry_id != entry_id));
    // Read-your-writes on the legs: a fresh entry is there with min_position.
    let fresh = h
        .post(
            "acme",
            &[
                ("customer:2:available", "EUR", 3),
                ("revenue:fees", "EUR", -3),
            ],
        )
        .await;
    let legs = entries(
        &h.db,
        h.store.as_ref(),
        "acme",
        "customer:2:available",
        "EUR",
        None,
        1_000,
        Some(fresh.last_position),
    )
    .await
    .unwrap();
    assert_eq!(legs.last().unwrap().position, fresh.last_position);
    let unknown = entries(
        &h.db,
        h.store.as_ref(),
        "acme",
        "customer:2:available",
        "EUR",
        Some(i64::MAX / 2),
        10,
        None,
    )
    .await;
    assert!(matches!(unknown, Err(BalanceError::UnknownPosition { .. })));
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn a_corrupted_snapshot_is_detected_and_repaired_by_a_rebuild(h: Harness) {
    h.post_random(7, 80).await;
    let (stop, handle) = start(h.runner(asiento_balances::projection(), "a"));
    // Held to the end of the test: dropping the sender stops the runner.
    let (_stop_entries, _entries_handle) =
        start(h.runner(asiento_balances::entries_projection(), "e"));
    h.caught_up_all().await;
    assert!(verify(&h.db, h.store.as_ref()).await.unwrap().is_empty());

    // The column is NUMERIC on PostgreSQL and decimal text on SQLite.
    let plus_one = match h.db {
        Database::Postgres(_) => "balance_minor + 1",
        Database::Sqlite(_) => "CAST(CAST(balance_minor AS INTEGER) + 1 AS TEXT)",
    };
    let corrupted = h
        .execute(&format!(
            "UPDATE balances_g1 SET balance_minor = {plus_one} \
             WHERE tenant = 'acme' AND account = 'revenue:fees' AND currency = 'USD'"
        ))
        .await;
    assert_eq!(corrupted, 1);
    let mismatches = verify(&h.db, h.store.as_ref()).await.unwrap();
    assert_eq!(mismatches.len(), 1);
    assert_eq!(mismatches[0].key, key("acme", "revenue:fees", "USD"));
    assert_eq!(
        mismatches[0].snapshot_minor.minor(),
        mismatches[0].recomputed_minor.minor() + 1
    );

    let report = rebuild(
        &h.db,
        &h.store,
        &Balances,
        &RebuildConfig::new("rebuilder"),
        std::future::pending(),
    )
    .await
    .unwrap();
    assert_eq!(report.generation, 2);
    assert!(verify(&h.db, h.store.as_ref()).await.unwrap().is_empty());
    h.caught_up_all().await;
    let expected = h.recompute().await;
    assert_eq!(snapshot_all(&h.db).await.unwrap().1, expected);
    assert_reads_match(&h, &expected).await;
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn a_rebuild_under_load_never_fails_a_read_and_ends_exact(h: Harness) {
    let h = Arc::new(h);
    h.post_random(8, 300).await;
    let (stop, handle) = start(h.runner(asiento_balances::projection(), "a"));
    // Held to the end of the test: dropping the sender stops the runner.
    let (_stop_entries, _entries_handle) =
        start(h.runner(asiento_balances::entries_projection(), "e"));
    h.caught_up_all().await;

    let running = Arc::new(AtomicBool::new(true));
    let writer = {
        let (h, running) = (h.clone(), running.clone());
        tokio::spawn(async move {
            let mut seed = 100;
            while running.load(Ordering::SeqCst) {
                h.post_random(seed, 5).await;
                seed += 1;
            }
        })
    };
    let reader = {
        let (h, running) = (h.clone(), running.clone());
        tokio::spawn(async move {
            let mut reads = 0u64;
            while running.load(Ordering::SeqCst) {
                for account in ACCOUNTS {
                    read_balance(
                        &h.db,
                        h.store.as_ref(),
                        "acme",
                        &AccountName::parse(account).unwrap(),
                        "USD",
                        None,
                    )
                    .await
                    .expect("a balance read failed during the rebuild");
                    reads += 1;
                }
                entries(
                    &h.db,
                    h.store.as_ref(),
                    "acme",
                    "revenue:fees",
                    "USD",
                    None,
                    50,
                    None,
                )
                .await
                .expect("an entries read failed during the rebuild");
            }
            reads
        })
    };
    let config = RebuildConfig {
        batch_size_max: 50,
        ..RebuildConfig::new("rebuilder")
    };
    let report = rebuild(&h.db, &h.store, &Balances, &config, std::future::pending())
        .await
        .unwrap();
    assert_eq!(report.generation, 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.store(false, Ordering::SeqCst);
    writer.await.unwrap();
    assert!(reader.await.unwrap() > 0);

    h.caught_up_all().await;
    let expected = h.recompute().await;
    assert_eq!(snapshot_all(&h.db).await.unwrap().1, expected);
    assert!(verify(&h.db, h.store.as_ref()).await.unwrap().is_empty());
    assert_reads_match(&h, &expected).await;
    stop.send(()).unwrap();
    handle.await.unwrap();
}

async fn failover_mid_batch_applies_nothing_twice(h: Harness) {
    h.post_random(9, 100).await;
    let a = Slow::new();
    let b = Slow::new();
    let (_stop_a, handle_a) = start(h.runner(a.clone(), "a"));
    h.caught_up().await;
    let (stop_b, handle_b) = start(h.runner(b.clone(), "b"));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        b.batches.load(Ordering::SeqCst),
        0,
        "the standby applied something"
    );

    // a writes a batch's rows, then hangs before committing; kill it there. (On SQLite the
    // batch holds the write lock, so the events go in first, in one append.)
    a.delay_ms.store(60_000, Ordering::SeqCst);
    let mid_batch = a.applying.notified();
    let mut rng = rand::rngs::StdRng::seed_from_u64(10);
    let appends: Vec<StreamAppend> = (0..60)
        .map(|_| {
            let amount = rng.random_range(1..1_000);
            let (stream_id, event) = entry_event(
                "acme",
                &[
                    ("customer:1:available", "USD", amount),
                    ("psp:sim:clearing", "USD", -amount),
                ],
            );
            StreamAppend {
                stream_id,
                expected: ExpectedVersion::NoStream,
                events: vec![event],
            }
        })
        .collect();
    h.store.append(&appends).await.unwrap();
    mid_batch.await;
    handle_a.abort();
    let killed = Instant::now();
    let _ = handle_a.await;

    h.caught_up().await;
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "takeover too slow: {:?}",
        killed.elapsed()
    );
    assert!(b.batches.load(Ordering::SeqCst) > 0);
    let expected = h.recompute().await;
    assert_eq!(snapshot_all(&h.db).await.unwrap().1, expected);
    assert!(verify(&h.db, h.store.as_ref()).await.unwrap().is_empty());
    stop_b.send(()).unwrap();
    handle_b.await.unwrap();
}
