//! The Stripe adapter: asiento's provider port over Stripe's API (`docs/providers.md`), sent
//! through [`crate::transport`] with a pinned `Stripe-Version`, form bodies and an
//! `Idempotency-Key` on every POST.
//!
//! - A charge is a PaymentIntent, created unconfirmed under the payment's PSP key and then
//!   confirmed under `<key>:confirm`: a duplicate that is never confirmed moves no money, and a
//!   re-send of both steps under the same keys while they live (under 23 h) finds the same
//!   PaymentIntent. A decline is Stripe's 402 `card_error`, whose PaymentIntent exists.
//! - Captures and cancels answer the PaymentIntent; refunds are Refund objects, `pending` until
//!   Stripe decides them (modifications are asynchronous), and a succeeded refund may still
//!   fail later.
//! - Stripe has no lookup by our key: the lookups by key are `Unsupported`, and what an answer
//!   that was lost stands for is found by id, by re-sending under the same key, or from the
//!   webhooks and the report.
//! - `idempotency_error` (the same key with another request) is a bug of ours: it is logged as
//!   an error and reported as unknown, never retried with another body.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use chrono::{DateTime, Utc};
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use reqwest::StatusCode;

use super::form::Form;
use super::reading::{
    cancel_operation, capture_operation, charge_of, dispute_fees, dispute_of, disputed,
    refund_operation, OperationRef, METADATA_CAPTURE_KEY, METADATA_PAYMENT_ID, METADATA_PSP_KEY,
};
use super::wire::{self, ErrorBody, ErrorType, Event, List, PaymentIntent, Refund, API_VERSION};
use crate::event::{EventData, EventType, WebhookEvent};
use crate::payout::Payout;
use crate::provider::{
    Capabilities, Charge, ChargeOutcome, CreateCharge, Movement, MovementKind, Operation,
    OperationAnswer, Provider, ProviderError, ProviderRequest, ReportLine, SettlementReport,
};
use crate::transport::{
    decode, Answered, Call, CallError, ClientConfig, ClientInitError, Transport,
};

const FORM: &str = "application/x-www-form-urlencoded";
/// What every read or write of a PaymentIntent expands: its charge, and the charge's balance
/// transaction, whose fee is posted as Stripe's.
const EXPAND_CHARGE: &str = "latest_charge.balance_transaction";

/// What a PaymentIntent's confirmation is keyed with: its creation's key and this.
const CONFIRM_KEY_SUFFIX: &str = ":confirm";

/// What Stripe allows: lookups by id only, asynchronous refunds, keys planned for 23 hours
/// (Stripe prunes them "at least 24 hours" after first use).
pub const CAPABILITIES: Capabilities = Capabilities {
    lookup_by_key: false,
    lookup_by_id: true,
    async_modifications: true,
    key_lifetime: Duration::from_secs(23 * 60 * 60),
    absence_confirmed_after: Duration::ZERO,
    report_slice: Some(crate::provider::REPORT_SLICE),
};

/// The most objects a listing other than a settlement report's reads (100 pages of 100 each).
/// A report's listings hold at most `ClientConfig::report_lines_max` each: a window with more is
/// halved ([`StripeProvider::settlement_report`]).
pub const REPORT_OBJECTS_MAX: usize = 10_000;

/// Why a listing gave no objects.
#[derive(Debug)]
pub(super) enum Listing {
    /// It holds more objects than its cap allowed.
    TooMany {
        path: String,
        cap: usize,
    },
    Provider(ProviderError),
}

impl From<ProviderError> for Listing {
    fn from(error: ProviderError) -> Self {
        Listing::Provider(error)
    }
}

impl From<Listing> for ProviderError {
    fn from(listing: Listing) -> Self {
        match listing {
            Listing::TooMany { path, cap } => ProviderError::Unknown {
                reason: format!("more than {cap} objects at {path} in one listing"),
            },
            Listing::Provider(error) => error,
        }
    }
}

/// A [`Provider`] speaking Stripe's API.
#[derive(Debug)]
pub struct StripeProvider {
    pub(super) transport: Transport,
}

