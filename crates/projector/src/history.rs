//! A stream as a read model keeps it, for projections that fold each touched stream through the
//! domain's `evolve`: its fold over the contiguous versions applied so far (`fold_batch`: a batch
//! pushes only its new events onto the stored fold, never the history before them), and the
//! events seen ahead of a gap (`take_contiguous`).
//!
//! On PostgreSQL the log's gap-free order is by writing transaction id, and a transaction that
//! took its id early can commit version n+1 of a stream after a younger one committed version n:
//! a projection may see n+1 first. Such an event waits until the gap fills.

use std::collections::{BTreeMap, HashMap};

use asiento_eventstore::{Cursor, EventStore, RecordedEvent, StoreError, Tx, READ_BATCH_MAX};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sqlx::types::Json;

use crate::ProjectionError;

fn malformed(position: i64, reason: impl Into<String>) -> ProjectionError {
    ProjectionError::Malformed {
        position,
        reason: reason.into(),
    }
}

/// One event of a stream as a read model keeps it: the stored form, so that replaying
/// it goes through the domain's decoder (and its upcaster) exactly as reading the log does.
/// The payload stays JSON text: a projection decodes it straight into the domain's event
/// (`decode_raw`), and stores it back as it read it, without a `serde_json::Value` tree.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Kept {
    pub version: u64,
    pub position: i64,
    pub event_type: String,
    pub schema: i32,
    pub data: Box<RawValue>,
}

impl Kept {
    #[must_use]
    pub fn from_recorded(event: &RecordedEvent) -> Kept {
        Kept {
            version: event.version,
            position: event.position,
            event_type: event.event_type.clone(),
            schema: event.schema,
            data: event.data.raw_value().to_owned(),
        }
    }
}

/// The events that continue a stream whose versions 1..=`applied` are applied, in order, taken
/// from `waiting` (events seen ahead of a gap) and `incoming`; `waiting` keeps the rest, sorted
/// by version. A version seen twice is a bug (the runtime applies each event once), and stops
/// the projection rather than guessing which copy is right.
pub fn take_contiguous(
    applied: u64,
    waiting: &mut Vec<Kept>,
    incoming: Vec<Kept>,
) -> Result<Vec<Kept>, ProjectionError> {
    waiting.extend(incoming);
    waiting.sort_by_key(|k| k.version);
    for (index, kept) in waiting.iter().enumerate() {
        let repeated = index > 0 && waiting[index - 1].version == kept.version;
        if kept.version <= applied || repeated || kept.version == 0 {
            return Err(malformed(
                kept.position,
                format!("stream version {} seen twice", kept.version),
            ));
        }
    }
    let mut next = applied + 1;
    let contiguous = waiting.iter().take_while(|k| {
        let fits = k.version == next;
        next += 1;
        fits
    });
    let count = contiguous.count();
    Ok(waiting.drain(..count).collect())
}

/// Where a projection keeps its streams' folds: a table with one row per stream (its id in
/// `id_column`, its fold as JSON in `state`), and a table of the events waiting behind a gap
/// (`id_column`, `version`, `event`), both of one generation.
#[derive(Debug, Clone, Copy)]
pub struct Tables<'a> {
    pub rows: &'a str,
    pub pending: &'a str,
    pub id_column: &'a str,
}

/// The storage option of a PostgreSQL table of stored folds. A fold row is rewritten at every
/// batch that touches its stream: half of each page left free lets PostgreSQL keep the new
/// version on the same page without a new index entry (a HOT update), so a long stream's row
/// leaves no trail of index entries to read past.
pub const FOLD_TABLE_POSTGRES: &str = "WITH (fillfactor = 50)";

/// What a batch found stored for the streams it touches: each one's fold and waiting events.
#[derive(Debug)]
struct Stored<F> {
    folds: HashMap<String, F>,
    pending: HashMap<String, Vec<Kept>>,
}

type PendingRow = (String, Json<Kept>);

