//! The balances read model: the CQRS read side for money.
//!
//! Balances are derived, never stored as truth: the tables here are caches of the log that a
//! rebuild can throw away and refill, and [`verify`] proves they match a full recomputation.
//!
//! - **Exact while lagging.** A balance read takes the snapshot row and the projection's
//!   checkpoint in one statement, then adds the legs of every journal entry the log holds
//!   after that checkpoint (read through the log's gap-free order). The answer is exact up to
//!   the newest event the log can serve, whether the projector is current, behind or stopped.
//! - **Read-your-writes.** With `min_position` (the `position` a command answered), a read waits
//!   (polling, at most [`READ_WAIT_MS_MAX`]) until it includes that event, then fails with
//!   [`BalanceError::ProjectionLagging`] (HTTP 503 `projection_lagging`).
//! - **Accounts** (`/v1/accounts?prefix=`) are listed from the projected balances and declared
//!   policies, as of the projection's checkpoint.
//! - **Legs and entries** (`/v1/accounts/{a}/entries`, `/v1/journal/{id}`) come from the
//!   projected tables only; with `min_position` they wait for the projector's checkpoint.
//! - **The past** (`?at=`, `?at_position=`, `/statement`): from the legs and their marks, a
//!   running sum every `MARK_LEGS` legs, and the log's positions in spans of one transaction
//!   (`at`, `marks`, `spans`).
//!
//! The lead process must call [`install`] once at startup (after migrations) so that the views
//! exist before the first read, and run a [`asiento_projector::Runner`] with [`projection`].

use std::sync::Arc;

use asiento_domain::Balance;
use asiento_eventstore::{Database, StoreError};
use asiento_projector::{Projection, ProjectionError, ProjectorError};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

mod accounts;
mod at;
mod decode;
mod journal;
mod marks;
mod projection;
mod read;
mod spans;
mod verify;

pub use accounts::{list_accounts, AccountPage, AccountQuery, AccountView, ACCOUNTS_LIMIT_MAX};
pub use asiento_projector::READ_WAIT_MS_MAX;
pub use at::{balance_at, statement, Point, Statement, StatementLine, StatementQuery};
pub use journal::{journal, JournalCursor, JournalPage, JournalQuery, JOURNAL_LIMIT_MAX};
pub use marks::{verify_marks, MarkMismatch, MARK_LEGS};
pub use projection::{
    Balances, LedgerEntries, ENTRIES_FINGERPRINT, ENTRIES_NAME, FINGERPRINT, NAME,
};
pub use read::{entries, journal_entry, read_balance, ENTRIES_LIMIT_MAX, TAIL_EVENTS_MAX};
pub use spans::{verify_spans, verify_spans_in_pages, SpanMismatch};
pub use verify::{recompute_all, snapshot_all, verify, BalanceMismatch};

/// The balances projection, for a [`asiento_projector::Runner`] or a rebuild.
pub fn projection() -> Arc<dyn Projection> {
    Arc::new(Balances)
}

/// The legs-and-journal-entries projection (`/entries`, `/journal`), rebuilt on its own.
pub fn entries_projection() -> Arc<dyn Projection> {
    Arc::new(LedgerEntries)
}

/// Registers both projections and creates their views if this database has none yet.
pub async fn install(db: &Database) -> Result<(), ProjectorError> {
    asiento_projector::install(db, &Balances).await?;
    asiento_projector::install(db, &LedgerEntries).await
}

/// Which balance: money is kept per tenant, account and currency.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BalanceKey {
    pub tenant: String,
    pub account: String,
    pub currency: String,
}

/// `GET /v1/accounts/{account}/balance`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountBalance {
    /// The posted balance.
    pub balance_minor: Balance,
    /// Reserved to leave the account by open holds (the negated balance of its
    /// `pending_debits:` account).
    pub pending_debits_minor: Balance,
    /// Reserved to reach the account by open holds (the balance of its `pending_credits:`
    /// account).
    pub pending_credits_minor: Balance,
    /// The position of the newest event (in commit order) the balance includes; 0 for an empty
    /// log. Passing it back as `min_position` never waits.
    pub as_of_position: i64,
}

impl AccountBalance {
    /// The balance from the sums of the account and of its two pending accounts (debits, then
    /// credits), read after the event at `position`.
    pub(crate) fn of_sums(
        sums: [Balance; 3],
        position: i64,
    ) -> Result<AccountBalance, BalanceError> {
        let [balance, pending_debits, pending_credits] = sums;
        // Money reserved to leave sits as a negative balance on `pending_debits:`.
        let pending_debits =
            pending_debits
                .checked_neg()
                .map_err(|_| ProjectionError::Malformed {
                    position,
                    reason: "pending debits overflow i128".to_owned(),
                })?;
        Ok(AccountBalance {
            balance_minor: balance,
            pending_debits_minor: pending_debits,
            pending_credits_minor: pending_credits,
            as_of_position: position,
        })
    }
}

/// One leg of a journal entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LegView {
    pub account: String,
    pub currency: String,
    pub amount_minor: i64,
}

/// One line of `GET /v1/accounts/{account}/entries`: a leg on the account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountLeg {
    pub entry_id: String,
    pub amount_minor: i64,
    /// The log position of the `EntryPosted` event; the `after` of the next page.
    pub position: i64,
    pub recorded_at: DateTime<Utc>,
}

/// `GET /v1/journal/{entry_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntryView {
    pub entry_id: String,
    pub tenant: String,
    pub position: i64,
    /// The entry this one reverses, if it is a correction.
    pub reverses: Option<String>,
    pub legs: Vec<LegView>,
    pub recorded_at: DateTime<Utc>,
    /// The stream whose event posted it: `payment-pay_…`, `transfer-tr_…`, `payout-…`.
    pub source: String,
    /// What the merchant wrote of the transfer it posts, if anything.
    pub description: Option<String>,
}

/// Why a read of the balances read model failed.
#[derive(Debug, thiserror::Error)]
pub enum BalanceError {
    /// The read could not include `min_position` in time (HTTP 503 `projection_lagging`), or
    /// the unprojected tail is longer than [`TAIL_EVENTS_MAX`].
    #[error("the balances projection is lagging (waited {waited_ms} ms)")]
    ProjectionLagging { waited_ms: u64 },
    /// `after` names no committed event (HTTP 400).
    #[error("no event at position {position}")]
    UnknownPosition { position: i64 },
    /// A page cursor that no page gave out (HTTP 400).
    #[error("the cursor is not one a page gave out")]
    InvalidCursor,
    /// [`install`] was never called on this database.
    #[error("the balances projection is not installed")]
    NotInstalled,
    /// A journal entry in the log cannot be read (a bug upstream; ours, HTTP 500).
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}
