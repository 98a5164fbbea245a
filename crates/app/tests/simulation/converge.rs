//! The end of a seed: every request still open is retried on a healthy provider, the provider
//! decides all it holds, time runs on past the operation timeouts, the key lifetimes and the
//! pending deadline with the reconciler sweeping, and every final state is delivered (a dark
//! charge's never, so the sweeps and the report must have told). The checks of `checks.rs` run
//! between these stages, so that a failure says which stage left something open.

use asiento_domain::PaymentId;
use asiento_psp::{Charge, Operation};

use super::knobs::{Fault, CLOCK_JUMP_MS_MAX, IDEMPOTENCY_LEASE_MS, OPERATION_PENDING_DEADLINE_MS};
use super::world::{webhook_facts, Sim};

impl Sim {
    /// The end of a seed: every open request is retried, the provider decides all it holds,
    /// time runs on past the operation timeouts, the key lifetimes and the pending deadline with
    /// the reconciler sweeping, and every operation must be closed (or legitimately excepted).
    /// Then every final state is delivered (except a dark charge's: the sweep and the report
    /// must have done it), and the ledger must agree with the provider about every charge and
    /// every operation.
    pub async fn converge(&mut self) -> usize {
        self.step += 1;
        self.note("converge");
        self.advance(IDEMPOTENCY_LEASE_MS + 1_000).await;
        for index in 0..self.requests.len() {
            if !self.requests[index].settled() {
                self.provider.arm(Fault::None);
                let idem = self.requests[index].idem.clone();
                let answer = self.plain_attempt(index, &idem).await;
                self.learn(index, answer);
            }
        }
        self.advance(2 * CLOCK_JUMP_MS_MAX).await;
        // Past every asynchronous decision and reversal, then past the pending deadline and
        // the shortest key lifetime: a sweep after each leap.
        for leap in [3_600_000, OPERATION_PENDING_DEADLINE_MS] {
            self.clock.advance_ms(leap);
            self.provider.tick();
            self.send_new_events().await;
            self.sweep(Fault::None).await;
        }
        self.sweep(Fault::None).await;
        self.check_provider();
        let unresolved = self.check_operations_closed("after the sweeps").await;
        self.deliver_everything().await;
        self.check().await;
        self.check_operations_closed("after every final state")
            .await;
        self.check_agreement().await;
        unresolved
    }

    /// Every charge's final state and every operation's, as webhooks; a dark charge's never.
    async fn deliver_everything(&mut self) {
        let (charges, operations, dark) = {
            let state = self.provider.state.lock().unwrap();
            let operations: Vec<(Operation, Charge)> = state
                .operations
                .iter()
                .map(|record| {
                    let index = state.charge_index(&record.operation.charge).unwrap();
                    (record.operation.clone(), state.charges[index].clone())
                })
                .collect();
            (state.charges.clone(), operations, state.dark.clone())
        };
        for (op, charge) in operations {
            if !dark.contains(&charge.id) {
                let payment = PaymentId::parse(charge.reference.as_deref().unwrap()).unwrap();
                let facts = webhook_facts(&charge, Some(&op));
                self.deliver(payment, &facts, "final operation").await;
            }
        }
        for charge in charges {
            if !dark.contains(&charge.id) {
                let payment = PaymentId::parse(charge.reference.as_deref().unwrap()).unwrap();
                let facts = webhook_facts(&charge, None);
                self.deliver(payment, &facts, "final charge").await;
            }
        }
    }
}
