//! Downloading report files as Adyen's report user (basic auth, docs/adyen-wire.md §5) from
//! their predictable URLs, `{base}/reports/download/MerchantAccount/{merchant}/{file}`. A 404
//! means the file is not generated (yet); the caller decides what that means. Settlement batches
//! never change once generated, so they are kept once read (at most [`BATCHES_CACHED_MAX`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use chrono::NaiveDate;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use reqwest::StatusCode;

use super::settlement::{self, SettlementRow};
use crate::adyen::notifications::BasicCredentials;
use crate::adyen::wire::NotificationItem;
use crate::provider::ProviderError;
use crate::transport::{Call, ClientConfig, ClientInitError, Transport};

/// The longest window one settlement report reads, in days (one file per day).
pub const WINDOW_DAYS_MAX: i64 = 62;
/// How many days before a window are read to find the first rows of the payments the window
/// touched; a payment whose history starts earlier is left out of the report.
pub const HISTORY_DAYS_MAX: i64 = 62;
/// Settlement batches kept in memory once read.
pub const BATCHES_CACHED_MAX: usize = 4_096;
/// Batches probed for in one call (each one request), so that a first sweep of an account with
/// many batches spreads over several.
pub const BATCH_PROBES_MAX: u64 = 256;

/// Where the reports are and who may read them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportsAccess {
    /// `https://ca-test.adyen.com` (`https://ca-live.adyen.com` live), or the simulator's base.
    pub base_url: String,
    /// The report service user (`report_…@Company.…`) and its password.
    pub credentials: BasicCredentials,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportsInitError {
    #[error("the report user's credentials are not a valid header value")]
    CredentialsInvalid,
    #[error("the report user is empty")]
    UsernameMissing,
    #[error(transparent)]
    Client(#[from] ClientInitError),
}

/// The daily Payment accounting report's file name.
pub fn accounting_file(day: NaiveDate) -> String {
    format!("payments_accounting_report_{}.csv", day.format("%Y_%m_%d"))
}

/// The Settlement details report's file name of batch `batch`.
pub fn settlement_file(batch: u64) -> String {
    format!("settlement_detail_report_batch_{batch}.csv")
}

/// The port's id of batch `batch`'s payout.
pub fn payout_id(batch: u64) -> String {
    format!("batch_{batch}")
}

/// The batch a payout id names.
pub fn batch_of_payout(id: &str) -> Option<u64> {
    id.strip_prefix("batch_")?.parse().ok()
}

fn batch_of_file(file: &str) -> Option<u64> {
    file.strip_prefix("settlement_detail_report_batch_")?
        .strip_suffix(".csv")?
        .parse()
        .ok()
}

/// The batch a REPORT_AVAILABLE item announces, when its file is a Settlement details report:
/// its `pspReference` is the file name, its `reason` the download URL.
pub fn batch_of_event(body: &[u8]) -> Option<u64> {
    let item: NotificationItem = serde_json::from_slice(body).ok()?;
    if item.event_code != "REPORT_AVAILABLE" {
        return None;
    }
    batch_of_file(&item.psp_reference).or_else(|| {
        let url = item.reason.as_deref()?;
        batch_of_file(url.rsplit('/').next()?)
    })
}

/// The report downloads of one merchant account.
#[derive(Debug)]
pub(crate) struct Reports {
    transport: Transport,
    merchant_account: String,
    batches: Mutex<BTreeMap<u64, Arc<Vec<SettlementRow>>>>,
}

impl Reports {
    pub fn new(
        name: &str,
        access: &ReportsAccess,
        merchant_account: &str,
        config: ClientConfig,
    ) -> Result<Reports, ReportsInitError> {
        if access.credentials.username.trim().is_empty() {
            return Err(ReportsInitError::UsernameMissing);
        }
        let mut headers = HeaderMap::new();
        let mut auth = HeaderValue::from_str(&access.credentials.header_value())
            .map_err(|_| ReportsInitError::CredentialsInvalid)?;
        auth.set_sensitive(true);
        headers.insert(AUTHORIZATION, auth);
        Ok(Reports {
            transport: Transport::new(name, &access.base_url, config, headers)?,
            merchant_account: merchant_account.to_owned(),
            batches: Mutex::new(BTreeMap::new()),
        })
    }

    pub fn name(&self) -> &str {
        self.transport.name()
    }

    /// The file's bytes; `None` when Adyen has not generated it (404).
    #[tracing::instrument(skip(self), fields(provider = %self.transport.name()))]
    pub async fn file(&self, file: &str) -> Result<Option<axum::body::Bytes>, ProviderError> {
        let url = self.transport.url(&[
            "reports",
            "download",
            "MerchantAccount",
            &self.merchant_account,
            file,
        ]);
        match self.transport.call(Call::read(url)).await {
            Ok(answered) => Ok(Some(answered.body)),
            Err(error)
                if error.answered().map(|(status, _)| status) == Some(StatusCode::NOT_FOUND) =>
            {
                Ok(None)
            }
            Err(error) => Err(error.into_provider_error()),
        }
    }

    /// Batch `batch`'s lines; `None` when it is not generated.
    pub async fn batch(
        &self,
        batch: u64,
    ) -> Result<Option<Arc<Vec<SettlementRow>>>, ProviderError> {
        if let Some(rows) = self.cached().get(&batch) {
            return Ok(Some(Arc::clone(rows)));
        }
        let Some(text) = self.file(&settlement_file(batch)).await? else {
            return Ok(None);
        };
        let rows = Arc::new(
            settlement::parse(&text).map_err(|error| ProviderError::Protocol {
                reason: error.to_string(),
            })?,
        );
        let mut cached = self.cached();
        cached.insert(batch, Arc::clone(&rows));
        while cached.len() > BATCHES_CACHED_MAX {
            cached.pop_first();
        }
        Ok(Some(rows))
    }

    /// Every batch generated so far that is still kept, after probing the batches after the
    /// highest one known until one is not generated (batch numbers are sequential per merchant
    /// account and start at 1; Adyen has no listing).
    pub async fn known_batches(
        &self,
    ) -> Result<Vec<(u64, Arc<Vec<SettlementRow>>)>, ProviderError> {
        let start = self
            .cached()
            .last_key_value()
            .map_or(1, |(batch, _)| batch + 1);
        for next in start..start.saturating_add(BATCH_PROBES_MAX) {
            if self.batch(next).await?.is_none() {
                break;
            }
        }
        Ok(self
            .cached()
            .iter()
            .map(|(batch, rows)| (*batch, Arc::clone(rows)))
            .collect())
    }

    fn cached(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Vec<SettlementRow>>>> {
        self.batches.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn file_names_are_adyen_s_and_report_available_names_its_batch() {
        let day = NaiveDate::from_ymd_opt(2026, 7, 1).unwrap();
        assert_eq!(
            accounting_file(day),
            "payments_accounting_report_2026_07_01.csv"
        );
        assert_eq!(settlement_file(12), "settlement_detail_report_batch_12.csv");
        assert_eq!(batch_of_payout(&payout_id(12)), Some(12));
        assert_eq!(batch_of_payout("po_12"), None);
        let item = |psp: &str, code: &str, reason: &str| {
            serde_json::to_vec(&serde_json::json!({
                "pspReference": psp, "merchantAccountCode": "Acme", "merchantReference": "",
                "amount": {"currency": "EUR", "value": 0}, "eventCode": code, "success": "true",
                "eventDate": "2026-07-01T00:00:00+00:00", "reason": reason,
            }))
            .unwrap()
        };
        let url = "https://ca-test.adyen.com/reports/download/MerchantAccount/Acme/settlement_detail_report_batch_7.csv";
        assert_eq!(
            batch_of_event(&item(
                "settlement_detail_report_batch_7.csv",
                "REPORT_AVAILABLE",
                url
            )),
            Some(7)
        );
        assert_eq!(
            batch_of_event(&item("other", "REPORT_AVAILABLE", url)),
            Some(7)
        );
        assert_eq!(
            batch_of_event(&item(
                "payments_accounting_report_2026_07_01.csv",
                "REPORT_AVAILABLE",
                ""
            )),
            None
        );
        assert_eq!(
            batch_of_event(&item(
                "settlement_detail_report_batch_7.csv",
                "AUTHORISATION",
                url
            )),
            None
        );
        assert_eq!(batch_of_event(b"[]"), None);
    }
}
