//! Group commit on both backends: many requests' steps submitted at once, some of which must fail
//! (a key that exists, a stale expected version, a lost lease, a webhook event delivered twice),
//! each get their own outcome, and
//! exactly the steps that succeeded are in the database, whole; a failing step never takes a
//! good one down with it, nor leaves a part of itself behind.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use asiento_app::commit::statement::{self, Written};
use asiento_app::commit::{
    Command, Committed, Completion, Facts, GuardWrite, Respond, Settle, Step, Work, Writer,
};
use asiento_app::idempotency::{
    canonical_body_hash, Completing, FreshClaim, IdempotencyKey, Lease, Scope, StoredResponse,
};
use asiento_app::webhooks::InboxRow;
use asiento_eventstore::{Database, ExpectedVersion, Metadata, NewEvent, StreamAppend};
use common::{Backend, TestDatabase};
use serde_json::json;
use uuid::Uuid;

const NOW_MS: i64 = 1_000_000;
const LEASE_MS: i64 = 60_000;

fn scope() -> Scope {
    Scope {
        tenant: "acme".into(),
        method: "POST".into(),
        route: "/v1/payments".into(),
    }
}

fn claim(key: &str, lease: Lease) -> FreshClaim {
    FreshClaim {
        scope: scope(),
        key: IdempotencyKey::parse(key).unwrap(),
        body: canonical_body_hash(&json!({ "key": key })),
        resource_id: format!("resource-{key}"),
        lease,
        now_ms: NOW_MS,
    }
}

fn lease() -> Lease {
    Lease {
        owner: Uuid::new_v4(),
        expires_ms: NOW_MS + LEASE_MS,
    }
}

fn append(stream_id: &str, expected: ExpectedVersion, n: usize) -> StreamAppend {
    StreamAppend {
        stream_id: stream_id.to_owned(),
        expected,
        events: (0..n)
            .map(|i| NewEvent {
                event_id: Uuid::now_v7(),
                event_type: "Tested".into(),
                schema: 1,
                data: json!({ "i": i }),
                metadata: Metadata::default(),
            })
            .collect(),
    }
}

/// A completion whose response names the position its step's append ended at.
fn completion(key: &str, lease: Lease) -> Completion {
    Completion {
        completing: Completing {
            scope: scope(),
            key: IdempotencyKey::parse(key).unwrap(),
            lease,
            response: StoredResponse::default(),
            now_ms: NOW_MS,
        },
        respond: Respond::new(|position| StoredResponse {
            status: 201,
            body: format!("{position:?}").into_bytes(),
        }),
    }
}

/// A verified `charge.succeeded` event of the simulator, as the inbox stores it.
fn inbox_row(event_id: &str) -> InboxRow {
    InboxRow {
        provider: "sim".into(),
        event_id: event_id.into(),
        event_type: "charge.succeeded".into(),
        payment_ref: None,
        payload: b"{}".to_vec(),
        now_ms: NOW_MS,
    }
}

async fn count(database: &Database, sql: &str) -> i64 {
    match database {
        Database::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
        Database::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
    }
}

/// A customer's guard key (`acme`, USD).
fn customer_key(customer: u32) -> asiento_domain::guard::GuardKey {
    asiento_domain::guard::GuardKey {
        tenant: asiento_domain::TenantId::parse("acme").unwrap(),
        account: asiento_domain::AccountName::parse(&format!("customer:{customer}:available"))
            .unwrap(),
        currency: asiento_domain::Currency::parse("USD").unwrap(),
    }
}

/// A payment decision's step: `payment` (its own stream's append) and the provider fact of
/// entry `n`, `delta` to the customer of `key` against `psp:sim:clearing`, decided against a
/// guard never written.
fn fact_step(
    n: u128,
    key: &asiento_domain::guard::GuardKey,
    delta: i64,
    payment: StreamAppend,
) -> Step {
    use asiento_domain::guard::{DebitGuard, Origin};
    entry_step(
        n,
        key,
        delta,
        payment,
        Origin::ProviderFact,
        DebitGuard::default(),
    )
}

