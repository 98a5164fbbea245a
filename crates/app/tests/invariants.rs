//! The invariant checker and the seal chain, on both backends: a healthy log passes; then each
//! corruption a test can make by hand (triggers disabled by the test) is found and named: an
//! edited payload (the hash chain, by stream), an unbalanced entry (by entry id), a deleted event
//! (by stream), a duplicated capture posting (by payment), a stuck idempotency key, and an events
//! table that accepts UPDATE again.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use asiento_app::clock::{Clock, SystemClock};
use asiento_app::invariants::{Check, Checker, Report, Sealer};
use asiento_domain::{
    payment_stream, psp_charge_key, Amount, CaptureMode, Currency, CustomerId, EntryId,
    FeeSchedule, PaymentCommand, PaymentEvent, PaymentId, ProviderFact, ProviderName, TenantId,
};
use asiento_eventstore::{Database, Metadata, NewEvent, StreamAppend};

mod common;

use common::{Backend, TestDatabase};

struct Db {
    database: Database,
    /// One sealer for the whole test: it holds the sealer's job lease once it has sealed.
    sealer: Sealer,
    db: TestDatabase,
}

async fn start(backend: Backend) -> Db {
    let db = TestDatabase::open(backend).await;
    Db {
        sealer: Sealer::new(db.database().clone(), clock()),
        database: db.database().clone(),
        db,
    }
}

impl Db {
    async fn finish(self) {
        self.db.finish().await;
    }

