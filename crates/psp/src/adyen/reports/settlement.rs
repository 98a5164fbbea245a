//! Adyen's Settlement details report (`settlement_detail_report_batch_N.csv`, one per payout
//! batch, docs/adyen-wire.md §5): every movement of money a batch settled, with the fees Adyen
//! kept on it, and the `MerchantPayout` line that sends the batch's balance to the bank. A batch
//! reads as a paid payout ([`payout_of`]): one transaction per line (its net, the payment its
//! `Psp Reference` names), and each payment as the batches read so far leave it
//! ([`charges_of`]): captured, refunded, disputed, and the fees per line (`Commission`,
//! `Markup`, `Scheme Fees`, `Interchange`, named by the line's `Modification Reference`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::table::Table;
use super::ReportError;
use crate::payout::{Payout, PayoutStatus, PayoutTransaction};
use crate::provider::{Charge, ChargeStatus, Dispute, DisputeStatus, ProviderFee};

const REPORT: &str = "settlement details report";
/// The line that pays the batch out.
pub const MERCHANT_PAYOUT: &str = "MerchantPayout";

/// One line of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettlementRow {
    /// The payment's pspReference; `None` for a line of no payment (a fee on the account, the
    /// payout itself).
    pub psp_reference: Option<String>,
    pub merchant_reference: String,
    pub payment_method: String,
    pub created: DateTime<Utc>,
    pub kind: String,
    /// The modification's pspReference (the capture, the refund, the dispute).
    pub modification_reference: Option<String>,
    pub gross_currency: String,
    /// `Gross Credit − Gross Debit`, minor units.
    pub gross_minor: i64,
    pub net_currency: String,
    /// `Net Credit − Net Debit`, minor units.
    pub net_minor: i64,
    /// Commission + Markup + Scheme Fees + Interchange, minor units of the net currency.
    pub fee_minor: i64,
    pub batch: u64,
}

/// Reads one batch's file.
pub fn parse(text: &[u8]) -> Result<Vec<SettlementRow>, ReportError> {
    let table = Table::parse(REPORT, text)?;
    let psp = table.column("Psp Reference")?;
    let merchant_reference = table.column("Merchant Reference")?;
    let payment_method = table.optional_column("Payment Method");
    let created = table.column("Creation Date")?;
    let zone = table.optional_column("TimeZone");
    let kind = table.column("Type")?;
    let modification = table.column("Modification Reference")?;
    let gross_currency = table.column("Gross Currency")?;
    let gross_debit = table.column("Gross Debit (GC)")?;
    let gross_credit = table.column("Gross Credit (GC)")?;
    let net_currency = table.column("Net Currency")?;
    let net_debit = table.column("Net Debit (NC)")?;
    let net_credit = table.column("Net Credit (NC)")?;
    let fees = [
        table.column("Commission (NC)")?,
        table.column("Markup (NC)")?,
        table.column("Scheme Fees (NC)")?,
        table.column("Interchange (NC)")?,
    ];
    let batch = table.column("Batch Number")?;
    table
        .rows()
        .map(|row| {
            let overflow = |what: &str| ReportError::ValueInvalid {
                report: REPORT,
                line: row.line,
                column: "Net Credit (NC)",
                why: format!("the line's {what} overflows"),
            };
            let gross = row.text(gross_currency).to_owned();
            let net = row.required(net_currency)?.to_owned();
            let gross_minor = row
                .minor(gross_credit, &gross)?
                .checked_sub(row.minor(gross_debit, &gross)?)
                .ok_or_else(|| overflow("gross"))?;
            let net_minor = row
                .minor(net_credit, &net)?
                .checked_sub(row.minor(net_debit, &net)?)
                .ok_or_else(|| overflow("net"))?;
            let mut fee_minor: i64 = 0;
            for column in fees {
                fee_minor = fee_minor
                    .checked_add(row.minor(column, &net)?)
                    .ok_or_else(|| overflow("fee"))?;
            }
            let batch_text = row.required(batch)?;
            Ok(SettlementRow {
                psp_reference: row.optional_text(Some(psp)).map(str::to_owned),
                merchant_reference: row.text(merchant_reference).to_owned(),
                payment_method: row
                    .optional_text(payment_method)
                    .unwrap_or_default()
                    .to_owned(),
                created: row.date(created, zone)?,
                kind: row.required(kind)?.to_owned(),
                modification_reference: row.optional_text(Some(modification)).map(str::to_owned),
                gross_currency: gross,
                gross_minor,
                net_currency: net,
                net_minor,
                fee_minor,
                batch: batch_text.parse().map_err(|_| {
                    row.invalid(batch, format!("{batch_text:?} is not a batch number"))
                })?,
            })
        })
        .collect()
}

