//! The payment flow across three systems that share no transaction: our database, the provider
//! and our workers.
//!
//! 1. Claim the client's idempotency key and append the intent (`PaymentIntended`, which names
//!    the PSP key the charge is requested under) in one short transaction, before any network
//!    call.
//! 2. Call the provider outside any transaction, with the PSP key derived from the payment id, so
//!    every retry, resume or lookup names the same charge.
//! 3. Apply the outcome through [`PaymentFlow::finalize`], the one path every provider fact takes
//!    (this request's answer, a webhook, the reconciler): load, decide, append with the exact
//!    expected version, and on a lost race re-read and re-decide. The idempotency response is
//!    stored in the same transaction, so a replay can never disagree with the ledger.
//! 4. An unknown outcome leaves the payment pending (202); a webhook or the reconciler settles it.
//!
//! A request whose process died after step 1 leaves its key in flight; once the lease runs out,
//! a retry takes the key over and resumes at step 2 with the same payment and the same PSP key.

use std::collections::BTreeMap;
use std::sync::Arc;

use asiento_domain::payment::Input;
use asiento_domain::{
    Amount, CaptureMode, CellNumber, CreatePayment, Currency, CustomerId, Operation, OperationKind,
    Payment, PaymentCommand, PaymentEvent, PaymentId, PaymentRecord, PaymentRejection,
    PaymentStatus, ProviderFact, ProviderName, TenantId,
};
use asiento_eventstore::{AppendError, Appended, Database, Metadata, StreamAppend, Tx};
use asiento_psp::CreateCharge;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::clock::Clock;
use crate::commit::{
    CommitError, Committed, Completion as WorkCompletion, Facts, GuardWrite, Respond, Step, Writer,
};
use crate::facts;
use crate::idempotency::{
    self, BodyHash, Claim, Completing, FreshClaim, IdempotencyError, IdempotencyKey, Lease, Scope,
    StoredResponse,
};
use crate::leases;
use crate::log::{self, LogError, Store};
use crate::providers::{ConfiguredProvider, Providers};
use crate::reply::{Answer, PaymentCommandKind, Rejected, Render, Reply};

/// How many times a decision is re-read and re-decided after losing a version race before the
/// request gives up (the key stays in flight and a retry resumes it).
pub const CONFLICT_RETRIES_MAX: u32 = 16;

/// Waits before deciding again after the `attempt`-th lost version race (counted from 0). The
/// first retry goes at once: a first race is most often lost to a step of this process that was
/// in flight when the decision read its state, and that step is written by the time the loss is
/// known. From the second, a random time up to 1, 2, 4 … ms, at most 32, so that the contenders of
/// one hot stream (a marketplace seller's guard) spread out instead of colliding again at once.
/// (No sleep at all for the first: the timer's ticks are milliseconds, and even a zero sleep waits
/// for the next one.)
pub(crate) async fn back_off(attempt: u32) {
    if let Some(ceiling) = backoff_ceiling_us(attempt) {
        let wait = rand::random_range(0..=ceiling);
        tokio::time::sleep(std::time::Duration::from_micros(wait)).await;
    }
}

/// The longest wait after the `attempt`-th lost race, in microseconds; `None`: none at all.
fn backoff_ceiling_us(attempt: u32) -> Option<u64> {
    let after_first = attempt.checked_sub(1)?;
    Some(1_000u64 << after_first.min(5))
}

/// How long an in-flight idempotency key is held before a retry may take it over. Longer than
/// the provider client's worst case (attempts × request timeout), so that a live request is never
/// taken over.
pub const IDEMPOTENCY_LEASE_MS_DEFAULT: i64 = 60_000;

#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Idempotency(#[from] IdempotencyError),
    #[error("append failed: {0}")]
    Append(#[source] AppendError),
    #[error("payment {0} kept losing version races")]
    TooManyConflicts(PaymentId),
    #[error("stored state is inconsistent: {0}")]
    Inconsistent(String),
    /// A ledger command lost every race it had on its accounts' guards: other writes kept
    /// changing them between its decision and its commit. Nothing was written and its key was
    /// not claimed, so the same request may be sent again (the API answers 409 `account_busy`
    /// with `Retry-After`).
    #[error("{0} kept losing races on its accounts; nothing was written")]
    Contended(String),
    /// The state machine refused a command of ours (a fact is never refused).
    #[error("refused: {0}")]
    Rejected(PaymentRejection),
    /// A lease this work relied on (an inbox row's, a payment's) was taken over meanwhile: the
    /// transaction rolls back and the new holder does the work.
    #[error("lease lost: {0}")]
    LeaseLost(String),
    #[error(transparent)]
    Lease(#[from] crate::leases::LeaseError),
    #[error(transparent)]
    Commit(#[from] CommitError),
}

impl From<asiento_eventstore::StoreError> for FlowError {
    fn from(error: asiento_eventstore::StoreError) -> Self {
        FlowError::Log(LogError::Store(error))
    }
}

/// A payment request, validated at the edge.
#[derive(Debug, Clone)]
pub struct NewPayment {
    pub tenant: TenantId,
    pub amount: Amount,
    pub currency: Currency,
    pub customer: CustomerId,
    pub provider: ProviderName,
    pub payment_method: String,
    pub capture_mode: CaptureMode,
    pub description: Option<String>,
    pub metadata: Map<String, Value>,
}

/// The idempotency context of a command: who asked, with which key and body.
#[derive(Debug, Clone)]
pub struct Idempotent {
    pub scope: Scope,
    pub key: IdempotencyKey,
    pub body: BodyHash,
    /// Carried into every event's metadata, so the log says which request caused what.
    pub correlation_id: Option<Uuid>,
}

/// What a finalisation on the request path also does: complete the request's idempotency record
/// with its answer.
struct Completion<'a> {
    request: &'a Idempotent,
    lease: Lease,
    kind: PaymentCommandKind,
}

/// What a finalisation applies to a payment.
#[derive(Debug, Clone)]
enum Change {
    /// Nothing new: answer with the current state.
    Nothing,
    /// Provider facts, decided in order (never refused: a contradicting one is flagged).
    Facts(Vec<ProviderFact>),
    /// A command of ours (an expiry, a review flag); its rejection is returned.
    Command(PaymentCommand),
}

/// One finalisation of a payment ([`PaymentFlow::finalize`]): provider facts or a command of
/// ours, what must commit in the same transaction, and the payment's state when the caller has
/// just read it.
pub struct Finalize<'a> {
    payment: PaymentId,
    change: Change,
    also: Option<&'a dyn InTransaction>,
    current: Option<CurrentPayment>,
    completion: Option<Completion<'a>>,
}