/// Why a Stripe adapter could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StripeInitError {
    #[error("the Stripe API key is not a valid header value")]
    ApiKeyInvalid,
    #[error(transparent)]
    Client(#[from] ClientInitError),
}

impl StripeProvider {
    /// `base_url` is `https://api.stripe.com` (or a Stripe dialect simulator); `api_key` is the
    /// account's secret key, sent as a Bearer token and never logged.
    pub fn new(
        name: impl Into<String>,
        base_url: &str,
        api_key: &str,
        config: ClientConfig,
    ) -> Result<StripeProvider, StripeInitError> {
        let mut headers = HeaderMap::new();
        let mut authorization = HeaderValue::from_str(&format!("Bearer {api_key}"))
            .map_err(|_| StripeInitError::ApiKeyInvalid)?;
        authorization.set_sensitive(true);
        headers.insert(AUTHORIZATION, authorization);
        headers.insert("Stripe-Version", HeaderValue::from_static(API_VERSION));
        Ok(StripeProvider {
            transport: Transport::new(name, base_url, config, headers)?,
        })
    }

    async fn post(&self, segments: &[&str], key: &str, form: &Form) -> Result<Answered, CallError> {
        let body = Bytes::from(form.encode());
        let answered = self
            .transport
            .call(Call::write(self.transport.url(segments), key, body, FORM))
            .await?;
        let request = request_of(&answered);
        tracing::info!(
            provider = %self.transport.name(),
            key,
            request_id = request.as_ref().map_or("", |request| request.id.as_str()),
            replayed = request.as_ref().is_some_and(|request| request.replayed),
            "stripe answered"
        );
        Ok(answered)
    }

    /// A write's answer, and the request of Stripe's that gave it.
    async fn post_object<T: serde::de::DeserializeOwned>(
        &self,
        segments: &[&str],
        key: &str,
        form: &Form,
    ) -> Result<(T, Option<ProviderRequest>), ProviderError> {
        let answered = self
            .post(segments, key, form)
            .await
            .map_err(|error| self.provider_error(error))?;
        Ok((decode(&answered.body)?, request_of(&answered)))
    }

    /// A refusal, unless it is `idempotency_error`: our bug, whose first request may have acted.
    fn provider_error(&self, error: CallError) -> ProviderError {
        if let Some((_, body)) = error.answered() {
            if let Ok(ErrorBody { error: object }) = serde_json::from_slice::<ErrorBody>(body) {
                if object.kind == ErrorType::IdempotencyError {
                    tracing::error!(
                        provider = %self.transport.name(),
                        message = object.message.as_deref().unwrap_or_default(),
                        "Stripe refused a key sent with another request: a bug of ours"
                    );
                    return ProviderError::Unknown {
                        reason: "idempotency_error: the key was first sent with another request"
                            .to_owned(),
                    };
                }
            }
        }
        error.into_provider_error()
    }

    /// What a failed creation or confirmation says about the charge.
    fn charge_outcome(&self, error: CallError) -> ChargeOutcome {
        if let Some((StatusCode::PAYMENT_REQUIRED, body)) = error.answered() {
            if let Ok(ErrorBody { error: object }) = serde_json::from_slice::<ErrorBody>(body) {
                if let Some(intent) = object.payment_intent {
                    return match charge_of(&intent) {
                        Ok(charge) => ChargeOutcome::from_charge(charge),
                        Err(error) => ChargeOutcome::Unknown {
                            reason: error.to_string(),
                        },
                    };
                }
            }
        }
        match self.provider_error(error) {
            ProviderError::Rejected(rejection) => ChargeOutcome::Rejected(rejection),
            other => ChargeOutcome::Unknown {
                reason: other.to_string(),
            },
        }
    }

    /// The charge a PaymentIntent stands for now, with its charge's dispute when it has one.
    pub(super) async fn charge_now(&self, intent: &PaymentIntent) -> Result<Charge, ProviderError> {
        self.with_dispute(intent, charge_of(intent)?).await
    }

