//! The Adyen dialect's reports (docs/adyen-wire.md §5): a journal of every notification item
//! the dialect sends that changes a payment, booking-dated, from which it renders the daily
//! Payment accounting report and closes Settlement details batches, served as Adyen serves them
//! at `GET /reports/download/MerchantAccount/{merchant}/{file}` behind the report user's basic
//! auth (401 otherwise; 404 for a file not generated).
//!
//! When a file is generated is deterministic and in the test's hands:
//! - a day's Payment accounting report exists once the day is over (UTC), or once
//!   `POST /sim/reports/accounting` (`{"through": "YYYY-MM-DD"}`, today by default) closed it;
//!   a closed day keeps showing rows booked on it later (a real file is frozen; the dialect's
//!   grows, which no reader can tell from a frozen one read later);
//! - `POST /sim/reports/settlement` closes one batch per merchant account and currency with
//!   every movement of money not in a batch yet: `Settled` for a capture, `Refunded`,
//!   `RefundedReversed`, `Chargeback`, `ChargebackReversed`, `SecondChargeback`, then the
//!   `MerchantPayout` line paying the batch's net out. Batches are numbered from 1 per merchant
//!   account and never change.
//!
//! Each generated file is announced by a REPORT_AVAILABLE item (file name as `pspReference`,
//! download URL as `reason`), signed like every other item.
//!
//! The fee schedule, on each `Settled` line only, each part rounded half-up on its own: a
//! commission of 10 minor units, a markup of 0.20 %, scheme fees of 0.10 % and interchange of
//! 0.80 % of the gross. A capture that fails after it was settled is not in any batch (Adyen
//! would book a correction).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use axum::body::Bytes;
use chrono::{DateTime, NaiveDate, Utc};

use super::book::AdyenBook;
use crate::state::Outgoing;
use asiento_psp::adyen::reports::{accounting_file, major_units, settlement_file};
use asiento_psp::adyen::wire::{Amount, NotificationItem, CAPTURE_DELAY_HOURS};

/// The fee schedule of `Settled` lines.
pub const COMMISSION_MINOR: i64 = 10;
pub const MARKUP_BPS: i64 = 20;
pub const SCHEME_FEES_BPS: i64 = 10;
pub const INTERCHANGE_BPS: i64 = 80;

/// The Payment accounting report's columns, as Adyen's documentation lists them, and the
/// modification's pspReference the dialect adds (a reader ignores columns it does not know).
const ACCOUNTING_COLUMNS: &[&str] = &[
    "Company Account",
    "Merchant Account",
    "Psp Reference",
    "Merchant Reference",
    "Payment Method",
    "Booking Date",
    "TimeZone",
    "Main Currency",
    "Main Amount",
    "Record Type",
    "Payment Currency",
    "Received (PC)",
    "Authorised (PC)",
    "Captured (PC)",
    "Settlement Currency",
    "Payable (SC)",
    "Commission (SC)",
    "Markup (SC)",
    "Scheme Fees (SC)",
    "Interchange (SC)",
    "Processing Fee Currency",
    "Processing Fee (FC)",
    "User Name",
    "Payment Method Variant",
    "Modification Merchant Reference",
    "Modification Reference",
];

const SETTLEMENT_COLUMNS: &[&str] = &[
    "Company Account",
    "Merchant Account",
    "Psp Reference",
    "Merchant Reference",
    "Payment Method",
    "Creation Date",
    "TimeZone",
    "Type",
    "Modification Reference",
    "Gross Currency",
    "Gross Debit (GC)",
    "Gross Credit (GC)",
    "Exchange Rate",
    "Net Currency",
    "Net Debit (NC)",
    "Net Credit (NC)",
    "Commission (NC)",
    "Markup (NC)",
    "Scheme Fees (NC)",
    "Interchange (NC)",
    "Payment Method Variant",
    "Modification Merchant Reference",
    "Batch Number",
];

const COMPANY: &str = "AsientoSimulatorCompany";
const PAYMENT_METHOD: &str = super::notifications::PAYMENT_METHOD;

/// One booked change of a payment.
#[derive(Clone, Debug)]
struct JournalRow {
    booked: DateTime<Utc>,
    merchant_account: String,
    psp_reference: String,
    merchant_reference: String,
    record_type: &'static str,
    amount: Amount,
    modification_reference: String,
    modification_merchant_reference: String,
    /// The batch that settled it, for a movement of money.
    batched: bool,
}