/// Reads the folds and waiting events of the streams `ids`.
async fn load<F: DeserializeOwned + Send + Unpin + 'static>(
    tx: &mut Tx,
    tables: Tables<'_>,
    ids: &[String],
) -> Result<Stored<F>, ProjectionError> {
    let Tables {
        rows: table,
        pending: pending_table,
        id_column: id,
    } = tables;
    let (rows, pending): (Vec<(String, Json<F>)>, Vec<PendingRow>) = match tx {
        // One round trip per table for the whole batch.
        Tx::Postgres(t) => {
            let rows = sqlx::query_as(&format!(
                "SELECT {id}, state FROM {table} WHERE {id} = ANY($1)"
            ))
            .bind(ids)
            .fetch_all(&mut **t)
            .await?;
            let pending = sqlx::query_as(&format!(
                "SELECT {id}, event FROM {pending_table} WHERE {id} = ANY($1)"
            ))
            .bind(ids)
            .fetch_all(&mut **t)
            .await?;
            (rows, pending)
        }
        // SQLite is in-process: a statement per stream costs no round trip.
        Tx::Sqlite(t) => {
            let (mut rows, mut pending) = (Vec::new(), Vec::new());
            let select_row = format!("SELECT {id}, state FROM {table} WHERE {id} = $1");
            let select_pending = format!("SELECT {id}, event FROM {pending_table} WHERE {id} = $1");
            for stream in ids {
                rows.extend(
                    sqlx::query_as(&select_row)
                        .bind(stream)
                        .fetch_optional(&mut **t)
                        .await?,
                );
                pending.extend(
                    sqlx::query_as(&select_pending)
                        .bind(stream)
                        .fetch_all(&mut **t)
                        .await?,
                );
            }
            (rows, pending)
        }
    };
    let mut stored = Stored {
        folds: HashMap::with_capacity(rows.len()),
        pending: HashMap::new(),
    };
    for (stream, Json(fold)) in rows {
        stored.folds.insert(stream, fold);
    }
    for (stream, Json(kept)) in pending {
        stored.pending.entry(stream).or_default().push(kept);
    }
    Ok(stored)
}

/// Pushes a batch's events onto the stored folds of the streams `stream_of` names (events of
/// other streams are skipped): each stream's fold is read once, only the events that continue
/// its versions are folded in (its history before them is never read again), and events seen
/// ahead of a gap wait. The streams whose fold moved come back, for the caller to store.
pub async fn fold_batch<F>(
    tx: &mut Tx,
    tables: Tables<'_>,
    events: &[RecordedEvent],
    stream_of: impl Fn(&RecordedEvent) -> Option<String>,
) -> Result<Vec<(String, F)>, ProjectionError>
where
    F: StreamFold + DeserializeOwned + Send + Unpin + 'static,
{
    // Grouped per stream so that each touched row is read, folded and written once.
    let mut incoming: BTreeMap<String, Vec<Kept>> = BTreeMap::new();
    for event in events {
        if let Some(id) = stream_of(event) {
            incoming
                .entry(id)
                .or_default()
                .push(Kept::from_recorded(event));
        }
    }
    if incoming.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<String> = incoming.keys().cloned().collect();
    let mut stored: Stored<F> = load(tx, tables, &ids).await?;
    let mut moved = Vec::with_capacity(ids.len());
    for (id, events) in incoming {
        let mut fold = stored.folds.remove(&id).unwrap_or_default();
        let had_pending = stored.pending.get(&id).is_some_and(|p| !p.is_empty());
        let mut waiting = stored.pending.remove(&id).unwrap_or_default();
        let next = take_contiguous(fold.version(), &mut waiting, events)?;
        if had_pending || !waiting.is_empty() {
            replace_pending(tx, tables, &id, &waiting).await?;
        }
        if !next.is_empty() {
            for kept in &next {
                fold.push(kept)?;
            }
            moved.push((id, fold));
        }
    }
    Ok(moved)
}

/// A stream folded event by event, as a projection's checker folds it again from the log.
pub trait StreamFold: Default {
    /// The stream version folded so far.
    fn version(&self) -> u64;
    /// Folds the next event of the stream (its version must be the next one).
    fn push(&mut self, kept: &Kept) -> Result<(), ProjectionError>;
}

