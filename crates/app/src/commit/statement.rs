//! A group commit batch as one PostgreSQL statement: one round trip and one autocommit
//! transaction, instead of BEGIN, a statement per kind of row and COMMIT.
//!
//! The statement is a chain of data-modifying CTEs, each the statement the transaction path runs
//! for its kind of row: the fresh claims (`claimed`), the webhook rows (`stored`), the events
//! (`each_written`, from `asiento_eventstore::EachAppend`), the completions (`completed`) and the
//! keys claimed and completed at once (`settled`): those of the kinds of rows the batch has
//! ([`Kinds`]), one statement text per combination.
//! What the transaction path decides between its statements, the statement decides inside:
//!
//! - **A step is written whole or not at all, and alone.** A step one of whose streams is not at
//!   the version it expects (`each_stale`) gets nothing written: no key claimed, no events, no
//!   completion. It is answered [`Committed::Conflict`] and the rest of the batch commits. A
//!   step that expects a stream to be new is not probed (most steps start a stream of their own,
//!   and that probe would find nothing in nearly every batch): if the stream exists, its first
//!   event's unique violation refuses the batch (below).
//! - **A claim gates its step's events.** A step whose key exists gets no events: its claim did
//!   not come back from `claimed`.
//! - **A key claimed and completed at once** (a step with both: a ledger command, whose answer
//!   is ready when its events are) is inserted completed after the events (`settled`), with the
//!   position in its answer; its step writes only if the key did not exist when the statement
//!   began (`settle_input.fresh`).
//! - **One gate for every kind of row.** Those three make up `each_blocked`, the steps that write
//!   nothing; each kind of row is written for the steps not in it. The set is computed once, so
//!   every gate is one probe of one hash table.
//! - **A completion's response carries the position of its step's last event**, which only the
//!   insert knows (`each_last`, each step's greatest position). If the response splits at the
//!   position's decimal text (`super::respond::Respond::split`: the text found in exactly one
//!   place), the statement stores the part before it, the real position and the part after it.
//!   Otherwise the batch takes the transaction path.
//! - **Nothing of a step is committed in part.** If a step that is written continues the chain of
//!   one that is not (`EachAppend::broken_chain`: its rows would leave a gap in the stream), or a
//!   completion found its lease taken over, the statement calls `asiento_batch_refused`
//!   (migration 0050), whose error undoes the whole statement. An event row or a key settled at
//!   once that another writer inserted first (after the statement began) does the same through
//!   its unique violation: those two INSERTs have no ON CONFLICT clause, which spares each row a
//!   probe of every unique index before it goes in. Either way the caller then writes each step
//!   alone, in a transaction of its own, which tells that step its [`Committed::Conflict`] or
//!   [`Committed::LeaseLost`].

use std::collections::HashSet;
use std::sync::LazyLock;

use asiento_eventstore::{each_results, EachAppend, StreamAppend};
use sqlx::postgres::PgArguments;
use sqlx::Row;
use uuid::Uuid;

use super::step::{CommitError, Committed, Work};
use crate::idempotency::{self, Completing, FreshClaim};
use crate::log::Store;
use crate::webhooks::{self, InboxRow};

/// The SQLSTATEs that mean the statement refused itself: `asiento_batch_refused`'s (migration
/// 0050) and a unique violation (a row another writer inserted first).
const REFUSED: [&str; 2] = ["AB001", "23505"];

/// Where each kind of row's arrays start among the statement's parameters. Only the kinds a batch
/// has are bound, the events' eleven arrays first, then the claims (ten), the webhook rows (six),
/// the completions (ten) and the keys settled at once: their claims (ten) and their answers
/// (four), in this order. (The server decodes every parameter bound on each execution, read or
/// not.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Params {
    events: usize,
    claims: usize,
    inbox: usize,
    completions: usize,
    settle_claims: usize,
    settle_answers: usize,
}

impl Params {
    /// The layout for a batch with `kinds`; the first parameter of a kind it does not have is
    /// where that kind would start, and is never read.
    fn of(kinds: Kinds) -> Params {
        let mut next = 1;
        let mut take = |present: bool, arrays: usize| {
            let first = next;
            if present {
                next += arrays;
            }
            first
        };
        Params {
            events: take(true, 11),
            claims: take(kinds.claims, 10),
            inbox: take(kinds.inbox, 6),
            completions: take(kinds.completions, 10),
            settle_claims: take(kinds.settles, 10),
            settle_answers: take(kinds.settles, 4),
        }
    }
}