impl<'a> Finalize<'a> {
    /// Provider facts, applied in order (none: answer with the payment's current state).
    pub fn facts(payment: PaymentId, facts: impl IntoIterator<Item = ProviderFact>) -> Self {
        let facts: Vec<ProviderFact> = facts.into_iter().collect();
        Finalize {
            payment,
            change: if facts.is_empty() {
                Change::Nothing
            } else {
                Change::Facts(facts)
            },
            also: None,
            current: None,
            completion: None,
        }
    }

    /// A command of ours (`Expire`, `FlagForReview` …), through the same guarded path as
    /// provider facts. A command the state machine refuses is `FlowError::Rejected`.
    pub fn command(payment: PaymentId, command: PaymentCommand) -> Self {
        Finalize {
            change: Change::Command(command),
            ..Finalize::facts(payment, None)
        }
    }

    /// With `also` committed in the same transaction (or, when nothing changes, on its own).
    pub fn also(self, also: &'a dyn InTransaction) -> Self {
        Finalize {
            also: Some(also),
            ..self
        }
    }

    /// Starting from the payment as the caller has just read it, to save reading it again. Read
    /// before any transaction began, as every decision must be; if it is outdated by now, the
    /// append's exact version refuses it and the flow reads again.
    pub fn loaded(self, loaded: Option<LoadedPayment>) -> Self {
        Finalize {
            current: loaded.map(Into::into),
            ..self
        }
    }
}

/// Work that must commit in the same transaction as a finalisation's events (or, when the fact
/// changes nothing, on its own): the webhook worker marks its inbox row processed this way, so a
/// row is processed exactly when its effect is recorded.
#[async_trait::async_trait]
pub trait InTransaction: Send + Sync {
    async fn run(&self, tx: &mut Tx, finalized: &Finalized) -> Result<(), FlowError>;
}

/// What `finalize` did.
#[derive(Debug, Clone)]
pub struct Finalized {
    pub payment: PaymentRecord,
    /// The position of the last event the call wrote, or of the stream's last event if it wrote
    /// none (someone else had already recorded the fact).
    pub position: i64,
    pub events_appended: usize,
}

/// A payment folded from its stream, with the events it came from.
pub type LoadedPayment = log::Loaded<Payment, PaymentEvent>;

/// What a decision on a payment starts from: its state (whose `version` the append expects) and
/// the position of its last event. Read from the log, or known from an append just made.
#[derive(Debug, Clone)]
pub struct CurrentPayment {
    pub payment: Payment,
    pub last_position: Option<i64>,
}

impl CurrentPayment {
    /// A new payment as the log holds it once its first `events` are appended, without reading
    /// them back.
    fn new(events: &[PaymentEvent], appended: &Appended) -> Self {
        CurrentPayment {
            payment: events
                .iter()
                .fold(Payment::default(), asiento_domain::evolve_payment),
            last_position: Some(appended.last_position),
        }
    }
}

impl From<LoadedPayment> for CurrentPayment {
    fn from(loaded: LoadedPayment) -> Self {
        CurrentPayment {
            last_position: loaded.last_position(),
            payment: loaded.aggregate,
        }
    }
}

/// The payment use cases: create, capture, refund, and the finalisation every path shares.
/// Made with [`PaymentFlow::new`]; cheap to clone.
#[derive(Clone)]
pub struct PaymentFlow {
    pub(crate) database: Database,
    pub(crate) store: Store,
    pub(crate) providers: Providers,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) render: Arc<dyn Render>,
    pub(crate) idempotency_lease_ms: i64,
    /// How long a request that resumes after a crash holds its payment's lease (serve's
    /// `--payment-lease`), so that the webhook worker and the reconciler keep off meanwhile.
    pub(crate) payment_lease_ms: i64,
    /// The database's one writer: it commits the request path's steps of concurrent requests
    /// together, and keeps the memories of the guard and payment states its commits left.
    pub(crate) writer: Arc<Writer>,
    /// The tenant cell this flow's database is, stamped into every payment id it mints so that a
    /// provider's webhook names it (`asiento_domain::cell`); `None` outside a deployment of cells.
    pub(crate) cell: Option<CellPlace>,
}

/// Where a flow's database stands in a deployment of tenant cells.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CellPlace {
    pub number: CellNumber,
    /// The directory's home cell: it holds the payments minted before the deployment had cells
    /// and answers for what a provider sends that names no payment of ours.
    pub home: bool,
    /// Tenants moved to another cell: their copy in this log is frozen, their new cell answers
    /// for their payments.
    pub moved_out: Vec<TenantId>,
    /// Tenants paused for a move (the directory's, in every cell): nothing in the process writes
    /// for them. Their payments' report lines wait (compared once they are not paused, in the
    /// cell that holds them then), their holds do not expire meanwhile, and no payout is posted
    /// while any tenant is paused (`payouts`).
    pub paused: Vec<TenantId>,
}

impl PaymentFlow {
    /// The payment flow on `database`, writing through the process's `writer` (made on the same
    /// database's store), with its providers; the leases at their defaults
    /// ([`PaymentFlow::with_leases`]).
    pub fn new(
        database: Database,
        writer: Arc<Writer>,
        providers: Providers,
        clock: Arc<dyn Clock>,
        render: Arc<dyn Render>,
    ) -> PaymentFlow {
        PaymentFlow {
            store: writer.store().clone(),
            database,
            writer,
            providers,
            clock,
            render,
            idempotency_lease_ms: IDEMPOTENCY_LEASE_MS_DEFAULT,
            payment_lease_ms: crate::leases::PAYMENT_LEASE_MS_DEFAULT,
            cell: None,
        }
    }

    /// The same flow in a tenant cell: the payments it creates carry the cell in their ids.
    pub fn in_cell(self, place: CellPlace) -> PaymentFlow {
        PaymentFlow {
            cell: Some(place),
            ..self
        }
    }

