//! Why the PostgreSQL log is read by (xact, position) below the xmin horizon
//! and not by `position > last_seen`: identity values are taken before
//! commit, so an event can commit *behind* a position a naive tailer has
//! already passed. These tests show the naive tailer skipping events while
//! the store's reader and subscription do not.

// Everything in this file is test code; clippy.toml's unwrap allowance
// only reaches `#[test]` functions, not their helpers.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use asiento_eventstore::{Cursor, Database, ExpectedVersion, RecordedEvent};
use futures::StreamExt;
use rand::Rng;
use uuid::Uuid;

use common::{assert_each_committed_once, event, events, to, Harness};

/// The tailer every first attempt writes: remember the highest position seen.
async fn naive_read(pool: &sqlx::PgPool, last_seen: i64) -> Vec<(i64, Uuid)> {
    sqlx::query_as("SELECT position, event_id FROM events WHERE position > $1 ORDER BY position")
        .bind(last_seen)
        .fetch_all(pool)
        .await
        .unwrap()
}

fn pg_pool(h: &Harness) -> sqlx::PgPool {
    match &h.db {
        Database::Postgres(pool) => pool.clone(),
        Database::Sqlite(_) => unreachable!("PostgreSQL only"),
    }
}

/// Deterministic: a transaction takes a position, a later one commits first,
/// the naive tailer moves past both, and the early one commits behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naive_position_tailing_skips_a_late_commit_read_all_does_not() {
    let h = Harness::open(asiento_testkit::Backend::Postgres).await;
    let pool = pg_pool(&h);

    let mut slow = h.db.begin().await.unwrap();
    let slow_append = h
        .store
        .append_in(
            &mut slow,
            &[to("slow", ExpectedVersion::NoStream, events(1))],
        )
        .await
        .unwrap();
    let fast_append = h
        .store
        .append(&[to("fast", ExpectedVersion::NoStream, events(1))])
        .await
        .unwrap();
    assert!(slow_append.last_position < fast_append.last_position);

    // The naive tailer sees the fast event and remembers its position.
    let seen = naive_read(&pool, 0).await;
    assert_eq!(
        seen.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![fast_append.last_position]
    );
    let last_seen = fast_append.last_position;

    // The gap-free reader hands out nothing past the open transaction.
    let early = h.store.read_all(Cursor::START, 10).await.unwrap();
    assert!(early.is_empty(), "{early:?}");

    slow.commit().await.unwrap();

    // The slow event is committed now, behind the naive tailer: skipped forever.
    assert!(naive_read(&pool, last_seen).await.is_empty());
    let all_positions: Vec<i64> = naive_read(&pool, 0).await.iter().map(|r| r.0).collect();
    assert_eq!(
        all_positions,
        vec![slow_append.last_position, fast_append.last_position]
    );

    // read_all gives both, the early transaction first.
    h.settled(fast_append.last_cursor).await;
    let all = h.store.read_all(Cursor::START, 10).await.unwrap();
    let streams: Vec<&str> = all.iter().map(|e| e.stream_id.as_str()).collect();
    assert_eq!(streams, vec!["slow", "fast"]);
    assert_eq!(all[0].cursor, slow_append.last_cursor);
    assert_eq!(all[1].cursor, fast_append.last_cursor);
    h.finish().await;
}

/// Under load: slow writers hold their transactions open after inserting
/// while fast writers commit beside them. A naive tailer polling the same
/// table misses events; the subscription receives every committed event
/// exactly once, in a stable order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_load_naive_tailer_misses_events_subscription_gets_all() {
    const SLOW_WRITERS: usize = 3;
    const SLOW_TXS: usize = 12;
    const FAST_WRITERS: usize = 3;
    let h = Harness::open(asiento_testkit::Backend::Postgres).await;
    let pool = pg_pool(&h);
    // Writers stop first; the naive tailer's final read comes after every
    // writer has finished, so whatever it still lacks it skipped for good.
    let stop = Arc::new(AtomicBool::new(false));
    let stop_naive = Arc::new(AtomicBool::new(false));

    let mut sub = h.store.subscribe(Cursor::START, 50);
    let subscriber = tokio::spawn(async move {
        let mut got: Vec<RecordedEvent> = Vec::new();
        while let Some(batch) = sub.next().await {
            got.extend(batch.unwrap());
            if got.iter().any(|e| e.event_type == "Done") {
                break;
            }
        }
        got
    });

    let naive = {
        let pool = pool.clone();
        let stop = Arc::clone(&stop_naive);
        tokio::spawn(async move {
            let mut seen = HashSet::new();
            let mut last_seen = 0;
            while !stop.load(Ordering::Acquire) {
                for (position, id) in naive_read(&pool, last_seen).await {
                    last_seen = last_seen.max(position);
                    seen.insert(id);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            for (_, id) in naive_read(&pool, last_seen).await {
                seen.insert(id);
            }
            seen
        })
    };

    let mut slow = Vec::new();
    for w in 0..SLOW_WRITERS {
        let (db, store) = (h.db.clone(), Arc::clone(&h.store));
        slow.push(tokio::spawn(async move {
            let mut committed = Vec::new();
            for i in 0..SLOW_TXS {
                let hold_ms = rand::rng().random_range(10..40u64);
                let batch = to(
                    &format!("slow-{w}-{i}"),
                    ExpectedVersion::NoStream,
                    events(1),
                );
                let mut tx = db.begin().await.unwrap();
                store
                    .append_in(&mut tx, std::slice::from_ref(&batch))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                tx.commit().await.unwrap();
                committed.push(batch.events[0].event_id);
            }
            committed
        }));
    }
    let mut fast = Vec::new();
    for w in 0..FAST_WRITERS {
        let store = Arc::clone(&h.store);
        let stop = Arc::clone(&stop);
        fast.push(tokio::spawn(async move {
            let mut committed = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Acquire) {
                let batch = to(
                    &format!("fast-{w}-{i}"),
                    ExpectedVersion::NoStream,
                    events(1),
                );
                store.append(std::slice::from_ref(&batch)).await.unwrap();
                committed.push(batch.events[0].event_id);
                i += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            committed
        }));
    }

    let mut committed = HashSet::new();
    for s in slow {
        committed.extend(s.await.unwrap());
    }
    stop.store(true, Ordering::Release);
    for f in fast {
        committed.extend(f.await.unwrap());
    }
    stop_naive.store(true, Ordering::Release);
    let naive_seen = naive.await.unwrap();
    let missed: Vec<&Uuid> = committed.difference(&naive_seen).collect();
    assert!(
        !missed.is_empty(),
        "the naive tailer should have skipped late commits ({} events)",
        committed.len()
    );
    eprintln!(
        "{} committed events: the naive tailer skipped {}, the subscription none",
        committed.len(),
        missed.len()
    );

    let done = to(
        "done",
        ExpectedVersion::NoStream,
        vec![event("Done", serde_json::json!({}))],
    );
    committed.insert(done.events[0].event_id);
    h.store.append(&[done]).await.unwrap();

    let got = tokio::time::timeout(Duration::from_secs(30), subscriber)
        .await
        .expect("the subscriber saw the last event in time")
        .unwrap();
    assert_each_committed_once(&got, &committed);
    h.finish().await;
}
