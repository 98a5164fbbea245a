//! A deterministic simulation of the payment flow, in the spirit of TigerBeetle's VOPR.
//!
//! From a seed, one pseudo-random stream drives the real `app` layer (`PaymentFlow`,
//! `LedgerFlow`, `Reconciler`, `Sealer`) on a SQLite file, against an in-memory provider and a
//! manual clock: which request comes next (a new payment, a retry with the same key and body, a
//! capture, a refund, a transfer), which provider fact a webhook delivers (the latest or a stale
//! one, repeated, out of order), what the customer and the provider do on their side, how far the
//! clock moves, when the reconciler sweeps, and how every provider write goes wrong.
//!
//! **Crash points.** A provider write (charge, capture, refund) can answer normally; fail before
//! doing anything (`Unknown`, no effect); lose its answer (the effect happens, the caller gets
//! `Unknown`); or crash the process before or after the effect. Those are the await points between
//! the steps of every flow (claim + intent committed → provider call → finalize committed), so a
//! crash there abandons the work exactly where a real process death would. A crash is a
//! cancellation: the provider raises a `Notify` and never answers; the operation runs under
//! `tokio::select!` against that signal, so the future is dropped at that await and nothing after
//! it runs. The "process" restarts: a new pool, new flows and a new reconciler on the same SQLite
//! file (only what committed survives), and the client retries with its key once the idempotency
//! lease has run out. This is deterministic because the crash is decided by the seeded stream at a
//! named point, not by counting polls: the number of polls of a sqlx future depends on its worker
//! thread, so dropping a future after N polls would not replay.
//!
//! **The provider's profile.** Each seed draws what kind of provider it plays against
//! (`Profile`): lookups by key and by id or not (`Capabilities`; a lookup the profile lacks
//! answers `Unsupported`), synchronous or asynchronous captures and refunds (answered `Pending`
//! and decided later, sometimes failed), late refund reversals (a succeeded refund fails and the
//! charge's refunded total goes back down), a key lifetime (a write under an older key is a new
//! one), whether a dispute's webhooks get through, whether an authorisation can be cancelled by
//! our reference (Adyen's technical cancel, asked for a payment never answered once it expired),
//! and how long past its expiry the report must be compared before such a charge is concluded
//! absent. Each `operation.updated` the provider
//! sends is delivered as it happens or dropped; a disputed charge may go dark (none of its
//! webhooks arrives again, so the sweep's lookups and the settlement report, which carries the
//! dispute, must tell). A refund on a disputed charge is refused (`charge_disputed`).
//!
//! **Checked after every step:** the real invariant checker (`Checker::check_once`: zero-sum
//! entries, stream versions, one capture posting per captured payment, idempotency leases, the
//! events table's immutability, seals), and simulation truths: the provider holds at most one
//! charge per payment; an idempotency key that got a 2xx names one payment forever; a replay is
//! byte for byte the first answer; the provider holds at most one capture or refund per key. At
//! the end of a seed, time runs on past the operation timeouts, the key lifetimes and the pending
//! deadline (the reconciler sweeping): every capture and refund must then be closed, unless the
//! profile makes it unresolvable (pending at a provider without lookups, or requested past its
//! key's lifetime), and then it must have its `operation_unresolved` exception. Every final state
//! is delivered (a dark charge's never); the ledger must then agree with the provider about every
//! charge (captured, refunded net of reversals, the provider's fees, the dispute and its outcome)
//! and every operation.
//!
//! Run: `cargo test -p asiento-app --test simulation` (`SIMULATION_SEEDS`, default 1000,
//! `SIMULATION_SEED_START`, `SIMULATION_STEPS`, default 20). A failure prints its seed, step and
//! trace; `SIMULATION_SEED=<n> cargo test -p asiento-app --test simulation` replays it exactly
//! (the trace is printed then, too). `scripts/simulate` runs many more seeds in release.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use asiento_app::clock::{Clock, ManualClock};
use asiento_app::exceptions::{self, Scope as ExceptionScope};
use asiento_app::facts;
use asiento_app::idempotency::{canonical_body_hash, IdempotencyKey, Scope, StoredResponse};
use asiento_app::invariants::{Checker, Sealer};
use asiento_app::ledger::{LedgerFlow, NewTransfer};
use asiento_app::log;
use asiento_app::payments::{Finalize, Idempotent, NewPayment, PaymentFlow};
use asiento_app::providers::{ConfiguredProvider, Providers};
use asiento_app::reconcile::{Reconciler, ReconcilerConfig};
use asiento_app::reply::{Answer, Render, Reply};
use asiento_domain::payment::DisputeOutcome;
use asiento_domain::{
    AccountName, Amount, CaptureMode, Currency, CustomerId, FeeSchedule, OperationState, PaymentId,
    PaymentRecord, PaymentStatus, ProviderFact, ProviderName, TenantId,
};
use asiento_eventstore::Database;
use asiento_psp::{
    Capabilities, Charge, ChargeOutcome, ChargeStatus, CreateCharge, Dispute, DisputeStatus,
    NextAction, Operation, OperationAnswer, OperationKind, OperationStatus, Provider,
    ProviderError, ProviderFee, ProviderRequest, Rejection, ReportLine, SettlementReport,
};
use asiento_testkit::Rng;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tokio::sync::Notify;

/// Seeds the bounded run checks unless `SIMULATION_SEEDS` says otherwise.
const SEEDS_DEFAULT: u64 = 1_000;
/// Steps per seed unless `SIMULATION_STEPS` says otherwise.
const STEPS_DEFAULT: u32 = 20;
/// Seeds run at once (each alone in its task, on its own file, so each still replays): a seed
/// mostly waits on SQLite, so a few at once use the cores.
const JOBS_DEFAULT: u64 = 8;
/// Attempts of one request within a step (the first, then retries after crashes).
const ATTEMPTS_PER_STEP_MAX: u32 = 3;
/// The simulated epoch: 2023-11-14T22:13:20Z.
const EPOCH_MS: i64 = 1_700_000_000_000;
const IDEMPOTENCY_LEASE_MS: i64 = 60_000;
/// How often the simulated `serve` runs a reconciler sweep while time passes.
const SWEEP_INTERVAL_MS: i64 = 5 * 60_000;
/// The longest single clock jump (a sweep runs every `SWEEP_INTERVAL_MS` inside it).
const CLOCK_JUMP_MS_MAX: i64 = 20 * 60_000;
/// The reconciler drives a capture or refund this long after its request (the clock is manual,
/// so small is cheap).
const OPERATION_TIMEOUT_MS: i64 = 30_000;
/// How long a pending capture or refund may wait for its decision: above the longest
/// asynchronous delay plus a sweep, so that only a profile without lookups ever reaches it.
const OPERATION_PENDING_DEADLINE_MS: i64 = 2 * 3_600_000;
/// Of the provider's `operation.updated` events, the share delivered as they happen.
const EVENTS_DELIVERED_PERCENT: u64 = 75;
/// A key lifetime no seed outlives (Stripe's day).
const KEY_LIFETIME_MS_LONG: i64 = 24 * 3_600_000;
/// The longer absence window a profile may have; the end of a seed runs past it.
const ABSENCE_CONFIRMED_AFTER_MS_LONG: i64 = 90 * 60_000;
const FEE_BPS: u32 = 300;
const TENANT: &str = "acme";
const PROVIDER: &str = "sim";
const CUSTOMERS: [&str; 3] = ["c1", "c2", "c3"];
const METHODS: [&str; 3] = ["pm_card_ok", "pm_card_declined", "pm_card_3ds"];

// ------------------------------------------------------------------------- the provider

