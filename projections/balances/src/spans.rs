//! Spans: the log's positions as the legs projection (`ledger_entries`) applied them, in runs of
//! consecutive positions of one transaction (`log_spans_g{n}`: first and last position, xact).
//! They let a balance at a position name that position's place in log order, (xact, position),
//! from the read model alone, in the statement that reads the sums (`crate::marks::sums_through`):
//! a position's transaction is not a function of the position on PostgreSQL, where concurrent
//! transactions take positions in any order.
//!
//! The runs of different transactions never overlap, so the run that holds a position is the one
//! starting nearest at or before it, if it reaches that far. A position no span holds is one the
//! projection has not applied yet (or the log never had): the reader asks the log
//! (`EventStore::cursor_of_position`). Written with the legs, in the projection's transaction;
//! a rebuild makes them again; `verify_spans` checks them against the log.

use asiento_eventstore::{Cursor, Database, EventStore, RecordedEvent, Tx};
use asiento_projector::on_snapshot;
use asiento_projector::snapshot::Snapshot;

use crate::ENTRIES_NAME;

/// Spans per page of the check.
const VERIFY_PAGE_SPANS: usize = 4_096;
/// Positions per read of the log while checking the spans.
const VERIFY_POSITIONS_PER_READ: usize = 1_000;

/// The table of spans (`WITHOUT ROWID` on SQLite: its key is the only index).
pub(crate) fn ddl(g: i64, postgres: bool) -> String {
    let (int, rowid) = if postgres {
        ("BIGINT", "")
    } else {
        ("INTEGER", " WITHOUT ROWID")
    };
    format!(
        "CREATE TABLE log_spans_g{g} (
            first_position {int} NOT NULL PRIMARY KEY,
            last_position  {int} NOT NULL,
            xact           {int} NOT NULL){rowid}"
    )
}

/// One run of consecutive positions of one transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub first: i64,
    pub last: i64,
    pub xact: i64,
}

/// The runs of `events` (in log order): a new one wherever the transaction changes or a position
/// is skipped.
fn spans_of(events: &[RecordedEvent]) -> Vec<Span> {
    let mut spans: Vec<Span> = Vec::new();
    for event in events {
        let (xact, position) = (event.cursor.xact(), event.cursor.position());
        match spans.last_mut() {
            Some(span) if span.xact == xact && span.last + 1 == position => span.last = position,
            _ => spans.push(Span {
                first: position,
                last: position,
                xact,
            }),
        }
    }
    spans
}

/// Inserts the spans of a batch of events.
pub(crate) async fn write(
    tx: &mut Tx,
    g: i64,
    events: &[RecordedEvent],
) -> Result<(), sqlx::Error> {
    let spans = spans_of(events);
    if spans.is_empty() {
        return Ok(());
    }
    match tx {
        Tx::Postgres(t) => {
            sqlx::query(&format!(
                "INSERT INTO log_spans_g{g} (first_position, last_position, xact)
                 SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::int8[])"
            ))
            .bind(spans.iter().map(|s| s.first).collect::<Vec<_>>())
            .bind(spans.iter().map(|s| s.last).collect::<Vec<_>>())
            .bind(spans.iter().map(|s| s.xact).collect::<Vec<_>>())
            .execute(&mut **t)
            .await?;
        }
        Tx::Sqlite(t) => {
            let insert = format!(
                "INSERT INTO log_spans_g{g} (first_position, last_position, xact) VALUES ($1, $2, $3)"
            );
            for span in &spans {
                sqlx::query(&insert)
                    .bind(span.first)
                    .bind(span.last)
                    .bind(span.xact)
                    .execute(&mut **t)
                    .await?;
            }
        }
    }
    Ok(())
}

/// The SQL expression of the transaction of the position bound as `$position` (NULL when no span
/// holds it), for the statement that reads sums at a position.
pub(crate) fn xact_of(position: &str) -> String {
    format!(
        "(SELECT xact FROM (SELECT xact, last_position FROM log_spans \
           WHERE first_position <= {position} ORDER BY first_position DESC LIMIT 1) AS nearest \
         WHERE last_position >= {position})"
    )
}

/// A span that disagrees with the log: a bug or a hand edit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanMismatch {
    /// The position the disagreement is first seen at.
    pub position: i64,
    pub detail: String,
}

/// Checks the spans against the log up to the projection's checkpoint: every event's position
/// is held by a span of its transaction, and every span's positions are events of the log.
pub async fn verify_spans(
    db: &Database,
    store: &dyn EventStore,
) -> Result<Vec<SpanMismatch>, crate::BalanceError> {
    verify_spans_in_pages(db, store, VERIFY_PAGE_SPANS).await
}