/// How a batch went.
pub enum Written {
    /// Committed: each step's outcome.
    Done(Vec<Committed>),
    /// A step could not be written whole, so nothing was: write each step alone.
    Refused,
    /// Not a batch for one statement (another backend, an expectation that needs a look per
    /// request, a response whose position cannot be filled in): the transaction path writes it.
    Unfit,
    /// Committed, but the statement's answer could not be read: every step fails, and none is
    /// written again (a retry with its key finds what was committed).
    Unreadable(String),
}

/// Writes `steps` as one statement, if they fit one.
pub async fn write(store: &Store, steps: &[Work]) -> Result<Written, CommitError> {
    let mut requests: Vec<(i64, &[StreamAppend])> = Vec::new();
    let mut claims: Vec<(&FreshClaim, i64)> = Vec::new();
    let mut rows: Vec<&InboxRow> = Vec::new();
    let mut completions: Vec<(Completing, i64, Option<Vec<u8>>)> = Vec::new();
    let mut settle_claims: Vec<(&FreshClaim, i64)> = Vec::new();
    let mut settle_answers: Vec<(Completing, i64, Option<Vec<u8>>)> = Vec::new();
    for (step, work) in (0_i64..).zip(steps) {
        if !work.appends.is_empty() {
            requests.push((step, &work.appends[..]));
        }
        match (&work.claim, work.completion.is_some()) {
            (Some(claim), true) => settle_claims.push((claim, step)),
            (Some(claim), false) => claims.push((claim, step)),
            (None, _) => {}
        }
        if let Some(row) = &work.inbox {
            // The inbox rows are not gated per step: a step that also appends (whose streams may
            // have moved on) is written by the transaction path.
            if !work.appends.is_empty() {
                return Ok(Written::Unfit);
            }
            rows.push(row);
        }
        if let Some(completion) = &work.completion {
            let (response, tail) = if work.appends.is_empty() {
                (completion.respond.at(None), None)
            } else {
                match completion.respond.split() {
                    Some(split) => (split.head.clone(), Some(split.tail.clone())),
                    None => return Ok(Written::Unfit),
                }
            };
            let completing = Completing {
                response,
                ..completion.completing.clone()
            };
            if work.claim.is_some() {
                settle_answers.push((completing, step, tail));
            } else {
                completions.push((completing, step, tail));
            }
        }
    }
    let Some(each) = EachAppend::of(requests.iter().copied())? else {
        return Ok(Written::Unfit);
    };
    let Some(mut conn) = store.statement_connection().await? else {
        return Ok(Written::Unfit);
    };

    let kinds = Kinds {
        claims: !claims.is_empty(),
        inbox: !rows.is_empty(),
        completions: !completions.is_empty(),
        settles: !settle_claims.is_empty(),
    };
    // In the order of `Params`.
    let mut arguments = PgArguments::default();
    let add = || -> Result<(), sqlx::error::BoxDynError> {
        each.add_to(&mut arguments)?;
        if kinds.claims {
            idempotency::add_claims(&mut arguments, claims.iter().copied())?;
        }
        if kinds.inbox {
            webhooks::add_inbox(&mut arguments, &rows)?;
        }
        if kinds.completions {
            idempotency::add_completions(&mut arguments, borrowed(&completions))?;
        }
        if kinds.settles {
            idempotency::add_claims(&mut arguments, settle_claims.iter().copied())?;
            idempotency::add_answers(&mut arguments, borrowed(&settle_answers))?;
        }
        Ok(())
    };
    add().map_err(sqlx::Error::Encode)?;
    let result = sqlx::query_with(statement(kinds), arguments)
        .fetch_one(&mut *conn)
        .await;
    let appended = result.as_ref().is_ok_and(|row| {
        row.try_get::<Vec<Uuid>, _>("written_event")
            .is_ok_and(|written| !written.is_empty())
    });
    conn.finished(&result, appended);
    let row = match result {
        Ok(row) => row,
        Err(sqlx::Error::Database(error))
            if error.code().is_some_and(|code| REFUSED.contains(&&*code)) =>
        {
            return Ok(Written::Refused)
        }
        // An error from the database undid the statement (its own transaction). Without an
        // answer (the connection broke) the batch may have committed, as when a COMMIT's
        // acknowledgement is lost: writing each step alone then can still not write anything
        // twice (keys, event ids and inbox event ids are unique; a completion needs its key in
        // flight), it only tells those steps they lost.
        Err(error) => return Err(error.into()),
    };
    Ok(outcomes(steps, &row, &requests, &rows).unwrap_or_else(|error| {
        tracing::error!(%error, steps = steps.len(), "a committed group commit batch's answer is unreadable");
        Written::Unreadable(format!("the batch committed, but its answer is unreadable: {error}"))
    }))
}