/// The journal and the batches made of it.
#[derive(Default)]
pub(crate) struct ReportBook {
    journal: Vec<JournalRow>,
    closed_through: Option<NaiveDate>,
    /// `(merchant account, batch)` → the file.
    batches: BTreeMap<(String, u64), Bytes>,
    next_batch: HashMap<String, u64>,
}

/// The record types an item books, in order.
fn record_types(item: &NotificationItem) -> Vec<&'static str> {
    let success = item.succeeded();
    match (item.event_code.as_str(), success) {
        ("AUTHORISATION", true) => {
            let automatic = item
                .additional_data
                .get(CAPTURE_DELAY_HOURS)
                .is_some_and(|hours| hours.trim() == "0");
            if automatic {
                vec!["Authorised", "SentForSettle"]
            } else {
                vec!["Authorised"]
            }
        }
        ("AUTHORISATION", false) => vec!["Refused"],
        ("CAPTURE", true) => vec!["SentForSettle"],
        ("CAPTURE_FAILED", true) => vec!["CaptureFailed"],
        ("REFUND", true) => vec!["Refunded"],
        ("REFUND_FAILED", true) => vec!["RefundFailed"],
        ("REFUNDED_REVERSED", true) => vec!["RefundedReversed"],
        ("CANCELLATION" | "TECHNICAL_CANCEL", true) => vec!["Cancelled"],
        ("NOTIFICATION_OF_CHARGEBACK", _) => vec!["NotificationOfChargeback"],
        ("CHARGEBACK", _) => vec!["Chargeback"],
        ("CHARGEBACK_REVERSED", _) => vec!["ChargebackReversed"],
        ("SECOND_CHARGEBACK", _) => vec!["SecondChargeback"],
        _ => Vec::new(),
    }
}

/// The Settlement details type of a booked record type, for those that move money.
fn settlement_type(record_type: &str) -> Option<&'static str> {
    match record_type {
        "SentForSettle" => Some("Settled"),
        "Refunded" => Some("Refunded"),
        "RefundFailed" | "RefundedReversed" => Some("RefundedReversed"),
        "Chargeback" => Some("Chargeback"),
        "ChargebackReversed" => Some("ChargebackReversed"),
        "SecondChargeback" => Some("SecondChargeback"),
        _ => None,
    }
}

/// Whether money comes in (a credit) for the merchant.
fn is_credit(kind: &str) -> bool {
    matches!(kind, "Settled" | "RefundedReversed" | "ChargebackReversed")
}

/// Books every item of `outgoing` that changes a payment.
pub(crate) fn journal(book: &mut AdyenBook, outgoing: &[Outgoing]) {
    for outgoing in outgoing {
        let Ok(item) = serde_json::from_slice::<NotificationItem>(&outgoing.body) else {
            continue;
        };
        // An item without `originalReference` names the payment by its own pspReference (an
        // AUTHORISATION), or is a dispute's named by the dispute's.
        let payment = match &item.original_reference {
            Some(payment) => payment.clone(),
            None => book
                .payment_of_dispute(&item.psp_reference)
                .unwrap_or(&item.psp_reference)
                .to_owned(),
        };
        let Some(record) = book.payment(&payment) else {
            continue;
        };
        let merchant_reference = record.reference.clone();
        let booked = DateTime::parse_from_rfc3339(&item.event_date)
            .map(|date| date.with_timezone(&Utc))
            .unwrap_or_else(|_| Utc::now());
        for record_type in record_types(&item) {
            book.reports.journal.push(JournalRow {
                booked,
                merchant_account: item.merchant_account_code.clone(),
                psp_reference: payment.clone(),
                merchant_reference: merchant_reference.clone(),
                record_type,
                amount: item.amount.clone(),
                modification_reference: item.psp_reference.clone(),
                modification_merchant_reference: item.merchant_reference.clone(),
                batched: false,
            });
        }
    }
}

fn money(minor: i64, currency: &str) -> String {
    major_units(minor, currency).unwrap_or_default()
}

fn booking_date(date: DateTime<Utc>) -> String {
    date.format("%Y-%m-%d %H:%M:%S").to_string()
}

