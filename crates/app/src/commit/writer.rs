//! The writer: the one door of the write path, built once per process and handed to every flow.
//!
//! It owns what must exist once per process for the write path: the dispatcher that batches the
//! steps (`super::dispatch`), and the two memories of what this process's own commits left (the
//! guards' states, `super::guard_memory`, and the payments', `super::payment_memory`). Two
//! writers on one store would batch apart and remember apart, so a process builds one and every
//! flow shares it.

use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, oneshot};

use super::guard_memory::GuardMemory;
use super::payment_memory::PaymentMemory;
use super::step::{CommitError, Committed, Reply, Work};
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

    /// The guard states this process's commits left.
    pub fn guards(&self) -> &GuardMemory {
        &self.guards
    }

    /// The payment states this process's commits left.
    pub fn payments(&self) -> &PaymentMemory {
        &self.payments
    }

    /// Writes `step` with whatever other steps are waiting, and answers once that committed.
    pub async fn commit(&self, step: Work) -> Result<Committed, CommitError> {
        let (reply, answer) = oneshot::channel();
        self.queue()
            .send((step, reply))
            .map_err(|_| CommitError::Stopped)?;
        answer.await.map_err(|_| CommitError::Stopped)?
    }

    fn queue(&self) -> &mpsc::UnboundedSender<(Work, Reply)> {
        self.queue.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(super::dispatch::dispatch(self.store.clone(), receiver));
            sender
        })
    }
}
