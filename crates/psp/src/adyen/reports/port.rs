//! The port's reconciliation calls over Adyen's reports: the settlement report of a window from
//! the Payment accounting reports of the days it touches, and payouts from the Settlement
//! details batches.
//!
//! - A window's day whose file is not generated yet (404) ends the report where that day begins,
//!   so the reconciler takes the window as compared only that far and asks for the rest later;
//!   it is never read as "no payments". When even the first day is missing, the report is
//!   unknown.
//! - A payment touched in the window is told as it stands, so the days before the window are
//!   read back (at most [`HISTORY_DAYS_MAX`], stopping at a day with no file: none older exists)
//!   until every such payment's first row is found.
//! - Adyen lists no batches and notifies each one (`REPORT_AVAILABLE`); the batches of a window
//!   are found by probing the batch numbers after the highest one known, which are sequential,
//!   until one is not generated, and keeping those whose `MerchantPayout` line was created in
//!   the window.

use chrono::{DateTime, Duration, NaiveDate, NaiveTime, Utc};

use super::accounting::{self, AccountingRow};
use super::download::{accounting_file, batch_of_payout, payout_id, Reports};
use super::settlement::{self, SettlementRow};
use super::{HISTORY_DAYS_MAX, WINDOW_DAYS_MAX};
use crate::payout::Payout;
use crate::provider::{ProviderError, SettlementReport};

fn protocol(error: super::ReportError) -> ProviderError {
    ProviderError::Protocol {
        reason: error.to_string(),
    }
}

impl Reports {
    async fn day(&self, day: NaiveDate) -> Result<Option<Vec<AccountingRow>>, ProviderError> {
        match self.file(&accounting_file(day)).await? {
            Some(text) => accounting::parse(&text).map(Some).map_err(protocol),
            None => Ok(None),
        }
    }

    /// The report of `[from, to)` as far as Adyen has made it: the days read in order up to the
    /// first one whose file is not generated yet (today's, normally), the window ending where
    /// that day begins.
    pub async fn settlement_report(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<SettlementReport, ProviderError> {
        if from >= to {
            return Ok(SettlementReport {
                from,
                to,
                data: Vec::new(),
            });
        }
        let first = from.date_naive();
        let last = (to - Duration::nanoseconds(1)).date_naive();
        if (last - first).num_days() >= WINDOW_DAYS_MAX {
            return Err(ProviderError::Unsupported {
                what: format!("report more than {WINDOW_DAYS_MAX} days at once"),
            });
        }
        let mut rows = Vec::new();
        let mut covered = to;
        let mut day = first;
        while day <= last {
            let Some(read) = self.day(day).await? else {
                if day == first {
                    return Err(ProviderError::Unknown {
                        reason: format!("Adyen has not generated {} yet", accounting_file(day)),
                    });
                }
                covered = day.and_time(NaiveTime::MIN).and_utc();
                break;
            };
            rows.extend(read);
            match day.succ_opt() {
                Some(next) => day = next,
                None => break,
            }
        }
        let to = covered;
        let mut folded = accounting::fold(&rows, from, to).map_err(protocol)?;
        let mut earlier = first;
        let mut read_back = 0;
        while !folded.unopened.is_empty() && read_back < HISTORY_DAYS_MAX {
            let Some(day) = earlier.pred_opt() else {
                break;
            };
            earlier = day;
            read_back += 1;
            let Some(read) = self.day(day).await? else {
                break;
            };
            rows.extend(read);
            folded = accounting::fold(&rows, from, to).map_err(protocol)?;
        }
        if !folded.unopened.is_empty() {
            tracing::warn!(provider = %self.name(), payments = ?folded.unopened, "payments touched in the window began before the reports read; left out of the report");
        }
        Ok(SettlementReport {
            from,
            to,
            data: folded.lines,
        })
    }

    pub async fn payouts_created(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<String>, ProviderError> {
        Ok(self
            .known_batches()
            .await?
            .into_iter()
            .filter(|(_, rows)| {
                settlement::created_of(rows).is_some_and(|created| created >= from && created < to)
            })
            .map(|(batch, _)| payout_id(batch))
            .collect())
    }

    pub async fn get_payout(&self, id: &str) -> Result<Option<Payout>, ProviderError> {
        let Some(batch) = batch_of_payout(id) else {
            return Ok(None);
        };
        // Announced or listed, so generated: a 404 is a file not served yet, asked again later.
        let Some(rows) = self.batch(batch).await? else {
            return Err(ProviderError::Unknown {
                reason: format!("Adyen does not serve batch {batch}'s report yet"),
            });
        };
        let mut payout = settlement::payout_of(id, batch, &rows).map_err(protocol)?;
        let mut wanted: Vec<&str> = rows
            .iter()
            .filter_map(|row| row.psp_reference.as_deref())
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        // Every earlier batch kept, so that a refund in this batch is told with its capture.
        let first = batch
            .saturating_sub(super::BATCHES_CACHED_MAX as u64 - 1)
            .max(1);
        let mut batches: Vec<std::sync::Arc<Vec<SettlementRow>>> = Vec::new();
        for earlier in first..batch {
            if let Some(rows) = self.batch(earlier).await? {
                batches.push(rows);
            }
        }
        batches.push(rows.clone());
        payout.charges =
            settlement::charges_of(batches.iter().map(|rows| rows.as_slice()), &wanted);
        Ok(Some(payout))
    }
}
