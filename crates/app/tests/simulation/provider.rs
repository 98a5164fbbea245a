//! The simulated provider's memory and its own behaviour: the charges and captures and refunds
//! it holds, the keys it remembers (one charge per key ever, one capture or refund per key while
//! the key lives), the asynchronous decisions and late reversals it runs as the clock moves
//! (`tick`), the fault armed for its next write (which may crash the process mid-call), and what
//! people do at the provider without us: a customer finishing a redirect, a refund in the
//! dashboard, a cardholder's dispute and its outcome. Its behaviour comes from the seed's
//! `Profile`, and its own draws come from a generator apart from the simulation's, so a seed
//! replays. What each call of the `Provider` trait does is in `provider_api.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use asiento_app::clock::{Clock, ManualClock};
use asiento_psp::{
    Charge, ChargeStatus, Dispute, DisputeStatus, Operation, OperationAnswer, OperationKind,
    OperationStatus, ProviderError, ProviderFee, ProviderRequest, Rejection,
};
use asiento_testkit::Rng;
use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use super::knobs::{Fault, Profile};

/// A capture or refund the provider holds, and what it will do with it later.
pub struct OpRecord {
    pub operation: Operation,
    /// When a pending operation is decided, and whether it then fails.
    decide_at_ms: Option<i64>,
    decide_fails: bool,
    /// When a succeeded refund fails.
    reverse_at_ms: Option<i64>,
}

/// The first answer under a key, replayed while the key lives.
pub struct KeyRecord {
    pub answer: Result<OperationAnswer, ProviderError>,
    born_ms: i64,
}

/// An `operation.updated` event: the operation and its charge right after the change.
#[derive(Clone)]
pub struct OperationEvent {
    pub operation: Operation,
    pub charge: Charge,
}

pub struct ProviderState {
    pub profile: Profile,
    /// The provider's own draws (reversals, failed decisions), apart from the simulation's.
    rng: Rng,
    /// In creation order, so that iterating never depends on random ids.
    pub charges: Vec<Charge>,
    pub by_key: HashMap<String, usize>,
    pub by_id: HashMap<String, usize>,
    /// Captures and refunds in creation order.
    pub operations: Vec<OpRecord>,
    /// Capture and refund keys.
    pub keys: HashMap<String, KeyRecord>,
    /// Every state every charge passed through, for stale and repeated webhooks.
    pub history: Vec<Charge>,
    /// Every `operation.updated` the provider sent.
    pub events: Vec<OperationEvent>,
    /// How many of `events` the simulation has delivered (or dropped) promptly.
    pub events_sent: usize,
    /// Charges whose dispute's webhooks (and every later one) are dropped.
    pub dark: HashSet<String>,
    /// Charges refunded in the dashboard.
    pub out_of_band: HashSet<String>,
    /// Armed for the next write, then back to `None`.
    fault: Fault,
    /// The next lookup answers `Unknown`.
    lookup_fails: bool,
    /// What the provider did, for the summary.
    pub refusals: u64,
    pub reversals: u64,
    pub disputes: u64,
}

/// A provider in memory: one charge per idempotency key, ever; one capture or refund per key
/// while the key lives; faults armed by the simulation; behaviour from the seed's profile.
pub struct SimProvider {
    pub state: Mutex<ProviderState>,
    pub clock: Arc<ManualClock>,
    crash: Arc<Notify>,
}

pub fn unknown(reason: &str) -> ProviderError {
    ProviderError::Unknown {
        reason: reason.to_owned(),
    }
}

fn rejection(code: &str) -> Rejection {
    Rejection {
        status: 400,
        code: code.to_owned(),
        message: code.to_owned(),
    }
}

pub fn rejected(code: &str) -> ProviderError {
    ProviderError::Rejected(rejection(code))
}

pub fn unsupported(what: &str) -> ProviderError {
    ProviderError::Unsupported {
        what: what.to_owned(),
    }
}

impl ProviderState {
    pub fn charge_index(&self, charge_id: &str) -> Option<usize> {
        self.by_id.get(charge_id).copied()
    }

    /// The charge changed: stamp it and keep the state for stale webhooks.
    pub fn touched(&mut self, index: usize, now: DateTime<Utc>) -> Charge {
        let charge = &mut self.charges[index];
        charge.updated = now;
        charge_fee(charge);
        let snapshot = charge.clone();
        self.history.push(snapshot.clone());
        snapshot
    }

