//! One conformance suite, run unchanged against both backends: each test in
//! `suite` borrows a [`Harness`] (a fresh, migrated database), and the test
//! kit's `both_backends!` runs every test once per backend.

// Everything in this file is test code; clippy.toml's unwrap allowance
// only reaches `#[test]` functions, not their helpers.
#![allow(clippy::unwrap_used)]

mod common;

mod suite {
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::time::Duration;

    use asiento_eventstore::{
        AppendError, Backend, Cursor, Database, ExpectedVersion, Metadata, RecordedEvent, Tx,
        Upcaster,
    };
    use futures::StreamExt;
    use rand::Rng;
    use uuid::Uuid;

    use crate::common::{assert_each_committed_once, event, events, to, Harness};

    async fn harness(backend: asiento_testkit::Backend) -> Harness {
        Harness::open(backend).await
    }

    asiento_testkit::both_backends!(
        fixture = &harness;
        expectations_table,
        exact_refuses_a_stream_behind_or_ahead,
        multi_stream_append_is_atomic,
        idempotent_resend_returns_the_original_result,
        reused_event_ids_are_refused,
        invalid_appends_are_refused,
        read_stream_from_a_version,
        read_all_batches_cover_everything_once,
        cursors_and_head,
        subscription_catches_up_then_tails_live,
        subscription_from_a_checkpoint,
        events_are_immutable,
        metadata_round_trips,
        upcaster_applies_on_every_read,
        append_in_commits_with_other_work,
        append_in_rolled_back_leaves_nothing,
        append_in_conflict_then_rollback,
        store_units_of_work_end_cleanly_and_reuse_connections,
        last_event_is_the_streams_last,
        read_streams_reads_each_stream_whole,
        paged_reads_list_streams_page_them_and_fetch_positions,
        append_each_in_writes_requests_independently,
        append_each_in_writes_chains_on_one_stream_in_order,
        migrations_are_reported_applied,
        race_sixteen_exact_writers_one_stream,
        race_slow_writers_under_a_tailing_subscriber,
        appends_abandoned_mid_flight_write_all_or_nothing,
    );

    const LIVE_WAIT_MS: u64 = 10_000;

    /// Every expectation against every stream state: the new version on
    /// success, or the actual version carried by the conflict.
    pub async fn expectations_table(h: &Harness) {
        use ExpectedVersion::*;
        /// Ok(new version) or Err(the actual version the conflict carries).
        type Outcome = Result<u64, Option<u64>>;
        // (stream state: events already in the stream, expectation, outcome)
        let table: &[(u64, ExpectedVersion, Outcome)] = &[
            (0, Any, Ok(1)),
            (0, NoStream, Ok(1)),
            (0, StreamExists, Err(None)),
            (0, Exact(0), Ok(1)),
            (0, Exact(1), Err(None)),
            (2, Any, Ok(3)),
            (2, NoStream, Err(Some(2))),
            (2, StreamExists, Ok(3)),
            (2, Exact(0), Err(Some(2))),
            (2, Exact(1), Err(Some(2))),
            (2, Exact(2), Ok(3)),
            (2, Exact(3), Err(Some(2))),
            (2, Exact(u64::MAX), Err(Some(2))),
        ];
        for (i, &(existing, expected, outcome)) in table.iter().enumerate() {
            let stream = format!("table-{i}");
            if existing > 0 {
                h.store
                    .append(&[to(&stream, NoStream, events(existing as usize))])
                    .await
                    .unwrap();
            }
            let got = h.store.append(&[to(&stream, expected, events(1))]).await;
            match (outcome, got) {
                (Ok(version), Ok(appended)) => {
                    assert_eq!(appended.streams, vec![(stream.clone(), version)], "row {i}")
                }
                (
                    Err(actual),
                    Err(AppendError::Conflict {
                        stream_id,
                        expected: e,
                        actual: a,
                    }),
                ) => {
                    assert_eq!(
                        (stream_id, e, a),
                        (stream.clone(), expected, actual),
                        "row {i}"
                    )
                }
                (want, got) => panic!("row {i}: wanted {want:?}, got {got:?}"),
            }
            let version_after = match outcome {
                Ok(v) => Some(v),
                Err(_) => (existing > 0).then_some(existing),
            };
            assert_eq!(
                h.store.stream_version(&stream).await.unwrap(),
                version_after,
                "row {i}"
            );
        }
    }

