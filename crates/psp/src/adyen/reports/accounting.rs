//! Adyen's Payment accounting report (`payments_accounting_report_YYYY_MM_DD.csv`, one per day,
//! docs/adyen-wire.md §5): every status change of every payment, booking-dated. Read by header
//! name into journal rows, then folded in booking order into one settlement-report line per
//! payment, as the payment stands after every row read.
//!
//! A row's amount is its `Main Amount` (the record type says which way it goes), in `Main
//! Currency` (the payment's currency, `Payment Currency`, when that column is given). How each
//! record type moves a payment:
//!
//! | Record Type | effect |
//! |---|---|
//! | Received | the amount asked; not decided yet |
//! | Authorised | authorised for the amount |
//! | Refused, Error | failed |
//! | Cancelled, Expired | failed, unless something was captured (the uncaptured rest is gone) |
//! | SentForSettle | captured += amount |
//! | CaptureFailed | captured −= amount; failed when nothing stays captured |
//! | Refunded | refunded += amount |
//! | RefundFailed, RefundedReversed | refunded −= amount |
//! | NotificationOfChargeback, Chargeback | a dispute, open (a chargeback withdraws the money) |
//! | ChargebackReversed | the dispute won |
//! | SecondChargeback | the dispute lost |
//! | anything else (Settled, SentForRefund, …) | the payment was touched; no change |
//!
//! Each Refunded, RefundFailed and RefundedReversed row is also a movement of the line
//! (`Refund`, `RefundFailure`) named by its `Modification Reference`, the refund's pspReference:
//! with no lookup, that is how the reconciler tells which refund of ours the report decided.
//!
//! A dispute is named by the row's `Modification Reference` (the dispute's pspReference, as its
//! notifications name it) when the file has that column. The report does not say how a
//! chargeback ends short of a reversal or a second chargeback, so a chargeback stays open here;
//! its notification (`disputeStatus`) closes it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::table::Table;
use super::ReportError;
use crate::provider::{ChargeStatus, Dispute, DisputeStatus, Movement, MovementKind, ReportLine};

const REPORT: &str = "payment accounting report";

/// One journal row of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountingRow {
    /// The payment's pspReference (Adyen's `Psp Reference` is the original payment's).
    pub psp_reference: String,
    pub merchant_reference: String,
    pub booked: DateTime<Utc>,
    pub record_type: String,
    pub currency: String,
    /// `Main Amount`, minor units, as signed in the file.
    pub amount_minor: i64,
    pub modification_reference: Option<String>,
}

/// Reads one day's file.
pub fn parse(text: &[u8]) -> Result<Vec<AccountingRow>, ReportError> {
    let table = Table::parse(REPORT, text)?;
    let psp = table.column("Psp Reference")?;
    let merchant_reference = table.column("Merchant Reference")?;
    let booked = table.column("Booking Date")?;
    let zone = table.optional_column("TimeZone");
    let record_type = table.column("Record Type")?;
    let main_currency = table.column("Main Currency")?;
    let main_amount = table.column("Main Amount")?;
    let payment_currency = table.optional_column("Payment Currency");
    let modification = table.optional_column("Modification Reference");
    table
        .rows()
        .map(|row| {
            let currency = row
                .optional_text(payment_currency)
                .unwrap_or_else(|| row.text(main_currency))
                .to_owned();
            Ok(AccountingRow {
                psp_reference: row.required(psp)?.to_owned(),
                merchant_reference: row.text(merchant_reference).to_owned(),
                booked: row.date(booked, zone)?,
                record_type: row.required(record_type)?.to_owned(),
                amount_minor: row.minor(main_amount, &currency)?,
                currency,
                modification_reference: row.optional_text(modification).map(str::to_owned),
            })
        })
        .collect()
}