    /// A fresh payment id, stamped with the flow's cell when it has one.
    fn mint_payment_id(&self) -> PaymentId {
        let minted = Uuid::now_v7();
        PaymentId::from_uuid(match &self.cell {
            Some(place) => place.number.stamp(minted),
            None => minted,
        })
    }

    /// Whether this flow's database answers for what a provider reports of `payment` (a report
    /// line, a payout's transaction), given the tenant its log holds it for (`None`: not in this
    /// log). Outside cells always. In a cell: a payment in its log unless its tenant moved out
    /// (a tenant moved in brings payments minted elsewhere); one not in its log, or no payment,
    /// only where it would be (the cell its id names, the home cell for an unstamped id or none),
    /// so that exactly one cell records it as unknown.
    pub fn answers_for(&self, payment: Option<PaymentId>, tenant: Option<&TenantId>) -> bool {
        let Some(place) = &self.cell else {
            return true;
        };
        if let Some(tenant) = tenant {
            return !place.moved_out.contains(tenant);
        }
        match payment.and_then(|payment| CellNumber::of(payment.as_uuid())) {
            Some(number) => number == place.number,
            None => place.home,
        }
    }

    /// The tenants paused for a move in this flow's cell (none outside cells).
    pub fn paused(&self) -> &[TenantId] {
        self.cell
            .as_ref()
            .map_or(&[], |place| place.paused.as_slice())
    }

    /// With these leases: how long a request holds its idempotency key, and how long one that
    /// resumes after a crash holds its payment.
    pub fn with_leases(self, idempotency_lease_ms: i64, payment_lease_ms: i64) -> PaymentFlow {
        PaymentFlow {
            idempotency_lease_ms,
            payment_lease_ms,
            ..self
        }
    }

    /// The same flow, committing through `writer` and deciding with its memories (a second
    /// process's flow on the same database, in a test). It goes on reading its own store.
    pub fn with_writer(self, writer: Arc<Writer>) -> PaymentFlow {
        PaymentFlow { writer, ..self }
    }

    /// The store it reads and writes.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The providers it charges through.
    pub fn providers(&self) -> &Providers {
        &self.providers
    }

    /// The clock it decides by.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The process's writer it commits through.
    pub fn writer(&self) -> &Arc<Writer> {
        &self.writer
    }

    fn metadata(&self, tenant: &TenantId, request: Option<&Idempotent>) -> Metadata {
        Metadata {
            tenant: Some(tenant.to_string()),
            correlation_id: request.and_then(|request| request.correlation_id),
            causation_id: None,
            idempotency_key: request.map(|request| request.key.as_str().to_owned()),
        }
    }

    /// `request`'s key to claim as new for `resource_id`, under a fresh lease (group commit).
    fn fresh_claim(&self, request: &Idempotent, resource_id: String, now_ms: i64) -> FreshClaim {
        FreshClaim {
            scope: request.scope.clone(),
            key: request.key.clone(),
            body: request.body,
            resource_id,
            lease: Lease::new(now_ms, self.idempotency_lease_ms),
            now_ms,
        }
    }

    fn provider(&self, name: &ProviderName) -> Result<&ConfiguredProvider, FlowError> {
        self.providers
            .get(name)
            .ok_or_else(|| FlowError::Inconsistent(format!("provider {name} is not configured")))
    }