/// What kind of provider a seed plays against, drawn once per seed: which lookups exist,
/// whether captures and refunds are decided later, how long it remembers a key, whether
/// refunds bounce and whether a dispute's webhooks get through.
#[derive(Debug, Clone, Copy)]
struct Profile {
    lookup_by_key: bool,
    lookup_by_id: bool,
    async_modifications: bool,
    /// How long after its request an asynchronous capture or refund is decided.
    async_delay_ms: i64,
    /// Of asynchronous decisions, the percentage that fail.
    async_fail_percent: u64,
    /// Of succeeded refunds, the percentage that fail later (a late reversal).
    reversal_percent: u64,
    reversal_delay_ms: i64,
    /// How long a capture's or refund's key is remembered; a write under an older key is new.
    key_lifetime_ms: i64,
    /// Of disputes, the percentage whose charge's webhooks are all dropped from then on.
    dispute_dark_percent: u64,
    /// Whether what a charge request made can be cancelled by our reference (Adyen's
    /// technical cancel): an authorisation whose answer was lost is then cancelled once its
    /// payment expired.
    cancel_by_reference: bool,
    /// How far past a payment's expiry the report must have been compared before a charge never
    /// answered is concluded absent.
    absence_confirmed_after_ms: i64,
}

impl Profile {
    fn draw(rng: &mut Rng) -> Profile {
        Profile {
            lookup_by_key: rng.chance(50),
            lookup_by_id: rng.chance(60),
            async_modifications: rng.chance(50),
            async_delay_ms: rng.between(1_000, 20 * 60_000),
            async_fail_percent: *rng.pick(&[0, 15, 40]),
            reversal_percent: *rng.pick(&[0, 0, 20, 50]),
            reversal_delay_ms: rng.between(1_000, 30 * 60_000),
            key_lifetime_ms: *rng.pick(&[KEY_LIFETIME_MS_LONG, KEY_LIFETIME_MS_LONG, 10 * 60_000]),
            dispute_dark_percent: *rng.pick(&[0, 50, 100]),
            cancel_by_reference: rng.chance(50),
            absence_confirmed_after_ms: *rng.pick(&[0, 0, ABSENCE_CONFIRMED_AFTER_MS_LONG]),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            lookup_by_key: self.lookup_by_key,
            lookup_by_id: self.lookup_by_id,
            async_modifications: self.async_modifications,
            key_lifetime: std::time::Duration::from_millis(self.key_lifetime_ms as u64),
            absence_confirmed_after: std::time::Duration::from_millis(
                self.absence_confirmed_after_ms as u64,
            ),
        }
    }

    /// The provider tells of a pending operation only by webhook (and, for a refund, by the
    /// report's cumulative total).
    fn webhooks_only(&self) -> bool {
        !self.lookup_by_key && !self.lookup_by_id
    }
}

/// How the next provider write goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Fault {
    #[default]
    None,
    /// The request never reached the provider: `Unknown`, nothing happened.
    FailBefore,
    /// The provider acted, the answer was lost (a timeout after sending): `Unknown`.
    LoseAnswer,
    /// The process dies before the request leaves.
    CrashBefore,
    /// The provider acts, and the process dies before it reads the answer.
    CrashAfter,
}

/// A capture or refund the provider holds, and what it will do with it later.
struct OpRecord {
    operation: Operation,
    /// When a pending operation is decided, and whether it then fails.
    decide_at_ms: Option<i64>,
    decide_fails: bool,
    /// When a succeeded refund fails.
    reverse_at_ms: Option<i64>,
}

/// The first answer under a key, replayed while the key lives.
struct KeyRecord {
    answer: Result<OperationAnswer, ProviderError>,
    born_ms: i64,
}

/// An `operation.updated` event: the operation and its charge right after the change.
#[derive(Clone)]
struct OperationEvent {
    operation: Operation,
    charge: Charge,
}

struct ProviderState {
    profile: Profile,
    /// The provider's own draws (reversals, failed decisions), apart from the simulation's.
    rng: Rng,
    /// In creation order, so that iterating never depends on random ids.
    charges: Vec<Charge>,
    by_key: HashMap<String, usize>,
    by_id: HashMap<String, usize>,
    /// Captures and refunds in creation order.
    operations: Vec<OpRecord>,
    /// Capture and refund keys.
    keys: HashMap<String, KeyRecord>,
    /// Every state every charge passed through, for stale and repeated webhooks.
    history: Vec<Charge>,
    /// Every `operation.updated` the provider sent.
    events: Vec<OperationEvent>,
    /// How many of `events` the simulation has delivered (or dropped) promptly.
    events_sent: usize,
    /// Charges whose dispute's webhooks (and every later one) are dropped.
    dark: HashSet<String>,
    /// Charges refunded in the dashboard.
    out_of_band: HashSet<String>,
    /// Armed for the next write, then back to `None`.
    fault: Fault,
    /// The next lookup answers `Unknown`.
    lookup_fails: bool,
    /// What the provider did, for the summary.
    refusals: u64,
    reversals: u64,
    disputes: u64,
}

/// A provider in memory: one charge per idempotency key, ever; one capture or refund per key
/// while the key lives; faults armed by the simulation; behaviour from the seed's profile.
struct SimProvider {
    state: Mutex<ProviderState>,
    clock: Arc<ManualClock>,
    crash: Arc<Notify>,
}

