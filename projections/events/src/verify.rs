//! The checker: the stored feed, and the streams' folds the next batch folds onto, compared with
//! the feed and the folds derived again from the log alone.
//!
//! A row that differs from the derivation at the same checkpoint (its number, id, type, tenant,
//! position or bytes), a missing row or an extra one is a bug or a hand edit; `asiento
//! projections rebuild merchant_events` replaces the feed with a fresh copy, numbered the same.

use asiento_eventstore::{Cursor, Database, EventStore};
use asiento_projector::on_db;
use sqlx::Row as _;

use std::collections::BTreeMap;

use sqlx::types::Json;

use asiento_domain::payment::ArchivedOperation;
use serde_json::Value;

use crate::archive::{self, VIEW as ARCHIVE_VIEW};
use crate::derive::Folded;
use crate::projection::{Deriver, Row, STREAMS_VIEW, VIEW};
use crate::{FeedError, NAME};

/// Events per log read while deriving again.
const DERIVE_PAGE_EVENTS: usize = 5_000;

/// Where the stored feed and the derivation differ, by `seq`: `stored` None is a row missing,
/// `derived` None a row the log does not give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub seq: i64,
    /// The row as stored (`event_id type position`), or None.
    pub stored: Option<String>,
    /// The row as derived, or None.
    pub derived: Option<String>,
}

/// A row's identity and bytes, as the mismatch shows them.
type Shown = (i64, String, String, String, i64, String);

fn shown(row: &Shown) -> String {
    format!(
        "{} {} {} position {}, {} bytes",
        row.1,
        row.2,
        row.3,
        row.4,
        row.5.len()
    )
}

/// Every stored row with the checkpoint they are exact at, in ONE statement so that they agree
/// even while a batch or a rebuild swap commits.
async fn snapshot_all(db: &Database) -> Result<(Cursor, Vec<Shown>), FeedError> {
    let statement = format!(
        "SELECT p.checkpoint_xact, p.checkpoint_position, v.seq, v.event_id, v.tenant, \
         v.event_type, v.position, v.body \
         FROM projections p LEFT JOIN {VIEW} v ON 1 = 1 WHERE p.name = $1 ORDER BY v.seq"
    );
    on_db!(db, pool => {
        let raw = sqlx::query(&statement).bind(NAME).fetch_all(pool).await?;
        let mut cursor = None;
        let mut rows = Vec::with_capacity(raw.len());
        for r in &raw {
            cursor = Some(Cursor::new(
                r.try_get("checkpoint_xact")?,
                r.try_get("checkpoint_position")?,
            ));
            // NULL: the LEFT JOIN found no rows at all.
            if let Some(seq) = r.try_get::<Option<i64>, _>("seq")? {
                rows.push((
                    seq,
                    r.try_get("event_id")?,
                    r.try_get("tenant")?,
                    r.try_get("event_type")?,
                    r.try_get("position")?,
                    r.try_get("body")?,
                ));
            }
        }
        Ok((cursor.ok_or(FeedError::NotInstalled)?, rows))
    })
}

/// The feed derived from the log alone, up to and including `upto`.
async fn derive_all(store: &dyn EventStore, upto: Cursor) -> Result<Vec<Row>, FeedError> {
    Ok(derive_log(store, upto).await?.rows)
}

/// The derivation of the log alone, up to and including `upto`.
async fn derive_log(store: &dyn EventStore, upto: Cursor) -> Result<Deriver, FeedError> {
    let mut deriver = Deriver::empty();
    let mut reached = Cursor::START;
    'pages: loop {
        let page = store.read_all(reached, DERIVE_PAGE_EVENTS).await?;
        for event in &page {
            if event.cursor > upto {
                break 'pages;
            }
            reached = event.cursor;
            deriver.push(event)?;
        }
        if page.is_empty() {
            break;
        }
    }
    Ok(deriver)
}

/// Compares the stored feed with the feed derived from the log up to its checkpoint. Empty: the
/// feed is right.
pub async fn verify(db: &Database, store: &dyn EventStore) -> Result<Vec<Mismatch>, FeedError> {
    let (checkpoint, stored) = snapshot_all(db).await?;
    let derived: Vec<Shown> = derive_all(store, checkpoint)
        .await?
        .into_iter()
        .map(|r| {
            (
                r.seq,
                r.event_id,
                r.tenant,
                r.event_type.to_owned(),
                r.position,
                r.body,
            )
        })
        .collect();
    let mut mismatches = Vec::new();
    let mut stored = stored.into_iter().peekable();
    let mut derived = derived.into_iter().peekable();
    loop {
        let (s, d) = match (stored.peek(), derived.peek()) {
            (None, None) => break,
            (Some(s), Some(d)) if s.0 == d.0 => (stored.next(), derived.next()),
            (Some(s), Some(d)) if s.0 < d.0 => (stored.next(), None),
            (Some(_), None) => (stored.next(), None),
            _ => (None, derived.next()),
        };
        if s != d {
            let seq = s.as_ref().or(d.as_ref()).map_or(0, |row| row.0);
            mismatches.push(Mismatch {
                seq,
                stored: s.as_ref().map(shown),
                derived: d.as_ref().map(shown),
            });
        }
    }
    Ok(mismatches)
}