    /// `POST /v1/payments`.
    #[tracing::instrument(
        skip_all,
        fields(tenant = %payment.tenant, key = request.key.as_str(), payment = tracing::field::Empty)
    )]
    pub async fn create(
        &self,
        request: &Idempotent,
        payment: NewPayment,
    ) -> Result<Answer, FlowError> {
        let id = self.mint_payment_id();
        tracing::Span::current().record("payment", tracing::field::display(id));
        let now = self.clock.now();
        let create = CreatePayment {
            id,
            tenant: payment.tenant.clone(),
            amount: payment.amount,
            currency: payment.currency,
            customer: payment.customer.clone(),
            provider: payment.provider.clone(),
            capture_mode: payment.capture_mode,
            description: payment.description.clone(),
            metadata: payment.metadata.clone(),
            payment_method: Some(payment.payment_method.clone()),
            at: now,
        };
        // Every rejection of a new payment is a validation of its request: answered before the
        // key is claimed, so it is not stored (API.md).
        let events = match asiento_domain::decide_payment(
            &Payment::default(),
            PaymentCommand::Create(create),
        ) {
            Ok(events) => events,
            Err(rejection) => {
                return Ok(Answer::Done(
                    self.render
                        .render(&Reply::Rejected(Rejected::Payment(rejection))),
                ))
            }
        };
        // The common case, a new key: claim and intent committed with other requests' steps.
        let metadata = self.metadata(&payment.tenant, Some(request));
        let appends: Arc<[StreamAppend]> = log::decision_appends(
            asiento_domain::payment_stream(id),
            0,
            log::encode(&events, &metadata, log::payment_codec)?,
            &[],
            &metadata,
        )?
        .into();
        let now_ms = now.timestamp_millis();
        let claim = self.fresh_claim(request, id.to_string(), now_ms);
        let lease = claim.lease;
        let step = Step::Claim {
            claim,
            appends: Arc::clone(&appends),
        };
        if let Committed::Written(Some(appended)) | Committed::Rebased(Some(appended), _) =
            self.writer.commit(step).await?
        {
            let current = CurrentPayment::new(&events, &appended);
            return self
                .charge_and_finalize(id, &payment.payment_method, request, lease, Some(current))
                .await;
        }
        // The key exists: claim it the usual way (a replay, a key in flight, a reused key, or a
        // request to resume).
        let mut tx = self.store.begin().await?;
        let claim = idempotency::claim(
            &mut tx,
            &request.scope,
            &request.key,
            request.body,
            &id.to_string(),
            now_ms,
            self.idempotency_lease_ms,
        )
        .await?;
        let (id, lease, current) = match claim {
            Claim::Fresh { lease } => {
                let appended = self
                    .store
                    .append_in(&mut tx, &appends)
                    .await
                    .map_err(FlowError::Append)?;
                tx.commit().await?;
                (id, lease, CurrentPayment::new(&events, &appended))
            }
            Claim::Resumed { lease, resource_id } => {
                tx.commit().await?;
                let id = PaymentId::parse(&resource_id).map_err(|_| {
                    FlowError::Inconsistent(format!("resource {resource_id} is not a payment id"))
                })?;
                tracing::Span::current().record("payment", tracing::field::display(id));
                tracing::info!(payment = %id, "resuming a payment whose request died mid-flight");
                return self
                    .with_payment_lease(id, request, lease, || {
                        self.charge_and_finalize(id, &payment.payment_method, request, lease, None)
                    })
                    .await;
            }
            other => {
                // A replay, a key in flight or reused: the claim wrote nothing. Ended rather than
                // dropped, so that the store keeps the connection.
                tx.rollback().await?;
                return self
                    .without_stale_next_action(answer_without_work(other))
                    .await;
            }
        };
        self.charge_and_finalize(id, &payment.payment_method, request, lease, Some(current))
            .await
    }

    /// Runs the recovery of a request that died mid-flight while holding the payment's lease, so
    /// that it never works on the payment at the same time as the webhook worker or the
    /// reconciler (the version check stays: a lease can run out under a slow holder). If another
    /// holder has the payment, the key is released for an immediate retry and the client told so.
    async fn with_payment_lease<F, Fut>(
        &self,
        id: PaymentId,
        request: &Idempotent,
        key_lease: Lease,
        work: F,
    ) -> Result<Answer, FlowError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Answer, FlowError>>,
    {
        let now_ms = self.clock.now_ms();
        let Some(payment_lease) =
            leases::acquire(&self.database, id, now_ms, self.payment_lease_ms).await?
        else {
            let mut tx = self.store.begin().await?;
            idempotency::release(&mut tx, &request.scope, &request.key, key_lease, now_ms).await?;
            tx.commit().await?;
            return Ok(Answer::InProgress { retry_after_s: 1 });
        };
        let answer = work().await;
        if let Err(error) = leases::release(&self.database, &payment_lease).await {
            tracing::warn!(payment = %id, %error, "payment lease not released; it will run out");
        }
        answer
    }

    /// Step 2 and 3: ask the provider (again, with the same key, if resuming) unless the payment
    /// already has the provider's answer, then finalize with it. `current` is the payment as the
    /// intent's append left it; when resuming it is read from the log.
    async fn charge_and_finalize(
        &self,
        id: PaymentId,
        payment_method: &str,
        request: &Idempotent,
        lease: Lease,
        current: Option<CurrentPayment>,
    ) -> Result<Answer, FlowError> {
        let current = match current {
            Some(current) => current,
            None => log::load_payment(self.store.as_ref(), id).await?.into(),
        };
        let record = current
            .payment
            .record
            .as_ref()
            .ok_or_else(|| FlowError::Inconsistent(format!("payment {id} has no intent")))?;
        let facts = if record.status == PaymentStatus::Pending {
            self.request_charge(record, payment_method).await?
        } else {
            Vec::new()
        };
        self.settle(
            request,
            id,
            lease,
            PaymentCommandKind::Create,
            facts,
            Some(current),
        )
        .await
    }

    /// Asks the provider for `record`'s charge under its key (again, identical, when resuming or
    /// when the first answer was lost: the provider answers the first outcome) and reads the
    /// answer as facts, for the caller to finalize.
    pub(crate) async fn request_charge(
        &self,
        record: &PaymentRecord,
        payment_method: &str,
    ) -> Result<Vec<ProviderFact>, FlowError> {
        let provider = self.provider(&record.provider)?;
        let outcome = provider
            .adapter
            .create_charge(&CreateCharge {
                idempotency_key: record.psp_key.clone(),
                amount_minor: record.amount.minor(),
                currency: record.currency.code().to_owned(),
                payment_method: payment_method.to_owned(),
                capture: record.capture_mode == CaptureMode::Automatic,
                reference: Some(record.id.to_string()),
                customer: Some(record.customer.to_string()),
                metadata: string_metadata(&record.metadata),
            })
            .await;
        Ok(match facts::outcome_misfit(record, &outcome) {
            // Not the charge we asked for: never applied. The payment stays pending and the
            // stale sweep, finding the same charge, records the exception and flags it.
            Some(misfit) => {
                tracing::error!(payment = %record.id, kind = %misfit.kind, fingerprint = %misfit.fingerprint, "the provider answered with a charge that is not this payment's; left to the reconciler");
                Vec::new()
            }
            None => facts::charge_outcome_facts(outcome),
        })
    }

    /// Applies a finalisation ([`Finalize`]: provider facts or a command of ours, and what commits
    /// with it) to a payment, once, whoever calls: the synchronous path, the webhook worker, the
    /// reconciler. Exact versions: a lost race reads and decides again.
    pub async fn finalize(&self, request: Finalize<'_>) -> Result<Finalized, FlowError> {
        self.finalize_with(request).await
    }

    /// The events a provider fact adds to a payment. Never a refusal: a malformed fact (a
    /// negative amount) is a provider bug, recorded as needing a person rather than inventing a
    /// state.
    fn decide_fact(
        &self,
        payment: &Payment,
        record: &PaymentRecord,
        fact: &ProviderFact,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<PaymentEvent>, FlowError> {
        let fees = self.provider(&record.provider)?.fees;
        let command = PaymentCommand::Provider {
            fact: fact.clone(),
            fees,
            at: now,
        };
        match asiento_domain::decide_payment(payment, command) {
            Ok(events) => Ok(events),
            Err(rejection) => flag_events(payment, &rejection, now),
        }
    }

    /// Whether `payment` already reflects every one of `facts`, in order: finalizing them would
    /// append nothing. The decision `finalize` makes, without its transaction. Provider facts
    /// only ever add to a payment, so what a payment read earlier already reflects, every later
    /// state of it does too (`finalize` relies on the same when it commits work beside a fact
    /// that changed nothing).
    pub fn reflects(&self, payment: &Payment, facts: &[ProviderFact]) -> Result<bool, FlowError> {
        let Some(record) = payment.record.as_ref() else {
            return Ok(false);
        };
        let now = self.clock.now();
        for fact in facts {
            if !self.decide_fact(payment, record, fact, now)?.is_empty() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    #[tracing::instrument(skip_all, fields(payment = %request.payment))]
    async fn finalize_with(&self, request: Finalize<'_>) -> Result<Finalized, FlowError> {
        let Finalize {
            payment: id,
            change,
            also,
            current: mut preloaded,
            completion,
        } = request;
        for attempt in 0..CONFLICT_RETRIES_MAX {
            let current = match preloaded.take() {
                Some(current) => current,
                None => log::load_payment(self.store.as_ref(), id).await?.into(),
            };
            let payment = current.payment;
            let record = payment
                .record
                .clone()
                .ok_or_else(|| FlowError::Inconsistent(format!("payment {id} not found")))?;
            let now = self.clock.now();
            let events = match &change {
                Change::Nothing => Vec::new(),
                Change::Command(command) => {
                    asiento_domain::decide_payment(&payment, command.clone())
                        .map_err(FlowError::Rejected)?
                }
                Change::Facts(facts) => {
                    let mut events = Vec::new();
                    let mut decided = payment.clone();
                    for fact in facts {
                        let record = decided.record.clone().ok_or_else(|| {
                            FlowError::Inconsistent(format!("payment {id} lost its record"))
                        })?;
                        let new = self.decide_fact(&decided, &record, fact, now)?;
                        decided = new.iter().fold(decided, asiento_domain::evolve_payment);
                        events.extend(new);
                    }
                    events
                }
            };
            let after = events
                .iter()
                .fold(payment.clone(), asiento_domain::evolve_payment);
            let after_record = after
                .record
                .clone()
                .ok_or_else(|| FlowError::Inconsistent(format!("payment {id} lost its record")))?;
            if events.is_empty() && completion.is_none() && also.is_none() {
                // Nothing to write and nothing to commit with it: no transaction at all.
                return Ok(Finalized {
                    payment: after_record,
                    position: current.last_position.unwrap_or(0),
                    events_appended: 0,
                });
            }
            // Every read through the pool happens before the transaction begins: on SQLite a
            // transaction holds the one write lock, and a holder waiting for a pool connection
            // that other waiters for the lock occupy would deadlock until the busy timeout.
            let read = self
                .writer
                .guards()
                .load(self.store.as_ref(), log::payment_entries(&events))
                .await?
                .states;
            let guard_appends = log::payment_guard_appends(&events, &read)
                .map_err(|rejection| FlowError::Inconsistent(rejection.to_string()))?;
            let appends = if events.is_empty() {
                Vec::new()
            } else {
                let metadata =
                    self.metadata(&record.tenant, completion.as_ref().map(|c| c.request));
                log::decision_appends(
                    asiento_domain::payment_stream(id),
                    payment.version,
                    log::encode(&events, &metadata, log::payment_codec)?,
                    &guard_appends,
                    &metadata,
                )?
            };
            let guards = GuardWrite {
                read,
                appends: guard_appends,
            };
            let unchanged_position = current.last_position.unwrap_or(0);
            let finalized = {
                let events_appended = events.len();
                move |position: Option<i64>| Finalized {
                    payment: after_record.clone(),
                    position: position.unwrap_or(unchanged_position),
                    events_appended,
                }
            };
            if let (Some(completion), None) = (&completion, also) {
                // A request's finalisation: committed with other requests' steps.
                let respond = {
                    let (render, kind, finalized) =
                        (Arc::clone(&self.render), completion.kind, finalized.clone());
                    Respond::new(move |position| {
                        render.render(&reply_for(kind, &finalized(position)))
                    })
                };
                respond.prepare_for(self.database.backend());
                let step = Step::Facts(Facts {
                    appends: appends.into(),
                    guards,
                    payment: Some((id, after)),
                    completion: Some(WorkCompletion {
                        completing: Completing {
                            scope: completion.request.scope.clone(),
                            key: completion.request.key.clone(),
                            lease: completion.lease,
                            response: StoredResponse::default(),
                            now_ms: now.timestamp_millis(),
                        },
                        respond,
                    }),
                });
                match self.writer.commit(step).await? {
                    Committed::Written(appended) | Committed::Rebased(appended, _) => {
                        return Ok(finalized(appended.map(|a| a.last_position)));
                    }
                    Committed::Conflict => {
                        metrics::counter!("asiento_finalize_conflicts_total").increment(1);
                        back_off(attempt).await;
                        continue;
                    }
                    Committed::LeaseLost => return Err(IdempotencyError::LeaseLost.into()),
                    Committed::NotFresh => {
                        return Err(FlowError::Inconsistent("a completion met a claim".into()))
                    }
                }
            }
            // With work of the caller's own in the transaction: appended there, through the
            // writer, so that its memories learn what commits.
            let mut tx = self.store.begin().await?;
            let (appended, uncommitted) = match self
                .writer
                .append_in(&mut tx, &appends, guards, Some((id, after)))
                .await
            {
                Ok(written) => written,
                Err(error) if log::is_conflict(&error) => {
                    metrics::counter!("asiento_finalize_conflicts_total").increment(1);
                    tx.rollback().await?;
                    back_off(attempt).await;
                    continue;
                }
                Err(error) => return Err(FlowError::Append(error)),
            };
            let finalized = finalized(appended.map(|a| a.last_position));
            if let Some(completion) = &completion {
                let response = self.render.render(&reply_for(completion.kind, &finalized));
                idempotency::complete(
                    &mut tx,
                    &completion.request.scope,
                    &completion.request.key,
                    completion.lease,
                    &response,
                    now.timestamp_millis(),
                )
                .await?;
            }
            if let Some(also) = also {
                also.run(&mut tx, &finalized).await?;
            }
            tx.commit().await?;
            uncommitted.committed();
            return Ok(finalized);
        }
        Err(FlowError::TooManyConflicts(id))
    }

    /// `POST /v1/payments/{id}/capture`: the merchant captures an authorized payment.
    #[tracing::instrument(skip_all, fields(tenant = %tenant, payment = %id, key = request.key.as_str()))]
    pub async fn capture(
        &self,
        request: &Idempotent,
        tenant: &TenantId,
        id: PaymentId,
        amount: Option<Amount>,
    ) -> Result<Answer, FlowError> {
        self.merchant_request(
            request,
            tenant,
            id,
            |at| PaymentCommand::RequestCapture { amount, at },
            |lease, resource| self.finish_capture(request, id, lease, resource),
        )
        .await
    }

    /// After the request is recorded: ask the provider, then finalize with its answer.
    async fn finish_capture(
        &self,
        request: &Idempotent,
        id: PaymentId,
        lease: Lease,
        resource: Resource,
    ) -> Result<Answer, FlowError> {
        self.finish_operation(request, id, lease, resource, OperationKind::Capture)
            .await
    }

    /// `POST /v1/payments/{id}/refunds`: a partial or full refund.
    #[tracing::instrument(skip_all, fields(tenant = %tenant, payment = %id, key = request.key.as_str()))]
    pub async fn refund(
        &self,
        request: &Idempotent,
        tenant: &TenantId,
        id: PaymentId,
        amount: Amount,
    ) -> Result<Answer, FlowError> {
        self.merchant_request(
            request,
            tenant,
            id,
            |at| PaymentCommand::RequestRefund { amount, at },
            |lease, resource| self.finish_refund(request, id, lease, resource),
        )
        .await
    }

    /// `POST /v1/payments/{id}/cancel`: the merchant releases an authorization it will not
    /// capture. The provider decides, as with a capture: a capture sent first may still win.
    #[tracing::instrument(skip_all, fields(tenant = %tenant, payment = %id, key = request.key.as_str()))]
    pub async fn cancel(
        &self,
        request: &Idempotent,
        tenant: &TenantId,
        id: PaymentId,
    ) -> Result<Answer, FlowError> {
        self.merchant_request(
            request,
            tenant,
            id,
            |at| PaymentCommand::RequestCancel { at },
            |lease, resource| {
                self.finish_operation(request, id, lease, resource, OperationKind::Cancel)
            },
        )
        .await
    }

    /// After the request is recorded: ask the provider, then finalize with its answer.
    async fn finish_refund(
        &self,
        request: &Idempotent,
        id: PaymentId,
        lease: Lease,
        resource: Resource,
    ) -> Result<Answer, FlowError> {
        self.finish_operation(request, id, lease, resource, OperationKind::Refund)
            .await
    }

    /// Sends the request's operation to the provider (again, with the same PSP key and amount,
    /// when resuming) while it is still open, and finalizes with what the answer means for it:
    /// its outcome, its refusal, or nothing when unknown (the operation stays requested, the
    /// answer is 202, and the reconciler drives it to an outcome).
    async fn finish_operation(
        &self,
        request: &Idempotent,
        id: PaymentId,
        lease: Lease,
        resource: Resource,
        kind: OperationKind,
    ) -> Result<Answer, FlowError> {
        let loaded = log::load_payment(self.store.as_ref(), resource.payment).await?;
        let record = found(&loaded.aggregate, id)?;
        // A capture recorded by an earlier version names the payment alone: the open capture.
        let legacy_capture = || match (resource.operation, kind) {
            (None, OperationKind::Capture) => record.open_capture().map(|op| op.sequence),
            _ => None,
        };
        let sequence = resource
            .operation_sequence(kind)
            .or_else(legacy_capture)
            .ok_or_else(|| {
                FlowError::Inconsistent(format!("request on {id} names no {}", kind.as_str()))
            })?;
        let facts = match record.operation(kind, sequence) {
            Some(op) if op.state.is_open() => self.send_operation(record, op).await?,
            _ => Vec::new(),
        };
        let current = Some(loaded.into());
        let kind = match kind {
            OperationKind::Capture => PaymentCommandKind::Capture { sequence },
            OperationKind::Refund => PaymentCommandKind::Refund { sequence },
            OperationKind::Cancel => PaymentCommandKind::Cancel { sequence },
        };
        self.settle(request, id, lease, kind, facts, current).await
    }

    /// Sends one open operation to the provider under its PSP key and reads the answer through
    /// [`facts::answer_facts`]: the same reading the reconciler makes when it sends it again. An
    /// answer that fits no operation of ours is logged and left to the reconciler, which flags
    /// it.
    pub(crate) async fn send_operation(
        &self,
        record: &PaymentRecord,
        op: &Operation,
    ) -> Result<Vec<ProviderFact>, FlowError> {
        let Some(charge_id) = record.provider_charge_id.as_deref() else {
            return Err(FlowError::Inconsistent(format!(
                "{} {} of {} before any charge",
                op.kind.as_str(),
                op.psp_key,
                record.id
            )));
        };
        let provider = self.provider(&record.provider)?;
        let amount = op.amount.minor();
        let answer = match op.kind {
            OperationKind::Capture => {
                provider
                    .adapter
                    .capture(charge_id, Some(amount), record.currency.code(), &op.psp_key)
                    .await
            }
            OperationKind::Refund => {
                provider
                    .adapter
                    .refund(charge_id, amount, record.currency.code(), &op.psp_key)
                    .await
            }
            OperationKind::Cancel => provider.adapter.cancel(charge_id, &op.psp_key).await,
        };
        let asked = facts::Asked {
            kind: op.kind,
            charge_id,
            psp_key: &op.psp_key,
            amount: op.amount,
        };
        match facts::answer_facts(record, &asked, &answer) {
            Ok(facts) => Ok(facts),
            Err(misfit) => {
                tracing::error!(payment = %record.id, key = %op.psp_key, kind = %misfit.kind, fingerprint = %misfit.fingerprint, "the provider answered for another operation; left to the reconciler");
                Ok(Vec::new())
            }
        }
    }

    /// A merchant's request on an existing payment: record it (or answer from the key), then
    /// `finish` it with the provider, holding the payment's lease when resuming after a crash.
    async fn merchant_request<F, Fut>(
        &self,
        request: &Idempotent,
        tenant: &TenantId,
        id: PaymentId,
        command: impl Fn(chrono::DateTime<chrono::Utc>) -> PaymentCommand,
        finish: F,
    ) -> Result<Answer, FlowError>
    where
        F: Fn(Lease, Resource) -> Fut,
        Fut: std::future::Future<Output = Result<Answer, FlowError>>,
    {
        match self.request_step(request, tenant, id, command).await? {
            RequestStep::Work {
                lease,
                resource,
                resumed: false,
            } => finish(lease, resource).await,
            RequestStep::Work {
                lease,
                resource,
                resumed: true,
            } => {
                self.with_payment_lease(id, request, lease, || finish(lease, resource))
                    .await
            }
            RequestStep::Answered(answer) => Ok(answer),
        }
    }

    /// Applies what the provider answered (or nothing, when unknown) and completes the key with
    /// the rendered answer, in one transaction.
    async fn settle(
        &self,
        request: &Idempotent,
        id: PaymentId,
        lease: Lease,
        kind: PaymentCommandKind,
        facts: Vec<ProviderFact>,
        current: Option<CurrentPayment>,
    ) -> Result<Answer, FlowError> {
        let finalize = Finalize {
            completion: Some(Completion {
                request,
                lease,
                kind,
            }),
            current,
            ..Finalize::facts(id, facts)
        };
        let finalized = self.finalize_with(finalize).await?;
        Ok(Answer::Done(
            self.render.render(&reply_for(kind, &finalized)),
        ))
    }

    /// The first, transactional step of a merchant request on an existing payment: decide the
    /// request, claim the key naming what it created, append; or store the rejection; or answer
    /// from the key's record. A lost version race retries from the read.
    async fn request_step(
        &self,
        request: &Idempotent,
        tenant: &TenantId,
        id: PaymentId,
        command: impl Fn(chrono::DateTime<chrono::Utc>) -> PaymentCommand,
    ) -> Result<RequestStep, FlowError> {
        for _ in 0..CONFLICT_RETRIES_MAX {
            let loaded = log::load_payment(self.store.as_ref(), id).await?;
            let payment = &loaded.aggregate;
            let now = self.clock.now();
            let decided = match &payment.record {
                // Another tenant's payment is as absent as one that does not exist.
                Some(record) if &record.tenant == tenant => {
                    asiento_domain::decide_payment(payment, command(now))
                }
                _ => Err(PaymentRejection::NotFound),
            };
            let input = command(now).input();
            let operation = decided
                .as_ref()
                .ok()
                .and_then(|events| requested_operation(payment, events, input));
            let resource = Resource {
                payment: id,
                operation,
            };
            let appends: Arc<[StreamAppend]> = match &decided {
                Ok(events) if !events.is_empty() => {
                    let metadata = self.metadata(tenant, Some(request));
                    log::decision_appends(
                        asiento_domain::payment_stream(id),
                        payment.version,
                        log::encode(events, &metadata, log::payment_codec)?,
                        &[],
                        &metadata,
                    )?
                    .into()
                }
                _ => Arc::default(),
            };
            let now_ms = now.timestamp_millis();
            if !appends.is_empty() {
                // The common case, a new key and a request to record: committed with other
                // requests' steps.
                let claim = self.fresh_claim(request, resource.to_string(), now_ms);
                let lease = claim.lease;
                let step = Step::Claim {
                    claim,
                    appends: Arc::clone(&appends),
                };
                match self.writer.commit(step).await? {
                    Committed::Written(_) | Committed::Rebased(..) => {
                        return Ok(RequestStep::Work {
                            lease,
                            resource,
                            resumed: false,
                        })
                    }
                    Committed::Conflict => continue,
                    // The key exists: claimed the usual way below.
                    Committed::NotFresh | Committed::LeaseLost => {}
                }
            }
            let mut tx = self.store.begin().await?;
            let claim = idempotency::claim(
                &mut tx,
                &request.scope,
                &request.key,
                request.body,
                &resource.to_string(),
                now_ms,
                self.idempotency_lease_ms,
            )
            .await?;
            match claim {
                Claim::Fresh { lease } => match decided {
                    Err(PaymentRejection::NotFound) => {
                        // Not stored: an unknown payment is the client's mistake, not work done.
                        tx.rollback().await?;
                        return Ok(RequestStep::Answered(Answer::Done(self.render.render(
                            &Reply::Rejected(Rejected::Payment(PaymentRejection::NotFound)),
                        ))));
                    }
                    Err(rejection) => {
                        let answer = self
                            .store_rejection(tx, request, lease, Rejected::Payment(rejection))
                            .await?;
                        return Ok(RequestStep::Answered(answer));
                    }
                    // Nothing new to record (the same capture is already awaiting the
                    // provider): the key is ours and names that capture, so ask the provider
                    // again with the same PSP key while it is open, which is safe, or answer its
                    // outcome once it has one, instead of appending an empty decision.
                    Ok(events) if events.is_empty() => {
                        tx.commit().await?;
                        return Ok(RequestStep::Work {
                            lease,
                            resource,
                            resumed: false,
                        });
                    }
                    Ok(_) => match self.store.append_in(&mut tx, &appends).await {
                        Ok(_) => {
                            tx.commit().await?;
                            return Ok(RequestStep::Work {
                                lease,
                                resource,
                                resumed: false,
                            });
                        }
                        Err(error) if log::is_conflict(&error) => {
                            tx.rollback().await?;
                            continue;
                        }
                        Err(error) => return Err(FlowError::Append(error)),
                    },
                },
                Claim::Resumed { lease, resource_id } => {
                    tx.commit().await?;
                    let resource = resource_id.parse::<Resource>().map_err(|()| {
                        FlowError::Inconsistent(format!("resource {resource_id} is unreadable"))
                    })?;
                    return Ok(RequestStep::Work {
                        lease,
                        resource,
                        resumed: true,
                    });
                }
                other => {
                    // As in `create`: nothing was written.
                    tx.rollback().await?;
                    return Ok(RequestStep::Answered(answer_without_work(other)));
                }
            }
        }
        Err(FlowError::TooManyConflicts(id))
    }

    /// Stores a business rejection as the key's response (it is replayed like a success) and
    /// answers with it.
    async fn store_rejection(
        &self,
        mut tx: Tx,
        request: &Idempotent,
        lease: Lease,
        rejected: Rejected,
    ) -> Result<Answer, FlowError> {
        let response = self.render.render(&Reply::Rejected(rejected));
        idempotency::complete(
            &mut tx,
            &request.scope,
            &request.key,
            lease,
            &response,
            self.clock.now_ms(),
        )
        .await?;
        tx.commit().await?;
        Ok(Answer::Done(response))
    }
}

/// What an idempotency record of a payment request names as its work: the payment, and the
/// operation the request asked for (`pay_…/refunds/2`, `pay_…/captures/1`). A capture recorded
/// by an earlier version names the payment alone; its operation is the open capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Resource {
    payment: PaymentId,
    operation: Option<(OperationKind, u32)>,
}

impl Resource {
    fn operation_sequence(&self, kind: OperationKind) -> Option<u32> {
        self.operation
            .filter(|(named, _)| *named == kind)
            .map(|(_, sequence)| sequence)
    }
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.operation {
            None => write!(f, "{}", self.payment),
            Some((OperationKind::Refund, sequence)) => {
                write!(f, "{}/refunds/{sequence}", self.payment)
            }
            Some((OperationKind::Capture, sequence)) => {
                write!(f, "{}/captures/{sequence}", self.payment)
            }
            Some((OperationKind::Cancel, sequence)) => {
                write!(f, "{}/cancels/{sequence}", self.payment)
            }
        }
    }
}