/// [`fact_step`] of any origin (a command's step is never rebased), decided against `read`.
fn entry_step(
    n: u128,
    key: &asiento_domain::guard::GuardKey,
    delta: i64,
    stream: StreamAppend,
    origin: asiento_domain::guard::Origin,
    read: asiento_domain::guard::DebitGuard,
) -> Step {
    use asiento_domain::guard::{decide_entry, Origin};
    use asiento_domain::{AccountName, Amount, EntryId, JournalEntry, Leg};

    let legs = vec![
        Leg::new(key.account.clone(), key.currency, Amount::new(delta)),
        Leg::new(
            AccountName::parse("psp:sim:clearing").unwrap(),
            key.currency,
            Amount::new(-delta),
        ),
    ];
    let entry = JournalEntry::new(
        EntryId::from_uuid(Uuid::from_u128(n)),
        key.tenant.clone(),
        legs,
        None,
    )
    .unwrap();
    let read: std::collections::BTreeMap<_, _> = [(key.clone(), read)].into_iter().collect();
    let at = chrono::DateTime::from_timestamp(1_764_000_000, 0).unwrap();
    let guard_appends = decide_entry(&entry, origin, &read, at).unwrap();
    let mut appends = vec![stream];
    appends.extend(asiento_app::log::guard_appends(&guard_appends, &Metadata::default()).unwrap());
    let guards = GuardWrite {
        read,
        appends: guard_appends,
    };
    if origin == Origin::ProviderFact {
        Step::Facts(Facts {
            appends: appends.into(),
            guards,
            payment: None,
            completion: None,
        })
    } else {
        Step::Command(Command {
            appends: appends.into(),
            guards,
            key: None,
        })
    }
}

/// The rows `steps` write, as the statement takes them.
fn rows(steps: Vec<Step>) -> Vec<Work> {
    steps.into_iter().map(Work::from).collect()
}

/// A step of a payment's facts without guards: `appends`, and the key it completes, if any.
fn facts_step(appends: Arc<[StreamAppend]>, completion: Option<Completion>) -> Step {
    Step::Facts(Facts {
        appends,
        guards: GuardWrite::default(),
        payment: None,
        completion,
    })
}

/// A command's step without guards or key: `appends` alone.
fn plain_step(appends: Arc<[StreamAppend]>) -> Step {
    Step::Command(Command {
        appends,
        guards: GuardWrite::default(),
        key: None,
    })
}

/// A command's step whose key is claimed and completed at once (`completion` names the key
/// `claim` claims, and renders its answer).
fn settled_step(claim: FreshClaim, completion: Completion, appends: Arc<[StreamAppend]>) -> Step {
    assert_eq!(claim.key, completion.completing.key, "one key");
    Step::Command(Command {
        appends,
        guards: GuardWrite::default(),
        key: Some(Settle {
            claim,
            respond: completion.respond,
        }),
    })
}

/// Every balance `key`'s guard records is the sum of the changes written up to it; the sum.
async fn assert_guard_balances_add_up(
    store: &asiento_app::log::Store,
    key: &asiento_domain::guard::GuardKey,
) -> i64 {
    use asiento_domain::guard::GuardEvent;
    let events = store.read_stream(&key.stream(), 0, 1_000).await.unwrap();
    let mut balance = 0;
    for event in &events {
        if let GuardEvent::BalanceChanged(change) =
            GuardEvent::decode_raw(&event.event_type, event.schema, event.data.raw()).unwrap()
        {
            balance += change.delta_minor.minor();
            assert_eq!(change.balance_minor.minor(), balance, "{events:#?}");
        }
    }
    balance
}