/// When the batch was made: its `MerchantPayout` line's creation date (the latest line's when
/// it has none).
pub fn created_of(rows: &[SettlementRow]) -> Option<DateTime<Utc>> {
    rows.iter()
        .find(|row| row.kind == MERCHANT_PAYOUT)
        .or_else(|| rows.iter().max_by_key(|row| row.created))
        .map(|row| row.created)
}

/// Batch `batch` as a paid payout named `id`, without its charges. The payout's amount is what
/// its `MerchantPayout` line sends to the bank; a batch without one has paid nothing out yet
/// and reads as pending.
pub fn payout_of(id: &str, batch: u64, rows: &[SettlementRow]) -> Result<Payout, ReportError> {
    let inconsistent = |why: String| ReportError::Inconsistent {
        report: REPORT,
        why: format!("batch {batch}: {why}"),
    };
    let payout_line = rows.iter().find(|row| row.kind == MERCHANT_PAYOUT);
    let currency = payout_line
        .or_else(|| rows.first())
        .map(|row| row.net_currency.clone())
        .ok_or_else(|| inconsistent("the file has no line".to_owned()))?;
    let mut transactions = Vec::with_capacity(rows.len());
    let mut sum: i64 = 0;
    for (index, row) in rows.iter().enumerate() {
        if row.batch != batch {
            return Err(inconsistent(format!("a line of batch {}", row.batch)));
        }
        if row.net_currency != currency {
            return Err(inconsistent(format!(
                "lines in {currency} and {}",
                row.net_currency
            )));
        }
        if row.kind == MERCHANT_PAYOUT {
            continue;
        }
        sum = sum
            .checked_add(row.net_minor)
            .ok_or_else(|| inconsistent("its net overflows".to_owned()))?;
        transactions.push(PayoutTransaction {
            id: row
                .modification_reference
                .clone()
                .unwrap_or_else(|| format!("batch_{batch}_line_{}", index + 2)),
            kind: row.kind.clone(),
            net_minor: row.net_minor,
            charge_id: row.psp_reference.clone(),
        });
    }
    let created = created_of(rows).unwrap_or_default();
    let Some(payout_line) = payout_line else {
        return Ok(Payout {
            id: id.to_owned(),
            status: PayoutStatus::Pending,
            amount_minor: sum,
            currency,
            created,
            failure_code: None,
            transactions: Vec::new(),
            charges: Vec::new(),
        });
    };
    let amount_minor = payout_line.net_minor.checked_neg().unwrap_or(i64::MAX);
    if amount_minor != sum {
        return Err(inconsistent(format!(
            "its MerchantPayout pays out {amount_minor} but its lines net {sum}"
        )));
    }
    Ok(Payout {
        id: id.to_owned(),
        status: PayoutStatus::Paid,
        amount_minor,
        currency,
        created,
        failure_code: None,
        transactions,
        charges: Vec::new(),
    })
}