/// Completions as `idempotency::add_completions` takes them.
fn borrowed(
    completions: &[(Completing, i64, Option<Vec<u8>>)],
) -> impl Iterator<Item = (&Completing, i64, Option<&[u8]>)> + Clone {
    completions
        .iter()
        .map(|(completing, step, tail)| (completing, *step, tail.as_deref()))
}

/// Each step's outcome, from the committed statement's answer.
fn outcomes(
    steps: &[Work],
    row: &sqlx::postgres::PgRow,
    requests: &[(i64, &[StreamAppend])],
    rows: &[&InboxRow],
) -> Result<Written, CommitError> {
    let claimed: HashSet<Uuid> = row
        .try_get::<Vec<Uuid>, _>("claimed")?
        .into_iter()
        .collect();
    let stale: HashSet<i64> = row.try_get::<Vec<i64>, _>("stale")?.into_iter().collect();
    let stored: Vec<(String, String)> = row
        .try_get::<Vec<String>, _>("stored_provider")?
        .into_iter()
        .zip(row.try_get::<Vec<String>, _>("stored_event")?)
        .collect();
    let written = row
        .try_get::<Vec<Uuid>, _>("written_event")?
        .into_iter()
        .zip(row.try_get::<Vec<i64>, _>("written_position")?)
        .zip(row.try_get::<Vec<i64>, _>("written_version")?)
        .zip(row.try_get::<Vec<i64>, _>("written_xact")?)
        .map(|(((event, position), version), xact)| (event, position, version, xact));
    let appends: Vec<&[StreamAppend]> = requests.iter().map(|(_, appends)| *appends).collect();
    let mut appended = each_results(&appends, written)?.into_iter();
    let mut stored = webhooks::stored_each(rows, stored).into_iter();

    let mut outcomes = Vec::with_capacity(steps.len());
    for (step, work) in (0_i64..).zip(steps) {
        if stale.contains(&step) {
            // Nothing of it was written (a stale step appends, so it has no inbox row).
            appended.next();
            outcomes.push(Committed::Conflict);
            continue;
        }
        let fresh = work
            .claim
            .as_ref()
            .is_none_or(|claim| claimed.contains(&claim.lease.owner));
        let inboxed = work.inbox.is_none() || stored.next() == Some(true);
        let written = if work.appends.is_empty() {
            None
        } else {
            appended.next().flatten()
        };
        outcomes.push(match (fresh && inboxed, written) {
            (false, _) => Committed::NotFresh,
            (true, written) if written.is_some() || work.appends.is_empty() => {
                Committed::Written(written)
            }
            // The statement refuses a batch with such a step; committed means it had none.
            (true, _) => {
                return Err(CommitError::Unexpected(
                    "a step of a committed batch was not written".into(),
                ))
            }
        });
    }
    Ok(Written::Done(outcomes))
}

/// The kinds of rows a batch writes besides its events. The statement leaves out the CTEs of the
/// kinds a batch has none of: PostgreSQL sets up every node of a plan on each execution, and for a
/// batch of one or a few steps that set-up costs about as much as running it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Kinds {
    claims: bool,
    inbox: bool,
    completions: bool,
    settles: bool,
}

impl Kinds {
    const COUNT: usize = 16;

    fn index(self) -> usize {
        usize::from(self.claims)
            | usize::from(self.inbox) << 1
            | usize::from(self.completions) << 2
            | usize::from(self.settles) << 3
    }

    fn of_index(index: usize) -> Kinds {
        Kinds {
            claims: index & 1 != 0,
            inbox: index & 2 != 0,
            completions: index & 4 != 0,
            settles: index & 8 != 0,
        }
    }
}

/// The statement for a batch with `kinds`, built once per kind.
fn statement(kinds: Kinds) -> &'static str {
    static STATEMENTS: LazyLock<Vec<String>> = LazyLock::new(|| {
        (0..Kinds::COUNT)
            .map(|i| build(Kinds::of_index(i)))
            .collect()
    });
    &STATEMENTS[kinds.index()]
}

