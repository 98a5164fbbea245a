//! The merchant events projection against both backends, fed a real payment stream's events by
//! hand: in order, and with versions out of the log's order (as PostgreSQL's gap-free order by
//! transaction id can deliver them). Both give the same feed: the same ids, types, order, times
//! and objects, numbered 1, 2, 3 … without a gap.

#![allow(clippy::unwrap_used)] // test code: a failed setup step should panic loudly

use asiento_domain::{
    decide_payment, evolve_payment, payment_stream, Amount, CaptureMode, CreatePayment, Currency,
    CustomerId, FeeSchedule, Payment, PaymentCommand, PaymentId, ProviderFact, ProviderName,
    TenantId,
};
use asiento_eventstore::{
    Database, EventStore, ExpectedVersion, Metadata, NewEvent, RecordedEvent, StreamAppend,
};
use asiento_merchant_events::{read_after, FeedCursor, FeedEvent, FeedQuery, MerchantEvents};
use asiento_projector::Projection;
use asiento_testkit::{Backend, TestDatabase};
use chrono::{DateTime, Utc};
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
    let mut stream = None;
    for command in commands {
        let events = decide_payment(&payment, command).unwrap();
        if let asiento_domain::PaymentEvent::PaymentIntended(e) = &events[0] {
            stream = Some(payment_stream(e.payment_id));
        }
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
                stream_id: stream.clone().unwrap(),
                expected: ExpectedVersion::Exact(payment.version),
                events: new_events,
            }])
            .await
            .unwrap();
        for event in &events {
            payment = evolve_payment(std::mem::take(&mut payment), event);
        }
    }
    store.read_stream(&stream.unwrap(), 1, 100).await.unwrap()
}

fn at(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_764_000_000 + seconds, 0).unwrap()
}

/// Created, captured, refunded twice: four merchant events among its events.
fn commands() -> Vec<PaymentCommand> {
    let id = PaymentId::from_uuid(Uuid::new_v4());
    let charge_id = format!("ch_{}", id.as_uuid().simple());
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
        refund(1_000, 2),
        refunded(1_000, 3),
        refund(500, 4),
        refunded(1_500, 5),
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

asiento_testkit::both_backends!(versions_out_of_order_give_the_feed_in_order_would);