impl std::str::FromStr for Resource {
    type Err = ();

    fn from_str(text: &str) -> Result<Self, ()> {
        let (payment, operation) = match text.split_once('/') {
            None => (text, None),
            Some((payment, rest)) => {
                let (kind, sequence) = rest.split_once('/').ok_or(())?;
                let kind = match kind {
                    "refunds" => OperationKind::Refund,
                    "captures" => OperationKind::Capture,
                    "cancels" => OperationKind::Cancel,
                    _ => return Err(()),
                };
                (payment, Some((kind, sequence.parse().map_err(|_| ())?)))
            }
        };
        Ok(Resource {
            payment: PaymentId::parse(payment).map_err(|_| ())?,
            operation,
        })
    }
}

/// The operation a merchant request's decision names: the capture, refund or cancel it records,
/// or, when it records nothing because the same capture (or a cancel) already awaits the
/// provider, that open operation. It is named as the decision saw it: it may settle before the
/// request reaches the provider (another request's answer, a webhook), and the request then
/// answers its outcome instead of looking for an open operation that is gone.
fn requested_operation(
    payment: &Payment,
    events: &[PaymentEvent],
    input: Input,
) -> Option<(OperationKind, u32)> {
    let recorded = events.iter().find_map(|event| match event {
        PaymentEvent::RefundRequested(e) => Some((OperationKind::Refund, e.sequence)),
        PaymentEvent::CaptureRequested(e) => Some((OperationKind::Capture, e.sequence)),
        PaymentEvent::CancelRequested(e) => Some((OperationKind::Cancel, e.sequence)),
        _ => None,
    });
    let record = payment.record.as_ref()?;
    match (recorded, events.is_empty(), input) {
        (Some(operation), _, _) => Some(operation),
        (None, true, Input::RequestCapture) => record
            .open_capture()
            .map(|op| (OperationKind::Capture, op.sequence)),
        (None, true, Input::RequestCancel) => record
            .open_cancel()
            .map(|op| (OperationKind::Cancel, op.sequence)),
        _ => None,
    }
}