/// Every stream `stream_of` names, folded from the log alone up to and including `upto`, read
/// `page_events` at a time; events seen ahead of a gap in their stream's versions wait for it.
/// Memory grows with the number of streams (one fold each), not with the log.
pub async fn fold_log<F: StreamFold, E: From<StoreError> + From<ProjectionError>>(
    store: &dyn EventStore,
    upto: Cursor,
    page_events: usize,
    stream_of: impl Fn(&RecordedEvent) -> Option<String>,
) -> Result<BTreeMap<String, F>, E> {
    let mut streams: BTreeMap<String, (F, Vec<Kept>)> = BTreeMap::new();
    let mut reached = Cursor::START;
    'pages: loop {
        let page = store.read_all(reached, page_events).await?;
        for event in &page {
            if event.cursor > upto {
                break 'pages;
            }
            reached = event.cursor;
            let Some(id) = stream_of(event) else {
                continue;
            };
            let (fold, waiting) = streams.entry(id).or_default();
            waiting.push(Kept::from_recorded(event));
            waiting.sort_by_key(|k| k.version);
            while waiting
                .first()
                .is_some_and(|k| k.version == fold.version() + 1)
            {
                let next = waiting.remove(0);
                fold.push(&next)?;
            }
        }
        // Only an empty page is the end: a page may be short while more follows.
        if page.is_empty() {
            break;
        }
    }
    Ok(streams
        .into_iter()
        .map(|(id, (fold, _))| (id, fold))
        .collect())
}

/// Every event of the streams `stream_ids` at or before `upto`, given to `each` in (stream id,
/// version) order, read `page_events` at a time (at most `READ_BATCH_MAX`): a checker's read of
/// a page of streams.
pub async fn each_event_of<E: From<StoreError>>(
    store: &dyn EventStore,
    stream_ids: &[String],
    upto: Cursor,
    page_events: usize,
    mut each: impl FnMut(&RecordedEvent) -> Result<(), E>,
) -> Result<(), E> {
    assert!(
        (1..=READ_BATCH_MAX).contains(&page_events),
        "a page of {page_events} events is more than one read returns"
    );
    let mut after: Option<(String, u64)> = None;
    loop {
        let at = after
            .as_ref()
            .map(|(stream, version)| (stream.as_str(), *version));
        let page = store.read_streams_page(stream_ids, at, page_events).await?;
        let Some(last) = page.last() else {
            return Ok(());
        };
        after = Some((last.stream_id.clone(), last.version));
        for event in page.iter().filter(|event| event.cursor <= upto) {
            each(event)?;
        }
        if page.len() < page_events {
            return Ok(());
        }
    }
}

/// The streams `stream_ids`, each folded from the log alone up to and including `upto` and keyed
/// by its stream id ([`each_event_of`]): what [`fold_log`] gives for these streams, holding only
/// their folds, for a checker that pages through a read model. A stream is folded up to a gap in
/// its versions; one with no event up to `upto` is absent.
pub async fn fold_streams<F: StreamFold, E: From<StoreError> + From<ProjectionError>>(
    store: &dyn EventStore,
    stream_ids: &[String],
    upto: Cursor,
    page_events: usize,
) -> Result<BTreeMap<String, F>, E> {
    let mut folds: BTreeMap<String, F> = BTreeMap::new();
    each_event_of(store, stream_ids, upto, page_events, |event| {
        let fold = folds.entry(event.stream_id.clone()).or_default();
        // Past a gap, `fold_log` keeps the event waiting for it, for ever in a log that ends at
        // `upto`.
        if event.version == fold.version() + 1 {
            fold.push(&Kept::from_recorded(event))?;
        }
        Ok::<_, E>(())
    })
    .await?;
    Ok(folds)
}