fn write_csv(columns: &[&str], rows: Vec<Vec<String>>) -> Bytes {
    let mut writer = csv::Writer::from_writer(Vec::new());
    let _ = writer.write_record(columns);
    for row in rows {
        let _ = writer.write_record(&row);
    }
    Bytes::from(writer.into_inner().unwrap_or_default())
}

/// `amount × bps / 10000`, half-up.
fn bps_of(amount: i64, bps: i64) -> i64 {
    (amount.saturating_mul(bps).saturating_add(5_000)) / 10_000
}

/// A file a close generated, to announce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Generated {
    pub merchant_account: String,
    pub file: String,
}

impl ReportBook {
    fn merchants(&self) -> BTreeSet<&str> {
        self.journal
            .iter()
            .map(|row| row.merchant_account.as_str())
            .collect()
    }

    fn available(&self, day: NaiveDate, now: DateTime<Utc>) -> bool {
        day < now.date_naive() || self.closed_through.is_some_and(|closed| day <= closed)
    }

    /// Closes every day through `through`; the files newly available.
    pub fn close_days(&mut self, through: NaiveDate) -> Vec<Generated> {
        let start = match self.closed_through {
            Some(closed) => closed.succ_opt(),
            None => self.journal.iter().map(|row| row.booked.date_naive()).min(),
        };
        let mut generated = Vec::new();
        if let Some(mut day) = start {
            while day <= through {
                // Each day is announced once, when it is first closed.
                {
                    for merchant in self.merchants() {
                        generated.push(Generated {
                            merchant_account: merchant.to_owned(),
                            file: accounting_file(day),
                        });
                    }
                }
                match day.succ_opt() {
                    Some(next) => day = next,
                    None => break,
                }
            }
        }
        self.closed_through = self.closed_through.max(Some(through));
        generated
    }

    /// One batch per merchant account and currency with unbatched money.
    pub fn settle(&mut self, now: DateTime<Utc>) -> Vec<Generated> {
        let mut groups: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
        for (index, row) in self.journal.iter().enumerate() {
            if !row.batched && settlement_type(row.record_type).is_some() {
                groups
                    .entry((row.merchant_account.clone(), row.amount.currency.clone()))
                    .or_default()
                    .push(index);
            }
        }
        let mut generated = Vec::new();
        for ((merchant, currency), indexes) in groups {
            let next = self.next_batch.entry(merchant.clone()).or_insert(1);
            let batch = *next;
            *next += 1;
            let mut lines = Vec::with_capacity(indexes.len() + 1);
            let mut net_sum: i64 = 0;
            for index in indexes {
                let row = &mut self.journal[index];
                row.batched = true;
                let Some(kind) = settlement_type(row.record_type) else {
                    continue;
                };
                let gross = row.amount.value.saturating_abs();
                let (commission, markup, scheme, interchange) = if kind == "Settled" {
                    (
                        COMMISSION_MINOR.min(gross),
                        bps_of(gross, MARKUP_BPS),
                        bps_of(gross, SCHEME_FEES_BPS),
                        bps_of(gross, INTERCHANGE_BPS),
                    )
                } else {
                    (0, 0, 0, 0)
                };
                let fees = commission + markup + scheme + interchange;
                let (gross_debit, gross_credit, net_debit, net_credit, net) = if is_credit(kind) {
                    let net = gross - fees;
                    (
                        String::new(),
                        money(gross, &currency),
                        String::new(),
                        money(net, &currency),
                        net,
                    )
                } else {
                    let net = gross + fees;
                    (
                        money(gross, &currency),
                        String::new(),
                        money(net, &currency),
                        String::new(),
                        -net,
                    )
                };
                net_sum = net_sum.saturating_add(net);
                let fee = |minor: i64| {
                    if minor == 0 {
                        String::new()
                    } else {
                        money(minor, &currency)
                    }
                };
                lines.push(vec![
                    COMPANY.to_owned(),
                    merchant.clone(),
                    row.psp_reference.clone(),
                    row.merchant_reference.clone(),
                    PAYMENT_METHOD.to_owned(),
                    booking_date(row.booked),
                    "UTC".to_owned(),
                    kind.to_owned(),
                    row.modification_reference.clone(),
                    currency.clone(),
                    gross_debit,
                    gross_credit,
                    "1".to_owned(),
                    currency.clone(),
                    net_debit,
                    net_credit,
                    fee(commission),
                    fee(markup),
                    fee(scheme),
                    fee(interchange),
                    PAYMENT_METHOD.to_owned(),
                    row.modification_merchant_reference.clone(),
                    batch.to_string(),
                ]);
            }
            let (payout_debit, payout_credit) = if net_sum >= 0 {
                (money(net_sum, &currency), String::new())
            } else {
                (String::new(), money(-net_sum, &currency))
            };
            lines.push(vec![
                COMPANY.to_owned(),
                merchant.clone(),
                String::new(),
                String::new(),
                String::new(),
                booking_date(now),
                "UTC".to_owned(),
                "MerchantPayout".to_owned(),
                String::new(),
                currency.clone(),
                String::new(),
                String::new(),
                "1".to_owned(),
                currency.clone(),
                payout_debit,
                payout_credit,
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                batch.to_string(),
            ]);
            self.batches.insert(
                (merchant.clone(), batch),
                write_csv(SETTLEMENT_COLUMNS, lines),
            );
            generated.push(Generated {
                merchant_account: merchant,
                file: settlement_file(batch),
            });
        }
        generated
    }

