//! The writer: the one door of the write path, built once per process and handed to every flow.
//!
//! It owns what must exist once per process for the write path: the dispatcher that batches the
//! steps (`super::dispatch`), and the two memories of what this process's own commits left (the
//! guards' states, `super::guard_memory`, and the payments', `super::payment_memory`). Two
//! writers on one store would batch apart and remember apart, so a process builds one and every
//! flow shares it.
//!
//! The memories learn only here, from each step's outcome ([`Writer::learn`]): a step written
//! leaves its guards and its payment in the states it computed (or, rebased, in the states the
//! batch tells); a step not written, whatever the reason, makes the memory drop the guard states
//! it was decided against, unless a later one was remembered since (`GuardMemory::lost_race`).
//! Flows only read them.

use std::sync::{Arc, OnceLock};

use asiento_domain::{Payment, PaymentId};
use asiento_eventstore::{AppendError, Appended, StreamAppend, Tx};
use tokio::sync::{mpsc, oneshot};

use super::guard_memory::GuardMemory;
use super::payment_memory::PaymentMemory;
use super::step::{CommitError, Committed, GuardWrite, Lesson, Reply, Step, Work};
use crate::log::Store;

/// The write path of one store: its dispatcher, started on first use, and the memories of what
/// its commits left. Shared as an `Arc`.
pub struct Writer {
    store: Store,
    queue: OnceLock<mpsc::UnboundedSender<(Work, Reply)>>,
    guards: GuardMemory,
    payments: PaymentMemory,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

impl Writer {
    pub fn new(store: Store) -> Arc<Writer> {
        Arc::new(Writer {
            store,
            queue: OnceLock::new(),
            guards: GuardMemory::default(),
            payments: PaymentMemory::default(),
        })
    }

    /// The store it writes to: the flows that commit through it read from the same.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The guard states this process's commits left.
    pub fn guards(&self) -> &GuardMemory {
        &self.guards
    }

    /// The payment states this process's commits left.
    pub fn payments(&self) -> &PaymentMemory {
        &self.payments
    }

    /// Writes `step` with whatever other steps are waiting, and answers once that committed;
    /// the memories have learnt its outcome by then. While a step is written, this process's
    /// commands on its guards wait for it (`GuardMemory::load_after_writes`).
    pub async fn commit(&self, step: Step) -> Result<Committed, CommitError> {
        let (work, lesson) = step.into_parts();
        let _writing = self.guards.writing(
            lesson
                .guards
                .appends
                .iter()
                .map(|append| append.key.clone()),
        );
        let (reply, answer) = oneshot::channel();
        self.queue()
            .send((work, reply))
            .map_err(|_| CommitError::Stopped)?;
        let outcome = answer.await.map_err(|_| CommitError::Stopped)?;
        self.learn(&lesson, outcome.as_ref().ok());
        outcome
    }

    /// Appends a decision's events inside its caller's transaction, beside work of the caller's
    /// own that must commit with them (the webhook worker marks its inbox row processed in the
    /// same transaction), or for a key that exists (claimed in that transaction). The memories
    /// learn from it once the caller tells that the transaction committed
    /// ([`Uncommitted::committed`]); a lost race or a transaction dropped uncommitted teaches
    /// them as a step not written does.
    pub async fn append_in(
        &self,
        tx: &mut Tx,
        appends: &[StreamAppend],
        guards: GuardWrite,
        payment: Option<(PaymentId, Payment)>,
    ) -> Result<(Option<Appended>, Uncommitted<'_>), AppendError> {
        let pending = Uncommitted {
            writer: self,
            lesson: Some(Lesson { guards, payment }),
        };
        if appends.is_empty() {
            return Ok((None, pending));
        }
        // On an error `pending` is dropped: learnt as not written.
        let appended = self.store.append_in(tx, appends).await?;
        Ok((Some(appended), pending))
    }

    /// What the memories learn from a step's outcome (`None`: it failed, and may or may not have
    /// been written).
    fn learn(&self, lesson: &Lesson, outcome: Option<&Committed>) {
        match outcome {
            Some(Committed::Written(_)) => {
                self.guards.wrote(&lesson.guards);
                if let Some((id, payment)) = &lesson.payment {
                    self.payments.remember(*id, payment);
                }
            }
            Some(Committed::Rebased(_, states)) => {
                self.guards.remember(states);
                if let Some((id, payment)) = &lesson.payment {
                    self.payments.remember(*id, payment);
                }
            }
            _ => self.guards.lost_race(&lesson.guards.read),
        }
    }

    fn queue(&self) -> &mpsc::UnboundedSender<(Work, Reply)> {
        self.queue.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(super::dispatch::dispatch(self.store.clone(), receiver));
            sender
        })
    }
}

/// A decision appended inside its caller's transaction ([`Writer::append_in`]), not yet known to
/// be committed.
#[must_use = "the memories learn a committed decision only when told"]
pub struct Uncommitted<'w> {
    writer: &'w Writer,
    lesson: Option<Lesson>,
}

impl Uncommitted<'_> {
    /// The caller's transaction committed: the memories learn what the decision left.
    pub fn committed(mut self) {
        if let Some(lesson) = self.lesson.take() {
            self.writer.learn(&lesson, Some(&Committed::Written(None)));
        }
    }
}

impl Drop for Uncommitted<'_> {
    fn drop(&mut self) {
        if let Some(lesson) = self.lesson.take() {
            self.writer.learn(&lesson, None);
        }
    }
}
