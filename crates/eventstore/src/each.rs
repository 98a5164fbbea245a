//! Many independent appends in one PostgreSQL statement, for group commit.
//!
//! [`EachAppend`] turns a batch of requests (each a decision: its own stream and its guards'
//! streams) into eleven column arrays, one element per event, and CTEs over them: `each_input`
//! (one row per event, with `req`, its request's index in the batch), `each_stale` (the requests
//! one of whose streams is not at the version they expect: one probe of the stream's current
//! version per append, but for the appends expecting no stream when a taken row fails the
//! statement) and `each_written` (the INSERT, `RETURNING event_id, position, version,
//! xact`). A stale request gets no rows at all, on any of its streams. A row some other writer got
//! to first is skipped (`Taken::Skip`, ON CONFLICT DO NOTHING) or fails the statement
//! (`Taken::Fail`): a request is written when all its events came back, which [`each_results`]
//! tells from the returned rows.
//!
//! **Order.** The rows are in the order they go in (`n`): every request's first stream (a
//! decision's own) before any request's later streams (its guards), each part in request order. A
//! transaction that appends a decision and then its guards (`append_in`, one stream after the
//! other) and races the statement for the same rows then cannot deadlock with it: while the
//! statement waits for a decision's row, it holds no guard row that transaction could be waiting
//! for. (In request order, the statement could hold a hot guard's next version, taken by an
//! earlier request of the batch, and wait for a payment's row the transaction holds while the
//! transaction waits for that guard row; PostgreSQL breaks such a cycle only after
//! `deadlock_timeout`.)
//!
//! **Chains.** Several requests of one batch may append to one stream (a hot account's guard),
//! each expecting the version the previous one leaves. Each row carries `chain`: the version the
//! stream must be at before the batch for the row to go in, which is the expectation of the
//! stream's first append in the batch when every later append continues exactly where the one
//! before it ends, and the row's own expectation otherwise (so a request that does not continue
//! the chain conflicts as it would alone); and `prev`, the request whose append it continues (-1
//! for none). A chain must never leave a gap in its stream's versions: with `Taken::Skip` a row
//! goes in only if every earlier row of its stream passes the gate; with `Taken::Fail` the
//! statement refuses itself instead when a request that is written continues one that is not
//! ([`EachAppend::broken_chain`]), so the caller writes each request alone.
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
enum Taken {
    /// Skips it (ON CONFLICT DO NOTHING): its request is not written, the others are.
    Skip,
    /// Fails the statement with a unique violation. For a statement that would refuse itself
    /// anyway when a row is missing: a plain INSERT checks each unique index once, as it inserts
    /// into it, where ON CONFLICT first probes every one of them and then inserts.
    Fail,
}

/// The columns of a batch of appends, bound as arrays, one element per event in the order the
/// events go in.
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
    /// The request whose append on the same stream this row's append continues, -1 for none.
    prevs: Vec<i64>,
}

/// Where a stream's chain stands while [`EachAppend::of`] lays out a batch.
struct ChainEnd {
    /// The version the stream must be at before the batch.
    base: i64,
    /// The version the stream's last append in the batch leaves.
    leaves: i64,
    /// The request of that last append.
    request: i64,
}

