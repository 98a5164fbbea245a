//! The projection: payment streams from the log into two tables per generation.
//!
//! - `payment_search_g{n}`: one row per (payment, term, kind), with the payment's tenant and
//!   creation time; the primary key makes a row written twice one row, and the lookup index
//!   (tenant, term, newest first) answers [`crate::find`] from its first entries;
//! - `payment_search_waiting_g{n}`: terms of a payment whose `PaymentIntended` (which names its
//!   tenant) has not been applied yet. Under the append invariant a stream's first event comes
//!   first in the log's order, so this table stays empty; it exists so that a stream whose
//!   versions arrive out of order still ends with every row, as the other projections tolerate.
//!
//! Readers use the views `payment_search` and `payment_search_waiting`.

use std::collections::{BTreeMap, BTreeSet};

use asiento_eventstore::{RecordedEvent, Tx};
use asiento_projector::{on_tx, Projection, ProjectionError};

use crate::terms::{Derived, Kind, Owner, Term};

/// The registry name, and the argument of `asiento projections rebuild payment_search`.
pub const NAME: &str = "payment_search";
/// Bump when the tables or the way they are filled change: runners then refuse the old data
/// until `asiento projections rebuild payment_search`.
pub const FINGERPRINT: &str = "payment-search-v1";

/// The payment search index. Stateless: everything lives in the database.
#[derive(Debug, Clone, Copy, Default)]
pub struct PaymentSearch;

pub(crate) const VIEW: &str = "payment_search";
pub(crate) const WAITING_VIEW: &str = "payment_search_waiting";
const TABLE: &str = "payment_search_g";
const WAITING_TABLE: &str = "payment_search_waiting_g";

fn ddl(g: i64, postgres: bool) -> Vec<String> {
    let (int, rowid) = if postgres {
        ("BIGINT", "")
    } else {
        ("INTEGER", " WITHOUT ROWID")
    };
    vec![
        format!(
            "CREATE TABLE {TABLE}{g} (
                payment_id TEXT  NOT NULL,
                term       TEXT  NOT NULL,
                kind       TEXT  NOT NULL,
                tenant     TEXT  NOT NULL,
                created_ms {int} NOT NULL,
                PRIMARY KEY (payment_id, term, kind)){rowid}"
        ),
        format!(
            "CREATE INDEX {TABLE}{g}_lookup ON {TABLE}{g} \
             (tenant, term, created_ms DESC, payment_id DESC)"
        ),
        format!(
            "CREATE TABLE {WAITING_TABLE}{g} (
                payment_id TEXT NOT NULL,
                term       TEXT NOT NULL,
                kind       TEXT NOT NULL,
                PRIMARY KEY (payment_id, term, kind)){rowid}"
        ),
    ]
}

#[async_trait::async_trait]
impl Projection for PaymentSearch {
    fn name(&self) -> &'static str {
        NAME
    }

    fn fingerprint(&self) -> &'static str {
        FINGERPRINT
    }

    async fn create_generation(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        let postgres = matches!(tx, Tx::Postgres(_));
        for statement in ddl(g, postgres) {
            on_tx!(tx, conn => sqlx::query(&statement).execute(conn).await?.rows_affected());
        }
        Ok(())
    }

    async fn point_views(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        asiento_projector::point_view(tx, VIEW, &format!("{TABLE}{g}")).await?;
        asiento_projector::point_view(tx, WAITING_VIEW, &format!("{WAITING_TABLE}{g}")).await
    }

    async fn drop_generation(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        for table in [TABLE, WAITING_TABLE] {
            let statement = format!("DROP TABLE IF EXISTS {table}{g}");
            on_tx!(tx, conn => sqlx::query(&statement).execute(conn).await?.rows_affected());
        }
        Ok(())
    }

    async fn apply(
        &self,
        tx: &mut Tx,
        g: i64,
        events: &[RecordedEvent],
    ) -> Result<(), ProjectionError> {
        let mut derived = Derived::default();
        for event in events {
            derived.push(event)?;
        }
        if derived.terms.is_empty() {
            return Ok(());
        }
        // Terms that waited for an intent this batch applies join it.
        let intended: Vec<String> = derived.owners.keys().cloned().collect();
        for (payment_id, term) in take_waiting(tx, g, &intended).await? {
            derived.terms.entry(payment_id).or_default().insert(term);
        }
        // The owners of payments intended in earlier batches are in the index already.
        let earlier: Vec<String> = derived
            .terms
            .keys()
            .filter(|id| !derived.owners.contains_key(*id))
            .cloned()
            .collect();
        let mut owners = derived.owners;
        owners.extend(load_owners(tx, g, &earlier).await?);
        let (mut rows, mut waiting) = (Vec::new(), Vec::new());
        for (payment_id, terms) in derived.terms {
            match owners.get(&payment_id) {
                Some(owner) => rows.extend(terms.into_iter().map(|term| Row {
                    payment_id: payment_id.clone(),
                    term,
                    owner: owner.clone(),
                })),
                None => waiting.extend(terms.into_iter().map(|term| (payment_id.clone(), term))),
            }
        }
        insert_rows(tx, g, &rows).await?;
        insert_waiting(tx, g, &waiting).await
    }
}

/// One row of the index as written.
struct Row {
    payment_id: String,
    term: Term,
    owner: Owner,
}

/// A stored kind back as a [`Kind`]; anything else is a row this code did not write.
fn kind_of(payment_id: &str, kind: &str) -> Result<Kind, ProjectionError> {
    Kind::parse(kind).ok_or_else(|| {
        ProjectionError::Database(sqlx::Error::Decode(
            format!("payment {payment_id} has a term of unknown kind {kind:?}").into(),
        ))
    })
}