/// A payment as its rows have left it.
#[derive(Clone, Debug, Default)]
struct Fold {
    reference: String,
    currency: String,
    asked_minor: Option<i64>,
    authorised_minor: Option<i64>,
    captured_minor: i64,
    refunded_minor: i64,
    /// Refused, errored, cancelled or expired.
    ended: bool,
    dispute: Option<Dispute>,
    /// The payment's first row was read (Received, Authorised, Refused or Error).
    opened: bool,
    /// The last row inside the window.
    touched: Option<DateTime<Utc>>,
    /// Each refund row and each refund reversal row, named by the refund's pspReference (its
    /// `Modification Reference`): what tells which refund of ours moved, where nothing can be
    /// looked up.
    movements: Vec<Movement>,
}

/// Whether a record type opens a payment's history (its first row).
pub fn opens(record_type: &str) -> bool {
    matches!(record_type, "Received" | "Authorised" | "Refused" | "Error")
}

impl Fold {
    fn apply(&mut self, row: &AccountingRow) -> Result<(), ReportError> {
        if self.currency.is_empty() {
            self.currency.clone_from(&row.currency);
        } else if self.currency != row.currency {
            return Err(ReportError::Inconsistent {
                report: REPORT,
                why: format!(
                    "payment {} has rows in {} and {}",
                    row.psp_reference, self.currency, row.currency
                ),
            });
        }
        if self.reference.is_empty() {
            self.reference.clone_from(&row.merchant_reference);
        }
        let amount = row.amount_minor.checked_abs().unwrap_or(i64::MAX);
        let overflow = || ReportError::Inconsistent {
            report: REPORT,
            why: format!("payment {}'s amounts overflow", row.psp_reference),
        };
        self.opened |= opens(&row.record_type);
        match row.record_type.as_str() {
            "Received" => {
                self.asked_minor.get_or_insert(amount);
            }
            "Authorised" => self.authorised_minor = Some(amount),
            "Refused" | "Error" => {
                self.ended = true;
                self.asked_minor.get_or_insert(amount);
            }
            "Cancelled" | "Expired" => self.ended = true,
            "SentForSettle" => {
                self.captured_minor = self
                    .captured_minor
                    .checked_add(amount)
                    .ok_or_else(overflow)?
            }
            // The scheme refused the capture: the authorisation it consumed is gone too.
            "CaptureFailed" => {
                self.captured_minor = self
                    .captured_minor
                    .checked_sub(amount)
                    .ok_or_else(overflow)?;
                self.ended = true;
            }
            "Refunded" => {
                self.refunded_minor = self
                    .refunded_minor
                    .checked_add(amount)
                    .ok_or_else(overflow)?;
                self.movement(row, MovementKind::Refund, -amount);
            }
            "RefundFailed" | "RefundedReversed" => {
                self.refunded_minor = self
                    .refunded_minor
                    .checked_sub(amount)
                    .ok_or_else(overflow)?;
                self.movement(row, MovementKind::RefundFailure, amount);
            }
            "NotificationOfChargeback" | "Chargeback" => {
                let dispute = self.dispute.get_or_insert(Dispute {
                    status: DisputeStatus::Open,
                    amount_minor: amount,
                    created: row.booked,
                    closed: None,
                    id: row.modification_reference.clone(),
                    reinstated: false,
                });
                dispute.amount_minor = amount;
            }
            // A second chargeback follows a reversal: the money withdrawn again.
            code @ ("ChargebackReversed" | "SecondChargeback") => {
                let (status, reinstated) = if code == "ChargebackReversed" {
                    (DisputeStatus::Won, false)
                } else {
                    (DisputeStatus::Lost, true)
                };
                self.dispute
                    .get_or_insert(Dispute {
                        status: DisputeStatus::Open,
                        amount_minor: amount,
                        created: row.booked,
                        closed: None,
                        id: row.modification_reference.clone(),
                        reinstated: false,
                    })
                    .advance(status, reinstated, row.booked);
            }
            _ => {}
        }
        Ok(())
    }