fn unknown(reason: &str) -> ProviderError {
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

fn rejected(code: &str) -> ProviderError {
    ProviderError::Rejected(rejection(code))
}

fn unsupported(what: &str) -> ProviderError {
    ProviderError::Unsupported {
        what: what.to_owned(),
    }
}

impl ProviderState {
    fn charge_index(&self, charge_id: &str) -> Option<usize> {
        self.by_id.get(charge_id).copied()
    }

    /// The charge changed: stamp it and keep the state for stale webhooks.
    fn touched(&mut self, index: usize, now: DateTime<Utc>) -> Charge {
        let charge = &mut self.charges[index];
        charge.updated = now;
        charge_fee(charge);
        let snapshot = charge.clone();
        self.history.push(snapshot.clone());
        snapshot
    }

    fn pending_refunds(&self, charge_id: &str) -> i64 {
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

    fn capture_pending(&self, charge_id: &str) -> bool {
        self.operations.iter().any(|record| {
            record.operation.charge == charge_id
                && record.operation.kind == OperationKind::Capture
                && record.operation.status == OperationStatus::Pending
        })
    }

    /// A write under `key`: the first answer while the key lives, else `effect` (again).
    fn keyed(
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
    fn new_operation(
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
    fn tick(&mut self, now: DateTime<Utc>) {
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
    fn operation_where(&self, matches: impl Fn(&Operation) -> bool) -> Option<Operation> {
        self.operations
            .iter()
            .rev()
            .map(|record| &record.operation)
            .find(|op| matches(op))
            .cloned()
    }
}

impl SimProvider {
    fn arm(&self, fault: Fault) {
        self.state.lock().unwrap().fault = fault;
    }

    fn profile(&self) -> Profile {
        self.state.lock().unwrap().profile
    }

    /// The provider catches up with the clock.
    fn tick(&self) {
        let now = self.clock.now();
        self.state.lock().unwrap().tick(now);
    }

    /// Runs a write under the armed fault. `effect` runs under the lock; the lock is never held
    /// across an await.
    async fn write<T>(
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
    fn lookup<T>(
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

    fn charges(&self) -> Vec<Charge> {
        self.state.lock().unwrap().charges.clone()
    }

    /// The customer finishes (or abandons) a redirect; the provider moves the charge on.
    fn complete_action(&self, index: usize, succeed: bool) -> Option<String> {
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
    fn refund_out_of_band(&self, index: usize, amount_minor: i64) -> Option<String> {
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
    fn open_dispute(&self, index: usize) -> Option<String> {
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

    fn close_dispute(&self, index: usize, won: bool) -> Option<String> {
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
fn charge_fee(charge: &mut Charge) {
    if charge.amount_captured > 0 && charge.provider_fees.is_empty() {
        charge.provider_fees.push(ProviderFee {
            transaction_id: format!("txn_{}", charge.id),
            fee_minor: charge.amount_captured * 29 / 1_000,
        });
    }
}

fn create_effect(state: &mut ProviderState, now: DateTime<Utc>, req: &CreateCharge) -> Charge {
    if let Some(&index) = state.by_key.get(&req.idempotency_key) {
        return state.charges[index].clone();
    }
    let index = state.charges.len();
    let id = format!("ch_{index:06}");
    let (status, captured, failure_code, next_action) = match req.payment_method.as_str() {
        "pm_card_declined" => (
            ChargeStatus::Failed,
            0,
            Some("card_declined".to_owned()),
            None,
        ),
        "pm_card_3ds" => (
            ChargeStatus::RequiresAction,
            0,
            None,
            Some(NextAction {
                kind: "redirect".into(),
                redirect_url: format!("https://sim.example/3ds/{id}"),
            }),
        ),
        _ if req.capture => (ChargeStatus::Succeeded, req.amount_minor, None, None),
        _ => (ChargeStatus::RequiresCapture, 0, None, None),
    };
    let mut charge = Charge {
        id: id.clone(),
        status,
        amount_minor: req.amount_minor,
        currency: req.currency.clone(),
        amount_captured: captured,
        amount_refunded: 0,
        reference: req.reference.clone(),
        idempotency_key: req.idempotency_key.clone(),
        payment_method: req.payment_method.clone(),
        capture: req.capture,
        failure_code,
        next_action,
        dispute: None,
        metadata: req.metadata.clone(),
        provider_fees: Vec::new(),
        created: now,
        updated: now,
    };
    charge_fee(&mut charge);
    state.charges.push(charge.clone());
    state.by_key.insert(req.idempotency_key.clone(), index);
    state.by_id.insert(id, index);
    state.history.push(charge.clone());
    charge
}

fn capture_effect(
    state: &mut ProviderState,
    now: DateTime<Utc>,
    charge_id: &str,
    amount_minor: Option<i64>,
    key: &str,
) -> Result<OperationAnswer, ProviderError> {
    state.keyed(key, now, |state| {
        let index = state
            .charge_index(charge_id)
            .ok_or_else(|| rejected("no_such_charge"))?;
        let charge = &state.charges[index];
        let amount = amount_minor.unwrap_or(charge.amount_minor);
        if charge.status != ChargeStatus::RequiresCapture {
            return Err(rejected("charge_not_capturable"));
        }
        if state.capture_pending(charge_id) {
            return Err(rejected("capture_pending"));
        }
        if amount <= 0 || amount > charge.amount_minor {
            return Err(rejected("amount_too_large"));
        }
        if state.profile.async_modifications {
            return Ok(state.new_operation(
                OperationKind::Capture,
                index,
                key,
                amount,
                OperationStatus::Pending,
                now,
            ));
        }
        let charge = &mut state.charges[index];
        charge.status = ChargeStatus::Succeeded;
        charge.amount_captured = amount;
        state.touched(index, now);
        Ok(state.new_operation(
            OperationKind::Capture,
            index,
            key,
            amount,
            OperationStatus::Succeeded,
            now,
        ))
    })
}

fn refund_effect(
    state: &mut ProviderState,
    now: DateTime<Utc>,
    charge_id: &str,
    amount_minor: i64,
    key: &str,
) -> Result<OperationAnswer, ProviderError> {
    state.keyed(key, now, |state| {
        let index = state
            .charge_index(charge_id)
            .ok_or_else(|| rejected("no_such_charge"))?;
        let pending = state.pending_refunds(charge_id);
        let charge = &state.charges[index];
        // Disputed money is frozen while the dispute is open, and gone once it is lost.
        if charge
            .dispute
            .as_ref()
            .is_some_and(|d| d.status != DisputeStatus::Won)
        {
            return Err(rejected("charge_disputed"));
        }
        let left = charge.amount_captured - charge.amount_refunded - pending;
        if charge.status != ChargeStatus::Succeeded || amount_minor <= 0 || amount_minor > left {
            return Err(rejected("refund_exceeds_captured"));
        }
        if state.profile.async_modifications {
            return Ok(state.new_operation(
                OperationKind::Refund,
                index,
                key,
                amount_minor,
                OperationStatus::Pending,
                now,
            ));
        }
        state.charges[index].amount_refunded += amount_minor;
        state.touched(index, now);
        Ok(state.new_operation(
            OperationKind::Refund,
            index,
            key,
            amount_minor,
            OperationStatus::Succeeded,
            now,
        ))
    })
}

#[async_trait]
impl Provider for SimProvider {
    fn name(&self) -> &str {
        PROVIDER
    }

    fn capabilities(&self) -> Capabilities {
        self.profile().capabilities()
    }

    async fn create_charge(&self, req: &CreateCharge) -> ChargeOutcome {
        self.write(
            |state, now| ChargeOutcome::from_charge(create_effect(state, now, req)),
            |reason| ChargeOutcome::Unknown {
                reason: reason.to_owned(),
            },
        )
        .await
    }

    async fn capture(
        &self,
        charge_id: &str,
        amount_minor: Option<i64>,
        _currency: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        self.write(
            |state, now| capture_effect(state, now, charge_id, amount_minor, idempotency_key),
            |reason| Err(unknown(reason)),
        )
        .await
    }

    async fn refund(
        &self,
        charge_id: &str,
        amount_minor: i64,
        _currency: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        self.write(
            |state, now| refund_effect(state, now, charge_id, amount_minor, idempotency_key),
            |reason| Err(unknown(reason)),
        )
        .await
    }

    async fn cancel_by_reference(
        &self,
        reference: &str,
        _idempotency_key: &str,
    ) -> Result<String, ProviderError> {
        let now = self.clock.now();
        let mut state = self.state.lock().unwrap();
        if !state.profile.cancel_by_reference {
            return Err(unsupported("cancel by reference"));
        }
        state.tick(now);
        // Only an authorisation can be cancelled: a captured charge stays as it is.
        let authorised = state.charges.iter().rposition(|charge| {
            charge.reference.as_deref() == Some(reference)
                && charge.status == ChargeStatus::RequiresCapture
        });
        if let Some(index) = authorised {
            let charge = &mut state.charges[index];
            charge.status = ChargeStatus::Failed;
            charge.failure_code = Some("canceled".into());
            state.touched(index, now);
        }
        Ok(format!("tc_{reference}"))
    }

    async fn cancel(
        &self,
        charge_id: &str,
        _idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        // Abandoned redirects are cancelled after a day; a seed never runs that long.
        Err(rejected(&format!("cancel_not_simulated_{charge_id}")))
    }

    async fn find_operation_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Operation>, ProviderError> {
        let allowed = self.profile().lookup_by_key;
        self.lookup(allowed, "find an operation by key", |state| {
            state.operation_where(|op| op.idempotency_key == idempotency_key)
        })
    }

    async fn get_operation(&self, id: &str) -> Result<Option<Operation>, ProviderError> {
        let allowed = self.profile().lookup_by_id;
        self.lookup(allowed, "read an operation", |state| {
            state.operation_where(|op| op.id == id)
        })
    }

    async fn get_charge(&self, charge_id: &str) -> Result<Option<Charge>, ProviderError> {
        let allowed = self.profile().lookup_by_id;
        self.lookup(allowed, "read a charge", |state| {
            state
                .charge_index(charge_id)
                .map(|index| state.charges[index].clone())
        })
    }

    async fn find_charge_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Charge>, ProviderError> {
        let allowed = self.profile().lookup_by_key;
        self.lookup(allowed, "find a charge by key", |state| {
            state
                .by_key
                .get(idempotency_key)
                .map(|&index| state.charges[index].clone())
        })
    }

    async fn settlement_report(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<SettlementReport, ProviderError> {
        self.lookup(true, "report", |state| {
            state
                .charges
                .iter()
                .filter(|charge| charge.updated >= from && charge.updated < to)
                .map(|charge| ReportLine {
                    charge_id: charge.id.clone(),
                    status: charge.status,
                    amount_minor: charge.amount_minor,
                    amount_captured: charge.amount_captured,
                    amount_refunded: charge.amount_refunded,
                    provider_fees: charge.provider_fees.clone(),
                    currency: charge.currency.clone(),
                    reference: charge.reference.clone(),
                    idempotency_key: charge.idempotency_key.clone(),
                    dispute_status: charge.dispute.as_ref().map(|d| d.status),
                    dispute: charge.dispute.clone(),
                    movements: Vec::new(),
                    last_touched: charge.updated,
                })
                .collect()
        })
        .map(|data| SettlementReport { from, to, data })
    }
}

// --------------------------------------------------------------------------- the client

/// Stored responses as JSON the simulation can read back: the payment id names what a key did.
struct SimRender;

impl Render for SimRender {
    fn render(&self, reply: &Reply<'_>) -> StoredResponse {
        let (status, body) = match reply {
            Reply::Payment {
                payment, position, ..
            } => (
                if payment.status == PaymentStatus::Pending {
                    202
                } else {
                    201
                },
                json!({
                    "id": payment.id.to_string(),
                    "status": payment.status.as_str(),
                    "captured": payment.captured.minor(),
                    "refunded": payment.refunded.minor(),
                    "position": position,
                }),
            ),
            Reply::Transfer {
                transfer, position, ..
            } => (
                201,
                json!({"entry": transfer.entry_id.map(|id| id.to_string()), "position": position}),
            ),
            Reply::Account { position, .. } => (201, json!({"position": position})),
            Reply::Rejected(rejected) => (422, json!({"rejected": format!("{rejected:?}")})),
        };
        StoredResponse {
            status,
            body: serde_json::to_vec(&body).unwrap(),
        }
    }
}

#[derive(Debug, Clone)]
enum Work {
    Create(NewPayment),
    Capture {
        payment: PaymentId,
        amount: Option<Amount>,
    },
    Refund {
        payment: PaymentId,
        amount: Amount,
    },
    Transfer(NewTransfer),
}

/// One client request and what the client learnt from it.
struct Request {
    work: Work,
    idem: Idempotent,
    /// The first answer that did the work (or its stored rejection).
    answered: Option<StoredResponse>,
    /// For a create: the payment its 2xx named.
    payment: Option<PaymentId>,
}

impl Request {
    fn settled(&self) -> bool {
        self.answered.is_some()
    }
}

/// How one attempt ended.
enum Outcome {
    Answer(Answer),
    Crashed,
}

// --------------------------------------------------------------------------- the world

/// The "process": everything that dies in a crash. The database file does not.
struct Process {
    database: Database,
    flow: PaymentFlow,
    transfers: LedgerFlow,
    reconciler: Reconciler,
}

struct Sim {
    seed: u64,
    step: u32,
    rng: Rng,
    url: String,
    _dir: Box<dyn std::any::Any + Send + Sync>,
    clock: Arc<ManualClock>,
    provider: Arc<SimProvider>,
    crash: Arc<Notify>,
    process: Process,
    requests: Vec<Request>,
    /// Payments the client learnt of, in the order it learnt them.
    payments: Vec<PaymentId>,
    last_sweep_ms: i64,
    crashes: u32,
    /// What the sweeps did about charges never answered: sent again, cancelled by reference.
    resent: u64,
    cancelled_by_reference: u64,
    trace: String,
}

async fn start_process(
    url: &str,
    clock: &Arc<ManualClock>,
    provider: &Arc<SimProvider>,
) -> Process {
    let database = Database::connect(url).await.unwrap();
    let clock: Arc<dyn Clock> = clock.clone();
    let adapter: Arc<dyn Provider> = provider.clone();
    let providers = Providers::new([(
        ProviderName::parse(PROVIDER).unwrap(),
        ConfiguredProvider {
            adapter,
            fees: FeeSchedule::new(FEE_BPS, Amount::ZERO).unwrap(),
        },
    )]);
    let writer = asiento_app::commit::Writer::new(database.event_store());
    let flow = PaymentFlow::new(
        database.clone(),
        Arc::clone(&writer),
        providers,
        clock.clone(),
        Arc::new(SimRender),
    )
    .with_leases(
        IDEMPOTENCY_LEASE_MS,
        asiento_app::leases::PAYMENT_LEASE_MS_DEFAULT,
    );
    let transfers = LedgerFlow::new(database.clone(), writer, clock, Arc::new(SimRender))
        .with_idempotency_lease(IDEMPOTENCY_LEASE_MS);
    let config = ReconcilerConfig {
        operation_timeout_ms: OPERATION_TIMEOUT_MS,
        operation_pending_deadline_ms: OPERATION_PENDING_DEADLINE_MS,
        ..ReconcilerConfig::default()
    };
    let reconciler = Reconciler::new(flow.clone(), config);
    Process {
        database,
        flow,
        transfers,
        reconciler,
    }
}

impl Sim {
    async fn new(seed: u64) -> Sim {
        let (dir, url) = asiento_eventstore::testing::temp_sqlite_url();
        let clock = Arc::new(ManualClock::at_ms(EPOCH_MS));
        let crash = Arc::new(Notify::new());
        let mut rng = Rng::new(seed);
        let profile = Profile::draw(&mut rng);
        let provider = Arc::new(SimProvider {
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
            clock: clock.clone(),
            crash: crash.clone(),
        });
        let process = start_process(&url, &clock, &provider).await;
        process.database.migrate().await.unwrap();
        Sim {
            seed,
            step: 0,
            rng,
            url,
            _dir: Box::new(dir),
            clock,
            provider,
            crash,
            process,
            requests: Vec::new(),
            payments: Vec::new(),
            last_sweep_ms: EPOCH_MS,
            crashes: 0,
            resent: 0,
            cancelled_by_reference: 0,
            trace: String::new(),
        }
    }

    fn note(&mut self, text: impl AsRef<str>) {
        let _ = writeln!(
            self.trace,
            "  [{:>3}] t+{:>7}s {}",
            self.step,
            (self.clock.now_ms() - EPOCH_MS) / 1_000,
            text.as_ref()
        );
    }

    fn fail(&self, what: impl AsRef<str>) -> ! {
        panic!(
            "simulation seed {} failed at step {}: {}\ntrace:\n{}\nreplay: SIMULATION_SEED={} cargo test -p asiento-app --test simulation -- --nocapture",
            self.seed,
            self.step,
            what.as_ref(),
            self.trace,
            self.seed
        );
    }

    /// The process dies: nothing in memory survives, the database keeps what committed.
    async fn restart(&mut self) {
        self.crashes += 1;
        self.process = start_process(&self.url, &self.clock, &self.provider).await;
        self.note("process restarted");
    }

    fn random_fault(&mut self) -> Fault {
        match self.rng.weighted(&[60, 8, 12, 10, 10]) {
            0 => Fault::None,
            1 => Fault::FailBefore,
            2 => Fault::LoseAnswer,
            3 => Fault::CrashBefore,
            _ => Fault::CrashAfter,
        }
    }

    /// Runs one attempt of a request, crashing where the provider says so.
    async fn attempt(&mut self, index: usize) -> Outcome {
        let fault = self.random_fault();
        self.provider.arm(fault);
        let request = &self.requests[index];
        let process = &self.process;
        let idem = request.idem.clone();
        let work = request.work.clone();
        let run = async {
            match work {
                Work::Create(payment) => process.flow.create(&idem, payment).await,
                Work::Capture { payment, amount } => {
                    process
                        .flow
                        .capture(&idem, &tenant(), payment, amount)
                        .await
                }
                Work::Refund { payment, amount } => {
                    process.flow.refund(&idem, &tenant(), payment, amount).await
                }
                Work::Transfer(transfer) => process.transfers.transfer(&idem, transfer).await,
            }
        };
        let result = tokio::select! {
            biased;
            () = self.crash.notified() => None,
            result = run => Some(result),
        };
        self.provider.arm(Fault::None);
        match result {
            None => {
                self.note(format!("request #{index}: crashed ({fault:?})"));
                Outcome::Crashed
            }
            Some(Ok(answer)) => {
                self.note(format!(
                    "request #{index}: {} ({fault:?})",
                    describe_answer(&answer)
                ));
                Outcome::Answer(answer)
            }
            Some(Err(error)) => self.fail(format!("request #{index} failed: {error}")),
        }
    }

    /// Sends a request (again), retrying after crashes within the step as a client would.
    async fn send(&mut self, index: usize) {
        for _ in 0..ATTEMPTS_PER_STEP_MAX {
            match self.attempt(index).await {
                Outcome::Crashed => {
                    self.restart().await;
                    // The client's retry comes once the idempotency lease has run out.
                    self.advance(IDEMPOTENCY_LEASE_MS + 1_000).await;
                }
                Outcome::Answer(answer) => {
                    self.learn(index, answer);
                    return;
                }
            }
        }
    }

    /// What the client learns from an answer, checked against what it knew.
    fn learn(&mut self, index: usize, answer: Answer) {
        let (response, replayed) = match answer {
            Answer::Done(response) => (response, false),
            Answer::Replayed(response) => (response, true),
            Answer::InProgress { .. } => return,
            Answer::KeyReused => self.fail(format!(
                "request #{index} was refused as a reused key with its own body"
            )),
        };
        let request = &self.requests[index];
        if replayed {
            match &request.answered {
                Some(first) if first != &response => self.fail(format!(
                    "request #{index}: the replay differs from the first answer:\n  first  {} {}\n  replay {} {}",
                    first.status,
                    String::from_utf8_lossy(&first.body),
                    response.status,
                    String::from_utf8_lossy(&response.body)
                )),
                _ => {}
            }
        }
        if let Work::Create(_) = request.work {
            if (200..300).contains(&response.status) {
                let body: Value = serde_json::from_slice(&response.body).unwrap();
                let id = PaymentId::parse(body["id"].as_str().unwrap()).unwrap();
                match request.payment {
                    Some(known) if known != id => self.fail(format!(
                        "idempotency key {} named payment {known} and now {id}",
                        request.idem.key.as_str()
                    )),
                    Some(_) => {}
                    None => {
                        self.requests[index].payment = Some(id);
                        self.payments.push(id);
                    }
                }
            }
        }
        let request = &mut self.requests[index];
        if request.answered.is_none() {
            request.answered = Some(response);
        }
    }

    fn new_request(&mut self, work: Work, route: String, body: Value) -> usize {
        let index = self.requests.len();
        let key = format!("key-{}-{index}", self.seed);
        self.requests.push(Request {
            work,
            idem: Idempotent {
                scope: Scope {
                    tenant: TENANT.into(),
                    method: "POST".into(),
                    route,
                },
                key: IdempotencyKey::parse(&key).unwrap(),
                body: canonical_body_hash(&body),
                correlation_id: None,
            },
            answered: None,
            payment: None,
        });
        index
    }

    /// Moves time on; the simulated `serve` sweeps every `SWEEP_INTERVAL_MS` meanwhile.
    async fn advance(&mut self, delta_ms: i64) {
        let mut left = delta_ms;
        while left > 0 {
            let chunk = left.min(SWEEP_INTERVAL_MS);
            self.clock.advance_ms(chunk);
            self.provider.tick();
            self.send_new_events().await;
            left -= chunk;
            if self.clock.now_ms() - self.last_sweep_ms >= SWEEP_INTERVAL_MS {
                self.sweep(Fault::None).await;
            }
        }
    }

    async fn sweep(&mut self, fault: Fault) {
        self.last_sweep_ms = self.clock.now_ms();
        self.provider.arm(fault);
        let reconciler = self.process.reconciler.clone();
        let result = tokio::select! {
            biased;
            () = self.crash.notified() => None,
            result = reconciler.sweep_once() => Some(result),
        };
        self.provider.arm(Fault::None);
        match result {
            None => {
                self.note(format!("sweep crashed ({fault:?})"));
                self.restart().await;
            }
            Some(Ok(summary)) => {
                self.resent += summary.charges_resent as u64;
                self.cancelled_by_reference += summary.cancelled_by_reference as u64;
                let line = summary.to_string().replace('\n', "; ");
                self.note(format!("sweep ({fault:?}): {line}"));
            }
            Some(Err(error)) => self.fail(format!("sweep failed: {error}")),
        }
    }

    // ---------------------------------------------------------------------- operations

    async fn op_create(&mut self) {
        let amount = *self.rng.pick(&[50, 999, 10_000, 123_457]);
        let customer = *self.rng.pick(&CUSTOMERS);
        let method = *self.rng.pick(&METHODS);
        let automatic = self.rng.chance(60);
        let body = json!({
            "amount_minor": amount,
            "currency": "USD",
            "customer": customer,
            "payment_method": method,
            "capture": if automatic { "automatic" } else { "manual" },
        });
        let payment = NewPayment {
            tenant: tenant(),
            amount: Amount::new(amount),
            currency: Currency::parse("USD").unwrap(),
            customer: CustomerId::parse(customer).unwrap(),
            provider: ProviderName::parse(PROVIDER).unwrap(),
            payment_method: method.to_owned(),
            capture_mode: if automatic {
                CaptureMode::Automatic
            } else {
                CaptureMode::Manual
            },
            description: None,
            metadata: serde_json::Map::new(),
        };
        let index = self.new_request(Work::Create(payment), "/v1/payments".into(), body.clone());
        self.note(format!("request #{index}: create {body}"));
        self.send(index).await;
    }

    async fn op_retry(&mut self) {
        if self.requests.is_empty() {
            return self.op_create().await;
        }
        // Unsettled requests first: that is what a client retries.
        let open: Vec<usize> = (0..self.requests.len())
            .filter(|&i| !self.requests[i].settled())
            .collect();
        let index = if !open.is_empty() && self.rng.chance(75) {
            *self.rng.pick(&open)
        } else {
            self.rng.below(self.requests.len() as u64) as usize
        };
        if self.rng.chance(50) {
            self.advance(IDEMPOTENCY_LEASE_MS + 1_000).await;
        }
        self.note(format!("request #{index}: retry"));
        self.send(index).await;
    }

    /// A payment the client knows of: usually one in a state where the command makes sense,
    /// sometimes any (a refused command is a stored rejection, worth replaying too).
    async fn known_payment(&mut self, fitting: &[PaymentStatus]) -> Option<PaymentId> {
        if self.payments.is_empty() {
            return None;
        }
        if self.rng.chance(80) {
            let mut fits = Vec::new();
            for &id in &self.payments {
                let status = log::load_payment(self.process.flow.store().as_ref(), id)
                    .await
                    .unwrap()
                    .aggregate
                    .record
                    .map(|record| record.status);
                if status.is_some_and(|status| fitting.contains(&status)) {
                    fits.push(id);
                }
            }
            if !fits.is_empty() {
                return Some(*self.rng.pick(&fits));
            }
        }
        Some(*self.rng.pick(&self.payments))
    }

    async fn payment_amount(&self, id: PaymentId) -> i64 {
        log::load_payment(self.process.flow.store().as_ref(), id)
            .await
            .unwrap()
            .aggregate
            .record
            .map_or(1, |record| record.amount.minor())
    }

    async fn op_capture(&mut self) {
        let Some(payment) = self.known_payment(&[PaymentStatus::Authorized]).await else {
            return self.op_create().await;
        };
        let full = self.payment_amount(payment).await;
        let amount = if self.rng.chance(50) {
            None
        } else {
            Some(self.rng.between(1, full))
        };
        let body = json!({ "amount_minor": amount });
        let route = format!("/v1/payments/{payment}/capture");
        let index = self.new_request(
            Work::Capture {
                payment,
                amount: amount.map(Amount::new),
            },
            route,
            body,
        );
        self.note(format!("request #{index}: capture {payment} {amount:?}"));
        self.send(index).await;
    }

    async fn op_refund(&mut self) {
        let Some(payment) = self
            .known_payment(&[PaymentStatus::Captured, PaymentStatus::PartiallyRefunded])
            .await
        else {
            return self.op_create().await;
        };
        let full = self.payment_amount(payment).await;
        // Mostly within what is left (so the provider sees it), sometimes anything.
        let left = log::load_payment(self.process.flow.store().as_ref(), payment)
            .await
            .unwrap()
            .aggregate
            .record
            .map_or(0, |record| {
                record.captured.minor() - record.refunded.minor()
            });
        let amount = if left > 0 && self.rng.chance(70) {
            self.rng.between(1, left)
        } else {
            self.rng.between(1, full)
        };
        let body = json!({ "amount_minor": amount });
        let route = format!("/v1/payments/{payment}/refunds");
        let index = self.new_request(
            Work::Refund {
                payment,
                amount: Amount::new(amount),
            },
            route,
            body,
        );
        self.note(format!("request #{index}: refund {payment} {amount}"));
        self.send(index).await;
    }

    async fn op_transfer(&mut self) {
        let customer = *self.rng.pick(&CUSTOMERS);
        let amount = self.rng.between(1, 20_000);
        let from = format!("customer:{customer}:available");
        let to = "merchant:acme:available".to_owned();
        let body = json!({"from": from, "to": to, "amount_minor": amount, "currency": "USD"});
        let transfer = NewTransfer {
            tenant: tenant(),
            from: AccountName::parse(&from).unwrap(),
            to: AccountName::parse(&to).unwrap(),
            amount: Amount::new(amount),
            currency: Currency::parse("USD").unwrap(),
            description: None,
            pending: false,
            expires_at: None,
        };
        let index = self.new_request(Work::Transfer(transfer), "/v1/transfers".into(), body);
        self.note(format!("request #{index}: transfer {amount} from {from}"));
        self.send(index).await;
    }

    /// A webhook: a state some charge passed through (usually its latest; sometimes a stale or
    /// repeated one), or an `operation.updated` the provider sent, applied as the worker applies
    /// it. A dark charge's webhooks (from its dispute on) never arrive.
    async fn op_webhook(&mut self) {
        let delivery = {
            let state = self.provider.state.lock().unwrap();
            let arrives =
                |charge: &Charge| !state.dark.contains(&charge.id) || charge.dispute.is_none();
            let choice = self.rng.below(100);
            if state.charges.is_empty() {
                None
            } else if choice < 35 && !state.events.is_empty() {
                let event = self.rng.pick(&state.events).clone();
                arrives(&event.charge).then(|| {
                    (
                        event.charge.clone(),
                        webhook_facts(&event.charge, Some(&event.operation)),
                    )
                })
            } else {
                let charge = if choice < 75 {
                    self.rng.pick(&state.charges).clone()
                } else {
                    self.rng.pick(&state.history).clone()
                };
                arrives(&charge).then(|| (charge.clone(), webhook_facts(&charge, None)))
            }
        };
        let Some((charge, facts)) = delivery else {
            return self.op_create().await;
        };
        let payment = PaymentId::parse(charge.reference.as_deref().unwrap()).unwrap();
        self.deliver(payment, &facts, "webhook").await;
    }

    /// The provider's new `operation.updated` events arrive promptly, or are dropped (a later
    /// webhook, a lookup or the report must then tell). A dark charge's never arrive.
    async fn send_new_events(&mut self) {
        let new: Vec<OperationEvent> = {
            let mut state = self.provider.state.lock().unwrap();
            let new = state.events[state.events_sent..].to_vec();
            state.events_sent = state.events.len();
            new.into_iter()
                .filter(|event| !state.dark.contains(&event.charge.id))
                .collect()
        };
        for event in new {
            if self.rng.chance(EVENTS_DELIVERED_PERCENT) {
                let payment = PaymentId::parse(event.charge.reference.as_deref().unwrap()).unwrap();
                let facts = webhook_facts(&event.charge, Some(&event.operation));
                self.deliver(payment, &facts, "webhook").await;
            } else {
                self.note(format!(
                    "webhook dropped: {} {:?}",
                    event.operation.id, event.operation.status
                ));
            }
        }
    }

    /// Applies a webhook's facts in order, as the worker does.
    async fn deliver(&mut self, payment: PaymentId, facts: &[ProviderFact], what: &str) {
        for fact in facts {
            self.note(format!("{what} {payment}: {fact:?}"));
            match self
                .process
                .flow
                .finalize(Finalize::facts(payment, Some(fact.clone())))
                .await
            {
                Ok(finalized) => {
                    let status = finalized.payment.status;
                    let appended = finalized.events_appended;
                    self.note(format!("  -> {status:?}, {appended} events"));
                }
                Err(error) => self.fail(format!("{what} for {payment} failed: {error}")),
            }
        }
    }

    /// What the provider does on its side: the customer finishes a redirect, the merchant
    /// refunds in the provider's dashboard, a cardholder disputes, a dispute is decided.
    fn op_provider_side(&mut self) {
        let charges = self.provider.charges();
        let fitting = |fits: &dyn Fn(&Charge) -> bool| -> Vec<usize> {
            (0..charges.len()).filter(|&i| fits(&charges[i])).collect()
        };
        let done = match self.rng.weighted(&[45, 15, 25, 15]) {
            0 => {
                let open = fitting(&|c| c.status == ChargeStatus::RequiresAction);
                let succeed = self.rng.chance(80);
                (!open.is_empty())
                    .then(|| *self.rng.pick(&open))
                    .and_then(|index| self.provider.complete_action(index, succeed))
            }
            1 => {
                let captured = fitting(&|c| c.status == ChargeStatus::Succeeded);
                let amount = self.rng.between(1, 50_000);
                (!captured.is_empty())
                    .then(|| *self.rng.pick(&captured))
                    .and_then(|index| self.provider.refund_out_of_band(index, amount))
            }
            2 => {
                let undisputed =
                    fitting(&|c| c.status == ChargeStatus::Succeeded && c.dispute.is_none());
                (!undisputed.is_empty())
                    .then(|| *self.rng.pick(&undisputed))
                    .and_then(|index| self.provider.open_dispute(index))
            }
            _ => {
                let disputed = fitting(&|c| {
                    c.dispute
                        .as_ref()
                        .is_some_and(|d| d.status == DisputeStatus::Open)
                });
                let won = self.rng.chance(50);
                (!disputed.is_empty())
                    .then(|| *self.rng.pick(&disputed))
                    .and_then(|index| self.provider.close_dispute(index, won))
            }
        };
        if let Some(done) = done {
            self.note(format!("provider: {done}"));
        }
    }

    async fn op_clock(&mut self) {
        let delta = *self.rng.pick(&[
            1_000,
            30_000,
            IDEMPOTENCY_LEASE_MS + 1_000,
            5 * 60_000,
            CLOCK_JUMP_MS_MAX,
        ]);
        self.note(format!("clock +{}s", delta / 1_000));
        self.advance(delta).await;
    }

    async fn op_sweep(&mut self) {
        let fault = self.random_fault();
        self.sweep(fault).await;
    }

    async fn op_seal(&mut self) {
        let sealer = Sealer::new(self.process.database.clone(), self.clock.clone());
        if let Err(error) = sealer.seal_once().await {
            self.fail(format!("sealing failed: {error}"));
        }
    }

    async fn op_idle_crash(&mut self) {
        self.note("process crashed while idle");
        self.restart().await;
    }

    async fn step_once(&mut self) {
        self.send_new_events().await;
        // create, retry, capture, refund, transfer, webhook, provider side, clock, sweep, seal,
        // idle crash
        match self.rng.weighted(&[20, 12, 12, 14, 4, 15, 10, 10, 6, 2, 2]) {
            0 => self.op_create().await,
            1 => self.op_retry().await,
            2 => self.op_capture().await,
            3 => self.op_refund().await,
            4 => self.op_transfer().await,
            5 => self.op_webhook().await,
            6 => self.op_provider_side(),
            7 => self.op_clock().await,
            8 => self.op_sweep().await,
            9 => self.op_seal().await,
            _ => self.op_idle_crash().await,
        }
    }

    // ------------------------------------------------------------------------- checks

    async fn check(&mut self) {
        let checker = Checker::new(self.process.database.clone(), self.clock.clone());
        let report = match checker.check_once().await {
            Ok(report) => report,
            Err(error) => self.fail(format!("the checker could not run: {error}")),
        };
        if !report.is_ok() {
            let listed: Vec<String> = report.violations.iter().map(|v| v.to_string()).collect();
            self.fail(format!("invariant violated:\n  {}", listed.join("\n  ")));
        }
        self.check_provider();
    }

    /// The provider holds at most one charge per payment, and one capture or refund per key.
    fn check_provider(&self) {
        let mut per_payment: BTreeMap<String, usize> = BTreeMap::new();
        for charge in self.provider.charges() {
            *per_payment
                .entry(charge.reference.clone().unwrap_or_default())
                .or_default() += 1;
        }
        if let Some((payment, count)) = per_payment.iter().find(|(_, &count)| count > 1) {
            self.fail(format!(
                "the provider holds {count} charges for payment {payment}"
            ));
        }
        let state = self.provider.state.lock().unwrap();
        let mut per_key: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for record in &state.operations {
            let op = &record.operation;
            let kind = if op.kind == OperationKind::Capture {
                "captures"
            } else {
                "refunds"
            };
            *per_key.entry((kind, &op.idempotency_key)).or_default() += 1;
        }
        if let Some(((kind, key), count)) = per_key.iter().find(|(_, &count)| count > 1) {
            self.fail(format!("the provider holds {count} {kind} under key {key}"));
        }
    }

    /// Every payment the ledger has: the ones the client learnt of and the ones the provider
    /// charged (a create whose answer never came).
    async fn all_payments(&self) -> Vec<PaymentRecord> {
        let mut ids: BTreeSet<PaymentId> = self.payments.iter().copied().collect();
        for charge in self.provider.charges() {
            ids.insert(PaymentId::parse(charge.reference.as_deref().unwrap()).unwrap());
        }
        let mut records = Vec::new();
        for id in ids {
            let loaded = log::load_payment(self.process.flow.store().as_ref(), id)
                .await
                .unwrap();
            records.extend(loaded.aggregate.record);
        }
        records
    }

    /// The PSP keys of the operations that have an `operation_unresolved` exception.
    async fn unresolved_keys(&self) -> HashSet<String> {
        let listed = exceptions::list(&self.process.database, &ExceptionScope::All, None, i64::MAX)
            .await
            .unwrap();
        listed
            .iter()
            .filter(|exception| exception.kind == "operation_unresolved")
            .filter_map(|exception| exception.local["operation"]["psp_key"].as_str())
            .map(str::to_owned)
            .collect()
    }

    /// Every operation of every payment is closed, unless the profile makes it unresolvable:
    /// a pending one of a provider that tells only by webhook, past its deadline; a requested
    /// one past its key's lifetime. Those must have their `operation_unresolved` exception.
    async fn check_operations_closed(&mut self, when: &str) -> usize {
        let profile = self.provider.profile();
        let unresolved = self.unresolved_keys().await;
        let now_ms = self.clock.now_ms();
        let mut open = 0;
        for record in self.all_payments().await {
            for op in record.operations.iter().filter(|op| op.state.is_open()) {
                open += 1;
                let age_ms = now_ms - op.requested_at.timestamp_millis();
                let legitimate = match op.state {
                    OperationState::Pending => {
                        profile.webhooks_only() && age_ms >= OPERATION_PENDING_DEADLINE_MS
                    }
                    _ => age_ms >= profile.key_lifetime_ms,
                };
                let excepted = unresolved.contains(&op.psp_key);
                if !legitimate || !excepted {
                    self.fail(format!(
                        "{when}: {} {} of payment {} is still {} (age {}s, profile {profile:?}, exception: {excepted})",
                        op.kind.as_str(),
                        op.psp_key,
                        record.id,
                        op.state.as_str(),
                        age_ms / 1_000
                    ));
                }
            }
        }
        open
    }

    /// The end of a seed: every open request is retried, the provider decides all it holds,
    /// time runs on past the operation timeouts, the key lifetimes and the pending deadline with
    /// the reconciler sweeping, and every operation must be closed (or legitimately excepted).
    /// Then every final state is delivered (except a dark charge's: the sweep and the report
    /// must have done it), and the ledger must agree with the provider about every charge and
    /// every operation.
    async fn converge(&mut self) -> usize {
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

    /// The ledger agrees with the provider about every charge that no person has to look at:
    /// status, captured, refunded net of reversals, the dispute and its outcome, and every
    /// capture and refund operation's outcome.
    async fn check_agreement(&mut self) {
        let (ops_by_key, rejected_keys, out_of_band) = {
            let state = self.provider.state.lock().unwrap();
            let ops: HashMap<String, Operation> = state
                .operations
                .iter()
                .map(|record| {
                    (
                        record.operation.idempotency_key.clone(),
                        record.operation.clone(),
                    )
                })
                .collect();
            let rejected: HashSet<String> = state
                .keys
                .iter()
                .filter(|(_, record)| matches!(record.answer, Err(ProviderError::Rejected(_))))
                .map(|(key, _)| key.clone())
                .collect();
            (ops, rejected, state.out_of_band.clone())
        };
        for charge in self.provider.charges() {
            let payment = PaymentId::parse(charge.reference.as_deref().unwrap()).unwrap();
            let record = log::load_payment(self.process.flow.store().as_ref(), payment)
                .await
                .unwrap()
                .aggregate
                .record
                .unwrap();
            // A flagged payment waits for a person: its books are not expected to agree.
            if !record.flags.is_empty() {
                continue;
            }
            let dispute_agrees = match (&charge.dispute, &record.dispute) {
                (None, None) => true,
                (Some(theirs), Some(ours)) => {
                    ours.amount.minor() == theirs.amount_minor
                        && match theirs.status {
                            DisputeStatus::Open => ours.outcome.is_none(),
                            DisputeStatus::Won => ours.outcome == Some(DisputeOutcome::Won),
                            DisputeStatus::Lost => ours.outcome == Some(DisputeOutcome::Lost),
                        }
                }
                _ => false,
            };
            let agrees = dispute_agrees
                && match charge.status {
                    ChargeStatus::Succeeded => {
                        record.captured.minor() == charge.amount_captured
                            && record.refunded.minor() == charge.amount_refunded
                            && provider_fees_agree(&record, &charge)
                    }
                    ChargeStatus::RequiresCapture => record.status == PaymentStatus::Authorized,
                    ChargeStatus::RequiresAction => matches!(
                        record.status,
                        PaymentStatus::RequiresAction | PaymentStatus::Expired
                    ),
                    ChargeStatus::Failed => matches!(
                        record.status,
                        PaymentStatus::Failed | PaymentStatus::Expired
                    ),
                };
            if !agrees {
                self.fail(format!(
                    "payment {payment} disagrees with its charge: ledger {:?} captured {} refunded {} dispute {:?}, provider {:?} captured {} refunded {} dispute {:?}",
                    record.status,
                    record.captured.minor(),
                    record.refunded.minor(),
                    record.dispute,
                    charge.status,
                    charge.amount_captured,
                    charge.amount_refunded,
                    charge.dispute,
                ));
            }
            for op in &record.operations {
                let theirs = ops_by_key.get(&op.psp_key);
                let agrees = match (op.state, theirs.map(|theirs| theirs.status)) {
                    (OperationState::Succeeded, Some(OperationStatus::Succeeded)) => true,
                    (OperationState::Reversed, Some(OperationStatus::Failed)) => true,
                    (OperationState::Refused, Some(OperationStatus::Failed)) => true,
                    (OperationState::Refused, None) => rejected_keys.contains(&op.psp_key),
                    // A cumulative total goes to open refunds oldest first: a dashboard refund
                    // covers one of ours that never reached the provider (the books agree).
                    (OperationState::Succeeded, None) => out_of_band.contains(&charge.id),
                    _ => false,
                };
                if !agrees {
                    self.fail(format!(
                        "{} {} of payment {payment} is {} here, at the provider {:?}",
                        op.kind.as_str(),
                        op.psp_key,
                        op.state.as_str(),
                        theirs
                    ));
                }
            }
        }
    }

    /// One attempt without faults or crashes (the provider is healthy at the end).
    async fn plain_attempt(&mut self, index: usize, idem: &Idempotent) -> Answer {
        let work = self.requests[index].work.clone();
        let flow = &self.process.flow;
        let result = match work {
            Work::Create(payment) => flow.create(idem, payment).await,
            Work::Capture { payment, amount } => {
                flow.capture(idem, &tenant(), payment, amount).await
            }
            Work::Refund { payment, amount } => flow.refund(idem, &tenant(), payment, amount).await,
            Work::Transfer(transfer) => self.process.transfers.transfer(idem, transfer).await,
        };
        match result {
            Ok(answer) => {
                self.note(format!(
                    "request #{index}: final retry {}",
                    describe_answer(&answer)
                ));
                answer
            }
            Err(error) => self.fail(format!("request #{index} failed at the end: {error}")),
        }
    }
}

/// The facts a webhook about `charge` (and `operation`, for `operation.updated`) stands for, in
/// the order the worker applies them: the operation's outcome, then what the charge stands for.
fn webhook_facts(charge: &Charge, operation: Option<&Operation>) -> Vec<ProviderFact> {
    let mut out = Vec::new();
    if let Some(op) = operation {
        out.extend(facts::operation_fact(op, None));
    }
    out.extend(facts::charge_facts(charge, facts::Read::Snapshot));
    out
}

fn tenant() -> TenantId {
    TenantId::parse(TENANT).unwrap()
}

fn describe_answer(answer: &Answer) -> String {
    match answer {
        Answer::Done(response) => format!(
            "done {} {}",
            response.status,
            String::from_utf8_lossy(&response.body)
        ),
        Answer::Replayed(response) => format!(
            "replayed {} {}",
            response.status,
            String::from_utf8_lossy(&response.body)
        ),
        Answer::InProgress { retry_after_s } => {
            format!("in progress (retry after {retry_after_s}s)")
        }
        Answer::KeyReused => "key reused".into(),
    }
}

/// What one seed did, for the summary line.
#[derive(Default)]
struct SeedStats {
    crashes: u64,
    requests: u64,
    payments: u64,
    /// Captures and refunds the provider holds, and of those the asynchronous ones.
    operations: u64,
    asynchronous: u64,
    refusals: u64,
    reversals: u64,
    disputes: u64,
    /// Disputes whose webhooks were all dropped.
    dark: u64,
    /// Operations left open with their `operation_unresolved` exception.
    unresolved: u64,
    /// Payments left flagged for a person at the end, by the shape of their flags.
    flagged: u64,
    /// Never-answered charges the sweeps sent again, and cancelled by reference.
    resent: u64,
    cancelled_by_reference: u64,
    flags: BTreeMap<String, u64>,
}

impl SeedStats {
    fn add(&mut self, other: &SeedStats) {
        self.crashes += other.crashes;
        self.requests += other.requests;
        self.payments += other.payments;
        self.operations += other.operations;
        self.asynchronous += other.asynchronous;
        self.refusals += other.refusals;
        self.reversals += other.reversals;
        self.disputes += other.disputes;
        self.dark += other.dark;
        self.unresolved += other.unresolved;
        self.flagged += other.flagged;
        self.resent += other.resent;
        self.cancelled_by_reference += other.cancelled_by_reference;
        for (flag, count) in &other.flags {
            *self.flags.entry(flag.clone()).or_default() += count;
        }
    }
}

async fn run_seed(seed: u64, steps: u32, verbose: bool) -> SeedStats {
    let mut sim = Sim::new(seed).await;
    let profile = sim.provider.profile();
    sim.note(format!("profile {profile:?}"));
    for step in 1..=steps {
        sim.step = step;
        sim.step_once().await;
        sim.check().await;
    }
    let unresolved = sim.converge().await;
    if verbose {
        println!("seed {seed} passed:\n{}", sim.trace);
    }
    let mut flags: BTreeMap<String, u64> = BTreeMap::new();
    let mut flagged = 0;
    for record in sim.all_payments().await {
        flagged += usize::from(record.needs_review());
        for flag in &record.flags {
            // The reconciler's flags name their exception, shaped below.
            if !flag.detail.starts_with("reconciliation exception") {
                *flags.entry(flag_shape(&flag.detail)).or_default() += 1;
            }
        }
    }
    let listed = exceptions::list(&sim.process.database, &ExceptionScope::All, None, i64::MAX)
        .await
        .unwrap();
    for exception in listed.iter().filter(|e| e.resolution == "manual") {
        let shape = format!(
            "{} exception, difference {}",
            exception.kind, exception.difference
        );
        *flags.entry(flag_shape(&shape)).or_default() += 1;
    }
    let state = sim.provider.state.lock().unwrap();
    SeedStats {
        crashes: u64::from(sim.crashes),
        requests: sim.requests.len() as u64,
        payments: sim.payments.len() as u64,
        operations: state.operations.len() as u64,
        asynchronous: if profile.async_modifications {
            state.operations.len() as u64
        } else {
            0
        },
        refusals: state.refusals,
        reversals: state.reversals,
        disputes: state.disputes,
        dark: state.dark.len() as u64,
        unresolved: unresolved as u64,
        flagged: flagged as u64,
        resent: sim.resent,
        cancelled_by_reference: sim.cancelled_by_reference,
        flags,
    }
}

/// A flag's detail without its amounts and ids, to count flags by kind.
fn flag_shape(detail: &str) -> String {
    let mut shape = String::with_capacity(detail.len());
    for c in detail.chars() {
        if !c.is_ascii_digit() {
            shape.push(c);
        } else if !shape.ends_with('#') {
            shape.push('#');
        }
    }
    shape
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|raw| {
        raw.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {raw:?}"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulation_seeds_hold_every_invariant() {
    let steps = env_u64("SIMULATION_STEPS").map_or(STEPS_DEFAULT, |steps| steps as u32);
    if let Some(seed) = env_u64("SIMULATION_SEED") {
        run_seed(seed, steps, true).await;
        return;
    }
    let start = env_u64("SIMULATION_SEED_START").unwrap_or(0);
    let count = env_u64("SIMULATION_SEEDS").unwrap_or(SEEDS_DEFAULT);
    let jobs = env_u64("SIMULATION_JOBS").unwrap_or(JOBS_DEFAULT).max(1) as usize;
    let began = std::time::Instant::now();
    let mut total = SeedStats::default();
    let mut seeds = start..start + count;
    let mut running = tokio::task::JoinSet::new();
    loop {
        while running.len() < jobs {
            let Some(seed) = seeds.next() else { break };
            running.spawn(async move { (seed, run_seed(seed, steps, false).await) });
        }
        let Some(joined) = running.join_next().await else {
            break;
        };
        match joined {
            Ok((_seed, stats)) => total.add(&stats),
            // The seed's panic carries its number, step and trace: pass it on as it is.
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => panic!("a seed's task failed: {error}"),
        }
    }
    println!(
        "simulation: {count} seeds from {start} x {steps} steps in {:.1}s: {} requests, {} payments, {} crashes; provider: {} captures and refunds ({} asynchronous), {} refused, {} reversed, {} disputes ({} with every webhook dropped); {} operations left unresolved with their exception, {} payments flagged for review; {} never-answered charges sent again, {} cancelled by reference",
        began.elapsed().as_secs_f64(),
        total.requests,
        total.payments,
        total.crashes,
        total.operations,
        total.asynchronous,
        total.refusals,
        total.reversals,
        total.disputes,
        total.dark,
        total.unresolved,
        total.flagged,
        total.resent,
        total.cancelled_by_reference,
    );
    for (flag, count) in &total.flags {
        println!("  flagged {count}x: {flag}");
    }
}

/// Our posted provider fees are the provider's, one per balance transaction.
fn provider_fees_agree(record: &PaymentRecord, charge: &Charge) -> bool {
    let ours: Vec<(&str, i64)> = record
        .provider_fees
        .iter()
        .map(|fee| (fee.transaction_id.as_str(), fee.fee.minor()))
        .collect();
    let theirs: Vec<(&str, i64)> = charge
        .provider_fees
        .iter()
        .filter(|fee| fee.fee_minor != 0)
        .map(|fee| (fee.transaction_id.as_str(), fee.fee_minor))
        .collect();
    ours == theirs
}