    /// Runs SQL as written (the test's own tampering).
    async fn exec(&self, sql: &str) {
        match &self.database {
            Database::Postgres(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
            Database::Sqlite(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// A check run, with the log read in one pass; the same run with every stream in a pass of
    /// its own must find exactly the same (the passes' tallies of entries, guards and payouts
    /// cross streams).
    async fn check(&self, grace_ms: i64) -> Report {
        let run = |streams_per_pass| {
            let mut checker = Checker::new(self.database.clone(), clock());
            checker.idempotency_grace_ms = grace_ms;
            checker.streams_per_pass = streams_per_pass;
            async move { checker.check_once().await.unwrap() }
        };
        for _ in 0..100 {
            let whole = run(usize::MAX).await;
            let split = run(1).await;
            // On PostgreSQL more of the log can become readable between the two runs.
            if split.events_checked != whole.events_checked {
                continue;
            }
            assert_eq!(whole.passes, 1);
            assert!(
                split.passes >= 2 || whole.streams_checked < 2,
                "{} streams in {} passes",
                whole.streams_checked,
                split.passes
            );
            assert_eq!(
                (split.streams_checked, split.unsealed),
                (whole.streams_checked, whole.unsealed)
            );
            if split.passes > 1 {
                // The passes read the log about twice, not once each: the guards' passes read it
                // whole, the streams' passes each their streams and every payout event.
                let guards = self
                    .count("select count(*) from events where version = 1 and stream_id like 'account-%'")
                    .await
                    .max(1);
                let payouts = self
                    .count("select count(*) from events where stream_id like 'payout-%'")
                    .await;
                let streams = split.passes - guards;
                assert_eq!(
                    split.events_read,
                    guards * whole.events_read + whole.events_read + streams * payouts,
                    "events read by {} passes ({guards} of guards)",
                    split.passes
                );
            }
            let found = |report: &Report| {
                let mut found: Vec<_> = report
                    .violations
                    .iter()
                    .map(|v| (v.check.as_str(), v.subject.clone(), v.detail.clone()))
                    .collect();
                found.sort();
                found
            };
            assert_eq!(found(&split), found(&whole), "one pass per stream");
            return whole;
        }
        panic!("two runs in a row never read the same log");
    }

    async fn count(&self, sql: &str) -> u64 {
        let count: i64 = match &self.database {
            Database::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
            Database::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
        };
        u64::try_from(count).unwrap()
    }

    async fn seal(&self) -> u64 {
        self.sealer.seal_once().await.unwrap().unwrap()
    }

    /// Lets the test edit and delete events: the triggers are disabled (and restored by
    /// [`Db::protect`]).
    async fn unprotect(&self) {
        match &self.database {
            Database::Postgres(_) => {
                self.exec("alter table events disable trigger events_immutable")
                    .await
            }
            Database::Sqlite(_) => {
                self.exec("drop trigger events_no_update").await;
                self.exec("drop trigger events_no_delete").await;
            }
        }
    }

    async fn protect(&self) {
        match &self.database {
            Database::Postgres(_) => {
                self.exec("alter table events enable trigger events_immutable")
                    .await
            }
            Database::Sqlite(_) => {
                self.exec(
                    "create trigger events_no_update before update on events begin \
                     select raise(abort, 'events are immutable: UPDATE on events is not allowed'); end",
                )
                .await;
                self.exec(
                    "create trigger events_no_delete before delete on events begin \
                     select raise(abort, 'events are immutable: DELETE on events is not allowed'); end",
                )
                .await;
            }
        }
    }
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// Appends a captured payment's stream the way the flow would (decided by the domain).
async fn captured_payment(database: &Database, n: u128, amount: i64) -> PaymentId {
    let id = PaymentId::from_uuid(uuid::Uuid::from_u128(n));
    let now = chrono::Utc::now();
    let mut payment = asiento_domain::Payment::default();
    let mut events = Vec::new();
    for command in [
        PaymentCommand::Create(asiento_domain::CreatePayment {
            id,
            tenant: TenantId::parse("acme").unwrap(),
            amount: Amount::new(amount),
            currency: Currency::parse("USD").unwrap(),
            customer: CustomerId::parse("42").unwrap(),
            provider: ProviderName::parse("sim").unwrap(),
            capture_mode: CaptureMode::Automatic,
            description: Some("order".into()),
            metadata: serde_json::Map::new(),
            payment_method: None,
            at: now,
        }),
        PaymentCommand::Provider {
            fact: ProviderFact::Captured {
                charge_id: format!("ch_{n}"),
                amount: Amount::new(amount),
            },
            fees: FeeSchedule::new(300, Amount::ZERO).unwrap(),
            at: now,
        },
    ] {
        let decided = asiento_domain::decide_payment(&payment, command).unwrap();
        payment = decided.iter().fold(payment, asiento_domain::evolve_payment);
        events.extend(decided);
    }
    assert_eq!(psp_charge_key(id).len(), 36);
    // With the customer's guard, as the flow writes it.
    let store = database.event_store();
    let guards =
        asiento_app::log::load_guards(store.as_ref(), asiento_app::log::payment_entries(&events))
            .await
            .unwrap();
    let guard_appends = asiento_app::log::payment_guard_appends(&events, &guards).unwrap();
    let appends = asiento_app::log::decision_appends(
        payment_stream(id),
        0,
        asiento_app::log::encode(
            &events,
            &Metadata::default(),
            asiento_app::log::payment_codec,
        )
        .unwrap(),
        &guard_appends,
        &Metadata::default(),
    )
    .unwrap();
    database.event_store().append(&appends).await.unwrap();
    id
}

fn subjects(report: &Report, check: Check) -> Vec<String> {
    report
        .violations
        .iter()
        .filter(|v| v.check == check)
        .map(|v| v.subject.clone())
        .collect()
}

async fn corruptions(backend: Backend) {
    let db = start(backend).await;
    let a = captured_payment(&db.database, 1, 10_000).await;
    let b = captured_payment(&db.database, 2, 5_000).await;
    let c = captured_payment(&db.database, 3, 7_000).await;

    // On PostgreSQL the log serves only transactions older than the oldest one open on the
    // server; wait until every event is readable, or every check below would pass vacuously.
    let appended = db.count("select count(*) from events").await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut report = db.check(0).await;
    while report.events_checked < appended {
        assert!(
            std::time::Instant::now() < deadline,
            "the log never served all {appended} events"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        report = db.check(0).await;
    }

    // Healthy, before and after sealing.
    assert!(report.is_ok(), "{:?}", report.violations);
    assert_eq!(report.unsealed, report.events_checked);
    assert_eq!(db.seal().await, report.events_checked);
    assert_eq!(db.seal().await, 0, "seals are written once");
    // One pass sealed each stream's events as one range: a row at each stream's last version
    // (three payments and the customer's guard).
    assert_eq!(db.count("select count(*) from event_seals").await, 4);
    assert_eq!(
        db.count("select count(*) from event_seals s join events e on e.position = s.position \
                  where e.version = (select max(version) from events l where l.stream_id = e.stream_id)")
            .await,
        4
    );
    let report = db.check(0).await;
    assert!(report.is_ok(), "{:?}", report.violations);
    assert_eq!(report.unsealed, 0);

    // 1. An edited payload that still decodes: only the chain can tell.
    db.unprotect().await;
    let stream_a = payment_stream(a);
    db.exec(&format!(
        "update events set data = {} where stream_id = '{stream_a}' and version = 1",
        match backend {
            Backend::Postgres => "jsonb_set(data, '{description}', '\"tampered\"')",
            Backend::Sqlite => "json_set(data, '$.description', 'tampered')",
        }
    ))
    .await;
    let report = db.check(0).await;
    assert_eq!(subjects(&report, Check::HashChain), vec![stream_a.clone()]);
    // Besides the triggers being off, nothing else is wrong.
    assert_eq!(
        report.violations.len(),
        1 + report.count(Check::EventsImmutable),
        "{:?}",
        report.violations
    );

    // 2. An unbalanced entry: named by its entry id.
    let stream_b = payment_stream(b);
    let entry_b = EntryId::derived(&format!("{b}:capture")).to_string();
    let leg = match backend {
        Backend::Postgres => "jsonb_set(data, '{entry,legs,0,amount_minor}', '-4999')".to_owned(),
        Backend::Sqlite => "json_set(data, '$.entry.legs[0].amount_minor', -4999)".to_owned(),
    };
    db.exec(&format!(
        "update events set data = {leg} where stream_id = '{stream_b}' and event_type = 'EntryPosted'"
    ))
    .await;
    let report = db.check(0).await;
    assert_eq!(
        subjects(&report, Check::EntryZeroSum),
        vec![entry_b.clone()]
    );
    assert!(subjects(&report, Check::HashChain).contains(&stream_b));
    // The customer's guard counted b's capture; the entries no longer do.
    assert_eq!(
        subjects(&report, Check::GuardBalance),
        vec!["acme:customer:42:available:USD".to_owned()]
    );

    // 3. A deleted event: the last one of c's stream (its seal outlives it).
    let stream_c = payment_stream(c);
    db.exec(&format!(
        "delete from events where stream_id = '{stream_c}' and version = \
         (select max(version) from events where stream_id = '{stream_c}')"
    ))
    .await;
    // And one from the middle of a's (its capture): versions are no longer contiguous.
    db.exec(&format!(
        "delete from events where stream_id = '{stream_a}' and version = 2"
    ))
    .await;
    let report = db.check(0).await;
    assert!(
        subjects(&report, Check::HashChain).contains(&stream_c),
        "{:?}",
        report.violations
    );
    assert_eq!(
        subjects(&report, Check::StreamVersions),
        vec![stream_a.clone()]
    );
    // a lost its capture (the posting stays), c its capture posting (the last event), and b's
    // no longer reads as an entry: a posting without a capture, or a capture without one.
    assert_eq!(
        subjects(&report, Check::CapturePosting),
        vec![a.to_string(), b.to_string(), c.to_string()]
    );

    // 4. The table accepts UPDATE again while the trigger is off: found.
    assert_eq!(
        report.count(Check::EventsImmutable),
        2,
        "{:?}",
        report.violations
    );
    db.protect().await;
    let report = db.check(0).await;
    assert_eq!(report.count(Check::EventsImmutable), 0);

    // 5. A second capture posting appended to a healthy payment.
    let d = captured_payment(&db.database, 4, 3_000).await;
    let stream_d = payment_stream(d);
    let posted = db
        .database
        .event_store()
        .read_stream(&stream_d, 1, 100)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.event_type == "EntryPosted")
        .unwrap();
    db.database
        .event_store()
        .append(&[StreamAppend {
            stream_id: stream_d.clone(),
            expected: asiento_eventstore::ExpectedVersion::Any,
            events: vec![NewEvent {
                event_id: uuid::Uuid::new_v4(),
                event_type: posted.event_type.clone(),
                schema: posted.schema,
                data: posted.data.value().clone(),
                metadata: Metadata::default(),
            }],
        }])
        .await
        .unwrap();
    // On PostgreSQL the log serves the append once every transaction older than it has ended on
    // the server (other tests run beside this one): look until it does, for a bounded time.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let report = db.check(0).await;
        if subjects(&report, Check::CapturePosting).contains(&d.to_string()) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the second capture posting of {d} was never found: {:?}",
            report.violations
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // 6. A guard event no entry accounts for, on an account of its own.
    let merchant = asiento_domain::guard_stream(
        &TenantId::parse("acme").unwrap(),
        &asiento_domain::AccountName::parse("merchant:x").unwrap(),
        Currency::parse("USD").unwrap(),
    );
    let stray = asiento_domain::GuardEvent::BalanceChanged(asiento_domain::guard::BalanceChanged {
        entry_id: EntryId::derived("stray"),
        delta_minor: Amount::new(5),
        balance_minor: Amount::new(5),
        pending_debits_delta_minor: Amount::new(3),
        pending_credits_delta_minor: Amount::ZERO,
        pending: asiento_domain::guard::Pending {
            pending_debits_minor: Amount::new(3),
            pending_credits_minor: Amount::ZERO,
        },
        at: chrono::Utc::now(),
        policy: None,
    });
    db.database
        .event_store()
        .append(&[StreamAppend {
            stream_id: merchant,
            expected: asiento_eventstore::ExpectedVersion::NoStream,
            events: vec![NewEvent {
                event_id: uuid::Uuid::new_v4(),
                event_type: stray.event_type().to_owned(),
                schema: stray.schema_version(),
                data: stray.encode().unwrap(),
                metadata: Metadata::default(),
            }],
        }])
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let report = db.check(0).await;
        let guards = subjects(&report, Check::GuardBalance);
        if guards.contains(&"acme:merchant:x:USD".to_owned()) {
            let detail = &report
                .violations
                .iter()
                .find(|v| v.subject == "acme:merchant:x:USD")
                .unwrap()
                .detail;
            assert_eq!(
                detail,
                "the guard says 5 posted, 3 pending debits, 0 pending credits; the entries say \
                 0, 0, 0"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the stray guard event was never found: {:?}",
            report.violations
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // 7. An idempotency record in flight past its lease (and past the grace).
    let mut tx = db.database.begin().await.unwrap();
    let scope = asiento_app::idempotency::Scope {
        tenant: "acme".into(),
        method: "POST".into(),
        route: "/v1/payments".into(),
    };
    let key = asiento_app::idempotency::IdempotencyKey::parse("k-1").unwrap();
    asiento_app::idempotency::claim(
        &mut tx,
        &scope,
        &key,
        asiento_app::idempotency::canonical_body_hash(&serde_json::json!({})),
        &d.to_string(),
        clock().now_ms() - 10_000,
        1_000,
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let report = db.check(0).await;
    assert_eq!(
        subjects(&report, Check::IdempotencyLease),
        vec!["acme POST /v1/payments k-1".to_owned()]
    );
    // Within the grace the reconciler has to finish it, it is not (yet) a violation.
    let report = db.check(60_000).await;
    assert_eq!(report.count(Check::IdempotencyLease), 0);
    assert!(PaymentEvent::TYPES.len() > 1);
    db.finish().await;
}

#[tokio::test]
async fn every_corruption_is_found_and_named_sqlite() {
    corruptions(Backend::Sqlite).await;
}

#[tokio::test]
async fn every_corruption_is_found_and_named_postgres() {
    corruptions(Backend::Postgres).await;
}

/// The sealer's job lease: a second sealer waits while the first holds it, and takes over once a
/// killed holder's lease (never renewed again) runs out, within `SEAL_LEASE_MS_DEFAULT`.
async fn sealer_lease_is_taken_over(backend: Backend) {
    let db = start(backend).await;
    captured_payment(&db.database, 1, 10_000).await;
    let clock = Arc::new(asiento_app::clock::ManualClock::at_ms(1_000_000));
    let first = Sealer::new(db.database.clone(), clock.clone());
    let second = Sealer::new(db.database.clone(), clock.clone());
    assert!(first.seal_once().await.unwrap().is_some());
    assert!(
        second.seal_once().await.unwrap().is_none(),
        "the lease is held"
    );
    clock.advance_ms(asiento_app::invariants::SEAL_LEASE_MS_DEFAULT - 1);
    assert!(
        second.seal_once().await.unwrap().is_none(),
        "not run out yet"
    );
    // `first` was killed: it renews nothing; one more millisecond and its lease has run out.
    clock.advance_ms(1);
    assert!(second.seal_once().await.unwrap().is_some(), "taken over");
    assert!(
        first.seal_once().await.unwrap().is_none(),
        "the old holder stays out"
    );
    db.finish().await;
}

#[tokio::test]
async fn sealer_lease_is_taken_over_sqlite() {
    sealer_lease_is_taken_over(Backend::Sqlite).await;
}

#[tokio::test]
async fn sealer_lease_is_taken_over_postgres() {
    sealer_lease_is_taken_over(Backend::Postgres).await;
}

/// Appends a payout's stream as `asiento_app::payouts` would (decided by the domain).
async fn paid_payout(database: &Database, id: &str, lines: &[(PaymentId, i64, i64)]) {
    use asiento_domain::payout::{self, Payout, PayoutFact, PayoutId, PayoutLine};
    let provider = ProviderName::parse("sim").unwrap();
    let id = PayoutId::parse(id).unwrap();
    let total: i64 = lines.iter().map(|(_, net, _)| net).sum();
    let fact = PayoutFact::Paid {
        currency: Currency::parse("USD").unwrap(),
        amount: Amount::new(total),
        lines: lines
            .iter()
            .map(|(payment, net, provider_net)| PayoutLine {
                payment: *payment,
                tenant: TenantId::parse("acme").unwrap(),
                net_minor: Amount::new(*net),
                provider_net_minor: Amount::new(*provider_net),
                // A captured payment's stream: its create, request, capture and entry.
                agreed_at_version: Some(4),
                transactions: vec![format!("txn_{payment}")],
            })
            .collect(),
        unattributed: Amount::ZERO,
        elsewhere: Amount::ZERO,
        created: chrono::Utc::now(),
    };
    let events =
        payout::decide(&Payout::default(), &provider, &id, fact, chrono::Utc::now()).unwrap();
    let append = StreamAppend {
        stream_id: asiento_domain::payout_stream(&provider, &id),
        expected: asiento_eventstore::ExpectedVersion::NoStream,
        events: asiento_app::log::encode(
            &events,
            &Metadata::default(),
            asiento_app::log::payout_codec,
        )
        .unwrap(),
    };
    database.event_store().append(&[append]).await.unwrap();
}

/// A payout that covers a payment in full leaves nothing of it in clearing; one whose entries
/// are not its lines is named.
async fn payouts_are_checked(backend: Backend) {
    let db = start(backend).await;
    let paid = captured_payment(&db.database, 11, 10_000).await;
    let short = captured_payment(&db.database, 12, 5_000).await;
    let partly = captured_payment(&db.database, 13, 7_000).await;
    // `paid` in full; `partly` half now (the provider holds 7000 for it), the rest later.
    paid_payout(
        &db.database,
        "po_1",
        &[(paid, 10_000, 10_000), (partly, 3_500, 7_000)],
    )
    .await;
    paid_payout(&db.database, "po_2", &[(partly, 3_500, 7_000)]).await;
    let appended = db.count("select count(*) from events").await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut report = db.check(0).await;
    while report.events_checked < appended {
        assert!(
            std::time::Instant::now() < deadline,
            "the log never served all events"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        report = db.check(0).await;
    }
    assert!(report.is_ok(), "{:?}", report.violations);

    // The provider says it paid out all it held for `short` (4900, its fee kept), but the ledger
    // never posted that fee: 100 stays in clearing.
    paid_payout(&db.database, "po_3", &[(short, 4_900, 4_900)]).await;
    let report = db.check(0).await;
    assert_eq!(
        subjects(&report, Check::PayoutClearing),
        vec![short.to_string()]
    );
    assert_eq!(
        report.count(Check::PayoutShare),
        0,
        "{:?}",
        report.violations
    );

    // A payout's entry edited to move another amount (still zero-sum): its share is named.
    db.unprotect().await;
    let stream = "payout-sim:po_1";
    let legs = match backend {
        Backend::Postgres => "jsonb_set(jsonb_set(data, '{entry,legs,0,amount_minor}', '13000'), '{entry,legs,1,amount_minor}', '-13000')",
        Backend::Sqlite => "json_set(data, '$.entry.legs[0].amount_minor', 13000, '$.entry.legs[1].amount_minor', -13000)",
    };
    db.exec(&format!(
        "update events set data = {legs} where stream_id = '{stream}' and event_type = 'EntryPosted'"
    ))
    .await;
    let report = db.check(0).await;
    assert_eq!(
        subjects(&report, Check::PayoutShare),
        vec![stream.to_owned()]
    );
    db.finish().await;
}

#[tokio::test]
async fn payouts_are_checked_sqlite() {
    payouts_are_checked(Backend::Sqlite).await;
}

#[tokio::test]
async fn payouts_are_checked_postgres() {
    payouts_are_checked(Backend::Postgres).await;
}

/// How many rows of `event_seals` a plan's scans returned (`EXPLAIN (ANALYZE, FORMAT JSON)`).
fn seal_rows_read(plan: &serde_json::Value) -> f64 {
    let own = if plan["Relation Name"] == "event_seals" {
        plan["Actual Rows"].as_f64().unwrap() * plan["Actual Loops"].as_f64().unwrap()
    } else {
        0.0
    };
    let children = plan["Plans"]
        .as_array()
        .map_or(0.0, |plans| plans.iter().map(seal_rows_read).sum::<f64>());
    own + children
}

/// The sealer finds a stream's newest seal without reading its older ones: the customer's guard
/// stream, sealed up to once per payment here, is read one seal at a time however many it has (a
/// read of all of them made every sealing batch slower than the last under a long load).
#[tokio::test]
async fn the_sealer_reads_one_seal_per_stream_however_long_the_stream_postgres() {
    /// Seals the stream gathers first; a pass seals only what is readable (other tests'
    /// transactions can hold an event back to the next pass), so payments go on until then.
    const SEALS: i64 = 100;
    let db = start(Backend::Postgres).await;
    let Database::Postgres(pool) = &db.database else {
        unreachable!("a PostgreSQL test database")
    };
    let mut longest = (String::new(), 0_i64);
    for n in 1..=10 * SEALS as u128 {
        captured_payment(&db.database, n, 10_000).await;
        db.seal().await;
        // None until a pass sealed something.
        longest = sqlx::query_as(
            "select stream_id, count(*) from event_seals group by stream_id \
             order by count(*) desc limit 1",
        )
        .fetch_optional(pool)
        .await
        .unwrap()
        .unwrap_or_default();
        if longest.1 >= SEALS {
            break;
        }
    }
    let (longest, seals) = longest;
    assert!(seals >= SEALS, "{longest}: {seals} seals");
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query(&format!(
        "prepare heads(text[]) as {}",
        asiento_app::invariants::SEAL_HEADS_SQL
    ))
    .execute(&mut *conn)
    .await
    .unwrap();
    assert!(!longest.contains('\''), "{longest}");
    let plan: serde_json::Value = sqlx::query_scalar(&format!(
        "explain (analyze, format json) execute heads(array['{longest}', 'payment-none'])"
    ))
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    let read = seal_rows_read(&plan[0]["Plan"]);
    assert!(
        read <= 1.0,
        "{read} seals read for one stream's head: {plan:#}"
    );
    drop(conn);
    assert!(db.check(0).await.violations.is_empty(), "the chain holds");
    db.finish().await;
}
