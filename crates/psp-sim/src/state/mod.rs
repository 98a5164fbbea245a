//! The provider's books: charges, operations, the active faults and the
//! seeded randomness, behind one mutex; what it answers is in `answers`, its
//! idempotency records in `keys`. Every operation here is
//! synchronous and makes one consistent change, so "the same key always
//! returns the same charge" holds under any concurrency: the lookup and the
//! insert happen under the same lock.
//!
//! Events are emitted (recorded, and queued for the webhook dispatcher)
//! under the lock too, so they leave in the order the changes were made;
//! the reorder fault is the only thing that shuffles them.
//!
//! Captures, refunds and cancels are operations with records of their own:
//! with asynchronous modifications they answer `pending` and are decided
//! later, and a refund may fail after succeeding. A later change is queued
//! in `scheduled` and run by the caller's timer ([`SimState::run_scheduled`]),
//! so that everything here stays synchronous.

mod answers;
mod keys;

use std::collections::{HashMap, VecDeque};

use axum::body::Bytes;
use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;

use super::adyen::{self, AdyenBook};
use super::faults::{call_fault, CallFault, Faults};
use super::fee::provider_fee_minor;
use super::stripe::{self, IntentBook};
use super::Dialect;
use answers::{check_create, to_bytes};
pub(crate) use answers::{AnswerDelay, Reply};
pub use answers::{
    CancelRequest, CaptureRequest, CreateChargeRequest, RefundRequest, SimError,
    CAPTURE_REVERSAL_REASON, CHARGES_MAX, EVENTS_RECORDED_MAX, FAILED_ON_DEMAND_REASON,
    PM_CARD_DECLINED, PM_CARD_OK, PM_CARD_SLOW, PM_CARD_TIMEOUT, PM_REDIRECT, REVERSAL_REASON,
};
use asiento_psp::event::{EventData, EventType, WebhookEvent};
use asiento_psp::provider::{
    Charge, ChargeStatus, Dispute, DisputeStatus, NextAction, Operation, OperationAnswer,
    OperationKind, OperationStatus, ProviderFee, ReportLine,
};
pub(crate) use keys::check_idempotency_key;
use keys::{fingerprint, IdempotencyRecord};

/// A webhook event on its way to the dispatcher: the body is fixed once, so
/// a duplicate is byte for byte the same.
#[derive(Clone, Debug)]
pub(crate) struct Outgoing {
    pub event_id: String,
    pub body: Bytes,
}

struct ChargeRecord {
    charge: Charge,
    /// Its operations' ids, in request order.
    operations: Vec<String>,
    /// Every time the charge changed: the settlement report lists a charge
    /// in a window when one of these falls inside it.
    touches: Vec<DateTime<Utc>>,
}

/// A change that happens later, on the caller's timer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Scheduled {
    pub after_ms: u64,
    pub operation_id: String,
    pub action: LaterAction,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LaterAction {
    /// An asynchronous capture or refund is decided (succeeded).
    Decide,
    /// A succeeded refund fails (the reversal fault), or a succeeded capture (the Adyen
    /// dialect's `capture failed`).
    Reverse,
    /// A change the Adyen dialect makes later; `operation_id` names what it acts on.
    Adyen(adyen::Later),
}

struct OperationRecord {
    operation: Operation,
    /// Drawn when the refund was requested (or set by a dialect): it fails after succeeding.
    reverses: bool,
}

pub(crate) struct SimState {
    charges: HashMap<String, ChargeRecord>,
    /// Charge ids in creation order, for listings.
    order: Vec<String>,
    /// One key space for every write, as Stripe's: a key reused on another
    /// route is a reuse with a different request.
    keys: HashMap<String, IdempotencyRecord>,
    pub faults: Faults,
    fault_rng: StdRng,
    events: VecDeque<WebhookEvent>,
    outbox: Option<mpsc::Sender<Outgoing>>,
    fee_bps: u32,
    operations: HashMap<String, OperationRecord>,
    /// Later changes for the caller to run ([`SimState::take_scheduled`]).
    scheduled: Vec<Scheduled>,
    /// Keys whose requests' answers are still held back, with how many.
    in_flight: HashMap<String, u32>,
    /// Until when the provider routes refuse service (`unreachable_ms`).
    pub unreachable_until: Option<std::time::Instant>,
    /// The wire format of answers and events.
    dialect: Dialect,
    /// The Stripe dialect's PaymentIntents and stored answers.
    pub stripe: IntentBook,
    /// The Adyen dialect's payments, modifications, disputes and stored answers.
    pub adyen: AdyenBook,
    /// Captures and refunds are always decided this long after they are asked, whatever the
    /// faults say (the Adyen dialect: every modification is asynchronous there).
    modification_delay_ms: Option<u64>,
    /// The windows settlement reports were asked for, the latest [`EVENTS_RECORDED_MAX`]: what
    /// a reconciler asked at once.
    report_windows: VecDeque<(DateTime<Utc>, DateTime<Utc>)>,
}

