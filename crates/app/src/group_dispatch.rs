//! Group commit's dispatcher: takes the steps requests send, forms batches and hands each to a
//! writer task (`crate::group_commit::write`), with up to [`IN_FLIGHT_MAX`] batches being written
//! at once where the store's transactions can write concurrently (PostgreSQL), one otherwise.
//!
//! One batch at a time leaves the database idle while the process waits for a batch's commit and
//! prepares the next, and every request waits for the whole statement ahead of it. Two batches in
//! flight overlap those waits. They must not touch the same rows: a batch waiting for another's
//! uncommitted row (a guard's next version, a key) could wait in a cycle (a deadlock that
//! PostgreSQL breaks only after `deadlock_timeout`), and a step decided against what an earlier
//! step leaves would race it instead of following it. So the dispatcher knows the rows each batch
//! in flight writes ([`rows_of`]: its streams, its keys, its inbox events) and holds back a step
//! that touches one of them, or one of a step held back before it, until those are written. Steps
//! that share rows therefore go in arrival order, one batch after the other, exactly as with a
//! single writer; steps that share none overlap.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures::FutureExt;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::group_commit::{write, GroupCommitError, Reply, Work, BATCH_MAX};
use crate::log::Store;

/// Batches written at once, at most, on a store whose transactions write concurrently. Two: one
/// commits while the next is written. More split the same requests into smaller batches, each
/// costing the database about as much as a full one.
pub const IN_FLIGHT_MAX: usize = 2;
/// Steps a batch needs to be written while another is in flight. A statement costs the database
/// nearly as much for one step as for several, so fewer wait for the batch in flight to end and
/// join the next one: a few concurrent requests are written in full batches one after the other,
/// as by a single writer, and only many are split into batches that overlap.
const CONCURRENT_BATCH_MIN: usize = 4;
/// How long the dispatcher goes on gathering steps after the first, at most (see [`gather`]).
const GATHER_MAX: Duration = Duration::from_micros(500);
/// Yields in a row that bring no new step, after which the dispatcher stops gathering.
const GATHER_IDLE_YIELDS: u32 = 3;

/// A row a step writes, hashed: two steps with the same row key may write the same row (a hash
/// collision only holds a step back needlessly).
type RowKey = u64;

/// Dispatches the steps `receiver` brings until every sender is gone and every batch is written.
pub(crate) async fn dispatch(store: Store, mut receiver: mpsc::UnboundedReceiver<(Work, Reply)>) {
    let in_flight_max = if store.writes_concurrently() {
        IN_FLIGHT_MAX
    } else {
        1
    };
    let mut waiting: Vec<(Work, Reply)> = Vec::new();
    let mut writing: JoinSet<()> = JoinSet::new();
    let mut rows_in_flight: HashMap<tokio::task::Id, HashSet<RowKey>> = HashMap::new();
    let mut open = true;
    loop {
        if writing.len() < in_flight_max && !waiting.is_empty() {
            gather(&mut receiver, &mut waiting).await;
            let busy: HashSet<RowKey> = rows_in_flight.values().flatten().copied().collect();
            let least = if writing.is_empty() {
                1
            } else {
                CONCURRENT_BATCH_MIN
            };
            let (batch, rows) = take_free(&mut waiting, &busy, least);
            if !batch.is_empty() {
                let id = writing.spawn(write_and_answer(store.clone(), batch)).id();
                rows_in_flight.insert(id, rows);
                continue;
            }
        }
        if !open && waiting.is_empty() && writing.is_empty() {
            return;
        }
        let mut received = Vec::new();
        tokio::select! {
            count = receiver.recv_many(&mut received, BATCH_MAX), if open => {
                open = count > 0;
                waiting.append(&mut received);
            }
            Some(done) = writing.join_next_with_id() => {
                let id = match done {
                    Ok((id, ())) => id,
                    Err(error) => error.id(),
                };
                rows_in_flight.remove(&id);
            }
        }
    }
}

/// Writes `batch` and answers each of its requests.
async fn write_and_answer(store: Store, batch: Vec<(Work, Reply)>) {
    metrics::histogram!("asiento_group_commit_batch_size").record(batch.len() as f64);
    let (steps, replies): (Vec<Work>, Vec<Reply>) = batch.into_iter().unzip();
    // A panic fails this batch's requests, not the dispatcher. (Caught here rather than by a task
    // of its own: a task more per batch is a wake-up more on each request's path.)
    let written = AssertUnwindSafe(write(&store, steps)).catch_unwind().await;
    let outcomes = written.unwrap_or_else(|panic| {
        let panic = panic
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic without a message");
        tracing::error!(panic, "a group commit batch panicked; its requests fail");
        (0..replies.len())
            .map(|_| Err(GroupCommitError::Unexpected("the batch panicked".into())))
            .collect()
    });
    for (reply, outcome) in replies.into_iter().zip(outcomes) {
        // A request that gave up is answered nowhere; its step is committed or not as told.
        let _ = reply.send(outcome);
    }
}

