//! Many independent appends in one PostgreSQL statement, for group commit.
//!
//! [`EachAppend`] turns a batch of requests (each a decision: its own stream and its guards'
//! streams) into ten column arrays and five CTEs: `each_input` (one row per event, with `req`,
//! its request's index in the batch), `each_cur` (each stream's current version; the planner
//! inlines it, so the look-up runs once per row of the stream),
//! `each_stale` (the requests one of whose streams is not at the version they expect),
//! `each_chained` (whether the row and every earlier row of its stream in the batch pass the
//! gate) and `each_written` (the INSERT, `RETURNING event_id, position, version, xact`). A stale
//! request gets no rows at all, on any of its streams. A row some other writer got to first is
//! skipped ([`Taken::Skip`], ON CONFLICT DO NOTHING) or fails the statement ([`Taken::Fail`]): a
//! request is written when all its events came back, which [`each_results`] tells from the
//! returned rows.
//!
//! **Order.** Every request's first stream (a decision's own) goes in before any request's later
//! streams (its guards), each part in request order. A transaction that appends a decision and
//! then its guards (`append_in`, one stream after the other) and races the statement for the
//! same rows then cannot deadlock with it: while the statement waits for a decision's row, it
//! holds no guard row that transaction could be waiting for. (In request order, the statement
//! could hold a hot guard's next version, taken by an earlier request of the batch, and wait
//! for a payment's row the transaction holds while the transaction waits for that guard row;
//! PostgreSQL breaks such a cycle only after `deadlock_timeout`.)
//!
//! **Chains.** Several requests of one batch may append to one stream (a hot account's guard),
//! each expecting the version the previous one leaves. Each row carries `chain`: the version the
//! stream must be at before the batch for the row to go in, which is the expectation of the
//! stream's first append in the batch when every later append continues exactly where the one
//! before it ends, and the row's own expectation otherwise (so a request that does not continue
//! the chain conflicts as it would alone). A row of a chain goes in only if every earlier row of
//! its stream passes the gate, so a chain never leaves a gap in the stream's versions.
//!
//! The store's own `append_each_in` wraps the CTEs in a statement of their own. The group commit
//! of the `app` crate puts them into one statement with its other rows (keys claimed, inbox rows,
//! keys completed), gated on its own conditions, so that a whole batch is one round trip and one
//! autocommit transaction ([`PgConn`] lends it a connection for that).

use sqlx::error::BoxDynError;
use sqlx::postgres::PgArguments;
use sqlx::types::Json;
use sqlx::Arguments;
use uuid::Uuid;

use crate::{AppendError, Appended, ExpectedVersion, Metadata, StreamAppend};

/// What the INSERT does with a row whose event id or stream version another writer took first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// Skips it (ON CONFLICT DO NOTHING): its request is not written, the others are.
    Skip,
    /// Fails the statement with a unique violation. For a statement that would refuse itself
    /// anyway when a row is missing: a plain INSERT checks each unique index once, as it inserts
    /// into it, where ON CONFLICT first probes every one of them and then inserts.
    Fail,
}

/// The columns of a batch of appends, bound as arrays.
pub struct EachAppend<'a> {
    stream_ids: Vec<&'a str>,
    expected: Vec<i64>,
    /// The version the stream must be at before the batch (see the module's Chains).
    chains: Vec<i64>,
    ords: Vec<i64>,
    event_ids: Vec<Uuid>,
    event_types: Vec<&'a str>,
    schemas: Vec<i32>,
    data: Vec<Json<&'a serde_json::Value>>,
    metadata: Vec<Json<&'a Metadata>>,
    requests: Vec<i64>,
}

impl<'a> EachAppend<'a> {
    /// The columns of `requests`, each given with its index (`req` in the statement); `None` when
    /// one of them expects `Any` or `StreamExists`, which need a look at the stream per request
    /// (`append_in` one by one).
    pub fn of(
        requests: impl IntoIterator<Item = (i64, &'a [StreamAppend])>,
    ) -> Result<Option<EachAppend<'a>>, AppendError> {
        let mut each = EachAppend {
            stream_ids: Vec::new(),
            expected: Vec::new(),
            chains: Vec::new(),
            ords: Vec::new(),
            event_ids: Vec::new(),
            event_types: Vec::new(),
            schemas: Vec::new(),
            data: Vec::new(),
            metadata: Vec::new(),
            requests: Vec::new(),
        };
        // Per stream: the chain's base and the version its last append leaves.
        let mut chained: std::collections::HashMap<&str, (i64, i64)> =
            std::collections::HashMap::new();
        for (request, streams) in requests {
            crate::validate(streams)?;
            for append in streams.iter() {
                let base = match append.expected {
                    ExpectedVersion::NoStream => 0,
                    // A version beyond i64 can never be current: -1 never matches.
                    ExpectedVersion::Exact(n) => i64::try_from(n).unwrap_or(-1),
                    ExpectedVersion::Any | ExpectedVersion::StreamExists => return Ok(None),
                };
                let count = i64::try_from(append.events.len()).unwrap_or(i64::MAX);
                let leaves = base.saturating_add(count);
                let chain = match chained.get(append.stream_id.as_str()) {
                    Some(&(chain, left)) if left == base && base >= 0 => chain,
                    _ => base,
                };
                chained.insert(append.stream_id.as_str(), (chain, leaves));
                for (ord, event) in (1_i64..).zip(&append.events) {
                    each.stream_ids.push(append.stream_id.as_str());
                    each.expected.push(base);
                    each.chains.push(chain);
                    each.ords.push(ord);
                    each.event_ids.push(event.event_id);
                    each.event_types.push(event.event_type.as_str());
                    each.schemas.push(event.schema);
                    each.data.push(Json(&event.data));
                    each.metadata.push(Json(&event.metadata));
                    each.requests.push(request);
                }
            }
        }
        Ok(Some(each))
    }

