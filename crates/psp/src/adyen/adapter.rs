//! The Adyen adapter: asiento's provider port over Adyen's Checkout API v71
//! (`docs/providers.md`), sent through [`crate::transport`] with `X-API-Key`, JSON bodies and an
//! `Idempotency-Key` on every POST.
//!
//! - A charge is a `/payments` request under the payment's PSP key, `reference` our payment id.
//!   The payment method is a token Adyen stored for the shopper (`storedPaymentMethodId`,
//!   shopper = our customer), charged as card-on-file. Automatic capture is asked for with
//!   `captureDelayHours: 0` (which Adyen echoes in the AUTHORISATION notification, so that a
//!   notification alone tells how the payment captures), manual capture with
//!   `additionalData.manualCapture`.
//! - Captures, refunds and cancels are modifications: Adyen answers `received` (a pending
//!   operation) and decides by notification; a success may still fail later (CAPTURE_FAILED,
//!   REFUND_FAILED, REFUNDED_REVERSED). Each carries its PSP key as `reference`, which the
//!   notification echoes as `merchantReference`.
//! - There is no lookup of any kind: every lookup is `Unsupported`, and what a lost answer stands
//!   for is found by re-sending under the same key while it lives (keys planned for 7 days), by
//!   the notifications, or from the reports.
//! - Reconciliation reads Adyen's CSV reports as the report user ([`super::reports`]), once
//!   [`AdyenProvider::with_reports`] says where they are: the settlement report from the daily
//!   Payment accounting reports, payouts from the Settlement details batches. Without it the
//!   report and the payouts are `Unsupported`.
//! - Error 704 (the key's first request still runs) carries `transient-error: true` and is
//!   retried with the same key; after the retries it is unknown, never a refusal.

use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use chrono::{DateTime, Utc};
use reqwest::header::{HeaderMap, HeaderValue};

use super::reading::{item_event, payment_outcome, received};
use super::reports::download::Reports;
use super::reports::{batch_of_event, payout_id, ReportsAccess, ReportsInitError};
use super::wire::{
    Amount, CardDetails, ModificationRequest, ModificationResponse, NotificationItem,
    PaymentRequest, PaymentResponse, API_VERSION, MANUAL_CAPTURE,
};
use crate::event::WebhookEvent;
use crate::payout::Payout;
use crate::provider::{
    Capabilities, Charge, ChargeOutcome, CreateCharge, Operation, OperationAnswer, OperationKind,
    Provider, ProviderError, SettlementReport,
};
use crate::transport::{Call, ClientConfig, ClientInitError, Transport};

const JSON: &str = "application/json";
/// The header of Adyen's API key.
pub const API_KEY_HEADER: &str = "X-API-Key";

/// What Adyen allows: no lookup at all, asynchronous modifications, keys planned for 7 days
/// (Adyen keeps them "a minimum of 31 days"; an older statement said 7 to 14).
pub const CAPABILITIES: Capabilities = Capabilities {
    lookup_by_key: false,
    lookup_by_id: false,
    async_modifications: true,
    key_lifetime: Duration::from_secs(7 * 24 * 60 * 60),
    // docs/adyen-wire.md §3: the AUTHORISATION window, then two daily Payment accounting reports.
    absence_confirmed_after: Duration::from_secs(2 * 24 * 60 * 60),
    // A report reads the accounting files of whole days, whatever part of them it is asked for.
    report_slice: None,
};

/// Where the shopper returns after a redirect when none is configured; Adyen requires one on
/// every `/payments` request.
pub const RETURN_URL_DEFAULT: &str = "https://localhost/asiento/return";

/// The lengths Adyen takes for a `shopperReference` (`PaymentRequest`'s schema). A customer id
/// outside them is not sent: Adyen would refuse the whole request for it, and no token can have
/// been stored under it.
pub const SHOPPER_REFERENCE_CHARS: std::ops::RangeInclusive<usize> = 3..=256;

/// An Adyen merchant account's settings beside its credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdyenAccount {
    /// The merchant account every request names (`merchantAccount`).
    pub merchant_account: String,
    /// Where a redirected shopper comes back to (`returnUrl`).
    pub return_url: String,
}

/// A [`Provider`] speaking Adyen's Checkout API.
#[derive(Debug)]
pub struct AdyenProvider {
    transport: Transport,
    account: AdyenAccount,
    /// Where the reports are downloaded from, as the report user; `None`: not configured.
    reports: Option<Reports>,
}

