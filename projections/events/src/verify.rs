//! The checker: the stored feed, and the streams' folds the next batch folds onto, compared with
//! the feed and the folds derived again from the log alone.
//!
//! A row that differs from the derivation at the same checkpoint (its number, id, type, tenant,
//! position or bytes), a missing row or an extra one is a bug or a hand edit; `asiento
//! projections rebuild merchant_events` replaces the feed with a fresh copy, numbered the same.

use asiento_domain::stream::{ENDPOINT_PREFIX, EXCEPTION_PREFIX, PAYMENT_PREFIX, TRANSFER_PREFIX};
use asiento_domain::{Event, Operation};
use asiento_eventstore::{Cursor, Database, EventStore, RecordedEvent, READ_BATCH_MAX};
use asiento_projector::history::each_event_of;
use asiento_projector::on_snapshot;
use asiento_projector::snapshot::{RowsOfStreams, Snapshot, CHECK_PAGE_EVENTS};

use std::collections::{BTreeMap, VecDeque};

use sqlx::types::Json;

use asiento_domain::payment::ArchivedOperation;
use serde_json::Value;

use crate::archive::{self, VIEW as ARCHIVE_VIEW};
use crate::derive::Folded;
use crate::projection::{Deriver, STREAMS_VIEW, VIEW};
use crate::{FeedError, NAME};

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
/// Streams whose folds the feed's check holds at most: a stream's events mostly come close
/// together in the log, and one that goes on after it was forgotten is folded again.
const VERIFY_STREAMS_HELD: usize = 2_048;

/// The events of `event`'s stream before it in the log's order.
async fn history_before(
    store: &dyn EventStore,
    event: &RecordedEvent,
) -> Result<Vec<RecordedEvent>, FeedError> {
    let mut history: Vec<RecordedEvent> = Vec::new();
    let mut from = 1;
    loop {
        let page = store
            .read_stream(&event.stream_id, from, READ_BATCH_MAX)
            .await?;
        let full = page.len() == READ_BATCH_MAX;
        from = page.last().map_or(from, |last| last.version + 1);
        history.extend(page.into_iter().filter(|e| e.cursor < event.cursor));
        if !full {
            break;
        }
    }
    history.sort_by_key(|e| e.cursor);
    Ok(history)
}

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

/// Compares the stored feed with the feed derived from the log up to its checkpoint. Empty: the
/// feed is right. The stored rows are read in pages from one [`Snapshot`] (with the checkpoint),
/// and each derived row is compared as the derivation gives it: the check holds a page of rows,
/// and the derivation's folds (one per stream).
pub async fn verify(db: &Database, store: &dyn EventStore) -> Result<Vec<Mismatch>, FeedError> {
    verify_in_pages(db, store, VERIFY_PAGE_ROWS, VERIFY_STREAMS_HELD).await
}