    /// `charge` with its dispute, when the PaymentIntent's charge is disputed (a PaymentIntent
    /// does not carry it: one more read, for disputed charges only).
    async fn with_dispute(
        &self,
        intent: &PaymentIntent,
        mut charge: Charge,
    ) -> Result<Charge, ProviderError> {
        if disputed(intent) {
            let mut url = self.transport.url(&["v1", "disputes"]);
            url.query_pairs_mut()
                .append_pair("payment_intent", &intent.id)
                .append_pair("limit", "1");
            let newest: List<wire::Dispute> = self.transport.object(Call::read(url)).await?;
            if let Some(dispute) = newest.data.first() {
                charge.dispute = Some(dispute_of(dispute));
                charge.provider_fees.extend(dispute_fees(dispute));
            }
        }
        Ok(charge)
    }

    pub(super) async fn intent(&self, id: &str) -> Result<Option<PaymentIntent>, ProviderError> {
        let mut url = self.transport.url(&["v1", "payment_intents", id]);
        url.query_pairs_mut()
            .append_pair("expand[0]", EXPAND_CHARGE);
        self.transport.lookup(url).await
    }
}

#[async_trait]
impl Provider for StripeProvider {
    fn name(&self) -> &str {
        self.transport.name()
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), key = %req.idempotency_key))]
    async fn create_charge(&self, req: &CreateCharge) -> ChargeOutcome {
        let mut metadata: BTreeMap<String, String> = req.metadata.clone();
        if let Some(reference) = &req.reference {
            metadata.insert(METADATA_PAYMENT_ID.to_owned(), reference.clone());
        }
        metadata.insert(METADATA_PSP_KEY.to_owned(), req.idempotency_key.clone());
        let create = Form::new()
            .field("amount", req.amount_minor.to_string())
            .field("currency", req.currency.to_ascii_lowercase())
            .field("payment_method", &req.payment_method)
            .field(
                "capture_method",
                if req.capture { "automatic" } else { "manual" },
            )
            .list("payment_method_types", ["card"])
            .map("metadata", &metadata);
        let created = match self
            .post(&["v1", "payment_intents"], &req.idempotency_key, &create)
            .await
        {
            Ok(answered) => answered,
            Err(error) => return self.charge_outcome(error),
        };
        let intent: PaymentIntent = match decode(&created.body) {
            Ok(intent) => intent,
            Err(error) => {
                return ChargeOutcome::Unknown {
                    reason: error.to_string(),
                }
            }
        };
        let confirm = Form::new().list("expand", [EXPAND_CHARGE]);
        let key = format!("{}{CONFIRM_KEY_SUFFIX}", req.idempotency_key);
        match self
            .post(
                &["v1", "payment_intents", &intent.id, "confirm"],
                &key,
                &confirm,
            )
            .await
        {
            Ok(answered) => match decode::<PaymentIntent>(&answered.body)
                .and_then(|intent| charge_of(&intent))
            {
                Ok(charge) => ChargeOutcome::from_charge(charge),
                Err(error) => ChargeOutcome::Unknown {
                    reason: error.to_string(),
                },
            },
            Err(error) => self.charge_outcome(error),
        }
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), charge_id, key = %idempotency_key))]
    async fn capture(
        &self,
        charge_id: &str,
        amount_minor: Option<i64>,
        _currency: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        let form = Form::new()
            .optional(
                "amount_to_capture",
                amount_minor.map(|amount| amount.to_string()),
            )
            .map(
                "metadata",
                &BTreeMap::from([(METADATA_CAPTURE_KEY.to_owned(), idempotency_key.to_owned())]),
            )
            .list("expand", [EXPAND_CHARGE]);
        let (intent, request): (PaymentIntent, _) = self
            .post_object(
                &["v1", "payment_intents", charge_id, "capture"],
                idempotency_key,
                &form,
            )
            .await?;
        Ok(OperationAnswer {
            operation: capture_operation(&intent, Some(idempotency_key), amount_minor),
            charge: charge_of(&intent).ok(),
            request,
        })
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), charge_id, key = %idempotency_key))]
    async fn refund(
        &self,
        charge_id: &str,
        amount_minor: i64,
        _currency: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        let form = Form::new()
            .field("payment_intent", charge_id)
            .field("amount", amount_minor.to_string())
            .map(
                "metadata",
                &BTreeMap::from([(METADATA_PSP_KEY.to_owned(), idempotency_key.to_owned())]),
            );
        let (refund, request): (Refund, _) = self
            .post_object(&["v1", "refunds"], idempotency_key, &form)
            .await?;
        Ok(OperationAnswer {
            operation: refund_operation(&refund, Some(idempotency_key)),
            charge: None,
            request,
        })
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), charge_id, key = %idempotency_key))]
    async fn cancel(
        &self,
        charge_id: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        let form = Form::new().list("expand", [EXPAND_CHARGE]);
        let (intent, request): (PaymentIntent, _) = self
            .post_object(
                &["v1", "payment_intents", charge_id, "cancel"],
                idempotency_key,
                &form,
            )
            .await?;
        Ok(OperationAnswer {
            operation: cancel_operation(&intent, idempotency_key),
            charge: charge_of(&intent).ok(),
            request,
        })
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), charge_id))]
    async fn get_charge(&self, charge_id: &str) -> Result<Option<Charge>, ProviderError> {
        match self.intent(charge_id).await? {
            Some(intent) => self.charge_now(&intent).await.map(Some),
            None => Ok(None),
        }
    }

    async fn find_charge_by_key(&self, _key: &str) -> Result<Option<Charge>, ProviderError> {
        Err(ProviderError::Unsupported {
            what: "look a PaymentIntent up by our idempotency key (Stripe has no such lookup)"
                .to_owned(),
        })
    }

    /// The events list (kept 30 days) of the window, paged: the first `payment_intent.*` event
    /// whose request was made under the key, or under its confirmation's (`<key>:confirm`),
    /// names the PaymentIntent, read as it stands; one never confirmed moved no money (`None`).
    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), key = %key))]
    async fn find_charge_in_events(
        &self,
        key: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Option<Charge>, ProviderError> {
        let [gte, lt] = created_in(from, to);
        let filters = [("type", "payment_intent.*".to_owned()), gte, lt];
        let events: Vec<Event> = self.listed(&["v1", "events"], &filters, None).await?;
        let confirm_key = format!("{key}{CONFIRM_KEY_SUFFIX}");
        let named = events.iter().find_map(|event| {
            let request = event.request.as_ref()?.idempotency_key.as_deref()?;
            (request == key || request == confirm_key)
                .then(|| event.data.object["id"].as_str())
                .flatten()
        });
        let Some(id) = named else {
            return Ok(None);
        };
        tracing::warn!(intent = %id, "a PaymentIntent made under our key found in Stripe's events, not in the report");
        match self.intent(id).await? {
            Some(intent) if charge_of(&intent).is_ok() => Ok(Some(self.charge_now(&intent).await?)),
            _ => Ok(None),
        }
    }

    async fn find_operation_by_key(&self, _key: &str) -> Result<Option<Operation>, ProviderError> {
        Err(ProviderError::Unsupported {
            what: "look a refund or capture up by our idempotency key (Stripe has no such lookup)"
                .to_owned(),
        })
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), operation_id = %id))]
    async fn get_operation(&self, id: &str) -> Result<Option<Operation>, ProviderError> {
        match OperationRef::parse(id) {
            Some(OperationRef::Refund(refund)) => {
                let url = self.transport.url(&["v1", "refunds", refund]);
                let refund: Option<Refund> = self.transport.lookup(url).await?;
                Ok(refund.map(|refund| refund_operation(&refund, None)))
            }
            Some(OperationRef::Capture(intent)) => Ok(self
                .intent(intent)
                .await?
                .map(|intent| capture_operation(&intent, None, None))),
            Some(OperationRef::Cancel(intent)) => Ok(self
                .intent(intent)
                .await?
                .map(|intent| cancel_operation(&intent, ""))),
            None => Ok(None),
        }
    }

    /// The event as a hint: the PaymentIntent it is about (and the refund, for a refund's
    /// event) read as they stand now, so that events arriving late, twice or out of order all
    /// say the same.
    #[tracing::instrument(skip_all, fields(provider = %self.transport.name()))]
    async fn read_event(&self, body: &[u8]) -> Result<Option<WebhookEvent>, ProviderError> {
        let event: Event = decode(body)?;
        let Some(hint) = Hint::of(&event) else {
            tracing::debug!(kind = %event.kind, "Stripe event type not used by the ledger");
            return Ok(None);
        };
        let operation = match hint.refund {
            Some(refund) => {
                let url = self.transport.url(&["v1", "refunds", refund]);
                match self.transport.lookup::<Refund>(url).await? {
                    Some(refund) => Some(refund_operation(&refund, None)),
                    None => return Err(gone("refund", refund)),
                }
            }
            None => None,
        };
        let intent_id = match (&operation, hint.intent) {
            (Some(operation), _) => operation.charge.clone(),
            (None, Some(intent)) => intent.to_owned(),
            (None, None) => return Ok(None),
        };
        let Some(intent) = self.intent(&intent_id).await? else {
            return Err(gone("payment_intent", &intent_id));
        };
        if !intent.metadata.contains_key(METADATA_PAYMENT_ID) {
            // Made on the same account by something other than asiento: not ours to apply.
            tracing::debug!(intent = %intent.id, "Stripe event about a PaymentIntent asiento did not create");
            return Ok(None);
        }
        Ok(Some(WebhookEvent {
            id: event.id.clone(),
            kind: hint.kind,
            created: event.created,
            data: EventData::of_charge(self.charge_now(&intent).await?, operation),
        }))
    }

    fn payout_of_event(&self, body: &[u8]) -> Option<String> {
        super::payouts::payout_of_event(body)
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), payout = %id))]
    async fn get_payout(&self, id: &str) -> Result<Option<Payout>, ProviderError> {
        self.read_payout(id).await
    }

    async fn payouts_created(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<String>, ProviderError> {
        self.payout_ids_created(from, to).await
    }

    /// Every PaymentIntent created in `[from, to)` or whose money moved then (a balance
    /// transaction of its charge, a refund, a refund failure or a dispute, paged by `created`),
    /// each as it stands now, with Stripe's fees from its balance transactions. A refund or a
    /// dispute on a PaymentIntent created in an earlier window is in the window it happened in.
    ///
    /// A window where a listing holds more than `report_lines_max` objects is halved (in whole
    /// seconds, Stripe's `created` filter) until its first part fits: the report then ends early,
    /// at that part's end, and the reconciler asks for the rest. Stripe lists newest first, so a
    /// listing cut short is not a report of the window's start.
    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), %from, %to))]
    async fn settlement_report(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<SettlementReport, ProviderError> {
        let cap = self.transport.config().report_lines_max.max(1);
        let mut until = to;
        loop {
            match self.report_until(from, until, cap).await {
                Ok(report) => return Ok(report),
                Err(Listing::TooMany { path, cap }) => {
                    let seconds = until.timestamp() - from.timestamp();
                    let half = DateTime::from_timestamp(from.timestamp() + seconds / 2, 0);
                    match half.filter(|_| seconds > 1) {
                        Some(half) => until = half,
                        None => return Err(Listing::TooMany { path, cap }.into()),
                    }
                }
                Err(Listing::Provider(error)) => return Err(error),
            }
        }
    }
}