async fn each_step_gets_its_own_outcome(backend: Backend) {
    let db = TestDatabase::open(backend).await;
    let database = db.database().clone();
    let store = database.event_store();
    let commits = Writer::new(store.clone());

    // Before: a key already claimed (and completed), an in-flight key with a known lease, and a
    // stream at version 1.
    let held = lease();
    for (key, lease) in [("existing", lease()), ("in-flight", held)] {
        let step = Step::Claim {
            claim: claim(key, lease),
            appends: vec![append(
                &format!("setup-{key}"),
                ExpectedVersion::NoStream,
                1,
            )]
            .into(),
        };
        assert!(matches!(
            commits.commit(step).await.unwrap(),
            Committed::Written(Some(_))
        ));
    }
    store
        .append(&[append("account", ExpectedVersion::NoStream, 1)])
        .await
        .unwrap();

    // Many steps at once: each kind several times, so that batches mix them.
    let mut tasks = Vec::new();
    for i in 0..48 {
        let commits = Arc::clone(&commits);
        let step = match i % 6 {
            // A new key and its intent: written.
            0 => Step::Claim {
                claim: claim(&format!("new-{i}"), lease()),
                appends: vec![append(
                    &format!("payment-{i}"),
                    ExpectedVersion::NoStream,
                    2,
                )]
                .into(),
            },
            // A key that exists: nothing of it is written.
            1 => Step::Claim {
                claim: claim("existing", lease()),
                appends: vec![append(&format!("never-{i}"), ExpectedVersion::NoStream, 2)].into(),
            },
            // A stale expectation beside a good stream: neither is written. Half expect the
            // stream at a version it is not at, half expect it new (the batch statement refuses
            // itself on those, and each step of the batch is written alone).
            2 => plain_step(
                vec![
                    append(&format!("fine-{i}"), ExpectedVersion::NoStream, 1),
                    append(
                        "account",
                        if i % 12 == 2 {
                            ExpectedVersion::Exact(7)
                        } else {
                            ExpectedVersion::NoStream
                        },
                        1,
                    ),
                ]
                .into(),
            ),
            // A completion under a lease that is not the key's: nothing is written.
            3 => facts_step(
                vec![append(&format!("lost-{i}"), ExpectedVersion::NoStream, 1)].into(),
                Some(completion("in-flight", lease())),
            ),
            // A key claimed and completed with its events (a ledger command): written.
            5 => {
                let lease = lease();
                settled_step(
                    claim(&format!("settled-{i}"), lease),
                    completion(&format!("settled-{i}"), lease),
                    vec![append(
                        &format!("settled-{i}"),
                        ExpectedVersion::NoStream,
                        1,
                    )]
                    .into(),
                )
            }
            // Events without a key: written.
            _ => {
                plain_step(vec![append(&format!("plain-{i}"), ExpectedVersion::NoStream, 3)].into())
            }
        };
        tasks.push(tokio::spawn(async move {
            (i, commits.commit(step).await.unwrap())
        }));
    }
    for task in tasks {
        let (i, outcome) = task.await.unwrap();
        match (i % 6, &outcome) {
            (0 | 4, Committed::Written(Some(_)))
            | (1, Committed::NotFresh)
            | (2, Committed::Conflict)
            | (3, Committed::LeaseLost) => {}
            (5, Committed::Written(Some(appended))) => assert_eq!(
                response_body(&database, &format!("settled-{i}")).await,
                format!("{:?}", Some(appended.last_position)).into_bytes()
            ),
            _ => panic!("step {i}: {outcome:?}"),
        }
    }
    // Exactly the good steps, whole: 8 intents of 2, 8 plain appends of 3, 8 settled appends of
    // 1, the 3 set-up events.
    assert_eq!(
        count(&database, "select count(*) from events").await,
        8 * 2 + 8 * 3 + 8 + 3
    );
    for prefix in ["never-", "fine-", "lost-"] {
        let sql = format!("select count(*) from events where stream_id like '{prefix}%'");
        assert_eq!(count(&database, &sql).await, 0, "{prefix}");
    }
    assert_eq!(
        count(&database, "select count(*) from idempotency_keys").await,
        8 + 8 + 2
    );

    // The key's own lease completes it, with the response rendered from its append.
    let step = facts_step(
        vec![append("completing", ExpectedVersion::NoStream, 1)].into(),
        Some(completion("in-flight", held)),
    );
    let Committed::Written(Some(appended)) = commits.commit(step).await.unwrap() else {
        panic!("the holder completes its key");
    };
    assert_eq!(
        response_body(&database, "in-flight").await,
        format!("{:?}", Some(appended.last_position)).into_bytes()
    );

    // Webhook events, each delivered twice at once: each stored once.
    let mut tasks = Vec::new();
    for i in 0..10 {
        let commits = Arc::clone(&commits);
        let row = inbox_row(&format!("evt_{}", i % 5));
        tasks.push(tokio::spawn(async move {
            let work = Step::Inbox(row);
            commits.commit(work).await.unwrap()
        }));
    }
    let mut stored = 0;
    for task in tasks {
        match task.await.unwrap() {
            Committed::Written(None) => stored += 1,
            Committed::NotFresh => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(stored, 5);
    assert_eq!(
        count(&database, "select count(*) from webhook_inbox").await,
        5
    );
    drop(commits);
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_step_gets_its_own_outcome_sqlite() {
    each_step_gets_its_own_outcome(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_step_gets_its_own_outcome_postgres() {
    each_step_gets_its_own_outcome(Backend::Postgres).await;
}

async fn response_body(database: &Database, key: &str) -> Vec<u8> {
    let sql = "select response_body from idempotency_keys where key = $1";
    match database {
        Database::Postgres(pool) => sqlx::query_scalar(sql)
            .bind(key)
            .fetch_one(pool)
            .await
            .unwrap(),
        Database::Sqlite(pool) => sqlx::query_scalar(&sql.replace('$', "?"))
            .bind(key)
            .fetch_one(pool)
            .await
            .unwrap(),
    }
}

/// The one-statement form on its own (PostgreSQL): a batch of every kind of step commits, with a
/// claim that exists gating its step's events, each completion's response carrying its step's
/// real position, a key settled at once (claimed and completed with its step) stored completed
/// with its position, and a step whose stream moved on answered `Conflict` with nothing of it
/// written (not its key, not its other stream's events) while the rest commits; a batch with a
/// completion under a lost lease, two steps settling one key, a step expecting a stream that
/// exists to be new, two steps taking one stream's first version, or a step continuing the chain
/// of a stale one, is refused with nothing of it written.
/// SQLite's batches take the transaction path.
async fn one_statement_commits_a_batch_whole_or_not_at_all(backend: Backend) {
    let db = TestDatabase::open(backend).await;
    let database = db.database().clone();
    let store = database.event_store();
    let commits = Writer::new(store.clone());
    let (held, held_too, settled, rejected) = (lease(), lease(), lease(), lease());
    for (key, lease) in [
        ("existing", lease()),
        ("in-flight", held),
        ("in-flight-too", held_too),
        ("in-flight-other", lease()),
    ] {
        let step = Step::Claim {
            claim: claim(key, lease),
            appends: vec![append(
                &format!("setup-{key}"),
                ExpectedVersion::NoStream,
                1,
            )]
            .into(),
        };
        assert!(matches!(
            commits.commit(step).await.unwrap(),
            Committed::Written(Some(_))
        ));
    }
    store
        .append(&[append("account", ExpectedVersion::NoStream, 2)])
        .await
        .unwrap();
    let steps = vec![
        Step::Claim {
            claim: claim("new", lease()),
            appends: vec![append("payment-new", ExpectedVersion::NoStream, 2)].into(),
        },
        Step::Claim {
            claim: claim("existing", lease()),
            appends: vec![append("never", ExpectedVersion::NoStream, 2)].into(),
        },
        Step::Inbox(inbox_row("evt_a")),
        Step::Inbox(inbox_row("evt_a")),
        facts_step(
            vec![
                append("completing", ExpectedVersion::NoStream, 1),
                append("account", ExpectedVersion::Exact(2), 1),
            ]
            .into(),
            Some(completion("in-flight", held)),
        ),
        facts_step(Arc::default(), Some(completion("in-flight-too", held_too))),
        Step::Claim {
            claim: claim("stale", lease()),
            appends: vec![
                append("payment-stale", ExpectedVersion::NoStream, 1),
                append("account", ExpectedVersion::Exact(1), 1),
            ]
            .into(),
        },
        settled_step(
            claim("settled", settled),
            completion("settled", settled),
            vec![append("transfer-settled", ExpectedVersion::NoStream, 1)].into(),
        ),
        settled_step(
            claim("existing", lease()),
            completion("existing", lease()),
            vec![append("never-settled", ExpectedVersion::NoStream, 1)].into(),
        ),
        settled_step(
            claim("rejected", rejected),
            completion("rejected", rejected),
            Arc::default(),
        ),
    ];
    let written = statement::write(&store, &rows(steps)).await.unwrap();
    if matches!(backend, Backend::Sqlite) {
        assert!(matches!(written, Written::Unfit));
        drop(commits);
        db.finish().await;
        return;
    }
    let Written::Done(outcomes) = written else {
        panic!("the batch fits one statement and commits");
    };
    let (completed, settled) = match &outcomes[..] {
        [Committed::Written(Some(new)), Committed::NotFresh, Committed::Written(None), Committed::NotFresh, Committed::Written(Some(completed)), Committed::Written(None), Committed::Conflict, Committed::Written(Some(settled)), Committed::NotFresh, Committed::Written(None)] =>
        {
            assert_eq!(new.streams, vec![("payment-new".to_owned(), 2)]);
            assert_eq!(
                completed.streams,
                vec![("completing".to_owned(), 1), ("account".to_owned(), 3)]
            );
            assert_eq!(settled.streams, vec![("transfer-settled".to_owned(), 1)]);
            (completed.clone(), settled.clone())
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(
        response_body(&database, "in-flight").await,
        format!("{:?}", Some(completed.last_position)).into_bytes()
    );
    assert_eq!(response_body(&database, "in-flight-too").await, b"None");
    assert_eq!(
        response_body(&database, "settled").await,
        format!("{:?}", Some(settled.last_position)).into_bytes()
    );
    assert_eq!(response_body(&database, "rejected").await, b"None");
    for never in ["never", "never-settled", "payment-stale"] {
        let sql = format!("select count(*) from events where stream_id = '{never}'");
        assert_eq!(count(&database, &sql).await, 0, "{never}");
    }
    assert_eq!(
        count(
            &database,
            "select count(*) from idempotency_keys where key = 'stale'"
        )
        .await,
        0
    );
    assert_eq!(
        count(&database, "select count(*) from webhook_inbox").await,
        1
    );
    let events = count(&database, "select count(*) from events").await;
    let keys = count(&database, "select count(*) from idempotency_keys").await;
    assert_eq!((events, keys), (4 + 2 + 2 + 2 + 1, 4 + 3));

    // A completion under a lease that is not its key's, a key settled twice or a stream version
    // taken twice refuses the whole batch: the good steps beside it are not written either.
    let twice = lease();
    let settling = |stream: &str| {
        settled_step(
            claim("twice", twice),
            completion("twice", twice),
            vec![append(stream, ExpectedVersion::NoStream, 1)].into(),
        )
    };
    for bad in [
        vec![facts_step(
            vec![append("lost", ExpectedVersion::NoStream, 1)].into(),
            Some(completion("in-flight-other", lease())),
        )],
        vec![settling("twice-a"), settling("twice-b")],
        // A step that expects a stream to be new where it exists: its first event is taken.
        vec![Step::Claim {
            claim: claim("account-new", lease()),
            appends: vec![
                append("payment-account-new", ExpectedVersion::NoStream, 1),
                append("account", ExpectedVersion::NoStream, 1),
            ]
            .into(),
        }],
        // Two steps that each take a stream's first version (neither continues the other).
        (0..2)
            .map(|_| plain_step(vec![append("taken-twice", ExpectedVersion::NoStream, 1)].into()))
            .collect(),
        // A step that continues, on one stream, the chain of a stale step: written alone, its
        // row would leave a gap where the stale step's was to go.
        vec![
            plain_step(
                vec![
                    append("chain-stale", ExpectedVersion::Exact(5), 1),
                    append("chain", ExpectedVersion::NoStream, 1),
                ]
                .into(),
            ),
            plain_step(
                vec![
                    append("chain-next", ExpectedVersion::NoStream, 1),
                    append("chain", ExpectedVersion::Exact(1), 1),
                ]
                .into(),
            ),
        ],
    ] {
        let steps = vec![
            Step::Claim {
                claim: claim("refused", lease()),
                appends: vec![append("payment-refused", ExpectedVersion::NoStream, 1)].into(),
            },
            Step::Inbox(inbox_row("evt_refused")),
        ]
        .into_iter()
        .chain(bad)
        .collect::<Vec<_>>();
        assert!(matches!(
            statement::write(&store, &rows(steps)).await.unwrap(),
            Written::Refused
        ));
        assert_eq!(
            count(&database, "select count(*) from events").await,
            events
        );
        assert_eq!(
            count(&database, "select count(*) from idempotency_keys").await,
            keys
        );
        assert_eq!(
            count(&database, "select count(*) from webhook_inbox").await,
            1
        );
    }
    drop(commits);
    db.finish().await;
}

/// The statement holds only the CTEs of the kinds of rows a batch has: a batch of every
/// combination of kinds commits, each step written with its rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_statement_commits_every_combination_of_kinds_postgres() {
    let db = TestDatabase::open(Backend::Postgres).await;
    let store = db.database().event_store();
    for combination in 0..16_u32 {
        let name = |kind: &str| format!("{kind}-{combination}");
        let has = |bit: u32| combination & (1 << bit) != 0;
        let held = lease();
        if has(2) {
            let step = Step::Claim {
                claim: claim(&name("held"), held),
                appends: Arc::default(),
            };
            assert!(matches!(
                statement::write(&store, &[step.into()]).await.unwrap(),
                Written::Done(_)
            ));
        }
        let settled = lease();
        let mut steps = vec![plain_step(
            vec![append(&name("plain"), ExpectedVersion::NoStream, 1)].into(),
        )];
        if has(0) {
            steps.push(Step::Claim {
                claim: claim(&name("claimed"), lease()),
                appends: vec![append(&name("claimed"), ExpectedVersion::NoStream, 1)].into(),
            });
        }
        if has(1) {
            steps.push(Step::Inbox(inbox_row(&name("evt"))));
        }
        if has(2) {
            steps.push(facts_step(
                vec![append(&name("completed"), ExpectedVersion::NoStream, 1)].into(),
                Some(completion(&name("held"), held)),
            ));
        }
        if has(3) {
            steps.push(settled_step(
                claim(&name("settled"), settled),
                completion(&name("settled"), settled),
                vec![append(&name("settled"), ExpectedVersion::NoStream, 1)].into(),
            ));
        }
        let steps = rows(steps);
        let Written::Done(outcomes) = statement::write(&store, &steps).await.unwrap() else {
            panic!("combination {combination:04b}: the batch fits one statement and commits");
        };
        for (step, outcome) in steps.iter().zip(&outcomes) {
            match outcome {
                Committed::Written(Some(appended)) if !step.appends().is_empty() => assert_eq!(
                    appended.streams,
                    vec![(step.appends()[0].stream_id.clone(), 1)],
                    "combination {combination:04b}"
                ),
                Committed::Written(None) if step.appends().is_empty() => {}
                other => panic!("combination {combination:04b}: {other:?}"),
            }
        }
        for (kind, sql) in [
            (2, "select count(*) from idempotency_keys where key = 'held-{c}' and state = 'completed'"),
            (3, "select count(*) from idempotency_keys where key = 'settled-{c}' and state = 'completed'"),
            (0, "select count(*) from idempotency_keys where key = 'claimed-{c}' and state = 'in_flight'"),
            (1, "select count(*) from webhook_inbox where event_id = 'evt-{c}'"),
        ] {
            let sql = sql.replace("{c}", &combination.to_string());
            assert_eq!(count(db.database(), &sql).await, i64::from(has(kind)), "{sql}");
        }
    }
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_statement_commits_a_batch_whole_or_not_at_all_sqlite() {
    one_statement_commits_a_batch_whole_or_not_at_all(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_statement_commits_a_batch_whole_or_not_at_all_postgres() {
    one_statement_commits_a_batch_whole_or_not_at_all(Backend::Postgres).await;
}

/// Forty provider facts on one customer's guard, all decided against the same state and
/// submitted at once (a marketplace seller paid forty times at once), beside forty on other
/// customers: every one is written, none conflicts, and the guard ends at the sum of them all,
/// one version per fact, its overdraft flagged exactly where the chained balances cross zero.
async fn facts_on_one_guard_are_chained_not_refused(backend: Backend) {
    use asiento_domain::guard::{DebitGuard, GuardEvent};
    use asiento_domain::Amount;

    let db = TestDatabase::open(backend).await;
    let store = db.database().event_store();
    let commits = Writer::new(store.clone());
    let step = |n: u32, customer: u32, delta: i64| {
        let payment = append(&format!("payment-{n}"), ExpectedVersion::NoStream, 1);
        fact_step(u128::from(n), &customer_key(customer), delta, payment)
    };
    // Customer 1 is credited 100 forty times, except that the 20th fact is a refund of 5000.
    let deltas: Vec<i64> = (0..40)
        .map(|n| if n == 19 { -5_000 } else { 100 })
        .collect();
    let mut tasks = Vec::new();
    for (n, delta) in (0u32..).zip(deltas.clone()) {
        for (customer, delta) in [(1, delta), (100 + n, 100)] {
            let commits = Arc::clone(&commits);
            let work = step(n * 1_000 + customer, customer, delta);
            tasks.push(tokio::spawn(async move { commits.commit(work).await }));
        }
    }
    for task in tasks {
        let outcome = task.await.unwrap().unwrap();
        assert!(
            matches!(
                outcome,
                Committed::Written(Some(_)) | Committed::Rebased(Some(_), _)
            ),
            "{outcome:?}"
        );
    }
    let events = store
        .read_stream(&customer_key(1).stream(), 0, 1_000)
        .await
        .unwrap();
    let decoded: Vec<GuardEvent> = events
        .iter()
        .map(|e| GuardEvent::decode_raw(&e.event_type, e.schema, e.data.raw()).unwrap())
        .collect();
    let state = decoded
        .iter()
        .fold(DebitGuard::default(), asiento_domain::guard::evolve);
    let changes = decoded
        .iter()
        .filter(|e| matches!(e, GuardEvent::BalanceChanged(_)))
        .count();
    assert_eq!(changes, 40);
    assert_eq!(state.balance, Amount::new(deltas.iter().sum()));
    assert_eq!(state.version, events.len() as u64);
    // Every balance is the one before plus its change, and a flag follows exactly the changes
    // that leave the balance below zero going down.
    let mut balance = 0;
    for (i, event) in decoded.iter().enumerate() {
        if let GuardEvent::BalanceChanged(change) = event {
            let below =
                balance + change.delta_minor.minor() < 0 && change.delta_minor.is_negative();
            balance += change.delta_minor.minor();
            assert_eq!(change.balance_minor.minor(), balance);
            let flagged = matches!(decoded.get(i + 1), Some(GuardEvent::OverdraftFlagged(_)));
            assert_eq!(flagged, below, "event {i}");
        }
    }
    drop(commits);
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn facts_on_one_guard_are_chained_not_refused_sqlite() {
    facts_on_one_guard_are_chained_not_refused(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn facts_on_one_guard_are_chained_not_refused_postgres() {
    facts_on_one_guard_are_chained_not_refused(Backend::Postgres).await;
}

/// No step is written carrying the balances of a step of its batch that was not written. Here
/// the first fact on a guard conflicts on its own stream every time; a declaration on the same
/// guard, appended as a writer outside the batch would (expecting any version, so neither
/// chained nor seen to move the guard), could take the guard's next version; and the second
/// fact, chained onto the first, expects exactly that version: written as chained, the guard
/// would count the first fact's 100 that no entry carries. Whatever else each step is told,
/// every balance the guard records is the sum of the changes written.
async fn no_step_carries_the_balances_of_a_step_not_written(backend: Backend) {
    use asiento_domain::guard::{declare, DebitGuard};
    use asiento_domain::AccountPolicy;

    let db = TestDatabase::open(backend).await;
    let store = db.database().event_store();
    let commits = Writer::new(store.clone());
    let key = customer_key(7);
    let at = chrono::DateTime::from_timestamp(1_764_000_000, 0).unwrap();
    let fact = |n: u128, delta: i64, payment: StreamAppend| fact_step(n, &key, delta, payment);
    let stale = fact(
        1,
        100,
        append("payment-stale", ExpectedVersion::Exact(5), 1),
    );
    let declaration = declare(
        key.clone(),
        &DebitGuard::default(),
        AccountPolicy::implied(&key.account),
        serde_json::Map::new(),
        at,
    )
    .unwrap();
    let mut appends =
        asiento_app::log::guard_appends(&[declaration], &Metadata::default()).unwrap();
    appends[0].expected = ExpectedVersion::Any;
    let declared = plain_step(appends.into());
    let chained = fact(
        2,
        200,
        append("payment-chained", ExpectedVersion::NoStream, 1),
    );
    // On one thread the three are queued before the writer runs: one batch.
    let (stale, declared, chained) = tokio::join!(
        commits.commit(stale),
        commits.commit(declared),
        commits.commit(chained)
    );
    assert!(matches!(stale, Ok(Committed::Conflict)), "{stale:?}");
    for outcome in [&declared, &chained] {
        assert!(
            matches!(
                outcome,
                Ok(Committed::Written(Some(_))
                    | Committed::Rebased(Some(_), _)
                    | Committed::Conflict)
            ),
            "{outcome:?}"
        );
    }
    assert_guard_balances_add_up(&store, &key).await;
    drop(commits);
    db.finish().await;
}

#[tokio::test(flavor = "current_thread")]
async fn no_step_carries_the_balances_of_a_step_not_written_sqlite() {
    no_step_carries_the_balances_of_a_step_not_written(Backend::Sqlite).await;
}

#[tokio::test(flavor = "current_thread")]
async fn no_step_carries_the_balances_of_a_step_not_written_postgres() {
    no_step_carries_the_balances_of_a_step_not_written(Backend::Postgres).await;
}

/// A fact retried after its batch's first try is chained again from the log, never from what an
/// earlier try chained it onto. Here a command on a guard (never rebased) sits between two facts
/// on it that were decided before the guard's last write: all three are stale, the command is
/// answered `Conflict`, and the facts are tried again. The second fact, first chained onto the
/// command, expects the very version the guard is now at; it must still be decided again from the
/// log, or it would carry the command's change that no entry of the guard holds.
async fn a_retried_fact_is_chained_from_the_log_not_from_its_first_try(backend: Backend) {
    use asiento_domain::guard::Origin;

    let db = TestDatabase::open(backend).await;
    let store = db.database().event_store();
    let commits = Writer::new(store.clone());
    let key = customer_key(8);
    let first = fact_step(
        10,
        &key,
        1_000,
        append("payment-first", ExpectedVersion::NoStream, 1),
    );
    assert!(matches!(
        commits.commit(first).await,
        Ok(Committed::Written(Some(_)))
    ));
    let read = asiento_app::log::load_guard(store.as_ref(), &key)
        .await
        .unwrap();
    assert_eq!(read.version, 1);

    // Both facts were decided against the guard before its first write; the command against
    // the guard as it is now.
    let refund = fact_step(
        11,
        &key,
        -100,
        append("payment-refund", ExpectedVersion::NoStream, 1),
    );
    let command = entry_step(
        12,
        &key,
        10,
        append("transfer-command", ExpectedVersion::NoStream, 1),
        Origin::Command,
        read,
    );
    let capture = fact_step(
        13,
        &key,
        300,
        append("payment-capture", ExpectedVersion::NoStream, 1),
    );
    // On one thread the three are queued before the writer runs: one batch.
    let (refund, command, capture) = tokio::join!(
        commits.commit(refund),
        commits.commit(command),
        commits.commit(capture)
    );
    assert!(matches!(command, Ok(Committed::Conflict)), "{command:?}");
    for outcome in [&refund, &capture] {
        assert!(
            matches!(outcome, Ok(Committed::Rebased(Some(_), _))),
            "{outcome:?}"
        );
    }
    assert_eq!(assert_guard_balances_add_up(&store, &key).await, 1_200);
    // What each fact's request is told its guard was left at is what the log holds.
    if let Ok(Committed::Rebased(_, states)) = &capture {
        let logged = asiento_app::log::load_guard(store.as_ref(), &key)
            .await
            .unwrap();
        assert_eq!(states.as_slice(), [(key.clone(), logged)].as_slice());
    }
    drop(commits);
    db.finish().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_retried_fact_is_chained_from_the_log_not_from_its_first_try_sqlite() {
    a_retried_fact_is_chained_from_the_log_not_from_its_first_try(Backend::Sqlite).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_retried_fact_is_chained_from_the_log_not_from_its_first_try_postgres() {
    a_retried_fact_is_chained_from_the_log_not_from_its_first_try(Backend::Postgres).await;
}

/// A fact is never chained onto a step that the batch itself overtakes. W continues a payment's
/// stream; X, a fact on a customer's guard, expects that payment's stream where W found it, so
/// the batch answers X `Conflict`; C, another fact on the same guard decided against the same
/// read as X, must then be written from the guard as the log holds it (+1,000, +50), never
/// chained onto X, whose +100 no entry holds.
async fn a_fact_is_never_chained_onto_a_step_the_batch_overtakes(backend: Backend) {
    use asiento_domain::guard::Origin;

    let db = TestDatabase::open(backend).await;
    let store = db.database().event_store();
    let commits = Writer::new(store.clone());
    let key = customer_key(9);
    let committed = |outcome| matches!(outcome, Ok(Committed::Written(Some(_))));
    let first = fact_step(
        20,
        &key,
        1_000,
        append("payment-a", ExpectedVersion::NoStream, 1),
    );
    assert!(committed(commits.commit(first).await));
    let read = asiento_app::log::load_guard(store.as_ref(), &key)
        .await
        .unwrap();
    assert_eq!(read.version, 1);
    let fact = |n, delta, stream| entry_step(n, &key, delta, stream, Origin::ProviderFact, read);
    let second = fact(21, 50, append("payment-b", ExpectedVersion::NoStream, 1));
    assert!(committed(commits.commit(second).await));
    let created = plain_step(vec![append("payment-p", ExpectedVersion::NoStream, 1)].into());
    assert!(committed(commits.commit(created).await));

    let w = plain_step(vec![append("payment-p", ExpectedVersion::Exact(1), 1)].into());
    let x = fact(22, 100, append("payment-p", ExpectedVersion::Exact(1), 1));
    let c = fact(23, 300, append("payment-c", ExpectedVersion::NoStream, 1));
    // On one thread the three are queued before the writer runs: one batch.
    let (w, x, c) = tokio::join!(commits.commit(w), commits.commit(x), commits.commit(c));
    assert!(matches!(w, Ok(Committed::Written(Some(_)))), "{w:?}");
    assert!(matches!(x, Ok(Committed::Conflict)), "{x:?}");
    assert!(matches!(c, Ok(Committed::Rebased(Some(_), _))), "{c:?}");
    assert_eq!(assert_guard_balances_add_up(&store, &key).await, 1_350);
    let logged = asiento_app::log::load_guard(store.as_ref(), &key)
        .await
        .unwrap();
    assert_eq!((logged.version, logged.balance.minor()), (3, 1_350));
    if let Ok(Committed::Rebased(_, states)) = &c {
        assert_eq!(states.as_slice(), [(key.clone(), logged)].as_slice());
    }
    drop(commits);
    db.finish().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_fact_is_never_chained_onto_a_step_the_batch_overtakes_sqlite() {
    a_fact_is_never_chained_onto_a_step_the_batch_overtakes(Backend::Sqlite).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_fact_is_never_chained_onto_a_step_the_batch_overtakes_postgres() {
    a_fact_is_never_chained_onto_a_step_the_batch_overtakes(Backend::Postgres).await;
}
