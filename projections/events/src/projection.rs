//! The projection: merchant events from the log into three tables per generation.
//!
//! - `merchant_events_g{n}`: the feed, one row per merchant event, numbered by `seq` in the
//!   order this projection derives them (which is the log's gap-free order);
//! - `merchant_event_streams_g{n}`: per payment, transfer, exception and endpoint stream, its
//!   fold over its events 1..=version (`state`): the object before the next batch's events,
//!   onto which that batch folds only them;
//! - `merchant_event_pending_g{n}`: events seen ahead of a gap in their stream's versions
//!   (`asiento_projector::history`), with the time the log recorded them;
//! - `merchant_event_operations_g{n}`: the operations a payment's fold no longer holds
//!   (`crate::archive`);
//! - the balance monitors' tables (`crate::monitors`): client accounts' running balances and
//!   the monitors with whether each matches.
//!
//! Readers use the views `merchant_events` and `balance_monitors`; the checker also reads
//! `merchant_event_streams` and `merchant_event_operations`.

use std::collections::HashMap;

use asiento_domain::payment::RECENT_OPERATIONS;
use asiento_domain::{Event, PaymentEvent};
use asiento_eventstore::{RecordedEvent, Tx};
use asiento_projector::history::{take_contiguous, Kept, FOLD_TABLE_POSTGRES};
use asiento_projector::{on_tx, Projection, ProjectionError};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::types::Json;

use crate::archive;
use crate::derive::{derive, Derived, Folded};
use crate::event_id;
use crate::monitors::{self, Watch};

/// The registry name, and the argument of `asiento projections rebuild merchant_events`.
pub const NAME: &str = "merchant_events";
/// Bump when the tables or the way they are filled change.
pub const FINGERPRINT: &str = "merchant-events-v4";

/// The merchant events read model. Stateless: everything lives in the database.
#[derive(Debug, Clone, Copy, Default)]
pub struct MerchantEvents;

pub(crate) const VIEW: &str = "merchant_events";
/// The view of the streams' folds, which `verify_states` reads.
pub(crate) const STREAMS_VIEW: &str = "merchant_event_streams";
const TABLE: &str = "merchant_events_g";
const STREAMS_TABLE: &str = "merchant_event_streams_g";
const PENDING_TABLE: &str = "merchant_event_pending_g";

fn ddl(g: i64, postgres: bool) -> Vec<String> {
    let (int, json, rowid) = if postgres {
        ("BIGINT", "JSONB", "")
    } else {
        ("INTEGER", "TEXT", " WITHOUT ROWID")
    };
    let fold_table = if postgres { FOLD_TABLE_POSTGRES } else { "" };
    vec![
        format!(
            "CREATE TABLE {TABLE}{g} (
                seq        {int} PRIMARY KEY CHECK (seq >= 1),
                event_id   TEXT  NOT NULL UNIQUE,
                tenant     TEXT  NOT NULL,
                event_type TEXT  NOT NULL,
                position   {int} NOT NULL,
                body       TEXT  NOT NULL){rowid}"
        ),
        format!("CREATE INDEX {TABLE}{g}_by_tenant ON {TABLE}{g} (tenant, seq)"),
        format!("CREATE INDEX {TABLE}{g}_by_type ON {TABLE}{g} (tenant, event_type, seq)"),
        format!(
            "CREATE TABLE {STREAMS_TABLE}{g} (
                stream_id TEXT PRIMARY KEY,
                state     {json} NOT NULL){rowid} {fold_table}"
        ),
        format!(
            "CREATE TABLE {PENDING_TABLE}{g} (
                stream_id TEXT  NOT NULL,
                version   {int} NOT NULL,
                event     {json} NOT NULL,
                PRIMARY KEY (stream_id, version)){rowid}"
        ),
    ]
}

/// An event waiting for an earlier version of its stream, with the log's time of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Waiting {
    kept: Kept,
    recorded_at: DateTime<Utc>,
}

/// One touched stream during a batch.
struct Stream {
    folded: Folded,
    waiting: Vec<Kept>,
    /// When each waiting or incoming event was recorded, by version.
    recorded_at: HashMap<u64, DateTime<Utc>>,
    /// Whether the batch folded events onto it (its state is stored again).
    moved: bool,
    had_pending: bool,
    /// The deriver's count of pushes when an event of the stream was last pushed.
    last_push: u64,
}

