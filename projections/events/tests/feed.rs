//! The merchant events projection against both backends, fed a real payment stream's events by
//! hand: in order, and with versions out of the log's order (as PostgreSQL's gap-free order by
//! transaction id can deliver them). Both give the same feed: the same ids, types, order, times
//! and objects, numbered 1, 2, 3 … without a gap.

#![allow(clippy::unwrap_used)] // test code: a failed setup step should panic loudly

use asiento_domain::{
    decide_payment, evolve_payment, payment_stream, Amount, CaptureMode, CreatePayment, Currency,
    CustomerId, FeeSchedule, OperationKind, OperationOutcome, Payment, PaymentCommand, PaymentId,
    ProviderFact, ProviderName, TenantId,
};
use asiento_eventstore::{
    Database, EventStore, ExpectedVersion, Metadata, NewEvent, RecordedEvent, StreamAppend,
};
use asiento_merchant_events::{read_after, FeedCursor, FeedEvent, FeedQuery, MerchantEvents};
use asiento_projector::Projection;
use asiento_testkit::{Backend, TestDatabase};
use chrono::{DateTime, Utc};
use std::sync::Arc;
use uuid::Uuid;

/// A migrated database of the test's own, with the projection installed (the directory of a
/// SQLite file is held with it).
async fn database(backend: Backend) -> (Database, TestDatabase) {
    let test_db = TestDatabase::open(backend).await;
    let db = test_db.database().clone();
    asiento_merchant_events::install(&db).await.unwrap();
    (db, test_db)
}

/// Decides each command in turn and appends what it decided, one append per command.
async fn payment_stream_of(
    store: &dyn EventStore,
    commands: Vec<PaymentCommand>,
) -> Vec<RecordedEvent> {
    let mut payment = Payment::default();
    for command in commands {
        decide_and_append(store, &mut payment, command).await;
    }
    let id = payment.record.unwrap().id;
    store
        .read_stream(&payment_stream(id), 1, 1_000)
        .await
        .unwrap()
}

/// Decides `command` on `payment`, appends what it decided and folds it in.
async fn decide_and_append(store: &dyn EventStore, payment: &mut Payment, command: PaymentCommand) {
    let events = decide_payment(payment, command).unwrap();
    let id = match (&payment.record, &events[0]) {
        (Some(record), _) => record.id,
        (None, asiento_domain::PaymentEvent::PaymentIntended(e)) => e.payment_id,
        (None, other) => panic!("a payment starts with its intent, not {other:?}"),
    };
    let new_events = events
        .iter()
        .map(|e| NewEvent {
            event_id: Uuid::new_v4(),
            event_type: e.event_type().to_owned(),
            schema: e.schema_version(),
            data: e.encode().unwrap(),
            metadata: Metadata {
                tenant: Some("acme".to_owned()),
                ..Metadata::default()
            },
        })
        .collect();
    store
        .append(&[StreamAppend {
            stream_id: payment_stream(id),
            expected: ExpectedVersion::Exact(payment.version),
            events: new_events,
        }])
        .await
        .unwrap();
    for event in &events {
        *payment = evolve_payment(std::mem::take(payment), event);
    }
}

fn at(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_764_000_000 + seconds, 0).unwrap()
}

/// Created, captured, refunded twice: four merchant events among its events.
fn commands() -> Vec<PaymentCommand> {
    let mut commands = created_and_captured();
    let charge_id = charge_of(&commands);
    let fees = FeeSchedule::new(300, Amount::ZERO).unwrap();
    let fact = |fact, s| PaymentCommand::Provider {
        fact,
        fees,
        at: at(s),
    };
    let refund = |amount, s| PaymentCommand::RequestRefund {
        amount: Amount::new(amount),
        at: at(s),
    };
    let refunded = |total, s| {
        fact(
            ProviderFact::Refunded {
                charge_id: charge_id.clone(),
                amount_refunded: Amount::new(total),
                current: false,
            },
            s,
        )
    };
    commands.extend([
        refund(1_000, 2),
        refunded(1_000, 3),
        refund(500, 4),
        refunded(1_500, 5),
    ]);
    commands
}