enum RequestStep {
    /// The key is ours and the request's first events are recorded: call the provider.
    /// `resumed`: an earlier request with this key died mid-flight and this one took over.
    Work {
        lease: Lease,
        resource: Resource,
        resumed: bool,
    },
    /// Answered without (further) work.
    Answered(Answer),
}

pub(crate) fn answer_without_work(claim: Claim) -> Answer {
    match claim {
        Claim::Completed(response) => Answer::Replayed(response),
        Claim::InProgress { retry_after_s } => Answer::InProgress { retry_after_s },
        Claim::KeyReused => Answer::KeyReused,
        // Callers handle Fresh and Resumed themselves; reaching here is a bug, answered as a
        // retryable in-progress rather than a panic.
        Claim::Fresh { .. } | Claim::Resumed { .. } => Answer::InProgress { retry_after_s: 1 },
    }
}

fn found(payment: &Payment, id: PaymentId) -> Result<&PaymentRecord, FlowError> {
    payment
        .record
        .as_ref()
        .ok_or_else(|| FlowError::Inconsistent(format!("payment {id} not found")))
}

/// A refused fact is recorded as a review flag: facts are never silently dropped.
fn flag_events(
    payment: &Payment,
    rejection: &PaymentRejection,
    at: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<PaymentEvent>, FlowError> {
    tracing::error!(%rejection, "provider fact refused by the domain; flagging for review");
    metrics::counter!("asiento_facts_flagged_total").increment(1);
    asiento_domain::decide_payment(
        payment,
        PaymentCommand::FlagForReview {
            note: format!("provider fact refused: {rejection}"),
            at,
        },
    )
    .map_err(|error| FlowError::Inconsistent(error.to_string()))
}

/// Provider metadata is string to string (as Stripe's is): other JSON values travel as JSON text.
fn string_metadata(metadata: &Map<String, Value>) -> BTreeMap<String, String> {
    metadata
        .iter()
        .map(|(key, value)| {
            let text = match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            (key.clone(), text)
        })
        .collect()
}

fn reply_for(kind: PaymentCommandKind, finalized: &Finalized) -> Reply<'_> {
    Reply::Payment {
        kind,
        payment: &finalized.payment,
        position: finalized.position,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_retry_goes_at_once_and_later_ones_wait_up_to_a_doubling_ceiling() {
        let ceilings: Vec<Option<u64>> = (0..8).map(backoff_ceiling_us).collect();
        assert_eq!(
            ceilings,
            [
                None,
                Some(1_000),
                Some(2_000),
                Some(4_000),
                Some(8_000),
                Some(16_000),
                Some(32_000),
                Some(32_000)
            ]
        );
        assert_eq!(backoff_ceiling_us(u32::MAX), Some(32_000));
    }

    #[test]
    fn resources_round_trip() {
        let payment = PaymentId::from_uuid(Uuid::from_u128(7));
        for resource in [
            Resource {
                payment,
                operation: None,
            },
            Resource {
                payment,
                operation: Some((OperationKind::Refund, 3)),
            },
            Resource {
                payment,
                operation: Some((OperationKind::Capture, 2)),
            },
        ] {
            assert_eq!(resource.to_string().parse::<Resource>(), Ok(resource));
        }
        assert_eq!(
            format!("{payment}/refunds/3"),
            Resource {
                payment,
                operation: Some((OperationKind::Refund, 3)),
            }
            .to_string(),
            "the form stored by earlier versions"
        );
        assert!("pay_nope".parse::<Resource>().is_err());
        assert!(format!("{payment}/refunds/x").parse::<Resource>().is_err());
        assert!(format!("{payment}/voids/1").parse::<Resource>().is_err());
    }
}