    /// The CTEs `each_input`, `each_cur`, `each_stale`, `each_chained` and `each_written`
    /// (without `WITH`): [`EachAppend::input_ctes`], then [`EachAppend::write_ctes`], skipping a
    /// row another writer got to first ([`Taken::Skip`]).
    pub fn ctes(first: usize, gate: &str) -> String {
        format!(
            "{}, {}",
            Self::input_ctes(first),
            Self::write_ctes(gate, Taken::Skip)
        )
    }

    /// The CTEs `each_input`, `each_cur` and `each_stale` (`req`: the requests one of whose
    /// streams is not at the version its chain expects), reading the ten arrays from parameters
    /// `$first` to `$first + 9`: what the rest of a statement may gate its own rows on (a key
    /// claimed only for a request that is not stale).
    pub fn input_ctes(first: usize) -> String {
        let p = |k: usize| first + k;
        format!(
            "each_input AS (SELECT * FROM unnest(${}::text[], ${}::int8[], ${}::int8[], \
             ${}::int8[], ${}::uuid[], ${}::text[], ${}::int4[], ${}::jsonb[], ${}::jsonb[], \
             ${}::int8[]) WITH ORDINALITY AS i(stream_id, expected, chain, ord, event_id, \
             event_type, schema, data, metadata, req, n)), \
             each_cur AS (SELECT s.stream_id, (SELECT coalesce(max(e.version), 0) FROM events e \
             WHERE e.stream_id = s.stream_id) AS v FROM (SELECT DISTINCT stream_id FROM \
             each_input) s), \
             each_stale AS (SELECT DISTINCT i.req FROM each_input i JOIN each_cur cur \
             ON cur.stream_id = i.stream_id WHERE cur.v <> i.chain)",
            p(0),
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            p(6),
            p(7),
            p(8),
            p(9),
        )
    }

    /// The CTEs `each_chained` and `each_written`, after [`EachAppend::input_ctes`]. `gate` is a
    /// condition on `i`, an `each_input` row (`i.req` is its request's index): rows for which it
    /// is false are not written, nor are the later rows of their streams; nor are a stale
    /// request's. `taken` says what becomes of a row another writer got to first.
    pub fn write_ctes(gate: &str, taken: Taken) -> String {
        let on_conflict = match taken {
            Taken::Skip => " ON CONFLICT DO NOTHING",
            Taken::Fail => "",
        };
        format!(
            "each_chained AS (SELECT g.*, bool_and(g.ok) OVER (PARTITION BY g.stream_id \
             ORDER BY g.n ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS chain_ok, \
             g.stream_id <> first_value(g.stream_id) OVER (PARTITION BY g.req ORDER BY g.n) \
             AS later_stream \
             FROM (SELECT i.*, ({gate}) AND i.req NOT IN (SELECT req FROM each_stale) AS ok \
             FROM each_input i) g), \
             each_written AS (INSERT INTO events (stream_id, version, event_id, event_type, \
             schema, data, metadata) \
             SELECT i.stream_id, i.expected + i.ord, i.event_id, i.event_type, i.schema, i.data, \
             i.metadata FROM each_chained i WHERE i.chain_ok \
             ORDER BY i.later_stream, i.n\
             {on_conflict} RETURNING event_id, position, version, xact)"
        )
    }

    /// Adds the ten arrays, in the order [`EachAppend::ctes`] reads them, as the next
    /// parameters of `arguments`.
    pub fn add_to(self, arguments: &mut PgArguments) -> Result<(), BoxDynError> {
        arguments.add(self.stream_ids)?;
        arguments.add(self.expected)?;
        arguments.add(self.chains)?;
        arguments.add(self.ords)?;
        arguments.add(self.event_ids)?;
        arguments.add(self.event_types)?;
        arguments.add(self.schemas)?;
        arguments.add(self.data)?;
        arguments.add(self.metadata)?;
        arguments.add(self.requests)
    }
}

/// Each request's result from the rows `each_written` returned, given as (event id, position,
/// version, xact): `Some` when every event of the request came back, `None` when one did not (its
/// expectation did not hold, its gate was false, or another writer got there first).
pub fn each_results(
    requests: &[&[StreamAppend]],
    rows: impl IntoIterator<Item = (Uuid, i64, i64, i64)>,
) -> Result<Vec<Option<Appended>>, AppendError> {
    // By event id: two requests naming one stream may expect the same versions.
    let written: std::collections::HashMap<Uuid, (i64, i64, i64)> = rows
        .into_iter()
        .map(|(event_id, position, version, xact)| (event_id, (position, version, xact)))
        .collect();
    let mut results = Vec::with_capacity(requests.len());
    for streams in requests {
        let mut parts = Vec::with_capacity(streams.len());
        for append in streams.iter() {
            let rows: Option<Vec<(i64, i64, i64)>> = append
                .events
                .iter()
                .map(|event| written.get(&event.event_id).copied())
                .collect();
            match rows {
                Some(rows) => parts.push(crate::classify::result_of(&append.stream_id, &rows)?),
                None => break,
            }
        }
        results.push((parts.len() == streams.len()).then(|| crate::merge(parts)));
    }
    Ok(results)
}