/// Each payment `wanted` names, as the lines of every batch given (in batch order) leave it:
/// captured (`Settled`), refunded (`Refunded` less `RefundedReversed`), disputed (`Chargeback`
/// open, `ChargebackReversed` won, `SecondChargeback` lost) and the fee of each line. The report
/// does not carry the authorised amount, so a charge's amount is what it captured; a payment
/// with nothing captured in the batches read is left out (its lines are then no payment's).
pub fn charges_of<'a>(
    batches: impl IntoIterator<Item = &'a [SettlementRow]>,
    wanted: &[&str],
) -> Vec<Charge> {
    let mut charges: BTreeMap<&str, Charge> = BTreeMap::new();
    for rows in batches {
        for row in rows {
            let Some(psp) = row.psp_reference.as_deref() else {
                continue;
            };
            if !wanted.contains(&psp) {
                continue;
            }
            let charge = charges.entry(psp).or_insert_with(|| Charge {
                id: psp.to_owned(),
                status: ChargeStatus::Succeeded,
                amount_minor: 0,
                currency: row.gross_currency.clone(),
                amount_captured: 0,
                amount_refunded: 0,
                reference: (!row.merchant_reference.is_empty())
                    .then(|| row.merchant_reference.clone()),
                idempotency_key: String::new(),
                payment_method: row.payment_method.clone(),
                capture: true,
                failure_code: None,
                next_action: None,
                dispute: None,
                metadata: BTreeMap::new(),
                provider_fees: Vec::new(),
                created: row.created,
                updated: row.created,
            });
            charge.updated = charge.updated.max(row.created);
            let gross = row.gross_minor;
            match row.kind.as_str() {
                "Settled" => charge.amount_captured = charge.amount_captured.saturating_add(gross),
                "Refunded" | "RefundedReversed" => {
                    charge.amount_refunded = charge.amount_refunded.saturating_sub(gross)
                }
                // A second chargeback follows a reversal: the money withdrawn again.
                code @ ("Chargeback" | "ChargebackReversed" | "SecondChargeback") => {
                    let (status, reinstated) = match code {
                        "Chargeback" => (DisputeStatus::Open, false),
                        "ChargebackReversed" => (DisputeStatus::Won, false),
                        _ => (DisputeStatus::Lost, true),
                    };
                    charge
                        .dispute
                        .get_or_insert(Dispute {
                            status: DisputeStatus::Open,
                            amount_minor: gross.saturating_abs(),
                            created: row.created,
                            closed: None,
                            id: row.modification_reference.clone(),
                            reinstated: false,
                        })
                        .advance(status, reinstated, row.created);
                }
                _ => {}
            }
            if row.fee_minor != 0 {
                if let Some(transaction_id) = &row.modification_reference {
                    charge.provider_fees.push(ProviderFee {
                        transaction_id: transaction_id.clone(),
                        fee_minor: row.fee_minor,
                    });
                }
            }
        }
    }
    charges
        .into_values()
        .filter(|charge| charge.amount_captured > 0)
        .map(|mut charge| {
            charge.amount_minor = charge.amount_captured;
            charge
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const HEADER: &str = "Company Account,Merchant Account,Psp Reference,Merchant Reference,Payment Method,Creation Date,TimeZone,Type,Modification Reference,Gross Currency,Gross Debit (GC),Gross Credit (GC),Exchange Rate,Net Currency,Net Debit (NC),Net Credit (NC),Commission (NC),Markup (NC),Scheme Fees (NC),Interchange (NC),Payment Method Variant,Modification Merchant Reference,Batch Number";

    fn batch_one() -> String {
        [
            HEADER,
            "Acme,AcmeEUR,PSP1,pay_1,visa,2026-07-01 10:00:00,UTC,Settled,CAP1,EUR,,100.00,1,EUR,,98.80,0.10,0.20,0.10,0.80,visa,cap_1,1",
            "Acme,AcmeEUR,PSP1,pay_1,visa,2026-07-01 11:00:00,UTC,Refunded,REF1,EUR,30.00,,1,EUR,30.00,,,,,,visa,ref_1,1",
            "Acme,AcmeEUR,,,,2026-07-01 12:00:00,UTC,Fee,,EUR,,,1,EUR,1.00,,,,,,,,1",
            "Acme,AcmeEUR,,,,2026-07-02 00:00:00,UTC,MerchantPayout,,EUR,,,1,EUR,67.80,,,,,,,,1",
        ]
        .join("\n")
    }

    #[test]
    fn a_batch_is_a_paid_payout_whose_lines_net_its_merchant_payout() {
        let rows = parse(batch_one().as_bytes()).unwrap();
        assert_eq!(rows[0].fee_minor, 120);
        assert_eq!((rows[0].gross_minor, rows[0].net_minor), (10_000, 9_880));
        assert_eq!((rows[1].gross_minor, rows[1].net_minor), (-3_000, -3_000));
        let payout = payout_of("batch_1", 1, &rows).unwrap();
        assert_eq!(payout.status, PayoutStatus::Paid);
        assert_eq!(
            (payout.amount_minor, payout.currency.as_str()),
            (6_780, "EUR")
        );
        assert_eq!(
            payout.created,
            DateTime::parse_from_rfc3339("2026-07-02T00:00:00Z").unwrap()
        );
        let txns: Vec<_> = payout
            .transactions
            .iter()
            .map(|t| (t.id.as_str(), t.net_minor, t.charge_id.as_deref()))
            .collect();
        assert_eq!(
            txns,
            vec![
                ("CAP1", 9_880, Some("PSP1")),
                ("REF1", -3_000, Some("PSP1")),
                ("batch_1_line_4", -100, None),
            ]
        );
        let charges = charges_of([rows.as_slice()], &["PSP1"]);
        assert_eq!(charges.len(), 1);
        let charge = &charges[0];
        assert_eq!(
            (
                charge.amount_captured,
                charge.amount_refunded,
                charge.reference.as_deref()
            ),
            (10_000, 3_000, Some("pay_1"))
        );
        assert_eq!(
            charge.provider_fees,
            vec![ProviderFee {
                transaction_id: "CAP1".into(),
                fee_minor: 120
            }]
        );
    }

    #[test]
    fn a_payment_s_later_batch_is_read_with_its_earlier_ones_and_disputes_follow_their_lines() {
        let one = parse(batch_one().as_bytes()).unwrap();
        let two = parse(
            [
                // Reordered, with a column the reader does not know.
                "Batch Number,Type,Psp Reference,Merchant Reference,Creation Date,Modification Reference,Gross Currency,Gross Debit (GC),Gross Credit (GC),Net Currency,Net Debit (NC),Net Credit (NC),Commission (NC),Markup (NC),Scheme Fees (NC),Interchange (NC),Booking Date",
                "2,Chargeback,PSP1,pay_1,2026-07-03 10:00:00,DSP1,EUR,70.00,,EUR,70.00,,,,,,2026-07-03",
                "2,ChargebackReversed,PSP1,pay_1,2026-07-04 10:00:00,DSP1,EUR,,70.00,EUR,,70.00,,,,,2026-07-04",
                "2,MerchantPayout,,,2026-07-05 00:00:00,,EUR,,,EUR,,,,,,,2026-07-05",
            ]
            .join("\n")
            .as_bytes(),
        )
        .unwrap();
        let payout = payout_of("batch_2", 2, &two).unwrap();
        assert_eq!(payout.amount_minor, 0);
        let charges = charges_of([one.as_slice(), two.as_slice()], &["PSP1"]);
        let dispute = charges[0].dispute.clone().unwrap();
        assert_eq!(
            (dispute.status, dispute.amount_minor, dispute.id.as_deref()),
            (DisputeStatus::Won, 7_000, Some("DSP1"))
        );
        // Without the batch that captured it, the payment is not told at all.
        assert!(charges_of([two.as_slice()], &["PSP1"]).is_empty());
    }

    #[test]
    fn a_batch_whose_payout_disagrees_with_its_lines_or_mixes_batches_is_refused() {
        let wrong = batch_one().replace("67.80", "67.81");
        let rows = parse(wrong.as_bytes()).unwrap();
        assert!(matches!(
            payout_of("batch_1", 1, &rows),
            Err(ReportError::Inconsistent { .. })
        ));
        let rows = parse(batch_one().as_bytes()).unwrap();
        assert!(payout_of("batch_2", 2, &rows).is_err());
        let bad = batch_one().replace("0.80,visa", "0.805,visa");
        assert!(matches!(
            parse(bad.as_bytes()),
            Err(ReportError::Amount {
                column: "Interchange (NC)",
                ..
            })
        ));
        let missing = batch_one().replace("Batch Number", "Batch");
        assert!(matches!(
            parse(missing.as_bytes()),
            Err(ReportError::ColumnMissing {
                column: "Batch Number",
                ..
            })
        ));
    }
}