/// [`verify`], reading `page_rows` stored rows at a time and holding the folds of at most
/// `streams_held` streams (one forgotten is folded again from the log when it goes on).
pub async fn verify_in_pages(
    db: &Database,
    store: &dyn EventStore,
    page_rows: i64,
    streams_held: usize,
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
        let page = store.read_all(reached, CHECK_PAGE_EVENTS).await?;
        let mut ended = page.is_empty();
        for event in &page {
            if event.cursor > checkpoint {
                ended = true;
                break;
            }
            reached = event.cursor;
            if deriver.forgot(event) {
                deriver.restore(&history_before(store, event).await?)?;
            }
            deriver.push(event)?;
            deriver.forget_beyond(streams_held);
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

/// Streams whose stored folds are compared at a time.
const VERIFY_PAGE_STREAMS: usize = 500;

/// The streams the feed folds: a stored fold per stream, keyed by the whole stream id.
const FOLDED_PREFIXES: [&str; 4] = [
    PAYMENT_PREFIX,
    TRANSFER_PREFIX,
    EXCEPTION_PREFIX,
    ENDPOINT_PREFIX,
];

/// Compares every stored fold (a payment's with its archived operations) with its stream folded
/// again from the log up to the checkpoint. Empty: the folds are right. The checkpoint, the
/// folds a page of streams at a time and their archived operations are read in one [`Snapshot`];
/// then the streams with a fold in the log and none stored, and archived operations of streams
/// with no stored fold.
pub async fn verify_states(
    db: &Database,
    store: &dyn EventStore,
) -> Result<Vec<StateMismatch>, FeedError> {
    verify_states_in_pages(db, store, VERIFY_PAGE_STREAMS).await
}

/// [`verify_states`], `page_streams` streams at a time.
pub async fn verify_states_in_pages(
    db: &Database,
    store: &dyn EventStore,
    page_streams: usize,
) -> Result<Vec<StateMismatch>, FeedError> {
    let mut snapshot = Snapshot::begin(db).await?;
    let checkpoint = snapshot
        .checkpoint(NAME)
        .await?
        .ok_or(FeedError::NotInstalled)?;
    let limit = i64::try_from(page_streams.max(1)).unwrap_or(i64::MAX);
    let mut mismatches = Vec::new();
    let mut mismatch = |stream_id: String, detail: String| {
        mismatches.push(StateMismatch { stream_id, detail });
    };
    let folds_statement = format!(
        "SELECT stream_id, state FROM {STREAMS_VIEW} WHERE stream_id > $1 \
         ORDER BY stream_id LIMIT $2"
    );
    let mut after = String::new();
    loop {
        let page: Vec<(String, Json<Value>)> = on_snapshot!(&mut snapshot, conn => {
            sqlx::query_as(&folds_statement)
                .bind(&after)
                .bind(limit)
                .fetch_all(&mut *conn)
                .await?
        });
        let Some((last, _)) = page.last() else {
            break;
        };
        after = last.clone();
        let streams: Vec<String> = page.iter().map(|(id, _)| id.clone()).collect();
        let mut archive = archive::by_stream(archived_of(&mut snapshot, &streams).await?)?;
        let mut derived = fold_each(store, &streams, checkpoint).await?;
        for (id, Json(value)) in page {
            let ours: Folded = serde_json::from_value(value).map_err(unreadable)?;
            let detail = match derived.remove(&id) {
                Some(theirs) => differs(ours, archive.remove(&id).unwrap_or_default(), &theirs),
                None => Some("a stored fold of a stream the log does not have".to_owned()),
            };
            if let Some(detail) = detail {
                mismatch(id, detail);
            }
        }
    }
    let rows = RowsOfStreams {
        view: STREAMS_VIEW,
        key_column: "stream_id",
        prefix: "",
    };
    for prefix in FOLDED_PREFIXES {
        let mut after = String::new();
        loop {
            let streams = snapshot
                .streams(prefix, Some(&rows), &after, checkpoint, page_streams)
                .await?;
            let Some(last) = streams.last() else {
                break;
            };
            after = last.clone();
            for id in fold_each(store, &streams, checkpoint).await?.into_keys() {
                mismatch(id, "no stored fold".to_owned());
            }
        }
    }
    let orphans_statement = format!(
        "SELECT DISTINCT a.stream_id FROM {ARCHIVE_VIEW} a WHERE a.stream_id > $1 \
         AND NOT EXISTS (SELECT 1 FROM {STREAMS_VIEW} s WHERE s.stream_id = a.stream_id) \
         ORDER BY a.stream_id LIMIT $2"
    );
    let mut after = String::new();
    loop {
        let orphans: Vec<String> = on_snapshot!(&mut snapshot, conn => {
            sqlx::query_scalar(&orphans_statement)
                .bind(&after)
                .bind(limit)
                .fetch_all(&mut *conn)
                .await?
        });
        let Some(last) = orphans.last() else {
            break;
        };
        after = last.clone();
        for id in orphans {
            mismatch(
                id,
                "archived operations of a stream with no stored fold".to_owned(),
            );
        }
    }
    snapshot.end().await?;
    mismatches.sort_by(|a, b| a.stream_id.cmp(&b.stream_id));
    Ok(mismatches)
}

/// The archived operations of `streams`.
async fn archived_of(
    snapshot: &mut Snapshot,
    streams: &[String],
) -> Result<Vec<(String, i64, Json<Operation>)>, FeedError> {
    let select = |list: &str| {
        format!("SELECT stream_id, idx, operation FROM {ARCHIVE_VIEW} WHERE stream_id {list}")
    };
    Ok(match snapshot {
        Snapshot::Postgres(tx) => {
            sqlx::query_as(&select("= ANY($1)"))
                .bind(streams)
                .fetch_all(&mut **tx)
                .await?
        }
        Snapshot::Sqlite(tx) => {
            let list = serde_json::to_string(streams).expect("a list of strings always serialises");
            sqlx::query_as(&select("IN (SELECT value FROM json_each($1))"))
                .bind(list)
                .fetch_all(&mut **tx)
                .await?
        }
    })
}

/// Each of `streams` the feed folds, folded from the log alone up to `upto` over its contiguous
/// versions, as the derivation folds it; a stream with nothing folded is absent.
async fn fold_each(
    store: &dyn EventStore,
    streams: &[String],
    upto: Cursor,
) -> Result<BTreeMap<String, Folded>, FeedError> {
    let mut folds: BTreeMap<String, Folded> = BTreeMap::new();
    each_event_of(
        store,
        streams,
        upto,
        CHECK_PAGE_EVENTS,
        |event| -> Result<(), FeedError> {
            let Some(folded) = Folded::of_stream(&event.stream_id) else {
                return Ok(());
            };
            let fold = folds.entry(event.stream_id.clone()).or_insert(folded);
            if event.version != fold.version() + 1 {
                return Ok(());
            }
            let malformed = |reason: String| {
                FeedError::Projection(asiento_projector::ProjectionError::Malformed {
                    position: event.position,
                    reason,
                })
            };
            let decoded = Event::decode_raw(
                &event.stream_id,
                &event.event_type,
                event.schema,
                event.data.raw(),
            )
            .map_err(|e| malformed(e.to_string()))?;
            *fold = fold
                .clone()
                .evolve(&decoded)
                .map_err(|reason| malformed(reason.to_owned()))?;
            Ok(())
        },
    )
    .await?;
    folds.retain(|_, fold| fold.version() > 0);
    Ok(folds)
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

fn unreadable(e: serde_json::Error) -> FeedError {
    FeedError::Projection(asiento_projector::ProjectionError::Malformed {
        position: 0,
        reason: format!("a stored fold: {e}"),
    })
}