    /// A refund's movement of money (signed: out is negative), named by its modification's
    /// pspReference; the report carries no fee on it. Without the column, nothing to name.
    fn movement(&mut self, row: &AccountingRow, kind: MovementKind, amount_minor: i64) {
        let Some(source) = row.modification_reference.clone() else {
            return;
        };
        let id = format!("{source}:{}", row.record_type);
        if self.movements.iter().any(|movement| movement.id == id) {
            // The same row read again (a day's file read twice, overlapping windows).
            return;
        }
        self.movements.push(Movement {
            id,
            kind,
            amount_minor,
            fee_minor: 0,
            net_minor: amount_minor,
            source,
        });
    }

    fn line(self, charge_id: String) -> Option<ReportLine> {
        let touched = self.touched?;
        let amount_minor = self.authorised_minor.or(self.asked_minor)?;
        let status = if self.captured_minor > 0 {
            ChargeStatus::Succeeded
        } else if self.ended {
            ChargeStatus::Failed
        } else if self.authorised_minor.is_some() {
            ChargeStatus::RequiresCapture
        } else {
            // Received and nothing since: not decided yet, nothing to compare.
            return None;
        };
        Some(ReportLine {
            charge_id,
            status,
            amount_minor,
            amount_captured: self.captured_minor.max(0),
            amount_refunded: self.refunded_minor.max(0),
            provider_fees: Vec::new(),
            currency: self.currency,
            reference: (!self.reference.is_empty()).then_some(self.reference),
            // The report does not carry our key; the reference names the payment.
            idempotency_key: String::new(),
            dispute_status: self.dispute.as_ref().map(|dispute| dispute.status),
            dispute: self.dispute,
            movements: self.movements,
            last_touched: touched,
        })
    }
}

/// What folding rows into lines found.
#[derive(Debug, Default)]
pub struct Folded {
    pub lines: Vec<ReportLine>,
    /// Payments touched in the window whose first row was not among the rows read: their
    /// earlier days must be read before they can be told.
    pub unopened: Vec<String>,
}

