//! The payment states this process's own commits left, so that the webhook worker can tell that
//! a provider event is already reflected without reading the payment's stream.
//!
//! Under load nearly every webhook reports what the synchronous answer already recorded a moment
//! before, in this process: reading the whole stream back to learn that was the worker's largest
//! read (docs/benchmarks.md).
//!
//! **Why a remembered state is enough.** It is a state the log really held: it is remembered only
//! after its commit. And provider facts only add to a payment, so what an earlier state reflects,
//! every later state does too (the rule `finalize` and the worker's batched mark already rest on,
//! ARCHITECTURE.md). A remembered state that does not reflect an event proves nothing (it may be
//! stale), and the worker then reads the log as it always did: a stale memory costs a read, never
//! a wrong answer. The memory is bounded: at [`PAYMENTS_MAX`] payments, remembering another forgets
//! the one remembered longest ago.

use asiento_domain::{Payment, PaymentId};

use super::latest::Latest;

/// Payments remembered at most; past that the one remembered longest ago is forgotten. A webhook
/// usually follows its payment's commit within a second, so this covers many seconds of a busy
/// process.
pub const PAYMENTS_MAX: usize = 16_384;

/// See the module docs. Cheap to clone; clones share one memory.
#[derive(Clone, Debug, Default)]
pub struct PaymentMemory {
    states: Latest<PaymentId, Payment, PAYMENTS_MAX>,
}

impl PaymentMemory {
    /// `payment` was committed: remember it, unless a later state of it is remembered already.
    pub fn remember(&self, id: PaymentId, payment: &Payment) {
        self.states.remember(&id, payment);
    }

    /// The latest state of `id` this process committed, if it still remembers one.
    pub fn recall(&self, id: PaymentId) -> Option<Payment> {
        self.states.recall(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn at(version: u64) -> Payment {
        Payment {
            version,
            record: None,
        }
    }

    #[test]
    fn keeps_the_latest_state_and_forgets_the_oldest_when_full() {
        let memory = PaymentMemory::default();
        let id = PaymentId::from_uuid(Uuid::from_u128(1));
        assert_eq!(memory.recall(id), None);
        memory.remember(id, &at(3));
        memory.remember(id, &at(2));
        assert_eq!(memory.recall(id).map(|p| p.version), Some(3));
        memory.remember(id, &at(5));
        assert_eq!(memory.recall(id).map(|p| p.version), Some(5));
        for n in 2..=PAYMENTS_MAX as u128 {
            memory.remember(PaymentId::from_uuid(Uuid::from_u128(n)), &at(1));
        }
        assert_eq!(
            memory.recall(id).map(|p| p.version),
            Some(5),
            "full, not over"
        );
        memory.remember(PaymentId::from_uuid(Uuid::from_u128(0)), &at(1));
        assert_eq!(
            memory.recall(id),
            None,
            "over the bound: the oldest is forgotten"
        );
        let second = PaymentId::from_uuid(Uuid::from_u128(2));
        assert_eq!(memory.recall(second).map(|p| p.version), Some(1));
    }
}