/// A feed row as it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub seq: i64,
    pub event_id: String,
    pub tenant: String,
    pub event_type: &'static str,
    pub position: i64,
    pub body: String,
}

/// The feed's rows as the log's events derive them, one event at a time in the log's order: the
/// one derivation, which `apply` runs per batch on the stored streams and `verify` over the
/// whole log from nothing.
pub(crate) struct Deriver {
    /// Each stream in a box of its own, so that the table's slots, empty ones included, are a few
    /// words rather than a payment's fold each.
    streams: HashMap<String, Box<Stream>>,
    /// Balances and monitors, for `balance.threshold_crossed`.
    watch: Watch,
    /// The last number given out.
    seq: i64,
    pub rows: Vec<Row>,
    /// Events pushed so far.
    pushes: u64,
}

impl Deriver {
    /// Before every event: no stream folded, no row.
    pub fn empty() -> Deriver {
        Deriver {
            streams: HashMap::new(),
            watch: Watch::default(),
            seq: 0,
            rows: Vec::new(),
            pushes: 0,
        }
    }

    /// Whether `event` continues a stream whose fold this deriver forgot
    /// ([`Deriver::forget_beyond`]): a stream it folds, not held, and the event not its first
    /// version (a forgotten stream had folded its first). The caller gives the stream's events
    /// before it to [`Deriver::restore`] first (there are none when the event is simply the
    /// first of its stream to arrive, ahead of a gap).
    pub fn forgot(&self, event: &RecordedEvent) -> bool {
        event.version > 1
            && !self.streams.contains_key(&event.stream_id)
            && Folded::of_stream(&event.stream_id).is_some()
    }

    /// Folds a forgotten stream again from `history`, its events pushed before, in the log's
    /// order: the stream as it was, without deriving their rows again.
    pub fn restore(&mut self, history: &[RecordedEvent]) -> Result<(), ProjectionError> {
        for event in history {
            self.push_to_stream(event, false)?;
        }
        Ok(())
    }

    /// Forgets the folds of the streams pushed to longest ago, down to half of `max`, once more
    /// than `max` are held; a stream with events waiting for a gap is kept. `verify` derives the
    /// whole log so, in bounded memory.
    pub fn forget_beyond(&mut self, max: usize) {
        if self.streams.len() <= max {
            return;
        }
        let mut idle: Vec<(u64, String)> = self
            .streams
            .iter()
            .filter(|(_, stream)| stream.waiting.is_empty())
            .map(|(id, stream)| (stream.last_push, id.clone()))
            .collect();
        idle.sort_unstable();
        let excess = self.streams.len() - max / 2;
        for (_, id) in idle.into_iter().take(excess) {
            self.streams.remove(&id);
        }
    }

    /// Takes the next event of the log; the rows it derives (one per event that joined its
    /// stream's contiguous history and tells a merchant something, then one per monitor an entry
    /// made cross) go to `rows`.
    pub fn push(&mut self, event: &RecordedEvent) -> Result<(), ProjectionError> {
        self.push_to_stream(event, true)?;
        self.watch.push(event, &mut self.seq, &mut self.rows)
    }

    /// Folds `event` onto its stream, deriving its rows when `derive_rows`.
    fn push_to_stream(
        &mut self,
        event: &RecordedEvent,
        derive_rows: bool,
    ) -> Result<(), ProjectionError> {
        self.pushes += 1;
        if !self.streams.contains_key(&event.stream_id) {
            let Some(folded) = Folded::of_stream(&event.stream_id) else {
                return Ok(());
            };
            self.streams
                .insert(event.stream_id.clone(), Box::new(Stream::new(folded)));
        }
        let Some(stream) = self.streams.get_mut(&event.stream_id) else {
            unreachable!("the stream was inserted above");
        };
        stream.last_push = self.pushes;
        stream.recorded_at.insert(event.version, event.recorded_at);
        let next = take_contiguous(
            stream.folded.version(),
            &mut stream.waiting,
            vec![Kept::from_recorded(event)],
        )?;
        for kept in &next {
            let decoded = Event::decode_raw(
                &event.stream_id,
                &kept.event_type,
                kept.schema,
                kept.data.get(),
            )
            .map_err(|e| malformed(kept.position, e.to_string()))?;
            let after = stream
                .folded
                .clone()
                .evolve(&decoded)
                .map_err(|reason| malformed(kept.position, reason))?;
            let derived = derive_rows
                .then(|| derive(&stream.folded, &after, &decoded, kept.position))
                .flatten();
            if let Some(derived) = derived {
                let recorded_at = stream
                    .recorded_at
                    .get(&kept.version)
                    .copied()
                    .ok_or_else(|| malformed(kept.position, "no record time for an event"))?;
                self.seq += 1;
                self.rows
                    .push(row(self.seq, &event.stream_id, kept, recorded_at, derived)?);
            }
            stream.folded = after;
        }
        stream.moved |= !next.is_empty();
        Ok(())
    }
}