pub(crate) fn new_id(prefix: &str) -> String {
    // Time-ordered and random rather than seeded: ids must stay unique
    // across simulator restarts, or the ledger would take a new `evt_` for
    // one it has already seen. Faults, not ids, are what a seed replays.
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

impl SimState {
    pub fn new(
        seed: u64,
        fee_bps: u32,
        dialect: Dialect,
        outbox: Option<mpsc::Sender<Outgoing>>,
    ) -> SimState {
        SimState {
            charges: HashMap::new(),
            order: Vec::new(),
            keys: HashMap::new(),
            faults: Faults::default(),
            fault_rng: StdRng::seed_from_u64(seed),
            events: VecDeque::new(),
            report_windows: VecDeque::new(),
            outbox,
            fee_bps,
            operations: HashMap::new(),
            scheduled: Vec::new(),
            in_flight: HashMap::new(),
            unreachable_until: None,
            dialect,
            stripe: IntentBook::default(),
            adyen: AdyenBook::default(),
            modification_delay_ms: None,
        }
    }

    /// Makes every capture and refund asynchronous, decided `delay_ms` after it is asked
    /// (the `async_modifications` fault, when on, says the delay instead).
    pub fn set_modification_delay(&mut self, delay_ms: u64) {
        self.modification_delay_ms = Some(delay_ms);
    }

    /// The delay of [`SimState::set_modification_delay`] (0 when none was set).
    pub fn modification_delay_ms(&self) -> u64 {
        self.modification_delay_ms.unwrap_or(0)
    }

    /// How long after it is asked a capture or refund is decided; `None`: at once.
    fn async_delay_ms(&self) -> Option<u64> {
        if self.faults.async_modifications {
            Some(self.faults.async_delay_ms)
        } else {
            self.modification_delay_ms
        }
    }

    /// Whether a write whose key's first request still runs is refused at once (409, or 422
    /// `704` in the Adyen dialect, which always does so) rather than served.
    pub fn conflicts_while_in_flight(&self) -> bool {
        self.faults.key_in_use_conflict || self.dialect == Dialect::Adyen
    }

    /// Whether the provider routes refuse service at `now`.
    pub fn unreachable(&self, now: std::time::Instant) -> bool {
        self.unreachable_until.is_some_and(|until| now < until)
    }

    /// The later changes queued since the last call, for the caller's timer.
    pub fn take_scheduled(&mut self) -> Vec<Scheduled> {
        std::mem::take(&mut self.scheduled)
    }

    pub fn draw_fault(&mut self) -> CallFault {
        let error = self.fault_rng.random::<f64>();
        let after = self.fault_rng.random::<f64>();
        let timeout = self.fault_rng.random::<f64>();
        call_fault(&self.faults, error, after, timeout)
    }

    fn emit(&mut self, kind: EventType, charge: &Charge, now: DateTime<Utc>) {
        self.emit_event(kind, charge, None, now);
    }

    fn emit_event(
        &mut self,
        kind: EventType,
        charge: &Charge,
        operation: Option<&Operation>,
        now: DateTime<Utc>,
    ) {
        let event = WebhookEvent {
            id: new_id("evt"),
            kind,
            created: now.timestamp(),
            data: EventData::of_charge(charge.clone(), operation.cloned()),
        };
        // The Adyen dialect's items are also its reports' journal: made with webhooks or not.
        if self.outbox.is_some() || self.dialect == Dialect::Adyen {
            let outgoing = match self.dialect {
                Dialect::Sim => vec![Outgoing {
                    event_id: event.id.clone(),
                    body: to_bytes(&event),
                }],
                Dialect::Stripe => stripe::events(&event, self),
                Dialect::Adyen => adyen::notifications(&event, self),
            };
            self.send(outgoing);
        }
        if self.events.len() >= EVENTS_RECORDED_MAX {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }

    /// Hands events to the webhook dispatcher, if one runs. Never blocks a request on it: a full
    /// queue loses the event, as an overloaded provider would, and says so.
    pub(crate) fn send(&mut self, outgoing: Vec<Outgoing>) {
        if self.dialect == Dialect::Adyen {
            adyen::journal(&mut self.adyen, &outgoing);
        }
        let Some(outbox) = &self.outbox else {
            return;
        };
        for outgoing in outgoing {
            let event_id = outgoing.event_id.clone();
            if let Err(error) = outbox.try_send(outgoing) {
                tracing::warn!(%event_id, %error, "webhook queue full or closed; event not sent");
            }
        }
    }

    fn record_mut(&mut self, charge_id: &str) -> Result<&mut ChargeRecord, SimError> {
        self.charges
            .get_mut(charge_id)
            .ok_or(SimError::ChargeNotFound)
    }

    /// Applies `change` to a charge, stamps it, and emits `kind` (if any)
    /// with the charge as it then stands.
    fn change(
        &mut self,
        charge_id: &str,
        now: DateTime<Utc>,
        kind: Option<EventType>,
        change: impl FnOnce(&mut Charge) -> Result<(), SimError>,
    ) -> Result<Charge, SimError> {
        let record = self.record_mut(charge_id)?;
        change(&mut record.charge)?;
        record.charge.updated = now;
        record.touches.push(now);
        let charge = record.charge.clone();
        if let Some(kind) = kind {
            self.emit(kind, &charge, now);
        }
        Ok(charge)
    }

    /// `POST /v1/charges`. `redirect_base` is where the customer would be
    /// sent for `pm_redirect`.
    pub fn create_charge(
        &mut self,
        key: &str,
        req: &CreateChargeRequest,
        now: DateTime<Utc>,
        redirect_base: &str,
    ) -> Result<Reply, SimError> {
        self.create_charge_as(key, req, now, redirect_base, new_id("ch"))
    }

    /// [`SimState::create_charge`] under a chosen id: the Stripe dialect's
    /// PaymentIntent `pi_<x>` confirms into the charge `ch_<x>`.
    pub fn create_charge_as(
        &mut self,
        key: &str,
        req: &CreateChargeRequest,
        now: DateTime<Utc>,
        redirect_base: &str,
        id: String,
    ) -> Result<Reply, SimError> {
        let fingerprint = fingerprint("POST", "/v1/charges", req);
        if let Some(record) = self.keys.get(key) {
            return match record {
                IdempotencyRecord::Charge {
                    fingerprint: stored,
                    charge_id,
                } if *stored == fingerprint => {
                    let charge = &self
                        .charges
                        .get(charge_id)
                        .ok_or(SimError::ChargeNotFound)?
                        .charge;
                    Ok(Reply {
                        replayed: true,
                        ..Reply::json(charge)
                    })
                }
                _ => Err(SimError::IdempotencyKeyReused),
            };
        }
        check_create(req)?;
        if self.charges.len() >= CHARGES_MAX {
            return Err(SimError::CapacityExhausted);
        }
        assert!(
            !self.charges.contains_key(&id),
            "charge {id} is created twice: a PaymentIntent confirms once"
        );
        let mut charge = Charge {
            id: id.clone(),
            status: ChargeStatus::RequiresAction,
            amount_minor: req.amount_minor,
            currency: req.currency.clone(),
            amount_captured: 0,
            amount_refunded: 0,
            reference: req.reference.clone(),
            idempotency_key: key.to_string(),
            payment_method: req.payment_method.clone(),
            capture: req.capture,
            failure_code: None,
            next_action: None,
            dispute: None,
            metadata: req.metadata.clone(),
            provider_fees: Vec::new(),
            created: now,
            updated: now,
        };
        let (event, delay) = match req.payment_method.as_str() {
            PM_CARD_DECLINED => {
                charge.status = ChargeStatus::Failed;
                charge.failure_code = Some("card_declined".to_string());
                (Some(EventType::ChargeFailed), AnswerDelay::None)
            }
            PM_REDIRECT => {
                charge.next_action = Some(NextAction {
                    kind: "redirect".to_string(),
                    redirect_url: format!(
                        "{}/sim/charges/{id}/authenticate",
                        redirect_base.trim_end_matches('/')
                    ),
                });
                (None, AnswerDelay::None)
            }
            method => {
                let delay = match method {
                    PM_CARD_TIMEOUT => AnswerDelay::Hang,
                    PM_CARD_SLOW => AnswerDelay::Slow,
                    _ => AnswerDelay::None,
                };
                (Some(authorize(&mut charge)), delay)
            }
        };
        self.charges.insert(
            id.clone(),
            ChargeRecord {
                charge: charge.clone(),
                operations: Vec::new(),
                touches: vec![now],
            },
        );
        self.order.push(id.clone());
        self.keys.insert(
            key.to_string(),
            IdempotencyRecord::Charge {
                fingerprint,
                charge_id: id,
            },
        );
        if let Some(event) = event {
            self.emit(event, &charge, now);
        }
        Ok(Reply {
            delay,
            ..Reply::json(&charge)
        })
    }

    /// Records a new operation on `charge_id` and answers it with the
    /// charge as it stands.
    fn new_operation(
        &mut self,
        kind: OperationKind,
        charge_id: &str,
        key: &str,
        amount_minor: i64,
        status: OperationStatus,
        now: DateTime<Utc>,
    ) -> Result<OperationAnswer, SimError> {
        let prefix = match kind {
            OperationKind::Capture => "cap",
            OperationKind::Refund => "re",
            OperationKind::Cancel => "cnl",
        };
        let record = self.record_mut(charge_id)?;
        let operation = Operation {
            id: new_id(prefix),
            kind,
            charge: charge_id.to_string(),
            idempotency_key: key.to_string(),
            amount_minor,
            currency: record.charge.currency.clone(),
            status,
            failure_reason: None,
            created: now,
            updated: now,
        };
        record.operations.push(operation.id.clone());
        let charge = record.charge.clone();
        self.operations.insert(
            operation.id.clone(),
            OperationRecord {
                operation: operation.clone(),
                reverses: false,
            },
        );
        Ok(OperationAnswer {
            operation,
            charge: Some(charge),
            request: None,
        })
    }

    /// Marks a refund (or a capture) as one that fails after succeeding.
    pub(crate) fn set_reverses(&mut self, operation_id: &str, reverses: bool) {
        if let Some(record) = self.operations.get_mut(operation_id) {
            record.reverses = reverses;
        }
    }

    /// The operations of `charge_id` of `kind` that are still pending.
    fn pending_of(&self, charge_id: &str, kind: OperationKind) -> impl Iterator<Item = &Operation> {
        self.charges
            .get(charge_id)
            .into_iter()
            .flat_map(|r| r.operations.iter())
            .filter_map(|id| self.operations.get(id))
            .map(|r| &r.operation)
            .filter(move |o| o.kind == kind && o.status == OperationStatus::Pending)
    }

    pub(crate) fn schedule(&mut self, after_ms: u64, operation_id: &str, action: LaterAction) {
        self.scheduled.push(Scheduled {
            after_ms,
            operation_id: operation_id.to_string(),
            action,
        });
    }

    /// Checks that `c` can be captured for `amount` (`None`: all of it).
    fn capturable(&self, c: &Charge, amount: Option<i64>) -> Result<i64, SimError> {
        if c.status != ChargeStatus::RequiresCapture {
            return Err(SimError::ChargeNotCapturable(c.status));
        }
        if self
            .pending_of(&c.id, OperationKind::Capture)
            .next()
            .is_some()
        {
            return Err(SimError::CapturePending);
        }
        let amount = amount.unwrap_or(c.amount_minor);
        if amount <= 0 {
            return Err(SimError::AmountMustBePositive);
        }
        if amount > c.amount_minor {
            return Err(SimError::CaptureExceedsAuthorized);
        }
        Ok(amount)
    }

    pub fn capture(
        &mut self,
        key: &str,
        charge_id: &str,
        req: &CaptureRequest,
        now: DateTime<Utc>,
    ) -> Result<Reply, SimError> {
        let fp = fingerprint("POST", &format!("/v1/charges/{charge_id}/capture"), req);
        self.keyed_write(key, fp, |state| {
            let charge = state
                .charges
                .get(charge_id)
                .ok_or(SimError::ChargeNotFound)?
                .charge
                .clone();
            let amount = state.capturable(&charge, req.amount_minor)?;
            if let Some(delay) = state.async_delay_ms() {
                let answer = state.new_operation(
                    OperationKind::Capture,
                    charge_id,
                    key,
                    amount,
                    OperationStatus::Pending,
                    now,
                )?;
                state.schedule(delay, &answer.operation.id, LaterAction::Decide);
                return Ok(answer);
            }
            let charge = state.change(charge_id, now, Some(EventType::ChargeCaptured), |c| {
                c.amount_captured = amount;
                c.status = ChargeStatus::Succeeded;
                Ok(())
            })?;
            let mut answer = state.new_operation(
                OperationKind::Capture,
                charge_id,
                key,
                amount,
                OperationStatus::Succeeded,
                now,
            )?;
            answer.charge = Some(charge);
            Ok(answer)
        })
    }

    /// Checks that `amount_minor` can be refunded from `c`: captured, not
    /// under an open dispute, and within what is captured minus what is refunded or
    /// still pending as a refund.
    fn refundable(&self, c: &Charge, amount_minor: i64) -> Result<(), SimError> {
        if amount_minor <= 0 {
            return Err(SimError::AmountMustBePositive);
        }
        if c.status != ChargeStatus::Succeeded || c.amount_captured == 0 {
            return Err(SimError::ChargeNotRefundable);
        }
        // While a dispute is open the disputed money is frozen; once it is closed, what is left
        // can be refunded again.
        if c.dispute
            .as_ref()
            .is_some_and(|d| d.status == DisputeStatus::Open)
        {
            return Err(SimError::ChargeDisputed);
        }
        let pending: i64 = self
            .pending_of(&c.id, OperationKind::Refund)
            .map(|o| o.amount_minor)
            .sum();
        let refundable = c.amount_captured - c.amount_refunded - pending;
        if amount_minor > refundable {
            return Err(SimError::RefundExceedsCaptured);
        }
        Ok(())
    }

    /// Refunds at once, without an operation (the provider's dashboard).
    fn refund_charge(
        &mut self,
        charge_id: &str,
        amount_minor: i64,
        now: DateTime<Utc>,
    ) -> Result<Charge, SimError> {
        let current = self
            .charges
            .get(charge_id)
            .ok_or(SimError::ChargeNotFound)?
            .charge
            .clone();
        self.refundable(&current, amount_minor)?;
        self.change(charge_id, now, Some(EventType::ChargeRefunded), |c| {
            c.amount_refunded += amount_minor;
            Ok(())
        })
    }

    pub fn refund(
        &mut self,
        key: &str,
        req: &RefundRequest,
        now: DateTime<Utc>,
    ) -> Result<Reply, SimError> {
        // One draw per refund request, whatever the rate, so a run replays.
        let reverses = self.fault_rng.random::<f64>() < self.faults.refund_reversal_rate;
        let fp = fingerprint("POST", "/v1/refunds", req);
        self.keyed_write(key, fp, |state| {
            let current = state
                .charges
                .get(&req.charge)
                .ok_or(SimError::ChargeNotFound)?
                .charge
                .clone();
            state.refundable(&current, req.amount_minor)?;
            if let Some(delay) = state.async_delay_ms() {
                let answer = state.new_operation(
                    OperationKind::Refund,
                    &req.charge,
                    key,
                    req.amount_minor,
                    OperationStatus::Pending,
                    now,
                )?;
                state.set_reverses(&answer.operation.id, reverses);
                state.schedule(delay, &answer.operation.id, LaterAction::Decide);
                return Ok(answer);
            }
            let charge = state.refund_charge(&req.charge, req.amount_minor, now)?;
            let mut answer = state.new_operation(
                OperationKind::Refund,
                &req.charge,
                key,
                req.amount_minor,
                OperationStatus::Succeeded,
                now,
            )?;
            answer.charge = Some(charge);
            state.set_reverses(&answer.operation.id, reverses);
            if reverses {
                let delay = state.faults.refund_reversal_delay_ms;
                state.schedule(delay, &answer.operation.id, LaterAction::Reverse);
            }
            Ok(answer)
        })
    }

    /// `POST /v1/charges/{id}/cancel`: voids an authorisation or an
    /// abandoned `requires_action` charge, synchronously.
    pub fn cancel(
        &mut self,
        key: &str,
        charge_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Reply, SimError> {
        let fp = fingerprint(
            "POST",
            &format!("/v1/charges/{charge_id}/cancel"),
            &CancelRequest {},
        );
        self.keyed_write(key, fp, |state| {
            let current = state
                .charges
                .get(charge_id)
                .ok_or(SimError::ChargeNotFound)?
                .charge
                .clone();
            if !matches!(
                current.status,
                ChargeStatus::RequiresCapture | ChargeStatus::RequiresAction
            ) {
                return Err(SimError::ChargeNotCancelable(current.status));
            }
            if state
                .pending_of(charge_id, OperationKind::Capture)
                .next()
                .is_some()
            {
                return Err(SimError::CapturePending);
            }
            let charge = state.change(charge_id, now, Some(EventType::ChargeFailed), |c| {
                c.status = ChargeStatus::Failed;
                c.failure_code = Some("canceled".to_string());
                c.next_action = None;
                Ok(())
            })?;
            let mut answer = state.new_operation(
                OperationKind::Cancel,
                charge_id,
                key,
                current.amount_minor,
                OperationStatus::Succeeded,
                now,
            )?;
            answer.charge = Some(charge);
            Ok(answer)
        })
    }

    /// Sets an operation's status, stamps it, and announces it with
    /// `operation.updated` and the charge as it then stands.
    fn settle_operation(
        &mut self,
        operation_id: &str,
        status: OperationStatus,
        failure_reason: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<OperationAnswer, SimError> {
        let record = self
            .operations
            .get_mut(operation_id)
            .ok_or(SimError::OperationNotFound)?;
        record.operation.status = status;
        record.operation.failure_reason = failure_reason.map(str::to_string);
        record.operation.updated = now;
        let operation = record.operation.clone();
        let charge = self.change(&operation.charge, now, None, |_| Ok(()))?;
        self.emit_event(EventType::OperationUpdated, &charge, Some(&operation), now);
        Ok(OperationAnswer {
            operation,
            charge: Some(charge),
            request: None,
        })
    }

    /// Runs a change that was scheduled. An operation that has moved on
    /// meanwhile (failed on demand) is left alone.
    pub fn run_scheduled(
        &mut self,
        item: &Scheduled,
        now: DateTime<Utc>,
    ) -> Result<Option<OperationAnswer>, SimError> {
        if let LaterAction::Adyen(later) = item.action {
            adyen::run_later(self, later, &item.operation_id, now)?;
            return Ok(None);
        }
        let record = self
            .operations
            .get(&item.operation_id)
            .ok_or(SimError::OperationNotFound)?;
        let operation = record.operation.clone();
        let reverses = record.reverses;
        match (item.action, operation.status) {
            (LaterAction::Decide, OperationStatus::Pending) => {
                self.decide(&operation, reverses, now).map(Some)
            }
            (LaterAction::Reverse, OperationStatus::Succeeded) => {
                let reason = match operation.kind {
                    OperationKind::Capture => CAPTURE_REVERSAL_REASON,
                    _ => REVERSAL_REASON,
                };
                self.reverse(&operation, reason, now).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Decides a pending capture or refund: it succeeds when the charge
    /// still allows it, and fails otherwise.
    fn decide(
        &mut self,
        operation: &Operation,
        reverses: bool,
        now: DateTime<Utc>,
    ) -> Result<OperationAnswer, SimError> {
        let amount = operation.amount_minor;
        let charge_id = operation.charge.as_str();
        let effect = self.change(charge_id, now, None, |c| match operation.kind {
            OperationKind::Capture if c.status == ChargeStatus::RequiresCapture => {
                c.amount_captured = amount;
                c.status = ChargeStatus::Succeeded;
                Ok(())
            }
            OperationKind::Refund
                if c.status == ChargeStatus::Succeeded
                    && c.amount_captured - c.amount_refunded >= amount =>
            {
                c.amount_refunded += amount;
                Ok(())
            }
            _ => Err(SimError::ChargeNotRefundable),
        });
        match effect {
            Ok(_) => {
                let answer =
                    self.settle_operation(&operation.id, OperationStatus::Succeeded, None, now)?;
                if reverses && operation.kind != OperationKind::Cancel {
                    let delay = self.faults.refund_reversal_delay_ms;
                    self.schedule(delay, &operation.id, LaterAction::Reverse);
                }
                Ok(answer)
            }
            Err(SimError::ChargeNotFound) => Err(SimError::ChargeNotFound),
            Err(error) => {
                self.settle_operation(&operation.id, OperationStatus::Failed, error.code(), now)
            }
        }
    }

    /// A succeeded refund fails: the refunded amount counts no more. A succeeded capture fails:
    /// nothing is captured, and the authorisation stands again.
    fn reverse(
        &mut self,
        operation: &Operation,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<OperationAnswer, SimError> {
        let amount = operation.amount_minor;
        let kind = operation.kind;
        self.change(&operation.charge, now, None, |c| {
            if kind == OperationKind::Capture {
                c.amount_captured = (c.amount_captured - amount).max(0);
                if c.amount_captured == 0 {
                    c.status = ChargeStatus::RequiresCapture;
                }
            } else {
                c.amount_refunded = (c.amount_refunded - amount).max(0);
            }
            Ok(())
        })?;
        self.settle_operation(&operation.id, OperationStatus::Failed, Some(reason), now)
    }

    /// `POST /sim/operations/{id}/fail`: a pending operation is decided
    /// failed, a succeeded refund is reversed, now.
    pub fn fail_operation(
        &mut self,
        operation_id: &str,
        now: DateTime<Utc>,
    ) -> Result<OperationAnswer, SimError> {
        let operation = self
            .operations
            .get(operation_id)
            .ok_or(SimError::OperationNotFound)?
            .operation
            .clone();
        match (operation.kind, operation.status) {
            (_, OperationStatus::Pending) => self.settle_operation(
                operation_id,
                OperationStatus::Failed,
                Some(FAILED_ON_DEMAND_REASON),
                now,
            ),
            (OperationKind::Refund, OperationStatus::Succeeded) => {
                self.reverse(&operation, REVERSAL_REASON, now)
            }
            (_, status) => Err(SimError::OperationNotFailable(status)),
        }
    }

    pub fn get_operation(&self, operation_id: &str) -> Result<Reply, SimError> {
        let record = self
            .operations
            .get(operation_id)
            .ok_or(SimError::OperationNotFound)?;
        Ok(Reply::json(&record.operation))
    }

    pub fn find_operation_by_key(&self, key: &str) -> Result<Reply, SimError> {
        if self.faults.lookup_disabled {
            return Err(SimError::NoSuchRoute);
        }
        match self.keys.get(key) {
            Some(IdempotencyRecord::Answer { operation_id, .. }) => {
                self.get_operation(operation_id)
            }
            _ => Err(SimError::OperationNotFound),
        }
    }

    /// Every operation, in request order, for the truth routes.
    pub fn operations(&self) -> Vec<Operation> {
        let mut all: Vec<Operation> = self
            .operations
            .values()
            .map(|r| r.operation.clone())
            .collect();
        // Ids are time-ordered (UUIDv7) within one prefix; order by time.
        all.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.id.cmp(&b.id)));
        all
    }

    pub fn get_charge(&self, charge_id: &str) -> Result<Reply, SimError> {
        let record = self
            .charges
            .get(charge_id)
            .ok_or(SimError::ChargeNotFound)?;
        Ok(Reply::json(&record.charge))
    }

    pub fn find_by_key(&self, key: &str) -> Result<Reply, SimError> {
        if self.faults.lookup_disabled {
            return Err(SimError::NoSuchRoute);
        }
        match self.keys.get(key) {
            Some(IdempotencyRecord::Charge { charge_id, .. }) => self.get_charge(charge_id),
            _ => Err(SimError::ChargeNotFound),
        }
    }

    /// Every charge touched in `[from, to)`, in creation order.
    pub fn report(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<ReportLine>, SimError> {
        if from >= to {
            return Err(SimError::WindowInvalid);
        }
        let lines = self
            .order
            .iter()
            .filter_map(|id| self.charges.get(id))
            .filter_map(|record| {
                let last_touched = record
                    .touches
                    .iter()
                    .filter(|t| **t >= from && **t < to)
                    .max()?;
                let c = &record.charge;
                Some(ReportLine {
                    charge_id: c.id.clone(),
                    status: c.status,
                    amount_minor: c.amount_minor,
                    amount_captured: c.amount_captured,
                    amount_refunded: c.amount_refunded,
                    provider_fees: self.provider_fees(c),
                    currency: c.currency.clone(),
                    reference: c.reference.clone(),
                    idempotency_key: c.idempotency_key.clone(),
                    dispute_status: c.dispute.as_ref().map(|d| d.status),
                    dispute: c.dispute.clone(),
                    movements: Vec::new(),
                    last_touched: *last_touched,
                })
            })
            .collect();
        Ok(lines)
    }

    /// The report of `[from, to)` with at most `limit` lines, and where it ends: past `limit`,
    /// the lines touched last before the first line left out, the report ending there (what is
    /// left is the next window's). More than `limit` lines touched at the window's very start
    /// are all told, the report then ending at `to`: a report always moves its reader on.
    pub fn report_at_most(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        limit: Option<usize>,
    ) -> Result<(Vec<ReportLine>, DateTime<Utc>), SimError> {
        let mut lines = self.report(from, to)?;
        let Some(limit) = limit.filter(|limit| lines.len() > *limit) else {
            return Ok((lines, to));
        };
        let mut touched: Vec<DateTime<Utc>> = lines.iter().map(|line| line.last_touched).collect();
        touched.sort_unstable();
        let end = touched[limit];
        if end <= from {
            return Ok((lines, to));
        }
        lines.retain(|line| line.last_touched < end);
        Ok((lines, end))
    }

    // --- control routes: what the customer, the card network or the
    // provider's own staff do to a charge ---

    pub fn complete(
        &mut self,
        charge_id: &str,
        succeeded: bool,
        now: DateTime<Utc>,
    ) -> Result<Charge, SimError> {
        let record = self.record_mut(charge_id)?;
        if record.charge.status != ChargeStatus::RequiresAction {
            return Err(SimError::ChargeNotAwaitingAction);
        }
        let mut kind = EventType::ChargeFailed;
        let charge = self.change(charge_id, now, None, |c| {
            c.next_action = None;
            if succeeded {
                kind = authorize(c);
            } else {
                c.status = ChargeStatus::Failed;
                c.failure_code = Some("authentication_failed".to_string());
            }
            Ok(())
        })?;
        self.emit(kind, &charge, now);
        Ok(charge)
    }

    pub fn refund_out_of_band(
        &mut self,
        charge_id: &str,
        amount_minor: i64,
        now: DateTime<Utc>,
    ) -> Result<Charge, SimError> {
        let charge = self.refund_charge(charge_id, amount_minor, now)?;
        if self.dialect == Dialect::Stripe {
            self.stripe.add_dashboard_refund(&charge, amount_minor, now);
        }
        Ok(charge)
    }

    pub fn open_dispute(
        &mut self,
        charge_id: &str,
        amount_minor: Option<i64>,
        now: DateTime<Utc>,
    ) -> Result<Charge, SimError> {
        self.change(charge_id, now, Some(EventType::ChargeDisputeCreated), |c| {
            if c.dispute.is_some() {
                return Err(SimError::ChargeDisputed);
            }
            let disputable = c.amount_captured - c.amount_refunded;
            if c.status != ChargeStatus::Succeeded || disputable <= 0 {
                return Err(SimError::ChargeNotRefundable);
            }
            let amount = amount_minor.unwrap_or(disputable);
            if amount <= 0 {
                return Err(SimError::AmountMustBePositive);
            }
            if amount > disputable {
                return Err(SimError::RefundExceedsCaptured);
            }
            c.dispute = Some(Dispute {
                status: DisputeStatus::Open,
                amount_minor: amount,
                created: now,
                closed: None,
                id: None,
                reinstated: false,
            });
            Ok(())
        })
    }

    pub fn close_dispute(
        &mut self,
        charge_id: &str,
        won: bool,
        now: DateTime<Utc>,
    ) -> Result<Charge, SimError> {
        self.change(
            charge_id,
            now,
            Some(EventType::ChargeDisputeClosed),
            |c| match &mut c.dispute {
                Some(d) if d.status == DisputeStatus::Open => {
                    d.status = if won {
                        DisputeStatus::Won
                    } else {
                        DisputeStatus::Lost
                    };
                    d.closed = Some(now);
                    Ok(())
                }
                _ => Err(SimError::DisputeNotOpen),
            },
        )
    }

    /// A dispute that was won is lost after all (a second chargeback): the disputed money is
    /// withdrawn again.
    pub fn second_chargeback(
        &mut self,
        charge_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Charge, SimError> {
        self.change(
            charge_id,
            now,
            Some(EventType::ChargeDisputeClosed),
            |c| match &mut c.dispute {
                Some(d) if d.status == DisputeStatus::Won => {
                    d.status = DisputeStatus::Lost;
                    d.reinstated = true;
                    d.closed = Some(now);
                    Ok(())
                }
                _ => Err(SimError::DisputeNotOpen),
            },
        )
    }

    /// Changes the amount the provider holds for a charge, silently (no
    /// event), the way a bug on either side would: a reconciliation test
    /// then finds the mismatch in the settlement report.
    pub fn set_amount(
        &mut self,
        charge_id: &str,
        amount_minor: i64,
        now: DateTime<Utc>,
    ) -> Result<Charge, SimError> {
        self.change(charge_id, now, None, |c| {
            if amount_minor <= 0 {
                return Err(SimError::AmountMustBePositive);
            }
            c.amount_minor = amount_minor;
            if c.amount_captured > 0 {
                c.amount_captured = amount_minor;
            }
            Ok(())
        })
    }

    /// The charge with this id, as it stands.
    pub fn charge(&self, charge_id: &str) -> Option<&Charge> {
        self.charges.get(charge_id).map(|record| &record.charge)
    }

    /// The operation with this id, as it stands.
    pub fn operation(&self, operation_id: &str) -> Option<&Operation> {
        self.operations
            .get(operation_id)
            .map(|record| &record.operation)
    }

    /// A charge's operations of one kind, in request order.
    pub fn operations_of(&self, charge_id: &str, kind: OperationKind) -> Vec<Operation> {
        self.charges
            .get(charge_id)
            .into_iter()
            .flat_map(|record| record.operations.iter())
            .filter_map(|id| self.operations.get(id))
            .map(|record| record.operation.clone())
            .filter(|operation| operation.kind == kind)
            .collect()
    }

    /// The fee the simulator keeps on a charge's capture, as its one balance transaction
    /// (`txn_<charge>`): the simulator's protocol reports it in the settlement report only.
    fn provider_fees(&self, charge: &Charge) -> Vec<ProviderFee> {
        let fee = provider_fee_minor(charge.amount_captured, self.fee_bps);
        if fee == 0 {
            return Vec::new();
        }
        vec![ProviderFee {
            transaction_id: format!("txn_{}", charge.id),
            fee_minor: fee,
        }]
    }

    pub fn fee_bps(&self) -> u32 {
        self.fee_bps
    }

    pub fn charges(&self) -> Vec<Charge> {
        self.order
            .iter()
            .filter_map(|id| self.charges.get(id))
            .map(|r| r.charge.clone())
            .collect()
    }

    pub fn events(&self) -> Vec<WebhookEvent> {
        self.events.iter().cloned().collect()
    }

    /// Notes that the settlement report of `[from, to)` was asked for.
    pub fn record_report_window(&mut self, from: DateTime<Utc>, to: DateTime<Utc>) {
        if self.report_windows.len() >= EVENTS_RECORDED_MAX {
            self.report_windows.pop_front();
        }
        self.report_windows.push_back((from, to));
    }

    pub fn report_windows(&self) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
        self.report_windows.iter().copied().collect()
    }
}

/// Authorizes a charge, capturing it at once when it asked to; returns the
/// event that announces it.
fn authorize(c: &mut Charge) -> EventType {
    if c.capture {
        c.status = ChargeStatus::Succeeded;
        c.amount_captured = c.amount_minor;
        EventType::ChargeSucceeded
    } else {
        c.status = ChargeStatus::RequiresCapture;
        EventType::ChargeAuthorized
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use std::collections::BTreeMap;

    fn request(method: &str, capture: bool) -> CreateChargeRequest {
        CreateChargeRequest {
            amount_minor: 10_000,
            currency: "USD".to_string(),
            payment_method: method.to_string(),
            capture,
            reference: Some("pay_1".to_string()),
            metadata: BTreeMap::new(),
        }
    }

    fn charge_of(reply: &Reply) -> Charge {
        serde_json::from_slice(&reply.body).unwrap()
    }

    #[test]
    fn payment_methods_decide_the_outcome() {
        let mut s = SimState::new(1, 0, Dialect::Sim, None);
        let now = Utc::now();
        let cases = [
            (
                PM_CARD_OK,
                true,
                ChargeStatus::Succeeded,
                10_000,
                AnswerDelay::None,
            ),
            (
                PM_CARD_OK,
                false,
                ChargeStatus::RequiresCapture,
                0,
                AnswerDelay::None,
            ),
            (
                PM_CARD_DECLINED,
                true,
                ChargeStatus::Failed,
                0,
                AnswerDelay::None,
            ),
            (
                PM_CARD_TIMEOUT,
                true,
                ChargeStatus::Succeeded,
                10_000,
                AnswerDelay::Hang,
            ),
            (
                PM_CARD_SLOW,
                true,
                ChargeStatus::Succeeded,
                10_000,
                AnswerDelay::Slow,
            ),
            (
                PM_REDIRECT,
                true,
                ChargeStatus::RequiresAction,
                0,
                AnswerDelay::None,
            ),
        ];
        for (i, (method, capture, status, captured, delay)) in cases.into_iter().enumerate() {
            let reply = s
                .create_charge(
                    &format!("k{i}"),
                    &request(method, capture),
                    now,
                    "http://sim",
                )
                .unwrap();
            let charge = charge_of(&reply);
            assert_eq!(
                (charge.status, charge.amount_captured, reply.delay),
                (status, captured, delay),
                "{method}"
            );
            assert_eq!(
                charge.next_action.is_some(),
                method == PM_REDIRECT,
                "{method}"
            );
        }
        let kinds: Vec<EventType> = s.events().iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                EventType::ChargeSucceeded,
                EventType::ChargeAuthorized,
                EventType::ChargeFailed,
                EventType::ChargeSucceeded,
                EventType::ChargeSucceeded,
            ]
        );
    }

    #[test]
    fn a_key_returns_its_charge_and_refuses_another_request() {
        let mut s = SimState::new(1, 0, Dialect::Sim, None);
        let now = Utc::now();
        let first = charge_of(
            &s.create_charge("k", &request(PM_CARD_OK, true), now, "")
                .unwrap(),
        );
        let again = s
            .create_charge("k", &request(PM_CARD_OK, true), now, "")
            .unwrap();
        assert!(again.replayed);
        assert_eq!(charge_of(&again), first);
        let mut other = request(PM_CARD_OK, true);
        other.amount_minor = 1;
        assert_eq!(
            s.create_charge("k", &other, now, "").unwrap_err(),
            SimError::IdempotencyKeyReused
        );
        // The same key on another route is a reuse too.
        let refund = RefundRequest {
            charge: first.id.clone(),
            amount_minor: 1,
        };
        assert_eq!(
            s.refund("k", &refund, now).unwrap_err(),
            SimError::IdempotencyKeyReused
        );
        assert_eq!(s.charges().len(), 1);
    }

    #[test]
    fn refunds_are_bounded_by_captured_minus_refunded_and_replay() {
        let mut s = SimState::new(1, 0, Dialect::Sim, None);
        let now = Utc::now();
        let charge = charge_of(
            &s.create_charge("k", &request(PM_CARD_OK, true), now, "")
                .unwrap(),
        );
        let refund = |amount_minor| RefundRequest {
            charge: charge.id.clone(),
            amount_minor,
        };
        let first = s.refund("r1", &refund(6_000), now).unwrap();
        let replay = s.refund("r1", &refund(6_000), now).unwrap();
        assert!(replay.replayed);
        assert_eq!(first.body, replay.body);
        assert_eq!(
            s.refund("r2", &refund(4_001), now).unwrap_err(),
            SimError::RefundExceedsCaptured
        );
        // A refusal is not stored: the key stays free.
        let done: OperationAnswer =
            serde_json::from_slice(&s.refund("r2", &refund(4_000), now).unwrap().body).unwrap();
        assert_eq!(
            (done.operation.kind, done.operation.status),
            (OperationKind::Refund, OperationStatus::Succeeded)
        );
        assert_eq!(done.charge.unwrap().amount_refunded, 10_000);
        assert_eq!(
            s.refund("r3", &refund(0), now).unwrap_err(),
            SimError::AmountMustBePositive
        );
    }

    #[test]
    fn capture_only_an_authorization_and_at_most_its_amount() {
        let mut s = SimState::new(1, 0, Dialect::Sim, None);
        let now = Utc::now();
        let auth = charge_of(
            &s.create_charge("k", &request(PM_CARD_OK, false), now, "")
                .unwrap(),
        );
        let too_much = CaptureRequest {
            amount_minor: Some(10_001),
        };
        assert_eq!(
            s.capture("c1", &auth.id, &too_much, now).unwrap_err(),
            SimError::CaptureExceedsAuthorized
        );
        let part = CaptureRequest {
            amount_minor: Some(7_000),
        };
        let answer = answer_of(&s.capture("c1", &auth.id, &part, now).unwrap());
        assert_eq!(
            (
                answer.operation.kind,
                answer.operation.status,
                answer.operation.amount_minor
            ),
            (OperationKind::Capture, OperationStatus::Succeeded, 7_000)
        );
        let captured = answer.charge.unwrap();
        assert_eq!(
            (captured.status, captured.amount_captured),
            (ChargeStatus::Succeeded, 7_000)
        );
        assert_eq!(
            s.capture("c2", &auth.id, &CaptureRequest::default(), now)
                .unwrap_err(),
            SimError::ChargeNotCapturable(ChargeStatus::Succeeded)
        );
        assert_eq!(
            s.capture("c3", "ch_nope", &part, now).unwrap_err(),
            SimError::ChargeNotFound
        );
    }

    #[test]
    fn redirects_complete_disputes_close_and_amounts_drift() {
        let mut s = SimState::new(1, 0, Dialect::Sim, None);
        let now = Utc::now();
        let pending = charge_of(
            &s.create_charge("k", &request(PM_REDIRECT, true), now, "http://h/")
                .unwrap(),
        );
        assert_eq!(
            pending.next_action.as_ref().unwrap().redirect_url,
            format!("http://h/sim/charges/{}/authenticate", pending.id)
        );
        let done = s.complete(&pending.id, true, now).unwrap();
        assert_eq!(
            (done.status, done.amount_captured, done.next_action),
            (ChargeStatus::Succeeded, 10_000, None)
        );
        assert_eq!(
            s.complete(&pending.id, true, now).unwrap_err(),
            SimError::ChargeNotAwaitingAction
        );
        let disputed = s.open_dispute(&pending.id, None, now).unwrap();
        assert_eq!(disputed.dispute.as_ref().unwrap().amount_minor, 10_000);
        assert_eq!(
            s.refund_out_of_band(&pending.id, 1, now).unwrap_err(),
            SimError::ChargeDisputed
        );
        let lost = s.close_dispute(&pending.id, false, now).unwrap();
        assert_eq!(lost.dispute.unwrap().status, DisputeStatus::Lost);
        assert_eq!(
            s.close_dispute(&pending.id, true, now).unwrap_err(),
            SimError::DisputeNotOpen
        );
        let drifted = s.set_amount(&pending.id, 9_999, now).unwrap();
        assert_eq!(
            (drifted.amount_minor, drifted.amount_captured),
            (9_999, 9_999)
        );
        let kinds: Vec<EventType> = s.events().iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                EventType::ChargeSucceeded,
                EventType::ChargeDisputeCreated,
                EventType::ChargeDisputeClosed
            ]
        );
    }

    #[test]
    fn invalid_requests_are_refused_before_anything_is_created() {
        let mut s = SimState::new(1, 0, Dialect::Sim, None);
        let now = Utc::now();
        let mut bad = request(PM_CARD_OK, true);
        bad.amount_minor = 0;
        assert_eq!(
            s.create_charge("a", &bad, now, "").unwrap_err(),
            SimError::AmountMustBePositive
        );
        let mut bad = request(PM_CARD_OK, true);
        bad.currency = "usd".to_string();
        assert_eq!(
            s.create_charge("b", &bad, now, "").unwrap_err(),
            SimError::CurrencyInvalid
        );
        let bad = request("pm_nope", true);
        assert!(matches!(
            s.create_charge("c", &bad, now, ""),
            Err(SimError::PaymentMethodUnknown(_))
        ));
        assert!(s.charges().is_empty());
        assert_eq!(
            check_idempotency_key(None),
            Err(SimError::IdempotencyKeyMissing)
        );
        assert_eq!(
            check_idempotency_key(Some("")),
            Err(SimError::IdempotencyKeyInvalid)
        );
        assert_eq!(
            check_idempotency_key(Some("a\u{7f}")),
            Err(SimError::IdempotencyKeyInvalid)
        );
        assert_eq!(
            check_idempotency_key(Some(&"k".repeat(256))),
            Err(SimError::IdempotencyKeyInvalid)
        );
        assert_eq!(
            check_idempotency_key(Some("pay_1:charge")),
            Ok("pay_1:charge")
        );
    }

    fn answer_of(reply: &Reply) -> OperationAnswer {
        serde_json::from_slice(&reply.body).unwrap()
    }

    fn captured_charge(s: &mut SimState, key: &str, now: DateTime<Utc>) -> Charge {
        charge_of(
            &s.create_charge(key, &request(PM_CARD_OK, true), now, "")
                .unwrap(),
        )
    }

    fn refund_of(charge: &Charge, amount_minor: i64) -> RefundRequest {
        RefundRequest {
            charge: charge.id.clone(),
            amount_minor,
        }
    }

    fn run_all(s: &mut SimState, now: DateTime<Utc>) -> Vec<OperationAnswer> {
        let mut done = Vec::new();
        loop {
            let items = s.take_scheduled();
            if items.is_empty() {
                return done;
            }
            for item in items {
                done.extend(s.run_scheduled(&item, now).unwrap());
            }
        }
    }

    #[test]
    fn async_modifications_answer_pending_and_change_the_charge_only_when_decided() {
        let mut s = SimState::new(1, 0, Dialect::Sim, None);
        s.faults.async_modifications = true;
        s.faults.async_delay_ms = 7;
        let now = Utc::now();
        let auth = charge_of(
            &s.create_charge("k", &request(PM_CARD_OK, false), now, "")
                .unwrap(),
        );
        let pending = answer_of(
            &s.capture("c1", &auth.id, &CaptureRequest::default(), now)
                .unwrap(),
        );
        assert_eq!(pending.operation.status, OperationStatus::Pending);
        assert_eq!(pending.operation.kind, OperationKind::Capture);
        assert_eq!(
            pending.charge.unwrap().status,
            ChargeStatus::RequiresCapture
        );
        // One capture at a time.
        assert_eq!(
            s.capture("c2", &auth.id, &CaptureRequest::default(), now)
                .unwrap_err(),
            SimError::CapturePending
        );
        let scheduled = s.take_scheduled();
        assert_eq!(scheduled.len(), 1);
        assert_eq!(scheduled[0].after_ms, 7);
        let decided = s.run_scheduled(&scheduled[0], now).unwrap().unwrap();
        assert_eq!(decided.operation.status, OperationStatus::Succeeded);
        let charge = decided.charge.unwrap();
        assert_eq!(
            (charge.status, charge.amount_captured),
            (ChargeStatus::Succeeded, 10_000)
        );
        // Running it again changes nothing.
        assert_eq!(s.run_scheduled(&scheduled[0], now).unwrap(), None);

        let first = answer_of(&s.refund("r1", &refund_of(&auth, 6_000), now).unwrap());
        assert_eq!(first.operation.status, OperationStatus::Pending);
        assert_eq!(
            first.charge.unwrap().amount_refunded,
            0,
            "pending does not count"
        );
        // A pending refund reserves its amount.
        assert_eq!(
            s.refund("r2", &refund_of(&auth, 4_001), now).unwrap_err(),
            SimError::RefundExceedsCaptured
        );
        let decided = run_all(&mut s, now);
        assert_eq!(decided.len(), 1);
        assert_eq!(decided[0].charge.as_ref().unwrap().amount_refunded, 6_000);

        let updates: Vec<&WebhookEvent> = s
            .events
            .iter()
            .filter(|e| e.kind == EventType::OperationUpdated)
            .collect();
        assert_eq!(updates.len(), 2);
        let op = updates[1].data.operation.as_ref().unwrap();
        assert_eq!(
            (op.kind, op.status),
            (OperationKind::Refund, OperationStatus::Succeeded)
        );
        assert_eq!(
            updates[1].data.charge.as_ref().unwrap().amount_refunded,
            6_000
        );
        // No charge.captured / charge.refunded for the asynchronous ones.
        assert!(!s.events.iter().any(|e| matches!(
            e.kind,
            EventType::ChargeCaptured | EventType::ChargeRefunded
        )));
    }

    #[test]
    fn a_reversed_refund_fails_later_and_stops_counting() {
        let mut s = SimState::new(1, 0, Dialect::Sim, None);
        s.faults.refund_reversal_rate = 1.0;
        s.faults.refund_reversal_delay_ms = 9;
        let now = Utc::now();
        let charge = captured_charge(&mut s, "k", now);
        let done = answer_of(&s.refund("r1", &refund_of(&charge, 6_000), now).unwrap());
        assert_eq!(done.operation.status, OperationStatus::Succeeded);
        assert_eq!(done.charge.unwrap().amount_refunded, 6_000);
        let scheduled = s.take_scheduled();
        assert_eq!(
            (scheduled.len(), scheduled[0].after_ms, scheduled[0].action),
            (1, 9, LaterAction::Reverse)
        );
        let reversed = s.run_scheduled(&scheduled[0], now).unwrap().unwrap();
        assert_eq!(reversed.operation.status, OperationStatus::Failed);
        assert_eq!(
            reversed.operation.failure_reason.as_deref(),
            Some(REVERSAL_REASON)
        );
        assert_eq!(reversed.charge.unwrap().amount_refunded, 0);
        let found: Operation =
            serde_json::from_slice(&s.find_operation_by_key("r1").unwrap().body).unwrap();
        assert_eq!(found.status, OperationStatus::Failed);
        let last = s.events.back().unwrap();
        assert_eq!(last.kind, EventType::OperationUpdated);
        assert_eq!(last.data.charge.as_ref().unwrap().amount_refunded, 0);
        // The replay of the key still answers what it answered first.
        let replay = answer_of(&s.refund("r1", &refund_of(&charge, 6_000), now).unwrap());
        assert_eq!(replay.operation.status, OperationStatus::Succeeded);

        // Rate 0: no reversal is ever scheduled.
        s.faults.refund_reversal_rate = 0.0;
        s.refund("r2", &refund_of(&charge, 1_000), now).unwrap();
        assert!(s.take_scheduled().is_empty());
    }

    #[test]
    fn a_set_modification_delay_decides_later_and_a_capture_may_fail_after_succeeding() {
        let mut s = SimState::new(1, 0, Dialect::Sim, None);
        s.set_modification_delay(25);
        let now = Utc::now();
        let auth = charge_of(
            &s.create_charge("k", &request(PM_CARD_OK, false), now, "")
                .unwrap(),
        );
        let pending = answer_of(
            &s.capture("c", &auth.id, &CaptureRequest::default(), now)
                .unwrap(),
        );
        assert_eq!(pending.operation.status, OperationStatus::Pending);
        s.set_reverses(&pending.operation.id, true);
        let decided = s.take_scheduled();
        assert_eq!(decided[0].after_ms, 25);
        let captured = s.run_scheduled(&decided[0], now).unwrap().unwrap();
        assert_eq!(captured.charge.unwrap().amount_captured, 10_000);
        let reversal = s.take_scheduled();
        assert_eq!(reversal[0].action, LaterAction::Reverse);
        let failed = s.run_scheduled(&reversal[0], now).unwrap().unwrap();
        assert_eq!(
            failed.operation.failure_reason.as_deref(),
            Some(CAPTURE_REVERSAL_REASON)
        );
        let after = failed.charge.unwrap();
        assert_eq!(
            (after.status, after.amount_captured),
            (ChargeStatus::RequiresCapture, 0)
        );
    }

    #[test]
    fn operations_fail_on_demand_and_cancels_void_what_is_not_captured() {
        let mut s = SimState::new(1, 0, Dialect::Sim, None);
        let now = Utc::now();
        let charge = captured_charge(&mut s, "k", now);
        let refund = answer_of(&s.refund("r1", &refund_of(&charge, 2_000), now).unwrap());
        let failed = s.fail_operation(&refund.operation.id, now).unwrap();
        assert_eq!(failed.operation.status, OperationStatus::Failed);
        assert_eq!(failed.charge.unwrap().amount_refunded, 0);
        assert_eq!(
            s.fail_operation(&refund.operation.id, now).unwrap_err(),
            SimError::OperationNotFailable(OperationStatus::Failed)
        );
        assert_eq!(
            s.fail_operation("re_nope", now).unwrap_err(),
            SimError::OperationNotFound
        );

        s.faults.async_modifications = true;
        let auth = charge_of(
            &s.create_charge("a", &request(PM_CARD_OK, false), now, "")
                .unwrap(),
        );
        let capture = answer_of(
            &s.capture("c", &auth.id, &CaptureRequest::default(), now)
                .unwrap(),
        );
        let failed = s.fail_operation(&capture.operation.id, now).unwrap();
        assert_eq!(
            failed.operation.failure_reason.as_deref(),
            Some(FAILED_ON_DEMAND_REASON)
        );
        // The scheduled decision finds it decided and leaves it.
        assert!(run_all(&mut s, now).is_empty());
        assert_eq!(
            s.get_charge(&auth.id).map(|r| charge_of(&r).status),
            Ok(ChargeStatus::RequiresCapture)
        );
        s.faults.async_modifications = false;

        let canceled = answer_of(&s.cancel("x1", &auth.id, now).unwrap());
        assert_eq!(
            (canceled.operation.kind, canceled.operation.amount_minor),
            (OperationKind::Cancel, 10_000)
        );
        let after = canceled.charge.unwrap();
        assert_eq!(
            (after.status, after.failure_code.as_deref()),
            (ChargeStatus::Failed, Some("canceled"))
        );
        assert!(s.cancel("x1", &auth.id, now).unwrap().replayed);
        assert_eq!(
            s.cancel("x2", &auth.id, now).unwrap_err(),
            SimError::ChargeNotCancelable(ChargeStatus::Failed)
        );
        let redirect = charge_of(
            &s.create_charge("rd", &request(PM_REDIRECT, true), now, "")
                .unwrap(),
        );
        let abandoned = answer_of(&s.cancel("x3", &redirect.id, now).unwrap());
        let after = abandoned.charge.unwrap();
        assert_eq!(
            (after.status, after.next_action),
            (ChargeStatus::Failed, None)
        );
        assert_eq!(
            s.complete(&redirect.id, true, now).unwrap_err(),
            SimError::ChargeNotAwaitingAction
        );
        assert_eq!(
            s.cancel("x4", &charge.id, now).unwrap_err(),
            SimError::ChargeNotCancelable(ChargeStatus::Succeeded)
        );
    }

    #[test]
    fn refusals_are_4xx_other_than_409_and_409_means_a_key_in_use() {
        let mut s = SimState::new(1, 0, Dialect::Sim, None);
        let now = Utc::now();
        let charge = captured_charge(&mut s, "k", now);
        s.open_dispute(&charge.id, None, now).unwrap();
        let disputed = s.refund("r", &refund_of(&charge, 1), now).unwrap_err();
        assert_eq!(disputed, SimError::ChargeDisputed);
        let not_auth = s
            .capture("c", &charge.id, &CaptureRequest::default(), now)
            .unwrap_err();
        for refusal in [
            disputed,
            not_auth,
            SimError::RefundExceedsCaptured,
            SimError::ChargeNotCancelable(ChargeStatus::Failed),
        ] {
            assert!(refusal.status().is_client_error(), "{refusal:?}");
            assert_ne!(refusal.status(), StatusCode::CONFLICT, "{refusal:?}");
        }
        assert_eq!(SimError::IdempotencyKeyInUse.status(), StatusCode::CONFLICT);
        assert_eq!(
            SimError::IdempotencyKeyInUse.code(),
            Some("idempotency_key_in_use")
        );

        s.enter("k1");
        s.enter("k1");
        s.leave("k1");
        assert!(s.in_use("k1"), "two requests held it; one left");
        s.leave("k1");
        assert!(!s.in_use("k1"));
    }

    #[test]
    fn without_the_lookup_routes_a_lookup_by_key_is_a_bare_404() {
        let mut s = SimState::new(1, 0, Dialect::Sim, None);
        let now = Utc::now();
        let charge = captured_charge(&mut s, "k", now);
        s.refund("r", &refund_of(&charge, 1), now).unwrap();
        assert!(s.find_by_key("k").is_ok());
        assert!(s.find_operation_by_key("r").is_ok());
        assert_eq!(
            s.find_operation_by_key("k").unwrap_err(),
            SimError::OperationNotFound,
            "a charge's key names no operation"
        );
        s.faults.lookup_disabled = true;
        for error in [
            s.find_by_key("k").unwrap_err(),
            s.find_operation_by_key("r").unwrap_err(),
        ] {
            assert_eq!(error, SimError::NoSuchRoute);
            assert_eq!(
                (error.status(), error.code()),
                (StatusCode::NOT_FOUND, None)
            );
        }
        // Reads by id stay.
        assert!(s.get_charge(&charge.id).is_ok());
    }

    #[test]
    fn an_unreachable_period_ends_by_itself() {
        let mut s = SimState::new(1, 0, Dialect::Sim, None);
        let now = std::time::Instant::now();
        assert!(!s.unreachable(now));
        s.unreachable_until = Some(now + std::time::Duration::from_millis(50));
        assert!(s.unreachable(now));
        assert!(!s.unreachable(now + std::time::Duration::from_millis(50)));
    }

    #[test]
    fn the_same_seed_draws_the_same_faults() {
        let faults = Faults {
            error_rate: 0.3,
            timeout_rate: 0.3,
            ..Faults::default()
        };
        let draws = |seed| {
            let mut s = SimState::new(seed, 0, Dialect::Sim, None);
            s.faults = faults.clone();
            (0..50).map(|_| s.draw_fault()).collect::<Vec<_>>()
        };
        assert_eq!(draws(9), draws(9));
        assert_ne!(draws(9), draws(10));
    }
}
