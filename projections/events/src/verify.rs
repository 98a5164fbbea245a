//! The checker: the stored feed, and the streams' folds the next batch folds onto, compared with
//! the feed and the folds derived again from the log alone.
//!
//! A row that differs from the derivation at the same checkpoint (its number, id, type, tenant,
//! position or bytes), a missing row or an extra one is a bug or a hand edit; `asiento
//! projections rebuild merchant_events` replaces the feed with a fresh copy, numbered the same.

use asiento_eventstore::{Cursor, Database, EventStore};
use asiento_projector::snapshot::Snapshot;
use asiento_projector::{on_db, on_snapshot};

use std::collections::{BTreeMap, VecDeque};

use sqlx::types::Json;

use asiento_domain::payment::ArchivedOperation;
use serde_json::Value;

use crate::archive::{self, VIEW as ARCHIVE_VIEW};
use crate::derive::Folded;
use crate::projection::{Deriver, STREAMS_VIEW, VIEW};
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

/// Stored feed rows read at a time.
const VERIFY_PAGE_ROWS: i64 = 1_000;

/// The stored feed in `seq` order, read a page at a time from one snapshot.
struct StoredFeed {
    page_rows: i64,
    page: VecDeque<Shown>,
    after: i64,
    ended: bool,
}

impl StoredFeed {
    fn new(page_rows: i64) -> StoredFeed {
        StoredFeed {
            page_rows: page_rows.max(1),
            page: VecDeque::new(),
            after: 0,
            ended: false,
        }
    }

    /// The next stored row, without taking it.
    async fn peek(&mut self, snapshot: &mut Snapshot) -> Result<Option<&Shown>, FeedError> {
        if self.page.is_empty() && !self.ended {
            let statement = format!(
                "SELECT seq, event_id, tenant, event_type, position, body FROM {VIEW} \
                 WHERE seq > $1 ORDER BY seq LIMIT $2"
            );
            let page: Vec<Shown> = on_snapshot!(&mut *snapshot, conn => {
                sqlx::query_as(&statement)
                    .bind(self.after)
                    .bind(self.page_rows)
                    .fetch_all(&mut *conn)
                    .await?
            });
            self.ended = page.len() < usize::try_from(self.page_rows).unwrap_or(usize::MAX);
            if let Some(last) = page.last() {
                self.after = last.0;
            }
            self.page = page.into();
        }
        Ok(self.page.front())
    }

    /// The stored row numbered `seq`, if there is one; the rows numbered before it, which the
    /// log does not give, each go to `extra`.
    async fn take(
        &mut self,
        snapshot: &mut Snapshot,
        seq: i64,
        mut extra: impl FnMut(Shown),
    ) -> Result<Option<Shown>, FeedError> {
        while let Some(next) = self.peek(snapshot).await? {
            if next.0 > seq {
                return Ok(None);
            }
            let Some(next) = self.page.pop_front() else {
                unreachable!("a row was just peeked");
            };
            if next.0 == seq {
                return Ok(Some(next));
            }
            extra(next);
        }
        Ok(None)
    }
}

/// The mismatch of a stored and a derived row that differ.
fn mismatch(stored: Option<Shown>, derived: Option<Shown>) -> Option<Mismatch> {
    (stored != derived).then(|| Mismatch {
        seq: stored.as_ref().or(derived.as_ref()).map_or(0, |row| row.0),
        stored: stored.as_ref().map(shown),
        derived: derived.as_ref().map(shown),
    })
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
/// feed is right. The stored rows are read in pages from one [`Snapshot`] (with the checkpoint),
/// and each derived row is compared as the derivation gives it: the check holds a page of rows,
/// and the derivation's folds (one per stream).
pub async fn verify(db: &Database, store: &dyn EventStore) -> Result<Vec<Mismatch>, FeedError> {
    verify_in_pages(db, store, VERIFY_PAGE_ROWS).await
}

/// [`verify`], reading `page_rows` stored rows at a time.
pub async fn verify_in_pages(
    db: &Database,
    store: &dyn EventStore,
    page_rows: i64,
) -> Result<Vec<Mismatch>, FeedError> {
    let mut snapshot = Snapshot::begin(db).await?;
    let checkpoint = snapshot
        .checkpoint(NAME)
        .await?
        .ok_or(FeedError::NotInstalled)?;
    let mut stored = StoredFeed::new(page_rows);
    let mut mismatches = Vec::new();
    let mut deriver = Deriver::empty();
    let mut reached = Cursor::START;
    loop {
        let page = store.read_all(reached, DERIVE_PAGE_EVENTS).await?;
        let mut ended = page.is_empty();
        for event in &page {
            if event.cursor > checkpoint {
                ended = true;
                break;
            }
            reached = event.cursor;
            deriver.push(event)?;
        }
        for row in std::mem::take(&mut deriver.rows) {
            let derived: Shown = (
                row.seq,
                row.event_id,
                row.tenant,
                row.event_type.to_owned(),
                row.position,
                row.body,
            );
            let found = stored
                .take(&mut snapshot, derived.0, |extra| {
                    mismatches.extend(mismatch(Some(extra), None));
                })
                .await?;
            mismatches.extend(mismatch(found, Some(derived)));
        }
        if ended {
            break;
        }
    }
    while stored.peek(&mut snapshot).await?.is_some() {
        mismatches.extend(mismatch(stored.page.pop_front(), None));
    }
    snapshot.end().await?;
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