impl Stream {
    fn new(folded: Folded) -> Stream {
        Stream {
            folded,
            waiting: Vec::new(),
            recorded_at: HashMap::new(),
            moved: false,
            had_pending: false,
            last_push: 0,
        }
    }
}

fn malformed(position: i64, reason: impl Into<String>) -> ProjectionError {
    ProjectionError::Malformed {
        position,
        reason: reason.into(),
    }
}

#[async_trait::async_trait]
impl Projection for MerchantEvents {
    fn name(&self) -> &'static str {
        NAME
    }

    fn fingerprint(&self) -> &'static str {
        FINGERPRINT
    }

    async fn create_generation(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        let postgres = matches!(tx, Tx::Postgres(_));
        for statement in ddl(g, postgres)
            .into_iter()
            .chain(archive::ddl(g, postgres))
            .chain(monitors::ddl(g, postgres))
        {
            on_tx!(tx, conn => sqlx::query(&statement).execute(conn).await?.rows_affected());
        }
        Ok(())
    }

    async fn point_views(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        asiento_projector::point_view(tx, VIEW, &format!("{TABLE}{g}")).await?;
        asiento_projector::point_view(tx, STREAMS_VIEW, &format!("{STREAMS_TABLE}{g}")).await?;
        asiento_projector::point_view(tx, archive::VIEW, &format!("{}{g}", archive::TABLE)).await?;
        asiento_projector::point_view(
            tx,
            monitors::MONITORS_VIEW,
            &format!("{}{g}", monitors::MONITORS_TABLE),
        )
        .await
    }

    async fn drop_generation(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        for table in [TABLE, STREAMS_TABLE, PENDING_TABLE, archive::TABLE]
            .into_iter()
            .chain(monitors::TABLES)
        {
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
        let mut ids: Vec<String> = events
            .iter()
            .filter(|event| Folded::of_stream(&event.stream_id).is_some())
            .map(|event| event.stream_id.clone())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let needed = monitors::needed(events)?;
        if ids.is_empty() && needed.keys.is_empty() && needed.monitors.is_empty() {
            return Ok(());
        }
        let mut streams = load(tx, g, &ids).await?;
        load_archived(tx, g, &mut streams, events).await?;
        let watch = monitors::load(tx, g, needed).await?;
        let seq: i64 = {
            let statement = format!("SELECT COALESCE(MAX(seq), 0) FROM {TABLE}{g}");
            on_tx!(tx, conn => sqlx::query_scalar(&statement).fetch_one(conn).await?)
        };
        let mut deriver = Deriver {
            streams,
            watch,
            seq,
            rows: Vec::new(),
            pushes: 0,
        };
        for event in events {
            deriver.push(event)?;
        }
        let Deriver {
            mut streams,
            watch,
            rows,
            ..
        } = deriver;
        insert_rows(tx, g, &rows).await?;
        archive::store(tx, g, &archive_windows(&mut streams)).await?;
        store_streams(tx, g, &streams).await?;
        monitors::store(tx, g, &watch).await
    }
}

fn row(
    seq: i64,
    stream_id: &str,
    kept: &Kept,
    recorded_at: DateTime<Utc>,
    derived: Derived,
) -> Result<Row, ProjectionError> {
    let id = event_id(stream_id, kept.version);
    let mut data = serde_json::Map::new();
    data.insert("object".to_owned(), derived.object);
    if let Some(operation) = derived.operation {
        data.insert("operation".to_owned(), operation);
    }
    let body = serde_json::json!({
        "id": id,
        "object": "event",
        "type": derived.kind.as_str(),
        "created": asiento_objects::time(&recorded_at),
        "position": kept.position,
        "data": data,
    });
    Ok(Row {
        seq,
        event_id: id,
        tenant: derived.tenant,
        event_type: derived.kind.as_str(),
        position: kept.position,
        body: serde_json::to_string(&body).map_err(|e| malformed(kept.position, e.to_string()))?,
    })
}

