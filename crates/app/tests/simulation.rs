//! A deterministic simulation of the payment flow, in the spirit of TigerBeetle's VOPR.
//!
//! From a seed, one pseudo-random stream drives the real `app` layer (`PaymentFlow`,
//! `TransferFlow`, `Reconciler`, `Sealer`) on a SQLite file, against an in-memory provider and a
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
//! **Checked after every step:** the real invariant checker (`Checker::check_once`: zero-sum
//! entries, stream versions, one capture posting per captured payment, idempotency leases, the
//! events table's immutability, seals), and simulation truths: the provider holds at most one
//! charge per payment; an idempotency key that got a 2xx names one payment forever; a replay is
//! byte for byte the first answer. At the end of a seed, time runs on (the reconciler sweeping)
//! and every charge's final state is delivered; the ledger must then agree with the provider.
//!
//! Run: `cargo test -p asiento-app --test simulation` (`SIMULATION_SEEDS`, default 1000,
//! `SIMULATION_SEED_START`, `SIMULATION_STEPS`, default 20). A failure prints its seed, step and
//! trace; `SIMULATION_SEED=<n> cargo test -p asiento-app --test simulation` replays it exactly
//! (the trace is printed then, too). `scripts/simulate` runs many more seeds in release.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use asiento_app::clock::{Clock, ManualClock};
use asiento_app::facts::charge_status_fact as fact_from_charge;
use asiento_app::idempotency::{canonical_body_hash, IdempotencyKey, Scope, StoredResponse};
use asiento_app::invariants::{Checker, Sealer};
use asiento_app::log;
use asiento_app::payments::{Idempotent, NewPayment, PaymentFlow};
use asiento_app::providers::{ConfiguredProvider, Providers};
use asiento_app::reconcile::{Reconciler, ReconcilerConfig};
use asiento_app::reply::{Answer, Render, Reply};
use asiento_app::transfers::{NewTransfer, TransferFlow};
use asiento_domain::{
    AccountName, Amount, CaptureMode, Currency, CustomerId, FeeSchedule, PaymentId, PaymentStatus,
    ProviderName, TenantId,
};
use asiento_eventstore::Database;
use asiento_psp::{
    Capabilities, Charge, ChargeOutcome, ChargeStatus, CreateCharge, NextAction, Operation,
    OperationAnswer, OperationKind, OperationStatus, Provider, ProviderError, Rejection,
    ReportLine,
};
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
const FEE_BPS: u32 = 300;
const TENANT: &str = "acme";
const PROVIDER: &str = "sim";
const CUSTOMERS: [&str; 3] = ["c1", "c2", "c3"];
const METHODS: [&str; 3] = ["pm_card_ok", "pm_card_declined", "pm_card_3ds"];

// ------------------------------------------------------------------------------------ the rng

