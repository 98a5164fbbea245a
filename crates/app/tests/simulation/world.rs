//! The world a seed runs in: the "process" (database pool, flows, reconciler: everything a crash
//! loses, while the SQLite file keeps what committed), the manual clock, the simulated provider,
//! the client's requests and the trace. It runs one attempt of a request under a drawn fault,
//! racing the provider's crash signal so that a crash drops the operation at the await where a
//! real process would die, then restarts the process; it moves time on with the sweeps a `serve`
//! would run, and delivers the provider's webhooks as the worker applies them. A failure panics
//! with the seed, the step and the trace, so that it replays.

use std::fmt::Write as _;
use std::sync::Arc;

use asiento_app::clock::{Clock, ManualClock};
use asiento_app::facts;
use asiento_app::idempotency::{canonical_body_hash, IdempotencyKey, Scope};
use asiento_app::ledger::LedgerFlow;
use asiento_app::payments::{Finalize, Idempotent, PaymentFlow};
use asiento_app::providers::{ConfiguredProvider, Providers};
use asiento_app::reconcile::{Reconciler, ReconcilerConfig};
use asiento_app::reply::Answer;
use asiento_domain::{Amount, FeeSchedule, PaymentId, ProviderFact, ProviderName};
use asiento_eventstore::Database;
use asiento_psp::{Charge, Operation, Provider};
use asiento_testkit::Rng;
use serde_json::Value;
use tokio::sync::Notify;

use super::client::{describe_answer, tenant, Outcome, Request, SimRender, Work};
use super::knobs::{
    Fault, Profile, ATTEMPTS_PER_STEP_MAX, EPOCH_MS, EVENTS_DELIVERED_PERCENT, FEE_BPS,
    IDEMPOTENCY_LEASE_MS, OPERATION_PENDING_DEADLINE_MS, OPERATION_TIMEOUT_MS, PROVIDER,
    SWEEP_INTERVAL_MS, TENANT,
};
use super::provider::{OperationEvent, SimProvider};

/// The "process": everything that dies in a crash. The database file does not.
pub struct Process {
    pub database: Database,
    pub flow: PaymentFlow,
    transfers: LedgerFlow,
    reconciler: Reconciler,
}

pub struct Sim {
    seed: u64,
    pub step: u32,
    pub rng: Rng,
    url: String,
    _dir: Box<dyn std::any::Any + Send + Sync>,
    pub clock: Arc<ManualClock>,
    pub provider: Arc<SimProvider>,
    crash: Arc<Notify>,
    pub process: Process,
    pub requests: Vec<Request>,
    /// Payments the client learnt of, in the order it learnt them.
    pub payments: Vec<PaymentId>,
    last_sweep_ms: i64,
    pub crashes: u32,
    /// What the sweeps did about charges never answered: sent again, cancelled by reference.
    pub resent: u64,
    pub cancelled_by_reference: u64,
    pub trace: String,
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
    pub async fn new(seed: u64) -> Sim {
        let (dir, url) = asiento_eventstore::scratch::temp_sqlite_url();
        let clock = Arc::new(ManualClock::at_ms(EPOCH_MS));
        let crash = Arc::new(Notify::new());
        let mut rng = Rng::new(seed);
        let profile = Profile::draw(&mut rng);
        let provider = Arc::new(SimProvider::new(
            profile,
            seed,
            clock.clone(),
            crash.clone(),
        ));
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

    pub fn note(&mut self, text: impl AsRef<str>) {
        let _ = writeln!(
            self.trace,
            "  [{:>3}] t+{:>7}s {}",
            self.step,
            (self.clock.now_ms() - EPOCH_MS) / 1_000,
            text.as_ref()
        );
    }

    pub fn fail(&self, what: impl AsRef<str>) -> ! {
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
    pub async fn restart(&mut self) {
        self.crashes += 1;
        self.process = start_process(&self.url, &self.clock, &self.provider).await;
        self.note("process restarted");
    }

    pub fn random_fault(&mut self) -> Fault {
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
    pub async fn send(&mut self, index: usize) {
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
    pub fn learn(&mut self, index: usize, answer: Answer) {
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

    pub fn new_request(&mut self, work: Work, route: String, body: Value) -> usize {
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
    pub async fn advance(&mut self, delta_ms: i64) {
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

    pub async fn sweep(&mut self, fault: Fault) {
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

    /// The provider's new `operation.updated` events arrive promptly, or are dropped (a later
    /// webhook, a lookup or the report must then tell). A dark charge's never arrive.
    pub async fn send_new_events(&mut self) {
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
    pub async fn deliver(&mut self, payment: PaymentId, facts: &[ProviderFact], what: &str) {
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

    /// One attempt without faults or crashes (the provider is healthy at the end).
    pub async fn plain_attempt(&mut self, index: usize, idem: &Idempotent) -> Answer {
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
pub fn webhook_facts(charge: &Charge, operation: Option<&Operation>) -> Vec<ProviderFact> {
    let mut out = Vec::new();
    if let Some(op) = operation {
        out.push(facts::operation_fact(op, None));
    }
    out.extend(facts::charge_facts(charge, facts::Read::Snapshot));
    out
}