type StateRow = (String, Json<Folded>);
type PendingRow = (String, Json<Waiting>);

/// The touched streams as stored: each one's fold, and its events waiting behind a gap.
async fn load(
    tx: &mut Tx,
    g: i64,
    ids: &[String],
) -> Result<HashMap<String, Box<Stream>>, ProjectionError> {
    let select_state =
        format!("SELECT stream_id, state FROM {STREAMS_TABLE}{g} WHERE stream_id = $1");
    let select_pending =
        format!("SELECT stream_id, event FROM {PENDING_TABLE}{g} WHERE stream_id = $1");
    let (states, pending): (Vec<StateRow>, Vec<PendingRow>) = match tx {
        Tx::Postgres(t) => {
            let any = |s: &str| s.replace("= $1", "= ANY($1)");
            let states = sqlx::query_as(&any(&select_state))
                .bind(ids)
                .fetch_all(&mut **t)
                .await?;
            let pending = sqlx::query_as(&any(&select_pending))
                .bind(ids)
                .fetch_all(&mut **t)
                .await?;
            (states, pending)
        }
        Tx::Sqlite(t) => {
            let (mut states, mut pending) = (Vec::new(), Vec::new());
            for id in ids {
                states.extend(
                    sqlx::query_as(&select_state)
                        .bind(id)
                        .fetch_optional(&mut **t)
                        .await?,
                );
                pending.extend(
                    sqlx::query_as(&select_pending)
                        .bind(id)
                        .fetch_all(&mut **t)
                        .await?,
                );
            }
            (states, pending)
        }
    };
    let mut stored: HashMap<String, Folded> = states
        .into_iter()
        .map(|(id, Json(folded))| (id, folded))
        .collect();
    let mut waiting: HashMap<String, Vec<Waiting>> = HashMap::new();
    for (id, Json(w)) in pending {
        waiting.entry(id).or_default().push(w);
    }
    let mut streams = HashMap::with_capacity(ids.len());
    for id in ids {
        let folded = match stored.remove(id) {
            Some(folded) => folded,
            None => Folded::of_stream(id)
                .unwrap_or_else(|| unreachable!("only streams with merchant events are loaded")),
        };
        let waits = waiting.remove(id).unwrap_or_default();
        streams.insert(
            id.clone(),
            Box::new(Stream {
                folded,
                had_pending: !waits.is_empty(),
                recorded_at: waits
                    .iter()
                    .map(|w| (w.kept.version, w.recorded_at))
                    .collect(),
                waiting: waits.into_iter().map(|w| w.kept).collect(),
                moved: false,
                last_push: 0,
            }),
        );
    }
    Ok(streams)
}

/// Loads back, into each touched payment's window, the archived operations that the batch's
/// events of it (and those waiting behind a gap, which the batch may release) read.
async fn load_archived(
    tx: &mut Tx,
    g: i64,
    streams: &mut HashMap<String, Box<Stream>>,
    events: &[RecordedEvent],
) -> Result<(), ProjectionError> {
    for (id, stream) in streams.iter_mut() {
        let Folded::Payment(window) = &mut stream.folded else {
            continue;
        };
        if window.archived == 0 {
            continue;
        }
        let incoming = events
            .iter()
            .filter(|event| event.stream_id == *id)
            .map(Kept::from_recorded);
        let mut decoded = Vec::new();
        for kept in stream.waiting.iter().cloned().chain(incoming) {
            decoded.push(
                PaymentEvent::decode_raw(&kept.event_type, kept.schema, kept.data.get())
                    .map_err(|e| malformed(kept.position, e.to_string()))?,
            );
        }
        let need = window.needs(&decoded);
        window.load(archive::load(tx, g, id, &need).await?);
    }
    Ok(())
}

/// Ends the batch's payment windows: the rows to archive (operations loaded back, and those
/// leaving a window for its latest [`RECENT_OPERATIONS`]). Only moved streams are stored, so
/// only theirs are archived.
fn archive_windows(
    streams: &mut HashMap<String, Box<Stream>>,
) -> Vec<(String, asiento_domain::payment::ArchivedOperation)> {
    let mut rows = Vec::new();
    for (id, stream) in streams.iter_mut().filter(|(_, s)| s.moved) {
        if let Folded::Payment(window) = &mut stream.folded {
            rows.extend(
                window
                    .archive(RECENT_OPERATIONS)
                    .into_iter()
                    .map(|row| (id.clone(), row)),
            );
        }
    }
    rows
}