/// One line per payment with a row booked in `[from, to)`, each folded over every row given
/// (earlier days included, so that a refund today is told with yesterday's capture), in
/// booking order.
pub fn fold(
    rows: &[AccountingRow],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Folded, ReportError> {
    let mut ordered: Vec<&AccountingRow> = rows.iter().collect();
    // Stable: rows booked at the same second keep the file's order.
    ordered.sort_by_key(|row| row.booked);
    let mut payments: BTreeMap<&str, Fold> = BTreeMap::new();
    for row in ordered {
        let fold = payments.entry(row.psp_reference.as_str()).or_default();
        fold.apply(row)?;
        if row.booked >= from && row.booked < to {
            fold.touched = Some(row.booked);
        }
    }
    let mut folded = Folded::default();
    for (psp_reference, fold) in payments {
        if fold.touched.is_none() {
            continue;
        }
        if !fold.opened {
            folded.unopened.push(psp_reference.to_owned());
            continue;
        }
        folded.lines.extend(fold.line(psp_reference.to_owned()));
    }
    Ok(folded)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const HEADER: &str = "Company Account,Merchant Account,Psp Reference,Merchant Reference,Payment Method,Booking Date,TimeZone,Main Currency,Main Amount,Record Type,Payment Currency,Received (PC),Authorised (PC),Captured (PC),Settlement Currency,Payable (SC),Commission (SC),Markup (SC),Scheme Fees (SC),Interchange (SC),Processing Fee Currency,Processing Fee (FC),User Name,Payment Method Variant,Modification Merchant Reference";

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn rows_are_read_by_header_name_whatever_the_order_and_extra_columns() {
        let standard = format!(
            "{HEADER}\nAcme,AcmeEUR,PSP1,pay_1,visa,2026-07-01 10:00:00,CET,EUR,10.50,Authorised,EUR,,10.50,,EUR,,,,,,,,,visa,\n"
        );
        let reordered = "Record Type,Extra Column,Main Amount,Psp Reference,Booking Date,Main Currency,Merchant Reference,TimeZone,New Since 2023\nAuthorised,x,10.50,PSP1,2026-07-01 10:00:00,EUR,pay_1,CET,y\n";
        for text in [standard.as_str(), reordered] {
            let rows = parse(text.as_bytes()).unwrap();
            assert_eq!(
                rows,
                vec![AccountingRow {
                    psp_reference: "PSP1".into(),
                    merchant_reference: "pay_1".into(),
                    booked: at("2026-07-01T09:00:00Z"),
                    record_type: "Authorised".into(),
                    currency: "EUR".into(),
                    amount_minor: 1050,
                    modification_reference: None,
                }]
            );
        }
    }

    #[test]
    fn bad_files_and_rows_are_refused_with_where_and_why() {
        let missing = "Psp Reference,Merchant Reference,Booking Date,Main Currency,Main Amount\n";
        assert!(matches!(
            parse(missing.as_bytes()),
            Err(ReportError::ColumnMissing {
                column: "Record Type",
                ..
            })
        ));
        let head = "Psp Reference,Merchant Reference,Booking Date,TimeZone,Main Currency,Main Amount,Record Type\n";
        for (row, column) in [
            (
                "PSP1,pay_1,2026-07-01 10:00:00,UTC,EUR,10.505,Authorised",
                "Main Amount",
            ),
            (
                "PSP1,pay_1,2026-07-01 10:00:00,UTC,JPY,10.5,Authorised",
                "Main Amount",
            ),
            (
                "PSP1,pay_1,2026-07-01 10:00:00,UTC,EUR,ten,Authorised",
                "Main Amount",
            ),
            ("PSP1,pay_1,yesterday,UTC,EUR,10,Authorised", "Booking Date"),
            (
                "PSP1,pay_1,2026-07-01 10:00:00,Mars/Olympus,EUR,10,Authorised",
                "TimeZone",
            ),
            (
                ",pay_1,2026-07-01 10:00:00,UTC,EUR,10,Authorised",
                "Psp Reference",
            ),
        ] {
            let error = parse(format!("{head}{row}\n").as_bytes()).unwrap_err();
            let (line, named) = match &error {
                ReportError::Amount { line, column, .. }
                | ReportError::ValueInvalid { line, column, .. } => (*line, *column),
                other => panic!("{row}: {other}"),
            };
            assert_eq!((line, named), (2, column), "{row}: {error}");
        }
        let ragged = format!("{head}PSP1,pay_1\n");
        assert!(matches!(
            parse(ragged.as_bytes()),
            Err(ReportError::Csv { .. })
        ));
    }

    fn row(psp: &str, booked: &str, kind: &str, amount: i64) -> AccountingRow {
        AccountingRow {
            psp_reference: psp.into(),
            merchant_reference: format!("ref_{psp}"),
            booked: at(booked),
            record_type: kind.into(),
            currency: "EUR".into(),
            amount_minor: amount,
            modification_reference: kind.contains("hargeback").then(|| "DISPUTE1".into()),
        }
    }

    #[test]
    fn rows_fold_in_booking_order_into_the_payment_as_it_stands() {
        let rows = vec![
            // Out of order in the files: folded by booking date.
            row("PSP1", "2026-07-02T09:00:00Z", "Refunded", -300),
            row("PSP1", "2026-07-01T10:00:00Z", "Authorised", 1000),
            row("PSP1", "2026-07-01T10:05:00Z", "SentForSettle", 1000),
            row("PSP1", "2026-07-02T11:00:00Z", "RefundedReversed", 100),
            row("PSP2", "2026-07-02T12:00:00Z", "Authorised", 500),
            row("PSP3", "2026-07-02T12:00:00Z", "Refused", 700),
            row("PSP4", "2026-07-01T08:00:00Z", "Authorised", 900),
            row("PSP4", "2026-07-01T08:01:00Z", "SentForSettle", 900),
            row("PSP4", "2026-07-02T08:00:00Z", "Chargeback", -900),
            row("PSP4", "2026-07-02T08:00:01Z", "ChargebackReversed", 900),
            // Touched in the window but its first row is on a day not read.
            row("PSP5", "2026-07-02T08:00:00Z", "Refunded", -50),
            // Not touched in the window.
            row("PSP6", "2026-07-01T08:00:00Z", "Authorised", 50),
            row("PSP7", "2026-07-02T08:00:00Z", "Received", 70),
            row("PSP8", "2026-07-02T08:00:00Z", "Authorised", 80),
            row("PSP8", "2026-07-02T09:00:00Z", "Cancelled", 80),
            row("PSP9", "2026-07-02T08:00:00Z", "Authorised", 90),
            row("PSP9", "2026-07-02T08:01:00Z", "SentForSettle", 90),
            row("PSP9", "2026-07-02T10:00:00Z", "CaptureFailed", 90),
        ];
        let folded = fold(
            &rows,
            at("2026-07-02T00:00:00Z"),
            at("2026-07-03T00:00:00Z"),
        )
        .unwrap();
        assert_eq!(folded.unopened, vec!["PSP5".to_owned()]);
        let got: Vec<_> = folded
            .lines
            .iter()
            .map(|line| {
                (
                    line.charge_id.as_str(),
                    line.status,
                    line.amount_minor,
                    line.amount_captured,
                    line.amount_refunded,
                    line.dispute_status,
                )
            })
            .collect();
        use ChargeStatus as S;
        assert_eq!(
            got,
            vec![
                ("PSP1", S::Succeeded, 1000, 1000, 200, None),
                ("PSP2", S::RequiresCapture, 500, 0, 0, None),
                ("PSP3", S::Failed, 700, 0, 0, None),
                ("PSP4", S::Succeeded, 900, 900, 0, Some(DisputeStatus::Won)),
                ("PSP8", S::Failed, 80, 0, 0, None),
                ("PSP9", S::Failed, 90, 0, 0, None),
            ]
        );
        let psp1 = &folded.lines[0];
        assert_eq!(psp1.reference.as_deref(), Some("ref_PSP1"));
        assert_eq!(psp1.idempotency_key, "");
        assert_eq!(psp1.last_touched, at("2026-07-02T11:00:00Z"));
        let dispute = folded.lines[3].dispute.clone().unwrap();
        assert_eq!(dispute.id.as_deref(), Some("DISPUTE1"));
        assert_eq!(dispute.closed, Some(at("2026-07-02T08:00:01Z")));
    }

    #[test]
    fn refund_rows_are_movements_named_by_the_refund() {
        let named = |kind: &str, amount: i64, refund: &str| AccountingRow {
            modification_reference: Some(refund.into()),
            ..row("PSP1", "2026-07-02T09:00:00Z", kind, amount)
        };
        let rows = vec![
            row("PSP1", "2026-07-02T08:00:00Z", "Authorised", 1000),
            row("PSP1", "2026-07-02T08:00:01Z", "SentForSettle", 1000),
            named("Refunded", -300, "REFUND1"),
            named("Refunded", -200, "REFUND2"),
            named("RefundedReversed", 300, "REFUND1"),
            // Without the column, nothing names the refund.
            row("PSP1", "2026-07-02T10:00:00Z", "Refunded", -100),
        ];
        let folded = fold(
            &rows,
            at("2026-07-02T00:00:00Z"),
            at("2026-07-03T00:00:00Z"),
        )
        .unwrap();
        let line = &folded.lines[0];
        assert_eq!(line.amount_refunded, 300);
        let got: Vec<_> = line
            .movements
            .iter()
            .map(|m| (m.source.as_str(), m.kind, m.amount_minor, m.net_minor))
            .collect();
        assert_eq!(
            got,
            vec![
                ("REFUND1", MovementKind::Refund, -300, -300),
                ("REFUND2", MovementKind::Refund, -200, -200),
                ("REFUND1", MovementKind::RefundFailure, 300, 300),
            ]
        );
    }
}
