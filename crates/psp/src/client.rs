//! The HTTP adapter for the simulator's protocol (`sim`): JSON at
//! `/v1/charges`, `/v1/refunds` and `/v1/operations`, with lookups by our
//! key. It sends through [`crate::transport`], which decides what is
//! retried and what is unknown.
//!
//! A lookup the provider cannot do ([`Capabilities::lookup_by_key`] false)
//! is [`ProviderError::Unsupported`] at once, with no network call.

use std::sync::Arc;

use async_trait::async_trait;
use axum::body::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use reqwest::header::HeaderMap;
use reqwest::Url;
use serde::Serialize;

use crate::provider::{
    Capabilities, Charge, ChargeOutcome, CreateCharge, Operation, OperationAnswer, Provider,
    ProviderError, SettlementReport,
};
pub use crate::transport::{
    backoff_ceiling_ms, ClientConfig, ClientInitError, FullJitter, RetrySleeper, TokioSleeper,
    CODE_RESOURCE_MISSING, IDEMPOTENCY_KEY_HEADER,
};
use crate::transport::{Call, Transport};

/// The body of `POST /v1/charges`.
#[derive(Serialize)]
struct CreateChargeBody<'a> {
    amount_minor: i64,
    currency: &'a str,
    payment_method: &'a str,
    capture: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reference: Option<&'a str>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    metadata: &'a std::collections::BTreeMap<String, String>,
}

#[derive(Serialize)]
struct CaptureBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    amount_minor: Option<i64>,
}

/// `{}`: the cancel route takes no parameters.
#[derive(Serialize)]
struct EmptyBody {}

#[derive(Serialize)]
struct RefundBody<'a> {
    charge: &'a str,
    amount_minor: i64,
}

/// A [`Provider`] over HTTP.
#[derive(Debug)]
pub struct HttpProvider {
    transport: Transport,
    capabilities: Capabilities,
}

impl HttpProvider {
    /// `base_url` is where the provider's `/v1` routes live, e.g.
    /// `http://127.0.0.1:8081` or `http://127.0.0.1:8080/sim`.
    pub fn new(
        name: impl Into<String>,
        base_url: &str,
        config: ClientConfig,
    ) -> Result<HttpProvider, ClientInitError> {
        let capabilities = config.capabilities;
        Ok(HttpProvider {
            transport: Transport::new(name, base_url, config, HeaderMap::new())?,
            capabilities,
        })
    }

    /// Waits between retries with `sleeper` instead of tokio's clock.
    pub fn with_sleeper(self, sleeper: Arc<dyn RetrySleeper>) -> HttpProvider {
        HttpProvider {
            transport: self.transport.with_sleeper(sleeper),
            ..self
        }
    }

    /// Makes the jitter replayable.
    pub fn with_jitter_seed(self, seed: u64) -> HttpProvider {
        HttpProvider {
            transport: self.transport.with_jitter_seed(seed),
            ..self
        }
    }

    pub fn config(&self) -> &ClientConfig {
        self.transport.config()
    }

    /// `Err(Unsupported)` when the provider has no lookup by key: asking
    /// would only meet a bare 404, which reads as "no such route", not as
    /// "never received".
    fn check_lookup_by_key(&self, what: &str) -> Result<(), ProviderError> {
        if self.capabilities.lookup_by_key {
            Ok(())
        } else {
            Err(ProviderError::Unsupported {
                what: what.to_string(),
            })
        }
    }

    fn url(&self, segments: &[&str]) -> Url {
        self.transport.url(segments)
    }

    fn write(&self, url: Url, key: &str, body: &impl Serialize) -> Call {
        // Structs of numbers, strings and string maps always serialize.
        let body = serde_json::to_vec(body).expect("request bodies always serialize");
        Call::write(url, key, Bytes::from(body), "application/json")
    }
}

