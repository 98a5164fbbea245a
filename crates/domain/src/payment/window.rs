//! A payment as a read model keeps it between batches, so that the cost of folding an event does
//! not grow with the stream.
//!
//! A payment's operations grow by one with every capture, refund and cancel asked, and a read
//! model that stored them all in its fold would read and write the whole list at every event:
//! the 200th refund of a payment would cost 200 times its first. But `evolve` reads few of them:
//! its amounts and status never read the list at all, an event about one operation reads that
//! operation, a capture's fact and a refund settlement naming no operation read the open ones
//! (what settled refunds account for is a sum the record keeps), and only a cancel's end is told
//! with a count of them all ([`PaymentEvent::operations_read`]). So:
//!
//! - a read model that shows no operation folds [`evolve_without_operations`];
//! - one that shows them keeps a [`PaymentWindow`]: the payment with its recent operations, the
//!   older ones archived (a row each, written once when they leave the window) and loaded back
//!   only for a batch whose events read them.
//!
//! Both are pinned against `evolve` of the whole stream by `tests/properties.rs`
//! (`windows_and_folds_without_operations_equal_the_whole_fold`).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::{evolve, Operation, OperationKind, Payment, PaymentEvent};
use crate::money::Amount;

/// How many of its latest operations a window keeps; also how many a merchant event's payment
/// object lists (docs/API.md "Events").
pub const RECENT_OPERATIONS: usize = 10;

/// Which of a payment's operations `evolve` reads to apply an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationsRead {
    /// None (it only appends one, or leaves them alone).
    None,
    /// The operation of this kind and sequence.
    One(OperationKind, u32),
    /// The open ones: a capture's fact ends every open capture, a settlement naming no refund is
    /// attributed to the open refunds.
    Open,
    /// All of them: a cancel's end is told with the last cancel asked.
    All,
}

impl PaymentEvent {
    /// Which operations `evolve` (and the merchant event it tells) reads to apply this event.
    #[must_use]
    pub fn operations_read(&self) -> OperationsRead {
        use OperationsRead::{All, One, Open};
        match self {
            PaymentEvent::ChargeCaptured(_) => Open,
            PaymentEvent::PaymentCanceled(_) => All,
            PaymentEvent::RefundSettled(e) => match e.sequence {
                Some(sequence) => One(OperationKind::Refund, sequence),
                None => Open,
            },
            PaymentEvent::CancelSucceeded(e) => One(OperationKind::Cancel, e.sequence),
            PaymentEvent::OperationReceived(e) => One(e.kind, e.sequence),
            PaymentEvent::OperationAnswered(e) => One(e.kind, e.sequence),
            PaymentEvent::OperationIdentified(e) => One(e.kind, e.sequence),
            PaymentEvent::OperationRefused(e) => One(e.kind, e.sequence),
            PaymentEvent::CaptureReversed(e) => One(OperationKind::Capture, e.sequence),
            PaymentEvent::RefundReversed(e) => One(OperationKind::Refund, e.sequence),
            PaymentEvent::PaymentIntended(_)
            | PaymentEvent::ChargeRequested(_)
            | PaymentEvent::ActionRequired(_)
            | PaymentEvent::ChargeAuthorized(_)
            | PaymentEvent::CaptureRequested(_)
            | PaymentEvent::ChargeFailed(_)
            | PaymentEvent::AuthorizationEnded(_)
            | PaymentEvent::PaymentExpired(_)
            | PaymentEvent::CancelRequested(_)
            | PaymentEvent::RefundRequested(_)
            | PaymentEvent::DisputeOpened(_)
            | PaymentEvent::DisputeClosed(_)
            | PaymentEvent::ProviderFeeCharged(_)
            | PaymentEvent::FlaggedForReview(_)
            | PaymentEvent::EntryPosted(_) => OperationsRead::None,
        }
    }
}

/// `evolve`, for a read model that shows none of a payment's operations: the payment it gives
/// has none (nor their sum, `operations_refunded`), and every other field is what `evolve` of
/// the whole stream gives.
#[must_use]
pub fn evolve_without_operations(payment: Payment, event: &PaymentEvent) -> Payment {
    let mut payment = evolve(payment, event);
    if let Some(record) = payment.record.as_mut() {
        record.operations.clear();
        record.operations_refunded = Amount::ZERO;
    }
    payment
}

/// An archived operation: its place in the payment's list (0-based) and what it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchivedOperation {
    pub index: u32,
    pub operation: Operation,
}

/// What a batch must load from a payment's archive before folding its events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveNeed {
    /// Nothing: the window holds every operation the events read.
    Nothing,
    /// The archived operations named (by kind and sequence: one that is not archived is simply
    /// not found), and the open ones if `open`.
    Some {
        named: BTreeSet<(OperationKind, u32)>,
        open: bool,
    },
    /// Every archived operation.
    All,
}

/// A payment whose operations before `archived` live in an archive: `payment`'s list holds the
/// operations from index `archived` on, preceded, during a batch, by the archived ones loaded
/// back for it (`loaded`: their indices and what they were). Stored between batches with
/// nothing loaded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PaymentWindow {
    pub payment: Payment,
    /// How many of the payment's first operations are archived.
    pub archived: u32,
    /// How many of the archived ones are open (when none, a fact that reads the open operations
    /// finds them all in the window).
    #[serde(default)]
    pub archived_open: u32,
    /// The operations at the front of the list, loaded for this batch, as loaded.
    #[serde(skip)]
    loaded: Vec<ArchivedOperation>,
}