/// The tenant and creation time of each payment already in the index (its `payment_id` row).
async fn load_owners(
    tx: &mut Tx,
    g: i64,
    ids: &[String],
) -> Result<BTreeMap<String, Owner>, ProjectionError> {
    if ids.is_empty() {
        return Ok(BTreeMap::new());
    }
    let kind = Kind::PaymentId.as_str();
    let rows: Vec<(String, String, i64)> = match tx {
        Tx::Postgres(t) => {
            // Each id bound as the term too: the whole key is looked up, not every term of the
            // payment (which grows with its refunds).
            sqlx::query_as(&format!(
                "SELECT s.payment_id, s.tenant, s.created_ms FROM {TABLE}{g} s \
                 JOIN UNNEST($1::text[]) AS i(id) \
                 ON s.payment_id = i.id AND s.term = i.id AND s.kind = $2"
            ))
            .bind(ids)
            .bind(kind)
            .fetch_all(&mut **t)
            .await?
        }
        // SQLite is in-process: a statement per payment costs no round trip.
        Tx::Sqlite(t) => {
            let select = format!(
                "SELECT payment_id, tenant, created_ms FROM {TABLE}{g} \
                 WHERE payment_id = $1 AND term = $1 AND kind = $2"
            );
            let mut rows = Vec::new();
            for id in ids {
                rows.extend(
                    sqlx::query_as(&select)
                        .bind(id)
                        .bind(kind)
                        .fetch_optional(&mut **t)
                        .await?,
                );
            }
            rows
        }
    };
    Ok(rows
        .into_iter()
        .map(|(id, tenant, created_ms)| (id, Owner { tenant, created_ms }))
        .collect())
}

/// Removes and returns the waiting terms of these payments.
async fn take_waiting(
    tx: &mut Tx,
    g: i64,
    ids: &[String],
) -> Result<Vec<(String, Term)>, ProjectionError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<(String, String, String)> = match tx {
        Tx::Postgres(t) => {
            sqlx::query_as(&format!(
                "DELETE FROM {WAITING_TABLE}{g} WHERE payment_id = ANY($1) \
                 RETURNING payment_id, term, kind"
            ))
            .bind(ids)
            .fetch_all(&mut **t)
            .await?
        }
        Tx::Sqlite(t) => {
            let delete = format!(
                "DELETE FROM {WAITING_TABLE}{g} WHERE payment_id = $1 \
                 RETURNING payment_id, term, kind"
            );
            let mut rows = Vec::new();
            for id in ids {
                rows.extend(
                    sqlx::query_as::<_, (String, String, String)>(&delete)
                        .bind(id)
                        .fetch_all(&mut **t)
                        .await?,
                );
            }
            rows
        }
    };
    if !rows.is_empty() {
        tracing::debug!(
            terms = rows.len(),
            "waiting payment terms joined their intent"
        );
    }
    rows.into_iter()
        .map(|(payment_id, term, kind)| {
            let kind = kind_of(&payment_id, &kind)?;
            Ok((payment_id, Term { term, kind }))
        })
        .collect()
}

/// Writes the batch's rows; a row already there is left as it is (an event applied twice adds
/// nothing). One UNNEST statement on PostgreSQL, a statement per row on SQLite (in process).
async fn insert_rows(tx: &mut Tx, g: i64, rows: &[Row]) -> Result<(), ProjectionError> {
    if rows.is_empty() {
        return Ok(());
    }
    match tx {
        Tx::Postgres(t) => {
            let text = |f: &dyn Fn(&Row) -> &str| rows.iter().map(f).collect::<Vec<&str>>();
            sqlx::query(&format!(
                "INSERT INTO {TABLE}{g} (payment_id, term, kind, tenant, created_ms)
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[])
                 ON CONFLICT DO NOTHING"
            ))
            .bind(text(&|r| &r.payment_id))
            .bind(text(&|r| &r.term.term))
            .bind(text(&|r| r.term.kind.as_str()))
            .bind(text(&|r| &r.owner.tenant))
            .bind(
                rows.iter()
                    .map(|r| r.owner.created_ms)
                    .collect::<Vec<i64>>(),
            )
            .execute(&mut **t)
            .await?;
        }
        Tx::Sqlite(t) => {
            let insert = format!(
                "INSERT INTO {TABLE}{g} (payment_id, term, kind, tenant, created_ms)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING"
            );
            for row in rows {
                sqlx::query(&insert)
                    .bind(&row.payment_id)
                    .bind(&row.term.term)
                    .bind(row.term.kind.as_str())
                    .bind(&row.owner.tenant)
                    .bind(row.owner.created_ms)
                    .execute(&mut **t)
                    .await?;
            }
        }
    }
    Ok(())
}

/// Keeps terms of payments whose intent is not applied yet. Rarely runs (see the module docs).
async fn insert_waiting(
    tx: &mut Tx,
    g: i64,
    waiting: &[(String, Term)],
) -> Result<(), ProjectionError> {
    let payments: BTreeSet<&str> = waiting.iter().map(|(id, _)| id.as_str()).collect();
    if !payments.is_empty() {
        tracing::debug!(
            payments = payments.len(),
            "payment terms wait for their PaymentIntended"
        );
    }
    let insert = format!(
        "INSERT INTO {WAITING_TABLE}{g} (payment_id, term, kind) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING"
    );
    for (payment_id, term) in waiting {
        on_tx!(tx, conn => {
            sqlx::query(&insert)
                .bind(payment_id)
                .bind(&term.term)
                .bind(term.kind.as_str())
                .execute(conn)
                .await?
                .rows_affected()
        });
    }
    Ok(())
}