async fn insert_rows(tx: &mut Tx, g: i64, rows: &[Row]) -> Result<(), ProjectionError> {
    if rows.is_empty() {
        return Ok(());
    }
    let columns = "(seq, event_id, tenant, event_type, position, body)";
    match tx {
        Tx::Postgres(t) => {
            let statement = format!(
                "INSERT INTO {TABLE}{g} {columns} SELECT * FROM UNNEST($1::int8[], $2::text[], \
                 $3::text[], $4::text[], $5::int8[], $6::text[])"
            );
            sqlx::query(&statement)
                .bind(rows.iter().map(|r| r.seq).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| r.event_id.as_str()).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| r.tenant.as_str()).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| r.event_type).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| r.position).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| r.body.as_str()).collect::<Vec<_>>())
                .execute(&mut **t)
                .await?;
        }
        Tx::Sqlite(t) => {
            let statement =
                format!("INSERT INTO {TABLE}{g} {columns} VALUES ($1, $2, $3, $4, $5, $6)");
            for r in rows {
                sqlx::query(&statement)
                    .bind(r.seq)
                    .bind(&r.event_id)
                    .bind(&r.tenant)
                    .bind(r.event_type)
                    .bind(r.position)
                    .bind(&r.body)
                    .execute(&mut **t)
                    .await?;
            }
        }
    }
    Ok(())
}

/// Writes the fold of each stream the batch moved, and its waiting events where they changed.
async fn store_streams(
    tx: &mut Tx,
    g: i64,
    streams: &HashMap<String, Box<Stream>>,
) -> Result<(), ProjectionError> {
    let upsert = format!(
        "INSERT INTO {STREAMS_TABLE}{g} (stream_id, state) VALUES ($1, $2) \
         ON CONFLICT (stream_id) DO UPDATE SET state = excluded.state"
    );
    let delete = format!("DELETE FROM {PENDING_TABLE}{g} WHERE stream_id = $1");
    let insert =
        format!("INSERT INTO {PENDING_TABLE}{g} (stream_id, version, event) VALUES ($1, $2, $3)");
    let moved: Vec<(&String, &Stream)> = streams
        .iter()
        .filter(|(_, s)| s.moved)
        .map(|(id, s)| (id, &**s))
        .collect();
    match tx {
        // One round trip for the batch's streams.
        Tx::Postgres(t) if !moved.is_empty() => {
            let statement = format!(
                "INSERT INTO {STREAMS_TABLE}{g} (stream_id, state) \
                 SELECT * FROM UNNEST($1::text[], $2::jsonb[]) \
                 ON CONFLICT (stream_id) DO UPDATE SET state = excluded.state"
            );
            sqlx::query(&statement)
                .bind(moved.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>())
                .bind(
                    moved
                        .iter()
                        .map(|(_, s)| Json(&s.folded))
                        .collect::<Vec<_>>(),
                )
                .execute(&mut **t)
                .await?;
        }
        Tx::Postgres(_) => {}
        Tx::Sqlite(t) => {
            for (id, stream) in &moved {
                sqlx::query(&upsert)
                    .bind(id.as_str())
                    .bind(Json(&stream.folded))
                    .execute(&mut **t)
                    .await?;
            }
        }
    }
    for (id, stream) in streams {
        if !stream.had_pending && stream.waiting.is_empty() {
            continue;
        }
        on_tx!(tx, conn => sqlx::query(&delete).bind(id).execute(conn).await?.rows_affected());
        for kept in &stream.waiting {
            let version = i64::try_from(kept.version)
                .map_err(|_| malformed(kept.position, "stream version overflows i64"))?;
            let recorded_at = stream
                .recorded_at
                .get(&kept.version)
                .copied()
                .ok_or_else(|| malformed(kept.position, "no record time for an event"))?;
            let waiting = Waiting {
                kept: kept.clone(),
                recorded_at,
            };
            on_tx!(tx, conn => sqlx::query(&insert)
                .bind(id)
                .bind(version)
                .bind(Json(&waiting))
                .execute(conn)
                .await?
                .rows_affected());
        }
    }
    Ok(())
}