/// [`verify_spans`], `page_spans` spans at a time: each page's spans against the log's events
/// at the positions from the page's first span (the log's first position, for the first page)
/// to the next page's first. The checkpoint, the log's last position and the spans are read in
/// one [`Snapshot`], so a batch committing meanwhile changes none of them; the log is read by
/// position and cut at the checkpoint. Memory: a page of spans and a read of events.
pub async fn verify_spans_in_pages(
    db: &Database,
    store: &dyn EventStore,
    page_spans: usize,
) -> Result<Vec<SpanMismatch>, crate::BalanceError> {
    let mut snapshot = Snapshot::begin(db).await?;
    let Some(checkpoint) = snapshot.checkpoint(ENTRIES_NAME).await? else {
        return Err(crate::BalanceError::NotInstalled);
    };
    // Every event up to the checkpoint committed before the snapshot began, so it lies within
    // the positions the snapshot sees.
    let (first, last): (Option<i64>, Option<i64>) = on_snapshot!(&mut snapshot, conn => {
        sqlx::query_as("SELECT MIN(position), MAX(position) FROM events")
            .fetch_one(&mut *conn)
            .await?
    });
    let page_spans = page_spans.max(1);
    // One span more than a page: where the page's positions end.
    let asked = i64::try_from(page_spans).unwrap_or(i64::MAX - 1) + 1;
    let mut found = Vec::new();
    let mut from = first.unwrap_or(1);
    let mut previous: Option<Span> = None;
    loop {
        let mut page: Vec<Span> = on_snapshot!(&mut snapshot, conn => {
            sqlx::query_as::<_, (i64, i64, i64)>(
                "SELECT first_position, last_position, xact FROM log_spans \
                 WHERE first_position > $1 ORDER BY first_position LIMIT $2",
            )
            .bind(previous.map_or(i64::MIN, |span| span.first))
            .bind(asked)
            .fetch_all(&mut *conn)
            .await?
        })
        .into_iter()
        .map(|(first, last, xact)| Span { first, last, xact })
        .collect();
        // The page's positions end where the next page's first span begins.
        let next = if page.len() > page_spans {
            page.pop()
        } else {
            None
        };
        let until = match next {
            Some(span) => span.first,
            None => page
                .iter()
                .map(|span| span.last)
                .chain(last)
                .max()
                .map_or(from, |last| last + 1),
        };
        if let (Some(before), Some(span)) = (previous, page.first()) {
            if span.first <= before.last {
                found.push(overlap(*span, before));
            }
        }
        previous = page.last().copied().or(previous);
        let mut check = Check::new(page.into_iter());
        while from < until {
            let positions: Vec<i64> = (from..until).take(VERIFY_POSITIONS_PER_READ).collect();
            for event in store.read_positions(&positions).await? {
                if event.cursor <= checkpoint {
                    check.event(event.cursor);
                }
            }
            from += positions.len() as i64;
        }
        found.extend(check.finish());
        if next.is_none() {
            break;
        }
    }
    snapshot.end().await?;
    Ok(found)
}

/// The spans (in position order) against the log's events, taken one at a time in any order:
/// memory for the spans, not for the log.
struct Check {
    spans: Vec<Span>,
    /// Per span, the events of the log it holds.
    held: Vec<i64>,
    found: Vec<SpanMismatch>,
}

/// `span` begins within `before`, the span before it.
fn overlap(span: Span, before: Span) -> SpanMismatch {
    SpanMismatch {
        position: span.first,
        detail: format!(
            "span {}..={} overlaps span {}..={}",
            span.first, span.last, before.first, before.last
        ),
    }
}

impl Check {
    fn new(spans: impl Iterator<Item = Span>) -> Self {
        let spans: Vec<Span> = spans.collect();
        let mut found = Vec::new();
        for pair in spans.windows(2) {
            if pair[1].first <= pair[0].last {
                found.push(overlap(pair[1], pair[0]));
            }
        }
        Check {
            held: vec![0; spans.len()],
            spans,
            found,
        }
    }

    fn event(&mut self, cursor: Cursor) {
        let (position, xact) = (cursor.position(), cursor.xact());
        let nearest = self.spans.partition_point(|s| s.first <= position);
        match nearest.checked_sub(1).map(|i| (i, self.spans[i])) {
            Some((i, span)) if span.last >= position => {
                self.held[i] += 1;
                if span.xact != xact {
                    self.found.push(SpanMismatch {
                        position,
                        detail: format!(
                            "span {}..={} says xact {}, the log {xact}",
                            span.first, span.last, span.xact
                        ),
                    });
                }
            }
            _ => self.found.push(SpanMismatch {
                position,
                detail: format!("the event at {position} (xact {xact}) is in no span"),
            }),
        }
    }

    /// What was found, with every span that holds a position the log does not have.
    fn finish(mut self) -> Vec<SpanMismatch> {
        for (span, held) in self.spans.iter().zip(&self.held) {
            if *held != span.last - span.first + 1 {
                self.found.push(SpanMismatch {
                    position: span.first,
                    detail: format!(
                        "span {}..={} holds {} positions, the log {held} of them",
                        span.first,
                        span.last,
                        span.last - span.first + 1
                    ),
                });
            }
        }
        self.found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(stored: &[(i64, i64, i64)], log: &[(i64, i64)]) -> Vec<i64> {
        let mut check =
            Check::new(
                stored
                    .iter()
                    .map(|&(first, last, xact)| Span { first, last, xact }),
            );
        for &(position, xact) in log {
            check.event(Cursor::new(xact, position));
        }
        check.finish().iter().map(|m| m.position).collect()
    }

    #[test]
    fn spans_that_hold_the_log_exactly_agree_with_it() {
        let log = [(1, 10), (2, 10), (4, 10), (5, 10), (3, 11)];
        assert_eq!(
            check(&[(1, 2, 10), (3, 3, 11), (4, 5, 10)], &log),
            Vec::<i64>::new()
        );
    }

    #[test]
    fn a_wrong_xact_a_missing_event_an_overlap_and_a_position_too_many_are_named() {
        let log = [(1, 10), (2, 12), (3, 11), (6, 13)];
        // 2: its xact; 6: in no span; 4: overlaps 3..=4; 3..=4 holds 4, which the log never had.
        assert_eq!(
            check(&[(1, 2, 10), (3, 4, 11), (4, 4, 11)], &log),
            vec![4, 2, 6, 3, 4]
        );
    }
}