    /// Versions never have gaps: an expectation behind the stream and one
    /// ahead of it are both conflicts, and a refused append writes nothing.
    pub async fn exact_refuses_a_stream_behind_or_ahead(h: &Harness) {
        let s = "gapless";
        h.store
            .append(&[to(s, ExpectedVersion::NoStream, events(3))])
            .await
            .unwrap();
        for n in [1, 2, 4, 10] {
            let err = h
                .store
                .append(&[to(s, ExpectedVersion::Exact(n), events(2))])
                .await
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    AppendError::Conflict {
                        actual: Some(3),
                        ..
                    }
                ),
                "{err:?}"
            );
        }
        let all = h.store.read_stream(s, 0, 100).await.unwrap();
        let versions: Vec<u64> = all.iter().map(|e| e.version).collect();
        assert_eq!(versions, vec![1, 2, 3]);
    }

    pub async fn multi_stream_append_is_atomic(h: &Harness) {
        use ExpectedVersion::*;
        h.store
            .append(&[to("b", NoStream, events(1))])
            .await
            .unwrap();
        // One stream's expectation fails: nothing of the append is written.
        let err = h
            .store
            .append(&[
                to("a", NoStream, events(2)),
                to("b", Exact(5), events(1)),
                to("c", Any, events(1)),
            ])
            .await
            .unwrap_err();
        match err {
            AppendError::Conflict {
                stream_id,
                expected,
                actual,
            } => assert_eq!(
                (stream_id.as_str(), expected, actual),
                ("b", Exact(5), Some(1))
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(h.store.stream_version("a").await.unwrap(), None);
        assert_eq!(h.store.stream_version("c").await.unwrap(), None);
        assert_eq!(h.count("SELECT count(*) FROM events").await, 1);

        let appended = h
            .store
            .append(&[
                to("a", NoStream, events(2)),
                to("b", Exact(1), events(1)),
                to("c", Any, events(3)),
            ])
            .await
            .unwrap();
        assert_eq!(
            appended.streams,
            vec![("a".into(), 2), ("b".into(), 2), ("c".into(), 3)]
        );
        h.settled(appended.last_cursor).await;
        let all = h.store.read_all(Cursor::START, 100).await.unwrap();
        assert_eq!(all.len(), 7);
        let written: Vec<&RecordedEvent> = all[1..].iter().collect();
        // One append is one transaction: its events share the commit-order key.
        assert!(written
            .iter()
            .all(|e| e.cursor.xact() == written[0].cursor.xact()));
        assert_eq!(appended.first_position, written[0].position);
        assert_eq!(appended.last_position, written[5].position);
        assert_eq!(appended.last_cursor, written[5].cursor);
    }

    pub async fn idempotent_resend_returns_the_original_result(h: &Harness) {
        use ExpectedVersion::*;
        h.store
            .append(&[to("s", NoStream, events(1))])
            .await
            .unwrap();
        let batch = to("s", Exact(1), events(2));
        let original = h.store.append(std::slice::from_ref(&batch)).await.unwrap();
        assert_eq!(original.streams, vec![("s".into(), 3)]);

        // The same request again, also after the stream moved on.
        assert_eq!(
            h.store.append(std::slice::from_ref(&batch)).await.unwrap(),
            original
        );
        h.store
            .append(&[to("s", Exact(3), events(1))])
            .await
            .unwrap();
        assert_eq!(
            h.store.append(std::slice::from_ref(&batch)).await.unwrap(),
            original
        );
        // `Any` is satisfied by any original.
        let mut any = batch.clone();
        any.expected = Any;
        assert_eq!(h.store.append(&[any]).await.unwrap(), original);
        // A different expectation is not a re-send of this append.
        let mut other = batch.clone();
        other.expected = Exact(2);
        assert!(matches!(
            h.store.append(&[other]).await.unwrap_err(),
            AppendError::Conflict {
                actual: Some(4),
                ..
            }
        ));
        assert_eq!(h.store.read_stream("s", 0, 100).await.unwrap().len(), 4);

        // Multi-stream appends re-send as a whole, also inside a unit of work.
        let multi = [to("m1", NoStream, events(2)), to("m2", NoStream, events(1))];
        let first = h.store.append(&multi).await.unwrap();
        assert_eq!(h.store.append(&multi).await.unwrap(), first);
        let mut tx = h.db.begin().await.unwrap();
        assert_eq!(h.store.append_in(&mut tx, &multi).await.unwrap(), first);
        tx.commit().await.unwrap();
        assert_eq!(h.count("SELECT count(*) FROM events").await, 4 + 3);
    }

    pub async fn reused_event_ids_are_refused(h: &Harness) {
        use ExpectedVersion::*;
        let original = to("x", NoStream, events(2));
        h.store
            .append(std::slice::from_ref(&original))
            .await
            .unwrap();

        // The same ids in another stream.
        let mut elsewhere = original.clone();
        elsewhere.stream_id = "y".into();
        let err = h.store.append(&[elsewhere]).await.unwrap_err();
        assert!(matches!(err, AppendError::EventIdTaken { .. }), "{err:?}");

        // One stored id among new ones.
        let mut mixed = to("x", Exact(2), events(1));
        mixed.events.push(original.events[0].clone());
        let err = h.store.append(&[mixed]).await.unwrap_err();
        assert!(matches!(err, AppendError::EventIdTaken { .. }), "{err:?}");

        // A re-sent stream next to a new one.
        let err = h
            .store
            .append(&[original.clone(), to("z", NoStream, events(1))])
            .await
            .unwrap_err();
        assert!(matches!(err, AppendError::EventIdTaken { .. }), "{err:?}");

        // The ids in a different order.
        let mut reordered = original.clone();
        reordered.events.reverse();
        let err = h.store.append(&[reordered]).await.unwrap_err();
        assert!(matches!(err, AppendError::EventIdTaken { .. }), "{err:?}");

        assert_eq!(h.count("SELECT count(*) FROM events").await, 2);
    }

    pub async fn invalid_appends_are_refused(h: &Harness) {
        use ExpectedVersion::*;
        assert!(matches!(
            h.store.append(&[]).await,
            Err(AppendError::NoEvents)
        ));
        assert!(matches!(
            h.store.append(&[to("e", Any, vec![])]).await,
            Err(AppendError::NoEvents)
        ));
        assert!(matches!(
            h.store
                .append(&[to("e", Any, events(1)), to("e", Any, events(1))])
                .await,
            Err(AppendError::StreamRepeated { .. })
        ));
        let e = event("T", serde_json::json!({}));
        assert!(matches!(
            h.store.append(&[to("e", Any, vec![e.clone(), e])]).await,
            Err(AppendError::EventIdRepeated { .. })
        ));
        assert!(matches!(
            h.store
                .append(&[to(
                    "e",
                    Any,
                    events(asiento_eventstore::EVENTS_PER_APPEND_MAX + 1)
                )])
                .await,
            Err(AppendError::TooManyEvents)
        ));
        assert_eq!(h.count("SELECT count(*) FROM events").await, 0);
    }

    pub async fn read_stream_from_a_version(h: &Harness) {
        use ExpectedVersion::*;
        let written = events(5);
        h.store
            .append(&[to("r", NoStream, written.clone())])
            .await
            .unwrap();
        h.store
            .append(&[to("other", NoStream, events(2))])
            .await
            .unwrap();

        let page = h.store.read_stream("r", 3, 2).await.unwrap();
        assert_eq!(
            page.iter().map(|e| e.version).collect::<Vec<_>>(),
            vec![3, 4]
        );
        assert_eq!(page[0].event_id, written[2].event_id);
        assert_eq!(page[0].data, written[2].data);
        assert_eq!(page[0].event_type, "Tested");
        assert_eq!(page[0].stream_id, "r");

        let all = h.store.read_stream("r", 0, 100).await.unwrap();
        assert_eq!(
            all.iter().map(|e| e.version).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5]
        );
        let ids: Vec<Uuid> = all.iter().map(|e| e.event_id).collect();
        assert_eq!(ids, written.iter().map(|e| e.event_id).collect::<Vec<_>>());
        assert!(h.store.read_stream("r", 6, 100).await.unwrap().is_empty());
        assert!(h
            .store
            .read_stream("nothing", 0, 100)
            .await
            .unwrap()
            .is_empty());
    }

    pub async fn read_all_batches_cover_everything_once(h: &Harness) {
        use ExpectedVersion::*;
        let mut expected_ids = Vec::new();
        let mut last = Cursor::START;
        for i in 0..12 {
            let a = to(&format!("p-{i}"), NoStream, events(1 + i % 3));
            let b = to(&format!("q-{}", i % 4), Any, events(2));
            expected_ids.extend(a.events.iter().map(|e| e.event_id));
            expected_ids.extend(b.events.iter().map(|e| e.event_id));
            last = h.store.append(&[a, b]).await.unwrap().last_cursor;
        }
        h.settled(last).await;
        let mut seen = Vec::new();
        let mut cursor = Cursor::START;
        loop {
            let batch = h.store.read_all(cursor, 10).await.unwrap();
            assert!(batch.len() <= 10);
            let Some(last) = batch.last() else { break };
            cursor = last.cursor;
            seen.extend(batch);
        }
        let ids: Vec<Uuid> = seen.iter().map(|e| e.event_id).collect();
        // Appends here are sequential, so the global order is append order.
        assert_eq!(ids, expected_ids);
        assert!(seen.windows(2).all(|w| w[0].cursor < w[1].cursor));
        assert!(seen.windows(2).all(|w| w[0].position < w[1].position));
    }

    pub async fn cursors_and_head(h: &Harness) {
        use ExpectedVersion::*;
        assert_eq!(h.store.head().await.unwrap(), Cursor::START);
        let appended = h
            .store
            .append(&[to("h", NoStream, events(3))])
            .await
            .unwrap();
        h.settled(appended.last_cursor).await;
        assert_eq!(h.store.head().await.unwrap(), appended.last_cursor);
        let all = h.store.read_all(Cursor::START, 10).await.unwrap();
        for e in &all {
            assert_eq!(
                h.store.cursor_of_position(e.position).await.unwrap(),
                Some(e.cursor)
            );
            assert!(e.cursor > Cursor::START);
        }
        assert_eq!(h.store.cursor_of_position(1_000_000).await.unwrap(), None);
        assert!(h
            .store
            .read_all(appended.last_cursor, 10)
            .await
            .unwrap()
            .is_empty());
        // Cursors travel as strings.
        let text = appended.last_cursor.to_string();
        assert_eq!(text.parse::<Cursor>().unwrap(), appended.last_cursor);
        assert!("12".parse::<Cursor>().is_err());
    }

    async fn next_events(
        sub: &mut futures::stream::BoxStream<
            'static,
            Result<Vec<RecordedEvent>, asiento_eventstore::StoreError>,
        >,
        n: usize,
        batch_size: usize,
    ) -> Vec<RecordedEvent> {
        let mut got = Vec::new();
        while got.len() < n {
            let batch = tokio::time::timeout(Duration::from_millis(LIVE_WAIT_MS), sub.next())
                .await
                .expect("subscription delivered in time")
                .expect("subscription does not end")
                .unwrap();
            assert!(!batch.is_empty() && batch.len() <= batch_size);
            got.extend(batch);
        }
        assert_eq!(got.len(), n, "no more than asked for");
        got
    }

    pub async fn subscription_catches_up_then_tails_live(h: &Harness) {
        use ExpectedVersion::*;
        for i in 0..5 {
            h.store
                .append(&[to(&format!("c-{i}"), NoStream, events(5))])
                .await
                .unwrap();
        }
        let mut sub = h.store.subscribe(Cursor::START, 10);
        let caught_up = next_events(&mut sub, 25, 10).await;
        assert!(caught_up.windows(2).all(|w| w[0].cursor < w[1].cursor));

        // Live: appended after the subscriber caught up, from another task,
        // and through a unit of work.
        let store = Arc::clone(&h.store);
        let writer = tokio::spawn(async move {
            for i in 0..3 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                store
                    .append(&[to(&format!("live-{i}"), NoStream, events(1))])
                    .await
                    .unwrap();
            }
        });
        let live = next_events(&mut sub, 3, 10).await;
        writer.await.unwrap();
        let mut tx = h.db.begin().await.unwrap();
        h.store
            .append_in(&mut tx, &[to("live-tx", NoStream, events(2))])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let live_tx = next_events(&mut sub, 2, 10).await;
        assert!(live.iter().all(|e| e.stream_id.starts_with("live-")));
        assert!(live_tx.iter().all(|e| e.stream_id == "live-tx"));
        assert!(caught_up.last().unwrap().cursor < live[0].cursor);
        assert!(live.last().unwrap().cursor < live_tx[0].cursor);
    }

    pub async fn subscription_from_a_checkpoint(h: &Harness) {
        use ExpectedVersion::*;
        let appended = h
            .store
            .append(&[to("k", NoStream, events(7))])
            .await
            .unwrap();
        h.settled(appended.last_cursor).await;
        let all = h.store.read_all(Cursor::START, 100).await.unwrap();
        let checkpoint = all[3].cursor;
        let mut sub = h.store.subscribe(checkpoint, 2);
        let rest = next_events(&mut sub, 3, 2).await;
        assert_eq!(
            rest.iter().map(|e| e.version).collect::<Vec<_>>(),
            vec![5, 6, 7]
        );
    }

    pub async fn events_are_immutable(h: &Harness) {
        use ExpectedVersion::*;
        h.store
            .append(&[to("i", NoStream, events(2))])
            .await
            .unwrap();
        let mut refused = vec![
            h.execute("UPDATE events SET event_type = 'Forged'").await,
            h.execute("DELETE FROM events").await,
            h.execute("DELETE FROM events WHERE version = 1").await,
        ];
        if h.backend() == Backend::Postgres {
            refused.push(h.execute("TRUNCATE events").await);
        }
        for result in refused {
            let err = result.expect_err("changing an event is refused");
            assert!(err.to_string().contains("events are immutable"), "{err}");
        }
        let all = h.store.read_stream("i", 0, 10).await.unwrap();
        assert_eq!(all.len(), 2);
        assert!(all.iter().all(|e| e.event_type == "Tested"));
    }

    pub async fn metadata_round_trips(h: &Harness) {
        use ExpectedVersion::*;
        let before = chrono::Utc::now() - chrono::Duration::seconds(5);
        let mut full = event(
            "Full",
            serde_json::json!({"amount_minor": 2500, "currency": "USD", "nested": [1, {"a": null}]}),
        );
        full.schema = 3;
        full.metadata = Metadata {
            tenant: Some("acme".into()),
            correlation_id: Some(Uuid::new_v4()),
            causation_id: Some(Uuid::new_v4()),
            idempotency_key: Some("key-1".into()),
        };
        let empty = event("Empty", serde_json::json!(null));
        h.store
            .append(&[to("md", NoStream, vec![full.clone(), empty.clone()])])
            .await
            .unwrap();
        let got = h.store.read_stream("md", 0, 10).await.unwrap();
        assert_eq!(got[0].metadata, full.metadata);
        assert_eq!(got[0].data, full.data);
        assert_eq!(got[0].schema, 3);
        assert_eq!(got[0].event_type, "Full");
        assert_eq!(got[1].metadata, Metadata::default());
        assert_eq!(got[1].data, serde_json::Value::Null);
        let after = chrono::Utc::now() + chrono::Duration::seconds(5);
        assert!(got
            .iter()
            .all(|e| before < e.recorded_at && e.recorded_at < after));
        // Absent fields are left out of the stored JSON.
        assert_eq!(
            h.count("SELECT count(*) FROM events WHERE CAST(metadata AS TEXT) LIKE '%tenant%'")
                .await,
            1
        );
    }

    /// Schema 1 of `Renamed` had `amount`; schema 2 calls it `amount_minor`.
    struct RenameAmount;
    impl Upcaster for RenameAmount {
        fn upcast(
            &self,
            event_type: &str,
            schema: i32,
            mut data: serde_json::Value,
        ) -> (i32, serde_json::Value) {
            if event_type != "Renamed" || schema != 1 {
                return (schema, data);
            }
            if let Some(obj) = data.as_object_mut() {
                if let Some(v) = obj.remove("amount") {
                    obj.insert("amount_minor".into(), v);
                }
            }
            (2, data)
        }
    }

    pub async fn upcaster_applies_on_every_read(h: &Harness) {
        use ExpectedVersion::*;
        let old = event("Renamed", serde_json::json!({"amount": 7}));
        let mut current = event("Renamed", serde_json::json!({"amount_minor": 8}));
        current.schema = 2;
        let unrelated = event("Other", serde_json::json!({"amount": 9}));
        let appended = h
            .store
            .append(&[to("u", NoStream, vec![old, current, unrelated])])
            .await
            .unwrap();
        h.settled(appended.last_cursor).await;
        let store = h.store_with(Arc::new(RenameAmount));
        let check = |got: &[RecordedEvent]| {
            assert_eq!(got.len(), 3);
            assert_eq!(
                (got[0].schema, got[0].data.value()),
                (2, &serde_json::json!({"amount_minor": 7}))
            );
            assert_eq!(
                (got[1].schema, got[1].data.value()),
                (2, &serde_json::json!({"amount_minor": 8}))
            );
            assert_eq!(
                (got[2].schema, got[2].data.value()),
                (1, &serde_json::json!({"amount": 9}))
            );
        };
        check(&store.read_stream("u", 0, 10).await.unwrap());
        check(&store.read_all(Cursor::START, 10).await.unwrap());
        let mut sub = store.subscribe(Cursor::START, 10);
        check(&next_events(&mut sub, 3, 10).await);
        // What is stored is unchanged.
        assert_eq!(
            h.store.read_stream("u", 1, 1).await.unwrap()[0].data,
            serde_json::json!({"amount": 7})
        );
    }

    async fn side_table(h: &Harness) {
        h.execute("CREATE TABLE side_effects (k TEXT PRIMARY KEY)")
            .await
            .unwrap();
    }

    async fn insert_side(tx: &mut Tx, k: &str) {
        match tx {
            Tx::Postgres(tx) => {
                sqlx::query("INSERT INTO side_effects (k) VALUES ($1)")
                    .bind(k)
                    .execute(&mut **tx)
                    .await
                    .unwrap();
            }
            Tx::Sqlite(tx) => {
                sqlx::query("INSERT INTO side_effects (k) VALUES (?)")
                    .bind(k)
                    .execute(&mut **tx)
                    .await
                    .unwrap();
            }
        }
    }

    pub async fn append_in_commits_with_other_work(h: &Harness) {
        use ExpectedVersion::*;
        side_table(h).await;
        let mut tx = h.store.begin().await.unwrap();
        insert_side(&mut tx, "request-1").await;
        let appended = h
            .store
            .append_in(
                &mut tx,
                &[to("w", NoStream, events(2)), to("w2", Any, events(1))],
            )
            .await
            .unwrap();
        assert_eq!(appended.streams, vec![("w".into(), 2), ("w2".into(), 1)]);
        tx.commit().await.unwrap();
        assert_eq!(h.count("SELECT count(*) FROM side_effects").await, 1);
        assert_eq!(h.store.stream_version("w").await.unwrap(), Some(2));
        h.settled(appended.last_cursor).await;
        let all = h.store.read_all(Cursor::START, 10).await.unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all.last().unwrap().cursor, appended.last_cursor);
    }

    pub async fn append_in_rolled_back_leaves_nothing(h: &Harness) {
        use ExpectedVersion::*;
        side_table(h).await;
        let mut tx = h.db.begin().await.unwrap();
        insert_side(&mut tx, "request-1").await;
        h.store
            .append_in(&mut tx, &[to("w", NoStream, events(2))])
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        // Dropping a unit of work rolls it back as well (one the store began, too).
        let mut tx = h.store.begin().await.unwrap();
        h.store
            .append_in(&mut tx, &[to("w", NoStream, events(1))])
            .await
            .unwrap();
        drop(tx);
        assert_eq!(h.count("SELECT count(*) FROM side_effects").await, 0);
        assert_eq!(h.store.stream_version("w").await.unwrap(), None);
        assert!(h
            .store
            .read_all(Cursor::START, 10)
            .await
            .unwrap()
            .is_empty());
    }

    pub async fn append_in_conflict_then_rollback(h: &Harness) {
        use ExpectedVersion::*;
        side_table(h).await;
        h.store
            .append(&[to("w", NoStream, events(1))])
            .await
            .unwrap();
        let mut tx = h.db.begin().await.unwrap();
        insert_side(&mut tx, "request-1").await;
        let err = h
            .store
            .append_in(
                &mut tx,
                &[
                    to("fresh", NoStream, events(1)),
                    to("w", NoStream, events(1)),
                ],
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&err, AppendError::Conflict { stream_id, actual: Some(1), .. } if stream_id == "w"),
            "{err:?}"
        );
        tx.rollback().await.unwrap();
        assert_eq!(h.count("SELECT count(*) FROM side_effects").await, 0);
        assert_eq!(h.count("SELECT count(*) FROM events").await, 1);
        // A transaction of the other backend is refused, not misused.
        let other = match h.backend() {
            Backend::Postgres => {
                let sqlite =
                    asiento_testkit::TestDatabase::new(asiento_testkit::Backend::Sqlite).await;
                let db = Database::connect(&sqlite.url).await.unwrap();
                db.begin().await.unwrap()
            }
            Backend::Sqlite => return,
        };
        let mut other = other;
        assert!(matches!(
            h.store
                .append_in(&mut other, &[to("x", Any, events(1))])
                .await,
            Err(AppendError::Store(
                asiento_eventstore::StoreError::BackendMismatch
            ))
        ));
    }

    /// Units of work the store begins (on PostgreSQL, on its own connections) end as asked,
    /// however they end, and what a dropped or rolled-back one did never leaks into the next one
    /// that gets its connection: more rounds than the store keeps connections.
    pub async fn store_units_of_work_end_cleanly_and_reuse_connections(h: &Harness) {
        use ExpectedVersion::*;
        side_table(h).await;
        for round in 0..24 {
            let key = format!("k{round}");
            let mut tx = h.store.begin().await.unwrap();
            insert_side(&mut tx, &key).await;
            h.store
                .append_in(&mut tx, &[to(&key, NoStream, events(1))])
                .await
                .unwrap();
            match round % 3 {
                0 => tx.rollback().await.unwrap(),
                1 => drop(tx),
                _ => tx.commit().await.unwrap(),
            }
            // The same work again: it conflicts only with a committed round.
            let mut tx = h.store.begin().await.unwrap();
            let again = h
                .store
                .append_in(&mut tx, &[to(&key, NoStream, events(1))])
                .await;
            assert_eq!(again.is_ok(), round % 3 != 2, "round {round}: {again:?}");
            tx.rollback().await.unwrap();
        }
        assert_eq!(h.count("SELECT count(*) FROM side_effects").await, 8);
        assert_eq!(h.count("SELECT count(*) FROM events").await, 8);
    }

    pub async fn last_event_is_the_streams_last(h: &Harness) {
        use ExpectedVersion::*;
        assert!(h.store.last_event("g").await.unwrap().is_none());
        h.store
            .append(&[to("g", NoStream, events(3))])
            .await
            .unwrap();
        h.store
            .append(&[to("other", Any, events(2))])
            .await
            .unwrap();
        let last = h.store.last_event("g").await.unwrap().unwrap();
        assert_eq!((last.stream_id.as_str(), last.version), ("g", 3));
        let read = h.store.read_stream("g", 3, 1).await.unwrap();
        assert_eq!(read[0].event_id, last.event_id);
    }

    /// Several streams at once, one of them longer than a page: each whole, in version order,
    /// nothing of other streams, a repeated or unknown id adding nothing.
    pub async fn read_streams_reads_each_stream_whole(h: &Harness) {
        use ExpectedVersion::*;
        let long = asiento_eventstore::READ_BATCH_MAX + 3;
        let mut written = 0;
        while written < long {
            let n = asiento_eventstore::EVENTS_PER_APPEND_MAX.min(long - written);
            let expected = if written == 0 {
                NoStream
            } else {
                Exact(written as u64)
            };
            h.store
                .append(&[to("b-long", expected, events(n))])
                .await
                .unwrap();
            written += n;
        }
        h.store
            .append(&[to("a", NoStream, events(2))])
            .await
            .unwrap();
        h.store
            .append(&[to("c", NoStream, events(1))])
            .await
            .unwrap();
        h.store
            .append(&[to("not-asked", NoStream, events(1))])
            .await
            .unwrap();
        let ids = ["c", "b-long", "a", "a", "unknown"].map(String::from);
        let read = h.store.read_streams(&ids).await.unwrap();
        assert_eq!(read.len(), long + 3);
        let mut streams: Vec<(String, Vec<u64>)> = Vec::new();
        for event in &read {
            match streams.last_mut() {
                Some((id, versions)) if *id == event.stream_id => versions.push(event.version),
                _ => streams.push((event.stream_id.clone(), vec![event.version])),
            }
        }
        streams.sort();
        let want: Vec<(String, Vec<u64>)> = [("a", 2), ("b-long", long), ("c", 1)]
            .into_iter()
            .map(|(id, n)| (id.to_owned(), (1..=n as u64).collect()))
            .collect();
        assert_eq!(streams, want, "each stream once, whole, in version order");
    }

    /// The checker's reads: stream ids listed once each in pages, several streams read page by
    /// page in (stream id, version) order, each whole and nothing else, and events fetched by
    /// position in the global order.
    pub async fn paged_reads_list_streams_page_them_and_fetch_positions(h: &Harness) {
        use ExpectedVersion::*;
        for (stream, n) in [("b", 3), ("a", 2), ("c", 4), ("d", 1)] {
            h.store
                .append(&[to(stream, NoStream, events(n))])
                .await
                .unwrap();
        }
        h.store
            .append(&[to("a", Exact(2), events(1))])
            .await
            .unwrap();

        let mut listed: Vec<String> = Vec::new();
        loop {
            let page = h
                .store
                .stream_ids_after(listed.last().map(String::as_str), 3)
                .await
                .unwrap();
            if page.is_empty() {
                break;
            }
            assert!(page.len() <= 3, "a page is at most its limit");
            listed.extend(page);
        }
        assert_eq!(listed, ["a", "b", "c", "d"], "each stream once, in order");

        let asked = ["c", "a", "unknown"].map(String::from);
        let mut read: Vec<(String, u64)> = Vec::new();
        loop {
            let after = read
                .last()
                .map(|(stream, version)| (stream.as_str(), *version));
            let page = h.store.read_streams_page(&asked, after, 2).await.unwrap();
            assert!(page.len() <= 2, "a page is at most its limit");
            if page.is_empty() {
                break;
            }
            read.extend(
                page.into_iter()
                    .map(|event| (event.stream_id, event.version)),
            );
        }
        let want: Vec<(String, u64)> = [("a", 1), ("a", 2), ("a", 3)]
            .into_iter()
            .chain((1..=4).map(|version| ("c", version)))
            .map(|(stream, version)| (stream.to_owned(), version))
            .collect();
        assert_eq!(
            read, want,
            "each stream asked for, whole, in (stream, version) order"
        );

        let all = h.store.read_all(Cursor::START, 100).await.unwrap();
        let mut positions: Vec<i64> = all.iter().map(|event| event.position).collect();
        positions.reverse();
        positions.push(-1);
        let fetched = h.store.read_positions(&positions).await.unwrap();
        assert_eq!(
            fetched, all,
            "every position that exists, in the global order"
        );
    }

    /// Group commit: each request of a batch is written whole or not at all (one expecting a new
    /// stream that exists writes nothing); two requests naming one stream cannot both be; a batch
    /// that is not all written is rolled back by its caller and leaves nothing; one that is
    /// commits every request with its own result.
    pub async fn append_each_in_writes_requests_independently(h: &Harness) {
        use ExpectedVersion::*;
        h.store
            .append(&[to("y", NoStream, events(1))])
            .await
            .unwrap();
        h.store
            .append(&[to("z", NoStream, events(1))])
            .await
            .unwrap();
        let a = [to("x", NoStream, events(2)), to("y", Exact(1), events(1))];
        let b = [to("z", Exact(1), events(1))];
        let stale = [to("z2", Exact(5), events(1))];
        let same_stream = [to("x", NoStream, events(1))];
        let mut tx = h.store.begin().await.unwrap();
        let results = h
            .store
            .append_each_in(&mut tx, &[&a, &b, &stale, &same_stream])
            .await
            .unwrap();
        assert!(results[1].is_some());
        assert!(results[2].is_none(), "a stale expectation is not written");
        assert_eq!(
            results[0].is_some() as u8 + results[3].is_some() as u8,
            1,
            "one of two requests on one stream: {results:?}"
        );
        tx.rollback().await.unwrap();
        assert_eq!(h.store.stream_version("x").await.unwrap(), None);
        assert_eq!(h.store.stream_version("y").await.unwrap(), Some(1));
        assert_eq!(h.store.stream_version("z").await.unwrap(), Some(1));

        // A request expecting a stream that exists to be new: none of its events is written,
        // not even those past the stream's versions.
        h.store
            .append(&[to("w", NoStream, events(1))])
            .await
            .unwrap();
        let not_new = [to("w", NoStream, events(2))];
        let mut tx = h.store.begin().await.unwrap();
        let results = h
            .store
            .append_each_in(&mut tx, &[&a, &b, &not_new])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let [Some(first), Some(second), None] = &results[..] else {
            panic!("both requests are written, not the third: {results:?}");
        };
        assert_eq!(h.store.stream_version("w").await.unwrap(), Some(1));
        assert_eq!(first.streams, vec![("x".into(), 2), ("y".into(), 2)]);
        assert_eq!(second.streams, vec![("z".into(), 2)]);
        for appended in [first, second] {
            h.settled(appended.last_cursor).await;
            for (stream, version) in &appended.streams {
                let last = h.store.last_event(stream).await.unwrap().unwrap();
                assert_eq!(last.version, *version);
                assert!(last.position >= appended.first_position);
                assert!(last.position <= appended.last_position);
            }
        }
    }

    /// Requests on one stream, each expecting the version the one before leaves (a hot
    /// account's guard in one group commit), are all written, in order, without a gap; a chain
    /// whose first request is stale writes none of it; a request that expects what an earlier
    /// one expected (not what it leaves) is not written.
    pub async fn append_each_in_writes_chains_on_one_stream_in_order(h: &Harness) {
        use ExpectedVersion::*;
        h.store
            .append(&[to("hot", NoStream, events(1))])
            .await
            .unwrap();
        let first = [to("hot", Exact(1), events(2)), to("a", NoStream, events(1))];
        let second = [to("hot", Exact(3), events(1))];
        let third = [to("b", NoStream, events(1)), to("hot", Exact(4), events(1))];
        let mut tx = h.store.begin().await.unwrap();
        let results = h
            .store
            .append_each_in(&mut tx, &[&first, &second, &third])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let versions: Vec<_> = results
            .iter()
            .map(|result| result.as_ref().map(|appended| appended.streams.clone()))
            .collect();
        assert_eq!(
            versions,
            vec![
                Some(vec![("hot".into(), 3), ("a".into(), 1)]),
                Some(vec![("hot".into(), 4)]),
                Some(vec![("b".into(), 1), ("hot".into(), 5)]),
            ]
        );
        let hot = h.store.read_stream("hot", 0, 100).await.unwrap();
        assert_eq!(
            hot.iter().map(|e| e.version).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5]
        );

        let stale = [to("hot", Exact(3), events(1))];
        let after_stale = [to("hot", Exact(4), events(1))];
        let mut tx = h.store.begin().await.unwrap();
        let results = h
            .store
            .append_each_in(&mut tx, &[&stale, &after_stale])
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert!(results[0].is_none(), "a stale expectation is not written");
        assert!(
            results[1].is_none(),
            "nor is what was chained onto it: {results:?}"
        );

        let one = [to("hot", Exact(5), events(1))];
        let same = [to("hot", Exact(5), events(1))];
        let mut tx = h.store.begin().await.unwrap();
        let results = h
            .store
            .append_each_in(&mut tx, &[&one, &same])
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert!(results[0].is_some() && results[1].is_none(), "{results:?}");
        assert_eq!(h.store.stream_version("hot").await.unwrap(), Some(5));
    }

    pub async fn migrations_are_reported_applied(h: &Harness) {
        assert!(!h.db.migrations_pending().await.unwrap());
        h.db.ping().await.unwrap();
        // Running them again is a no-op.
        h.db.migrate().await.unwrap();
        assert!(!h.db.migrations_pending().await.unwrap());
    }

    /// 16 tasks race on one stream with `Exact` expectations: the versions
    /// come out 1..N with no gap or duplicate, and every loser gets
    /// `Conflict` carrying a version at least as new as the one it expected.
    pub async fn race_sixteen_exact_writers_one_stream(h: &Harness) {
        const TASKS: usize = 16;
        const WINS_PER_TASK: usize = 6;
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let mut handles = Vec::new();
        for task in 0..TASKS {
            let store = Arc::clone(&h.store);
            let barrier = Arc::clone(&barrier);
            handles.push(tokio::spawn(async move {
                barrier.wait().await;
                let (mut wins, mut conflicts) = (Vec::new(), 0usize);
                while wins.len() < WINS_PER_TASK {
                    let current = store.stream_version("hot").await.unwrap().unwrap_or(0);
                    let mut e = events(1);
                    e[0].data = serde_json::json!({ "task": task });
                    match store
                        .append(&[to("hot", ExpectedVersion::Exact(current), e)])
                        .await
                    {
                        Ok(a) => wins.push(a.streams[0].1),
                        Err(AppendError::Conflict { actual, .. }) => {
                            assert!(
                                actual.unwrap_or(0) > current,
                                "{actual:?} after expecting {current}"
                            );
                            conflicts += 1;
                        }
                        Err(other) => panic!("a loser must get Conflict, got {other:?}"),
                    }
                }
                (wins, conflicts)
            }));
        }
        let mut won = Vec::new();
        let mut conflicts = 0;
        for handle in handles {
            let (wins, c) = handle.await.unwrap();
            won.extend(wins);
            conflicts += c;
        }
        won.sort_unstable();
        let n = (TASKS * WINS_PER_TASK) as u64;
        assert_eq!(
            won,
            (1..=n).collect::<Vec<_>>(),
            "each version won exactly once"
        );
        assert!(conflicts > 0, "the tasks really raced");
        let stored: Vec<u64> = h
            .store
            .read_stream("hot", 0, 1000)
            .await
            .unwrap()
            .iter()
            .map(|e| e.version)
            .collect();
        assert_eq!(stored, (1..=n).collect::<Vec<_>>());
    }

    /// Appends whose callers give up at random moments (the future dropped
    /// mid-statement, as a timed-out request does): each is written whole or
    /// not at all, and the connections they were on serve later appends
    /// correctly (on PostgreSQL, the store's own append connections).
    pub async fn appends_abandoned_mid_flight_write_all_or_nothing(h: &Harness) {
        const ROUNDS: usize = 200;
        const EVENTS: usize = 5;
        let mut rng = rand::rng();
        let mut abandoned = 0;
        for round in 0..ROUNDS {
            let stream = format!("abandoned-{round}");
            // Every fourth caller gives up after the first poll, the others within 3 ms.
            let patience = match round % 4 {
                0 => Duration::ZERO,
                _ => Duration::from_micros(rng.random_range(0..3_000)),
            };
            let request = [to(&stream, ExpectedVersion::NoStream, events(EVENTS))];
            if tokio::time::timeout(patience, h.store.append(&request))
                .await
                .is_err()
            {
                abandoned += 1;
            }
        }
        // Later appends (on whatever connections are left) see exact versions.
        for round in 0..ROUNDS {
            let stream = format!("abandoned-{round}");
            let version = h.store.stream_version(&stream).await.unwrap();
            assert!(
                matches!(version, None | Some(5)),
                "{stream}: half an append is stored ({version:?})"
            );
            let next = to(
                &stream,
                ExpectedVersion::Exact(version.unwrap_or(0)),
                events(1),
            );
            let appended = h.store.append(&[next]).await.unwrap();
            assert_eq!(appended.streams[0].1, version.unwrap_or(0) + 1);
        }
        assert!(
            abandoned > 0,
            "no append was abandoned: the test proves nothing"
        );
    }

    /// Writers hold their transactions open for random times while a
    /// subscriber tails the log: it receives every committed event exactly
    /// once, and in the same order a later full read gives.
    /// Writers that hold their transactions open for a while, under three subscribers of one
    /// store (which share its cache of the newest events, each at its own pace): every
    /// subscriber sees every committed event once, in the order a fresh store reads the log.
    pub async fn race_slow_writers_under_a_tailing_subscriber(h: &Harness) {
        const WRITERS: usize = 6;
        const TXS_PER_WRITER: usize = 15;
        let collectors: Vec<_> = [7, 3, 50]
            .into_iter()
            .map(|batch_size| {
                let mut sub = h.store.subscribe(Cursor::START, batch_size);
                tokio::spawn(async move {
                    let mut got: Vec<RecordedEvent> = Vec::new();
                    while let Some(batch) = sub.next().await {
                        got.extend(batch.unwrap());
                        if got.iter().any(|e| e.event_type == "Done") {
                            return got;
                        }
                    }
                    got
                })
            })
            .collect();
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let store = Arc::clone(&h.store);
            let db = h.db.clone();
            writers.push(tokio::spawn(async move {
                let mut committed = Vec::new();
                for i in 0..TXS_PER_WRITER {
                    let (hold_ms, n, roll_back, shared) = {
                        let mut rng = rand::rng();
                        (
                            rng.random_range(0..20u64),
                            rng.random_range(1..4usize),
                            rng.random_bool(0.1),
                            rng.random_bool(0.3),
                        )
                    };
                    let stream = if shared {
                        format!("shared-{}", i % 3)
                    } else {
                        format!("w{w}-{i}")
                    };
                    let mut tx = db.begin().await.unwrap();
                    let batch = to(&stream, ExpectedVersion::Any, events(n));
                    match store.append_in(&mut tx, std::slice::from_ref(&batch)).await {
                        Ok(_) => {}
                        Err(AppendError::Conflict { .. }) => {
                            tx.rollback().await.unwrap();
                            continue;
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                    if roll_back {
                        tx.rollback().await.unwrap();
                    } else {
                        tx.commit().await.unwrap();
                        committed.extend(batch.events.iter().map(|e| e.event_id));
                    }
                }
                committed
            }));
        }
        let mut committed = HashSet::new();
        for w in writers {
            committed.extend(w.await.unwrap());
        }
        let done = to(
            "done",
            ExpectedVersion::NoStream,
            vec![event("Done", serde_json::json!({}))],
        );
        committed.insert(done.events[0].event_id);
        h.store.append(&[done]).await.unwrap();

        let mut seen = Vec::new();
        for collector in collectors {
            let got = tokio::time::timeout(Duration::from_millis(LIVE_WAIT_MS * 3), collector)
                .await
                .expect("the subscriber saw the last event in time")
                .unwrap();
            seen.push(assert_each_committed_once(&got, &committed));
        }
        // Stable order: a fresh store (nothing cached) reads the whole log the same way. Read
        // only now: what a subscriber has seen stays readable, but right after the last append
        // another test's open transaction may still hold PostgreSQL's read horizon before it.
        let fresh = h.db.event_store();
        let mut again = Vec::new();
        let mut cursor = Cursor::START;
        loop {
            let batch = fresh.read_all(cursor, 50).await.unwrap();
            let Some(last) = batch.last() else { break };
            cursor = last.cursor;
            again.extend(batch.into_iter().map(|e| e.event_id));
        }
        for ids in seen {
            assert_eq!(again, ids);
        }
    }
}