/// Takes out of `waiting`, in order, up to [`BATCH_MAX`] steps none of whose rows is `busy` or
/// a row of a step left waiting before it, if there are at least `least` of them (else none);
/// with the rows they write.
fn take_free(
    waiting: &mut Vec<(Work, Reply)>,
    busy: &HashSet<RowKey>,
    least: usize,
) -> (Vec<(Work, Reply)>, HashSet<RowKey>) {
    let mut held = busy.clone();
    let mut rows = HashSet::new();
    let mut free = Vec::with_capacity(waiting.len());
    let mut taken = 0;
    for (work, _) in waiting.iter() {
        let touched = rows_of(work);
        let takes = taken < BATCH_MAX && touched.iter().all(|row| !held.contains(row));
        if takes {
            taken += 1;
            rows.extend(touched);
        } else {
            held.extend(touched);
        }
        free.push(takes);
    }
    if taken < least.max(1) {
        return (Vec::new(), HashSet::new());
    }
    let (batch, left): (Vec<_>, Vec<_>) =
        waiting.drain(..).zip(free).partition(|(_, taken)| *taken);
    *waiting = left.into_iter().map(|(step, _)| step).collect();
    (batch.into_iter().map(|(step, _)| step).collect(), rows)
}

/// The rows `work` writes or waits for: its streams, the key it claims or completes, its inbox
/// event.
fn rows_of(work: &Work) -> Vec<RowKey> {
    let hash = |parts: &[&str]| {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        parts.hash(&mut hasher);
        hasher.finish()
    };
    let mut rows: Vec<RowKey> = work
        .appends
        .iter()
        .map(|append| hash(&["stream", &append.stream_id]))
        .collect();
    let keys = work
        .claim
        .iter()
        .map(|claim| (&claim.scope, &claim.key))
        .chain(
            work.completion
                .iter()
                .map(|completion| (&completion.completing.scope, &completion.completing.key)),
        );
    for (scope, key) in keys {
        rows.push(hash(&[
            "key",
            &scope.tenant,
            &scope.method,
            &scope.route,
            key.as_str(),
        ]));
    }
    if let Some(row) = &work.inbox {
        rows.push(hash(&["inbox", &row.provider, &row.event_id]));
    }
    rows
}