    pub fn pending_refunds(&self, charge_id: &str) -> i64 {
        self.operations
            .iter()
            .map(|record| &record.operation)
            .filter(|op| {
                op.charge == charge_id
                    && op.kind == OperationKind::Refund
                    && op.status == OperationStatus::Pending
            })
            .map(|op| op.amount_minor)
            .sum()
    }

    pub fn capture_pending(&self, charge_id: &str) -> bool {
        self.operations.iter().any(|record| {
            record.operation.charge == charge_id
                && record.operation.kind == OperationKind::Capture
                && record.operation.status == OperationStatus::Pending
        })
    }

    /// A write under `key`: the first answer while the key lives, else `effect` (again).
    pub fn keyed(
        &mut self,
        key: &str,
        now: DateTime<Utc>,
        effect: impl FnOnce(&mut ProviderState) -> Result<OperationAnswer, ProviderError>,
    ) -> Result<OperationAnswer, ProviderError> {
        let now_ms = now.timestamp_millis();
        if let Some(record) = self.keys.get(key) {
            if now_ms - record.born_ms < self.profile.key_lifetime_ms {
                return record.answer.clone();
            }
        }
        let answer = effect(self);
        if matches!(answer, Err(ProviderError::Rejected(_))) {
            self.refusals += 1;
        }
        self.keys.insert(
            key.to_owned(),
            KeyRecord {
                answer: answer.clone(),
                born_ms: now_ms,
            },
        );
        answer
    }

    /// Records a new operation on the charge at `index` and answers it with the charge as it
    /// stands. A pending one is decided later; a succeeded refund may fail later.
    pub fn new_operation(
        &mut self,
        kind: OperationKind,
        index: usize,
        key: &str,
        amount_minor: i64,
        status: OperationStatus,
        now: DateTime<Utc>,
    ) -> OperationAnswer {
        let prefix = match kind {
            OperationKind::Capture => "cap",
            OperationKind::Refund => "re",
            OperationKind::Cancel => "cnl",
        };
        let charge = self.charges[index].clone();
        let operation = Operation {
            id: format!("{prefix}_{:06}", self.operations.len()),
            kind,
            charge: charge.id.clone(),
            idempotency_key: key.to_owned(),
            amount_minor,
            currency: charge.currency.clone(),
            status,
            failure_reason: None,
            created: now,
            updated: now,
        };
        let now_ms = now.timestamp_millis();
        let profile = self.profile;
        let (decide_at_ms, decide_fails) = if status == OperationStatus::Pending {
            let fails = self.rng.chance(profile.async_fail_percent);
            (Some(now_ms + profile.async_delay_ms), fails)
        } else {
            (None, false)
        };
        let reverse_at_ms = (status == OperationStatus::Succeeded
            && kind == OperationKind::Refund
            && self.rng.chance(profile.reversal_percent))
        .then_some(now_ms + profile.reversal_delay_ms);
        self.operations.push(OpRecord {
            operation: operation.clone(),
            decide_at_ms,
            decide_fails,
            reverse_at_ms,
        });
        let request = Some(ProviderRequest {
            id: format!("req_{}", operation.id),
            replayed: false,
        });
        OperationAnswer {
            operation,
            charge: Some(charge),
            request,
        }
    }

    /// Sets an operation's status and announces it with `operation.updated`.
    fn settle(
        &mut self,
        op: usize,
        status: OperationStatus,
        reason: Option<&str>,
        now: DateTime<Utc>,
    ) {
        let index = self
            .charge_index(&self.operations[op].operation.charge)
            .unwrap();
        let charge = self.touched(index, now);
        let record = &mut self.operations[op];
        record.operation.status = status;
        record.operation.failure_reason = reason.map(str::to_owned);
        record.operation.updated = now;
        let operation = record.operation.clone();
        self.events.push(OperationEvent { operation, charge });
    }

    /// Runs what the provider decided to do by `now`: asynchronous decisions, late reversals.
    pub fn tick(&mut self, now: DateTime<Utc>) {
        let now_ms = now.timestamp_millis();
        for op in 0..self.operations.len() {
            let record = &self.operations[op];
            let status = record.operation.status;
            if status == OperationStatus::Pending
                && record.decide_at_ms.is_some_and(|at| at <= now_ms)
            {
                self.decide(op, now);
            } else if status == OperationStatus::Succeeded
                && record.reverse_at_ms.is_some_and(|at| at <= now_ms)
            {
                let amount = record.operation.amount_minor;
                let index = self.charge_index(&record.operation.charge).unwrap();
                let charge = &mut self.charges[index];
                charge.amount_refunded = (charge.amount_refunded - amount).max(0);
                self.operations[op].reverse_at_ms = None;
                self.reversals += 1;
                self.settle(op, OperationStatus::Failed, Some("refund_returned"), now);
            }
        }
    }