#[async_trait]
impl Provider for HttpProvider {
    fn name(&self) -> &str {
        self.transport.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), key = %req.idempotency_key))]
    async fn create_charge(&self, req: &CreateCharge) -> ChargeOutcome {
        let body = CreateChargeBody {
            amount_minor: req.amount_minor,
            currency: &req.currency,
            payment_method: &req.payment_method,
            capture: req.capture,
            reference: req.reference.as_deref(),
            metadata: &req.metadata,
        };
        let call = self.write(self.url(&["v1", "charges"]), &req.idempotency_key, &body);
        match self.transport.call(call).await {
            Ok(answered) => match serde_json::from_slice::<Charge>(&answered.body) {
                Ok(charge) => ChargeOutcome::from_charge(charge),
                // A 2xx means the provider acted; we just cannot read how.
                Err(e) => ChargeOutcome::Unknown {
                    reason: format!("unreadable charge in a 2xx answer: {e}"),
                },
            },
            Err(error) => match error.rejection() {
                Some(rejection) => ChargeOutcome::Rejected(rejection),
                None => ChargeOutcome::Unknown {
                    reason: error.unknown_reason(),
                },
            },
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
        let url = self.url(&["v1", "charges", charge_id, "capture"]);
        self.transport
            .object(self.write(url, idempotency_key, &CaptureBody { amount_minor }))
            .await
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), charge_id, key = %idempotency_key))]
    async fn refund(
        &self,
        charge_id: &str,
        amount_minor: i64,
        _currency: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        let body = RefundBody {
            charge: charge_id,
            amount_minor,
        };
        self.transport
            .object(self.write(self.url(&["v1", "refunds"]), idempotency_key, &body))
            .await
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), charge_id, key = %idempotency_key))]
    async fn cancel(
        &self,
        charge_id: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        let url = self.url(&["v1", "charges", charge_id, "cancel"]);
        self.transport
            .object(self.write(url, idempotency_key, &EmptyBody {}))
            .await
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), charge_id))]
    async fn get_charge(&self, charge_id: &str) -> Result<Option<Charge>, ProviderError> {
        self.transport
            .lookup(self.url(&["v1", "charges", charge_id]))
            .await
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), key = %idempotency_key))]
    async fn find_charge_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Charge>, ProviderError> {
        self.check_lookup_by_key("look a charge up by idempotency key")?;
        let mut url = self.url(&["v1", "charges"]);
        url.query_pairs_mut()
            .append_pair("idempotency_key", idempotency_key);
        self.transport.lookup(url).await
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), key = %idempotency_key))]
    async fn find_operation_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Operation>, ProviderError> {
        self.check_lookup_by_key("look an operation up by idempotency key")?;
        let mut url = self.url(&["v1", "operations"]);
        url.query_pairs_mut()
            .append_pair("idempotency_key", idempotency_key);
        self.transport.lookup(url).await
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), operation_id = %id))]
    async fn get_operation(&self, id: &str) -> Result<Option<Operation>, ProviderError> {
        self.transport
            .lookup(self.url(&["v1", "operations", id]))
            .await
    }

    #[tracing::instrument(skip_all, fields(provider = %self.transport.name(), %from, %to))]
    async fn settlement_report(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<SettlementReport, ProviderError> {
        let mut url = self.url(&["v1", "settlement_report"]);
        url.query_pairs_mut()
            .append_pair("from", &from.to_rfc3339_opts(SecondsFormat::Nanos, true))
            .append_pair("to", &to.to_rfc3339_opts(SecondsFormat::Nanos, true))
            .append_pair(
                "limit",
                &self.transport.config().report_lines_max.max(1).to_string(),
            );
        self.transport.object(Call::read(url)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_checked_and_joined_with_escaping() {
        let p =
            HttpProvider::new("sim", "http://127.0.0.1:1/sim/", ClientConfig::default()).unwrap();
        assert_eq!(
            p.url(&["v1", "charges", "ch_1/../x", "capture"]).as_str(),
            "http://127.0.0.1:1/sim/v1/charges/ch_1%2F..%2Fx/capture"
        );
        assert!(HttpProvider::new("sim", "mailto:x@y", ClientConfig::default()).is_err());
        assert!(HttpProvider::new("sim", "not a url", ClientConfig::default()).is_err());
        let zero = ClientConfig {
            attempts_max: 0,
            ..ClientConfig::default()
        };
        assert!(matches!(
            HttpProvider::new("sim", "http://x", zero),
            Err(ClientInitError::AttemptsMaxZero)
        ));
    }
}