impl<'a> EachAppend<'a> {
    /// The columns of `requests`, each given with its index (`req` in the statement); `None` when
    /// one of them expects `Any` or `StreamExists`, which need a look at the stream per request
    /// (`append_in` one by one).
    pub fn of(
        requests: impl IntoIterator<Item = (i64, &'a [StreamAppend])>,
    ) -> Result<Option<EachAppend<'a>>, AppendError> {
        let requests: Vec<(i64, &'a [StreamAppend])> = requests.into_iter().collect();
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
            prevs: Vec::new(),
        };
        for (_, streams) in &requests {
            crate::validate(streams)?;
        }
        // The module's Order: the first streams, then the later ones, each part in request order.
        let firsts = requests
            .iter()
            .filter_map(|&(request, streams)| Some((request, streams.first()?)));
        let laters = requests.iter().flat_map(|&(request, streams)| {
            streams.iter().skip(1).map(move |append| (request, append))
        });
        let mut chains: std::collections::HashMap<&str, ChainEnd> =
            std::collections::HashMap::new();
        for (request, append) in firsts.chain(laters) {
            let base = match append.expected {
                ExpectedVersion::NoStream => 0,
                // A version beyond i64 can never be current: -1 never matches.
                ExpectedVersion::Exact(n) => i64::try_from(n).unwrap_or(-1),
                ExpectedVersion::Any | ExpectedVersion::StreamExists => return Ok(None),
            };
            let count = i64::try_from(append.events.len()).unwrap_or(i64::MAX);
            let leaves = base.saturating_add(count);
            let (chain, prev) = match chains.get(append.stream_id.as_str()) {
                Some(end) if end.leaves == base && base >= 0 => (end.base, end.request),
                _ => (base, -1),
            };
            chains.insert(
                append.stream_id.as_str(),
                ChainEnd {
                    base: chain,
                    leaves,
                    request,
                },
            );
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
                each.prevs.push(prev);
            }
        }
        Ok(Some(each))
    }

    /// The CTEs `each_input`, `each_stale`, `each_chained` and `each_written` (without `WITH`):
    /// [`EachAppend::input_ctes`], then the rows of the requests that are not stale and pass
    /// `gate` (a condition on `i`, an `each_input` row), each only if every earlier row of its
    /// stream does too, skipping a row another writer got to first (`Taken::Skip`).
    pub fn ctes(first: usize, gate: &str) -> String {
        format!(
            "{}, each_chained AS (SELECT g.*, bool_and(g.ok) OVER (PARTITION BY g.stream_id \
             ORDER BY g.n ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS chain_ok \
             FROM (SELECT i.*, ({gate}) AND i.req NOT IN (SELECT req FROM each_stale) AS ok \
             FROM each_input i) g), {}",
            Self::inputs(first, Taken::Skip),
            Self::written_cte("each_chained i WHERE i.chain_ok", Taken::Skip)
        )
    }

    /// The CTEs `each_input` and `each_stale` for a statement that fails on a row another writer
    /// took first (`Taken::Fail`, [`EachAppend::write_cte`]), reading the eleven arrays from
    /// parameters `$first` to `$first + 10`: what the rest of a statement may gate its own rows on
    /// (a key claimed only for a request that is not stale). `each_stale` holds the requests one
    /// of whose streams is not at the version its chain expects, except those expecting no
    /// stream: a stream that exists already has a version 1, so their first row fails the
    /// statement, and the probe of a stream that is new in nearly every batch (a payment's, a
    /// transfer's) is spared.
    pub fn input_ctes(first: usize) -> String {
        Self::inputs(first, Taken::Fail)
    }

    /// `each_input` and `each_stale`. Only a statement that fails on a taken row may leave the
    /// streams expected new out of `each_stale`: skipping the taken row instead would write
    /// the rows after it (an append of two events to a stream at version 1 would get its
    /// version 2), a request in part.
    fn inputs(first: usize, taken: Taken) -> String {
        let p: Vec<usize> = (first..first + 11).collect();
        let probed = match taken {
            Taken::Skip => "",
            Taken::Fail => " AND i.chain <> 0",
        };
        format!(
            "each_input AS (SELECT * FROM unnest(${}::text[], ${}::int8[], ${}::int8[], \
             ${}::int8[], ${}::uuid[], ${}::text[], ${}::int4[], ${}::jsonb[], ${}::jsonb[], \
             ${}::int8[], ${}::int8[]) WITH ORDINALITY AS i(stream_id, expected, chain, ord, \
             event_id, event_type, schema, data, metadata, req, prev, n)), \
             each_stale AS (SELECT i.req FROM each_input i WHERE i.ord = 1{probed} \
             AND (SELECT coalesce(max(e.version), 0) FROM events e \
             WHERE e.stream_id = i.stream_id) <> i.chain)",
            p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10]
        )
    }

    /// The CTE `each_written`, after [`EachAppend::input_ctes`]: inserts, in order, the rows of
    /// `each_input` whose request is not in `blocked` (a query of request indexes, which must hold
    /// the stale ones), failing the statement on a row another writer got to first
    /// (`Taken::Fail`). The statement must refuse itself on a [`EachAppend::broken_chain`] of the
    /// same `blocked`.
    pub fn write_cte(blocked: &str) -> String {
        Self::written_cte(
            &format!("each_input i WHERE i.req NOT IN ({blocked})"),
            Taken::Fail,
        )
    }

    /// A condition that holds when a request that is written continues the chain of one in
    /// `blocked`, which is not (its rows would leave a gap in its stream).
    pub fn broken_chain(blocked: &str) -> String {
        format!(
            "EXISTS (SELECT 1 FROM each_input i WHERE i.prev >= 0 \
             AND i.req NOT IN ({blocked}) AND i.prev IN ({blocked}))"
        )
    }

    /// `each_written` over `source` (`each_input`'s columns as `i`), in the rows' order.
    fn written_cte(source: &str, taken: Taken) -> String {
        let on_conflict = match taken {
            Taken::Skip => " ON CONFLICT DO NOTHING",
            Taken::Fail => "",
        };
        format!(
            "each_written AS (INSERT INTO events (stream_id, version, event_id, event_type, \
             schema, data, metadata) \
             SELECT i.stream_id, i.expected + i.ord, i.event_id, i.event_type, i.schema, i.data, \
             i.metadata FROM {source} ORDER BY i.n\
             {on_conflict} RETURNING event_id, position, version, xact)"
        )
    }

    /// Adds the eleven arrays, in the order [`EachAppend::input_ctes`] reads them, as the next
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
        arguments.add(self.requests)?;
        arguments.add(self.prevs)
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