impl StripeProvider {
    /// The settlement report of `[from, to)`, each listing holding at most `cap` objects.
    async fn report_until(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        cap: usize,
    ) -> Result<SettlementReport, Listing> {
        let mut lines = Vec::new();
        let mut listed = BTreeSet::new();
        let created: Vec<PaymentIntent> = self
            .listed_at_most(
                &["v1", "payment_intents"],
                &created_in(from, to),
                Some(&format!("data.{EXPAND_CHARGE}")),
                cap,
            )
            .await?;
        let moved: Vec<wire::BalanceTransaction> = self
            .listed_at_most(
                &["v1", "balance_transactions"],
                &created_in(from, to),
                Some("data.source"),
                cap,
            )
            .await?;
        let mut movements: BTreeMap<String, Vec<Movement>> = BTreeMap::new();
        for txn in &moved {
            let intent = txn
                .source
                .as_ref()
                .and_then(|source| source.object()?.payment_intent.as_ref());
            if let Some(intent) = intent {
                movements
                    .entry(intent.id().to_owned())
                    .or_default()
                    .push(movement_of(txn));
            }
        }
        for intent in &created {
            listed.insert(intent.id.clone());
            // No outcome yet: nothing to compare.
            if let Ok(charge) = charge_of(intent) {
                let mut line = report_line(self.with_dispute(intent, charge).await?);
                line.movements = movements.remove(&intent.id).unwrap_or_default();
                lines.push(line);
            }
        }
        for (id, moved) in movements {
            if listed.contains(&id) {
                continue;
            }
            let Some(intent) = self.intent(&id).await? else {
                return Err(gone("PaymentIntent", &id).into());
            };
            if let Ok(charge) = charge_of(&intent) {
                let mut line = report_line(self.with_dispute(&intent, charge).await?);
                line.movements = moved;
                lines.push(line);
            }
        }
        Ok(SettlementReport {
            from,
            to,
            data: lines,
        })
    }