    /// The payments (pspReferences) the journal has booked.
    pub fn booked_payments(&self) -> BTreeSet<String> {
        self.journal
            .iter()
            .map(|row| row.psp_reference.clone())
            .collect()
    }

    /// Payment `psp_reference` stands at `amount_minor` in the charge model (the simulator's
    /// `POST /sim/charges/{id}/amount`: an amount Adyen holds other than the one asked): its
    /// Received and Authorised rows say that amount, as Adyen's files would, and so does a
    /// capture of the whole amount it had; a partial capture keeps its own.
    pub fn restate_amount(&mut self, psp_reference: &str, amount_minor: i64) {
        let authorised = self
            .journal
            .iter()
            .find(|row| row.psp_reference == psp_reference && row.record_type == "Authorised")
            .map(|row| row.amount.value);
        for row in &mut self.journal {
            if row.psp_reference != psp_reference {
                continue;
            }
            let whole = match row.record_type {
                "Received" | "Authorised" => true,
                "SentForSettle" => authorised == Some(row.amount.value),
                _ => false,
            };
            if whole {
                row.amount.value = amount_minor;
            }
        }
    }

    /// The file `file` of `merchant`, when it is generated.
    pub fn file(&self, merchant: &str, file: &str, now: DateTime<Utc>) -> Option<Bytes> {
        if let Some(batch) = file
            .strip_prefix("settlement_detail_report_batch_")
            .and_then(|rest| rest.strip_suffix(".csv"))
        {
            let batch: u64 = batch.parse().ok()?;
            return self.batches.get(&(merchant.to_owned(), batch)).cloned();
        }
        let day = file
            .strip_prefix("payments_accounting_report_")
            .and_then(|rest| rest.strip_suffix(".csv"))?;
        let day = NaiveDate::parse_from_str(day, "%Y_%m_%d").ok()?;
        if !self.available(day, now) {
            return None;
        }
        let rows = self
            .journal
            .iter()
            .filter(|row| row.merchant_account == merchant && row.booked.date_naive() == day)
            .map(|row| {
                let currency = row.amount.currency.clone();
                let amount = money(row.amount.value, &currency);
                let column = |kind: &str| {
                    if row.record_type == kind {
                        amount.clone()
                    } else {
                        String::new()
                    }
                };
                vec![
                    COMPANY.to_owned(),
                    row.merchant_account.clone(),
                    row.psp_reference.clone(),
                    row.merchant_reference.clone(),
                    PAYMENT_METHOD.to_owned(),
                    booking_date(row.booked),
                    "UTC".to_owned(),
                    currency.clone(),
                    amount.clone(),
                    row.record_type.to_owned(),
                    currency.clone(),
                    column("Received"),
                    column("Authorised"),
                    column("SentForSettle"),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    PAYMENT_METHOD.to_owned(),
                    row.modification_merchant_reference.clone(),
                    row.modification_reference.clone(),
                ]
            })
            .collect();
        Some(write_csv(ACCOUNTING_COLUMNS, rows))
    }
}