    /// Decides a pending capture or refund: it fails when the profile says so or the charge no
    /// longer allows it, else it takes effect (and a refund may be reversed later).
    fn decide(&mut self, op: usize, now: DateTime<Utc>) {
        let record = &self.operations[op];
        let (kind, amount) = (record.operation.kind, record.operation.amount_minor);
        let fails = record.decide_fails;
        let index = self.charge_index(&record.operation.charge).unwrap();
        self.operations[op].decide_at_ms = None;
        let charge = &mut self.charges[index];
        let allowed = match kind {
            OperationKind::Capture => charge.status == ChargeStatus::RequiresCapture,
            _ => {
                charge.status == ChargeStatus::Succeeded
                    && charge.amount_captured - charge.amount_refunded >= amount
            }
        };
        if fails || !allowed {
            return self.settle(
                op,
                OperationStatus::Failed,
                Some("declined_by_acquirer"),
                now,
            );
        }
        match kind {
            OperationKind::Capture => {
                charge.status = ChargeStatus::Succeeded;
                charge.amount_captured = amount;
            }
            _ => {
                charge.amount_refunded += amount;
                let profile = self.profile;
                if self.rng.chance(profile.reversal_percent) {
                    self.operations[op].reverse_at_ms =
                        Some(now.timestamp_millis() + profile.reversal_delay_ms);
                }
            }
        }
        self.settle(op, OperationStatus::Succeeded, None, now);
    }

    /// The operation as the provider holds it now, by our key or its id.
    pub fn operation_where(&self, matches: impl Fn(&Operation) -> bool) -> Option<Operation> {
        self.operations
            .iter()
            .rev()
            .map(|record| &record.operation)
            .find(|op| matches(op))
            .cloned()
    }
}

impl SimProvider {
    /// A provider of the seed's `profile`, with nothing yet; its own draws come from `seed` apart
    /// from the simulation's.
    pub fn new(
        profile: Profile,
        seed: u64,
        clock: Arc<ManualClock>,
        crash: Arc<Notify>,
    ) -> SimProvider {
        SimProvider {
            state: Mutex::new(ProviderState {
                profile,
                rng: Rng::new(seed ^ 0x0BAD_C0DE_0BAD_C0DE),
                charges: Vec::new(),
                by_key: HashMap::new(),
                by_id: HashMap::new(),
                operations: Vec::new(),
                keys: HashMap::new(),
                history: Vec::new(),
                events: Vec::new(),
                events_sent: 0,
                dark: HashSet::new(),
                out_of_band: HashSet::new(),
                fault: Fault::None,
                lookup_fails: false,
                refusals: 0,
                reversals: 0,
                disputes: 0,
            }),
            clock,
            crash,
        }
    }

    pub fn arm(&self, fault: Fault) {
        self.state.lock().unwrap().fault = fault;
    }

    pub fn profile(&self) -> Profile {
        self.state.lock().unwrap().profile
    }

    /// The provider catches up with the clock.
    pub fn tick(&self) {
        let now = self.clock.now();
        self.state.lock().unwrap().tick(now);
    }

    /// Runs a write under the armed fault. `effect` runs under the lock; the lock is never held
    /// across an await.
    pub async fn write<T>(
        &self,
        effect: impl FnOnce(&mut ProviderState, DateTime<Utc>) -> T,
        lost: impl FnOnce(&str) -> T,
    ) -> T {
        let now = self.clock.now();
        let fault = {
            let mut state = self.state.lock().unwrap();
            state.tick(now);
            std::mem::replace(&mut state.fault, Fault::None)
        };
        match fault {
            Fault::None => effect(&mut self.state.lock().unwrap(), now),
            Fault::FailBefore => lost("connection refused"),
            Fault::LoseAnswer => {
                let _ = effect(&mut self.state.lock().unwrap(), now);
                lost("timed out after sending")
            }
            Fault::CrashBefore => {
                self.crash.notify_one();
                std::future::pending().await
            }
            Fault::CrashAfter => {
                let _ = effect(&mut self.state.lock().unwrap(), now);
                self.crash.notify_one();
                std::future::pending().await
            }
        }
    }

