//! The checker: the stored index compared with the index derived again from the log alone.
//!
//! A row that differs from the derivation at the same checkpoint (its tenant or creation time),
//! a missing row or an extra one is a bug or a hand edit; `asiento projections rebuild
//! payment_search` replaces the index with a fresh copy.

use std::collections::BTreeMap;

use asiento_eventstore::{Cursor, Database, EventStore};
use asiento_projector::on_db;
use sqlx::Row as _;

use crate::projection::{VIEW, WAITING_VIEW};
use crate::terms::{Derived, Owner};
use crate::{SearchError, NAME};

/// Events per log read while deriving again.
const DERIVE_PAGE_EVENTS: usize = 5_000;

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

/// Every stored row, with the checkpoint they are exact at, read in ONE statement so that they
/// agree even while a batch or a rebuild swap commits.
async fn snapshot_all(db: &Database) -> Result<(Cursor, BTreeMap<Key, Place>), SearchError> {
    let statement = format!(
        "SELECT p.checkpoint_xact, p.checkpoint_position, v.payment_id, v.term, v.kind, \
         v.tenant, v.created_ms \
         FROM projections p LEFT JOIN ( \
             SELECT payment_id, term, kind, tenant, created_ms FROM {VIEW} \
             UNION ALL \
             SELECT payment_id, term, kind, NULL, NULL FROM {WAITING_VIEW} \
         ) v ON 1 = 1 WHERE p.name = $1"
    );
    on_db!(db, pool => {
        let raw = sqlx::query(&statement).bind(NAME).fetch_all(pool).await?;
        let mut cursor = None;
        let mut rows = BTreeMap::new();
        for r in &raw {
            cursor = Some(Cursor::new(
                r.try_get("checkpoint_xact")?,
                r.try_get("checkpoint_position")?,
            ));
            // NULL: the LEFT JOIN found no rows at all.
            let Some(payment_id) = r.try_get::<Option<String>, _>("payment_id")? else {
                continue;
            };
            let tenant: Option<String> = r.try_get("tenant")?;
            let created_ms: Option<i64> = r.try_get("created_ms")?;
            rows.insert(
                (payment_id, r.try_get("term")?, r.try_get("kind")?),
                tenant.zip(created_ms),
            );
        }
        Ok((cursor.ok_or(SearchError::NotInstalled)?, rows))
    })
}

/// The rows the log alone gives, up to and including `upto`. Memory grows with the number of
/// terms, as the index does.
async fn derive_all(
    store: &dyn EventStore,
    upto: Cursor,
) -> Result<BTreeMap<Key, Place>, SearchError> {
    let mut derived = Derived::default();
    let mut reached = Cursor::START;
    'pages: loop {
        let page = store.read_all(reached, DERIVE_PAGE_EVENTS).await?;
        for event in &page {
            if event.cursor > upto {
                break 'pages;
            }
            reached = event.cursor;
            derived.push(event)?;
        }
        if page.is_empty() {
            break;
        }
    }
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
    Ok(rows)
}

/// Compares every stored row with the rows derived from the log up to the index's checkpoint.
/// Empty: the index is right.
pub async fn verify(db: &Database, store: &dyn EventStore) -> Result<Vec<Mismatch>, SearchError> {
    let (checkpoint, mut stored) = snapshot_all(db).await?;
    let mut derived = derive_all(store, checkpoint).await?;
    let mut keys: Vec<Key> = stored.keys().chain(derived.keys()).cloned().collect();
    keys.sort();
    keys.dedup();
    Ok(keys
        .into_iter()
        .filter_map(|key| {
            let stored = stored.remove(&key);
            let derived = derived.remove(&key);
            let (payment_id, term, kind) = key;
            (stored != derived).then_some(Mismatch {
                payment_id,
                term,
                kind,
                stored,
                derived,
            })
        })
        .collect())
}
