//! The write path: one door, [`Writer`], built once per process.
//!
//! Every durable step of a request, typed as what it is ([`Step`]: a key's claim with the first
//! events of its work, a payment's provider facts with its key's completion, a ledger command, a
//! webhook's inbox row), is handed to the process's writer ([`Writer::commit`]), which batches
//! the steps waiting at that moment (`dispatch`), plans each batch in batch order (`plan`: the steps an earlier
//! written step overtakes, and provider facts chained onto the steps before them), writes it as
//! one PostgreSQL statement (`statement`) or one transaction (`batch`), and answers each step
//! after the commit, the answer's position filled in (`respond`). It keeps the memories of what
//! its commits left (`guard_memory`, `payment_memory`, both on `latest`), and only it updates
//! them, from each step's outcome; a decision appended in its caller's own transaction goes
//! through it too ([`Writer::append_in`]).
//!
//! The files import in one direction: `writer` → `dispatch` → `batch` → {`plan`, `statement`} →
//! `step` → `respond`; `writer` → the memories (`guard_memory`, `payment_memory`, both on
//! `latest`), which know only `step`'s `GuardWrite`. A batch's outcomes equal its steps applied
//! one at a time, in batch order, to the log as it stood, and every state the memories hold is
//! one the log held (`app/tests/write_model`).

mod batch;
mod dispatch;
pub mod guard_memory;
mod latest;
pub mod payment_memory;
mod plan;
mod respond;
pub mod statement;
mod step;
mod turns;
mod writer;

pub use respond::Respond;
pub use step::{
    Command, CommitError, Committed, Completion, Facts, GuardStates, GuardWrite, Settle, Step,
    Work, BATCH_MAX,
};
pub use turns::Turn;
pub use writer::{Uncommitted, Writer};
