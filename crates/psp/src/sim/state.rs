//! The provider's books: charges, idempotency records, the active faults and
//! the seeded randomness, behind one mutex. Every operation here is
//! synchronous and makes one consistent change, so "the same key always
//! returns the same charge" holds under any concurrency: the lookup and the
//! insert happen under the same lock.
//!
//! Events are emitted (recorded, and queued for the webhook dispatcher)
//! under the lock too, so they leave in the order the changes were made;
//! the reorder fault is the only thing that shuffles them.

use std::collections::{BTreeMap, HashMap, VecDeque};

use axum::body::Bytes;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::faults::{call_fault, CallFault, Faults};
use crate::event::{EventData, EventType, WebhookEvent};
use crate::provider::{
    Charge, ChargeStatus, Dispute, DisputeStatus, NextAction, Refund, ReportLine,
};

/// The simulator refuses new charges beyond this many (it keeps everything
/// in memory).
pub const CHARGES_MAX: usize = 1_000_000;
/// `GET /sim/events` keeps the most recent events only.
pub const EVENTS_RECORDED_MAX: usize = 10_000;
/// Stripe's limits on metadata, so a client that passes here passes there.
pub const METADATA_KEYS_MAX: usize = 50;
pub const METADATA_KEY_LEN_MAX: usize = 40;
pub const METADATA_VALUE_LEN_MAX: usize = 500;
pub const REFERENCE_LEN_MAX: usize = 255;
pub const IDEMPOTENCY_KEY_LEN_MAX: usize = 255;

/// The payment methods and what they do.
pub const PM_CARD_OK: &str = "pm_card_ok";
pub const PM_CARD_DECLINED: &str = "pm_card_declined";
pub const PM_CARD_TIMEOUT: &str = "pm_card_timeout";
pub const PM_REDIRECT: &str = "pm_redirect";
pub const PM_CARD_SLOW: &str = "pm_card_slow";

/// A request the simulator refuses, with its HTTP status and stable code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error("the Idempotency-Key header is required")]
    IdempotencyKeyMissing,
    #[error("the Idempotency-Key must be 1-{IDEMPOTENCY_KEY_LEN_MAX} printable ASCII characters")]
    IdempotencyKeyInvalid,
    #[error("this Idempotency-Key was used with a different request")]
    IdempotencyKeyReused,
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("amount_minor must be positive")]
    AmountMustBePositive,
    #[error("currency must be a three-letter upper-case code")]
    CurrencyInvalid,
    #[error("unknown payment method {0:?}")]
    PaymentMethodUnknown(String),
    #[error("no such charge")]
    ChargeNotFound,
    #[error("the charge is {0:?}, not requires_capture")]
    ChargeNotCapturable(ChargeStatus),
    #[error("the capture exceeds the authorized amount")]
    CaptureExceedsAuthorized,
    #[error("the charge has nothing captured to refund")]
    ChargeNotRefundable,
    #[error("the refund exceeds the captured amount minus what was refunded")]
    RefundExceedsCaptured,
    #[error("the charge has a dispute")]
    ChargeDisputed,
    #[error("the charge is not waiting for a customer action")]
    ChargeNotAwaitingAction,
    #[error("the charge has no open dispute")]
    DisputeNotOpen,
    #[error("`from` must be before `to`")]
    WindowInvalid,
    #[error("the simulator holds {CHARGES_MAX} charges already")]
    CapacityExhausted,
    #[error("simulated provider error")]
    Simulated,
}

impl SimError {
    pub fn status(&self) -> StatusCode {
        match self {
            SimError::IdempotencyKeyMissing
            | SimError::IdempotencyKeyInvalid
            | SimError::InvalidRequest(_)
            | SimError::AmountMustBePositive
            | SimError::CurrencyInvalid
            | SimError::PaymentMethodUnknown(_)
            | SimError::WindowInvalid => StatusCode::BAD_REQUEST,
            SimError::ChargeNotFound => StatusCode::NOT_FOUND,
            SimError::ChargeNotCapturable(_)
            | SimError::ChargeNotRefundable
            | SimError::ChargeDisputed
            | SimError::ChargeNotAwaitingAction
            | SimError::DisputeNotOpen => StatusCode::CONFLICT,
            SimError::IdempotencyKeyReused
            | SimError::CaptureExceedsAuthorized
            | SimError::RefundExceedsCaptured => StatusCode::UNPROCESSABLE_ENTITY,
            SimError::CapacityExhausted => StatusCode::SERVICE_UNAVAILABLE,
            SimError::Simulated => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            SimError::IdempotencyKeyMissing => "idempotency_key_missing",
            SimError::IdempotencyKeyInvalid => "idempotency_key_invalid",
            SimError::IdempotencyKeyReused => "idempotency_key_reused",
            SimError::InvalidRequest(_) => "invalid_request",
            SimError::AmountMustBePositive => "amount_must_be_positive",
            SimError::CurrencyInvalid => "currency_invalid",
            SimError::PaymentMethodUnknown(_) => "payment_method_unknown",
            SimError::ChargeNotFound => crate::client::CODE_RESOURCE_MISSING,
            SimError::ChargeNotCapturable(_) => "charge_not_capturable",
            SimError::CaptureExceedsAuthorized => "capture_exceeds_authorized",
            SimError::ChargeNotRefundable => "charge_not_refundable",
            SimError::RefundExceedsCaptured => "refund_exceeds_captured",
            SimError::ChargeDisputed => "charge_disputed",
            SimError::ChargeNotAwaitingAction => "charge_not_awaiting_action",
            SimError::DisputeNotOpen => "dispute_not_open",
            SimError::WindowInvalid => "window_invalid",
            SimError::CapacityExhausted => "capacity_exhausted",
            SimError::Simulated => "simulated_error",
        }
    }