    /// Every object of a listing with `filters`, page after page (`starting_after` the last
    /// one's id), at most [`REPORT_OBJECTS_MAX`].
    pub(super) async fn listed<T>(
        &self,
        path: &[&str],
        filters: &[(&str, String)],
        expand: Option<&str>,
    ) -> Result<Vec<T>, ProviderError>
    where
        T: serde::de::DeserializeOwned + wire::HasId,
    {
        Ok(self
            .listed_at_most(path, filters, expand, REPORT_OBJECTS_MAX)
            .await?)
    }

    /// [`StripeProvider::listed`], at most `cap` objects.
    async fn listed_at_most<T>(
        &self,
        path: &[&str],
        filters: &[(&str, String)],
        expand: Option<&str>,
        cap: usize,
    ) -> Result<Vec<T>, Listing>
    where
        T: serde::de::DeserializeOwned + wire::HasId,
    {
        let mut all: Vec<T> = Vec::new();
        loop {
            let mut url = self.transport.url(path);
            {
                let mut query = url.query_pairs_mut();
                query.append_pair("limit", "100");
                for (name, value) in filters {
                    query.append_pair(name, value);
                }
                if let Some(expand) = expand {
                    query.append_pair("expand[0]", expand);
                }
                if let Some(last) = all.last() {
                    query.append_pair("starting_after", last.id());
                }
            }
            let page: List<T> = self.transport.object(Call::read(url)).await?;
            let more = page.has_more && !page.data.is_empty();
            all.extend(page.data);
            if all.len() > cap || (more && all.len() == cap) {
                return Err(Listing::TooMany {
                    path: path.join("/"),
                    cap,
                });
            }
            if !more {
                return Ok(all);
            }
        }
    }
}