/// A stream whose stored fold differs from its fold derived from the log (or is missing, or has
/// no stream in the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateMismatch {
    pub stream_id: String,
    pub detail: String,
}

/// Compares every stored fold (a payment's with its archived operations) with its stream folded
/// again from the log up to the checkpoint they were read at (in one statement with them).
/// Empty: the folds are right.
pub async fn verify_states(
    db: &Database,
    store: &dyn EventStore,
) -> Result<Vec<StateMismatch>, FeedError> {
    // One statement, so that folds, archive and checkpoint are one snapshot: the folds' rows
    // carry the checkpoint, the archive's an index.
    let statement = format!(
        "SELECT p.checkpoint_xact, p.checkpoint_position, s.stream_id, s.state, \
                CAST(NULL AS BIGINT) AS idx \
         FROM projections p LEFT JOIN {STREAMS_VIEW} s ON 1 = 1 WHERE p.name = $1 \
         UNION ALL \
         SELECT CAST(NULL AS BIGINT), CAST(NULL AS BIGINT), a.stream_id, a.operation, a.idx \
         FROM {ARCHIVE_VIEW} a"
    );
    type StateRow = (
        Option<i64>,
        Option<i64>,
        Option<String>,
        Option<Json<Value>>,
        Option<i64>,
    );
    let rows: Vec<StateRow> = on_db!(db, pool => {
        sqlx::query_as(&statement).bind(NAME).fetch_all(pool).await?
    });
    let Some((x, p)) = rows.iter().find_map(|row| Some((row.0?, row.1?))) else {
        return Err(FeedError::NotInstalled);
    };
    let mut stored: BTreeMap<String, Folded> = BTreeMap::new();
    let mut archived = Vec::new();
    for (_, _, id, value, index) in rows {
        let (Some(id), Some(Json(value))) = (id, value) else {
            continue;
        };
        let unreadable = |e: serde_json::Error| FeedError::Projection(malformed(e));
        match index {
            None => {
                stored.insert(id, serde_json::from_value(value).map_err(unreadable)?);
            }
            Some(index) => archived.push((
                id,
                index,
                Json(serde_json::from_value(value).map_err(unreadable)?),
            )),
        }
    }
    let mut archive = archive::by_stream(archived)?;
    let deriver = derive_log(store, Cursor::new(x, p)).await?;
    let mut mismatches = Vec::new();
    for (id, derived) in deriver.folds() {
        let detail = match stored.remove(id) {
            Some(ours) => differs(ours, archive.remove(id).unwrap_or_default(), derived),
            None => Some("no stored fold".to_owned()),
        };
        mismatches.extend(detail.map(|detail| StateMismatch {
            stream_id: id.clone(),
            detail,
        }));
    }
    mismatches.extend(stored.into_keys().map(|id| StateMismatch {
        stream_id: id,
        detail: "a stored fold of a stream the log does not have".to_owned(),
    }));
    mismatches.extend(archive.into_keys().map(|id| StateMismatch {
        stream_id: id,
        detail: "archived operations of a stream with no stored fold".to_owned(),
    }));
    mismatches.sort_by(|a, b| a.stream_id.cmp(&b.stream_id));
    Ok(mismatches)
}

/// How a stored fold (with its archived operations) differs from the log's, if it does.
fn differs(ours: Folded, archived: Vec<ArchivedOperation>, derived: &Folded) -> Option<String> {
    let (version, theirs) = (ours.version(), derived.version());
    let same = match (&ours, derived) {
        (Folded::Payment(window), Folded::Payment(whole)) => {
            match (window.assemble(archived), whole.assemble(Vec::new())) {
                (Ok(ours), Ok(whole)) => ours == whole,
                (Err(reason), _) | (_, Err(reason)) => return Some(reason),
            }
        }
        _ if !archived.is_empty() => return Some("archived operations of no payment".to_owned()),
        _ => ours == *derived,
    };
    (!same).then(|| {
        format!(
            "stored fold at version {version}, the log's at version {theirs}{}",
            if version == theirs {
                " (their contents differ)"
            } else {
                ""
            }
        )
    })
}

fn malformed(e: serde_json::Error) -> asiento_projector::ProjectionError {
    asiento_projector::ProjectionError::Malformed {
        position: 0,
        reason: format!("a stored fold or archived operation: {e}"),
    }
}