    /// Stripe's error families: the caller's fault or the provider's.
    pub fn kind(&self) -> &'static str {
        if self.status().is_server_error() {
            "api_error"
        } else {
            "invalid_request_error"
        }
    }
}

/// `POST /v1/charges`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateChargeRequest {
    pub amount_minor: i64,
    pub currency: String,
    pub payment_method: String,
    #[serde(default = "default_true")]
    pub capture: bool,
    #[serde(default)]
    pub reference: Option<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

fn default_true() -> bool {
    true
}

/// `POST /v1/charges/{id}/capture`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureRequest {
    #[serde(default)]
    pub amount_minor: Option<i64>,
}

/// `POST /v1/refunds`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefundRequest {
    pub charge: String,
    pub amount_minor: i64,
}

/// How the answer to a successful call is held back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AnswerDelay {
    None,
    /// `pm_card_slow`: `slow_ms`.
    Slow,
    /// `pm_card_timeout`: `hang_ms`, longer than any client waits.
    Hang,
}

/// A successful answer, ready to be sent.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: StatusCode,
    pub body: Bytes,
    pub replayed: bool,
    pub delay: AnswerDelay,
}

impl Reply {
    fn json(value: &impl Serialize) -> Reply {
        Reply {
            status: StatusCode::OK,
            body: to_bytes(value),
            replayed: false,
            delay: AnswerDelay::None,
        }
    }
}

fn to_bytes(value: &impl Serialize) -> Bytes {
    // Our own plain structs always serialize.
    Bytes::from(serde_json::to_vec(value).expect("simulator objects always serialize"))
}

/// A webhook event on its way to the dispatcher: the body is fixed once, so
/// a duplicate is byte for byte the same.
#[derive(Clone, Debug)]
pub(crate) struct Outgoing {
    pub event_id: String,
    pub body: Bytes,
}

struct ChargeRecord {
    charge: Charge,
    /// Every time the charge changed: the settlement report lists a charge
    /// in a window when one of these falls inside it.
    touches: Vec<DateTime<Utc>>,
}

enum IdempotencyRecord {
    /// A charge creation: a replay answers the charge as it stands now.
    Charge {
        fingerprint: String,
        charge_id: String,
    },
    /// A capture or refund: a replay answers the stored answer.
    Answer { fingerprint: String, body: Bytes },
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
}