/// The filters of a listing by creation in `[from, to)`.
pub(super) fn created_in(from: DateTime<Utc>, to: DateTime<Utc>) -> [(&'static str, String); 2] {
    [
        ("created[gte]", from.timestamp().to_string()),
        ("created[lt]", to.timestamp().to_string()),
    ]
}

/// A charge as a settlement report's line.
fn report_line(charge: Charge) -> ReportLine {
    ReportLine {
        status: charge.status,
        amount_minor: charge.amount_minor,
        amount_captured: charge.amount_captured,
        amount_refunded: charge.amount_refunded,
        provider_fees: charge.provider_fees,
        currency: charge.currency,
        reference: charge.reference,
        idempotency_key: charge.idempotency_key,
        dispute_status: charge.dispute.as_ref().map(|dispute| dispute.status),
        dispute: charge.dispute,
        movements: Vec::new(),
        last_touched: charge.updated,
        charge_id: charge.id,
    }
}

/// A balance transaction as a movement of a charge's money.
fn movement_of(txn: &wire::BalanceTransaction) -> Movement {
    let kind = match (txn.kind.as_str(), txn.reporting_category.as_str()) {
        ("charge" | "payment", _) => MovementKind::Charge,
        ("refund" | "payment_refund", _) => MovementKind::Refund,
        ("refund_failure" | "payment_failure_refund", _) => MovementKind::RefundFailure,
        ("adjustment", "dispute") => MovementKind::DisputeWithdrawal,
        ("adjustment", "dispute_reversal") => MovementKind::DisputeReinstatement,
        _ => MovementKind::Other,
    };
    Movement {
        id: txn.id.clone(),
        kind,
        amount_minor: txn.amount,
        fee_minor: txn.fee,
        net_minor: txn.net,
        source: txn
            .source
            .as_ref()
            .map(|source| source.id().to_owned())
            .unwrap_or_default(),
    }
}

/// The request Stripe names in an answer's `Request-Id`, and whether `Idempotent-Replayed` says
/// it replayed the first answer under the key.
fn request_of(answered: &Answered) -> Option<ProviderRequest> {
    let header = |name: &str| {
        answered
            .headers
            .get(name)
            .and_then(|value| value.to_str().ok())
    };
    let id = header("Request-Id").filter(|id| !id.is_empty())?;
    Some(ProviderRequest {
        id: id.to_owned(),
        replayed: header("Idempotent-Replayed") == Some("true"),
    })
}

/// A Stripe event's object was announced and is not there: Stripe keeps objects, so this is a
/// stale or foreign event, asked again later and then dead-lettered by the worker.
fn gone(object: &str, id: &str) -> ProviderError {
    ProviderError::Unknown {
        reason: format!("the event names {object} {id}, which Stripe does not have"),
    }
}

/// What a Stripe event points at: the PaymentIntent (directly, or through the charge or dispute
/// it is about), or the refund, and which of our event types it stands for.
struct Hint<'a> {
    kind: EventType,
    intent: Option<&'a str>,
    refund: Option<&'a str>,
}