impl PaymentWindow {
    /// What to load before folding `events` (in order) onto this window.
    #[must_use]
    pub fn needs<'a>(&self, events: impl IntoIterator<Item = &'a PaymentEvent>) -> ArchiveNeed {
        if self.archived == 0 {
            return ArchiveNeed::Nothing;
        }
        let held = |kind: OperationKind, sequence: u32| {
            self.payment.record.as_ref().is_some_and(|record| {
                record
                    .operations
                    .iter()
                    .any(|op| op.kind == kind && op.sequence == sequence)
            })
        };
        let (mut named, mut open) = (BTreeSet::new(), false);
        for event in events {
            match event.operations_read() {
                OperationsRead::None => {}
                OperationsRead::One(kind, sequence) => {
                    if !held(kind, sequence) {
                        named.insert((kind, sequence));
                    }
                }
                OperationsRead::Open => open = self.archived_open > 0,
                OperationsRead::All => return ArchiveNeed::All,
            }
        }
        if named.is_empty() && !open {
            ArchiveNeed::Nothing
        } else {
            ArchiveNeed::Some { named, open }
        }
    }

    /// Puts archived operations back in front of the list, in archive order, for this batch
    /// (what [`PaymentWindow::needs`] asked for, as the archive has them).
    pub fn load(&mut self, mut operations: Vec<ArchivedOperation>) {
        assert!(
            self.loaded.is_empty(),
            "a window is loaded once per batch, then archived"
        );
        operations.sort_by_key(|archived| archived.index);
        operations.dedup_by_key(|archived| archived.index);
        assert!(
            operations.iter().all(|a| a.index < self.archived),
            "an archived operation's index is below the window's start"
        );
        let Some(record) = self.payment.record.as_mut() else {
            assert!(
                operations.is_empty(),
                "operations of a payment not intended"
            );
            return;
        };
        let recent = std::mem::take(&mut record.operations);
        record.operations = operations
            .iter()
            .map(|archived| archived.operation.clone())
            .chain(recent)
            .collect();
        self.loaded = operations;
    }

    /// Folds the next event (what it reads must have been loaded).
    #[must_use]
    pub fn evolve(mut self, event: &PaymentEvent) -> PaymentWindow {
        self.payment = evolve(self.payment, event);
        self
    }

    /// How many operations the payment has.
    #[must_use]
    pub fn total(&self) -> u32 {
        let held = self
            .payment
            .record
            .as_ref()
            .map_or(0, |record| record.operations.len() - self.loaded.len());
        self.archived + u32::try_from(held).unwrap_or(u32::MAX)
    }

    /// The payment's last `RECENT_OPERATIONS` operations, oldest first (every one, if it has
    /// fewer). Whatever was loaded, the window always holds them.
    #[must_use]
    pub fn recent(&self) -> &[Operation] {
        let Some(record) = self.payment.record.as_ref() else {
            return &[];
        };
        let held = &record.operations[self.loaded.len()..];
        let listed = RECENT_OPERATIONS.min(self.total() as usize);
        assert!(
            held.len() >= listed,
            "a window holds its payment's {listed} latest operations"
        );
        &held[held.len() - listed..]
    }

    /// Ends a batch: the loaded operations go back to the archive, and the oldest ones beyond the
    /// latest `keep` join them. Gives the archive rows to write (each replaces the row of its
    /// index, if any): those that left the window, and the loaded ones the batch changed.
    #[must_use]
    pub fn archive(&mut self, keep: usize) -> Vec<ArchivedOperation> {
        let loaded = std::mem::take(&mut self.loaded);
        let Some(record) = self.payment.record.as_mut() else {
            return Vec::new();
        };
        let beyond = record.operations.len().saturating_sub(loaded.len() + keep);
        let leaving = loaded.len() + beyond;
        let mut rows: Vec<ArchivedOperation> = Vec::new();
        let (mut opened, mut closed) = (0u32, 0u32);
        for (at, operation) in record.operations.drain(..leaving).enumerate() {
            opened += u32::from(operation.state.is_open());
            match loaded.get(at) {
                Some(was) => {
                    closed += u32::from(was.operation.state.is_open());
                    if was.operation != operation {
                        rows.push(ArchivedOperation {
                            index: was.index,
                            operation,
                        });
                    }
                }
                None => rows.push(ArchivedOperation {
                    index: self.archived + u32::try_from(at - loaded.len()).unwrap_or(u32::MAX),
                    operation,
                }),
            }
        }
        self.archived_open = (self.archived_open + opened)
            .checked_sub(closed)
            .unwrap_or_else(|| unreachable!("the loaded open operations were counted archived"));
        self.archived += u32::try_from(beyond).unwrap_or(u32::MAX);
        rows
    }

    /// The whole payment: the window's operations after the archive's, which must hold exactly
    /// the indices before the window's. For a checker comparing a stored window with the log.
    pub fn assemble(&self, mut archive: Vec<ArchivedOperation>) -> Result<Payment, String> {
        archive.sort_by_key(|row| row.index);
        let indices: Vec<u32> = archive.iter().map(|row| row.index).collect();
        if indices != (0..self.archived).collect::<Vec<u32>>() || !self.loaded.is_empty() {
            return Err(format!(
                "the archive holds operations {indices:?}, the window starts at {}",
                self.archived
            ));
        }
        let open = archive
            .iter()
            .filter(|row| row.operation.state.is_open())
            .count();
        if open != self.archived_open as usize {
            return Err(format!(
                "the archive holds {open} open operations, the window counts {}",
                self.archived_open
            ));
        }
        let mut payment = self.payment.clone();
        match payment.record.as_mut() {
            Some(record) => {
                let recent = std::mem::take(&mut record.operations);
                record.operations = archive
                    .into_iter()
                    .map(|row| row.operation)
                    .chain(recent)
                    .collect();
            }
            None if self.archived > 0 => return Err("operations of no payment".into()),
            None => {}
        }
        Ok(payment)
    }
}