/// Adds to `batch` the steps that arrive while the tasks just woken run: the requests the last
/// batch answered often come back at once with their next step (a client's next command, a
/// payment's finalisation after its create), and each that joins this batch is spared waiting a
/// whole statement for the next one. The dispatcher yields rather than sleeps, so that those
/// tasks run first, and stops after [`GATHER_IDLE_YIELDS`] yields that bring nothing or after
/// [`GATHER_MAX`]: an idle writer adds a few task switches to a request, a busy one a fraction of
/// a statement.
async fn gather(
    receiver: &mut mpsc::UnboundedReceiver<(Work, Reply)>,
    batch: &mut Vec<(Work, Reply)>,
) {
    let started = Instant::now();
    let mut idle = 0;
    while batch.len() < BATCH_MAX && idle < GATHER_IDLE_YIELDS && started.elapsed() < GATHER_MAX {
        tokio::task::yield_now().await;
        let before = batch.len();
        while batch.len() < BATCH_MAX {
            match receiver.try_recv() {
                Ok(step) => batch.push(step),
                Err(_) => break,
            }
        }
        idle = if batch.len() == before { idle + 1 } else { 0 };
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use asiento_eventstore::{ExpectedVersion, StreamAppend};
    use tokio::sync::oneshot;

    #[tokio::test(flavor = "current_thread")]
    async fn gather_takes_the_steps_of_tasks_woken_before_it() {
        let (sender, mut receiver) = mpsc::unbounded_channel();
        let step = || (Work::default(), oneshot::channel().0);
        // Requests the last batch answered: each sends its next step once it runs.
        let (answer, answered) = tokio::sync::watch::channel(false);
        for _ in 0..3 {
            let (sender, mut answered) = (sender.clone(), answered.clone());
            tokio::spawn(async move {
                answered.changed().await.unwrap();
                sender.send(step()).unwrap();
            });
        }
        sender.send(step()).unwrap();
        let mut batch = Vec::new();
        receiver.recv_many(&mut batch, BATCH_MAX).await;
        answer.send(true).unwrap();
        gather(&mut receiver, &mut batch).await;
        assert_eq!(
            batch.len(),
            4,
            "the three woken requests' steps join the batch"
        );
        // Nothing more comes: gathering ends after a few idle yields.
        gather(&mut receiver, &mut batch).await;
        assert_eq!(batch.len(), 4);
    }

    fn appending(streams: &[&str]) -> (Work, Reply) {
        let appends = streams
            .iter()
            .map(|stream| StreamAppend {
                stream_id: (*stream).to_owned(),
                expected: ExpectedVersion::NoStream,
                events: Vec::new(),
            })
            .collect();
        (
            Work {
                appends,
                ..Work::default()
            },
            oneshot::channel().0,
        )
    }

    fn streams(batch: &[(Work, Reply)]) -> Vec<Vec<&str>> {
        batch
            .iter()
            .map(|(work, _)| work.appends.iter().map(|a| a.stream_id.as_str()).collect())
            .collect()
    }

    #[test]
    fn a_step_touching_a_row_in_flight_waits_and_so_do_the_steps_after_it_on_its_rows() {
        let in_flight: HashSet<RowKey> = rows_of(&appending(&["guard-a"]).0).into_iter().collect();
        let mut waiting = vec![
            appending(&["transfer-1", "guard-a", "guard-b"]),
            appending(&["transfer-2", "guard-c"]),
            // Free of the batch in flight, but it shares guard-b with the step held before it.
            appending(&["transfer-3", "guard-b"]),
            appending(&["transfer-4", "guard-c", "guard-d"]),
        ];
        let (batch, rows) = take_free(&mut waiting, &in_flight, 1);
        assert_eq!(
            streams(&batch),
            [
                vec!["transfer-2", "guard-c"],
                vec!["transfer-4", "guard-c", "guard-d"]
            ],
            "steps sharing rows with each other but none in flight go together, in order"
        );
        assert_eq!(
            streams(&waiting),
            [
                vec!["transfer-1", "guard-a", "guard-b"],
                vec!["transfer-3", "guard-b"]
            ]
        );
        assert_eq!(rows.len(), 4);
        // Once the batch in flight is written, the held steps go, in their order.
        let (batch, _) = take_free(&mut waiting, &rows, 1);
        assert_eq!(
            streams(&batch),
            [
                vec!["transfer-1", "guard-a", "guard-b"],
                vec!["transfer-3", "guard-b"]
            ]
        );
        assert!(waiting.is_empty());
    }

    #[test]
    fn while_a_batch_is_in_flight_too_few_free_steps_wait_for_the_next_one() {
        let in_flight: HashSet<RowKey> = rows_of(&appending(&["guard-a"]).0).into_iter().collect();
        let mut waiting = vec![
            appending(&["transfer-1", "guard-a"]),
            appending(&["transfer-2", "guard-b"]),
            appending(&["transfer-3", "guard-c"]),
        ];
        let (batch, rows) = take_free(&mut waiting, &in_flight, 3);
        assert!(batch.is_empty() && rows.is_empty());
        assert_eq!(
            streams(&waiting),
            [
                vec!["transfer-1", "guard-a"],
                vec!["transfer-2", "guard-b"],
                vec!["transfer-3", "guard-c"]
            ],
            "nothing taken, nothing reordered"
        );
        let (batch, _) = take_free(&mut waiting, &in_flight, 2);
        assert_eq!(batch.len(), 2);
        assert_eq!(streams(&waiting), [vec!["transfer-1", "guard-a"]]);
    }

    #[test]
    fn a_key_and_an_inbox_event_are_rows_too() {
        use crate::idempotency::{BodyHash, FreshClaim, IdempotencyKey, Lease, Scope};
        let claiming = |key: &str| Work {
            claim: Some(FreshClaim {
                scope: Scope {
                    tenant: "acme".to_owned(),
                    method: "POST".to_owned(),
                    route: "/v1/transfers".to_owned(),
                },
                key: IdempotencyKey::parse(key).unwrap(),
                body: BodyHash([0; 32]),
                resource_id: "r".to_owned(),
                lease: Lease::new(0, 1_000),
                now_ms: 0,
            }),
            ..Work::default()
        };
        assert_eq!(rows_of(&claiming("k-1")), rows_of(&claiming("k-1")));
        assert_ne!(rows_of(&claiming("k-1")), rows_of(&claiming("k-2")));
    }
}