fn charge_of(commands: &[PaymentCommand]) -> String {
    match &commands[0] {
        PaymentCommand::Create(create) => format!("ch_{}", create.id.as_uuid().simple()),
        other => panic!("not a creation: {other:?}"),
    }
}

/// A payment of 100.00 USD created and captured at once.
fn created_and_captured() -> Vec<PaymentCommand> {
    let id = PaymentId::from_uuid(Uuid::new_v4());
    let charge_id = format!("ch_{}", id.as_uuid().simple());
    let fees = FeeSchedule::new(300, Amount::ZERO).unwrap();
    let fact = |fact, s| PaymentCommand::Provider {
        fact,
        fees,
        at: at(s),
    };
    vec![
        PaymentCommand::Create(CreatePayment {
            id,
            tenant: TenantId::parse("acme").unwrap(),
            amount: Amount::new(10_000),
            currency: Currency::parse("USD").unwrap(),
            customer: CustomerId::parse("42").unwrap(),
            provider: ProviderName::parse("sim").unwrap(),
            capture_mode: CaptureMode::Automatic,
            description: None,
            metadata: serde_json::Map::new(),
            payment_method: None,
            at: at(0),
        }),
        fact(
            ProviderFact::Captured {
                charge_id: charge_id.clone(),
                amount: Amount::new(10_000),
            },
            1,
        ),
    ]
}

async fn apply(db: &Database, batch: &[RecordedEvent]) {
    let mut tx = db.begin().await.unwrap();
    MerchantEvents.apply(&mut tx, 1, batch).await.unwrap();
    tx.commit().await.unwrap();
}

async fn feed(db: &Database) -> Vec<FeedEvent> {
    read_after(
        db,
        &FeedQuery {
            tenant: Some("acme".to_owned()),
            after: FeedCursor::START,
            types: Vec::new(),
            limit: 1_000,
        },
    )
    .await
    .unwrap()
}

async fn versions_out_of_order_give_the_feed_in_order_would(backend: Backend) {
    let (source, _d0) = database(backend).await;
    let events = payment_stream_of(source.event_store().as_ref(), commands()).await;
    let version = |v: u64| events.iter().find(|e| e.version == v).unwrap().clone();
    let last = u64::try_from(events.len()).unwrap();
    assert!(last >= 8, "{last} events");

    let (in_order, _d1) = database(backend).await;
    apply(&in_order, &events[..3]).await;
    apply(&in_order, &events[3..]).await;
    let expected = feed(&in_order).await;
    let kinds: Vec<&str> = expected.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "payment.created",
            "payment.captured",
            "payment.refunded",
            "payment.refunded"
        ]
    );
    assert_eq!(
        expected.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    for event in &expected {
        let origin = events
            .iter()
            .find(|e| e.position == event.position)
            .unwrap();
        let body: serde_json::Value = serde_json::from_str(&event.body).unwrap();
        assert_eq!(
            body["created"],
            asiento_objects::time(&origin.recorded_at),
            "{body}"
        );
        assert_eq!(body["id"], event.event_id);
        assert_eq!(body["data"]["object"]["position"], event.position);
    }
    let refunds: Vec<i64> = expected[2..]
        .iter()
        .map(|e| {
            let body: serde_json::Value = serde_json::from_str(&e.body).unwrap();
            body["data"]["operation"]["amount_minor"].as_i64().unwrap()
        })
        .collect();
    assert_eq!(refunds, [1_000, 500]);

    // The same events, versions 2 and 3 before 1, and the tail before 4.
    let (out_of_order, _d2) = database(backend).await;
    apply(&out_of_order, &[version(3), version(2)]).await;
    assert_eq!(feed(&out_of_order).await, []);
    apply(&out_of_order, &[version(1)]).await;
    assert_eq!(feed(&out_of_order).await.len(), 2);
    let tail: Vec<_> = (5..=last).map(version).collect();
    apply(&out_of_order, &tail).await;
    assert_eq!(feed(&out_of_order).await.len(), 2);
    apply(&out_of_order, &[version(4)]).await;
    assert_eq!(feed(&out_of_order).await, expected);
}

