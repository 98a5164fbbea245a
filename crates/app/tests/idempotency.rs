//! The idempotency store on both backends: claim, replay, reuse, in-flight, takeover after a lost
//! lease, and a real race of many requests for one key.

use asiento_app::idempotency::{
    self, canonical_body_hash, Claim, IdempotencyError, IdempotencyKey, Scope, StoredResponse,
};
use asiento_eventstore::Database;
use asiento_testkit::TestDatabase;

const LEASE_MS: i64 = 30_000;

fn scope() -> Scope {
    Scope {
        tenant: "acme".into(),
        method: "POST".into(),
        route: "/v1/payments".into(),
    }
}

fn key(raw: &str) -> IdempotencyKey {
    IdempotencyKey::parse(raw).expect("valid key")
}

async fn claim_committed(
    database: &Database,
    key: &IdempotencyKey,
    body: &serde_json::Value,
    resource: &str,
    now_ms: i64,
) -> Claim {
    let mut tx = database.begin().await.expect("begin");
    let claim = idempotency::claim(
        &mut tx,
        &scope(),
        key,
        canonical_body_hash(body),
        resource,
        now_ms,
        LEASE_MS,
    )
    .await
    .expect("claim");
    tx.commit().await.expect("commit");
    claim
}

async fn lifecycle(opened: TestDatabase) {
    let database = opened.database().clone();
    let body = serde_json::json!({"amount_minor": 100, "currency": "USD"});
    let k = key("order-1");

    let Claim::Fresh { lease } = claim_committed(&database, &k, &body, "pay_1", 1_000).await else {
        panic!("first claim must be fresh");
    };

    // Same key and body while the first holds its lease: in progress, with a Retry-After.
    let claim = claim_committed(&database, &k, &body, "pay_2", 2_000).await;
    assert!(
        matches!(claim, Claim::InProgress { retry_after_s } if retry_after_s >= 1),
        "{claim:?}"
    );

    // Another body: refused whatever the state.
    let other = serde_json::json!({"amount_minor": 101, "currency": "USD"});
    assert_eq!(
        claim_committed(&database, &k, &other, "pay_3", 2_000).await,
        Claim::KeyReused
    );

    let response = StoredResponse {
        status: 201,
        body: br#"{"id":"pay_1"}"#.to_vec(),
    };
    let mut tx = database.begin().await.expect("begin");
    idempotency::complete(&mut tx, &scope(), &k, lease, &response, 3_000)
        .await
        .expect("complete");
    tx.commit().await.expect("commit");

    // Completed: replayed byte for byte, even long after the lease would have run out.
    assert_eq!(
        claim_committed(&database, &k, &body, "pay_4", 1_000_000).await,
        Claim::Completed(response)
    );
    assert_eq!(
        claim_committed(&database, &k, &other, "pay_5", 1_000_000).await,
        Claim::KeyReused
    );
}

async fn takeover_after_lease_expiry(opened: TestDatabase) {
    let database = opened.database().clone();
    let body = serde_json::json!({"amount_minor": 100});
    let k = key("crashy");
    let Claim::Fresh { lease: dead } = claim_committed(&database, &k, &body, "pay_a", 0).await
    else {
        panic!("fresh");
    };

    // Past the lease, a retry takes over and resumes the resource the first request chose.
    let after = LEASE_MS + 1;
    let Claim::Resumed { lease, resource_id } =
        claim_committed(&database, &k, &body, "pay_b", after).await
    else {
        panic!("must resume");
    };
    assert_eq!(resource_id, "pay_a");

    // The dead holder waking up can no longer complete: its work must roll back.
    let response = StoredResponse {
        status: 201,
        body: b"{}".to_vec(),
    };
    let mut tx = database.begin().await.expect("begin");
    let lost = idempotency::complete(&mut tx, &scope(), &k, dead, &response, after).await;
    assert!(matches!(lost, Err(IdempotencyError::LeaseLost)), "{lost:?}");
    drop(tx);

    // A release lets the next retry take over at once.
    let mut tx = database.begin().await.expect("begin");
    idempotency::release(&mut tx, &scope(), &k, lease, after)
        .await
        .expect("release");
    tx.commit().await.expect("commit");
    let claim = claim_committed(&database, &k, &body, "pay_c", after + 1).await;
    assert!(
        matches!(&claim, Claim::Resumed { resource_id, .. } if resource_id == "pay_a"),
        "{claim:?}"
    );
}

/// Many requests race for one key at the same instant: exactly one wins it.
async fn concurrent_claims_have_one_winner(opened: TestDatabase) {
    let database = opened.database().clone();
    const REQUESTS: usize = 20;
    let body = serde_json::json!({"amount_minor": 500});
    let mut tasks = Vec::new();
    for index in 0..REQUESTS {
        let database = database.clone();
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let resource = format!("pay_{index}");
            claim_committed(&database, &key("raced"), &body, &resource, 10).await
        }));
    }
    let mut fresh = 0;
    for task in tasks {
        match task.await.expect("task") {
            Claim::Fresh { .. } => fresh += 1,
            Claim::InProgress { .. } => {}
            other => panic!("unexpected claim {other:?}"),
        }
    }
    assert_eq!(fresh, 1, "exactly one request may own the key");
}

async fn purge_keeps_in_flight_records(opened: TestDatabase) {
    let database = opened.database().clone();
    let body = serde_json::json!({});
    let Claim::Fresh { lease } = claim_committed(&database, &key("old"), &body, "r1", 0).await
    else {
        panic!("fresh");
    };
    let mut tx = database.begin().await.expect("begin");
    let response = StoredResponse {
        status: 200,
        body: b"{}".to_vec(),
    };
    idempotency::complete(&mut tx, &scope(), &key("old"), lease, &response, 1)
        .await
        .expect("complete");
    tx.commit().await.expect("commit");
    claim_committed(&database, &key("stuck"), &body, "r2", 0).await;

    let mut tx = database.begin().await.expect("begin");
    let purged = idempotency::purge_completed(&mut tx, 100)
        .await
        .expect("purge");
    tx.commit().await.expect("commit");
    assert_eq!(purged, 1);
    // The purged key is new again; the in-flight one still answers from its record.
    assert!(matches!(
        claim_committed(&database, &key("old"), &body, "r3", 200).await,
        Claim::Fresh { .. }
    ));
    assert!(matches!(
        claim_committed(&database, &key("stuck"), &body, "r4", 200).await,
        Claim::InProgress { .. }
    ));
}

/// A migrated database of the test's own on `backend`.
async fn open(backend: asiento_testkit::Backend) -> TestDatabase {
    TestDatabase::open(backend).await
}

asiento_testkit::both_backends!(
    fixture = open;
    lifecycle,
    takeover_after_lease_expiry,
    concurrent_claims_have_one_winner,
    purge_keeps_in_flight_records,
);