impl<'a> Hint<'a> {
    fn of(event: &'a Event) -> Option<Hint<'a>> {
        let object = &event.data.object;
        let id = object["id"].as_str();
        let intent_of_object = object["payment_intent"].as_str();
        let (kind, intent, refund) = match event.kind.as_str() {
            "payment_intent.succeeded" => (EventType::ChargeSucceeded, id, None),
            "payment_intent.amount_capturable_updated" => (EventType::ChargeAuthorized, id, None),
            "payment_intent.payment_failed" | "payment_intent.canceled" => {
                (EventType::ChargeFailed, id, None)
            }
            "charge.succeeded" | "charge.updated" => {
                (EventType::ChargeSucceeded, intent_of_object, None)
            }
            "charge.captured" => (EventType::ChargeCaptured, intent_of_object, None),
            "charge.failed" | "charge.expired" => (EventType::ChargeFailed, intent_of_object, None),
            "charge.refunded" => (EventType::ChargeRefunded, intent_of_object, None),
            "refund.created" | "refund.updated" | "refund.failed" | "charge.refund.updated" => {
                (EventType::OperationUpdated, None, id)
            }
            "charge.dispute.created"
            | "charge.dispute.updated"
            | "charge.dispute.funds_withdrawn" => {
                (EventType::ChargeDisputeCreated, intent_of_object, None)
            }
            "charge.dispute.closed" | "charge.dispute.funds_reinstated" => {
                (EventType::ChargeDisputeClosed, intent_of_object, None)
            }
            _ => return None,
        };
        if intent.is_none() && refund.is_none() {
            return None;
        }
        Some(Hint {
            kind,
            intent,
            refund,
        })
    }
}
