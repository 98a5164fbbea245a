//! The checker: the stored index compared with the index derived again from the log alone.
//!
//! A row that differs from the derivation at the same checkpoint (its tenant or creation time),
//! a missing row or an extra one is a bug or a hand edit; `asiento projections rebuild
//! payment_search` replaces the index with a fresh copy.

use std::collections::BTreeMap;

use asiento_domain::stream::PAYMENT_PREFIX;
use asiento_eventstore::{Cursor, Database, EventStore};
use asiento_projector::history::each_event_of;
use asiento_projector::snapshot::{Snapshot, CHECK_PAGE_EVENTS};

use crate::projection::{VIEW, WAITING_VIEW};
use crate::terms::{Derived, Owner};
use crate::{SearchError, NAME};

/// A row's key: payment id, term, kind.
type Key = (String, String, String);

/// Where a row is: `Some(tenant, created_ms)` in the index, `None` waiting for its payment's
/// `PaymentIntended`.
type Place = Option<(String, i64)>;

/// A row of the index (or of the waiting terms) that the stored index and the derivation
/// disagree on. `stored` None: the row is missing; `derived` None: the log does not give it.
/// Inside each, `Some(None)` is a term waiting for its payment's `PaymentIntended`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub payment_id: String,
    pub term: String,
    pub kind: String,
    /// (tenant, created_ms) as stored.
    pub stored: Option<Place>,
    /// (tenant, created_ms) as derived.
    pub derived: Option<Place>,
}

/// Payments compared at a time: the rows the check holds.
const VERIFY_PAGE_PAYMENTS: usize = 500;

/// Compares every stored row with the rows derived from the log up to the index's checkpoint.
/// Empty: the index is right. Its memory is a page of payments, however many there are: in one
/// [`Snapshot`], the payment streams up to the checkpoint a page at a time (the stored rows of
/// their payments against the rows derived from their events), then the stored rows of payments
/// with no stream.
pub async fn verify(db: &Database, store: &dyn EventStore) -> Result<Vec<Mismatch>, SearchError> {
    verify_in_pages(db, store, VERIFY_PAGE_PAYMENTS).await
}

/// [`verify`], `page_payments` payments at a time.
pub async fn verify_in_pages(
    db: &Database,
    store: &dyn EventStore,
    page_payments: usize,
) -> Result<Vec<Mismatch>, SearchError> {
    let mut snapshot = Snapshot::begin(db).await?;
    let checkpoint = snapshot
        .checkpoint(NAME)
        .await?
        .ok_or(SearchError::NotInstalled)?;
    let mut mismatches = Vec::new();
    let mut after = String::new();
    loop {
        let streams = snapshot
            .streams(PAYMENT_PREFIX, None, &after, checkpoint, page_payments)
            .await?;
        let Some(last) = streams.last() else {
            break;
        };
        after = last.clone();
        let payments: Vec<String> = streams
            .iter()
            .filter_map(|stream| stream.strip_prefix(PAYMENT_PREFIX))
            .map(str::to_owned)
            .collect();
        let stored = stored_rows(&mut snapshot, &payments).await?;
        let mut derived = Derived::default();
        each_event_of(store, &streams, checkpoint, CHECK_PAGE_EVENTS, |event| {
            derived.push(event).map_err(SearchError::from)
        })
        .await?;
        compare(stored, rows_of(derived), &mut mismatches);
    }
    let mut after = String::new();
    loop {
        let orphans =
            payments_without_stream(&mut snapshot, &after, checkpoint, page_payments).await?;
        let Some(last) = orphans.last() else {
            break;
        };
        after = last.clone();
        let stored = stored_rows(&mut snapshot, &orphans).await?;
        compare(stored, BTreeMap::new(), &mut mismatches);
    }
    snapshot.end().await?;
    mismatches
        .sort_by(|a, b| (&a.payment_id, &a.term, &a.kind).cmp(&(&b.payment_id, &b.term, &b.kind)));
    Ok(mismatches)
}

/// The stored rows of `payments`, in the index and waiting.
async fn stored_rows(
    snapshot: &mut Snapshot,
    payments: &[String],
) -> Result<BTreeMap<Key, Place>, SearchError> {
    type Stored = (String, String, String, Option<String>, Option<i64>);
    let select = |list: &str| {
        format!(
            "SELECT payment_id, term, kind, tenant, created_ms FROM {VIEW} \
             WHERE payment_id {list} \
             UNION ALL \
             SELECT payment_id, term, kind, NULL, NULL FROM {WAITING_VIEW} \
             WHERE payment_id {list}"
        )
    };
    let rows: Vec<Stored> = match snapshot {
        Snapshot::Postgres(tx) => {
            sqlx::query_as(&select("= ANY($1)"))
                .bind(payments)
                .fetch_all(&mut **tx)
                .await?
        }
        Snapshot::Sqlite(tx) => {
            let list =
                serde_json::to_string(payments).expect("a list of strings always serialises");
            sqlx::query_as(&select("IN (SELECT value FROM json_each($1))"))
                .bind(list)
                .fetch_all(&mut **tx)
                .await?
        }
    };
    Ok(rows
        .into_iter()
        .map(|(payment_id, term, kind, tenant, created_ms)| {
            ((payment_id, term, kind), tenant.zip(created_ms))
        })
        .collect())
}

/// Up to `limit` payments after `after` that have stored rows (in the index or waiting) but no
/// stream up to `upto`.
async fn payments_without_stream(
    snapshot: &mut Snapshot,
    after: &str,
    upto: Cursor,
    limit: usize,
) -> Result<Vec<String>, SearchError> {
    let statement = |xact: &str| {
        format!(
            "SELECT DISTINCT v.payment_id FROM ( \
                 SELECT payment_id FROM {VIEW} UNION SELECT payment_id FROM {WAITING_VIEW} \
             ) v WHERE v.payment_id > $1 AND NOT EXISTS ( \
                 SELECT 1 FROM events e WHERE e.stream_id = '{PAYMENT_PREFIX}' || v.payment_id \
                 AND e.version = 1 AND ({xact}, e.position) <= ($2, $3)) \
             ORDER BY v.payment_id LIMIT $4"
        )
    };
    Ok(snapshot.ids_up_to(statement, after, upto, limit).await?)
}

/// The rows `derived` gives.
fn rows_of(derived: Derived) -> BTreeMap<Key, Place> {
    let mut rows = BTreeMap::new();
    for (payment_id, terms) in derived.terms {
        let place = derived
            .owners
            .get(&payment_id)
            .map(|Owner { tenant, created_ms }| (tenant.clone(), *created_ms));
        for term in terms {
            let key = (payment_id.clone(), term.term, term.kind.as_str().to_owned());
            rows.insert(key, place.clone());
        }
    }
    rows
}

/// Adds a mismatch for every row the two sides disagree on.
fn compare(
    mut stored: BTreeMap<Key, Place>,
    mut derived: BTreeMap<Key, Place>,
    mismatches: &mut Vec<Mismatch>,
) {
    let mut keys: Vec<Key> = stored.keys().chain(derived.keys()).cloned().collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let stored = stored.remove(&key);
        let derived = derived.remove(&key);
        let (payment_id, term, kind) = key;
        if stored != derived {
            mismatches.push(Mismatch {
                payment_id,
                term,
                kind,
                stored,
                derived,
            });
        }
    }
}
