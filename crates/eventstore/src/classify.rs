//! What an append that could not be written as asked actually was: a re-send
//! of an append already stored (answer the original result), a conflict, or a
//! lost race that a retry will win. Shared by both backends so that they give
//! the same answers, which the conformance suite checks.

use std::collections::HashMap;

use uuid::Uuid;

use crate::{AppendError, Cursor, StoreError, StreamAppend};

/// The result of appending to one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamResult {
    pub stream_id: String,
    /// The stream's last version after the append.
    pub version: u64,
    pub first_position: i64,
    pub last_position: i64,
    pub last_cursor: Cursor,
}

/// A stored row, as far as classification needs it.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub event_id: Uuid,
    pub stream_id: String,
    pub version: i64,
    pub position: i64,
    pub xact: i64,
}

#[derive(Debug)]
pub(crate) enum Verdict {
    /// Every event was already stored by an identical earlier append.
    Replayed(StreamResult),
    Refused(AppendError),
    /// The expectation holds now: the statement lost a race (or ran on a stale
    /// snapshot) and trying again can succeed.
    Retry,
}

/// Builds the result from the rows an append wrote (or found), each given as
/// (position, version, xact).
pub(crate) fn result_of(
    stream_id: &str,
    rows: &[(i64, i64, i64)],
) -> Result<StreamResult, StoreError> {
    let mut version = 0;
    let mut first_position = i64::MAX;
    let mut last_position = i64::MIN;
    let mut last_cursor = Cursor::START;
    for &(position, v, xact) in rows {
        version = version.max(crate::version_from_db(position, v)?);
        first_position = first_position.min(position);
        last_position = last_position.max(position);
        last_cursor = last_cursor.max(Cursor::new(xact, position));
    }
    Ok(StreamResult {
        stream_id: stream_id.to_owned(),
        version,
        first_position,
        last_position,
        last_cursor,
    })
}

/// `stored`: the rows already holding any of the append's event ids;
/// `actual`: the stream's last version now (0 = no stream).
pub(crate) fn classify(
    append: &StreamAppend,
    stored: &[Stored],
    actual: u64,
) -> Result<Verdict, StoreError> {
    let conflict = || {
        Verdict::Refused(AppendError::Conflict {
            stream_id: append.stream_id.clone(),
            expected: append.expected,
            actual: (actual > 0).then_some(actual),
        })
    };
    if stored.is_empty() {
        return Ok(if append.expected.holds(actual) {
            Verdict::Retry
        } else {
            conflict()
        });
    }
    let by_id: HashMap<Uuid, &Stored> = stored.iter().map(|s| (s.event_id, s)).collect();
    // An identical re-send: every event stored, in this stream, in request
    // order with consecutive versions, and the expectation held just before.
    let mut rows = Vec::with_capacity(append.events.len());
    let mut first_version = None;
    for (i, event) in append.events.iter().enumerate() {
        let Some(s) = by_id.get(&event.event_id) else {
            return Ok(Verdict::Refused(AppendError::EventIdTaken {
                event_id: stored[0].event_id,
            }));
        };
        let first = *first_version.get_or_insert(s.version);
        // `i` is bounded by EVENTS_PER_APPEND_MAX, so it fits an i64.
        let in_place = s.stream_id == append.stream_id && s.version == first + i as i64;
        if !in_place {
            return Ok(Verdict::Refused(AppendError::EventIdTaken {
                event_id: s.event_id,
            }));
        }
        rows.push((s.position, s.version, s.xact));
    }
    let before = first_version.map_or(0, |v| v - 1);
    let before = crate::version_from_db(rows[0].0, before)?;
    if !append.expected.holds(before) {
        return Ok(conflict());
    }
    Ok(Verdict::Replayed(result_of(&append.stream_id, &rows)?))
}
