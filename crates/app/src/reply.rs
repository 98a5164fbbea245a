//! What a command answers, before it is HTTP. The use cases decide *what* to answer; the API crate
//! decides how it looks (`Render`). Rendering happens inside the command's last transaction,
//! because the rendered bytes are what the idempotency record stores and replays: the first answer
//! and every replay are the same bytes by construction.

use asiento_domain::guard::{AccountDeclared, GuardKey};
use asiento_domain::transfer::TransferRecord;
use asiento_domain::{
    GuardRejection, HoldRejection, PaymentId, PaymentRecord, PaymentRejection, TransferRejection,
};

use crate::idempotency::StoredResponse;

/// A business rejection of a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejected {
    Payment(PaymentRejection),
    Transfer(TransferRejection),
    Hold(HoldRejection),
    Guard(GuardRejection),
    /// The first transfer of a batch that is refused (0-based), and why: nothing was written.
    Batch {
        index: usize,
        rejection: Box<Rejected>,
    },
}

/// The state a command leaves behind, to be rendered.
/// Which command a payment reply answers: it decides the status code of a settled answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentCommandKind {
    Create,
    /// A capture answers the state of its own operation, the one with this sequence.
    Capture {
        sequence: u32,
    },
    /// A refund answers the state of its own operation, the one with this sequence.
    Refund {
        sequence: u32,
    },
    /// A cancel answers the state of its own operation, the one with this sequence.
    Cancel {
        sequence: u32,
    },
    /// A read, or a fact applied by a worker.
    Read,
}

#[derive(Debug, Clone)]
pub enum Reply<'a> {
    Payment {
        kind: PaymentCommandKind,
        payment: &'a PaymentRecord,
        /// The global position of the last event the command wrote: a read-your-writes token.
        position: i64,
    },
    /// A transfer as a command left it; `created`: the command requested it (a hold's post or
    /// void answers the transfer it ended).
    Transfer {
        transfer: &'a TransferRecord,
        created: bool,
        position: i64,
    },
    /// A batch of transfers, all written (201), in the batch's order.
    TransferBatch {
        transfers: &'a [TransferRecord],
        position: i64,
    },
    /// An account declaration; `created`: the first one for this account and currency.
    Account {
        key: &'a GuardKey,
        declared: &'a AccountDeclared,
        created: bool,
        position: i64,
    },
    /// A balance monitor its creation left (201).
    Monitor {
        created: &'a asiento_domain::monitor::MonitorCreated,
        deleted_at: Option<&'a chrono::DateTime<chrono::Utc>>,
        position: i64,
    },
    Rejected(Rejected),
}

/// Renders replies as stored responses (status and exact body bytes).
pub trait Render: Send + Sync {
    fn render(&self, reply: &Reply<'_>) -> StoredResponse;

    /// `stored`, when it is a payment answer that carries a `next_action`: which payment, and the
    /// same answer without it. A replay hands a `next_action` out only while its payment is still
    /// `requires_action` (`crate::replay`), and only the renderer knows where it sits in the
    /// bytes. The default finds none: for renderers that never render one.
    fn next_action_in(&self, stored: &StoredResponse) -> Option<NextActionIn> {
        let _ = stored;
        None
    }
}

/// A stored payment answer that carries a `next_action` (see [`Render::next_action_in`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextActionIn {
    /// The payment the answer is about.
    pub payment: PaymentId,
    /// The same status and body with no `next_action`.
    pub without: StoredResponse,
}

/// How a command ended, for the HTTP layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// This request did the work (or stored its rejection); answer with it.
    Done(StoredResponse),
    /// An earlier request with the same key and body did; replay its answer.
    Replayed(StoredResponse),
    /// Another request holds the key.
    InProgress { retry_after_s: u64 },
    /// The key was used with another body.
    KeyReused,
}