/// Why an Adyen adapter could not be built.
#[derive(Debug, thiserror::Error)]
pub enum AdyenInitError {
    #[error("the Adyen API key is not a valid header value")]
    ApiKeyInvalid,
    #[error("the Adyen merchant account is empty")]
    MerchantAccountMissing,
    #[error(transparent)]
    Client(#[from] ClientInitError),
    #[error(transparent)]
    Reports(#[from] ReportsInitError),
}

impl AdyenProvider {
    /// `base_url` is where Adyen's versioned Checkout paths live: `https://checkout-test.adyen.com`,
    /// `https://{PREFIX}-checkout-live.adyenpayments.com/checkout`, or a simulator of the Adyen
    /// dialect. `api_key` is sent as `X-API-Key` and never logged.
    pub fn new(
        name: impl Into<String>,
        base_url: &str,
        api_key: &str,
        account: AdyenAccount,
        config: ClientConfig,
    ) -> Result<AdyenProvider, AdyenInitError> {
        if account.merchant_account.trim().is_empty() {
            return Err(AdyenInitError::MerchantAccountMissing);
        }
        let mut headers = HeaderMap::new();
        let mut key = HeaderValue::from_str(api_key).map_err(|_| AdyenInitError::ApiKeyInvalid)?;
        key.set_sensitive(true);
        headers.insert(API_KEY_HEADER, key);
        Ok(AdyenProvider {
            transport: Transport::new(name, base_url, config, headers)?,
            account,
            reports: None,
        })
    }

    /// Reads the reports at `access` (the report user's own credentials, never the API key),
    /// with the timeouts and retries of the API's calls.
    pub fn with_reports(mut self, access: &ReportsAccess) -> Result<AdyenProvider, AdyenInitError> {
        self.reports = Some(Reports::new(
            self.transport.name(),
            access,
            &self.account.merchant_account,
            self.transport.config().clone(),
        )?);
        Ok(self)
    }

    fn reports(&self, what: &str) -> Result<&Reports, ProviderError> {
        self.reports
            .as_ref()
            .ok_or_else(|| ProviderError::Unsupported {
                what: format!("{what} without access to its reports"),
            })
    }

    async fn post<T: serde::Serialize, A: serde::de::DeserializeOwned>(
        &self,
        segments: &[&str],
        key: &str,
        body: &T,
    ) -> Result<A, ProviderError> {
        let body = serde_json::to_vec(body).map_err(|error| ProviderError::Protocol {
            reason: format!("encoding the request: {error}"),
        })?;
        let mut path = vec![API_VERSION];
        path.extend_from_slice(segments);
        let call = Call::write(self.transport.url(&path), key, Bytes::from(body), JSON);
        self.transport.object(call).await
    }

    fn modification(&self, amount: Option<Amount>, reference: &str) -> ModificationRequest {
        ModificationRequest {
            merchant_account: self.account.merchant_account.clone(),
            amount,
            reference: Some(reference.to_owned()),
            payment_reference: None,
        }
    }

    /// Sends one modification of `payment` and reads its `received` as a pending operation.
    async fn modify(
        &self,
        kind: OperationKind,
        payment: &str,
        amount: Option<Amount>,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        let segment = match kind {
            OperationKind::Capture => "captures",
            OperationKind::Refund => "refunds",
            OperationKind::Cancel => "cancels",
        };
        let body = self.modification(amount.clone(), idempotency_key);
        let answer: ModificationResponse = self
            .post(&["payments", payment, segment], idempotency_key, &body)
            .await?;
        let (amount_minor, currency) = answer
            .amount
            .or(amount)
            .map_or((0, String::new()), |amount| (amount.value, amount.currency));
        tracing::info!(provider = %self.transport.name(), key = idempotency_key, psp_reference = %answer.psp_reference, status = %answer.status, "adyen received a modification");
        Ok(OperationAnswer {
            operation: received(
                kind,
                answer.payment_psp_reference.as_deref().unwrap_or(payment),
                answer.psp_reference,
                idempotency_key,
                amount_minor,
                &currency,
                Utc::now(),
            ),
            charge: None,
            request: None,
        })
    }

    fn unsupported<T>(&self, what: String) -> Result<T, ProviderError> {
        Err(ProviderError::Unsupported { what })
    }
}

/// The `/payments` request for `req`.
pub fn payment_request(req: &CreateCharge, account: &AdyenAccount) -> PaymentRequest {
    let mut additional_data = std::collections::BTreeMap::new();
    if !req.capture {
        additional_data.insert(MANUAL_CAPTURE.to_owned(), "true".to_owned());
    }
    PaymentRequest {
        amount: Amount {
            currency: req.currency.to_ascii_uppercase(),
            value: req.amount_minor,
        },
        merchant_account: account.merchant_account.clone(),
        payment_method: CardDetails {
            kind: Some("scheme".to_owned()),
            stored_payment_method_id: Some(req.payment_method.clone()),
            ..CardDetails::default()
        },
        reference: req
            .reference
            .clone()
            .unwrap_or_else(|| req.idempotency_key.clone()),
        return_url: account.return_url.clone(),
        capture_delay_hours: req.capture.then_some(0),
        additional_data,
        metadata: req.metadata.clone(),
        shopper_reference: req
            .customer
            .clone()
            .filter(|customer| SHOPPER_REFERENCE_CHARS.contains(&customer.chars().count())),
        shopper_interaction: Some("ContAuth".to_owned()),
        recurring_processing_model: Some("CardOnFile".to_owned()),
    }
}

#[async_trait]
impl Provider for AdyenProvider {
    fn name(&self) -> &str {
        self.transport.name()
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// Cancels the authorisation of the payment we sent with `reference` (our payment id), for a
    /// payment whose `/payments` answer was lost: Adyen finds it by our reference (a
    /// TECHNICAL_CANCEL notification tells the outcome).
    async fn cancel_by_reference(
        &self,
        reference: &str,
        idempotency_key: &str,
    ) -> Result<String, ProviderError> {
        let body = ModificationRequest {
            merchant_account: self.account.merchant_account.clone(),
            amount: None,
            reference: Some(idempotency_key.to_owned()),
            payment_reference: Some(reference.to_owned()),
        };
        let answer: ModificationResponse = self.post(&["cancels"], idempotency_key, &body).await?;
        Ok(answer.psp_reference)
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), key = %req.idempotency_key))]
    async fn create_charge(&self, req: &CreateCharge) -> ChargeOutcome {
        let body = payment_request(req, &self.account);
        match self
            .post::<_, PaymentResponse>(&["payments"], &req.idempotency_key, &body)
            .await
        {
            Ok(answer) => payment_outcome(req, &answer, Utc::now()),
            Err(ProviderError::Rejected(rejection)) => ChargeOutcome::Rejected(rejection),
            Err(error) => ChargeOutcome::Unknown {
                reason: error.to_string(),
            },
        }
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), charge_id, key = %idempotency_key))]
    async fn capture(
        &self,
        charge_id: &str,
        amount_minor: Option<i64>,
        currency: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        // Adyen captures the amount it is given; the ledger always names it.
        let Some(value) = amount_minor else {
            return self.unsupported(format!("capture {charge_id} without an amount"));
        };
        let amount = Amount {
            currency: currency.to_ascii_uppercase(),
            value,
        };
        self.modify(
            OperationKind::Capture,
            charge_id,
            Some(amount),
            idempotency_key,
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), charge_id, key = %idempotency_key))]
    async fn refund(
        &self,
        charge_id: &str,
        amount_minor: i64,
        currency: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        let amount = Amount {
            currency: currency.to_ascii_uppercase(),
            value: amount_minor,
        };
        self.modify(
            OperationKind::Refund,
            charge_id,
            Some(amount),
            idempotency_key,
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), charge_id, key = %idempotency_key))]
    async fn cancel(
        &self,
        charge_id: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        self.modify(OperationKind::Cancel, charge_id, None, idempotency_key)
            .await
    }

    async fn get_charge(&self, charge_id: &str) -> Result<Option<Charge>, ProviderError> {
        self.unsupported(format!("read payment {charge_id} (Adyen has no lookup)"))
    }

    async fn find_charge_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Charge>, ProviderError> {
        self.unsupported(format!("find a payment by key {idempotency_key}"))
    }

    async fn find_operation_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Operation>, ProviderError> {
        self.unsupported(format!("find a modification by key {idempotency_key}"))
    }

    async fn get_operation(&self, id: &str) -> Result<Option<Operation>, ProviderError> {
        self.unsupported(format!("read modification {id} (Adyen has no lookup)"))
    }

    async fn settlement_report(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<SettlementReport, ProviderError> {
        self.reports(&format!("report [{from}, {to})"))?
            .settlement_report(from, to)
            .await
    }

    /// A REPORT_AVAILABLE item whose file is a Settlement details report: its batch's payout.
    fn payout_of_event(&self, body: &[u8]) -> Option<String> {
        batch_of_event(body).map(payout_id)
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), payout = %id))]
    async fn get_payout(&self, id: &str) -> Result<Option<Payout>, ProviderError> {
        self.reports(&format!("read payout {id}"))?
            .get_payout(id)
            .await
    }

    async fn payouts_created(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<String>, ProviderError> {
        self.reports(&format!("list the payouts of [{from}, {to})"))?
            .payouts_created(from, to)
            .await
    }

    /// A stored notification item, verified when it was received.
    async fn read_event(&self, body: &[u8]) -> Result<Option<WebhookEvent>, ProviderError> {
        let item: NotificationItem =
            serde_json::from_slice(body).map_err(|error| ProviderError::Protocol {
                reason: format!("the body is not an Adyen notification item: {error}"),
            })?;
        Ok(item_event(&item))
    }
}