/// SplitMix64: tiny, fast, and fixed forever, so a seed replays on every toolchain and every
/// version of every crate (a dependency's generator may change its stream between releases).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5EED_5EED_5EED_5EED)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`); the modulo bias is irrelevant here.
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `low..=high`.
    fn between(&mut self, low: i64, high: i64) -> i64 {
        low + self.below((high - low + 1) as u64) as i64
    }

    /// True with probability `percent`%.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// An index chosen by weight.
    fn weighted(&mut self, weights: &[u64]) -> usize {
        let total: u64 = weights.iter().sum();
        let mut pick = self.below(total);
        for (index, weight) in weights.iter().enumerate() {
            if pick < *weight {
                return index;
            }
            pick -= weight;
        }
        weights.len() - 1
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

// ------------------------------------------------------------------------- the provider

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

#[derive(Default)]
struct ProviderState {
    /// In creation order, so that iterating never depends on random ids.
    charges: Vec<Charge>,
    by_key: HashMap<String, usize>,
    by_id: HashMap<String, usize>,
    /// Answers of captures and refunds by their idempotency key: a repeat replays the answer.
    captures: HashMap<String, Result<OperationAnswer, ProviderError>>,
    refunds: HashMap<String, Result<OperationAnswer, ProviderError>>,
    refunds_made: u64,
    /// Every state every charge passed through, for stale and repeated webhooks.
    history: Vec<Charge>,
    /// Armed for the next write, then back to `None`.
    fault: Fault,
    /// The next lookup answers `Unknown`.
    lookup_fails: bool,
}

/// A provider in memory: one charge per idempotency key, ever; faults armed by the simulation.
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

impl SimProvider {
    fn arm(&self, fault: Fault) {
        self.state.lock().unwrap().fault = fault;
    }

    /// Runs a write under the armed fault. `effect` runs under the lock; the lock is never held
    /// across an await.
    async fn write<T>(
        &self,
        effect: impl FnOnce(&mut ProviderState, DateTime<Utc>) -> T,
        lost: impl FnOnce(&str) -> T,
    ) -> T {
        let now = self.clock.now();
        let fault = std::mem::replace(&mut self.state.lock().unwrap().fault, Fault::None);
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

    fn lookup<T>(&self, answer: impl FnOnce(&ProviderState) -> T) -> Result<T, ProviderError> {
        let mut state = self.state.lock().unwrap();
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
        charge.updated = now;
        let snapshot = charge.clone();
        state.history.push(snapshot.clone());
        Some(format!("{} -> {:?}", snapshot.id, snapshot.status))
    }

    /// A refund made in the provider's dashboard, not through us.
    fn refund_out_of_band(&self, index: usize, amount_minor: i64) -> Option<String> {
        let now = self.clock.now();
        let mut state = self.state.lock().unwrap();
        let charge = state.charges.get_mut(index)?;
        let left = charge.amount_captured - charge.amount_refunded;
        if charge.status != ChargeStatus::Succeeded || left <= 0 {
            return None;
        }
        let amount = amount_minor.clamp(1, left);
        charge.amount_refunded += amount;
        charge.updated = now;
        let snapshot = charge.clone();
        state.history.push(snapshot.clone());
        Some(format!("{} refunded {amount} out of band", snapshot.id))
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
    let charge = Charge {
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
        created: now,
        updated: now,
    };
    state.charges.push(charge.clone());
    state.by_key.insert(req.idempotency_key.clone(), index);
    state.by_id.insert(id, index);
    state.history.push(charge.clone());
    charge
}

/// The succeeded operation `kind` on `charge` (as it stands after), keyed `key`.
fn succeeded(
    kind: OperationKind,
    id: String,
    charge: Charge,
    amount_minor: i64,
    key: &str,
    now: DateTime<Utc>,
) -> OperationAnswer {
    OperationAnswer {
        operation: Operation {
            id,
            kind,
            charge: charge.id.clone(),
            idempotency_key: key.to_owned(),
            amount_minor,
            currency: charge.currency.clone(),
            status: OperationStatus::Succeeded,
            failure_reason: None,
            created: now,
            updated: now,
        },
        charge: Some(charge),
    }
}

fn capture_effect(
    state: &mut ProviderState,
    now: DateTime<Utc>,
    charge_id: &str,
    amount_minor: Option<i64>,
    key: &str,
) -> Result<OperationAnswer, ProviderError> {
    if let Some(answer) = state.captures.get(key) {
        return answer.clone();
    }
    let answer = match state.by_id.get(charge_id).copied() {
        None => Err(ProviderError::Rejected(rejection("no_such_charge"))),
        Some(index) => {
            let charge = &mut state.charges[index];
            let amount = amount_minor.unwrap_or(charge.amount_minor);
            if charge.status != ChargeStatus::RequiresCapture {
                Err(ProviderError::Rejected(rejection("charge_not_capturable")))
            } else if amount <= 0 || amount > charge.amount_minor {
                Err(ProviderError::Rejected(rejection("amount_too_large")))
            } else {
                charge.status = ChargeStatus::Succeeded;
                charge.amount_captured = amount;
                charge.updated = now;
                let snapshot = charge.clone();
                state.history.push(snapshot.clone());
                let id = format!("cap_{}", snapshot.id);
                Ok(succeeded(
                    OperationKind::Capture,
                    id,
                    snapshot,
                    amount,
                    key,
                    now,
                ))
            }
        }
    };
    state.captures.insert(key.to_owned(), answer.clone());
    answer
}

fn refund_effect(
    state: &mut ProviderState,
    now: DateTime<Utc>,
    charge_id: &str,
    amount_minor: i64,
    key: &str,
) -> Result<OperationAnswer, ProviderError> {
    if let Some(answer) = state.refunds.get(key) {
        return answer.clone();
    }
    let answer = match state.by_id.get(charge_id).copied() {
        None => Err(ProviderError::Rejected(rejection("no_such_charge"))),
        Some(index) => {
            let charge = &mut state.charges[index];
            let left = charge.amount_captured - charge.amount_refunded;
            if charge.status != ChargeStatus::Succeeded || amount_minor <= 0 || amount_minor > left
            {
                Err(ProviderError::Rejected(rejection(
                    "refund_exceeds_captured",
                )))
            } else {
                charge.amount_refunded += amount_minor;
                charge.updated = now;
                let snapshot = charge.clone();
                state.history.push(snapshot.clone());
                state.refunds_made += 1;
                let id = format!("re_{:06}", state.refunds_made);
                Ok(succeeded(
                    OperationKind::Refund,
                    id,
                    snapshot,
                    amount_minor,
                    key,
                    now,
                ))
            }
        }
    };
    state.refunds.insert(key.to_owned(), answer.clone());
    answer
}

#[async_trait]
impl Provider for SimProvider {
    fn name(&self) -> &str {
        PROVIDER
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::SIM
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
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        self.write(
            |state, now| refund_effect(state, now, charge_id, amount_minor, idempotency_key),
            |reason| Err(unknown(reason)),
        )
        .await
    }

    async fn cancel(
        &self,
        charge_id: &str,
        _idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        // The flows under simulation never cancel.
        Err(ProviderError::Rejected(rejection(&format!(
            "cancel_not_simulated_{charge_id}"
        ))))
    }

    async fn find_operation_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Operation>, ProviderError> {
        self.lookup(|state| {
            state
                .captures
                .get(idempotency_key)
                .or_else(|| state.refunds.get(idempotency_key))
                .and_then(|answer| answer.as_ref().ok())
                .map(|answer| answer.operation.clone())
        })
    }

    async fn get_operation(&self, id: &str) -> Result<Option<Operation>, ProviderError> {
        self.lookup(|state| {
            state
                .captures
                .values()
                .chain(state.refunds.values())
                .filter_map(|answer| answer.as_ref().ok())
                .find(|answer| answer.operation.id == id)
                .map(|answer| answer.operation.clone())
        })
    }

    async fn get_charge(&self, charge_id: &str) -> Result<Option<Charge>, ProviderError> {
        self.lookup(|state| {
            state
                .by_id
                .get(charge_id)
                .map(|&index| state.charges[index].clone())
        })
    }

    async fn find_charge_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Charge>, ProviderError> {
        self.lookup(|state| {
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
    ) -> Result<Vec<ReportLine>, ProviderError> {
        self.lookup(|state| {
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
                    fee_minor: 0,
                    currency: charge.currency.clone(),
                    reference: charge.reference.clone(),
                    idempotency_key: charge.idempotency_key.clone(),
                    dispute_status: None,
                    dispute: None,
                    last_touched: charge.updated,
                })
                .collect()
        })
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
            Reply::Transfer { transfer, position } => (
                201,
                json!({"entry": transfer.entry_id.map(|id| id.to_string()), "position": position}),
            ),
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
    transfers: TransferFlow,
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
    let store = database.event_store();
    let flow = PaymentFlow {
        database: database.clone(),
        store: store.clone(),
        commits: asiento_app::group_commit::GroupCommit::new(store),
        guards: Default::default(),
        committed: Default::default(),
        providers,
        clock: clock.clone(),
        render: Arc::new(SimRender),
        idempotency_lease_ms: IDEMPOTENCY_LEASE_MS,
    };
    let transfers = TransferFlow {
        database: database.clone(),
        store: database.event_store(),
        clock,
        render: Arc::new(SimRender),
        idempotency_lease_ms: IDEMPOTENCY_LEASE_MS,
    };
    let reconciler = Reconciler::new(flow.clone(), ReconcilerConfig::default());
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
        let provider = Arc::new(SimProvider {
            state: Mutex::new(ProviderState::default()),
            clock: clock.clone(),
            crash: crash.clone(),
        });
        let process = start_process(&url, &clock, &provider).await;
        process.database.migrate().await.unwrap();
        Sim {
            seed,
            step: 0,
            rng: Rng::new(seed),
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
                let status = log::load_payment(self.process.flow.store.as_ref(), id)
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
        log::load_payment(self.process.flow.store.as_ref(), id)
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
        let amount = self.rng.between(1, full);
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
        };
        let index = self.new_request(Work::Transfer(transfer), "/v1/transfers".into(), body);
        self.note(format!("request #{index}: transfer {amount} from {from}"));
        self.send(index).await;
    }

    /// A webhook: a state some charge passed through (usually its latest; sometimes a stale or
    /// repeated one), applied as the worker applies it.
    async fn op_webhook(&mut self) {
        let snapshot = {
            let state = self.provider.state.lock().unwrap();
            if state.charges.is_empty() {
                None
            } else if self.rng.chance(60) {
                Some(self.rng.pick(&state.charges).clone())
            } else {
                Some(self.rng.pick(&state.history).clone())
            }
        };
        let Some(charge) = snapshot else {
            return self.op_create().await;
        };
        let fact = fact_from_charge(&charge);
        let payment = PaymentId::parse(charge.reference.as_deref().unwrap()).unwrap();
        self.note(format!("webhook {payment}: {fact:?}"));
        match self.process.flow.finalize(payment, Some(fact)).await {
            Ok(finalized) => {
                let status = finalized.payment.status;
                let appended = finalized.events_appended;
                self.note(format!("  -> {status:?}, {appended} events"));
            }
            Err(error) => self.fail(format!("webhook for {payment} failed: {error}")),
        }
    }

    /// The customer finishes a redirect, or the merchant refunds in the provider's dashboard.
    fn op_provider_side(&mut self) {
        let count = self.provider.state.lock().unwrap().charges.len();
        if count == 0 {
            return;
        }
        let index = self.rng.below(count as u64) as usize;
        let done = if self.rng.chance(70) {
            let succeed = self.rng.chance(80);
            self.provider.complete_action(index, succeed)
        } else {
            let amount = self.rng.between(1, 50_000);
            self.provider.refund_out_of_band(index, amount)
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
        // create, retry, capture, refund, transfer, webhook, provider side, clock, sweep, seal,
        // idle crash
        match self.rng.weighted(&[22, 12, 10, 10, 5, 15, 6, 10, 6, 2, 2]) {
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
    }

    /// The end of a seed: every open request is retried, time runs on with the reconciler
    /// sweeping, and every charge's final state is delivered. Then the ledger must agree with the
    /// provider about every charge.
    async fn converge(&mut self) {
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
        self.sweep(Fault::None).await;
        for charge in self.provider.charges() {
            let payment = PaymentId::parse(charge.reference.as_deref().unwrap()).unwrap();
            let fact = fact_from_charge(&charge);
            if let Err(error) = self.process.flow.finalize(payment, Some(fact)).await {
                self.fail(format!("final delivery for {payment} failed: {error}"));
            }
        }
        self.check().await;
        for charge in self.provider.charges() {
            let payment = PaymentId::parse(charge.reference.as_deref().unwrap()).unwrap();
            let record = log::load_payment(self.process.flow.store.as_ref(), payment)
                .await
                .unwrap()
                .aggregate
                .record
                .unwrap();
            // A flagged payment waits for a person: its books are not expected to agree.
            if !record.flags.is_empty() {
                continue;
            }
            let agrees = match charge.status {
                ChargeStatus::Succeeded => {
                    record.captured.minor() == charge.amount_captured
                        && record.refunded.minor() == charge.amount_refunded
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
                    "payment {payment} disagrees with its charge: ledger {:?} captured {} refunded {}, provider {:?} captured {} refunded {}",
                    record.status,
                    record.captured.minor(),
                    record.refunded.minor(),
                    charge.status,
                    charge.amount_captured,
                    charge.amount_refunded
                ));
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
struct SeedStats {
    crashes: u32,
    requests: usize,
    payments: usize,
}

async fn run_seed(seed: u64, steps: u32, verbose: bool) -> SeedStats {
    let mut sim = Sim::new(seed).await;
    for step in 1..=steps {
        sim.step = step;
        sim.step_once().await;
        sim.check().await;
    }
    sim.converge().await;
    if verbose {
        println!("seed {seed} passed:\n{}", sim.trace);
    }
    SeedStats {
        crashes: sim.crashes,
        requests: sim.requests.len(),
        payments: sim.payments.len(),
    }
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
    let (mut crashes, mut requests, mut payments) = (0u64, 0usize, 0usize);
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
            Ok((_seed, stats)) => {
                crashes += u64::from(stats.crashes);
                requests += stats.requests;
                payments += stats.payments;
            }
            // The seed's panic carries its number, step and trace: pass it on as it is.
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => panic!("a seed's task failed: {error}"),
        }
    }
    println!(
        "simulation: {count} seeds from {start} x {steps} steps in {:.1}s: {requests} requests, {payments} payments, {crashes} crashes",
        began.elapsed().as_secs_f64()
    );
}