/// The statement for `kinds`; its parameters as [`Params::of`] lays them out.
fn build(kinds: Kinds) -> String {
    let params = Params::of(kinds);
    // The steps that write nothing (`each_blocked`): the stale ones, those whose claim did not
    // come back and those whose key to settle was not fresh.
    let blocked_steps = "SELECT req FROM each_blocked";
    let step_written = format!("u.step NOT IN ({blocked_steps})");
    let mut blocked = vec!["SELECT req FROM each_stale"];
    // A completion's position: that of its step's last event.
    let position = "SELECT l.position FROM each_last l WHERE l.req = u.step";

    // The CTEs in the order they must run: the claims and the keys settled at once before the
    // events they gate, the completions and the settled keys after the events whose position
    // they carry.
    let mut ctes = vec![EachAppend::input_ctes(params.events)];
    let mut owners = Vec::new();
    if kinds.claims {
        ctes.push(idempotency::claims_ctes(
            params.claims,
            "step NOT IN (SELECT req FROM each_stale)",
        ));
        blocked
            .push("SELECT step FROM claim_input WHERE o NOT IN (SELECT lease_owner FROM claimed)");
        owners.push("SELECT lease_owner FROM claimed");
    }
    let [settle_input, settled] = idempotency::settles_ctes(
        params.settle_claims,
        params.settle_answers,
        &step_written,
        position,
    );
    if kinds.settles {
        ctes.push(settle_input);
        blocked.push("SELECT step FROM settle_input WHERE NOT fresh");
    }
    ctes.push(format!("each_blocked AS ({})", blocked.join(" UNION ALL ")));
    if kinds.inbox {
        ctes.push(webhooks::inbox_cte(params.inbox));
    }
    ctes.push(EachAppend::write_cte(blocked_steps));
    if kinds.completions || kinds.settles {
        ctes.push(
            "each_last AS MATERIALIZED (SELECT i.req, max(w.position) AS position \
             FROM each_written w JOIN each_input i ON i.event_id = w.event_id GROUP BY i.req)"
                .to_owned(),
        );
    }
    if kinds.completions {
        ctes.push(idempotency::completions_cte(
            params.completions,
            position,
            &step_written,
        ));
    }
    if kinds.settles {
        ctes.push(settled);
        owners.push("SELECT lease_owner FROM settled");
    }

    let claimed = if owners.is_empty() {
        "'{}'::uuid[]".to_owned()
    } else {
        format!("ARRAY({})", owners.join(" UNION ALL "))
    };
    let [stored_provider, stored_event] = if kinds.inbox {
        ["provider", "event_id"]
            .map(|column| format!("ARRAY(SELECT {column} FROM stored ORDER BY provider, event_id)"))
    } else {
        ["'{}'::text[]", "'{}'::text[]"].map(str::to_owned)
    };
    let mut refusals = vec![format!(
        "WHEN {} THEN asiento_batch_refused('a step continues the chain of a step not written')",
        EachAppend::broken_chain(blocked_steps)
    )];
    if kinds.completions {
        refusals.push(format!(
            "WHEN (SELECT count(*) FROM completed) <> (SELECT count(*) FROM \
             unnest(${completions}::int8[]) AS u(step) WHERE {step_written}) \
             THEN asiento_batch_refused('a key''s lease was taken over')",
            completions = params.completions,
        ));
    }
    // The written rows' columns in one pass: the four arrays are aligned, in no particular order.
    format!(
        "WITH {ctes} \
         SELECT {claimed} AS claimed, ARRAY(SELECT req FROM each_stale) AS stale, \
         {stored_provider} AS stored_provider, {stored_event} AS stored_event, \
         w.written_event, w.written_position, w.written_version, w.written_xact, \
         CASE {refusals} ELSE true END AS written \
         FROM (SELECT coalesce(array_agg(event_id), '{{}}') AS written_event, \
         coalesce(array_agg(position), '{{}}') AS written_position, \
         coalesce(array_agg(version), '{{}}') AS written_version, \
         coalesce(array_agg(xact), '{{}}') AS written_xact FROM each_written) w",
        ctes = ctes.join(", "),
        refusals = refusals.join(" "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parameters a statement reads, in order of first mention.
    fn parameters(statement: &str) -> Vec<usize> {
        let mut read = Vec::new();
        for (at, _) in statement.match_indices('$') {
            let digits: String = statement[at + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            let n: usize = digits.parse().expect("a parameter number");
            if !read.contains(&n) {
                read.push(n);
            }
        }
        read
    }

    #[test]
    fn a_statement_reads_exactly_the_parameters_of_the_kinds_its_batch_has() {
        for index in 0..Kinds::COUNT {
            let kinds = Kinds::of_index(index);
            let bound = 11
                + [
                    (kinds.claims, 10),
                    (kinds.inbox, 6),
                    (kinds.completions, 10),
                    (kinds.settles, 14),
                ]
                .iter()
                .filter(|(present, _)| *present)
                .map(|(_, arrays)| arrays)
                .sum::<usize>();
            let mut read = parameters(&build(kinds));
            read.sort_unstable();
            assert_eq!(read, (1..=bound).collect::<Vec<_>>(), "{kinds:?}");
        }
        let transfers = Params::of(Kinds::of_index(8));
        assert_eq!(
            (
                transfers.events,
                transfers.settle_claims,
                transfers.settle_answers
            ),
            (1, 12, 22),
            "a batch of ledger commands binds its events, then its keys' claims and answers"
        );
    }
}
