//! Atomic batches of transfers: up to [`BATCH_TRANSFERS_MAX`] transfers (holds included),
//! decided in batch order, each against the guard states the ones before it leave, and written
//! all or none. One refused (a policy, a frozen account, funds an earlier transfer of the batch
//! spent) refuses the batch, naming the first that is.
//!
//! The decision is exactly the transfers decided one at a time ([`decide_with_guards`]), each on
//! what the earlier ones leave; what it adds is the merge: a guard that several transfers move
//! gets one append, expecting the version read, with their events in batch order, so that the
//! whole batch is one atomic append with every stream at its exact expected version.

use std::collections::BTreeMap;

use crate::guard::{evolve, DebitGuard, GuardAppend, GuardKey};
use crate::transfer::{decide_with_guards, RequestTransfer, Transfer, TransferEvent};
use crate::TransferRejection;

/// The most transfers one batch may hold.
pub const BATCH_TRANSFERS_MAX: usize = 100;

/// What a batch appends: each transfer's events, in batch order, and one append per guard moved.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct BatchDecision {
    pub transfers: Vec<Vec<TransferEvent>>,
    pub guards: Vec<GuardAppend>,
}

/// The first transfer of a batch that is refused, and why: nothing of the batch is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("transfer {index} of the batch: {rejection}")]
pub struct BatchRejection {
    /// 0-based, in the order the batch lists its transfers.
    pub index: usize,
    pub rejection: TransferRejection,
}

/// Decides `requests` in order against `guards`, the states read of every guard their entries
/// touch.
pub fn decide_batch(
    requests: Vec<RequestTransfer>,
    guards: &BTreeMap<GuardKey, DebitGuard>,
) -> Result<BatchDecision, BatchRejection> {
    let mut states = guards.clone();
    let mut merged: Vec<GuardAppend> = Vec::new();
    let mut transfers = Vec::with_capacity(requests.len());
    for (index, request) in requests.into_iter().enumerate() {
        let decision = decide_with_guards(&Transfer::default(), request, &states)
            .map_err(|rejection| BatchRejection { index, rejection })?;
        for append in decision.guards {
            let state = states.get(&append.key).copied().unwrap_or_default();
            assert_eq!(
                state.version, append.expected_version,
                "a transfer's guard append expects the state it was decided on"
            );
            let after = append.events.iter().fold(state, evolve);
            states.insert(append.key.clone(), after);
            match merged.iter_mut().find(|m| m.key == append.key) {
                Some(earlier) => earlier.events.extend(append.events),
                None => merged.push(append),
            }
        }
        transfers.push(decision.events);
    }
    Ok(BatchDecision {
        transfers,
        guards: merged,
    })
}

#[cfg(test)]
mod tests {
    use chrono::DateTime;

    use super::*;
    use crate::guard::GuardRejection;
    use crate::{AccountName, Amount, Currency, TenantId, TransferId};

    fn key(account: &str) -> GuardKey {
        GuardKey {
            tenant: TenantId::parse("t").unwrap(),
            account: AccountName::parse(account).unwrap(),
            currency: Currency::parse("USD").unwrap(),
        }
    }

    fn transfer(n: u128, from: &str, to: &str, amount: i64, pending: bool) -> RequestTransfer {
        RequestTransfer {
            id: TransferId::from_uuid(uuid::Uuid::from_u128(n)),
            tenant: TenantId::parse("t").unwrap(),
            from: AccountName::parse(from).unwrap(),
            to: AccountName::parse(to).unwrap(),
            amount: Amount::new(amount),
            currency: Currency::parse("USD").unwrap(),
            description: None,
            pending,
            expires_at: None,
            at: DateTime::from_timestamp(1_764_000_000, 0).unwrap(),
        }
    }

    /// Customer 1 holds 500; customer 2 and the shop nothing.
    fn funded() -> BTreeMap<GuardKey, DebitGuard> {
        let funded = DebitGuard {
            version: 4,
            balance: Amount::new(500),
            ..DebitGuard::default()
        };
        BTreeMap::from([
            (key("customer:1:available"), funded),
            (key("customer:2:available"), DebitGuard::default()),
            (key("merchant:shop"), DebitGuard::default()),
        ])
    }

    #[test]
    fn a_batch_is_its_transfers_one_at_a_time_with_one_append_per_guard() {
        let requests = vec![
            transfer(1, "customer:1:available", "merchant:shop", 200, false),
            transfer(2, "customer:1:available", "customer:2:available", 100, true),
            transfer(3, "customer:2:available", "merchant:shop", 50, false),
        ];
        // The second transfer refuses no funds the first spent; the third is funded by nothing
        // the batch gave (a hold credits only on its post), so customer 2 must not go below zero.
        let refused = decide_batch(requests.clone(), &funded()).unwrap_err();
        assert_eq!(refused.index, 2);
        assert!(matches!(
            refused.rejection,
            TransferRejection::Guard(GuardRejection::InsufficientFunds { .. })
        ));

        let requests: Vec<_> = requests.into_iter().take(2).collect();
        let batch = decide_batch(requests.clone(), &funded()).unwrap();
        // One at a time, each on what the one before leaves.
        let mut states = funded();
        let mut one_by_one = Vec::new();
        for request in requests {
            let decision = decide_with_guards(&Transfer::default(), request, &states).unwrap();
            for append in &decision.guards {
                let state = states.get(&append.key).copied().unwrap_or_default();
                states.insert(append.key.clone(), append.events.iter().fold(state, evolve));
            }
            one_by_one.push(decision);
        }
        assert_eq!(
            batch.transfers,
            one_by_one
                .iter()
                .map(|d| d.events.clone())
                .collect::<Vec<_>>()
        );
        // The customer's guard moved twice: one append from the version read, both changes.
        let customer = key("customer:1:available");
        let appends: Vec<&GuardAppend> =
            batch.guards.iter().filter(|g| g.key == customer).collect();
        assert_eq!(appends.len(), 1);
        assert_eq!(appends[0].expected_version, 4);
        let after = appends[0].events.iter().fold(funded()[&customer], evolve);
        assert_eq!(after, states[&customer]);
        assert_eq!(after.balance, Amount::new(300));
        assert_eq!(after.pending_debits, Amount::new(100));
    }
}
