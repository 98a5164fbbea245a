//! Group commit's dispatcher: takes the steps requests send, forms batches and writes them one at
//! a time (`super::step::write`).
//!
//! The steps that arrive while a batch is being written wait for it and go together in the next.
//! One writer, on every store. A second batch in flight beside it was measured on PostgreSQL on
//! two-core machines (docs/benchmarks.md): it made more ledger transfers per second on one of them,
//! where a few concurrent requests left a core idle, and fewer on another; in `bench e2e`, whose
//! load keeps both cores busy, it cost CPU per payment and made fewer payments per second, whether
//! its batches took half the steps or only those arriving while another was in flight. Batches
//! that follow one another also never wait for each other's rows.

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures::FutureExt;

use tokio::sync::mpsc;

use super::batch::write;
use super::step::{CommitError, Reply, Work, BATCH_MAX};
use crate::log::Store;

/// How long the dispatcher goes on gathering steps after the first, at most (see [`gather`]).
const GATHER_MAX: Duration = Duration::from_micros(500);
/// Yields in a row that bring no new step, after which the dispatcher stops gathering.
const GATHER_IDLE_YIELDS: u32 = 3;

/// Dispatches the steps `receiver` brings until every sender is gone and every batch is written.
pub(crate) async fn dispatch(store: Store, mut receiver: mpsc::UnboundedReceiver<(Work, Reply)>) {
    let mut batch = Vec::with_capacity(BATCH_MAX);
    while receiver.recv_many(&mut batch, BATCH_MAX).await > 0 {
        gather(&mut receiver, &mut batch).await;
        write_and_answer(&store, std::mem::take(&mut batch)).await;
    }
}

/// Writes `batch` and answers each of its requests. The time this takes is recorded
/// (`asiento_group_commit_write_seconds`): its sum's rate is the share of the time the one writer
/// is busy, which nears 1 when requests queue behind it.
async fn write_and_answer(store: &Store, batch: Vec<(Work, Reply)>) {
    let started = Instant::now();
    metrics::histogram!("asiento_group_commit_batch_size").record(batch.len() as f64);
    let (steps, replies): (Vec<Work>, Vec<Reply>) = batch.into_iter().unzip();
    // A panic fails this batch's requests, not the dispatcher.
    let written = AssertUnwindSafe(write(store, steps)).catch_unwind().await;
    let outcomes = written.unwrap_or_else(|panic| {
        let panic = panic
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic without a message");
        tracing::error!(panic, "a group commit batch panicked; its requests fail");
        (0..replies.len())
            .map(|_| Err(CommitError::Unexpected("the batch panicked".into())))
            .collect()
    });
    for (reply, outcome) in replies.into_iter().zip(outcomes) {
        // A request that gave up is answered nowhere; its step is committed or not as told.
        let _ = reply.send(outcome);
    }
    metrics::histogram!("asiento_group_commit_write_seconds")
        .record(started.elapsed().as_secs_f64());
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
}