fn new_id(prefix: &str) -> String {
    // Time-ordered and random rather than seeded: ids must stay unique
    // across simulator restarts, or the ledger would take a new `evt_` for
    // one it has already seen. Faults, not ids, are what a seed replays.
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

fn fingerprint(route: &str, target: &str, body: &impl Serialize) -> String {
    format!(
        "{route} {target} {}",
        String::from_utf8_lossy(&to_bytes(body))
    )
}

/// `bps` of `amount`, rounded half up, without floats or overflow.
pub fn fee_minor(amount_minor: i64, fee_bps: u32) -> i64 {
    let scaled = i128::from(amount_minor) * i128::from(fee_bps);
    let rounded = (scaled + 5_000).div_euclid(10_000);
    i64::try_from(rounded).unwrap_or(i64::MAX)
}

pub(crate) fn check_idempotency_key(key: Option<&str>) -> Result<&str, SimError> {
    let key = key.ok_or(SimError::IdempotencyKeyMissing)?;
    let printable = key.bytes().all(|b| (0x20..=0x7e).contains(&b));
    if key.is_empty() || key.len() > IDEMPOTENCY_KEY_LEN_MAX || !printable {
        return Err(SimError::IdempotencyKeyInvalid);
    }
    Ok(key)
}

fn check_create(req: &CreateChargeRequest) -> Result<(), SimError> {
    if req.amount_minor <= 0 {
        return Err(SimError::AmountMustBePositive);
    }
    let currency_ok =
        req.currency.len() == 3 && req.currency.bytes().all(|b| b.is_ascii_uppercase());
    if !currency_ok {
        return Err(SimError::CurrencyInvalid);
    }
    if ![
        PM_CARD_OK,
        PM_CARD_DECLINED,
        PM_CARD_TIMEOUT,
        PM_REDIRECT,
        PM_CARD_SLOW,
    ]
    .contains(&req.payment_method.as_str())
    {
        return Err(SimError::PaymentMethodUnknown(req.payment_method.clone()));
    }
    if req
        .reference
        .as_ref()
        .is_some_and(|r| r.len() > REFERENCE_LEN_MAX)
    {
        return Err(SimError::InvalidRequest(format!(
            "reference is longer than {REFERENCE_LEN_MAX}"
        )));
    }
    let metadata_ok = req.metadata.len() <= METADATA_KEYS_MAX
        && req
            .metadata
            .iter()
            .all(|(k, v)| k.len() <= METADATA_KEY_LEN_MAX && v.len() <= METADATA_VALUE_LEN_MAX);
    if !metadata_ok {
        return Err(SimError::InvalidRequest(format!(
            "metadata allows {METADATA_KEYS_MAX} keys of {METADATA_KEY_LEN_MAX} and values of {METADATA_VALUE_LEN_MAX} characters"
        )));
    }
    Ok(())
}

impl SimState {
    pub fn new(seed: u64, fee_bps: u32, outbox: Option<mpsc::Sender<Outgoing>>) -> SimState {
        SimState {
            charges: HashMap::new(),
            order: Vec::new(),
            keys: HashMap::new(),
            faults: Faults::default(),
            fault_rng: StdRng::seed_from_u64(seed),
            events: VecDeque::new(),
            outbox,
            fee_bps,
        }
    }

    pub fn draw_fault(&mut self) -> CallFault {
        let error = self.fault_rng.random::<f64>();
        let after = self.fault_rng.random::<f64>();
        let timeout = self.fault_rng.random::<f64>();
        call_fault(&self.faults, error, after, timeout)
    }

    fn emit(&mut self, kind: EventType, charge: &Charge, now: DateTime<Utc>) {
        let event = WebhookEvent {
            id: new_id("evt"),
            kind,
            created: now.timestamp(),
            data: EventData {
                charge: charge.clone(),
            },
        };
        if let Some(outbox) = &self.outbox {
            let outgoing = Outgoing {
                event_id: event.id.clone(),
                body: to_bytes(&event),
            };
            // Never block a request on the dispatcher; a full queue loses
            // the event, as an overloaded provider would, and says so.
            if let Err(error) = outbox.try_send(outgoing) {
                tracing::warn!(event_id = %event.id, %error, "webhook queue full or closed; event not sent");
            }
        }
        if self.events.len() >= EVENTS_RECORDED_MAX {
            self.events.pop_front();
        }
        self.events.push_back(event);
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
        let id = new_id("ch");
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

    /// Replays a stored capture or refund, refuses a reused key, or runs
    /// `op` and stores its answer under the key.
    fn keyed_write(
        &mut self,
        key: &str,
        fingerprint: String,
        op: impl FnOnce(&mut SimState) -> Result<Bytes, SimError>,
    ) -> Result<Reply, SimError> {
        if let Some(record) = self.keys.get(key) {
            return match record {
                IdempotencyRecord::Answer {
                    fingerprint: stored,
                    body,
                } if *stored == fingerprint => Ok(Reply {
                    status: StatusCode::OK,
                    body: body.clone(),
                    replayed: true,
                    delay: AnswerDelay::None,
                }),
                _ => Err(SimError::IdempotencyKeyReused),
            };
        }
        // Refusals are not stored: the request changed nothing, and the
        // same key may succeed once the charge allows it.
        let body = op(self)?;
        self.keys.insert(
            key.to_string(),
            IdempotencyRecord::Answer {
                fingerprint,
                body: body.clone(),
            },
        );
        Ok(Reply {
            status: StatusCode::OK,
            body,
            replayed: false,
            delay: AnswerDelay::None,
        })
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
            let charge = state.change(charge_id, now, Some(EventType::ChargeCaptured), |c| {
                if c.status != ChargeStatus::RequiresCapture {
                    return Err(SimError::ChargeNotCapturable(c.status));
                }
                let amount = req.amount_minor.unwrap_or(c.amount_minor);
                if amount <= 0 {
                    return Err(SimError::AmountMustBePositive);
                }
                if amount > c.amount_minor {
                    return Err(SimError::CaptureExceedsAuthorized);
                }
                c.amount_captured = amount;
                c.status = ChargeStatus::Succeeded;
                Ok(())
            })?;
            Ok(to_bytes(&charge))
        })
    }

    fn refund_charge(
        &mut self,
        charge_id: &str,
        amount_minor: i64,
        now: DateTime<Utc>,
    ) -> Result<Refund, SimError> {
        let charge = self.change(charge_id, now, Some(EventType::ChargeRefunded), |c| {
            if amount_minor <= 0 {
                return Err(SimError::AmountMustBePositive);
            }
            if c.status != ChargeStatus::Succeeded || c.amount_captured == 0 {
                return Err(SimError::ChargeNotRefundable);
            }
            if c.dispute.is_some() {
                return Err(SimError::ChargeDisputed);
            }
            let refundable = c.amount_captured - c.amount_refunded;
            if amount_minor > refundable {
                return Err(SimError::RefundExceedsCaptured);
            }
            c.amount_refunded += amount_minor;
            Ok(())
        })?;
        Ok(Refund {
            id: new_id("re"),
            charge: charge.id,
            amount_minor,
            currency: charge.currency,
            charge_amount_refunded: charge.amount_refunded,
            created: now,
        })
    }

    pub fn refund(
        &mut self,
        key: &str,
        req: &RefundRequest,
        now: DateTime<Utc>,
    ) -> Result<Reply, SimError> {
        let fp = fingerprint("POST", "/v1/refunds", req);
        self.keyed_write(key, fp, |state| {
            let refund = state.refund_charge(&req.charge, req.amount_minor, now)?;
            Ok(to_bytes(&refund))
        })
    }

    pub fn get_charge(&self, charge_id: &str) -> Result<Reply, SimError> {
        let record = self
            .charges
            .get(charge_id)
            .ok_or(SimError::ChargeNotFound)?;
        Ok(Reply::json(&record.charge))
    }

    pub fn find_by_key(&self, key: &str) -> Result<Reply, SimError> {
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
                    fee_minor: fee_minor(c.amount_captured, self.fee_bps),
                    currency: c.currency.clone(),
                    reference: c.reference.clone(),
                    idempotency_key: c.idempotency_key.clone(),
                    dispute_status: c.dispute.as_ref().map(|d| d.status),
                    last_touched: *last_touched,
                })
            })
            .collect();
        Ok(lines)
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
        self.refund_charge(charge_id, amount_minor, now)?;
        self.charges
            .get(charge_id)
            .map(|r| r.charge.clone())
            .ok_or(SimError::ChargeNotFound)
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
    fn fee_rounds_half_up_in_minor_units() {
        // API.md's examples at 300 bps: 50 -> 1.5 -> 2, 49 -> 1.47 -> 1.
        assert_eq!(fee_minor(50, 300), 2);
        assert_eq!(fee_minor(49, 300), 1);
        assert_eq!(fee_minor(10_000, 300), 300);
        assert_eq!(fee_minor(10_000, 0), 0);
        assert_eq!(fee_minor(i64::MAX, u32::MAX), i64::MAX);
    }

    #[test]
    fn payment_methods_decide_the_outcome() {
        let mut s = SimState::new(1, 0, None);
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
        let mut s = SimState::new(1, 0, None);
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
        let mut s = SimState::new(1, 0, None);
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
        let done: Refund =
            serde_json::from_slice(&s.refund("r2", &refund(4_000), now).unwrap().body).unwrap();
        assert_eq!(done.charge_amount_refunded, 10_000);
        assert_eq!(
            s.refund("r3", &refund(0), now).unwrap_err(),
            SimError::AmountMustBePositive
        );
    }

    #[test]
    fn capture_only_an_authorization_and_at_most_its_amount() {
        let mut s = SimState::new(1, 0, None);
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
        let captured = charge_of(&s.capture("c1", &auth.id, &part, now).unwrap());
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
        let mut s = SimState::new(1, 0, None);
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
        let mut s = SimState::new(1, 0, None);
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

    #[test]
    fn the_same_seed_draws_the_same_faults() {
        let faults = Faults {
            error_rate: 0.3,
            timeout_rate: 0.3,
            ..Faults::default()
        };
        let draws = |seed| {
            let mut s = SimState::new(seed, 0, None);
            s.faults = faults.clone();
            (0..50).map(|_| s.draw_fault()).collect::<Vec<_>>()
        };
        assert_eq!(draws(9), draws(9));
        assert_ne!(draws(9), draws(10));
    }
}