/// The projection rebuilt in batches of three events once the log shows position `last`. The
/// rebuild reads what the log shows, which a transaction of another test on the cluster
/// (creating its database) can hold back for a moment: read on until it shows `last`. (Each read
/// goes on from the last: a short page is not the log's end.)
async fn rebuilt_through(
    db: &Database,
    store: &Arc<dyn EventStore>,
    last: i64,
) -> asiento_projector::RebuildReport {
    let (mut reached, mut shown) = (asiento_eventstore::Cursor::START, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while shown < last {
        let page = store.read_all(reached, 1_000).await.unwrap();
        match page.last() {
            Some(event) => (reached, shown) = (event.cursor, event.position.max(shown)),
            None => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the log never showed position {last}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
    let mut config = asiento_projector::RebuildConfig::new("feed-test");
    config.batch_size_max = 3;
    asiento_projector::rebuild(db, store, &MerchantEvents, &config, std::future::pending())
        .await
        .unwrap()
}

/// The feed's check holding one stream's fold at a time: payments whose events interleave in
/// the log, each forgotten between its events and folded again from the log before the next,
/// give the findings of holding them all, on a right feed and on one with a row edited.
async fn the_feed_check_folds_a_forgotten_stream_again(backend: Backend) {
    let (db, _d) = database(backend).await;
    let store = db.event_store();
    let mut payments: Vec<(Payment, Vec<PaymentCommand>)> =
        (0..3).map(|_| (Payment::default(), commands())).collect();
    for step in 0..payments[0].1.len() {
        for (payment, commands) in &mut payments {
            decide_and_append(store.as_ref(), payment, commands[step].clone()).await;
        }
    }
    let last = store.head().await.unwrap().position();
    let report = rebuilt_through(&db, &store, last).await;
    let held = |streams| asiento_merchant_events::verify_in_pages(&db, store.as_ref(), 2, streams);
    assert_eq!(
        asiento_merchant_events::verify(&db, store.as_ref())
            .await
            .unwrap(),
        []
    );
    assert_eq!(held(1).await.unwrap(), []);

    let edit = format!(
        "UPDATE merchant_events_g{} SET body = body || ' ' WHERE seq = 7",
        report.generation
    );
    let edited = match &db {
        Database::Postgres(pool) => sqlx::query(&edit)
            .execute(pool)
            .await
            .map(|r| r.rows_affected()),
        Database::Sqlite(pool) => sqlx::query(&edit)
            .execute(pool)
            .await
            .map(|r| r.rows_affected()),
    };
    assert_eq!(edited.unwrap(), 1);
    let whole = asiento_merchant_events::verify(&db, store.as_ref())
        .await
        .unwrap();
    assert_eq!(
        whole.iter().map(|m| m.seq).collect::<Vec<_>>(),
        [7],
        "{whole:?}"
    );
    assert_eq!(held(1).await.unwrap(), whole);
}

/// A payment with more operations than a fold keeps (`RECENT_OPERATIONS`), rebuilt in batches of
/// three events so that its operations leave the fold for the archive between batches: a late
/// reversal of its first refund and a settlement naming no refund read archived ones back. The
/// feed is the one derived from the log in one pass (which archives nothing), the stored folds
/// with their archives are the log's, and each event lists the latest operations with the total.
async fn a_long_payment_s_archived_operations_are_read_back_where_events_need_them(
    backend: Backend,
) {
    let (db, _d) = database(backend).await;
    let store = db.event_store();
    let mut payment = Payment::default();
    let commands = created_and_captured();
    let charge_id = charge_of(&commands);
    for command in commands {
        decide_and_append(store.as_ref(), &mut payment, command).await;
    }
    let fees = FeeSchedule::new(300, Amount::ZERO).unwrap();
    let outcome = |payment: &Payment, sequence: u32, outcome: OperationOutcome, s: i64| {
        let op = payment
            .record
            .as_ref()
            .and_then(|r| r.operation(OperationKind::Refund, sequence))
            .unwrap();
        PaymentCommand::Provider {
            fact: ProviderFact::Operation {
                kind: OperationKind::Refund,
                charge_id: charge_id.clone(),
                psp_key: op.psp_key.clone(),
                provider_id: Some(format!("re_{sequence}")),
                amount: op.amount,
                outcome,
                request: None,
            },
            fees,
            at: at(s),
        }
    };
    let refund = |s: i64| PaymentCommand::RequestRefund {
        amount: Amount::new(100),
        at: at(s),
    };
    for sequence in 1..=13 {
        let s = i64::from(sequence) * 10;
        decide_and_append(store.as_ref(), &mut payment, refund(s)).await;
        let settled = outcome(&payment, sequence, OperationOutcome::Succeeded, s + 1);
        decide_and_append(store.as_ref(), &mut payment, settled).await;
    }
    let returned = OperationOutcome::Reversed {
        reason: "returned".into(),
    };
    let reversal = outcome(&payment, 1, returned, 200);
    decide_and_append(store.as_ref(), &mut payment, reversal).await;
    // Two refunds asked, then a report that one more settled: the first of them (the archive's
    // settled refunds count in what is already accounted for).
    decide_and_append(store.as_ref(), &mut payment, refund(210)).await;
    decide_and_append(store.as_ref(), &mut payment, refund(212)).await;
    let cumulative = PaymentCommand::Provider {
        fact: ProviderFact::Refunded {
            charge_id: charge_id.clone(),
            amount_refunded: Amount::new(1_400),
            current: false,
        },
        fees,
        at: at(213),
    };
    decide_and_append(store.as_ref(), &mut payment, cumulative).await;
    let stream = payment_stream(payment.record.as_ref().unwrap().id);
    let last = store.last_event(&stream).await.unwrap().unwrap().position;
    let report = rebuilt_through(&db, &store, last).await;
    assert_eq!(
        asiento_merchant_events::verify(&db, store.as_ref())
            .await
            .unwrap(),
        []
    );
    assert_eq!(
        asiento_merchant_events::verify_states(&db, store.as_ref())
            .await
            .unwrap(),
        []
    );

    let bodies: Vec<serde_json::Value> = feed(&db)
        .await
        .iter()
        .map(|e| serde_json::from_str(&e.body).unwrap())
        .collect();
    let last = |kind: &str| bodies.iter().rev().find(|b| b["type"] == kind).unwrap();
    let listed = |body: &serde_json::Value| -> Vec<u64> {
        body["data"]["object"]["operations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|op| op["sequence"].as_u64().unwrap())
            .collect()
    };
    let failed = last("payment.refund_failed");
    assert_eq!(failed["data"]["operation"]["sequence"], 1, "{failed}");
    assert_eq!(failed["data"]["operation"]["state"], "reversed", "{failed}");
    assert_eq!(
        failed["data"]["operation"]["provider_id"], "re_1",
        "{failed}"
    );
    assert_eq!(listed(failed), (4..=13).collect::<Vec<_>>());
    assert_eq!(failed["data"]["object"]["operations_total"], 13);
    let settled = last("payment.refunded");
    assert_eq!(settled["data"]["operation"]["sequence"], 14, "{settled}");
    assert_eq!(
        settled["data"]["operation"]["state"], "succeeded",
        "{settled}"
    );
    assert_eq!(listed(settled), (6..=15).collect::<Vec<_>>());
    assert_eq!(settled["data"]["object"]["operations_total"], 15);
    assert_eq!(
        settled["data"]["object"]["operations"][9]["state"],
        "requested"
    );
    assert_eq!(settled["data"]["object"]["refunded_minor"], 1_300);

    // The fold holds the latest ten; the archive the rest, which the checker reads.
    let table = format!("merchant_event_operations_g{}", report.generation);
    let count = format!("SELECT COUNT(*) FROM {table}");
    let count: i64 = match &db {
        Database::Postgres(pool) => sqlx::query_scalar(&count).fetch_one(pool).await.unwrap(),
        Database::Sqlite(pool) => sqlx::query_scalar(&count).fetch_one(pool).await.unwrap(),
    };
    assert_eq!(count, 5);
    let lose = format!("DELETE FROM {table} WHERE idx = 2");
    let lost = match &db {
        Database::Postgres(pool) => sqlx::query(&lose)
            .execute(pool)
            .await
            .unwrap()
            .rows_affected(),
        Database::Sqlite(pool) => sqlx::query(&lose)
            .execute(pool)
            .await
            .unwrap()
            .rows_affected(),
    };
    assert_eq!(lost, 1);
    let mismatches = asiento_merchant_events::verify_states(&db, store.as_ref())
        .await
        .unwrap();
    assert_eq!(mismatches.len(), 1, "{mismatches:?}");
    assert!(
        mismatches[0]
            .detail
            .contains("the archive holds operations [0, 1, 3, 4]"),
        "{mismatches:?}"
    );
    // The stream's stored fold lost too: the log has a fold no row keeps, and the archive
    // operations of a stream with no fold.
    let forget = format!(
        "DELETE FROM merchant_event_streams_g{} WHERE stream_id = '{stream}'",
        report.generation
    );
    let forgotten = match &db {
        Database::Postgres(pool) => sqlx::query(&forget)
            .execute(pool)
            .await
            .map(|r| r.rows_affected()),
        Database::Sqlite(pool) => sqlx::query(&forget)
            .execute(pool)
            .await
            .map(|r| r.rows_affected()),
    };
    assert_eq!(forgotten.unwrap(), 1);
    let mismatches = asiento_merchant_events::verify_states(&db, store.as_ref())
        .await
        .unwrap();
    let details: Vec<(&str, &str)> = mismatches
        .iter()
        .map(|m| (m.stream_id.as_str(), m.detail.as_str()))
        .collect();
    assert_eq!(
        details,
        [
            (stream.as_str(), "no stored fold"),
            (
                stream.as_str(),
                "archived operations of a stream with no stored fold"
            ),
        ],
    );
    let paged = asiento_merchant_events::verify_states_in_pages(&db, store.as_ref(), 1)
        .await
        .unwrap();
    assert_eq!(paged, mismatches, "one stream a page");

    // The feed's checker, reading the stored rows a page at a time: a row lost, one edited, and
    // one the log does not give are each named by their number.
    let rows = format!("merchant_events_g{}", report.generation);
    let last: i64 = {
        let max = format!("SELECT MAX(seq) FROM {rows}");
        match &db {
            Database::Postgres(pool) => sqlx::query_scalar(&max).fetch_one(pool).await.unwrap(),
            Database::Sqlite(pool) => sqlx::query_scalar(&max).fetch_one(pool).await.unwrap(),
        }
    };
    assert!(last > 5, "{last} rows");
    let extra = last + 1;
    for statement in [
        format!("DELETE FROM {rows} WHERE seq = 2"),
        format!("UPDATE {rows} SET body = body || ' ' WHERE seq = 4"),
        format!(
            "INSERT INTO {rows} (seq, event_id, tenant, event_type, position, body) \
             SELECT {extra}, 'evt_extra', tenant, event_type, position, body FROM {rows} \
             WHERE seq = 1"
        ),
    ] {
        let changed = match &db {
            Database::Postgres(pool) => sqlx::query(&statement)
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
            Database::Sqlite(pool) => sqlx::query(&statement)
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
        };
        assert_eq!(changed.unwrap(), 1, "{statement}");
    }
    let found = asiento_merchant_events::verify(&db, store.as_ref())
        .await
        .unwrap();
    let named: Vec<(i64, bool, bool)> = found
        .iter()
        .map(|m| (m.seq, m.stored.is_some(), m.derived.is_some()))
        .collect();
    assert_eq!(
        named,
        [(2, false, true), (4, true, true), (extra, true, false)],
        "{found:?}"
    );
    for page_rows in [1, 2, 3] {
        let paged = asiento_merchant_events::verify_in_pages(&db, store.as_ref(), page_rows, 1)
            .await
            .unwrap();
        assert_eq!(paged, found, "{page_rows} rows a page");
    }
}

asiento_testkit::both_backends!(
    versions_out_of_order_give_the_feed_in_order_would,
    a_long_payment_s_archived_operations_are_read_back_where_events_need_them,
    the_feed_check_folds_a_forgotten_stream_again,
);