/// Makes the stored waiting events of stream `id` exactly `waiting`. Rarely runs: only when a
/// stream's versions arrived out of order.
pub async fn replace_pending(
    tx: &mut Tx,
    tables: Tables<'_>,
    id: &str,
    waiting: &[Kept],
) -> Result<(), ProjectionError> {
    let Tables {
        pending: table,
        id_column: column,
        ..
    } = tables;
    let delete = format!("DELETE FROM {table} WHERE {column} = $1");
    crate::on_tx!(tx, conn => sqlx::query(&delete).bind(id).execute(conn).await?.rows_affected());
    let insert = format!("INSERT INTO {table} ({column}, version, event) VALUES ($1, $2, $3)");
    for kept in waiting {
        let version = i64::try_from(kept.version)
            .map_err(|_| malformed(kept.position, "stream version overflows i64"))?;
        crate::on_tx!(tx, conn => {
            sqlx::query(&insert)
                .bind(id)
                .bind(version)
                .bind(Json(kept))
                .execute(conn)
                .await?
                .rows_affected()
        });
    }
    tracing::debug!(
        stream = id,
        waiting = waiting.len(),
        "events wait for an earlier version of their stream"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(version: u64) -> Kept {
        Kept {
            version,
            position: i64::try_from(version).unwrap_or(0) * 10,
            event_type: "ChargeRequested".into(),
            schema: 1,
            data: serde_json::value::to_raw_value(&serde_json::Value::Null)
                .unwrap_or_else(|e| panic!("null is JSON: {e}")),
        }
    }

    fn versions(events: &[Kept]) -> Vec<u64> {
        events.iter().map(|k| k.version).collect()
    }

    /// (already applied, waiting before, incoming) -> (history after, waiting after).
    #[test]
    fn the_contiguous_events_are_taken_and_the_rest_kept_waiting() {
        type Case = (u64, &'static [u64], &'static [u64], u64, &'static [u64]);
        let cases: &[Case] = &[
            (0, &[], &[1, 2, 3], 3, &[]),
            (0, &[], &[2, 3], 0, &[2, 3]),
            (0, &[2, 3], &[1], 3, &[]),
            (2, &[], &[4, 3, 6], 4, &[6]),
            (2, &[6], &[5], 2, &[5, 6]),
            (2, &[5, 6], &[3, 4], 6, &[]),
            (1, &[], &[], 1, &[]),
        ];
        for &(applied, before, incoming, after, left) in cases {
            let mut waiting: Vec<Kept> = before.iter().copied().map(kept).collect();
            let taken = take_contiguous(
                applied,
                &mut waiting,
                incoming.iter().copied().map(kept).collect(),
            )
            .unwrap_or_else(|e| panic!("{applied} {before:?} {incoming:?}: {e}"));
            assert_eq!(
                versions(&taken),
                (applied + 1..=after).collect::<Vec<_>>(),
                "{applied} {before:?} {incoming:?}"
            );
            assert_eq!(
                versions(&waiting),
                left,
                "{applied} {before:?} {incoming:?}"
            );
        }
    }

    #[test]
    fn a_version_seen_twice_is_refused() {
        let cases: &[(u64, &[u64], &[u64])] = &[
            (2, &[], &[2]),
            (0, &[3], &[3]),
            (0, &[], &[1, 1]),
            (0, &[], &[0]),
        ];
        for &(applied, before, incoming) in cases {
            let mut waiting: Vec<Kept> = before.iter().copied().map(kept).collect();
            let result = take_contiguous(
                applied,
                &mut waiting,
                incoming.iter().copied().map(kept).collect(),
            );
            assert!(
                matches!(result, Err(ProjectionError::Malformed { .. })),
                "{applied} {before:?} {incoming:?}"
            );
        }
    }

    /// The stored form is the one read models already hold: the payload a JSON value inside the
    /// kept event (not a string of it), read back and written out again unchanged.
    #[test]
    fn a_kept_payload_is_stored_as_the_json_value_it_is() {
        let stored = r#"{"version":3,"position":30,"event_type":"ChargeCaptured","schema":1,"data":{"amount":{"minor":2500,"currency":"USD"},"note":"caf\u00e9"}}"#;
        let kept: Kept = serde_json::from_str(stored).unwrap();
        assert_eq!(
            kept.data.get(),
            r#"{"amount":{"minor":2500,"currency":"USD"},"note":"caf\u00e9"}"#
        );
        assert_eq!(serde_json::to_string(&kept).unwrap(), stored);
        let tree = serde_json::to_value(&kept).unwrap();
        assert_eq!(tree["data"]["amount"]["minor"], 2500, "{tree}");
    }
}