    /// A read the profile allows (`allowed`), else `Unsupported` without a call.
    pub fn lookup<T>(
        &self,
        allowed: bool,
        what: &str,
        answer: impl FnOnce(&ProviderState) -> T,
    ) -> Result<T, ProviderError> {
        let now = self.clock.now();
        let mut state = self.state.lock().unwrap();
        if !allowed {
            return Err(unsupported(what));
        }
        state.tick(now);
        if std::mem::take(&mut state.lookup_fails) {
            return Err(unknown("lookup timed out"));
        }
        Ok(answer(&state))
    }

    pub fn charges(&self) -> Vec<Charge> {
        self.state.lock().unwrap().charges.clone()
    }

    /// The customer finishes (or abandons) a redirect; the provider moves the charge on.
    pub fn complete_action(&self, index: usize, succeed: bool) -> Option<String> {
        let now = self.clock.now();
        let mut state = self.state.lock().unwrap();
        let charge = state.charges.get_mut(index)?;
        if charge.status != ChargeStatus::RequiresAction {
            return None;
        }
        charge.next_action = None;
        if !succeed {
            charge.status = ChargeStatus::Failed;
            charge.failure_code = Some("authentication_failed".into());
        } else if charge.capture {
            charge.status = ChargeStatus::Succeeded;
            charge.amount_captured = charge.amount_minor;
        } else {
            charge.status = ChargeStatus::RequiresCapture;
        }
        let snapshot = state.touched(index, now);
        Some(format!("{} -> {:?}", snapshot.id, snapshot.status))
    }

    /// A refund made in the provider's dashboard, not through us.
    pub fn refund_out_of_band(&self, index: usize, amount_minor: i64) -> Option<String> {
        let now = self.clock.now();
        let mut state = self.state.lock().unwrap();
        let pending = state.pending_refunds(&state.charges.get(index)?.id);
        let charge = state.charges.get_mut(index)?;
        let left = charge.amount_captured - charge.amount_refunded - pending;
        if charge.status != ChargeStatus::Succeeded || left <= 0 || charge.dispute.is_some() {
            return None;
        }
        let amount = amount_minor.clamp(1, left);
        charge.amount_refunded += amount;
        let id = charge.id.clone();
        state.out_of_band.insert(id);
        let snapshot = state.touched(index, now);
        Some(format!("{} refunded {amount} out of band", snapshot.id))
    }

    /// The cardholder disputes what is left of a captured charge (once per charge, never while
    /// a refund is pending). With the profile's odds, the charge goes dark: none of its
    /// webhooks arrives from now on.
    pub fn open_dispute(&self, index: usize) -> Option<String> {
        let now = self.clock.now();
        let mut state = self.state.lock().unwrap();
        let pending = state.pending_refunds(&state.charges.get(index)?.id);
        let charge = state.charges.get_mut(index)?;
        let disputable = charge.amount_captured - charge.amount_refunded;
        if charge.status != ChargeStatus::Succeeded
            || charge.dispute.is_some()
            || disputable <= 0
            || pending > 0
        {
            return None;
        }
        charge.dispute = Some(Dispute {
            status: DisputeStatus::Open,
            amount_minor: disputable,
            created: now,
            closed: None,
            id: None,
            reinstated: false,
        });
        let id = charge.id.clone();
        let percent = state.profile.dispute_dark_percent;
        let dark = state.rng.chance(percent);
        if dark {
            state.dark.insert(id.clone());
        }
        state.disputes += 1;
        state.touched(index, now);
        let webhooks = if dark { "dropped" } else { "delivered" };
        Some(format!(
            "{id} disputed for {disputable} (webhooks {webhooks})"
        ))
    }

    pub fn close_dispute(&self, index: usize, won: bool) -> Option<String> {
        let now = self.clock.now();
        let mut state = self.state.lock().unwrap();
        let charge = state.charges.get_mut(index)?;
        let dispute = charge.dispute.as_mut()?;
        if dispute.status != DisputeStatus::Open {
            return None;
        }
        dispute.status = if won {
            DisputeStatus::Won
        } else {
            DisputeStatus::Lost
        };
        dispute.closed = Some(now);
        let snapshot = state.touched(index, now);
        Some(format!("{} dispute closed, won: {won}", snapshot.id))
    }
}

/// The provider's processing fee (2.9 %, rounded down) on a charge's capture, as its balance
/// transaction `txn_<charge>`: set once, when the charge first has captured money.
pub fn charge_fee(charge: &mut Charge) {
    if charge.amount_captured > 0 && charge.provider_fees.is_empty() {
        charge.provider_fees.push(ProviderFee {
            transaction_id: format!("txn_{}", charge.id),
            fee_minor: charge.amount_captured * 29 / 1_000,
        });
    }
}
